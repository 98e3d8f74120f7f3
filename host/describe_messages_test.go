package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/abidoc"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/plugins/abi/schema"
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

// TestTheHostsDescribeChecksAgreeWithTheSchema loads, as hand-made
// modules, every describe reply of the schema corpus
// (plugins/abi/schema/testdata/corpus.json), and checks that the host
// accepts exactly those that describe-reply.json accepts.
func TestTheHostsDescribeChecksAgreeWithTheSchema(t *testing.T) {
	raw, err := os.ReadFile("../plugins/abi/schema/testdata/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus []struct {
		Schema  string          `json:"schema"`
		Valid   bool            `json:"valid"`
		Why     string          `json:"why"`
		Message json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(raw, &corpus); err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	for _, n := range schema.Names() {
		b, _ := schema.Document(n)
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(schema.BaseURL+n, doc); err != nil {
			t.Fatal(err)
		}
	}
	sch, err := c.Compile(schema.BaseURL + "describe-reply.json")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, Config{})
	n := 0
	for i, k := range corpus {
		if k.Schema != "describe-reply.json" {
			continue
		}
		n++
		t.Run(k.Why, func(t *testing.T) {
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(k.Message))
			if err != nil {
				t.Fatal(err)
			}
			schemaOK := sch.Validate(v) == nil
			role := abi.RoleExecutor
			var probe struct {
				Role abi.Role `json:"role"`
			}
			if json.Unmarshal(k.Message, &probe) == nil && probe.Role == abi.RoleBuilder {
				role = abi.RoleBuilder
			}
			p, err := e.h.Load(context.Background(), PluginSpec{Name: fmt.Sprintf("d%d", i), Path: writeModule(t, describingModuleAs(role, string(k.Message))), Role: role})
			if err == nil {
				p.Close(context.Background())
			}
			if hostOK := err == nil; hostOK != schemaOK || hostOK != k.Valid {
				t.Fatalf("want valid=%v; the schema says %v; the host says %v\n%s", k.Valid, schemaOK, err, k.Message)
			}
		})
	}
	if n < 30 {
		t.Fatalf("only %d describe replies in the corpus", n)
	}
	// And every describe example of docs/ABI.md, loaded with the role its
	// check marker names.
	examples, err := abidoc.Read("../docs/ABI.md")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, ex := range examples {
		if len(ex.What) != 2 || ex.What[0] != "describe" {
			continue
		}
		role, body := ex.What[1], string(ex.JSON)
		found++
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
		if err != nil {
			t.Fatalf("docs/ABI.md:%d: %v", ex.Line, err)
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("docs/ABI.md:%d: the schema refuses the example: %v", ex.Line, err)
		}
		p, err := e.h.Load(context.Background(), PluginSpec{Name: fmt.Sprintf("doc%d", ex.Line), Path: writeModule(t, describingModuleAs(abi.Role(role), body)), Role: abi.Role(role)})
		if err != nil {
			t.Errorf("docs/ABI.md:%d: the host refuses the example: %v", ex.Line, err)
			continue
		}
		p.Close(context.Background())
	}
	if found < 2 {
		t.Fatalf("found %d describe examples in docs/ABI.md; the markers were lost", found)
	}
}
