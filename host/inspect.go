package host

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/agenthost/agenthost/plugins/abi"
)

// SupportedABIVersions are the ABI major versions this host speaks.
var SupportedABIVersions = []int{abi.Version}

// wasiModule is the WASI preview 1 import module; it is linked for every
// plugin (with no files, environment or network unless granted).
const wasiModule = "wasi_snapshot_preview1"

// moduleInfo is what the host learns from a module's exports and imports
// before any instance exists.
type moduleInfo struct {
	abiVersion    int   // the ABI version the host picked
	markers       []int // every ABI marker the module exports, ascending
	memoryExports int   // exported memories (each gets a capped allocator)
	// initExport is the guest runtime's initialiser (guestInitExport),
	// "" when the module has none.
	initExport string
}

// requiredExports are the exports each role must have, each () -> i32.
var requiredExports = map[abi.Role][]string{
	abi.RoleBuilder:  {abi.ExportDescribe, abi.ExportBuild},
	abi.RoleExecutor: {abi.ExportDescribe, abi.ExportStart, abi.ExportPoll, abi.ExportAttach, abi.ExportCancel},
}

// inspectModule runs the version handshake, checks the imports against
// what the host offers, and checks the exports that role needs. It reads
// the compiled module only: nothing is instantiated.
func inspectModule(cm wazero.CompiledModule, role abi.Role) (moduleInfo, error) {
	exports := cm.ExportedFunctions()
	info := moduleInfo{memoryExports: len(cm.ExportedMemories()), initExport: guestInitExport(exports)}
	v, markers, err := handshake(exports)
	if err != nil {
		return info, err
	}
	info.abiVersion, info.markers = v, markers
	if err := checkImports(cm); err != nil {
		return info, err
	}
	for _, name := range requiredExports[role] {
		def, ok := exports[name]
		if !ok {
			return info, fmt.Errorf("%w: a plugin loaded as %s must export %q (() -> i32); this module does not: rebuild it with every %s export of docs/ABI.md",
				ErrExportMissing, role, name, role)
		}
		if got := signature(def.ParamTypes(), def.ResultTypes()); got != "() -> i32" {
			return info, fmt.Errorf("%w: export %q has type %s, want () -> i32", ErrExportMissing, name, got)
		}
	}
	return info, nil
}

// guestInitExport names the guest runtime's initialiser among exports as
// extism go-sdk detects it: Haskell's hs_init (run after _initialize, when
// there is one), else a WASI reactor's _initialize, else a command's
// __wasm_call_ctors, each of the last two only without parameters; ""
// when there is none.
func guestInitExport(exports map[string]api.FunctionDefinition) string {
	if _, ok := exports["hs_init"]; ok {
		return "hs_init"
	}
	for _, name := range []string{"_initialize", "__wasm_call_ctors"} {
		if def, ok := exports[name]; ok && len(def.ParamTypes()) == 0 {
			return name
		}
	}
	return ""
}

// handshake finds the ABI markers among the exports and picks the highest
// version the host supports (docs/DESIGN.md §7).
func handshake(exports map[string]api.FunctionDefinition) (int, []int, error) {
	var markers []int
	for name, def := range exports {
		v, ok := abi.ParseMarker(name)
		if !ok {
			continue
		}
		if got := signature(def.ParamTypes(), def.ResultTypes()); got != "() -> ()" {
			return 0, nil, fmt.Errorf("%w: marker %q must be a function with no parameters and no results, it is %s",
				ErrABIMismatch, name, got)
		}
		markers = append(markers, v)
	}
	sort.Ints(markers)
	if len(markers) == 0 {
		return 0, nil, fmt.Errorf("%w: the module does not export the marker function %q, so it is not an agenthost ABI v%d plugin: export %q (no parameters, no results) from a plugin built for ABI v%d",
			ErrABIMismatch, abi.Marker, abi.Version, abi.Marker, abi.Version)
	}
	for i := len(markers) - 1; i >= 0; i-- {
		for _, s := range SupportedABIVersions {
			if markers[i] == s {
				return s, markers, nil
			}
		}
	}
	return 0, markers, fmt.Errorf("%w: the plugin speaks ABI %s (exports %s) and this host supports ABI %s (%s): use a build of the plugin for a supported version, or a newer agenthost",
		ErrABIMismatch, versions(markers), markerNames(markers), versions(SupportedABIVersions), markerNames(SupportedABIVersions))
}

func versions(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("v%d", v)
	}
	return strings.Join(s, ", ")
}

func markerNames(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = abi.MarkerFor(v)
	}
	return strings.Join(s, ", ")
}

// checkImports allows every extism:host/env and WASI import, the
// extism:host/user functions of abi.HostFuncs with their exact types, and
// nothing else.
func checkImports(cm wazero.CompiledModule) error {
	offered := map[string]abi.HostFunc{}
	names := make([]string, 0, len(abi.HostFuncs))
	for _, f := range abi.HostFuncs {
		offered[f.Name] = f
		names = append(names, f.Name)
	}
	for _, def := range cm.ImportedFunctions() {
		module, name, _ := def.Import()
		switch module {
		case abi.ExtismEnv, wasiModule:
			continue
		case abi.HostModule:
			f, ok := offered[name]
			got := signature(def.ParamTypes(), def.ResultTypes())
			if !ok {
				return fmt.Errorf("%w: import %s.%s %s is not a function this host offers (it offers %s): remove it or upgrade the host",
					ErrImportRefused, module, name, got, strings.Join(names, ", "))
			}
			if want := f.Signature(); got != want {
				return fmt.Errorf("%w: import %s.%s has type %s, but the host offers %s: declare it with the type in docs/ABI.md",
					ErrImportRefused, module, name, got, want)
			}
		default:
			return fmt.Errorf("%w: import %s.%s is from module %q, which the host does not provide (it provides %s, %s and %s)",
				ErrImportRefused, module, name, module, abi.HostModule, abi.ExtismEnv, wasiModule)
		}
	}
	for _, def := range cm.ImportedMemories() {
		module, name, _ := def.Import()
		return fmt.Errorf("%w: import %s.%s is a memory; a plugin must define its own memory, so that the host can cap it", ErrImportRefused, module, name)
	}
	return nil
}

// signature renders a wasm function type the way abi.HostFunc.Signature
// does: "(i64, i64) -> i64".
func signature(params, results []api.ValueType) string {
	ps := make([]string, len(params))
	for i, p := range params {
		ps[i] = api.ValueTypeName(p)
	}
	rs := make([]string, len(results))
	for i, r := range results {
		rs[i] = api.ValueTypeName(r)
	}
	return abi.HostFunc{Params: ps, Results: rs}.Signature()
}
