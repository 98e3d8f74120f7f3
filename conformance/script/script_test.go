package script

import (
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

func req(msgs ...abi.Message) abi.ModelRequest { return abi.ModelRequest{Messages: msgs} }

func TestScriptFollowsItsSteps(t *testing.T) {
	user := abi.Message{Role: abi.MessageUser, Content: `call:echo({"text":"a,b"}),slow()|ask:Sure?|answer:got $results`}
	out, err := Reply(req(abi.Message{Role: abi.MessageSystem, Content: "sys"}, user))
	if err != nil || len(out.Message.ToolCalls) != 2 || out.Message.ToolCalls[0].Name != "echo" ||
		string(out.Message.ToolCalls[0].Arguments) != `{"text":"a,b"}` || out.Message.ToolCalls[1].ID != "call_1_2" {
		t.Fatalf("step 1: %+v %v", out, err)
	}
	asst := abi.Message{Role: abi.MessageAssistant}
	out, _ = Reply(req(user, asst, abi.Message{Role: abi.MessageTool, Content: "x"}))
	if out.AwaitInput == nil || out.AwaitInput.Prompt != "Sure?" {
		t.Fatalf("step 2: %+v", out)
	}
	out, _ = Reply(req(user, asst, abi.Message{Role: abi.MessageTool, Content: "x"}, abi.Message{Role: abi.MessageTool, Content: "y"}, asst))
	if out.Message.Content != "got x,y" || out.Usage != StepUsage {
		t.Fatalf("step 3: %+v", out)
	}
	out, _ = Reply(req(user, asst, asst, asst))
	if out.Message.Content != "script exhausted" {
		t.Fatalf("past the end: %+v", out)
	}
}

func TestBadScriptsAreErrors(t *testing.T) {
	for _, s := range []string{"dance:now", "call:echo(", "call:(x)", `call:echo({bad json})`} {
		if _, err := Reply(req(abi.Message{Role: abi.MessageUser, Content: s})); err == nil {
			t.Errorf("script %q: want an error", s)
		}
	}
	if _, err := Reply(req()); err == nil {
		t.Error("no user message: want an error")
	}
}
