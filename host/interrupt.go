package host

import "fmt"

// Interrupting a guest without wazero's termination checks.
//
// wazero stops a running guest only when its module was compiled with
// WithCloseOnContextDone: every loop header then calls a trampoline that
// looks at the module's closed flag, and every call into the module
// starts a watcher goroutine for its context. Together they made a call
// of the C calculator six times slower than the same code unchecked, and
// an empty call 40 % dearer (docs/DESIGN.md §7.6).
//
// The native path instead rewrites the module before compiling it, as
// Wasmtime's epoch interruption and Wasm gas meters do (instrumentLoops):
// at the head of every loop a countdown, and every safepointEvery
// iterations a call of an added function, $safepoint, which reads the
// global the host sets to stop the call (exported as interruptExport) and
// grows the memory by 0 pages, which wazero runs in Go: the one moment a
// goroutine running a guest can be preempted, which Go's garbage
// collector needs to stop the world (wazero's own check leaves the native
// code at every iteration for the same reason). To stop a call, the host
// sets the global from the timer's goroutine; the guest traps at its next
// safepoint, and the host reports the stop as the exit of a timeout or a
// cancelled caller, as wazero's own check would. Code that does not loop
// ends by itself (a recursion that does not end overflows the stack, a
// trap); wazero's check has the same reach.
//
// The rewrite needs to know every instruction's immediates, to find the
// loops and skip everything else. A module with an instruction or a type
// it does not know (a proposal it does not cover: GC, typed function
// references, the legacy exception instructions, memory64 limits), or
// with no memory to grow, is not rewritten: instrumentLoops returns an
// error and the module is compiled as it is, with wazero's checks
// (nativeCode.checked).

// interruptExport is the name the added global is exported under.
const interruptExport = "agenthost:interrupt"

// errUninstrumentable says a module cannot be rewritten, and why.
type errUninstrumentable struct{ why string }

func (e *errUninstrumentable) Error() string { return "cannot add interrupt checks: " + e.why }

func uninstrumentable(format string, args ...any) error {
	return &errUninstrumentable{why: fmt.Sprintf(format, args...)}
}

// Section ids.
const (
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
)

// sectionRank is a section's place in the binary's order (custom
// sections may stand anywhere).
func sectionRank(id byte) int {
	switch id {
	case 1, 2, 3, 4, 5:
		return int(id)
	case 13: // tag
		return 6
	case secGlobal:
		return 7
	case secExport:
		return 8
	case secStart:
		return 9
	case secElement:
		return 10
	case secDataCount:
		return 11
	case secCode:
		return 12
	case secData:
		return 13
	}
	return -1
}

// reader reads a module's bytes; every read past the end or a malformed
// LEB128 sets err, and every later read returns zero.
type reader struct {
	b   []byte
	pos int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = uninstrumentable(format, args...)
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.pos >= len(r.b) {
		r.fail("unexpected end at byte %d", r.pos)
		return 0
	}
	c := r.b[r.pos]
	r.pos++
	return c
}

func (r *reader) skip(n int) {
	if r.err != nil {
		return
	}
	if n < 0 || r.pos+n > len(r.b) {
		r.fail("unexpected end at byte %d", r.pos)
		return
	}
	r.pos += n
}

// lebLimit is the shift past which a LEB128 of maxBits bits is too long.
func lebLimit(maxBits uint) uint { return (maxBits + 6) / 7 * 7 }

// uleb reads an unsigned LEB128 of at most maxBits bits.
func (r *reader) uleb(maxBits uint) uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= lebLimit(maxBits) {
			r.fail("LEB128 too long at byte %d", r.pos)
			return 0
		}
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v
		}
	}
}

func (r *reader) u32() uint32 { return uint32(r.uleb(32)) }

// sleb skips a signed LEB128 of at most maxBits bits, returning its value
// as far as 64 bits go.
func (r *reader) sleb(maxBits uint) int64 {
	var v int64
	var shift uint
	for {
		if shift >= lebLimit(maxBits) {
			r.fail("LEB128 too long at byte %d", r.pos)
			return 0
		}
		c := r.byte()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= int64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
}

func appendULEB(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// Value types that are one byte: i32, i64, f32, f64, v128, funcref,
// externref. (GC reference types are longer, and not covered.)
func isSimpleValType(c byte) bool {
	switch c {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return true
	}
	return false
}

func (r *reader) valType() {
	if c := r.byte(); r.err == nil && !isSimpleValType(c) {
		r.fail("value type 0x%02x", c)
	}
}

func (r *reader) limits() {
	flags := r.byte()
	if flags > 3 { // 0-1: min [max]; 2-3: shared (threads); 4-7 memory64
		r.fail("limits flags 0x%02x", flags)
		return
	}
	r.u32()
	if flags&1 != 0 {
		r.u32()
	}
}

// blockType skips a block's type: empty, a value type, or a type index.
func (r *reader) blockType() {
	if r.err != nil {
		return
	}
	if r.pos >= len(r.b) {
		r.fail("unexpected end at byte %d", r.pos)
		return
	}
	c := r.b[r.pos]
	if c == 0x40 || isSimpleValType(c) {
		r.pos++
		return
	}
	if c == 0x63 || c == 0x64 { // (ref null ht), (ref ht): GC
		r.fail("block type 0x%02x", c)
		return
	}
	if idx := r.sleb(33); r.err == nil && idx < 0 {
		r.fail("block type %d", idx)
	}
}

func (r *reader) memArg() {
	align := r.u32()
	if align&(1<<6) != 0 { // multi-memory: a memory index follows
		r.u32()
	}
	r.uleb(64)
}

// safepointEvery is how many loop iterations a guest runs between two
// safepoints: a memory.grow by 0 pages, which wazero runs in Go. Native
// code cannot be preempted, so a guest that never left it would hold up
// every stop-the-world of Go's garbage collector (and with it the whole
// process) for as long as it ran; it is also where the interrupt global
// is read.
const safepointEvery = 1024

// The sections instrumentLoops rewrites, and what they hold of the module.
type moduleShape struct {
	importedFuncs, definedFuncs     uint64
	importedGlobals, definedGlobals uint64
	types                           uint64
	memories                        uint64
}

// instrumentLoops returns the module with interrupt checks (see above),
// or an *errUninstrumentable. It adds, and shifts no existing index:
//   - two mutable i32 globals: $stop (0, exported as interruptExport,
//     set by the host) and $budget (safepointEvery);
//   - a type () -> () and a function $safepoint of that type:
//     if $stop: unreachable; memory.grow 0 (wazero runs it in Go, where
//     the goroutine can be preempted); if $stop: unreachable; $budget =
//     safepointEvery;
//   - at the head of every loop: if $budget == 0: call $safepoint;
//     $budget -= 1.
func instrumentLoops(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" || wasm[4] != 1 || wasm[5] != 0 || wasm[6] != 0 || wasm[7] != 0 {
		return nil, uninstrumentable("not a WebAssembly 1.0 binary")
	}
	type section struct {
		id   byte
		body []byte
	}
	var sections []section
	r := &reader{b: wasm, pos: 8}
	for r.pos < len(wasm) && r.err == nil {
		id := r.byte()
		n := r.u32()
		start := r.pos
		r.skip(int(n))
		if r.err == nil {
			sections = append(sections, section{id, wasm[start:r.pos]})
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	var shape moduleShape
	have := map[byte]bool{}
	for _, s := range sections {
		have[s.id] = true
		sr := &reader{b: s.body}
		switch s.id {
		case secType:
			shape.types = checkTypes(sr)
		case secImport:
			countImports(sr, &shape)
		case secFunction:
			shape.definedFuncs = sr.uleb(32)
		case secMemory:
			shape.memories += sr.uleb(32)
		case secGlobal:
			shape.definedGlobals = sr.uleb(32)
		}
		if sr.err != nil {
			return nil, sr.err
		}
	}
	if shape.memories == 0 {
		return nil, uninstrumentable("the module has no memory, which the safepoint grows by 0 pages")
	}
	stop := shape.importedGlobals + shape.definedGlobals
	budget := stop + 1
	safepointType := shape.types
	safepointFunc := shape.importedFuncs + shape.definedFuncs

	// At every loop head: if $budget == 0: call $safepoint; $budget -= 1.
	check := appendULEB([]byte{0x23}, budget) // global.get $budget
	check = append(check, 0x45, 0x04, 0x40)   // i32.eqz; if
	check = appendULEB(append(check, 0x10), safepointFunc)
	check = append(check, 0x0b) // end
	check = appendULEB(append(check, 0x23), budget)
	check = append(check, 0x41, 0x01, 0x6b) // i32.const 1; i32.sub
	check = appendULEB(append(check, 0x24), budget)

	trapIfStopped := appendULEB([]byte{0x23}, stop) // global.get $stop
	trapIfStopped = append(trapIfStopped, 0x04, 0x40, 0x00, 0x0b)
	body := []byte{0x00} // no locals
	body = append(body, trapIfStopped...)
	body = append(body, 0x41, 0x00, 0x40, 0x00, 0x1a) // memory.grow 0; drop
	body = append(body, trapIfStopped...)
	body = append(body, 0x41)
	body = appendSLEB(body, safepointEvery)
	body = appendULEB(append(body, 0x24), budget)
	body = append(body, 0x0b)
	safepointCode := appendULEB(nil, uint64(len(body)))
	safepointCode = append(safepointCode, body...)

	newGlobals := []byte{0x7f, 0x01, 0x41, 0x00, 0x0b, 0x7f, 0x01, 0x41}
	newGlobals = appendSLEB(newGlobals, safepointEvery)
	newGlobals = append(newGlobals, 0x0b)
	newExport := appendULEB(nil, uint64(len(interruptExport)))
	newExport = append(newExport, interruptExport...)
	newExport = appendULEB(append(newExport, 0x03), stop) // a global

	added := map[byte]struct {
		n       uint64
		entries []byte
	}{
		secType:     {1, []byte{0x60, 0x00, 0x00}},
		secFunction: {1, appendULEB(nil, safepointType)},
		secGlobal:   {2, newGlobals},
		secExport:   {1, newExport},
	}
	out := append([]byte{}, wasm[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = appendULEB(out, uint64(len(body)))
		out = append(out, body...)
	}
	emitNew := func(id byte) {
		a := added[id]
		emit(id, append(appendULEB(nil, a.n), a.entries...))
		have[id] = true
	}
	for _, s := range sections {
		if rank := sectionRank(s.id); rank >= 0 {
			for _, id := range []byte{secType, secFunction, secGlobal, secExport} {
				if !have[id] && rank > sectionRank(id) {
					emitNew(id)
				}
			}
		}
		switch s.id {
		case secType, secFunction, secGlobal, secExport:
			a := added[s.id]
			sr := &reader{b: s.body}
			n := sr.uleb(32)
			if sr.err != nil {
				return nil, sr.err
			}
			b := appendULEB(nil, n+a.n)
			b = append(b, s.body[sr.pos:]...)
			emit(s.id, append(b, a.entries...))
		case secCode:
			b, err := instrumentCode(s.body, check, safepointCode)
			if err != nil {
				return nil, err
			}
			emit(s.id, b)
		default:
			emit(s.id, s.body)
		}
	}
	for _, id := range []byte{secType, secFunction, secGlobal, secExport} {
		if !have[id] {
			emitNew(id)
		}
	}
	if !have[secCode] {
		emit(secCode, append([]byte{1}, safepointCode...))
	}
	return out, nil
}

func appendSLEB(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// checkTypes reads the type section: function types of one-byte value
// types only (a GC recursion group would change what an index counts).
func checkTypes(r *reader) uint64 {
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		if form := r.byte(); r.err == nil && form != 0x60 {
			r.fail("type form 0x%02x", form)
			return 0
		}
		for j := 0; j < 2 && r.err == nil; j++ { // params, results
			m := r.u32()
			for k := uint32(0); k < m && r.err == nil; k++ {
				r.valType()
			}
		}
	}
	return uint64(n)
}

// countImports reads the import section.
func countImports(r *reader, shape *moduleShape) {
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		r.skip(int(r.u32())) // module
		r.skip(int(r.u32())) // name
		switch kind := r.byte(); kind {
		case 0x00: // function
			r.u32()
			shape.importedFuncs++
		case 0x01: // table
			r.valType()
			r.limits()
		case 0x02: // memory
			r.limits()
			shape.memories++
		case 0x03: // global
			r.valType()
			r.byte()
			shape.importedGlobals++
		case 0x04: // tag
			r.byte()
			r.u32()
		default:
			r.fail("import kind 0x%02x", kind)
		}
	}
}

// instrumentCode rewrites the code section: check after every loop's
// block type, in every function body, and the safepoint function last.
func instrumentCode(body, check, safepoint []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendULEB(nil, uint64(n)+1)
	var fn []byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		size := int(r.u32())
		start := r.pos
		r.skip(size)
		if r.err != nil {
			break
		}
		var err error
		fn, err = instrumentFunc(body[start:r.pos], check, fn[:0])
		if err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		out = appendULEB(out, uint64(len(fn)))
		out = append(out, fn...)
	}
	if r.err != nil {
		return nil, r.err
	}
	if r.pos != len(body) {
		return nil, uninstrumentable("%d bytes after the code section's functions", len(body)-r.pos)
	}
	return append(out, safepoint...), nil
}

// instrumentFunc copies one function body into out, with check after the
// block type of every loop.
func instrumentFunc(body, check, out []byte) ([]byte, error) {
	r := &reader{b: body}
	groups := r.u32()
	for i := uint32(0); i < groups && r.err == nil; i++ {
		r.u32()
		r.valType()
	}
	copied := 0
	for r.pos < len(body) && r.err == nil {
		op := r.byte()
		if op == 0x03 { // loop
			r.blockType()
			if r.err != nil {
				break
			}
			out = append(out, body[copied:r.pos]...)
			out = append(out, check...)
			copied = r.pos
			continue
		}
		skipImmediates(r, op)
	}
	if r.err != nil {
		return nil, r.err
	}
	return append(out, body[copied:]...), nil
}

// skipImmediates skips the immediates of the instruction op, whose opcode
// byte r has just read. Every opcode of Wasm 2.0 (with SIMD), the
// threads, tail-call and exception-handling (try_table) proposals is
// known; any other fails r.
func skipImmediates(r *reader, op byte) {
	switch {
	case op == 0x00, op == 0x01, op == 0x05, op == 0x0a, op == 0x0b, op == 0x0f,
		op == 0x1a, op == 0x1b, op == 0xd1,
		op >= 0x45 && op <= 0xc4:
		// no immediates
	case op == 0x02, op == 0x04: // block, if
		r.blockType()
	case op == 0x08: // throw
		r.u32()
	case op == 0x0c, op == 0x0d: // br, br_if
		r.u32()
	case op == 0x0e: // br_table
		n := r.u32()
		for i := uint32(0); i <= n && r.err == nil; i++ {
			r.u32()
		}
	case op == 0x10, op == 0x12: // call, return_call
		r.u32()
	case op == 0x11, op == 0x13: // call_indirect, return_call_indirect
		r.u32()
		r.u32()
	case op == 0x1c: // select t*
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			r.valType()
		}
	case op == 0x1f: // try_table
		r.blockType()
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			switch kind := r.byte(); kind {
			case 0x00, 0x01: // catch, catch_ref: tag, label
				r.u32()
				r.u32()
			case 0x02, 0x03: // catch_all, catch_all_ref: label
				r.u32()
			default:
				r.fail("try_table catch kind 0x%02x", kind)
			}
		}
	case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
		r.u32()
	case op >= 0x28 && op <= 0x3e: // loads and stores
		r.memArg()
	case op == 0x3f, op == 0x40: // memory.size, memory.grow
		r.u32()
	case op == 0x41:
		r.sleb(32)
	case op == 0x42:
		r.sleb(64)
	case op == 0x43:
		r.skip(4)
	case op == 0x44:
		r.skip(8)
	case op == 0xd0: // ref.null
		if t := r.byte(); r.err == nil && t != 0x70 && t != 0x6f {
			r.fail("ref.null heap type 0x%02x", t)
		}
	case op == 0xd2: // ref.func
		r.u32()
	case op == 0xfc:
		skipFC(r, r.u32())
	case op == 0xfd:
		skipSIMD(r, r.u32())
	case op == 0xfe:
		skipAtomic(r, r.u32())
	default:
		r.fail("opcode 0x%02x at byte %d", op, r.pos-1)
	}
}

func skipFC(r *reader, sub uint32) {
	switch sub {
	case 0, 1, 2, 3, 4, 5, 6, 7: // saturating truncations
	case 8, 10, 12, 14: // memory.init, memory.copy, table.init, table.copy: two indices
		r.u32()
		r.u32()
	case 9, 11, 13, 15, 16, 17: // data.drop, memory.fill, elem.drop, table.grow, table.size, table.fill
		r.u32()
	default:
		r.fail("opcode 0xfc %d", sub)
	}
}

func skipSIMD(r *reader, sub uint32) {
	switch {
	case sub <= 11, sub == 92, sub == 93: // loads, store, load_zero
		r.memArg()
	case sub == 12, sub == 13: // v128.const, i8x16.shuffle
		r.skip(16)
	case sub >= 21 && sub <= 34: // extract_lane, replace_lane
		r.byte()
	case sub >= 84 && sub <= 91: // load_lane, store_lane
		r.memArg()
		r.byte()
	case sub <= 255: // every other SIMD instruction has none
	default:
		r.fail("opcode 0xfd %d", sub)
	}
}

func skipAtomic(r *reader, sub uint32) {
	switch {
	case sub == 3: // atomic.fence
		r.byte()
	case sub <= 2, sub >= 0x10 && sub <= 0x4e:
		r.memArg()
	default:
		r.fail("opcode 0xfe %d", sub)
	}
}
