package host

import "github.com/agenthost/agenthost/plugins/abi"

// A tiny WebAssembly binary encoder for the load-refusal tests: wazero has
// no text-format parser, so the test modules are written as bytes.

const (
	wI32 = 0x7f
	wI64 = 0x7e
)

type wFuncType struct{ params, results []byte }

type wImport struct {
	module, name string
	typ          wFuncType
}

type wExport struct {
	name string
	typ  wFuncType // () -> () or () -> i32 bodies are generated
	// code, when set, is the function's whole body (locals and
	// instructions, with the final end).
	code []byte
}

func uleb(n int) []byte { return appendULEB(nil, uint64(n)) }

func wName(s string) []byte { return append(uleb(len(s)), s...) }

func wVec(items [][]byte) []byte {
	out := uleb(len(items))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func wSection(id byte, body []byte) []byte {
	return append(append([]byte{id}, uleb(len(body))...), body...)
}

// tinyModule encodes a module that imports the given functions and
// exports one function per export, plus one page of memory exported as
// "memory". Exported bodies return nothing or i32 0.
func tinyModule(imports []wImport, exports []wExport) []byte {
	var types [][]byte
	typeIndex := func(ft wFuncType) int {
		enc := append([]byte{0x60}, append(wVec(bytesEach(ft.params)), wVec(bytesEach(ft.results))...)...)
		for i, t := range types {
			if string(t) == string(enc) {
				return i
			}
		}
		types = append(types, enc)
		return len(types) - 1
	}
	var imps, funcs, exps, codes [][]byte
	for _, im := range imports {
		imps = append(imps, append(append(wName(im.module), wName(im.name)...), append([]byte{0x00}, uleb(typeIndex(im.typ))...)...))
	}
	for i, ex := range exports {
		funcs = append(funcs, uleb(typeIndex(ex.typ)))
		exps = append(exps, append(wName(ex.name), append([]byte{0x00}, uleb(len(imports)+i)...)...))
		body := ex.code
		if body == nil {
			body = []byte{0x00} // no locals
			if len(ex.typ.results) == 1 {
				body = append(body, 0x41, 0x00) // i32.const 0
			}
			body = append(body, 0x0b)
		}
		codes = append(codes, append(uleb(len(body)), body...))
	}
	exps = append(exps, append(wName("memory"), 0x02, 0x00))
	mod := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	mod = append(mod, wSection(1, wVec(types))...)
	if len(imps) > 0 {
		mod = append(mod, wSection(2, wVec(imps))...)
	}
	mod = append(mod, wSection(3, wVec(funcs))...)
	mod = append(mod, wSection(5, wVec([][]byte{{0x00, 0x01}}))...) // memory min 1
	mod = append(mod, wSection(7, wVec(exps))...)
	mod = append(mod, wSection(10, wVec(codes))...)
	return mod
}

func bytesEach(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i, c := range b {
		out[i] = []byte{c}
	}
	return out
}

var (
	sigMarker = wFuncType{}
	sigExport = wFuncType{results: []byte{wI32}}
)

// executorExports are a complete executor's exports, after the markers.
func executorExports(markers ...string) []wExport {
	var ex []wExport
	for _, m := range markers {
		ex = append(ex, wExport{name: m, typ: sigMarker})
	}
	for _, n := range []string{"describe", "start", "poll", "attach", "cancel"} {
		ex = append(ex, wExport{name: n, typ: sigExport})
	}
	return ex
}

// replyImports are the Extism kernel functions a replyBody calls, as
// imports 0, 1 and 2.
var replyImports = []wImport{
	{"extism:host/env", "alloc", wFuncType{params: []byte{wI64}, results: []byte{wI64}}},
	{"extism:host/env", "store_u8", wFuncType{params: []byte{wI64, wI32}}},
	{"extism:host/env", "output_set", wFuncType{params: []byte{wI64, wI64}}},
}

// replyBody is the body of a () -> i32 export that writes reply as its
// output (one store_u8 per byte) and returns 0. The module must import
// replyImports first.
func replyBody(reply []byte) []byte {
	b := []byte{0x01, 0x01, wI64} // one i64 local: the output's offset
	b = append(b, 0x42)
	b = appendSLEB(b, int64(len(reply)))
	b = append(b, 0x10, 0x00, 0x21, 0x00) // call alloc; local.set 0
	for i, c := range reply {
		b = append(b, 0x20, 0x00, 0x42)
		b = appendSLEB(b, int64(i))
		b = append(b, 0x7c, 0x41) // i64.add; i32.const
		b = appendSLEB(b, int64(c))
		b = append(b, 0x10, 0x01) // call store_u8
	}
	b = append(b, 0x20, 0x00, 0x42)
	b = appendSLEB(b, int64(len(reply)))
	b = append(b, 0x10, 0x02, 0x41, 0x00, 0x0b) // call output_set; i32.const 0; end
	return b
}

// describingModule is a complete executor whose describe answers reply.
func describingModule(reply string) []byte { return describingModuleAs(abi.RoleExecutor, reply) }

// describingModuleAs is a module with every export of role whose describe
// answers reply.
func describingModuleAs(role abi.Role, reply string) []byte {
	ex := []wExport{{name: abi.Marker, typ: sigMarker}}
	for _, n := range requiredExports[role] {
		ex = append(ex, wExport{name: n, typ: sigExport})
	}
	for i := range ex {
		if ex[i].name == "describe" {
			ex[i].code = replyBody([]byte(reply))
		}
	}
	return tinyModule(replyImports, ex)
}
