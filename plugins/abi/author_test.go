package abi

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestHelpersBuildRepliesTheHostAccepts(t *testing.T) {
	cases := []struct {
		name   string
		r      EffectReply
		kind   EffectKind
		export string
		want   string
	}{
		{"DoneTool is a done tool reply", DoneTool("5", false), KindTool, ExportStart, ok},
		{"DoneModel is a done model reply", DoneModel(ModelOutcome{Message: Message{Role: MessageAssistant, Content: "5"}}), KindModel, ExportStart, ok},
		{"Done takes a raw outcome", Done(json.RawMessage(`{"content":"5"}`)), KindTool, ExportPoll, ok},
		{"Failed with a message", Failed("upstream said 503", true), KindTool, ExportStart, ok},
		{"RateLimited with a wait", RateLimited("the server answered 429", 20_000), KindModel, ExportStart, ok},
		{"RateLimited without a wait", RateLimited("slow down", 0), KindTool, ExportPoll, ok},
		{"RateLimited with a blank message is still refused", RateLimited(" ", 5), KindModel, ExportStart, "error.message"},
		{"a negative retry_after_ms is refused", EffectReply{State: StateFailed, Error: &ReplyError{Message: "429", Retriable: true, RetryAfterMS: -1}}, KindModel, ExportStart, "error.retry_after_ms"},
		{"Pending with a handle", Pending("job-1", 250), KindTool, ExportStart, ok},
		{"Pending without a handle", Pending("", 0), KindModel, ExportPoll, ok},
		{"Unknown from attach", Unknown(), KindTool, ExportAttach, ok},
		{"Unknown from start is still refused", Unknown(), KindTool, ExportStart, "state"},
		{"Failed with a blank message is still refused", Failed("", false), KindTool, ExportStart, "error.message"},
		{"Pending with a negative interval is still refused", Pending("h", -1), KindTool, ExportStart, "poll_after_ms"},
		{"DoneModel does not hide a bad outcome", DoneModel(ModelOutcome{Message: Message{Role: MessageUser}}), KindModel, ExportStart, "outcome.message.role"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, ValidateEffectReply(tc.r, tc.kind, tc.export), tc.want)
			raw, err := json.Marshal(tc.r)
			if err != nil {
				t.Fatal(err)
			}
			_, err = DecodeEffectReply(raw, tc.kind, tc.export)
			checkVerdict(t, err, tc.want)
		})
	}
}

func TestDoneOfAnUnencodableOutcomeIsAFailedReply(t *testing.T) {
	r := Done(json.RawMessage(`{"content":`))
	if r.State != StateFailed || r.Error == nil || r.Error.Retriable || !strings.Contains(r.Error.Message, "cannot encode the outcome") {
		t.Fatalf("Done of invalid JSON gave %+v", r)
	}
	checkVerdict(t, ValidateEffectReply(r, KindTool, ExportStart), ok)
}

func TestRateLimitedIsARetriableFailureOfItsOwnClass(t *testing.T) {
	r := RateLimited("the server answered 429", -3)
	if r.State != StateFailed || r.Error == nil || !r.Error.Retriable || r.Error.Class != ClassRateLimited || r.Error.RetryAfterMS != 0 {
		t.Fatalf("RateLimited gave %+v %+v", r, r.Error)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"state":"failed","error":{"message":"the server answered 429","retriable":true,"class":"rate_limited"}}`; string(raw) != want {
		t.Fatalf("RateLimited encodes as %s, want %s", raw, want)
	}
	for _, tc := range []struct {
		e         *ReplyError
		class     ErrorClass
		retriable bool
	}{
		{nil, ClassPluginFailed, false},
		{&ReplyError{Message: "x"}, ClassPluginFailed, false},
		{&ReplyError{Message: "x", Retriable: true}, ClassPluginFailed, true},
		{&ReplyError{Message: "x", Class: ClassRateLimited}, ClassRateLimited, true},
		{&ReplyError{Message: "x", Class: ClassPluginFailed, Retriable: true}, ClassPluginFailed, true},
		// A class the host gives, or one a later host may know, is a
		// plain failure here.
		{&ReplyError{Message: "x", Class: ClassPluginTrap, Retriable: false}, ClassPluginFailed, false},
		{&ReplyError{Message: "x", Class: "quota_exhausted", Retriable: true}, ClassPluginFailed, true},
	} {
		if got := tc.e.HostClass(); got != tc.class {
			t.Errorf("%+v: HostClass %s, want %s", tc.e, got, tc.class)
		}
		if got := tc.e.HostRetriable(); got != tc.retriable {
			t.Errorf("%+v: HostRetriable %v, want %v", tc.e, got, tc.retriable)
		}
	}
	if !ClassRateLimited.Valid() || !ClassRateLimited.Retriable() {
		t.Fatal("rate_limited is not a valid, retriable class")
	}
}

func TestCancelHelpers(t *testing.T) {
	checkVerdict(t, ValidateCancelReply(Cancelled(), KindTool), ok)
	r, err := CancelDone(ToolOutcome{Content: "finished anyway"})
	if err != nil {
		t.Fatal(err)
	}
	checkVerdict(t, ValidateCancelReply(r, KindTool), ok)
	if _, err := CancelDone(json.RawMessage(`nope`)); err == nil || !strings.HasPrefix(err.Error(), "abi: ") {
		t.Fatalf("CancelDone of invalid JSON: got %v, want an abi: error", err)
	}
}

func TestEffectToolArguments(t *testing.T) {
	var args struct {
		Expression string `json:"expression"`
	}
	e := Effect{ID: "run_1.t1.0", Kind: KindTool, Tool: "calculate", Request: json.RawMessage(`{"arguments":{"expression":"2+3"}}`)}
	if err := e.ToolArguments(&args); err != nil || args.Expression != "2+3" {
		t.Fatalf("got %+v, %v", args, err)
	}

	var none struct{ X int }
	for _, req := range []string{``, `{}`, `{"arguments":null}`} {
		e := Effect{ID: "run_1.t1.0", Request: json.RawMessage(req)}
		if err := e.ToolArguments(&none); err != nil {
			t.Errorf("request %q: missing arguments should decode as {}: %v", req, err)
		}
	}
	for _, req := range []string{`[]`, `{"arguments":"2+3"}`, `{"arguments":{"expression":5}}`} {
		e := Effect{ID: "run_1.t1.0", Request: json.RawMessage(req)}
		err := e.ToolArguments(&args)
		if err == nil || !strings.HasPrefix(err.Error(), "abi: effect run_1.t1.0: ") {
			t.Errorf("request %q: got %v, want an error naming the effect", req, err)
		}
	}
}

func TestEffectModelRequest(t *testing.T) {
	e := Effect{ID: "run_1.m1", Kind: KindModel, Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}],"params":{"temperature":0}}`)}
	req, err := e.ModelRequest()
	if err != nil || len(req.Messages) != 1 || req.Messages[0].Content != "hi" {
		t.Fatalf("got %+v, %v", req, err)
	}
	if _, err := (Effect{ID: "run_1.m1", Request: json.RawMessage(`[]`)}).ModelRequest(); err == nil {
		t.Fatal("a request that is an array decoded")
	}
}
