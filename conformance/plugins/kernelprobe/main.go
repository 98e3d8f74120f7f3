//go:build wasip1

// Command kernelprobe is a conformance executor that also exports probe, a
// small interpreter of raw extism:host/env (and extism:host/user) calls: the
// differential test of the host's two call paths (host.TestCallPathsAgree,
// host.FuzzHostFunctionBounds) runs the same probe programs on both and
// compares what comes back. As an executor it is well behaved: describe,
// start (tool "echo" answers its text argument), poll and attach (unknown),
// cancel (unknown), through go-pdk like the other conformance plugins.
//
// probe reads its input with the raw imports input_length, input_load_u64
// (whole 8-byte words) and input_load_u8 (the tail), never through go-pdk,
// and runs it as a program: a sequence of ops, each one byte
//
//	op = byte % 35
//
// followed by its operands. The ops, with their operands (a, b) and result:
//
//	 0 alloc(a) -> offset          17 var_set(a, b)
//	 1 free(a)                     18 log_info(a)
//	 2 length(a) -> n              19 memory_bytes() -> n
//	 3 length_unsafe(a) -> n       20 output_length() -> n
//	 4 load_u8(a) -> byte          21 output_offset() -> offset
//	 5 load_u64(a) -> word         22 get_log_level() -> level
//	 6 store_u8(a, b)  (b as u32)  23 bytes: a length byte L and L data bytes
//	 7 store_u64(a, b)                follow (no operands); alloc(L), then
//	 8 input_load_u8(a) -> byte       store_u8 of each byte -> offset
//	 9 input_load_u64(a) -> word   24 agenthost_kv_get(a) -> offset
//	10 input_offset() -> offset    25 agenthost_kv_set(a, b) -> status
//	11 input_length() -> n         26 agenthost_kv_delete(a) -> status
//	12 output_set(a, b)            27 agenthost_emit(a) -> status
//	13 error_set(a)                28 agenthost_now_ms() -> ms
//	14 error_get() -> offset       29 agenthost_http(a) -> offset
//	15 config_get(a) -> offset     30 http_request(a, b) -> offset (Extism's)
//	16 var_get(a) -> offset        31 status(a): probe returns a (as i32) -> a
//	32 trap(a): a%2 == 0 loads a byte at 0xFFFFFFF0 of the guest's own
//	   memory (a Wasm out-of-bounds trap: Go has no unreachable instruction);
//	   a%2 == 1 is a Go panic (the runtime prints it to stderr and traps)
//	33 log(a, b): log_trace, log_debug, log_info, log_warn or log_error
//	   (by a%5) of b
//	34 end: the program stops here (no result); the rest of the input is
//	   data, which the program may read with input_load_u8/u64
//
// reset is left out on purpose: no PDK calls it inside a call.
//
// An operand starts with a tag byte t; by t&3:
//
//	0  a literal: the next 8 bytes, little-endian
//	1  a small literal: t>>2 (0..63)
//	2  a reference: a byte k and a little-endian int16 d follow; the value
//	   is the result of op #k (counting from 0; k past the last result
//	   wraps modulo their number, and with none the value is 0) plus d,
//	   wrapping: "the offset alloc returned, minus 12" is a header
//	3  a constant: specials[(t>>2) % len(specials)] (below), for the
//	   edges of the kernel's arena and of 64-bit arithmetic
//
// A program that ends inside an op stops before that op. Every op records
// one u64 (0 for an op with no result). When the program ends, probe writes
// them as its output, 8 bytes little-endian each, then one byte with the
// number of ops modulo 256, with alloc, store_u64, store_u8 and output_set,
// unless the last op other than status was output_set or error_set (the
// program's own output or error stands). probe returns the status of the
// last status op, 0 without one.
//
// For tests; not a stable API.
package main

import (
	"encoding/json"
	"unsafe"

	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return kit.Describe(abi.Describe{
		Name: "conformance-kernelprobe", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool},
		Tools: []abi.Tool{{Name: "echo", Description: "Return the text argument",
			InputSchema: json.RawMessage(`{"type":"object"}`), Idempotent: true, Approval: abi.ApprovalNever}},
	})
}

//go:wasmexport start
func start() int32 {
	var in abi.EffectInput
	if err := kit.Input(&in); err != nil {
		return kit.Fail("start: bad input: " + err.Error())
	}
	var req abi.ToolRequest
	_ = json.Unmarshal(in.Effect.Request, &req)
	var args struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(req.Arguments, &args)
	if in.Effect.Tool != "echo" {
		return kit.Failed("unknown tool "+in.Effect.Tool, false)
	}
	return kit.Done(args.Text)
}

//go:wasmexport poll
func poll() int32 { return kit.Reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport attach
func attach() int32 { return kit.Reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport cancel
func cancel() int32 { return kit.Reply(abi.CancelReply{State: abi.StateUnknown}) }

// The raw Extism imports, with go-sdk v1.7.1's wasm types.

//go:wasmimport extism:host/env alloc
func extAlloc(n uint64) uint64

//go:wasmimport extism:host/env free
func extFree(p uint64)

//go:wasmimport extism:host/env length
func extLength(p uint64) uint64

//go:wasmimport extism:host/env length_unsafe
func extLengthUnsafe(p uint64) uint64

//go:wasmimport extism:host/env load_u8
func extLoadU8(p uint64) uint32

//go:wasmimport extism:host/env load_u64
func extLoadU64(p uint64) uint64

//go:wasmimport extism:host/env store_u8
func extStoreU8(p uint64, v uint32)

//go:wasmimport extism:host/env store_u64
func extStoreU64(p, v uint64)

//go:wasmimport extism:host/env input_load_u8
func extInputLoadU8(i uint64) uint32

//go:wasmimport extism:host/env input_load_u64
func extInputLoadU64(i uint64) uint64

//go:wasmimport extism:host/env input_offset
func extInputOffset() uint64

//go:wasmimport extism:host/env input_length
func extInputLength() uint64

//go:wasmimport extism:host/env output_set
func extOutputSet(p, n uint64)

//go:wasmimport extism:host/env output_length
func extOutputLength() uint64

//go:wasmimport extism:host/env output_offset
func extOutputOffset() uint64

//go:wasmimport extism:host/env error_set
func extErrorSet(p uint64)

//go:wasmimport extism:host/env error_get
func extErrorGet() uint64

//go:wasmimport extism:host/env config_get
func extConfigGet(p uint64) uint64

//go:wasmimport extism:host/env var_get
func extVarGet(p uint64) uint64

//go:wasmimport extism:host/env var_set
func extVarSet(p, q uint64)

//go:wasmimport extism:host/env memory_bytes
func extMemoryBytes() uint64

//go:wasmimport extism:host/env get_log_level
func extGetLogLevel() int32

//go:wasmimport extism:host/env http_request
func extHTTPRequest(p, q uint64) uint64

//go:wasmimport extism:host/env log_trace
func extLogTrace(p uint64)

//go:wasmimport extism:host/env log_debug
func extLogDebug(p uint64)

//go:wasmimport extism:host/env log_info
func extLogInfo(p uint64)

//go:wasmimport extism:host/env log_warn
func extLogWarn(p uint64)

//go:wasmimport extism:host/env log_error
func extLogError(p uint64)

// The agenthost host functions, called with raw offsets.

//go:wasmimport extism:host/user agenthost_kv_get
func hostKVGet(key uint64) uint64

//go:wasmimport extism:host/user agenthost_kv_set
func hostKVSet(key, value uint64) uint64

//go:wasmimport extism:host/user agenthost_kv_delete
func hostKVDelete(key uint64) uint64

//go:wasmimport extism:host/user agenthost_emit
func hostEmit(event uint64) uint64

//go:wasmimport extism:host/user agenthost_now_ms
func hostNowMS() uint64

//go:wasmimport extism:host/user agenthost_http
func hostHTTP(request uint64) uint64

// Opcodes.
const (
	opAlloc = iota
	opFree
	opLength
	opLengthUnsafe
	opLoadU8
	opLoadU64
	opStoreU8
	opStoreU64
	opInputLoadU8
	opInputLoadU64
	opInputOffset
	opInputLength
	opOutputSet
	opErrorSet
	opErrorGet
	opConfigGet
	opVarGet
	opVarSet
	opLogInfo
	opMemoryBytes
	opOutputLength
	opOutputOffset
	opGetLogLevel
	opBytes
	opKVGet
	opKVSet
	opKVDelete
	opEmit
	opNowMS
	opHTTP
	opHTTPRequest
	opStatus
	opTrap
	opLog
	opEnd
	numOps
)

// specials are the constants an operand of kind 3 picks. The kernel's
// memory starts at 16 pages (1 MiB); its first block's header is at 65 and
// its data at 77; its MemoryRoot is bytes 1 to 64.
var specials = [...]uint64{
	0:  ^uint64(0),            // 2^64-1
	1:  ^uint64(0) - 7,        // 2^64-8
	2:  ^uint64(0) - 11,       // 2^64-12: -12, a header's distance
	3:  1 << 63,               //
	4:  1<<32 - 1,             // the largest u32
	5:  1 << 32,               // the first offset past u32
	6:  1<<32 + 77,            // wraps, as a u32, to the first block's data
	7:  16 << 16,              // the end of the kernel's initial memory
	8:  16<<16 - 8,            // its last u64
	9:  16<<16 - 1,            // its last byte
	10: 64,                    // the last byte of the root
	11: 65,                    // the first block's header
	12: 77,                    // the first block's data
	13: 1,                     // the root
	14: 9,                     // the root's position
	15: 17,                    // the root's length
	16: 25,                    // the root's error
	17: 49,                    // the root's output offset
	18: 0xFFFFFFF4,            // -12 as a u32: a block size that loops the walk
	19: 1 << 31,               //
	20: 0xFFFF_FFFF_FFF0,      //
	21: 65536,                 //
	22: 1<<20 + 1,             //
	23: 0x7FFF_FFFF_FFFF_FFFF, //
}

// program is the probe's input being decoded.
type program struct {
	code    []byte
	at      int
	results []uint64
}

func (p *program) byte() (byte, bool) {
	if p.at >= len(p.code) {
		return 0, false
	}
	b := p.code[p.at]
	p.at++
	return b, true
}

func (p *program) u64() (uint64, bool) {
	if p.at+8 > len(p.code) {
		p.at = len(p.code)
		return 0, false
	}
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(p.code[p.at+i])
	}
	p.at += 8
	return v, true
}

func (p *program) operand() (uint64, bool) {
	t, ok := p.byte()
	if !ok {
		return 0, false
	}
	switch t & 3 {
	case 0:
		return p.u64()
	case 1:
		return uint64(t >> 2), true
	case 2:
		k, ok1 := p.byte()
		lo, ok2 := p.byte()
		hi, ok3 := p.byte()
		if !ok1 || !ok2 || !ok3 {
			return 0, false
		}
		d := int16(uint16(lo) | uint16(hi)<<8)
		var base uint64
		if n := len(p.results); n > 0 {
			base = p.results[int(k)%n]
		}
		return base + uint64(int64(d)), true
	default:
		return specials[int(t>>2)%len(specials)], true
	}
}

// readInput reads the whole input with the raw imports: words with
// input_load_u64, the tail with input_load_u8.
func readInput() []byte {
	n := extInputLength()
	if n > 1<<24 {
		n = 1 << 24
	}
	b := make([]byte, n)
	i := uint64(0)
	for ; i+8 <= n; i += 8 {
		w := extInputLoadU64(i)
		for j := uint64(0); j < 8; j++ {
			b[i+j] = byte(w >> (8 * j))
		}
	}
	for ; i < n; i++ {
		b[i] = byte(extInputLoadU8(i))
	}
	return b
}

var anchor byte

// trapOutOfBounds loads a byte at 0xFFFFFFF0 of the guest's memory, which
// is far past its end: a Wasm trap.
//
//go:noinline
func trapOutOfBounds() byte {
	base := unsafe.Pointer(&anchor)
	p := (*byte)(unsafe.Add(base, int(0xFFFFFFF0-uintptr(base))))
	return *p
}

//go:noinline
func trapPanic() {
	panic("kernelprobe: trap requested")
}

//go:wasmexport probe
func probe() int32 {
	p := &program{code: readInput()}
	status := int32(0)
	last := -1
	for {
		b, ok := p.byte()
		if !ok {
			break
		}
		op := int(b) % numOps
		if op == opEnd {
			break
		}
		var r uint64
		switch op {
		case opInputOffset, opInputLength, opErrorGet, opMemoryBytes, opOutputLength, opOutputOffset, opGetLogLevel, opNowMS:
			switch op {
			case opInputOffset:
				r = extInputOffset()
			case opInputLength:
				r = extInputLength()
			case opErrorGet:
				r = extErrorGet()
			case opMemoryBytes:
				r = extMemoryBytes()
			case opOutputLength:
				r = extOutputLength()
			case opOutputOffset:
				r = extOutputOffset()
			case opGetLogLevel:
				r = uint64(uint32(extGetLogLevel()))
			case opNowMS:
				r = hostNowMS()
			}
		case opBytes:
			l, ok := p.byte()
			if !ok || p.at+int(l) > len(p.code) {
				return finish(p, status, last)
			}
			data := p.code[p.at : p.at+int(l)]
			p.at += int(l)
			off := extAlloc(uint64(l))
			if off != 0 {
				for i, c := range data {
					extStoreU8(off+uint64(i), uint32(c))
				}
			}
			r = off
		case opStoreU8, opStoreU64, opOutputSet, opVarSet, opKVSet, opHTTPRequest, opLog:
			a, ok1 := p.operand()
			c, ok2 := p.operand()
			if !ok1 || !ok2 {
				return finish(p, status, last)
			}
			switch op {
			case opStoreU8:
				extStoreU8(a, uint32(c))
			case opStoreU64:
				extStoreU64(a, c)
			case opOutputSet:
				extOutputSet(a, c)
			case opVarSet:
				extVarSet(a, c)
			case opKVSet:
				r = hostKVSet(a, c)
			case opHTTPRequest:
				r = extHTTPRequest(a, c)
			case opLog:
				switch a % 5 {
				case 0:
					extLogTrace(c)
				case 1:
					extLogDebug(c)
				case 2:
					extLogInfo(c)
				case 3:
					extLogWarn(c)
				default:
					extLogError(c)
				}
			}
		default:
			a, ok := p.operand()
			if !ok {
				return finish(p, status, last)
			}
			switch op {
			case opAlloc:
				r = extAlloc(a)
			case opFree:
				extFree(a)
			case opLength:
				r = extLength(a)
			case opLengthUnsafe:
				r = extLengthUnsafe(a)
			case opLoadU8:
				r = uint64(extLoadU8(a))
			case opLoadU64:
				r = extLoadU64(a)
			case opInputLoadU8:
				r = uint64(extInputLoadU8(a))
			case opInputLoadU64:
				r = extInputLoadU64(a)
			case opErrorSet:
				extErrorSet(a)
			case opConfigGet:
				r = extConfigGet(a)
			case opVarGet:
				r = extVarGet(a)
			case opLogInfo:
				extLogInfo(a)
			case opKVGet:
				r = hostKVGet(a)
			case opKVDelete:
				r = hostKVDelete(a)
			case opEmit:
				r = hostEmit(a)
			case opHTTP:
				r = hostHTTP(a)
			case opStatus:
				status = int32(uint32(a))
				r = a
			case opTrap:
				if a%2 == 0 {
					r = uint64(trapOutOfBounds())
				} else {
					trapPanic()
				}
			}
		}
		p.results = append(p.results, r)
		if op != opStatus {
			last = op
		}
	}
	return finish(p, status, last)
}

// finish writes the results as the output, unless the program's last op
// set the output or the error itself, and returns the status.
func finish(p *program, status int32, last int) int32 {
	if last == opOutputSet || last == opErrorSet {
		return status
	}
	n := uint64(len(p.results))*8 + 1
	off := extAlloc(n)
	for i, r := range p.results {
		extStoreU64(off+uint64(i)*8, r)
	}
	extStoreU8(off+n-1, uint32(len(p.results)))
	extOutputSet(off, n)
	return status
}
