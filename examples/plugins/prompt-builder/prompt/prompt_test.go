package prompt

import (
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
