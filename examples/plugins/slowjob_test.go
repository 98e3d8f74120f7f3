package examples_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

func (e *env) execCount(t *testing.T, effect string, attempt int) string {
	t.Helper()
	b, err := e.kv.KVGet(context.Background(), "acme", "slow-job", []byte(fmt.Sprintf("exec/%s#%d", effect, attempt)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSlowJob(t *testing.T) { testSlowJob(t, "slow-job") }

// asSlowJob loads a build of slow-job under the name "slow-job", whose KV
// scope it then has: either build finds the other's jobs.
func asSlowJob(s *host.PluginSpec) { s.Name = "slow-job" }

// testSlowJob checks the slow-job plugin built from dir.
func testSlowJob(t *testing.T, dir string) {
	e := newEnv(t)
	p := e.load(t, dir, abi.RoleExecutor, asSlowJob)
	if d := p.Describe(); !d.Attach || len(d.Tools) != 1 || d.Tools[0].Name != "slow_job" || d.Tools[0].Idempotent {
		t.Fatalf("describe: %+v", d)
	}
	x, err := p.Executor()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := toolCall("run_1.t1.0", 1, "slow_job", map[string]any{"seconds": 3, "label": "demo"})

	// Before start: no record, so attach and poll answer unknown.
	if r, err := x.Attach(ctx, c); err != nil || r.State != abi.StateUnknown {
		t.Fatalf("attach before start: %+v %v", r, err)
	}
	r, err := x.Start(ctx, c)
	if err != nil || r.State != abi.StatePending || r.Handle == "" || r.PollAfterMS <= 0 {
		t.Fatalf("start: %+v %v", r, err)
	}
	handle := r.Handle
	if got := e.execCount(t, "run_1.t1.0", 1); got != "1" {
		t.Fatalf("exec count after start: %q", got)
	}
	// The same attempt again (a crash before EffectPending was committed)
	// creates no second job: the same handle, the same count.
	if r, err := x.Start(ctx, c); err != nil || r.State != abi.StatePending || r.Handle != handle {
		t.Fatalf("repeated start: %+v %v", r, err)
	}
	if got := e.execCount(t, "run_1.t1.0", 1); got != "1" {
		t.Fatalf("exec count after a repeated start: %q, want 1", got)
	}
	c.Input.Handle = handle
	e.clock.Advance(2 * time.Second)
	if r, err := x.Poll(ctx, c); err != nil || r.State != abi.StatePending || r.PollAfterMS != 1000 {
		t.Fatalf("poll before due: %+v %v", r, err)
	}
	// attach after a restart may come with no handle: the record is found
	// by (effect, attempt).
	c.Input.Handle = ""
	if r, err := x.Attach(ctx, c); err != nil || r.State != abi.StatePending {
		t.Fatalf("attach with an empty handle: %+v %v", r, err)
	}
	e.clock.Advance(time.Second)
	if o := tool(t)(x.Attach(ctx, c)); o.IsError || o.Content != `slow job "demo" finished after 3 s` {
		t.Fatalf("attach when due: %+v", o)
	}
	if o := tool(t)(x.Poll(ctx, c)); o.Content != `slow job "demo" finished after 3 s` {
		t.Fatalf("poll when due: %+v", o)
	}
	// A finished job answers cancel with its result.
	if cr, err := x.Cancel(ctx, c); err != nil || cr.State != abi.StateDone {
		t.Fatalf("cancel after due: %+v %v", cr, err)
	}

	// Another attempt of the same effect is another job, with its own count.
	c2 := toolCall("run_1.t1.0", 2, "slow_job", map[string]any{"seconds": 10})
	if r, err := x.Poll(ctx, c2); err != nil || r.State != abi.StateUnknown {
		t.Fatalf("poll of attempt 2 before its start: %+v %v", r, err)
	}
	if r, err := x.Start(ctx, c2); err != nil || r.State != abi.StatePending {
		t.Fatalf("start attempt 2: %+v %v", r, err)
	}
	if got := e.execCount(t, "run_1.t1.0", 2); got != "1" {
		t.Fatalf("exec count of attempt 2: %q", got)
	}
	// Cancel before due: cancelled, and the record says so from then on.
	if cr, err := x.Cancel(ctx, c2); err != nil || cr.State != abi.StateCancelled {
		t.Fatalf("cancel: %+v %v", cr, err)
	}
	e.clock.Advance(time.Minute)
	if r, err := x.Poll(ctx, c2); err != nil || r.State != abi.StateFailed {
		t.Fatalf("poll after cancel: %+v %v", r, err)
	}
	if cr, err := x.Cancel(ctx, toolCall("run_9.t1.0", 1, "slow_job", nil)); err != nil || cr.State != abi.StateUnknown {
		t.Fatalf("cancel with no record: %+v %v", cr, err)
	}

	// A bad argument is a tool error, and no job.
	bad := toolCall("run_1.t2.0", 1, "slow_job", map[string]any{"seconds": "soon"})
	if o := tool(t)(x.Start(ctx, bad)); !o.IsError {
		t.Fatalf("bad seconds: %+v", o)
	}
	if got := e.execCount(t, "run_1.t2.0", 1); got != "" {
		t.Fatalf("a refused start counted a job: %q", got)
	}

	// After a restart (a new host on the same KV), attach still answers.
	c3 := toolCall("run_2.t1.0", 1, "slow_job", map[string]any{"seconds": 1, "label": "late"})
	if r, err := x.Start(ctx, c3); err != nil || r.State != abi.StatePending {
		t.Fatalf("start before the restart: %+v %v", r, err)
	}
	e2 := restart(t, e.clock, e.kv)
	x2 := e2.executor(t, dir, asSlowJob)
	if r, err := x2.Attach(ctx, c3); err != nil || r.State != abi.StatePending {
		t.Fatalf("attach after the restart: %+v %v", r, err)
	}
	e.clock.Advance(time.Second)
	if o := tool(t)(x2.Attach(ctx, c3)); o.Content != `slow job "late" finished after 1 s` {
		t.Fatalf("attach after the restart, when due: %+v", o)
	}
	if got := e.execCount(t, "run_2.t1.0", 1); got != "1" {
		t.Fatalf("exec count after the restart: %q", got)
	}
}
