package job

import (
	"encoding/json"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

type mapKV map[string][]byte

func (m mapKV) Get(k string) ([]byte, bool) { v, ok := m[k]; return v, ok }
func (m mapKV) Set(k string, v []byte) abi.Status {
	if len(v) == 0 {
		delete(m, k)
	} else {
		m[k] = v
	}
	return abi.StatusOK
}

func effect(args string) abi.Effect {
	return abi.Effect{ID: "run_1.t1.0", Attempt: 1, Kind: abi.KindTool, Tool: Tool, Request: json.RawMessage(`{"arguments":` + args + `}`)}
}

// A crash between the record's write and the count's leaves the count
// behind; the repeated start brings it up to the record, never past it.
func TestRepeatedStartRepairsTheCount(t *testing.T) {
	kv := mapKV{}
	now := int64(1000)
	j := Jobs{KV: kv, Now: func() int64 { return now }}
	e := effect(`{"seconds": 2}`)
	if r := j.Start(e); r.State != abi.StatePending {
		t.Fatalf("%+v", r)
	}
	delete(kv, ExecKey(e)) // the crash
	for range 2 {
		if r := j.Start(e); r.State != abi.StatePending {
			t.Fatalf("%+v", r)
		}
	}
	if got := string(kv[ExecKey(e)]); got != "1" {
		t.Fatalf("exec count %q, want 1", got)
	}
}

// After a restart the host re-attaches and polls; it never calls start
// again. Poll and attach must repair the count as start does.
func TestPollAfterACrashRepairsTheCount(t *testing.T) {
	kv := mapKV{}
	now := int64(1000)
	j := Jobs{KV: kv, Now: func() int64 { return now }}
	e := effect(`{"seconds": 2}`)
	if r := j.Start(e); r.State != abi.StatePending {
		t.Fatalf("%+v", r)
	}
	delete(kv, ExecKey(e)) // the crash, between the two writes
	if r := j.Poll(e); r.State != abi.StatePending {
		t.Fatalf("poll: %+v", r)
	}
	if got := string(kv[ExecKey(e)]); got != "1" {
		t.Fatalf("exec count %q after the poll, want 1", got)
	}
	now += 5000
	if r := j.Poll(e); r.State != abi.StateDone || string(kv[ExecKey(e)]) != "1" {
		t.Fatalf("poll when due: %+v, count %q", r, kv[ExecKey(e)])
	}
}

func TestBadArguments(t *testing.T) {
	j := Jobs{KV: mapKV{}, Now: func() int64 { return 0 }}
	for _, args := range []string{`{}`, `{"seconds": -1}`, `{"seconds": 0}`, `{"seconds": "5"}`, `{"seconds": 1e9}`, `[1]`} {
		r := j.Start(effect(args))
		var o abi.ToolOutcome
		if r.State != abi.StateDone || json.Unmarshal(r.Outcome, &o) != nil || !o.IsError {
			t.Errorf("%s: %+v", args, r)
		}
	}
	if len(j.KV.(mapKV)) != 0 {
		t.Errorf("a refused start wrote to the KV: %v", j.KV)
	}
}
