package host

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestDescribeRefusalsSayWhatIsWrongOnce loads hand-made executors whose
// describe answers a given reply, and checks each refusal: one "host: "
// prefix, advice that fits the error, the grammar of roles, and, for a
// reply that is not JSON, its length and an excerpt at the offset.
func TestDescribeRefusalsSayWhatIsWrongOnce(t *testing.T) {
	e := newEnv(t, Config{})
	for _, c := range []struct {
		name, reply string
		want        []string
		not         []string
	}{
		{"a builder's describe loaded as an executor", `{"abi":1,"name":"x","role":"builder"}`,
			[]string{`role: is "builder", but the plugin is loaded as an executor; load it where a builder is wanted`},
			[]string{"a executor", "load it with the role it reports", "fix the plugin's describe"}},
		{"a schema of the wrong type", `{"abi":1,"name":"x","role":"executor","effects":["tool"],"tools":[{"name":"t","input_schema":{"type":"string"}}]}`,
			[]string{`tools[0].input_schema.type: is "string"`, `fix the plugin's describe reply (docs/ABI.md, "describe")`},
			[]string{"role it reports"}},
		{"a schema that cannot check arguments", `{"abi":1,"name":"x","role":"executor","effects":["tool"],"tools":[{"name":"t","input_schema":{"type":"object","$ref":"file:///etc/passwd"}}]}`,
			[]string{"tools[0].input_schema (tool t) cannot check arguments", "outside the schema", "fix the tool's input_schema"},
			[]string{"role it reports"}},
		{"a corrupt reply", `{"abi":1, "name": fa lse}`,
			[]string{"invalid character ' ' in literal false", `(at byte 21 of 25: "{\"abi\":1, \"name\": fa" ⟨here⟩ " lse}")`},
			[]string{"role it reports"}},
		{"a reply that is not JSON at all", "\x01\x02 not json",
			[]string{"is not valid JSON (want a JSON object)", `(at byte 1 of 11: "" ⟨here⟩ "\x01\x02 not json")`},
			nil},
		{"a long corrupt reply shows an excerpt", `{"abi":1,"name":"` + strings.Repeat("a", 200) + `"` + strings.Repeat("b", 200) + `}`,
			[]string{"at byte 219 of 419:", `…"aaaaaaaaaaaaaaaaaaaaaaa\"" ⟨here⟩ "bbbbbbbbbbbbbbbbbbbbbbbb"…`},
			nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.h.Load(context.Background(), PluginSpec{Name: "tiny", Path: writeModule(t, describingModule(c.reply)), Role: abi.RoleExecutor})
			if !errors.Is(err, ErrDescribe) {
				t.Fatalf("got %v, want ErrDescribe", err)
			}
			msg := err.Error()
			if n := strings.Count(msg, "host: "); n != 1 || !strings.HasPrefix(msg, "host: plugin[tiny] export[describe]: plugin_protocol: describe refused: describe reply: ") {
				t.Errorf("want one prefix, got %q", msg)
			}
			if strings.Contains(msg, "abi: ") {
				t.Errorf("the abi's prefix is repeated: %q", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q does not say %q", msg, w)
				}
			}
			for _, w := range c.not {
				if strings.Contains(msg, w) {
					t.Errorf("%q says %q", msg, w)
				}
			}
		})
	}
}

func TestLoadRefusalsHaveOnePrefix(t *testing.T) {
	e := newEnv(t, Config{})
	wasm := tinyModule([]wImport{{"env", "abort", wFuncType{}}}, executorExports("agenthost_abi_v1"))
	_, err := e.h.Load(context.Background(), PluginSpec{Name: "tiny", Path: writeModule(t, wasm), Role: abi.RoleExecutor})
	if !errors.Is(err, ErrImportRefused) {
		t.Fatalf("got %v", err)
	}
	if msg := err.Error(); strings.Count(msg, "host: ") != 1 || !strings.Contains(msg, ": load ") || !strings.Contains(msg, ": import refused: import env.abort") {
		t.Fatalf("want one prefix: %q", msg)
	}
}

func TestAPluginLoadedAsOneRoleSaysSoGrammatically(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.load(t, conformance.PluginExecutor, abi.RoleExecutor, nil)
	if _, err := x.Builder(); err == nil || !strings.Contains(err.Error(), "loaded as an executor, not a builder") {
		t.Fatalf("got %v", err)
	}
	b := e.load(t, conformance.PluginBuilder, abi.RoleBuilder, nil)
	if _, err := b.Executor(); err == nil || !strings.Contains(err.Error(), "loaded as a builder, not an executor") {
		t.Fatalf("got %v", err)
	}
}
