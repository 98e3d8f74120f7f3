package badgerstore

import (
	"encoding/binary"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// lexWalk lists, in lexicographic (byte) order, the distinct values of the
// string component that follows prefix in an index's keys.
//
// Keys sort by their bytes, and a component is length-prefixed, so an
// index holds its values in (length, bytes) order: "b" before "ab". Each
// length forms a run of keys whose values sort lexicographically among
// themselves, so lexWalk keeps one head per length present (the smallest
// value of that length not yet taken) and hands out the smallest head: a
// merge. Starting costs one or two seeks per length present; each value
// costs one seek. It never reads values, and never reads a key it does not
// hand out beyond the heads.
//
// lexWalk holds no iterator position between calls (every step seeks), so
// walks over nested prefixes can share one iterator.
type lexWalk struct {
	it     *badger.Iterator
	prefix key
	heads  []string // the smallest value not yet taken of each length present
}

// maxLexLen bounds a component's length: one uvarint byte. IDs are at most
// loop.MaxIDLen (64) bytes.
const maxLexLen = 127

// newLexWalk starts a walk over the values v after after: v > after, or
// v >= after when inclusive.
func newLexWalk(it *badger.Iterator, prefix key, after string, inclusive bool) (*lexWalk, error) {
	w := &lexWalk{it: it, prefix: prefix}
	for n := 1; n <= maxLexLen; n++ {
		it.Seek(w.lowerBound(n, after, inclusive))
		if !it.ValidForPrefix(prefix) {
			break
		}
		v, err := w.value()
		if err != nil {
			return nil, err
		}
		if len(v) == n {
			w.heads = append(w.heads, v)
			continue
		}
		// No value of length n is past the bound; the seek landed in a
		// longer run. Go on from that length (n++ follows).
		n = len(v) - 1
	}
	return w, nil
}

// lowerBound is where the values of length n after after begin. All values
// of length n compare with after over their first min(n, len(after))
// bytes: when n > len(after) a value is past after exactly when it starts
// with after or something greater; otherwise it must be greater than
// after[:n], except that after itself qualifies when inclusive.
func (w *lexWalk) lowerBound(n int, after string, inclusive bool) key {
	k := append(key(nil), w.prefix...)
	k = binary.AppendUvarint(k, uint64(n))
	switch {
	case n > len(after):
		return k.raw(after)
	case n == len(after) && inclusive:
		return k.raw(after)
	default:
		return append(k.raw(after[:n]), 0xff)
	}
}

// value decodes the component at the iterator's key.
func (w *lexWalk) value() (string, error) {
	b := w.it.Item().Key()[len(w.prefix):]
	n, width := binary.Uvarint(b)
	if width <= 0 || n == 0 || n > maxLexLen || uint64(len(b)-width) < n {
		return "", fmt.Errorf("badgerstore: malformed key component %x", b)
	}
	return string(b[width : width+int(n)]), nil
}

// next returns the smallest value not yet taken; ok is false at the end.
func (w *lexWalk) next() (v string, ok bool, err error) {
	if len(w.heads) == 0 {
		return "", false, nil
	}
	i := 0
	for j := range w.heads {
		if w.heads[j] < w.heads[i] {
			i = j
		}
	}
	v = w.heads[i]
	// The next value of the same length: past every key of v (the bytes
	// after a component never start with 0xff, a uvarint of at most 127).
	run := key(binary.AppendUvarint(append(key(nil), w.prefix...), uint64(len(v))))
	w.it.Seek(append(run.raw(v), 0xff))
	if w.it.ValidForPrefix(run) {
		if w.heads[i], err = w.value(); err != nil {
			return "", false, err
		}
	} else {
		w.heads = append(w.heads[:i], w.heads[i+1:]...)
	}
	return v, true, nil
}
