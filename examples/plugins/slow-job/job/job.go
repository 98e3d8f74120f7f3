// Package job is the logic of the slow-job example: a long-running job
// whose record lives in the host KV, keyed by (effect id, attempt), so
// that poll, attach and cancel work from any instance, after any restart,
// with or without the handle. It is plain Go over a small KV interface, so
// its tests run on the host; the plugin (package main, built for wasip1)
// passes the agenthost KV and clock.
//
// # KV keys
//
//	job/<effect id>#<attempt>   the job's record (JSON, see Record)
//	exec/<effect id>#<attempt>  how many times a start created the job: a
//	                            decimal number, 1 after the first start and
//	                            never more, however often start is repeated
//
// A test that kills the host with -9 mid-job reads exec/… to prove that
// recovery never ran a job twice.
package job

import (
	"fmt"
	"math"
	"strconv"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/segmentio/encoding/json"
)

// Tool is the tool's name.
const Tool = "slow_job"

// MaxSeconds is the longest job a call may ask for.
const MaxSeconds = 24 * 60 * 60

// KV is the durable key-value space the jobs live in: the host KV in the
// plugin. Get's ok is false for a missing key. Set writes durably and
// returns the host's status.
type KV interface {
	Get(key string) ([]byte, bool)
	Set(key string, value []byte) abi.Status
}

// Jobs runs jobs over a KV and a clock (Unix milliseconds).
type Jobs struct {
	KV  KV
	Now func() int64
}

// State of a job record.
const (
	Running   = "running"
	Cancelled = "cancelled"
)

// Record is a job's KV record.
type Record struct {
	State   string  `json:"state"`
	Label   string  `json:"label"`
	Seconds float64 `json:"seconds"`
	StartMS int64   `json:"start_ms"`
	DueMS   int64   `json:"due_ms"`
	// Exec is the creation count this record was written with: the exec
	// key is brought up to it if a crash fell between the two writes.
	Exec int64 `json:"exec"`
}

// Args are the tool's arguments.
type Args struct {
	Seconds *float64 `json:"seconds"`
	Label   string   `json:"label"`
}

// JobKey and ExecKey are the KV keys of an effect attempt.
func JobKey(e abi.Effect) string  { return fmt.Sprintf("job/%s#%d", e.ID, e.Attempt) }
func ExecKey(e abi.Effect) string { return fmt.Sprintf("exec/%s#%d", e.ID, e.Attempt) }

// PollAfterMS bounds the wait the plugin asks for between polls.
const (
	minPollMS = 100
	maxPollMS = 1000
)

// Start creates the job of an effect attempt, or, when it exists (the same
// attempt dispatched again, after a crash), answers from its record and
// creates nothing.
func (j Jobs) Start(e abi.Effect) abi.EffectReply {
	if e.Tool != Tool {
		return abi.Failed(fmt.Sprintf("slow-job: no tool %q here; this plugin offers %q", e.Tool, Tool), false)
	}
	if r, found, err := j.load(e); err != nil {
		return abi.Failed(err.Error(), false)
	} else if found {
		if reply, ok := j.repairExec(e, r); !ok {
			return reply
		}
		return j.answer(e, r)
	}
	var a Args
	if err := e.ToolArguments(&a); err != nil {
		return abi.DoneTool(`error: the arguments must be {"seconds": number, "label": string}: `+err.Error(), true)
	}
	if a.Seconds == nil || math.IsNaN(*a.Seconds) || *a.Seconds <= 0 || *a.Seconds > MaxSeconds {
		return abi.DoneTool(fmt.Sprintf(`error: "seconds" must be a number above 0 and at most %d`, MaxSeconds), true)
	}
	if a.Label == "" {
		a.Label = "job"
	}
	exec, err := j.execCount(e)
	if err != nil {
		return abi.Failed(err.Error(), false)
	}
	now := j.Now()
	r := Record{State: Running, Label: a.Label, Seconds: *a.Seconds, StartMS: now,
		DueMS: now + int64(math.Ceil(*a.Seconds*1000)), Exec: exec + 1}
	// The record first: it is the job. Then the count, which a repeated
	// start repairs from the record if a crash fell in between.
	if st := j.save(e, r); st != abi.StatusOK {
		return abi.Failed(fmt.Sprintf("slow-job: cannot record the job (kv_set status %d); try again", st), true)
	}
	if st := j.KV.Set(ExecKey(e), []byte(strconv.FormatInt(r.Exec, 10))); st != abi.StatusOK {
		return abi.Failed(fmt.Sprintf("slow-job: cannot count the job (kv_set status %d); try again", st), true)
	}
	return j.answer(e, r)
}

// Poll and Attach answer from the record: pending until the job is due,
// then done; unknown when there is no record of this attempt.
func (j Jobs) Poll(e abi.Effect) abi.EffectReply {
	r, found, err := j.load(e)
	switch {
	case err != nil:
		return abi.Failed(err.Error(), false)
	case !found:
		return abi.Unknown()
	}
	// A crash between the record and the counter writes is repaired here
	// too: after a restart the host re-attaches and polls, and never calls
	// start again.
	if reply, ok := j.repairExec(e, r); !ok {
		return reply
	}
	return j.answer(e, r)
}

// Cancel stops a running job: its record says cancelled. A job that was
// already due answers done with its result; no record answers unknown.
func (j Jobs) Cancel(e abi.Effect) (abi.CancelReply, error) {
	r, found, err := j.load(e)
	switch {
	case err != nil:
		return abi.CancelReply{}, err
	case !found:
		return abi.CancelReply{State: abi.StateUnknown}, nil
	case r.State == Cancelled:
		return abi.Cancelled(), nil
	case j.Now() >= r.DueMS:
		return abi.CancelDone(abi.ToolOutcome{Content: result(r)})
	}
	r.State = Cancelled
	if st := j.save(e, r); st != abi.StatusOK {
		return abi.CancelReply{}, fmt.Errorf("slow-job: cannot record the cancellation (kv_set status %d)", st)
	}
	return abi.Cancelled(), nil
}

func (j Jobs) answer(e abi.Effect, r Record) abi.EffectReply {
	if r.State == Cancelled {
		return abi.Failed(fmt.Sprintf("slow-job: job %q of %s#%d was cancelled", r.Label, e.ID, e.Attempt), false)
	}
	left := r.DueMS - j.Now()
	if left <= 0 {
		return abi.DoneTool(result(r), false)
	}
	return abi.Pending(JobKey(e), min(max(left, minPollMS), maxPollMS))
}

func result(r Record) string {
	return fmt.Sprintf("slow job %q finished after %s s", r.Label, strconv.FormatFloat(r.Seconds, 'f', -1, 64))
}

func (j Jobs) load(e abi.Effect) (Record, bool, error) {
	b, ok := j.KV.Get(JobKey(e))
	if !ok {
		return Record{}, false, nil
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, false, fmt.Errorf("slow-job: the record %s is corrupt: %v", JobKey(e), err)
	}
	return r, true, nil
}

func (j Jobs) save(e abi.Effect, r Record) abi.Status {
	b, err := json.Marshal(r)
	if err != nil {
		return abi.StatusRefused
	}
	return j.KV.Set(JobKey(e), b)
}

func (j Jobs) execCount(e abi.Effect) (int64, error) {
	b, ok := j.KV.Get(ExecKey(e))
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("slow-job: the counter %s is corrupt: %q", ExecKey(e), b)
	}
	return n, nil
}

// repairExec brings the exec count up to the record's, after a crash
// between the record's write and the count's. It never increments.
func (j Jobs) repairExec(e abi.Effect, r Record) (abi.EffectReply, bool) {
	n, err := j.execCount(e)
	if err != nil {
		return abi.Failed(err.Error(), false), false
	}
	if n >= r.Exec {
		return abi.EffectReply{}, true
	}
	if st := j.KV.Set(ExecKey(e), []byte(strconv.FormatInt(r.Exec, 10))); st != abi.StatusOK {
		return abi.Failed(fmt.Sprintf("slow-job: cannot count the job (kv_set status %d); try again", st), true), false
	}
	return abi.EffectReply{}, true
}
