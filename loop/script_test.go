package loop

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the scenario files in testdata/")

// TestScenarios runs the story files in testdata/scenarios. Each block is a
// command, a line "----", the expected output, and a blank line. The
// commands are described on scriptRunner.exec. Run with -rewrite to
// regenerate the expected output, then read the diff before committing.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/scenarios/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			runScenarioFile(t, f)
		})
	}
}

type block struct {
	cmd      string
	expected string
	line     int
}

func parseBlocks(t *testing.T, text string) (blocks []block, comments map[int][]string) {
	lines := strings.Split(text, "\n")
	comments = map[int][]string{}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" {
			continue
		}
		if strings.HasPrefix(l, "#") {
			comments[len(blocks)] = append(comments[len(blocks)], l)
			continue
		}
		b := block{cmd: l, line: i + 1}
		i++
		if i >= len(lines) || lines[i] != "----" {
			t.Fatalf("line %d: command %q is not followed by ----", b.line, l)
		}
		var exp []string
		for i++; i < len(lines) && lines[i] != ""; i++ {
			exp = append(exp, lines[i])
		}
		b.expected = strings.Join(exp, "\n")
		blocks = append(blocks, b)
	}
	return blocks, comments
}

func runScenarioFile(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, comments := parseBlocks(t, string(raw))
	s := &scriptRunner{now: 1_000}
	var out strings.Builder
	for i, b := range blocks {
		for _, c := range comments[i] {
			out.WriteString(c + "\n")
		}
		got := s.exec(t, b.cmd)
		if !*rewrite && got != b.expected {
			t.Errorf("%s:%d: %s\n--- want\n%s\n--- got\n%s", path, b.line, b.cmd, b.expected, got)
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n\n", b.cmd, got)
	}
	for _, c := range comments[len(blocks)] {
		out.WriteString(c + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptRunner holds a Run and applies script commands to it. Time moves
// 1000 ms per event unless a command says at=N.
type scriptRunner struct {
	run Run
	now int64
}

func kv(args []string) (pos []string, named map[string]string) {
	named = map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			named[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	return pos, named
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("bad number %q", s)
	}
	return n
}

func scriptPolicy(t *testing.T, s string) Policy {
	switch {
	case s == "fail":
		return Policy{Mode: PolicyFail}
	case s == "failrun":
		return Policy{Mode: PolicyFailRun}
	case strings.HasPrefix(s, "retry"):
		return Policy{Mode: PolicyRetry, MaxAttempts: atoi(t, strings.TrimPrefix(s, "retry")), BackoffMS: 1000, MaxBackoffMS: 4000}
	}
	t.Fatalf("bad policy %q", s)
	return Policy{}
}

// exec runs one command and renders what happened. Commands:
//
//	create [tools=a,b:approval:retry3,c:failrun,d:strict] [max_steps=N] [max_calls=N]
//	       [parallel=N] [deadline=MS] [effect_timeout=MS] [model=retryN|fail|failrun]
//	start | plan [step=N] | dispatch EFFECT [attempt=N] | pending EFFECT handle=H
//	model EFFECT [calls=tool,tool@ok,tool@bad] [answer=TEXT] [await=PROMPT] [usage=IN/OUT]
//	tool EFFECT content=TEXT [error]
//	fail EFFECT class=CLASS [retriable] | cancelled EFFECT
//	approve CALLID... | deny CALLID [reason=TEXT] | input TEXT
//	cancel [reason=TEXT] | timer at=MS | complete | failrun | finishcancel
//	decide | show
//
// A strict tool's input_schema requires an integer "n"; a call's arguments
// are {} by default, {"n":1} with @ok and {"n":"x"} with @bad.
//
// Effect commands take attempt=N (default: the effect's current attempt).
// Words in TEXT are joined with '_' in the script and shown with spaces.
func (s *scriptRunner) exec(t *testing.T, cmd string) string {
	fields := strings.Fields(cmd)
	pos, named := kv(fields[1:])
	text := func(k string) string { return strings.ReplaceAll(named[k], "_", " ") }
	at := s.now + 1000
	if v, ok := named["at"]; ok {
		at = int64(atoi(t, v))
	}
	attempt := func(id string) int {
		if v, ok := named["attempt"]; ok {
			return atoi(t, v)
		}
		if e := s.run.Effect(id); e != nil {
			if fields[0] == "dispatch" {
				return e.Attempt + 1
			}
			return e.Attempt
		}
		return 1
	}
	var ev Event
	switch fields[0] {
	case "decide":
		return renderActions(Decide(s.run))
	case "show":
		return renderRun(s.run)
	case "create":
		spec := Spec{Tenant: "acme", Session: "s1", ID: "run_1", Input: "question", Limits: DefaultLimits, ModelPolicy: DefaultModelPolicy}
		if v, ok := named["tools"]; ok {
			for _, d := range strings.Split(v, ",") {
				parts := strings.Split(d, ":")
				ts := ToolSpec{Name: parts[0], Policy: Policy{Mode: PolicyFail}}
				for _, p := range parts[1:] {
					if p == "approval" {
						ts.Approval = true
					} else if p == "strict" {
						ts.InputSchema = json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)
					} else {
						ts.Policy = scriptPolicy(t, p)
					}
				}
				spec.Tools = append(spec.Tools, ts)
			}
		}
		if v, ok := named["max_steps"]; ok {
			spec.Limits.MaxSteps = atoi(t, v)
		}
		if v, ok := named["max_calls"]; ok {
			spec.Limits.MaxToolCallsPerStep = atoi(t, v)
		}
		if v, ok := named["parallel"]; ok {
			spec.Limits.MaxParallelToolCalls = atoi(t, v)
		}
		if v, ok := named["deadline"]; ok {
			spec.Limits.DeadlineMS = int64(atoi(t, v))
		}
		if v, ok := named["effect_timeout"]; ok {
			spec.Limits.EffectTimeoutMS = int64(atoi(t, v))
		}
		if v, ok := named["model"]; ok {
			spec.ModelPolicy = scriptPolicy(t, v)
		}
		ev = RunCreated(spec, at)
	case "start":
		ev = Event{Type: EventRunStarted}
	case "plan":
		step := s.run.Step + 1
		if v, ok := named["step"]; ok {
			step = atoi(t, v)
		}
		ev = Event{Type: EventModelStepPlanned, Step: step, Request: json.RawMessage(fmt.Sprintf(`{"step":%d}`, step))}
	case "dispatch":
		ev = Event{Type: EventEffectDispatched, EffectID: pos[0], Attempt: attempt(pos[0]), Epoch: 1}
	case "pending":
		ev = Event{Type: EventEffectPending, EffectID: pos[0], Attempt: attempt(pos[0]), Handle: named["handle"]}
	case "model":
		m := abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, Content: text("answer")}}
		if v, ok := named["calls"]; ok {
			for i, name := range strings.Split(v, ",") {
				name, how, _ := strings.Cut(name, "@")
				args := map[string]string{"ok": `{"n":1}`, "bad": `{"n":"x"}`}[how]
				if args == "" {
					args = `{}`
				}
				m.Message.ToolCalls = append(m.Message.ToolCalls, abi.ToolCall{ID: fmt.Sprintf("call_%d", i+1), Name: name, Arguments: json.RawMessage(args)})
			}
		}
		if v, ok := named["await"]; ok {
			m.AwaitInput = &abi.AwaitInput{Prompt: strings.ReplaceAll(v, "_", " ")}
		}
		if v, ok := named["usage"]; ok {
			in, out, _ := strings.Cut(v, "/")
			m.Usage = abi.Usage{InputTokens: int64(atoi(t, in)), OutputTokens: int64(atoi(t, out))}
		}
		ev = Settled(pos[0], attempt(pos[0]), Outcome{State: OutcomeDone, Model: &m}, 0)
	case "tool":
		isErr := len(pos) > 1 && pos[1] == "error"
		ev = Settled(pos[0], attempt(pos[0]), Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: text("content"), IsError: isErr}}, 0)
	case "fail":
		retriable := len(pos) > 1 && pos[1] == "retriable"
		ev = Settled(pos[0], attempt(pos[0]), Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ErrorClass(named["class"]), Message: "boom", Retriable: retriable}}, 0)
	case "cancelled":
		ev = Settled(pos[0], attempt(pos[0]), Outcome{State: OutcomeCancelled}, 0)
	case "approve":
		ev = Event{Type: EventApprovalRecorded}
		for _, id := range pos {
			ev.Approvals = append(ev.Approvals, abi.ApprovalDecision{ToolCallID: id, Approved: true})
		}
	case "deny":
		ev = Event{Type: EventApprovalRecorded, Approvals: []abi.ApprovalDecision{{ToolCallID: pos[0], Reason: text("reason")}}}
	case "input":
		ev = Event{Type: EventInputProvided, Input: strings.ReplaceAll(strings.Join(pos, " "), "_", " ")}
	case "cancel":
		ev = Event{Type: EventCancelRequested, Reason: text("reason")}
	case "timer":
		ev = Event{Type: EventTimerFired}
	case "complete":
		ev = Event{Type: EventRunCompleted}
	case "failrun":
		ev = Event{Type: EventRunFailed}
	case "finishcancel":
		ev = Event{Type: EventRunCancelled}
	default:
		t.Fatalf("unknown command %q", fields[0])
	}
	ev.At = at
	next, err := Apply(s.run, ev)
	if err != nil {
		if !equalRuns(next, s.run) {
			t.Fatalf("%s: Apply changed the run although it failed", cmd)
		}
		if sentinelName(err) == "UNTYPED" {
			t.Fatalf("%s: untyped error %v", cmd, err)
		}
		return "error: " + err.Error()
	}
	s.run, s.now = next, at
	return fmt.Sprintf("ok: %s seq=%d\n%s", s.run.Status, s.run.Seq, renderActions(Decide(s.run)))
}

func equalRuns(a, b Run) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

var sentinels = []error{ErrTerminal, ErrStaleAttempt, ErrAlreadySettled, ErrUnknownEffect, ErrUnknownToolCall,
	ErrNotAwaiting, ErrLimit, ErrInvalidEvent, ErrInvalidID, ErrNoChange}

func sentinelName(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return strings.TrimPrefix(s.Error(), "loop: ")
		}
	}
	return "UNTYPED"
}

func renderActions(acts []Action) string {
	if len(acts) == 0 {
		return "  (no actions)"
	}
	var b strings.Builder
	for i, a := range acts {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString("  " + string(a.Type))
		switch a.Type {
		case ActionPlanModelStep:
			fmt.Fprintf(&b, " step=%d", a.Step)
		case ActionDispatch, ActionCancelEffect:
			fmt.Fprintf(&b, " %s#%d", a.EffectID, a.Attempt)
		case ActionAwaitApproval:
			fmt.Fprintf(&b, " %s", strings.Join(a.ToolCallIDs, ","))
		case ActionAwaitInput:
			fmt.Fprintf(&b, " %q", a.Prompt)
		case ActionWakeAt:
			fmt.Fprintf(&b, " %d", a.At)
			if a.EffectID != "" {
				fmt.Fprintf(&b, " (%s)", a.EffectID)
			}
		case ActionComplete:
			fmt.Fprintf(&b, " %q", a.Result)
		case ActionFail, ActionFinishCancelled:
			fmt.Fprintf(&b, " %s: %s", a.Failure.Class, a.Failure.Message)
		}
	}
	return b.String()
}

func renderRun(r Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status=%s step=%d seq=%d usage=%d/%d", r.Status, r.Step, r.Seq, r.Usage.InputTokens, r.Usage.OutputTokens)
	if r.Result != "" {
		fmt.Fprintf(&b, " result=%q", r.Result)
	}
	if r.Failure != nil {
		fmt.Fprintf(&b, " failure=%s", r.Failure.Class)
	}
	ids := make([]string, 0, len(r.Effects))
	for _, e := range r.Effects {
		s := fmt.Sprintf("%s:%s#%d", e.ID, e.State, e.Attempt)
		if e.Handle != "" {
			s += " handle=" + e.Handle
		}
		ids = append(ids, s)
	}
	sort.Strings(ids)
	for _, s := range ids {
		b.WriteString("\n  effect " + s)
	}
	for _, m := range r.Transcript {
		line := fmt.Sprintf("\n  %s: %s", m.Role, m.Content)
		if m.ToolCallID != "" {
			line += " [" + m.ToolCallID + "]"
		}
		for _, c := range m.ToolCalls {
			line += fmt.Sprintf(" ->%s(%s)", c.Name, c.ID)
		}
		if m.IsError {
			line += " (error)"
		}
		b.WriteString(line)
	}
	return b.String()
}
