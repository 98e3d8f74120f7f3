package host

// The differential test of the native kernel (kernel.go) against the one
// it transcribes: the extism-runtime.wasm that go-sdk v1.7.1 embeds, run
// in a plain wazero runtime, with go-sdk's own Go load_u64, store_u64 and
// input_load_u64 and go-sdk's host-side operations (SetInput, GetOutput,
// GetError, CurrentPlugin.ReadBytes and WriteBytes) emulated on it from
// go-sdk's source. An op-sequence interpreter drives both from a []byte
// (FuzzKernelMatchesWasm, TestKernelMatchesWasmRandom) or from a list of
// concrete ops (the table tests) and, after every op, compares the result,
// whether it trapped, and the whole memory.
//
// Both memories are capped at the same number of pages (the sequence's
// first byte picks the cap: WithMemoryLimitPages on the reference, the
// grow func on the subject), far below kernelMaxPages, so that a sequence
// never allocates gigabytes.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// ---------------------------------------------------------------------------
// The reference: extism-runtime.wasm in wazero.

const kdSDKModule = "github.com/extism/go-sdk"

var kdWasm struct {
	once sync.Once
	b    []byte
	err  error
}

// kdKernelWasm is the go-sdk module's extism-runtime.wasm: found from the
// test binary's build info and the module cache, else by `go list -m`.
func kdKernelWasm(tb testing.TB) []byte {
	kdWasm.once.Do(func() {
		var dirs []string
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, d := range bi.Deps {
				if d.Path != kdSDKModule {
					continue
				}
				if d.Replace != nil {
					d = d.Replace
				}
				cache := os.Getenv("GOMODCACHE")
				if cache == "" {
					gopath := os.Getenv("GOPATH")
					if gopath == "" {
						home, _ := os.UserHomeDir()
						gopath = filepath.Join(home, "go")
					}
					cache = filepath.Join(filepath.SplitList(gopath)[0], "pkg", "mod")
				}
				dirs = append(dirs, filepath.Join(cache, "github.com", "extism", "go-sdk@"+d.Version))
			}
		}
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, "extism-runtime.wasm")); err == nil {
				kdWasm.b = b
				return
			}
		}
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", kdSDKModule).Output()
		if err != nil {
			kdWasm.err = fmt.Errorf("locating %s: %v", kdSDKModule, err)
			return
		}
		kdWasm.b, kdWasm.err = os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "extism-runtime.wasm"))
	})
	if kdWasm.err != nil {
		tb.Fatalf("the reference kernel: %v", kdWasm.err)
	}
	return kdWasm.b
}

type kdRuntime struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
}

var kdRuntimes struct {
	sync.Mutex
	m map[uint32]*kdRuntime
}

// kdRuntimeFor is a wazero runtime whose memories are capped at capPages,
// with the kernel compiled in it; one per cap, for the test process.
func kdRuntimeFor(tb testing.TB, capPages uint32) *kdRuntime {
	wasm := kdKernelWasm(tb)
	kdRuntimes.Lock()
	defer kdRuntimes.Unlock()
	if r, ok := kdRuntimes.m[capPages]; ok {
		return r
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(capPages))
	c, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		tb.Fatalf("compiling the reference kernel: %v", err)
	}
	if kdRuntimes.m == nil {
		kdRuntimes.m = map[uint32]*kdRuntime{}
	}
	r := &kdRuntime{rt: rt, compiled: c}
	kdRuntimes.m[capPages] = r
	return r
}

// kdRef is one instance of the reference kernel.
type kdRef struct {
	mod         api.Module
	mem         api.Memory
	fns         map[string]api.Function
	deadline    time.Duration // of each kernel call
	inputOffset uint64        // what SetInput returned (go-sdk's InputOffsetKey)
}

func kdNewRef(tb testing.TB, capPages uint32, deadline time.Duration) *kdRef {
	r := kdRuntimeFor(tb, capPages)
	mod, err := r.rt.InstantiateModule(context.Background(), r.compiled, wazero.NewModuleConfig().WithName(""))
	if err != nil {
		tb.Fatalf("instantiating the reference kernel: %v", err)
	}
	return &kdRef{mod: mod, mem: mod.ExportedMemory("memory"), fns: map[string]api.Function{}, deadline: deadline}
}

func (r *kdRef) close() { _ = r.mod.Close(context.Background()) }

func (r *kdRef) memory() []byte {
	b, ok := r.mem.Read(0, r.mem.Size())
	if !ok {
		panic("reading the reference memory")
	}
	return b
}

func (r *kdRef) u64(at uint32) uint64 {
	v, _ := r.mem.ReadUint64Le(at)
	return v
}

// call calls a kernel export under the op's deadline (the runtime closes
// the module when it passes).
func (r *kdRef) call(name string, args ...uint64) (uint64, error) {
	f, ok := r.fns[name]
	if !ok {
		f = r.mod.ExportedFunction(name)
		if f == nil {
			panic("the kernel has no export " + name)
		}
		r.fns[name] = f
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.deadline)
	defer cancel()
	res, err := f.Call(ctx, args...)
	if err != nil || len(res) == 0 {
		return 0, err
	}
	return res[0], nil
}

// failed records a failed kernel call in out: a timeout or a trap.
func (out *kdOutcome) failed(err error) {
	var exit *sys.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded {
		out.timeout = true
		return
	}
	out.trap = true
	out.msg = err.Error()
}

func (r *kdRef) do(o kdOp) (out kdOutcome) {
	// c calls a kernel export; on failure it records it and ends the op.
	var stop bool
	c := func(name string, args ...uint64) uint64 {
		if stop {
			return 0
		}
		v, err := r.call(name, args...)
		if err != nil {
			out.failed(err)
			stop = true
		}
		return v
	}
	switch o.code {
	case opAlloc:
		out.val = c("alloc", o.a)
	case opFree:
		c("free", o.a)
	case opLength:
		out.val = c("length", o.a)
	case opLengthUnsafe:
		out.val = c("length_unsafe", o.a)
	case opLoadU8:
		out.val = uint64(api.DecodeU32(c("load_u8", o.a)))
	case opStoreU8:
		c("store_u8", o.a, api.EncodeU32(uint32(o.b)))
	case opInputLoadU8:
		out.val = uint64(api.DecodeU32(c("input_load_u8", o.a)))
	case opInputSet:
		c("input_set", o.a, o.b)
	case opOutputSet:
		c("output_set", o.a, o.b)
	case opRegister:
		out.val = c(kdRegisters[o.a%uint64(len(kdRegisters))].export)
	case opReset:
		c("reset")
	case opErrorSet:
		c("error_set", o.a)

	// go-sdk's own Go functions (host.go: load_u64, store_u64,
	// inputLoad_u64): api.Memory at a u32 offset, a panic (trap) when
	// out of range.
	case opLoadU64:
		v, ok := r.mem.ReadUint64Le(uint32(o.a))
		if !ok {
			out.trap, out.msg = true, fmt.Sprintf("could not read value at offset: %v", o.a)
		}
		out.val = v
	case opStoreU64:
		if !r.mem.WriteUint64Le(uint32(o.a), o.b) {
			out.trap, out.msg = true, fmt.Sprintf("could not write value '%v' at offset: %v", o.b, o.a)
		}
	case opInputLoadU64:
		v, ok := r.mem.ReadUint64Le(uint32(o.a + r.inputOffset))
		if !ok {
			out.trap, out.msg = true, fmt.Sprintf("could not read value at offset: %v", o.a)
		}
		out.val = v

	// go-sdk's host side.
	case opSetInput: // Plugin.SetInputWithContext
		data := kdData(o)
		c("reset")
		ptr := c("alloc", uint64(len(data)))
		if stop {
			return out
		}
		r.mem.Write(uint32(ptr), data)
		// go-sdk ignores input_set's error; it cannot fail here anyway
		// (it touches only the root).
		_, _ = r.call("input_set", ptr, uint64(len(data)))
		r.inputOffset = ptr
		out.val = ptr
	case opOutput: // Plugin.GetOutputWithContext
		off := c("output_offset")
		n := c("output_length")
		if stop {
			return out
		}
		mem, _ := r.mem.Read(uint32(off), uint32(n))
		out.data = append([]byte{}, mem...)
	case opErrorMessage: // Plugin.GetErrorWithContext; a failed call is "" there
		off := c("error_get")
		if stop || off == 0 {
			return out
		}
		n := c("length", off)
		if stop {
			return out
		}
		mem, _ := r.mem.Read(uint32(off), uint32(n))
		out.data = append([]byte{}, mem...)
	case opReadBlock: // CurrentPlugin.ReadBytes
		n := c("length", o.a)
		if stop {
			return out
		}
		mem, ok := r.mem.Read(uint32(o.a), uint32(n))
		if ok {
			out.data, out.ok = append([]byte{}, mem...), true
		}
	case opWriteBlock: // CurrentPlugin.WriteBytes
		data := kdData(o)
		ptr := c("alloc", uint64(len(data)))
		if stop {
			return out
		}
		if r.mem.Write(uint32(ptr), data) {
			out.val, out.ok = ptr, true
		}
	default:
		panic(fmt.Sprintf("op %d", o.code))
	}
	return out
}

// ---------------------------------------------------------------------------
// The subject: the native kernel.

type kdSub struct {
	k           *kernel
	buf         []byte
	capBytes    uint64
	inputOffset uint64 // what setInput returned (nativeGuest.inputOffset)
	checks      uint64 // calls of stopped during the op
	wall        time.Time
}

func kdNewSub(tb testing.TB, capPages uint32) *kdSub {
	s := &kdSub{capBytes: uint64(capPages) * kernelPage}
	k, ok := newKernel(s.grow, s.stopped)
	if !ok {
		tb.Fatal("newKernel refused")
	}
	s.k = k
	return s
}

// grow allocates like a wazero memory with capPages as its limit.
func (s *kdSub) grow(n uint64) []byte {
	if n > s.capBytes || n > kernelMaxPages*kernelPage {
		return nil
	}
	if n <= uint64(cap(s.buf)) { // never written past len: still zero
		s.buf = s.buf[:n]
		return s.buf
	}
	nb := make([]byte, n, min(max(n, 2*uint64(cap(s.buf))), s.capBytes))
	copy(nb, s.buf)
	s.buf = nb
	return nb
}

// stopped ends a walk the way the instance's timeout would, but without
// a clock: a walk over blocks is a function of the block address alone
// (the memory does not change while it walks) and visits only addresses
// inside the memory (a load past it traps), so a walk of more steps than
// the memory has bytes has revisited an address and never ends; the Wasm
// kernel would spin in it until its deadline. A wall clock backs it up.
func (s *kdSub) stopped() uint32 {
	s.checks++
	if s.checks*walkCheckEvery > uint64(len(s.k.mem))+2*walkCheckEvery || time.Now().After(s.wall) {
		return sys.ExitCodeDeadlineExceeded
	}
	return 0
}

func (s *kdSub) do(o kdOp) (out kdOutcome) {
	s.checks, s.wall = 0, time.Now().Add(time.Minute)
	defer func() {
		if r := recover(); r != nil {
			switch e := r.(type) {
			case *kernelTrap:
				out.trap, out.msg = true, e.Error()
			case *sys.ExitError:
				if e.ExitCode() != sys.ExitCodeDeadlineExceeded {
					panic(r)
				}
				out.timeout = true
			default: // the native kernel must never fail like this
				out.panicked = fmt.Sprint(r)
			}
		}
	}()
	k := s.k
	switch o.code {
	case opAlloc:
		out.val = k.alloc(o.a)
	case opFree:
		k.free(o.a)
	case opLength:
		out.val = k.length(o.a)
	case opLengthUnsafe:
		out.val = k.lengthUnsafe(o.a)
	case opLoadU8:
		out.val = uint64(k.loadU8(o.a))
	case opStoreU8:
		k.storeU8(o.a, uint32(o.b))
	case opInputLoadU8:
		out.val = uint64(k.inputLoadU8(o.a))
	case opInputSet:
		k.inputSet(o.a, o.b)
	case opOutputSet:
		k.outputSet(o.a, o.b)
	case opRegister:
		out.val = k.register(kdRegisters[o.a%uint64(len(kdRegisters))].at)
	case opReset:
		k.reset()
	case opErrorSet:
		k.errorSet(o.a)
	case opLoadU64:
		out.val = k.loadU64(o.a)
	case opStoreU64:
		k.storeU64(o.a, o.b)
	case opInputLoadU64:
		out.val = k.inputLoadU64(s.inputOffset, o.a)
	case opSetInput:
		s.inputOffset = k.setInput(kdData(o))
		out.val = s.inputOffset
	case opOutput:
		out.data = k.output()
	case opErrorMessage:
		out.data = []byte(k.errorMessage())
	case opReadBlock:
		out.data, out.ok = k.readBlock(o.a)
	case opWriteBlock:
		out.val, out.ok = k.writeBlock(kdData(o))
	default:
		panic(fmt.Sprintf("op %d", o.code))
	}
	return out
}

// ---------------------------------------------------------------------------
// Ops and outcomes.

type kdCode uint8

const (
	opAlloc kdCode = iota
	opFree
	opLength
	opLengthUnsafe
	opLoadU8
	opLoadU64
	opStoreU8
	opStoreU64
	opInputLoadU8
	opInputLoadU64
	opInputSet
	opOutputSet
	opRegister
	opReset
	opErrorSet
	opSetInput     // host: go-sdk's SetInput
	opOutput       // host: GetOutput
	opErrorMessage // host: GetError
	opReadBlock    // host: CurrentPlugin.ReadBytes
	opWriteBlock   // host: CurrentPlugin.WriteBytes
	kdNumCodes
)

// The registers a guest reads with no argument, and their root fields.
var kdRegisters = []struct {
	export string
	at     uint64
}{
	{"input_length", offInputLength},
	{"input_offset", offInputOffset},
	{"output_length", offOutputLength},
	{"output_offset", offOutputOffset},
	{"error_get", offError},
	{"memory_bytes", offLength},
}

// kdOp is one concrete op: a and b are its arguments; setInput and
// writeBlock take n bytes of a fixed pattern starting at seed.
type kdOp struct {
	code kdCode
	a, b uint64
	n    int
	seed byte
}

func kAlloc(n uint64) kdOp            { return kdOp{code: opAlloc, a: n} }
func kFree(p uint64) kdOp             { return kdOp{code: opFree, a: p} }
func kLength(p uint64) kdOp           { return kdOp{code: opLength, a: p} }
func kLengthUnsafe(p uint64) kdOp     { return kdOp{code: opLengthUnsafe, a: p} }
func kLoadU8(p uint64) kdOp           { return kdOp{code: opLoadU8, a: p} }
func kLoadU64(p uint64) kdOp          { return kdOp{code: opLoadU64, a: p} }
func kStoreU8(p, v uint64) kdOp       { return kdOp{code: opStoreU8, a: p, b: v} }
func kStoreU64(p, v uint64) kdOp      { return kdOp{code: opStoreU64, a: p, b: v} }
func kInputLoadU8(i uint64) kdOp      { return kdOp{code: opInputLoadU8, a: i} }
func kInputLoadU64(i uint64) kdOp     { return kdOp{code: opInputLoadU64, a: i} }
func kInputSet(h, n uint64) kdOp      { return kdOp{code: opInputSet, a: h, b: n} }
func kOutputSet(p, n uint64) kdOp     { return kdOp{code: opOutputSet, a: p, b: n} }
func kRegister(i uint64) kdOp         { return kdOp{code: opRegister, a: i} }
func kReset() kdOp                    { return kdOp{code: opReset} }
func kErrorSet(h uint64) kdOp         { return kdOp{code: opErrorSet, a: h} }
func kSetInput(n int, seed byte) kdOp { return kdOp{code: opSetInput, n: n, seed: seed} }
func kOutput() kdOp                   { return kdOp{code: opOutput} }
func kErrorMessage() kdOp             { return kdOp{code: opErrorMessage} }
func kReadBlock(p uint64) kdOp        { return kdOp{code: opReadBlock, a: p} }
func kWriteBlock(n int, seed byte) kdOp {
	return kdOp{code: opWriteBlock, n: n, seed: seed}
}

// kdNum writes a number as Go source, in hex when that reads better.
func kdNum(v uint64) string {
	if v >= 1<<20 && v != 1<<20 {
		return fmt.Sprintf("%#x", v)
	}
	return fmt.Sprint(v)
}

var kdFuncNames = [kdNumCodes]string{
	"kAlloc", "kFree", "kLength", "kLengthUnsafe", "kLoadU8", "kLoadU64", "kStoreU8", "kStoreU64",
	"kInputLoadU8", "kInputLoadU64", "kInputSet", "kOutputSet", "kRegister", "kReset", "kErrorSet",
	"kSetInput", "kOutput", "kErrorMessage", "kReadBlock", "kWriteBlock",
}

// String is the op as the Go expression that builds it.
func (o kdOp) String() string {
	name := kdFuncNames[o.code]
	switch o.code {
	case opStoreU8, opStoreU64, opInputSet, opOutputSet:
		return fmt.Sprintf("%s(%s, %s)", name, kdNum(o.a), kdNum(o.b))
	case opRegister:
		return fmt.Sprintf("%s(%d) /* %s */", name, o.a, kdRegisters[o.a%uint64(len(kdRegisters))].export)
	case opReset, opOutput, opErrorMessage:
		return name + "()"
	case opSetInput, opWriteBlock:
		return fmt.Sprintf("%s(%d, %d)", name, o.n, o.seed)
	}
	return fmt.Sprintf("%s(%s)", name, kdNum(o.a))
}

// kdPattern backs the data of setInput and writeBlock.
var kdPattern = sync.OnceValue(func() []byte {
	b := make([]byte, kdMaxData+256)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
})

const kdMaxData = 4 << 20

func kdData(o kdOp) []byte {
	n := min(max(o.n, 0), kdMaxData)
	return kdPattern()[int(o.seed) : int(o.seed)+n]
}

// kdOutcome is what an op did, as the plugin (or the host) sees it.
type kdOutcome struct {
	val      uint64
	data     []byte // output, errorMessage, readBlock
	ok       bool   // readBlock, writeBlock
	trap     bool
	timeout  bool
	panicked string // the subject failed with something else than a trap
	msg      string // the trap's message: not compared
}

func (a kdOutcome) same(b kdOutcome) bool {
	return a.val == b.val && bytes.Equal(a.data, b.data) && a.ok == b.ok &&
		a.trap == b.trap && a.timeout == b.timeout && a.panicked == b.panicked
}

func (a kdOutcome) String() string {
	switch {
	case a.panicked != "":
		return "PANIC " + a.panicked
	case a.timeout:
		return "timed out"
	case a.trap:
		return "trap (" + a.msg + ")"
	}
	s := "val=" + kdNum(a.val)
	if a.data != nil {
		d := a.data
		if len(d) > 24 {
			s += fmt.Sprintf(" data=%d bytes %x...", len(d), d[:24])
		} else {
			s += fmt.Sprintf(" data=%x", d)
		}
	}
	if a.ok {
		s += " ok"
	}
	return s
}

// ---------------------------------------------------------------------------
// The interpreter.

// kdState is what the op decoder may look at: the memory's size, the
// offsets earlier ops returned, and the reference's root fields (both
// memories are equal whenever an op is decoded).
type kdState struct {
	ref     *kdRef
	memSize uint64
	offsets []uint64
}

type kdSource interface {
	next(st *kdState) (kdOp, bool)
}

type kdList struct {
	ops []kdOp
	i   int
}

func (l *kdList) next(*kdState) (kdOp, bool) {
	if l.i >= len(l.ops) {
		return kdOp{}, false
	}
	l.i++
	return l.ops[l.i-1], true
}

// kdDivergence is the first op at which the two kernels disagree.
type kdDivergence struct {
	capPages uint32
	ops      []kdOp // up to and including the diverging op
	kind     string // "result", "memory", "timeout"
	ref, sub kdOutcome
	detail   string
}

func (d *kdDivergence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the native kernel diverges from extism-runtime.wasm (memory capped at %d pages) at op %d, %v:\n",
		d.capPages, len(d.ops)-1, d.ops[len(d.ops)-1])
	fmt.Fprintf(&b, "  wasm:   %v\n  native: %v\n", d.ref, d.sub)
	if d.detail != "" {
		fmt.Fprintf(&b, "  %s\n", d.detail)
	}
	fmt.Fprintf(&b, "  ops (kdRunOps(t, %d, ...)):\n", d.capPages)
	for i, o := range d.ops {
		fmt.Fprintf(&b, "    %v, // %d\n", o, i)
	}
	return b.String()
}

// The reference's deadline for a kernel call: long enough for any walk
// or memset that ends (at most a step per byte of memory; with
// WithCloseOnContextDone the compiled code looks at the module's state on
// every loop iteration, which costs a few ns a step, tens under -race),
// short enough that a walk that never ends costs little. A sequence whose
// only disagreement is the reference timing out runs again with kdLong.
const (
	kdShort = 100 * time.Millisecond
	kdLong  = 30 * time.Second
)

func kdDeadline(memSize uint64, long bool) time.Duration {
	if long {
		return kdLong
	}
	return kdShort + time.Duration(memSize)*60*time.Nanosecond
}

// kdRun runs the ops src gives on a fresh reference and subject, and
// returns the ops it ran and the first divergence, if any. A trap on both
// sides ends the sequence (after the memories are compared), as does a
// timeout on both.
func kdRun(tb testing.TB, capPages uint32, src kdSource, maxOps int, long bool) (ops []kdOp, d *kdDivergence, end string) {
	ref := kdNewRef(tb, capPages, kdShort)
	defer ref.close()
	sub := kdNewSub(tb, capPages)
	st := &kdState{ref: ref}
	for len(ops) < maxOps {
		st.memSize = uint64(ref.mem.Size())
		o, ok := src.next(st)
		if !ok {
			break
		}
		ops = append(ops, o)
		ref.deadline = kdDeadline(st.memSize, long)
		ro := ref.do(o)
		so := sub.do(o)
		div := func(kind, detail string) *kdDivergence {
			return &kdDivergence{capPages: capPages, ops: ops, kind: kind, ref: ro, sub: so, detail: detail}
		}
		if ro.timeout || so.timeout {
			if ro.timeout && so.timeout {
				return ops, nil, "timeout"
			}
			return ops, div("timeout", ""), ""
		}
		if !ro.same(so) {
			return ops, div("result", ""), ""
		}
		rm, sm := ref.memory(), sub.k.mem
		if !kdMemEqual(rm, sm) {
			return ops, div("memory", kdMemDiff(rm, sm)), ""
		}
		if ro.trap {
			return ops, nil, "trap"
		}
		switch o.code {
		case opAlloc, opSetInput, opWriteBlock:
			if ro.val != 0 {
				st.offsets = append(st.offsets, ro.val)
			}
		}
	}
	return ops, nil, ""
}

// kdMemEqual is bytes.Equal without the race detector's range read of
// both memories on every op (bytes.Compare is assembly): under -race that
// read cost most of the test's time.
func kdMemEqual(a, b []byte) bool { return len(a) == len(b) && bytes.Compare(a, b) == 0 }

func kdMemDiff(ref, sub []byte) string {
	if len(ref) != len(sub) {
		return fmt.Sprintf("memory size: wasm %d bytes, native %d bytes", len(ref), len(sub))
	}
	first, last, n := -1, -1, 0
	for i := range ref {
		if ref[i] != sub[i] {
			if first < 0 {
				first = i
			}
			last = i
			n++
		}
	}
	lo, hi := first, min(first+16, len(ref))
	return fmt.Sprintf("memory: %d bytes differ in [%d, %d]; at %d wasm has %x, native %x",
		n, first, last, first, ref[lo:hi], sub[lo:hi])
}

// kdRunOps runs a list of concrete ops, once more with the long deadline
// if the reference alone timed out.
func kdRunOps(tb testing.TB, capPages uint32, ops ...kdOp) *kdDivergence {
	_, d, _ := kdRun(tb, capPages, &kdList{ops: ops}, len(ops), false)
	if d != nil && d.kind == "timeout" && d.ref.timeout {
		_, d, _ = kdRun(tb, capPages, &kdList{ops: ops}, len(ops), true)
	}
	return d
}

// kdShrink removes ops from a diverging list while it still diverges the
// same way, for a short reproducer: runs of ops, halving their length
// down to single ops, within a time budget.
func kdShrink(tb testing.TB, d *kdDivergence) *kdDivergence {
	deadline := time.Now().Add(10 * time.Second)
	for chunk := max((len(d.ops)-1)/2, 1); ; chunk /= 2 {
		for i := 0; i+chunk <= len(d.ops)-1 && time.Now().Before(deadline); {
			try := append(append([]kdOp{}, d.ops[:i]...), d.ops[i+chunk:]...)
			if nd := kdRunOps(tb, d.capPages, try...); nd != nil && nd.kind == d.kind {
				d = nd
			} else {
				i++
			}
		}
		if chunk == 1 {
			return d
		}
	}
}

// ---------------------------------------------------------------------------
// The byte decoder: the fuzz target's input as an op sequence.
//
// Byte 0 picks the memory cap (kdCaps). Then each op is one byte (kdOpTable,
// modulo 64)
// followed by its arguments; each argument is a kind byte (kdKinds) and
// the kind's bytes. Past the end every byte reads 0; the sequence ends at
// an op boundary once the input is used up.

var kdCaps = []uint32{256, 17, 32, 64}

var kdOpTable = func() (t [64]kdCode) {
	w := [kdNumCodes]int{
		opAlloc: 12, opFree: 7, opLength: 4, opLengthUnsafe: 2, opLoadU8: 2, opLoadU64: 2, opStoreU8: 3,
		opStoreU64: 4, opInputLoadU8: 2, opInputLoadU64: 2, opInputSet: 2, opOutputSet: 2, opRegister: 3,
		opReset: 1, opErrorSet: 2, opSetInput: 3, opOutput: 2, opErrorMessage: 2, opReadBlock: 3, opWriteBlock: 4,
	}
	i := 0
	for c, n := range w {
		for ; n > 0; n-- {
			t[i] = kdCode(c)
			i++
		}
	}
	if i != len(t) {
		panic(fmt.Sprintf("kdOpTable: weights add up to %d", i))
	}
	return t
}()

var (
	kdDeltas = []int64{0, 0, 0, 1, -1, 12, -12, 8, -8, -4, 4}
	kdHuge   = []uint64{1<<32 - 1, 1 << 32, 1 << 63, ^uint64(0), ^uint64(0) - 7}
	kdSplit  = []uint64{116, 127, 128, 129, 140, 12, 11, 1}
	kdRoot   = []uint32{offPosition, offLength, offError, offInputOffset, offInputLength, offOutputOffset, offOutputLength}
)

// Value kinds.
const (
	vOffset    = iota // an offset an earlier op returned (byte: index), plus a delta (byte: kdDeltas)
	vSmall            // byte
	vMemEnd           // memory size - 16 + byte%33
	vZero             //
	v64               //
	v65               //
	vHuge             // byte: kdHuge
	vNear64           // 2^64 - 1 - byte
	vLow              // byte%80: the root and the first block's header
	vRegister         // byte%4: input_offset, output_offset, error, position+65 (the next bump block)
	vU16              // 2 bytes LE
	vU32              // 4 bytes LE
	vU64              // 8 bytes LE
	vMiB              // (byte%6+1) MiB + byte - 128
	vSplit            // byte: kdSplit (the split threshold)
	vWide             // byte: 2^32 + b, 2^48 + b<<16 (npages truncation), 2^63 + b, 2^32 - b; byte: b
	vRootField        // byte: kdRoot
	vKinds
)

type kdBytes struct {
	b      []byte
	i      int
	maxOps int
}

func (d *kdBytes) byte() byte {
	if d.i >= len(d.b) {
		d.i++
		return 0
	}
	d.i++
	return d.b[d.i-1]
}

func (d *kdBytes) le(n int) uint64 {
	var v uint64
	for i := 0; i < n; i++ {
		v |= uint64(d.byte()) << (8 * i)
	}
	return v
}

// kdKinds maps a kind byte to a value kind, weighted so that a random
// sequence mostly runs on (an out-of-range address traps, which ends the
// sequence) yet often reaches every kind.
var kdKinds = kdWeighted("kdKinds", [vKinds]int{
	vOffset: 120, vSmall: 20, vMemEnd: 4, vZero: 6, v64: 4, v65: 4, vHuge: 3, vNear64: 3,
	vLow: 16, vRegister: 16, vU16: 18, vU32: 2, vU64: 2, vMiB: 2, vSplit: 16, vWide: 6, vRootField: 14,
})

// kdLenKinds is kdKinds for alloc's length: mostly small, so that the
// heap and the memory stay small (the memory is compared after every op,
// and the reference's reset costs about 3 ns a byte of heap) and rarely
// grow by MiBs; and no offsets, which would grow them in a feedback loop.
var kdLenKinds = kdWeighted("kdLenKinds", [vKinds]int{
	vSmall: 154, vU16: 12, vSplit: 30, vZero: 4, vMiB: 2, vHuge: 8, vNear64: 8, vWide: 8,
	vMemEnd: 2, vU32: 6, vU64: 6, vRegister: 6, v64: 4, v65: 4, vLow: 2,
})

// kdWeighted is a table of 256 value kinds, each as many times as its
// weight says; the weights must add up to 256.
func kdWeighted(name string, w [vKinds]int) (t [256]uint8) {
	i := 0
	for k, n := range w {
		for ; n > 0; n-- {
			t[i] = uint8(k)
			i++
		}
	}
	if i != 256 {
		panic(fmt.Sprintf("%s: weights add up to %d", name, i))
	}
	return t
}

func (d *kdBytes) value(st *kdState) uint64 { return d.valueOf(st, kdKinds[d.byte()]) }

func (d *kdBytes) length(st *kdState) uint64 { return d.valueOf(st, kdLenKinds[d.byte()]) }

func (d *kdBytes) valueOf(st *kdState, kind uint8) uint64 {
	switch kind {
	case vOffset:
		base := uint64(blocksAt + blockHeader)
		i := int(d.byte())
		if len(st.offsets) > 0 {
			base = st.offsets[len(st.offsets)-1-i%len(st.offsets)]
		}
		return base + uint64(kdDeltas[int(d.byte())%len(kdDeltas)])
	case vSmall:
		return uint64(d.byte())
	case vMemEnd:
		return st.memSize - 16 + uint64(d.byte()%33)
	case vZero:
		return 0
	case v64:
		return 64
	case v65:
		return 65
	case vHuge:
		return kdHuge[int(d.byte())%len(kdHuge)]
	case vNear64:
		return ^uint64(0) - uint64(d.byte())
	case vLow:
		return uint64(d.byte() % 80)
	case vRegister:
		switch d.byte() % 4 {
		case 0:
			return st.ref.u64(offInputOffset)
		case 1:
			return st.ref.u64(offOutputOffset)
		case 2:
			return st.ref.u64(offError)
		default:
			return st.ref.u64(offPosition) + blocksAt
		}
	case vU16:
		return d.le(2)
	case vU32:
		return d.le(4)
	case vU64:
		return d.le(8)
	case vMiB:
		m := uint64(d.byte()%6 + 1)
		return m<<20 + uint64(d.byte()) - 128
	case vSplit:
		return kdSplit[int(d.byte())%len(kdSplit)]
	case vWide:
		w, b := d.byte(), uint64(d.byte())
		switch w % 4 {
		case 0:
			return 1<<32 + b
		case 1:
			return 1<<48 + b<<16
		case 2:
			return 1<<63 + b
		default:
			return 1<<32 - b
		}
	default: // vRootField
		return uint64(kdRoot[int(d.byte())%len(kdRoot)])
	}
}

// Data length kinds: the kind byte modulo 64. Mostly small: the
// reference's reset (its memset stores 4 bytes at a time) costs about
// 3 ns a byte of heap, and a random sequence resets often.
const (
	dSmall  = 0  // 0..57: byte
	dU16    = 58 // 58..61: 2 bytes
	dBlocks = 62 // (byte%16+1) * 64 KiB + byte
	dMemEnd = 63 // memory size - 16 + byte%33, when at most kdMaxData
)

func (d *kdBytes) dataLen(st *kdState) int {
	switch k := d.byte() % 64; {
	case k < dU16:
		return int(d.byte())
	case k < dBlocks:
		return int(d.le(2))
	case k == dBlocks:
		n := int(d.byte()%16+1) * 65536
		return n + int(d.byte())
	default:
		n := int(st.memSize) - 16 + int(d.byte()%33)
		if n > kdMaxData {
			return n % 4096
		}
		return n
	}
}

func (d *kdBytes) next(st *kdState) (kdOp, bool) {
	if d.i >= len(d.b) {
		return kdOp{}, false
	}
	o := kdOp{code: kdOpTable[d.byte()%64]}
	switch o.code {
	case opAlloc:
		o.a = d.length(st)
	case opFree, opLength, opLengthUnsafe, opLoadU8, opLoadU64, opInputLoadU8,
		opInputLoadU64, opErrorSet, opReadBlock:
		o.a = d.value(st)
	case opStoreU8:
		o.a = d.value(st)
		v := d.byte()
		o.b = uint64(v) | uint64(v&0x80)<<1 // an i32: bits past the byte are dropped
	case opStoreU64, opInputSet, opOutputSet:
		o.a, o.b = d.value(st), d.value(st)
	case opRegister:
		o.a = uint64(d.byte()) % uint64(len(kdRegisters))
	case opSetInput, opWriteBlock:
		o.n, o.seed = d.dataLen(st), d.byte()
	}
	return o, true
}

const kdMaxOps = 400

// kdRunBytes runs the sequence data encodes; once more with the long
// deadline if the reference alone timed out. It returns what kdRun does.
func kdRunBytes(tb testing.TB, data []byte, maxOps int) ([]kdOp, *kdDivergence, string) {
	if len(data) == 0 {
		return nil, nil, ""
	}
	capPages := kdCaps[int(data[0])%len(kdCaps)]
	ops, d, end := kdRun(tb, capPages, &kdBytes{b: data[1:]}, maxOps, false)
	if d != nil && d.kind == "timeout" && d.ref.timeout {
		ops, d, end = kdRun(tb, capPages, &kdBytes{b: data[1:]}, maxOps, true)
	}
	return ops, d, end
}

// ---------------------------------------------------------------------------
// The seed encoder: builds inputs for the decoder above.

// kdSeed is a seed of the fuzz target: a memory cap (index in kdCaps) and
// ops, each sOp's encoding.
type kdSeed struct {
	name   string
	capIdx byte
	ops    [][]byte
}

func (s kdSeed) bytes() []byte {
	b := []byte{s.capIdx}
	for _, o := range s.ops {
		b = append(b, o...)
	}
	return b
}

// sArg is an encoded argument: a value kind (translated by sOp into the
// kind byte of the op's table) and its bytes, or, with kind -1, raw bytes.
type sArg struct {
	kind int
	rest []byte
}

func sOp(c kdCode, args ...sArg) []byte {
	i := 0
	for kdOpTable[i] != c {
		i++
	}
	b := []byte{byte(i)}
	table := &kdKinds
	if c == opAlloc {
		table = &kdLenKinds
	}
	for _, a := range args {
		if a.kind >= 0 {
			k := 0
			for int(table[k]) != a.kind {
				k++ // an index out of range: a kind the op's table lacks
			}
			b = append(b, byte(k))
		}
		b = append(b, a.rest...)
	}
	return b
}

func sV(kind int, rest ...byte) sArg { return sArg{kind, rest} }
func sRaw(rest ...byte) sArg         { return sArg{-1, rest} }

// sOff is the offset returned back ops ago (0: the latest) plus kdDeltas[delta].
func sOff(back, delta byte) sArg { return sV(vOffset, back, delta) }

// Indexes in kdDeltas.
const (
	dl0, dlPlus1, dlMinus1, dlPlus12, dlMinus12, dlPlus8, dlMinus8, dlMinus4, dlPlus4 = 0, 3, 4, 5, 6, 7, 8, 9, 10
)

func sSmall(v byte) sArg        { return sV(vSmall, v) }
func sMemEnd(delta int) sArg    { return sV(vMemEnd, byte(delta+16)) }
func sZero() sArg               { return sV(vZero) }
func s64() sArg                 { return sV(v64) }
func s65() sArg                 { return sV(v65) }
func sHuge(i byte) sArg         { return sV(vHuge, i) }
func sNear64(d byte) sArg       { return sV(vNear64, d) }
func sLow(a byte) sArg          { return sV(vLow, a) }
func sReg(w byte) sArg          { return sV(vRegister, w) }
func sU16(v uint16) sArg        { return sV(vU16, byte(v), byte(v>>8)) }
func sU32(v uint32) sArg        { return sV(vU32, binary.LittleEndian.AppendUint32(nil, v)...) }
func sU64(v uint64) sArg        { return sV(vU64, binary.LittleEndian.AppendUint64(nil, v)...) }
func sMiB(m byte, adj int) sArg { return sV(vMiB, m-1, byte(adj+128)) }
func sSplitV(i byte) sArg       { return sV(vSplit, i) }
func sWide(w, b byte) sArg      { return sV(vWide, w, b) }
func sRootF(i byte) sArg        { return sV(vRootField, i) } // kdRoot[i]

func sLen(n byte) sArg       { return sRaw(dSmall, n) }
func sLen16(n uint16) sArg   { return sRaw(dU16, byte(n), byte(n>>8)) }
func sLenBlocks(k byte) sArg { return sRaw(dBlocks, k-1, 0) } // k * 64 KiB
func sLenMemEnd(d int) sArg  { return sRaw(dMemEnd, byte(d+16)) }
func sB(b byte) sArg         { return sRaw(b) }

// Indexes in kdRoot.
const (
	rfPosition, rfLength, rfError, rfInputOffset, rfInputLength, rfOutputOffset, rfOutputLength = 0, 1, 2, 3, 4, 5, 6
)

// kdSeeds are the fuzz target's seed corpus, one a case (`make test` runs
// them, so each is short).
func kdSeeds() []kdSeed {
	reg := func(i byte) []byte { return sOp(opRegister, sB(i)) }
	return []kdSeed{
		{"bump allocations and lengths", 0, [][]byte{
			sOp(opAlloc, sSmall(100)), sOp(opAlloc, sSmall(1)), sOp(opAlloc, sSplitV(2)),
			sOp(opLength, sOff(0, dl0)), sOp(opLength, sOff(1, dl0)), sOp(opLength, sOff(0, dlPlus1)),
			sOp(opLengthUnsafe, sOff(1, dl0)), sOp(opLengthUnsafe, sOff(1, dlMinus1)), reg(5)}},
		{"free, double free, reuse once the bump area is full", 1, [][]byte{
			sOp(opAlloc, sU16(30000)), sOp(opAlloc, sU16(20000)), sOp(opFree, sOff(1, dl0)),
			sOp(opFree, sOff(1, dl0)), sOp(opAlloc, sU16(14000)), sOp(opAlloc, sU16(2000)),
			sOp(opAlloc, sSmall(200)), sOp(opFree, sOff(0, dl0)), sOp(opAlloc, sSmall(10)),
			sOp(opLength, sOff(0, dl0)), sOp(opLength, sOff(5, dl0))}},
		{"free of freed blocks and of non-blocks", 0, [][]byte{
			sOp(opAlloc, sSmall(40)), sOp(opAlloc, sSmall(50)), sOp(opFree, sOff(0, dl0)), sOp(opFree, sOff(0, dl0)),
			sOp(opFree, sOff(0, dlPlus1)), sOp(opFree, sOff(1, dlMinus12)), sOp(opFree, s64()), sOp(opFree, s65()),
			sOp(opFree, sHuge(3)), sOp(opFree, sMemEnd(1)), sOp(opLength, sOff(1, dl0)),
			sOp(opFree, sMemEnd(-16))}}, // walks past the memory's end: a trap
		{"length near the memory's end walks off it", 0, [][]byte{
			sOp(opAlloc, sSmall(8)), sOp(opLength, sMemEnd(1)), sOp(opLength, sMemEnd(-16))}},
		{"load and store near the memory's end", 0, [][]byte{
			sOp(opLoadU8, sMemEnd(-1)), sOp(opStoreU8, sMemEnd(-1), sB(7)), sOp(opLoadU64, sMemEnd(-8)),
			sOp(opStoreU64, sMemEnd(-8), sU64(0x0102030405060708)), sOp(opLoadU8, sMemEnd(1)),
			sOp(opStoreU8, sMemEnd(1), sB(9)), sOp(opLoadU8, s64()), sOp(opLoadU8, sSmall(63)),
			sOp(opStoreU8, sSmall(63), sB(1)), sOp(opLoadU8, sMemEnd(-1)), sOp(opLoadU8, sMemEnd(0))}},
		{"load_u64 past the end traps", 0, [][]byte{sOp(opLoadU64, sMemEnd(-7))}},
		{"store_u64 past the end traps", 0, [][]byte{sOp(opStoreU64, sMemEnd(-4), sSmall(1))}},
		{"store_u8 at the end traps", 0, [][]byte{sOp(opStoreU8, sMemEnd(0), sB(1))}},
		{"load_u64 at huge offsets truncates to u32", 0, [][]byte{
			sOp(opStoreU64, sWide(0, 100), sU64(42)), sOp(opLoadU64, sSmall(100)), sOp(opLoadU64, sWide(0, 100)),
			sOp(opLoadU64, sHuge(1)), sOp(opLoadU64, sHuge(0))}},
		{"input: setInput, input_load_u8/u64, free of the input", 0, [][]byte{
			sOp(opSetInput, sLen(100), sB(3)), sOp(opInputLoadU8, sSmall(0)), sOp(opInputLoadU8, sSmall(99)),
			sOp(opInputLoadU8, sSmall(100)), sOp(opInputLoadU64, sSmall(92)), sOp(opInputLoadU64, sSmall(93)),
			sOp(opInputLoadU64, sNear64(76)), reg(0), reg(1),
			sOp(opFree, sReg(0)), reg(0), sOp(opInputLoadU8, sSmall(0)), sOp(opInputLoadU64, sMemEnd(-8))}},
		{"input_set and output_set bounds", 0, [][]byte{
			sOp(opAlloc, sSmall(50)), sOp(opInputSet, sOff(0, dl0), sSmall(50)), sOp(opOutputSet, sOff(0, dl0), sSmall(50)),
			sOp(opOutputSet, s64(), sSmall(2)), sOp(opOutputSet, s65(), sZero()), sOp(opOutputSet, sOff(0, dl0), sNear64(0)),
			sOp(opInputSet, sOff(0, dl0), sHuge(4)), sOp(opOutputSet, sMemEnd(0), sSmall(1)), reg(2), reg(3), sOp(opOutput),
			sOp(opInputSet, sSmall(70), sU32(65467)), sOp(opInputSet, sSmall(70), sU32(65468)), reg(0)}},
		{"output and error as the host reads them", 0, [][]byte{
			sOp(opWriteBlock, sLen(20), sB(1)), sOp(opErrorSet, sOff(0, dl0)), sOp(opErrorMessage),
			sOp(opOutputSet, sOff(0, dl0), sSmall(20)), sOp(opOutput), sOp(opErrorSet, sOff(0, dlPlus1)), sOp(opErrorMessage),
			sOp(opErrorSet, s65()), sOp(opErrorSet, s64()), sOp(opErrorSet, sZero()), sOp(opErrorMessage), reg(4),
			sOp(opOutputSet, sU32(65472), sSmall(60)), sOp(opStoreU64, sRootF(rfOutputOffset), sMemEnd(-4)), sOp(opOutput),
			sOp(opReadBlock, sOff(0, dl0)), sOp(opReadBlock, sOff(0, dlPlus1)), sOp(opReadBlock, sZero())}},
		{"corrupt block headers: status, size, used", 0, [][]byte{
			sOp(opAlloc, sSmall(30)), sOp(opAlloc, sSmall(30)), sOp(opAlloc, sSmall(30)),
			sOp(opStoreU8, sOff(1, dlMinus12), sB(2)), sOp(opStoreU64, sOff(2, dlMinus8), sU64(0xffffffff_00000010)),
			sOp(opLength, sOff(0, dl0)), sOp(opLengthUnsafe, sOff(2, dl0)), sOp(opStoreU8, sOff(0, dlMinus12), sB(3)),
			sOp(opLength, sOff(0, dl0)), sOp(opFree, sOff(0, dl0)), sOp(opReadBlock, sOff(2, dl0))}},
		{"corrupt the root: position, length", 0, [][]byte{
			sOp(opAlloc, sSmall(30)), sOp(opStoreU64, sRootF(rfLength), sSmall(200)), sOp(opAlloc, sSmall(100)),
			sOp(opAlloc, sSmall(100)), sOp(opStoreU64, sRootF(rfPosition), sU32(65000)), sOp(opAlloc, sU16(2000)),
			sOp(opStoreU64, sRootF(rfPosition), sHuge(3)), sOp(opAlloc, sSmall(5)), reg(5)}},
		{"the root's initialized byte cleared mid-sequence", 0, [][]byte{
			sOp(opAlloc, sSmall(30)), sOp(opStoreU8, sLow(1), sB(0)), sOp(opStoreU64, sLow(1), sZero()),
			sOp(opAlloc, sSmall(30)), sOp(opLength, sOff(0, dl0)), sOp(opLength, sOff(1, dl0))}},
		{"overlapping blocks via a size near 2^64", 0, [][]byte{
			sOp(opAlloc, sNear64(0)), sOp(opAlloc, sSmall(20)), sOp(opLength, sOff(0, dl0)), sOp(opLength, sOff(1, dl0)),
			sOp(opAlloc, sHuge(4)), sOp(opFree, sOff(0, dl0)), sOp(opLength, sOff(1, dl0)), sOp(opAlloc, sSmall(3))}},
		{"huge allocations: refused, or npages wrapping to 0", 0, [][]byte{
			sOp(opAlloc, sHuge(0)), sOp(opAlloc, sHuge(1)), sOp(opAlloc, sHuge(2)), reg(5),
			sOp(opAlloc, sWide(1, 0)), sOp(opAlloc, sWide(1, 7)), sOp(opAlloc, sSmall(1)), reg(5)}},
		{"allocations that grow the memory by MiBs", 0, [][]byte{
			sOp(opAlloc, sMiB(3, 5)), sOp(opAlloc, sMiB(2, 0)), sOp(opLength, sOff(0, dl0)), sOp(opFree, sOff(1, dl0)),
			sOp(opAlloc, sMemEnd(0)), sOp(opAlloc, sMiB(1, -12)), reg(5), sOp(opLoadU8, sMemEnd(-1))}},
		{"allocate until the memory cap refuses (test_oom)", 3, [][]byte{
			sOp(opAlloc, sMiB(1, 0)), sOp(opAlloc, sMiB(1, 0)), sOp(opAlloc, sMiB(1, 0)), sOp(opAlloc, sMiB(1, 0)),
			sOp(opAlloc, sMiB(1, 0)), sOp(opLength, sOff(0, dl0)), sOp(opAlloc, sSmall(1))}},
		{"setInput whose alloc fails writes at 0", 1, [][]byte{
			sOp(opSetInput, sLenBlocks(3), sB(9)), reg(0), reg(1), sOp(opAlloc, sSmall(1))}},
		{"reset in the middle", 0, [][]byte{
			sOp(opAlloc, sSmall(60)), sOp(opWriteBlock, sLen(40), sB(2)), sOp(opErrorSet, sOff(0, dl0)),
			sOp(opReset), sOp(opErrorMessage), sOp(opLength, sOff(0, dl0)), sOp(opAlloc, sSmall(60)),
			sOp(opSetInput, sLen(10), sB(4)), sOp(opReset), sOp(opInputLoadU8, sSmall(0)), reg(0)}},
		{"reset with a position past the memory's end", 0, [][]byte{
			sOp(opAlloc, sSmall(60)), sOp(opStoreU8, sOff(0, dl0), sB(0xaa)),
			sOp(opStoreU64, sRootF(rfPosition), sU32(1<<20)), sOp(opReset)}},
		{"reset with a position past 2^31", 0, [][]byte{
			sOp(opAlloc, sSmall(60)), sOp(opStoreU64, sRootF(rfPosition), sHuge(0)), sOp(opReset), sOp(opAlloc, sSmall(3)),
			sOp(opStoreU64, sRootF(rfPosition), sU32(0x80000010)), sOp(opReset)}},
		{"a block size that makes length's walk a cycle", 0, [][]byte{
			sOp(opAlloc, sSmall(30)), sOp(opAlloc, sSmall(30)),
			sOp(opStoreU64, sOff(1, dlMinus8), sU64(0xfffffff4)), sOp(opLength, sOff(0, dl0))}},
		{"a block size that makes free's walk a cycle", 0, [][]byte{
			sOp(opAlloc, sSmall(30)), sOp(opStoreU64, sOff(0, dlMinus8), sNear64(11)), sOp(opFree, sMemEnd(-4))}},
		{"reuse with corrupted free blocks", 1, [][]byte{
			sOp(opAlloc, sU16(40000)), sOp(opAlloc, sU16(20000)), sOp(opFree, sOff(1, dl0)),
			sOp(opStoreU64, sOff(1, dlMinus8), sU64(45000)), sOp(opAlloc, sU16(9000)), // overlaps the next block
			sOp(opAlloc, sU16(30000)), sOp(opLength, sOff(0, dl0)), sOp(opLength, sOff(1, dl0)), sOp(opFree, sOff(1, dl0)),
			sOp(opStoreU64, sOff(4, dlMinus8), sU64(0x00fffff0)), sOp(opAlloc, sU16(9000))}},
		{"writeBlock and readBlock", 0, [][]byte{
			sOp(opWriteBlock, sLen16(3000), sB(5)), sOp(opReadBlock, sOff(0, dl0)), sOp(opWriteBlock, sLen(0), sB(0)),
			sOp(opReadBlock, sOff(0, dlMinus1)), sOp(opReadBlock, sMemEnd(1)), sOp(opWriteBlock, sLenMemEnd(0), sB(1)),
			sOp(opReadBlock, sOff(0, dl0)), sOp(opReadBlock, sMemEnd(0))}},
		{"store_u64 over the root's registers", 2, [][]byte{
			sOp(opSetInput, sLen(16), sB(1)), sOp(opStoreU64, sRootF(rfInputOffset), sMemEnd(-2)), sOp(opInputLoadU8, sSmall(0)),
			sOp(opInputLoadU8, sSmall(1)), sOp(opStoreU64, sRootF(rfInputLength), sHuge(3)),
			sOp(opStoreU64, sRootF(rfInputOffset), sSmall(70)), sOp(opInputLoadU8, sU32(1<<32-60)), sOp(opInputLoadU8, sSmall(200)),
			sOp(opInputLoadU64, sSmall(3)), sOp(opStoreU64, sRootF(rfOutputOffset), sSmall(70)),
			sOp(opStoreU64, sRootF(rfOutputLength), sHuge(0)), sOp(opOutput), sOp(opStoreU64, sRootF(rfOutputLength), sSmall(9)),
			sOp(opOutput), sOp(opStoreU64, sRootF(rfError), sSmall(3)), sOp(opErrorMessage),
			sOp(opStoreU64, sRootF(rfInputOffset), sMemEnd(-2)), sOp(opInputLoadU8, sSmall(2))}}, // past the end: a trap
	}
}

// ---------------------------------------------------------------------------
// The tests.

func FuzzKernelMatchesWasm(f *testing.F) {
	seeds := map[string]kdSeed{}
	for _, s := range kdSeeds() {
		f.Add(s.bytes())
		seeds[string(s.bytes())] = s
	}
	fuzzing := false
	if fl := flag.Lookup("test.fuzz"); fl != nil {
		fuzzing = fl.Value.String() != ""
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ops, d, end := kdRunBytes(t, data, kdMaxOps)
		if d != nil {
			if !fuzzing { // when fuzzing, the fuzzer minimizes the input itself
				d = kdShrink(t, d)
			}
			t.Fatal(d)
		}
		if s, ok := seeds[string(data)]; ok {
			kdCheckSeed(t, s, ops, end)
		}
	})
}

// kdCheckSeed checks the seed encoder against the decoder: a seed runs the
// ops it was written with, up to a trap or a timeout on both sides (which
// ends a sequence).
func kdCheckSeed(t *testing.T, s kdSeed, ops []kdOp, end string) {
	if len(ops) > len(s.ops) || (end == "" && len(ops) != len(s.ops)) {
		t.Fatalf("seed %q: %d ops encoded, %d decoded (%v)", s.name, len(s.ops), len(ops), ops)
	}
	for i, o := range ops {
		if want := kdOpTable[s.ops[i][0]]; o.code != want {
			t.Errorf("seed %q: op %d decoded as %v, encoded as %s", s.name, i, o, kdFuncNames[want])
		}
	}
	if len(ops) < len(s.ops) {
		t.Logf("seed %q: ends at op %d of %d, by a %s: %v", s.name, len(ops)-1, len(s.ops), end, ops[len(ops)-1])
	}
}

// TestKernelMatchesWasmRandom runs pseudo-random sequences from a fixed
// seed, under the caps of 17, 32 and 64 pages. Eighty of them, and
// memories of at most 4 MiB: the reference's loops are slow under -race
// (see kdDeadline), and the fuzzer and the seeds reach further.
func TestKernelMatchesWasmRandom(t *testing.T) {
	const seqs, opsPer = 80, 200
	rng := rand.New(rand.NewPCG(659, 1065))
	for i := 0; i < seqs; i++ {
		data := make([]byte, 8*opsPer)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		data[0] = byte(1 + i%3) // kdCaps[1:]
		if _, d, _ := kdRunBytes(t, data, opsPer); d != nil {
			t.Fatalf("random sequence %d, shrunk:\n%v", i, kdShrink(t, d))
		}
	}
}

// TestKernelMatchesWasmCases runs fixed op lists on both kernels, each a
// case worth reading on its own; the first ones are divergences that the
// fuzzer found, as short as kdShrink makes them.
func TestKernelMatchesWasmCases(t *testing.T) {
	cases := []struct {
		name string
		cap  uint32
		ops  []kdOp
	}{
		// The Wasm memset stores 4 bytes at a time and traps at the first
		// store past the memory's end, having zeroed everything before it;
		// the native one checks the whole range first and zeroes nothing.
		{"reset whose memset runs past the memory's end", 256, []kdOp{
			kAlloc(60), kStoreU64(9, 1<<20), kReset()}},
		// The same through the host: SetInput's alloc fails (17 pages), so
		// go-sdk writes the input at 0, over the root's position, and the
		// next SetInput's reset runs past the end.
		{"setInput after an input written over the root", 17, []kdOp{
			kSetInput(590075, 52), kSetInput(135, 43)}},

		{"a walk for reuse that cycles: both time out", 17, []kdOp{
			kAlloc(30000), kAlloc(30000), kStoreU64(69, 0xfffffff4), kAlloc(10000)}},
		{"a block whose size wraps the walk back below its start", 256, []kdOp{
			kAlloc(30), kAlloc(30), kStoreU64(111, 0xffffff00), kLength(119), kAlloc(1), kLength(161)}},
		{"status bytes other than 0, 1, 2", 256, []kdOp{
			kAlloc(30), kAlloc(30), kStoreU8(65, 7), kLength(77), kFree(77), kStoreU8(107, 255),
			kStoreU64(9, 65400), kAlloc(100), kLength(119)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if d := kdRunOps(t, c.cap, c.ops...); d != nil {
				t.Fatal(d)
			}
		})
	}
}

// TestKernelKnownValues runs fixed sequences and checks the values the
// reference kernel (extism-runtime.wasm v1.7.0) returns, on both kernels.
// test_659 is the kernel's own test (extism/extism, kernel/src/lib.rs);
// its offsets there are for a kernel that always looked for a free block
// first, while this one reuses a freed block only once the bump area is
// full, so from the second alloc(4) on the reference's values differ.
func TestKernelKnownValues(t *testing.T) {
	type step struct {
		op   kdOp
		want uint64
	}
	cases := []struct {
		name  string
		cap   uint32
		steps []step
	}{
		{"test_659", 256, []step{
			{kReset(), 0},
			{kAlloc(1065), 77},
			{kAlloc(288), 1154},
			{kAlloc(128), 1454},
			{kLength(1154), 288},
			{kLength(1454), 128},
			{kFree(1454), 0},
			{kAlloc(213), 1594},
			{kLengthUnsafe(1594), 213},
			{kAlloc(511), 1819},
			{kAlloc(4), 2342}, // the source's 1454: the freed block is not looked at
			{kLength(1454), 0},
			{kLength(2342), 4},
			{kLength(1819), 511},
			{kAlloc(13), 2358},
			{kLength(2358), 13},
			{kAlloc(336), 2383},
			{kAlloc(1077), 2731},
			{kLength(2383), 336},
			{kLength(2731), 1077},
			{kFree(2731), 0},
			{kAlloc(1094), 3820},
			{kLengthUnsafe(3820), 1094},
			{kAlloc(4), 4926},
			{kAlloc(4), 4942},
			{kLength(4942), 4},
			{kLength(4926), 4},
		}},
		{"fresh root", 256, []step{
			{kRegister(5), 65472}, // memory_bytes: a page less the root, though the memory has 16
			{kRegister(0), 0},
			{kAlloc(0), 0},
			{kAlloc(1), 77},
			{kLength(77), 1},
			{kLengthUnsafe(77), 1},
			{kLength(76), 0},
			{kLoadU8(65), 1},          // the block's status: active
			{kLoadU64(69), 1 | 1<<32}, // size and used
			{kRegister(5), 65472},
		}},
		{"reuse only once the bump area is full", 17, []step{
			{kAlloc(30000), 77},
			{kAlloc(20000), 30089},
			{kFree(77), 0},
			{kAlloc(15000), 50101}, // fits in what is left of the root's length: bumped
			{kAlloc(1000), 29077},  // does not: the freed block, split (30000 - 1000 >= 128)
			{kLength(77), 0},       // the front part, 28988 bytes, free
			{kLoadU64(69), 28988},  // its size, and used 0
			{kLength(29077), 1000},
			{kRegister(5), 65472}, // no growth
		}},
		{"the split threshold: an excess of 127 is kept, 128 split off", 17, []step{
			{kAlloc(1000), 77},
			{kAlloc(64000), 1089}, // 384 bytes left: the next allocs reuse
			{kFree(77), 0},
			{kAlloc(873), 77}, // excess 127: the whole block
			{kLength(77), 873},
			{kLoadU64(69), 1000 | 873<<32},
			{kFree(77), 0},
			{kAlloc(872), 205}, // excess 128: split, the tail block is used
			{kLength(205), 872},
			{kLoadU64(69), 116}, // the front: size 128 - 12, used 0
		}},
		{"reuse when the need equals the position", 17, []step{
			{kAlloc(40000), 77},
			{kFree(77), 0},
			{kAlloc(40000), 77}, // need 40012 == position 40012: the walk runs
			{kRegister(5), 65472},
			{kAlloc(40000), 40089}, // need < position, nothing free: grows a page
			{kRegister(5), 65472 + 65536},
		}},
		{"input_set and output_set bounds", 256, []step{
			{kInputSet(70, 65467), 0}, // last byte 65536: in the root's length
			{kRegister(0), 65467},
			{kInputSet(70, 65468), 0}, // last byte 65537 = length + 65: refused
			{kRegister(0), 65467},
			{kInputSet(65, 1), 0},
			{kRegister(1), 65},
			{kInputSet(64, 2), 0}, // below the blocks: refused
			{kRegister(1), 65},
			{kInputSet(66, 0), 0}, // empty: its last byte is 65, accepted
			{kRegister(0), 0},
			{kInputSet(65, 0), 0}, // last byte 64: refused
			{kRegister(1), 66},
			{kOutputSet(65535, 2), 0},
			{kRegister(2), 2},
			{kOutputSet(65536, 2), 0}, // last byte at the limit: refused
			{kOutputSet(65537, 0), 0}, // starts at the limit: refused
			{kRegister(3), 65535},
			{kErrorSet(65536), 0},
			{kRegister(4), 65536},
			{kErrorSet(65537), 0}, // refused
			{kErrorSet(64), 0},    // refused
			{kRegister(4), 65536},
			{kErrorSet(65), 0},
			{kRegister(4), 65},
		}},
		{"input registers", 256, []step{
			{kSetInput(100, 3), 77},
			{kRegister(0), 100},
			{kRegister(1), 77},
			{kInputLoadU8(99), uint64(kdPattern()[3+99])},
			{kInputLoadU8(100), 0},
			{kInputLoadU64(92), binary.LittleEndian.Uint64(kdPattern()[3+92:])},
			{kFree(77), 0},
			{kRegister(0), 0},
			{kInputLoadU8(0), 0},
		}},
		{"alloc near 2^64 wraps its need to 11", 256, []step{
			{kAlloc(^uint64(0)), 77}, // bumped by 11, size 0xffffffff
			{kLoadU64(9), 11},
			{kLengthUnsafe(77), 0xffffffff},
			{kAlloc(1), 88},  // its header at 76, over the first one's used
			{kLength(88), 1}, // the walk from 65 wraps to 76
		}},
		{"a shortfall of exactly a page grows one page", 256, []step{
			{kAlloc(130932), 77}, // need 130944, 65408 left: 65536 short
			{kRegister(5), 65472 + 65536},
			{kLoadU8(17*65536 - 1), 0},
			{kAlloc(65536), 131021}, // 64 left: 65548 short, 2 pages
			{kRegister(5), 65472 + 3*65536},
			{kLoadU8(19*65536 - 1), 0},
		}},
		{"alloc of 2^63: npages wraps to 0, memory.grow(0) succeeds", 256, []step{
			{kAlloc(1 << 63), 77},
			{kRegister(5), 65472},
			{kLoadU64(9), 1<<63 + 12},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := kdNewRef(t, c.cap, kdLong)
			defer ref.close()
			sub := kdNewSub(t, c.cap)
			for i, s := range c.steps {
				ro, so := ref.do(s.op), sub.do(s.op)
				if ro.trap || ro.timeout || ro.val != s.want {
					t.Errorf("step %d %v: wasm %v, want %d", i, s.op, ro, s.want)
				}
				if !so.same(ro) {
					t.Errorf("step %d %v: native %v, wasm %v", i, s.op, so, ro)
				}
				if rm := ref.memory(); !kdMemEqual(rm, sub.k.mem) {
					t.Fatalf("step %d %v: %s", i, s.op, kdMemDiff(rm, sub.k.mem))
				}
			}
		})
	}
}
