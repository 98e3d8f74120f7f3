package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

const promptBuilderC = "prompt-builder-c"

func TestPromptBuilderC(t *testing.T) { testPromptBuilder(t, promptBuilderC) }

// TestPromptBuilderCMatchesGo runs random build inputs through the Go and
// the C builders under several configs and wants the same outputs, or the
// same errors.
func TestPromptBuilderCMatchesGo(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	configs := []map[string]string{
		nil,
		{"history_window": "0"}, {"history_window": "1"}, {"history_window": "5"},
		{"history_window": "20"}, {"history_window": "100"}, {"history_window": " 7 "},
		{"history_window": "+3"}, {"history_window": "-1"}, {"history_window": "x"},
		{"history_window": ""}, {"history_window": "\u00a02\u3000"}, {"history_window": "9\u00a0x"},
		{"system_prompt": "Be brief."}, {"system_prompt": ""}, {"system_prompt": " \t\n"},
		{"system_prompt": "Réponds en français ✓ <&> \"q\"", "history_window": "3"},
	}
	rng := rand.New(rand.NewSource(1))
	var inputs []abi.BuildInput
	for i := 0; i < 300; i++ {
		inputs = append(inputs, randomBuildInput(rng))
	}
	for ci, cfg := range configs {
		load := func(dir string) *host.Builder {
			b, err := e.load(t, dir, abi.RoleBuilder, func(s *host.PluginSpec) {
				s.Name = fmt.Sprintf("%s-%d", dir, ci)
				s.Sandbox.Config = cfg
			}).Builder()
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		g, c := load("prompt-builder"), load(promptBuilderC)
		// Every config sees a share of the inputs; the first sees them all.
		for i, in := range inputs {
			if ci > 0 && i%len(configs) != ci {
				continue
			}
			want, werr := g.Build(ctx, "acme", in)
			got, gerr := c.Build(ctx, "acme", in)
			if (werr == nil) != (gerr == nil) || (werr != nil && (classOf(t, werr) != classOf(t, gerr) || afterExport(werr) != afterExport(gerr))) {
				t.Fatalf("config %v input %d: errors differ:\n Go %v\n  C %v", cfg, i, werr, gerr)
			}
			if werr != nil {
				continue
			}
			if !sameOutput(t, want, got) {
				t.Fatalf("config %v input %d: outputs differ:\n Go %+v\n  C %+v", cfg, i, want, got)
			}
		}
	}
}

// sameOutput compares two outputs, their raw JSON fields semantically.
func sameOutput(t *testing.T, a, b abi.BuildOutput) bool {
	t.Helper()
	norm := func(o abi.BuildOutput) any {
		raw, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	return reflect.DeepEqual(norm(a), norm(b)) && (a.Request.Tools == nil) == (b.Request.Tools == nil) &&
		len(a.Request.Messages) == len(b.Request.Messages)
}

var randomStrings = []string{"", "hi", "q\"uote\\back", "tab\tnew\nline", "é ✓ 日本 😀", "<a&b>", "\u2028\u2029", "\x01\x1f", "tool", " user "}

func randomString(rng *rand.Rand) string { return randomStrings[rng.Intn(len(randomStrings))] }

func randomMessage(rng *rand.Rand) abi.Message {
	roles := []string{"user", "assistant", "tool", "system"}
	m := abi.Message{Role: roles[rng.Intn(len(roles))], Content: randomString(rng)}
	switch m.Role {
	case "assistant":
		for k := rng.Intn(3); k > 0; k-- {
			expr, _ := json.Marshal(randomString(rng))
			args := json.RawMessage(fmt.Sprintf(`{"expression":%s,"n":%d,"x":[1,{"y":null}]}`, expr, rng.Intn(100)))
			if rng.Intn(4) == 0 {
				args = nil
			}
			m.ToolCalls = append(m.ToolCalls, abi.ToolCall{ID: fmt.Sprintf("call_%d", rng.Intn(1000)), Name: "calculate", Arguments: args})
		}
	case "tool":
		m.ToolCallID = fmt.Sprintf("call_%d", rng.Intn(1000))
		m.IsError = rng.Intn(3) == 0
	}
	return m
}

func randomBuildInput(rng *rand.Rand) abi.BuildInput {
	in := abi.BuildInput{ABI: 1, Run: abi.RunView{ID: "run_1", Tenant: "acme", Session: "s", Step: rng.Intn(5) + 1, Input: randomString(rng)}}
	if n := rng.Intn(61); n > 0 || rng.Intn(2) == 0 {
		in.History = []abi.Message{}
		for ; n > 0; n-- {
			in.History = append(in.History, randomMessage(rng))
		}
	}
	for n := rng.Intn(6); n > 0; n-- {
		in.Transcript = append(in.Transcript, randomMessage(rng))
	}
	for n := rng.Intn(6); n > 0; n-- {
		tool := abi.Tool{Name: fmt.Sprintf("tool_%d", n), Description: randomString(rng), Idempotent: rng.Intn(2) == 0}
		if rng.Intn(2) == 0 {
			tool.InputSchema = json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`)
			tool.Approval = "never"
		}
		in.Tools = append(in.Tools, tool)
	}
	if rng.Intn(10) == 0 {
		in.Tools = []abi.Tool{}
	}
	return in
}

// afterExport is an error's text after the plugin's name, which differs.
func afterExport(err error) string {
	s := err.Error()
	if i := strings.Index(s, "export[build]: "); i >= 0 {
		return s[i:]
	}
	return s
}
