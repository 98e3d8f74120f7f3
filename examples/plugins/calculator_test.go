package examples_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

// calcCase is one row of calculator/expr/testdata/cases.json: the table
// the Go evaluator, the calculator plugin and calculator-c are all held to.
type calcCase struct {
	Expr  string `json:"expr"`
	Want  string `json:"want"`
	Error string `json:"error"`
}

func calcCases(t *testing.T) []calcCase {
	t.Helper()
	b, err := os.ReadFile("calculator/expr/testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cs []calcCase
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

// testCalculator runs the shared table and the bad inputs against one
// calculator plugin.
func testCalculator(t *testing.T, dir string) {
	e := newEnv(t)
	p := e.load(t, dir, abi.RoleExecutor, nil)
	d := p.Describe()
	if len(d.Tools) != 1 || d.Tools[0].Name != "calculate" || !d.Tools[0].Idempotent || d.Tools[0].Approval != abi.ApprovalNever {
		t.Fatalf("describe: %+v", d)
	}
	var schema struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if err := json.Unmarshal(d.Tools[0].InputSchema, &schema); err != nil || schema.Type != "object" || schema.Properties["expression"] == nil || len(schema.Required) != 1 {
		t.Fatalf("input_schema %s: %v", d.Tools[0].InputSchema, err)
	}
	x, err := p.Executor()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, c := range calcCases(t) {
		o := tool(t)(x.Start(ctx, toolCall("run_1.t1.0", i+1, "calculate", map[string]string{"expression": c.Expr})))
		switch {
		case c.Error != "":
			if !o.IsError || o.Content != "error: "+c.Error {
				t.Errorf("%q: %+v, want the error %q", c.Expr, o, c.Error)
			}
		case o.IsError || o.Content != c.Want:
			t.Errorf("%q: %+v, want %s", c.Expr, o, c.Want)
		}
	}

	// Arguments the model got wrong are tool errors it can read, never a trap.
	for _, args := range []any{map[string]any{}, map[string]any{"expression": 5}, map[string]any{"expr": "1+1"}, []int{1}} {
		o := tool(t)(x.Start(ctx, toolCall("run_1.t2.0", 1, "calculate", args)))
		if !o.IsError || !strings.Contains(o.Content, "expression") {
			t.Errorf("arguments %v: %+v", args, o)
		}
	}
	// Arguments left out are {}: the expression is missing.
	c := toolCall("run_1.t2.1", 1, "calculate", nil)
	c.Input.Effect.Request = nil
	if o := tool(t)(x.Start(ctx, c)); !o.IsError || !strings.Contains(o.Content, "missing") {
		t.Errorf("no arguments: %+v", o)
	}
	// Another tool is the plugin's verdict: failed, not retriable.
	r, err := x.Start(ctx, toolCall("run_1.t2.2", 1, "nope", nil))
	if err != nil || r.State != abi.StateFailed || r.Error.Retriable || !strings.Contains(r.Error.Message, "nope") {
		t.Errorf("unknown tool: %+v %v", r, err)
	}
	// No records: poll and attach answer unknown, cancel cancelled.
	if r, err := x.Poll(ctx, toolCall("run_1.t1.0", 1, "calculate", nil)); err != nil || r.State != abi.StateUnknown {
		t.Errorf("poll: %+v %v", r, err)
	}
	if r, err := x.Attach(ctx, toolCall("run_1.t1.0", 1, "calculate", nil)); err != nil || r.State != abi.StateUnknown {
		t.Errorf("attach: %+v %v", r, err)
	}
	if r, err := x.Cancel(ctx, toolCall("run_1.t1.0", 1, "calculate", nil)); err != nil || r.State != abi.StateCancelled {
		t.Errorf("cancel: %+v %v", r, err)
	}
	// An input with no effect is a protocol error, not a trap.
	bad := toolCall("", 0, "calculate", nil)
	if _, err := x.Start(ctx, bad); classOf(t, err) != abi.ClassPluginProtocol {
		t.Errorf("start without an effect: %v", err)
	}
	// The instance survived all of it.
	if st := p.Stats("acme"); st.Failed != 0 {
		t.Errorf("instances discarded: %+v", st)
	}
}

func TestCalculator(t *testing.T) { testCalculator(t, "calculator") }
