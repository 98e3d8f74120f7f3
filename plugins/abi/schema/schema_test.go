package schema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/plugins/abi/schema"

	"github.com/agenthost/agenthost/internal/abidoc"
)

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s is not one of the ABI's documents", url)
}

// compiler knows every document by its $id, and loads nothing else.
func compiler(t *testing.T) *jsonschema.Compiler {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	for _, n := range schema.Names() {
		raw, err := schema.Document(n)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		var id struct {
			ID string `json:"$id"`
		}
		if err := json.Unmarshal(raw, &id); err != nil || id.ID != schema.BaseURL+n {
			t.Fatalf("%s: $id is %q, want %q", n, id.ID, schema.BaseURL+n)
		}
		if err := c.AddResource(schema.BaseURL+n, doc); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
	return c
}

func TestEveryDocumentCompiles(t *testing.T) {
	if len(schema.Names()) < 12 {
		t.Fatalf("only %d documents: %v", len(schema.Names()), schema.Names())
	}
	c := compiler(t)
	for _, n := range schema.Names() {
		if _, err := c.Compile(schema.BaseURL + n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// goCheck is the Go validator a document stands for, by its reference.
func goCheck(ref string) (func([]byte) error, bool) {
	kindOf := func(s string) abi.EffectKind {
		if strings.HasPrefix(s, "model") {
			return abi.KindModel
		}
		return abi.KindTool
	}
	doc, def, _ := strings.Cut(ref, "#/$defs/")
	switch doc {
	case "describe-reply.json":
		return func(b []byte) error { _, err := abi.DecodeDescribe(b, ""); return err }, true
	case "build-reply.json":
		return func(b []byte) error { _, err := abi.DecodeBuildOutput(b); return err }, true
	case "effect-reply.json":
		if def == "" || def == "envelope" || def == "notUnknown" {
			return nil, false
		}
		export := abi.ExportPoll
		if strings.HasSuffix(def, "-start") {
			export = abi.ExportStart
		}
		return func(b []byte) error { _, err := abi.DecodeEffectReply(b, kindOf(def), export); return err }, true
	case "cancel-reply.json":
		if def != "model" && def != "tool" {
			return nil, false
		}
		return func(b []byte) error { _, err := abi.DecodeCancelReply(b, kindOf(def)); return err }, true
	case "model-outcome.json":
		return func(b []byte) error { _, err := abi.DecodeModelOutcome(b); return err }, true
	case "tool-outcome.json":
		return func(b []byte) error { _, err := abi.DecodeToolOutcome(b); return err }, true
	}
	return nil, false
}

func validate(t *testing.T, c *jsonschema.Compiler, ref string, data []byte) error {
	t.Helper()
	sch, err := c.Compile(schema.BaseURL + ref)
	if err != nil {
		t.Fatalf("compile %s: %v", ref, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}

type corpusCase struct {
	Schema  string          `json:"schema"`
	Valid   bool            `json:"valid"`
	Why     string          `json:"why"`
	Message json.RawMessage `json:"message"`
}

// TestTheSchemasAndTheValidatorsAgreeOnTheCorpus holds each document to
// the Go validator it stands for on testdata/corpus.json: messages that
// are valid, and messages that break one rule each.
func TestTheSchemasAndTheValidatorsAgreeOnTheCorpus(t *testing.T) {
	raw, err := os.ReadFile("testdata/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus []corpusCase
	if err := json.Unmarshal(raw, &corpus); err != nil {
		t.Fatal(err)
	}
	c := compiler(t)
	invalid := 0
	for _, k := range corpus {
		t.Run(k.Schema+": "+k.Why, func(t *testing.T) {
			check, ok := goCheck(k.Schema)
			if !ok {
				t.Fatalf("no Go validator stands for %s", k.Schema)
			}
			goErr := check(k.Message)
			schErr := validate(t, c, k.Schema, k.Message)
			if (goErr == nil) != k.Valid || (schErr == nil) != k.Valid {
				t.Fatalf("want valid=%v; the Go validator says %v; the schema says %v\n%s", k.Valid, goErr, schErr, k.Message)
			}
		})
		if !k.Valid {
			invalid++
		}
	}
	if invalid < 70 {
		t.Fatalf("the corpus has %d invalid messages; it was cut", invalid)
	}
}

// docExample is a JSON block of docs/ABI.md marked "<!-- check: what
// [args] -->", the markers plugins/abi's doc test reads too.
type docExample = abidoc.Example

func docExamples(t *testing.T) []docExample {
	t.Helper()
	out, err := abidoc.Read("../../../docs/ABI.md")
	if err != nil {
		t.Fatalf("docs/ABI.md is the contract this package implements: %v", err)
	}
	return out
}

// docSchema is the document (and Go validator) of a doc example.
func docSchema(what []string) string {
	arg := func(i int) string {
		if i < len(what) {
			return what[i]
		}
		return ""
	}
	switch arg(0) {
	case "describe":
		return "describe-reply.json"
	case "build-input":
		return "build-input.json"
	case "build-output":
		return "build-reply.json"
	case "effect-input":
		return "effect-input.json"
	case "effect-reply":
		if arg(2) == abi.ExportStart {
			return "effect-reply.json#/$defs/" + arg(1) + "-start"
		}
		return "effect-reply.json#/$defs/" + arg(1)
	case "cancel-reply":
		return "cancel-reply.json#/$defs/" + arg(1)
	case "model-outcome":
		return "model-outcome.json"
	case "tool-outcome":
		return "tool-outcome.json"
	case "emit":
		return "emit-event.json"
	case "http-request":
		return "http-request.json"
	case "http-response":
		return "http-response.json"
	case "http-stream-head":
		return "http-stream-head.json"
	case "http-stream-end":
		return "http-stream-end.json"
	case "describe-input":
		return "describe-input.json"
	}
	return ""
}

// TestEveryExampleOfTheDocPassesItsSchema checks every marked JSON example
// of docs/ABI.md against its document and, where one stands for it, the
// Go validator: a doc change that breaks either fails here.
func TestEveryExampleOfTheDocPassesItsSchema(t *testing.T) {
	examples := docExamples(t)
	if len(examples) < 20 {
		t.Fatalf("found %d checked examples in docs/ABI.md; the markers were lost", len(examples))
	}
	c := compiler(t)
	seen := map[string]bool{}
	for _, ex := range examples {
		ref := docSchema(ex.What)
		t.Run(fmt.Sprintf("%s@%d", strings.Join(ex.What, "_"), ex.Line), func(t *testing.T) {
			if ref == "" {
				t.Fatalf("docs/ABI.md:%d: no document for check %v", ex.Line, ex.What)
			}
			if err := validate(t, c, ref, ex.JSON); err != nil {
				t.Fatalf("docs/ABI.md:%d: %s: %v\n%s", ex.Line, ref, err, ex.JSON)
			}
			if check, ok := goCheck(ref); ok {
				data := ex.JSON
				if ex.What[0] == "describe" && len(ex.What) > 1 {
					if _, err := abi.DecodeDescribe(data, abi.Role(ex.What[1])); err != nil {
						t.Fatalf("docs/ABI.md:%d: %v", ex.Line, err)
					}
				}
				if err := check(data); err != nil {
					t.Fatalf("docs/ABI.md:%d: the Go validator: %v", ex.Line, err)
				}
			}
		})
		seen[strings.SplitN(ref, "#", 2)[0]] = true
	}
	for _, n := range schema.Names() {
		if n != "common.json" && n != "kv-status.json" && !seen[n] {
			t.Errorf("docs/ABI.md has no checked example for %s", n)
		}
	}
}

func TestKVStatusesAreTheABIsCodes(t *testing.T) {
	c := compiler(t)
	for _, s := range []abi.Status{abi.StatusOK, abi.StatusTooLarge, abi.StatusStoreUnavailable, abi.StatusRefused} {
		if err := validate(t, c, "kv-status.json", []byte(fmt.Sprint(int64(s)))); err != nil {
			t.Errorf("status %d: %v", s, err)
		}
	}
	for _, bad := range []string{"4", "-1", `"0"`, "1.5"} {
		if validate(t, c, "kv-status.json", []byte(bad)) == nil {
			t.Errorf("status %s passed", bad)
		}
	}
}
