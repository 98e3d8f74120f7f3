package host

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

// agenthost_input_read and agenthost_output_set move a call's input and
// output by pointer into the plugin's own memory, on both call paths; a
// range outside that memory traps the call with an error that says so,
// and never panics the host.

// ioImports are replyImports and, as functions 3 and 4,
// agenthost_input_read and agenthost_output_set.
var ioImports = append(append([]wImport(nil), replyImports...),
	wImport{abi.HostModule, abi.HostInputRead, wFuncType{params: []byte{wI64, wI64}, results: []byte{wI64}}},
	wImport{abi.HostModule, abi.HostOutputSet, wFuncType{params: []byte{wI64, wI64}}},
)

// i64Const is the instruction i64.const v.
func i64Const(v int64) []byte { return appendSLEB([]byte{0x42}, v) }

// readLength, as ioBody's outLen, is the length agenthost_input_read
// returned.
const readLength = math.MinInt64

// ioBody is the body of a () -> i32 export that calls
// agenthost_input_read(readPtr, readLen), then
// agenthost_output_set(outPtr, outLen), and returns 0. A negative
// argument is 2^64 plus it, as the host sees the i64.
func ioBody(readPtr, readLen, outPtr, outLen int64) []byte {
	b := []byte{0x00} // no locals
	if outLen == readLength {
		b = append(b, i64Const(outPtr)...) // output_set's pointer, under input_read's result
	}
	b = append(b, i64Const(readPtr)...)
	b = append(b, i64Const(readLen)...)
	b = append(b, 0x10, 0x03) // call agenthost_input_read
	if outLen != readLength {
		b = append(b, 0x1a) // drop
		b = append(b, i64Const(outPtr)...)
		b = append(b, i64Const(outLen)...)
	}
	b = append(b, 0x10, 0x04)          // call agenthost_output_set
	return append(b, 0x41, 0x00, 0x0b) // i32.const 0; end
}

// ioModule is a complete executor whose describe answers initDescribe,
// with one more export for each of bodies.
func ioModule(bodies map[string][]byte) []byte {
	ex := executorExports(abi.Marker)
	for i := range ex {
		if ex[i].name == abi.ExportDescribe {
			ex[i].code = replyBody([]byte(initDescribe))
		}
	}
	for name, body := range bodies {
		ex = append(ex, wExport{name: name, typ: sigExport, code: body})
	}
	return tinyModule(ioImports, ex)
}

const pageBytes = 65536 // the ioModule's memory: one page

// echoedInput is the input of the calls below: long enough that a guest
// reading it 8 bytes a call would make hundreds of host calls.
var echoedInput = []byte(`{"abi":1,"effect":{"id":"run1.t1.0","attempt":1,"kind":"tool","tool":"t","request":{"arguments":{"text":"` +
	strings.Repeat("h\u00e9llo ", 400) + `"}}}}`)

func TestInputReadAndOutputSetOnBothPaths(t *testing.T) {
	type call struct {
		name   string
		body   []byte
		input  []byte
		want   []byte // the output, when the call succeeds
		errHas string // else the words of its error
	}
	calls := []call{
		{"the whole input, echoed", ioBody(100, pageBytes-100, 100, readLength), echoedInput, echoedInput, ""},
		{"the first 4 bytes", ioBody(100, 4, 100, 4), echoedInput, echoedInput[:4], ""},
		{"an empty output", ioBody(0, 0, 0, 0), echoedInput, []byte{}, ""},
		{"up to the memory's last byte", ioBody(pageBytes-5, 5, pageBytes-5, 5), echoedInput, echoedInput[:5], ""},
		{"an empty input", ioBody(100, 10, 100, readLength), []byte{}, []byte{}, ""},
		{"a length of 2^64-1: the whole input", ioBody(8, -1, 8, readLength), echoedInput, echoedInput, ""},
		{"read past the end", ioBody(pageBytes-4, 5, 0, 0), echoedInput, nil,
			"agenthost_input_read: the range of 5 bytes at 65532 is outside the plugin's memory of 65536 bytes"},
		{"read at 2^32", ioBody(1<<32, 1, 0, 0), echoedInput, nil,
			"agenthost_input_read: the range of 1 bytes at 4294967296 is outside the plugin's memory"},
		{"read at 2^64-1", ioBody(-1, 1, 0, 0), echoedInput, nil,
			"agenthost_input_read: the range of 1 bytes at 18446744073709551615 is outside"},
		{"output past the end", ioBody(0, 0, pageBytes, 1), echoedInput, nil,
			"agenthost_output_set: the range of 1 bytes at 65536 is outside the plugin's memory of 65536 bytes"},
		{"output at 2^63", ioBody(0, 0, -1<<63, 1), echoedInput, nil,
			"agenthost_output_set: the range of 1 bytes at 9223372036854775808 is outside"},
		{"output of 2^64-1 bytes", ioBody(0, 0, 8, -1), echoedInput, nil,
			"agenthost_output_set: the range of 18446744073709551615 bytes at 8 is outside"},
	}
	bodies := map[string][]byte{}
	for _, c := range calls {
		bodies[c.name] = c.body
	}
	module := ioModule(bodies)
	ctx := context.Background()
	for _, path := range []CallPath{CallPathNative, CallPathSDK} {
		t.Run(string(path), func(t *testing.T) {
			e := newEnv(t, Config{CallPath: path})
			p, err := e.h.Load(ctx, PluginSpec{Name: "io", Path: writeModule(t, module), Role: abi.RoleExecutor})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				out, err := p.CallRaw(ctx, cpTenant, c.name, c.input)
				if c.errHas == "" {
					if err != nil || !bytes.Equal(out, c.want) {
						t.Errorf("%s: got %q, %v; want %q", c.name, clipBytes(out), err, clipBytes(c.want))
					}
					continue
				}
				if err == nil || classOf(t, err) != abi.ClassPluginTrap || !strings.Contains(err.Error(), c.errHas) {
					t.Errorf("%s: got %q, %v; want a plugin_trap that says %q", c.name, clipBytes(out), err, c.errHas)
				}
			}
		})
	}
}

// clipBytes is b, cut to 40 bytes for a failure message.
func clipBytes(b []byte) []byte {
	if len(b) > 40 {
		return append(b[:40:40], "…"...)
	}
	return b
}
