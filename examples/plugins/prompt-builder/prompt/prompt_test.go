package prompt

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

func config(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(config(nil))
	if err != nil || c.SystemPrompt != DefaultSystemPrompt || c.HistoryWindow != DefaultHistoryWindow {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = ParseConfig(config(map[string]string{"system_prompt": "Be brief.", "history_window": " 0 "}))
	if err != nil || c.SystemPrompt != "Be brief." || c.HistoryWindow != 0 {
		t.Fatalf("set: %+v %v", c, err)
	}
	for _, bad := range []string{"-1", "many", "2.5"} {
		_, err := ParseConfig(config(map[string]string{"history_window": bad}))
		if err == nil || !strings.Contains(err.Error(), "history_window") {
			t.Errorf("history_window %q: %v", bad, err)
		}
	}
}

func msg(role, content string) abi.Message { return abi.Message{Role: role, Content: content} }

func TestBuild(t *testing.T) {
	history := []abi.Message{
		msg("user", "q1"), msg("assistant", "a1"),
		msg("user", "q2"), {Role: "assistant", ToolCalls: []abi.ToolCall{{ID: "c", Name: "calculate"}}}, {Role: "tool", ToolCallID: "c", Content: "5"}, msg("assistant", "a2"),
	}
	in := abi.BuildInput{
		Run:        abi.RunView{ID: "r", Step: 1, Input: "q3"},
		History:    history,
		Transcript: []abi.Message{msg("user", "q3")},
		Tools:      []abi.Tool{{Name: "calculate"}},
	}
	cases := []struct {
		window int
		want   []string // contents after the system message
	}{
		{0, []string{"q3"}},
		{1, []string{"a2", "q3"}},
		{2, []string{"a2", "q3"}}, // the window starts on a tool result: dropped
		{3, []string{"", "5", "a2", "q3"}},
		{20, []string{"q1", "a1", "q2", "", "5", "a2", "q3"}},
	}
	for _, c := range cases {
		out := Build(Config{SystemPrompt: "S", HistoryWindow: c.window}, in)
		if err := abi.ValidateBuildOutput(out); err != nil {
			t.Fatalf("window %d: %v", c.window, err)
		}
		m := out.Request.Messages
		if m[0].Role != "system" || m[0].Content != "S" {
			t.Fatalf("window %d: first message %+v", c.window, m[0])
		}
		var got []string
		for _, x := range m[1:] {
			got = append(got, x.Content)
		}
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("window %d: %q, want %q", c.window, got, c.want)
		}
		if len(out.Request.Tools) != 1 || out.Request.Tools[0].Name != "calculate" {
			t.Errorf("window %d: tools %+v", c.window, out.Request.Tools)
		}
	}
}

// TestBuildUsesTheRunsAgent: the agent's instructions are the system
// message and its settings the params; an agent without instructions
// leaves the config's system prompt, and an input without an agent builds
// as before agents.
func TestBuildUsesTheRunsAgent(t *testing.T) {
	in := abi.BuildInput{Run: abi.RunView{ID: "r", Step: 1, Input: "q"}, Transcript: []abi.Message{msg("user", "q")},
		Agent: &abi.AgentView{Name: "support", Version: "v-1", Instructions: "You are support.",
			Settings: []byte(`{"model":"gpt-4o-mini","temperature":0.2,"max_output_tokens":300}`)}}
	out := Build(Config{SystemPrompt: "S", HistoryWindow: 5}, in)
	if err := abi.ValidateBuildOutput(out); err != nil {
		t.Fatal(err)
	}
	if m := out.Request.Messages[0]; m.Role != "system" || m.Content != "You are support." {
		t.Errorf("system message %+v, want the agent's instructions", m)
	}
	p := out.Request.Params
	if p["model"] != "gpt-4o-mini" || p["temperature"] != 0.2 || p["max_output_tokens"] != float64(300) || p["output_schema"] != nil {
		t.Errorf("params %v, want the agent's settings", p)
	}

	// The agent's output schema is the param output_schema, over a
	// setting of that name, with or without other settings.
	in.Agent.Settings = []byte(`{"model":"m","output_schema":"a setting"}`)
	in.Agent.OutputSchema = []byte(`{"type":"object","required":["city"]}`)
	p = Build(Config{}, in).Request.Params
	if got, _ := json.Marshal(p); string(got) != `{"model":"m","output_schema":{"required":["city"],"type":"object"}}` {
		t.Errorf("params %s, want the settings and the agent's output schema", got)
	}
	in.Agent.Settings = nil
	p = Build(Config{}, in).Request.Params
	if got, _ := json.Marshal(p); string(got) != `{"output_schema":{"required":["city"],"type":"object"}}` {
		t.Errorf("params %s, want the output schema alone", got)
	}

	in.Agent = &abi.AgentView{Name: "default", Version: "v-2"}
	out = Build(Config{SystemPrompt: "S"}, in)
	if out.Request.Messages[0].Content != "S" || out.Request.Params != nil {
		t.Errorf("an agent without instructions or settings: system %q, params %v; want the config's prompt and none", out.Request.Messages[0].Content, out.Request.Params)
	}
	in.Agent = nil
	out = Build(Config{SystemPrompt: "S"}, in)
	if out.Request.Messages[0].Content != "S" || out.Request.Params != nil {
		t.Errorf("no agent: system %q, params %v", out.Request.Messages[0].Content, out.Request.Params)
	}
}
