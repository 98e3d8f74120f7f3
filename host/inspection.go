package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"sort"

	"github.com/tetratelabs/wazero"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Inspection is what a module's exports and imports say, read without
// running any of its code: the ABI markers, and whether the host would
// accept its imports.
type Inspection struct {
	// Markers are the ABI versions of the module's agenthost_abi_vN
	// exports, ascending; ABIVersion is the one the host would pick (0
	// when none is supported).
	Markers    []int
	ABIVersion int
	// Handshake is the host's refusal of the markers, or nil.
	Handshake error
	// ImportsRefused is the host's refusal of an import, or nil.
	ImportsRefused error
	// Exports and Imports list the module's functions with their wasm
	// types, sorted.
	Exports []Func
	Imports []Func
	// Role is the role the exports suggest ("" when they suggest none):
	// a builder exports build, an executor exports start.
	Role abi.Role
	// SHA256 is the file's hex sha256.
	SHA256 string
}

// Func is one imported or exported function.
type Func struct {
	Module    string // "" for an export
	Name      string
	Signature string // "(i64) -> i64"
}

func (f Func) String() string {
	if f.Module != "" {
		return fmt.Sprintf("%s.%s %s", f.Module, f.Name, f.Signature)
	}
	return f.Name + " " + f.Signature
}

// Inspect compiles the module at path (through the host's compilation
// cache) and reports its markers, exports and imports. Nothing is
// instantiated. An error means the file could not be read or is not
// WebAssembly; the host's refusals are fields of the Inspection.
func (h *Host) Inspect(ctx context.Context, path string) (Inspection, error) {
	wasm, err := os.ReadFile(path)
	if err != nil {
		return Inspection{}, fmt.Errorf("host: inspect %s: %w", path, err)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, h.runtimeConfig())
	defer rt.Close(context.WithoutCancel(ctx))
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return Inspection{}, fmt.Errorf("host: inspect %s: not a valid WebAssembly module: %w", path, err)
	}
	var in Inspection
	in.SHA256 = sha256Hex(wasm)
	exports := cm.ExportedFunctions()
	for name, def := range exports {
		in.Exports = append(in.Exports, Func{Name: name, Signature: signature(def.ParamTypes(), def.ResultTypes())})
		if v, ok := abi.ParseMarker(name); ok {
			in.Markers = append(in.Markers, v)
		}
	}
	sort.Ints(in.Markers)
	for _, def := range cm.ImportedFunctions() {
		module, name, _ := def.Import()
		in.Imports = append(in.Imports, Func{Module: module, Name: name, Signature: signature(def.ParamTypes(), def.ResultTypes())})
	}
	sort.Slice(in.Exports, func(i, j int) bool { return in.Exports[i].Name < in.Exports[j].Name })
	sort.Slice(in.Imports, func(i, j int) bool {
		return in.Imports[i].Module+"."+in.Imports[i].Name < in.Imports[j].Module+"."+in.Imports[j].Name
	})
	in.ABIVersion, _, in.Handshake = handshake(exports)
	in.ImportsRefused = checkImports(cm)
	switch {
	case exports[abi.ExportBuild] != nil:
		in.Role = abi.RoleBuilder
	case exports[abi.ExportStart] != nil:
		in.Role = abi.RoleExecutor
	}
	return in, nil
}

// CallRaw runs one export of the plugin with a raw input, on an instance
// of tenant's pool, under the plugin's limits, and returns its raw output
// without decoding it. Failures are classified as the runtime's calls are
// (a *runtime.PluginError for the plugin's own). It is for tools that
// check a plugin against the ABI (agenthost plugin verify); Runs go
// through Executor and Builder.
func (p *Plugin) CallRaw(ctx context.Context, tenant, export string, input []byte) ([]byte, error) {
	if tenant == "" {
		return nil, fmt.Errorf("host: plugin[%s] export[%s]: the call has no tenant", p.name, export)
	}
	return p.call(ctx, &callScope{plugin: p, export: export, tenant: tenant}, input)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
