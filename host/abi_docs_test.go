package host

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/agenthost/agenthost/plugins/abi"
)

// docImport is one row of an imports table of docs/ABI.md.
type docImport struct {
	line             int
	name, wasm, cSig string
}

// docImports reads the table after "<!-- imports: MODULE -->".
func docImports(t *testing.T, module string) []docImport {
	t.Helper()
	raw, err := os.ReadFile("../docs/ABI.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docImport
	in := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "<!-- imports: "+module+" -->":
			in = true
		case in && l == "":
			if len(out) > 0 {
				return out
			}
		case in && strings.HasPrefix(l, "| `"):
			cells := strings.Split(strings.Trim(l, "|"), "|")
			if len(cells) < 3 {
				t.Fatalf("docs/ABI.md:%d: a row needs import, wasm type and C prototype", n)
			}
			unq := func(s string) string { return strings.Trim(strings.TrimSpace(s), "`") }
			out = append(out, docImport{line: n, name: unq(cells[0]), wasm: unq(cells[1]), cSig: unq(cells[2])})
		}
	}
	t.Fatalf("docs/ABI.md has no imports table for %s", module)
	return nil
}

var cProto = regexp.MustCompile(`^(\w+) (\w+)\((.*)\)$`)

// cToWasm maps a C prototype to its wasm type for clang's wasm32 target.
func cToWasm(t *testing.T, proto string) (name, sig string) {
	t.Helper()
	m := cProto.FindStringSubmatch(proto)
	if m == nil {
		t.Fatalf("%q is not a C prototype", proto)
	}
	typ := func(c string) string {
		switch c {
		case "uint64_t", "int64_t":
			return "i64"
		case "uint32_t", "int32_t":
			return "i32"
		}
		t.Errorf("%q: C type %q is not one of uint64_t, int64_t, uint32_t, int32_t, void", proto, c)
		return "?"
	}
	var ps, rs []string
	if m[3] != "void" {
		for _, p := range strings.Split(m[3], ",") {
			ps = append(ps, typ(strings.Fields(p)[0]))
		}
	}
	if m[1] != "void" {
		rs = []string{typ(m[1])}
	}
	return m[2], abi.HostFunc{Params: ps, Results: rs}.Signature()
}

// TestTheDocsImportTablesAreTheHostsImports checks the imports tables of
// docs/ABI.md against what the host links: every function of
// extism:host/env and of extism:host/user, each with its wasm type, and
// C prototypes whose types are those wasm types.
func TestTheDocsImportTablesAreTheHostsImports(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	env, err := e.h.envModule(rt).Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]map[string]string{abi.ExtismEnv: {}, abi.HostModule: {}}
	for name, d := range env.ExportedFunctionDefinitions() {
		have[abi.ExtismEnv][name] = signature(d.ParamTypes(), d.ResultTypes())
	}
	for _, f := range abi.HostFuncs {
		have[abi.HostModule][f.Name] = f.Signature()
	}
	for _, module := range []string{abi.ExtismEnv, abi.HostModule} {
		rows := docImports(t, module)
		var documented []string
		for _, r := range rows {
			documented = append(documented, r.name)
			want, ok := have[module][r.name]
			if !ok {
				t.Errorf("docs/ABI.md:%d: %s.%s is not a function the host links", r.line, module, r.name)
				continue
			}
			if r.wasm != want {
				t.Errorf("docs/ABI.md:%d: %s.%s is %s in the doc, %s in the host", r.line, module, r.name, r.wasm, want)
			}
			name, sig := cToWasm(t, r.cSig)
			if name != r.name || sig != want {
				t.Errorf("docs/ABI.md:%d: the C prototype %q is %s %s; want %s %s", r.line, r.cSig, name, sig, r.name, want)
			}
		}
		for name := range have[module] {
			if !slices.Contains(documented, name) {
				t.Errorf("docs/ABI.md: the %s table lacks %s (%s)", module, name, have[module][name])
			}
		}
	}
}
