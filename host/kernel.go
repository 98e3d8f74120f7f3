package host

import (
	"encoding/binary"
	"fmt"

	"github.com/tetratelabs/wazero/sys"
)

// kernel is the Extism kernel of one native instance, in Go: the memory a
// plugin reaches through the extism:host/env functions (alloc, load_u8,
// output_set, ...), its allocator and its input, output and error
// registers.
//
// It is a transcription, function by function, of the kernel that extism
// go-sdk embeds (extism-runtime.wasm, kernel v1.7.0, built for wasm32 with
// bounds checking) combined with the go-sdk's own Go versions of load_u64,
// store_u64 and input_load_u64, which replace the kernel's. The layout is
// the kernel's, byte for byte, in a buffer the size of the kernel's linear
// memory:
//
//	1        the MemoryRoot: initialized u8, then at 9 position, 17 length,
//	         25 error, 33 input_offset, 41 input_length, 49 output_offset,
//	         57 output_length (u64 each, little-endian)
//	65       the first MemoryBlock: status u8, size u32 at +4, used u32 at
//	         +8, then size bytes of data at +12; the next block follows
//
// Every arithmetic wrap, every bounds check and every trap is the
// kernel's, so that a plugin cannot tell this kernel from the Wasm one:
// the same offsets come back from alloc, the same out-of-range loads read
// 0 or trap, and a plugin that scribbles over the allocator's blocks gets
// the same results (docs/DESIGN.md §7.6; the differential test
// TestCallPathsAgree runs every plugin in the repository through both).
//
// A trap is a panic with a *kernelTrap, which wazero turns into the
// guest call's error (classified plugin_trap); a walk over blocks that a
// guest has corrupted into a cycle stops when the instance is closed by
// its timeout, as the Wasm kernel's loop does. kernel is not safe for
// concurrent use: an instance serves one call at a time.
type kernel struct {
	mem  []byte                      // the kernel's linear memory, len a multiple of 64 KiB
	grow func(newSize uint64) []byte // the memory allocator: nil refuses
	// stopped, when not nil, is the instance's exit code once its timeout
	// or its caller halted it (0 while it runs).
	stopped func() uint32
}

// Kernel layout constants (wasm32: usize is 4 bytes).
const (
	kernelPage        = 65536
	kernelMinPages    = 16      // the kernel module's declared memory minimum
	kernelMaxPages    = 65536   // wazero's limit for a memory with no maximum
	rootAt            = 1       // the MemoryRoot's address
	blocksAt          = 65      // the first MemoryBlock: rootAt + size of MemoryRoot
	rootSize          = 64      // size of MemoryRoot
	blockHeader       = 12      // size of MemoryBlock
	offInitialized    = 1       // rootAt + 0
	offPosition       = 9       // rootAt + 8
	offLength         = 17      // rootAt + 16
	offError          = 25      // rootAt + 24
	offInputOffset    = 33      // rootAt + 32
	offInputLength    = 41      // rootAt + 40
	offOutputOffset   = 49      // rootAt + 48
	offOutputLength   = 57      // rootAt + 56
	initialRootLength = 65472   // PAGE_SIZE - size of MemoryRoot
	walkCheckEvery    = 1 << 12 // block-walk steps between two looks at stop
)

// kernelTrap is a trap of a kernel function: what the Wasm kernel's
// out-of-bounds access or unreachable would have been.
type kernelTrap struct{ what string }

func (t *kernelTrap) Error() string { return "extism kernel: " + t.what }

func trapf(format string, args ...any) { panic(&kernelTrap{what: fmt.Sprintf(format, args...)}) }

// newKernel returns a kernel whose memory has the Wasm kernel's initial
// size, taken from grow (which charges it to the instance's memory).
func newKernel(grow func(uint64) []byte, stopped func() uint32) (*kernel, bool) {
	k := &kernel{grow: grow, stopped: stopped}
	k.mem = grow(kernelMinPages * kernelPage)
	return k, k.mem != nil
}

// pages is memory.size.
func (k *kernel) pages() uint32 { return uint32(len(k.mem) / kernelPage) }

// memoryGrow is memory.grow: the old size in pages, or -1 (as uint32).
func (k *kernel) memoryGrow(delta uint32) uint32 {
	cur := k.pages()
	if delta == 0 {
		return cur
	}
	next := uint64(cur) + uint64(delta)
	if next > kernelMaxPages || int32(delta) < 0 {
		return ^uint32(0)
	}
	b := k.grow(next * kernelPage)
	if b == nil {
		return ^uint32(0)
	}
	k.mem = b
	return cur
}

// Wasm loads and stores: the effective address is a u32 base plus a
// static offset, checked against the memory's size; past it, a trap.

func (k *kernel) check(base uint32, off, n uint64) uint64 {
	ea := uint64(base) + off
	if ea+n > uint64(len(k.mem)) {
		trapf("out of bounds memory access (%d bytes at %d, memory is %d bytes)", n, ea, len(k.mem))
	}
	return ea
}

func (k *kernel) ld8(base uint32, off uint64) uint32 {
	return uint32(k.mem[k.check(base, off, 1)])
}

func (k *kernel) ld32(base uint32, off uint64) uint32 {
	ea := k.check(base, off, 4)
	return binary.LittleEndian.Uint32(k.mem[ea:])
}

func (k *kernel) ld64(base uint32, off uint64) uint64 {
	ea := k.check(base, off, 8)
	return binary.LittleEndian.Uint64(k.mem[ea:])
}

func (k *kernel) st8(base uint32, off uint64, v uint32) {
	k.mem[k.check(base, off, 1)] = byte(v)
}

func (k *kernel) st32(base uint32, off uint64, v uint32) {
	ea := k.check(base, off, 4)
	binary.LittleEndian.PutUint32(k.mem[ea:], v)
}

func (k *kernel) st64(base uint32, off uint64, v uint64) {
	ea := k.check(base, off, 8)
	binary.LittleEndian.PutUint64(k.mem[ea:], v)
}

// walked counts one step of a walk over the blocks and, every
// walkCheckEvery steps, ends the call if the instance was closed: a guest
// can corrupt the block sizes into a cycle, which the Wasm kernel would
// spin in until the call's timeout.
func (k *kernel) walked(steps *uint32) {
	*steps++
	if *steps%walkCheckEvery == 0 && k.stopped != nil {
		if code := k.stopped(); code != 0 {
			panic(sys.NewExitError(code))
		}
	}
}

// memset is the kernel's compiler-builtins memset(dst, 0, n), including
// the way it splits n into a byte head, words and a byte tail.
func (k *kernel) memset(dst, n uint32) {
	p := dst
	if n >= 16 {
		head := -dst & 3
		wordsAt := dst + head
		if head != 0 {
			for {
				k.st8(p, 0, 0)
				p++
				if p >= wordsAt {
					break
				}
			}
		}
		rest := n - head
		words := rest &^ 3
		end := wordsAt + words
		if int32(words) >= 1 {
			if end > wordsAt {
				ea, size := uint64(wordsAt), uint64(len(k.mem))
				if ea+uint64(words) > size {
					// The loop stores every whole word that fits, then
					// traps on the first that does not.
					if ea < size {
						clear(k.mem[ea : ea+(size-ea)/4*4])
					}
					k.check(wordsAt, 0, uint64(words))
				}
				clear(k.mem[ea : ea+uint64(words)])
			} else { // the loop stores once, then its bound has wrapped
				k.st32(wordsAt, 0, 0)
			}
		}
		p = end
		n = rest & 3
	}
	if n != 0 {
		end := p + n
		for {
			k.st8(p, 0, 0)
			p++
			if p >= end {
				break
			}
		}
	}
}

// root is MemoryRoot::new: it initialises the root on first use.
func (k *kernel) root() {
	v := k.ld8(0, offInitialized)
	if v == 0 {
		k.st8(0, offInitialized, 1)
		// memory.size is never 0 here: the memory starts at 16 pages.
		k.st64(0, offInputOffset, 0)
		k.st64(0, offInputLength, 0)
		k.st64(0, offOutputOffset, 0)
		k.st64(0, offOutputLength, 0)
		k.st64(0, offError, 0)
		k.st64(0, offLength, initialRootLength)
		k.st64(0, offPosition, 0)
		k.memset(blocksAt, 144)
		return
	}
	k.st8(0, offInitialized, v)
}

// allocBlock is MemoryRoot::alloc: the address of the block's header, or
// 0 when the memory cannot grow.
func (k *kernel) allocBlock(length uint64) uint32 {
	need := length + blockHeader
	pos := k.ld64(rootAt, 8)
	memLeft := k.ld64(rootAt, 16) - pos - rootSize
	if need >= memLeft {
		if b, ok := k.reuseBlock(length, need, pos); ok {
			return b
		}
		diff := need - memLeft
		npages := uint32(diff>>16) + b2u(diff&0xffff != 0)
		if k.memoryGrow(npages) == ^uint32(0) {
			return 0
		}
		k.st64(rootAt, 16, k.ld64(rootAt, 16)+uint64(npages)<<16)
	}
	k.st64(rootAt, 8, k.ld64(rootAt, 8)+need)
	b := uint32(pos) + blocksAt
	k.st32(b, 8, uint32(length))
	k.st32(b, 4, uint32(length))
	k.st8(b, 0, 1)
	return b
}

// reuseBlock is find_free_block, as the kernel runs it: only when the
// bump allocator has no room left.
func (k *kernel) reuseBlock(length, need, pos uint64) (uint32, bool) {
	if need > pos {
		return 0, false
	}
	end := pos + blocksAt
	if end <= blocksAt {
		return 0, false
	}
	want := uint32(length)
	b := uint32(blocksAt)
	var steps uint32
	for {
		var size uint32
		switch k.ld8(b, 0) {
		case 0: // unused: taken whatever its size
			return k.useBlock(b, want), true
		case 2: // free
			size = k.ld32(b, 4)
			if size >= want {
				if excess := size - want; excess >= 128 { // split
					k.st32(b, 8, 0)
					k.st32(b, 4, excess-blockHeader)
					b += excess
					k.st32(b, 8, 0)
					k.st32(b, 4, want)
					k.st8(b, 0, 2)
				}
				return k.useBlock(b, want), true
			}
		default:
			size = k.ld32(b, 4)
		}
		b = b + size + blockHeader
		if end <= uint64(b) {
			return 0, false
		}
		k.walked(&steps)
	}
}

func (k *kernel) useBlock(b, used uint32) uint32 {
	k.st8(b, 0, 1)
	k.st32(b, 8, used)
	return b
}

// findActive walks the blocks for the active one whose data starts at p
// (find_block after its bounds check): its header's address, or false.
func (k *kernel) findActive(p uint64) (uint32, bool) {
	end := p + blocksAt
	b := uint32(blocksAt)
	var steps uint32
	for {
		data := b + blockHeader
		if k.ld8(b, 0) == 1 && uint64(data) == p {
			return b, true
		}
		b = data + k.ld32(b, 4)
		if !(end > uint64(b)) {
			return 0, false
		}
		k.walked(&steps)
	}
}

// inBoundsFast is pointer_in_bounds_fast: 64 <= p <= memory's end.
func (k *kernel) inBoundsFast(p uint64) bool {
	return p >= rootSize && p <= uint64(k.pages())<<16
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// The extism:host/env functions, as a guest calls them.

func (k *kernel) alloc(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	k.root()
	b := k.allocBlock(n)
	if b == 0 {
		return 0
	}
	return uint64(b + blockHeader)
}

func (k *kernel) free(p uint64) {
	if p == 0 {
		return
	}
	k.root()
	if !k.inBoundsFast(p) {
		return
	}
	b, ok := k.findActive(p)
	if !ok {
		return
	}
	k.st8(b, 0, 2)
	if k.ld64(0, offInputOffset) != p {
		return
	}
	k.st64(0, offInputLength, 0)
}

func (k *kernel) lengthUnsafe(p uint64) uint64 {
	if p == 0 || !k.inBoundsFast(p) {
		return 0
	}
	h := uint32(p) - blockHeader
	if k.ld8(h, 0) != 1 {
		return 0
	}
	return uint64(k.ld32(h, 8))
}

func (k *kernel) length(p uint64) uint64 {
	if p == 0 {
		return 0
	}
	k.root()
	if !k.inBoundsFast(p) {
		return 0
	}
	b, ok := k.findActive(p)
	if !ok {
		return 0
	}
	return uint64(k.ld32(b, 8))
}

func (k *kernel) loadU8(p uint64) uint32 {
	if !k.inBoundsFast(p) {
		return 0
	}
	return k.ld8(uint32(p), 0)
}

func (k *kernel) storeU8(p uint64, v uint32) {
	if !k.inBoundsFast(p) {
		return
	}
	k.st8(uint32(p), 0, v)
}

func (k *kernel) inputLoadU8(i uint64) uint32 {
	k.root()
	if k.ld64(0, offInputLength) <= i {
		return 0
	}
	return k.ld8(uint32(k.ld64(0, offInputOffset)+i), 0)
}

// loadU64, storeU64 and inputLoadU64 are go-sdk's: a u32 offset into the
// whole memory, with no lower bound and no look at the input's length; a
// read or write past the end panics (a trap).

func (k *kernel) loadU64(p uint64) uint64 {
	if uint64(uint32(p))+8 > uint64(len(k.mem)) {
		trapf("could not read value at offset: %d", p)
	}
	return binary.LittleEndian.Uint64(k.mem[uint32(p):])
}

func (k *kernel) storeU64(p, v uint64) {
	if uint64(uint32(p))+8 > uint64(len(k.mem)) {
		trapf("could not write value '%d' at offset: %d", v, p)
	}
	binary.LittleEndian.PutUint64(k.mem[uint32(p):], v)
}

// inputLoadU64 reads at inputOffset (the offset the host allocated the
// input at, not the input_offset register) plus i.
func (k *kernel) inputLoadU64(inputOffset, i uint64) uint64 {
	a := uint32(i + inputOffset)
	if uint64(a)+8 > uint64(len(k.mem)) {
		trapf("could not read value at offset: %d", i)
	}
	return binary.LittleEndian.Uint64(k.mem[a:])
}

// setRange is input_set and output_set: the register pair at offAt and
// lenAt takes (h, n) when the whole range lies in the allocator's length.
func (k *kernel) setRange(offAt, lenAt uint64, h, n uint64) {
	k.root()
	limit := k.ld64(0, offLength) + blocksAt
	if h < blocksAt || limit <= h {
		return
	}
	last := h + n - 1
	if last < blocksAt || last >= limit {
		return
	}
	k.st64(0, offAt, h)
	k.st64(0, lenAt, n)
}

func (k *kernel) inputSet(h, n uint64)  { k.setRange(offInputOffset, offInputLength, h, n) }
func (k *kernel) outputSet(p, n uint64) { k.setRange(offOutputOffset, offOutputLength, p, n) }

func (k *kernel) register(at uint64) uint64 {
	k.root()
	return k.ld64(0, at)
}

func (k *kernel) reset() {
	k.root()
	pos := k.ld32(0, offPosition)
	k.st64(0, offPosition, 0)
	k.memset(blocksAt, pos)
	k.st64(0, offError, 0)
	k.st64(0, offOutputLength, 0)
	k.st64(0, offOutputOffset, 0)
	k.st64(0, offInputLength, 0)
	k.st64(0, offInputOffset, 0)
}

func (k *kernel) errorSet(h uint64) {
	k.root()
	if h != 0 && (h <= rootSize || k.ld64(0, offLength)+blocksAt <= h) {
		return
	}
	k.st64(0, offError, h)
}

// What the host itself does with the memory, as go-sdk does it through
// api.Memory: u32 offsets, and a range past the end is refused (false),
// not a trap.

func (k *kernel) read(off, n uint32) ([]byte, bool) {
	if uint64(off)+uint64(n) > uint64(len(k.mem)) {
		return nil, false
	}
	return k.mem[off : off+n : off+n], true
}

func (k *kernel) write(off uint32, b []byte) bool {
	if uint64(off)+uint64(len(b)) > uint64(len(k.mem)) {
		return false
	}
	copy(k.mem[off:], b)
	return true
}

// readBlock is go-sdk's CurrentPlugin.ReadBytes: the block's length by
// the walk, then a copy of that many bytes at off.
func (k *kernel) readBlock(off uint64) ([]byte, bool) {
	n := k.length(off)
	b, ok := k.read(uint32(off), uint32(n))
	if !ok {
		return nil, false
	}
	return append([]byte{}, b...), true
}

// writeBlock is go-sdk's CurrentPlugin.WriteBytes: alloc, then a write at
// the offset it returned, even 0.
func (k *kernel) writeBlock(b []byte) (uint64, bool) {
	p := k.alloc(uint64(len(b)))
	if !k.write(uint32(p), b) {
		return 0, false
	}
	return p, true
}

// setInput is go-sdk's SetInput: reset, alloc, write, input_set. It
// returns the offset the input was allocated at.
func (k *kernel) setInput(data []byte) uint64 {
	k.reset()
	p := k.alloc(uint64(len(data)))
	k.write(uint32(p), data)
	k.inputSet(p, uint64(len(data)))
	return p
}

// output is go-sdk's GetOutput: a copy of the output registers' range,
// empty when it lies outside the memory.
func (k *kernel) output() []byte {
	off := k.register(offOutputOffset)
	n := k.register(offOutputLength)
	b, _ := k.read(uint32(off), uint32(n))
	out := make([]byte, len(b))
	copy(out, b)
	return out
}

// errorMessage is go-sdk's GetError: the error block's bytes, "" when
// none is set or the block is not one.
func (k *kernel) errorMessage() string {
	off := k.register(offError)
	if off == 0 {
		return ""
	}
	n := k.length(off)
	b, _ := k.read(uint32(off), uint32(n))
	return string(b)
}
