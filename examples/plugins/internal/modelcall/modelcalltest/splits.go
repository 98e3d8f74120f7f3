package modelcalltest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/plugins/abi"
)

// CheckSplits checks a model plugin's streaming against a recorded
// stream of the provider's: read by call (the plugin's call on a Host),
// the stream split into two reads at every byte offset, into many at
// random ones (from seed), and read a byte at a time, each with LF and
// with CRLF line breaks, replies exactly want (what the same answer
// unstreamed decodes to), and its deltas add up to wantDeltas with one at
// most per read that brought any of the answer, none of them empty.
func CheckSplits(t testing.TB, recorded string, seed uint64, want abi.EffectReply, wantDeltas abi.ModelDelta, call func(*Host) abi.EffectReply) {
	t.Helper()
	check := func(name string, h *Host) {
		t.Helper()
		CheckRead(t, name, h, want, wantDeltas, call)
	}
	for _, body := range []string{recorded, strings.ReplaceAll(recorded, "\n", "\r\n")} {
		b := []byte(body)
		for i := range b {
			check(fmt.Sprintf("split at %d", i), Stream(Split(b, i)...))
		}
		rng := rand.New(rand.NewPCG(seed, seed+1))
		for range 200 {
			at := map[int]bool{}
			for range 1 + rng.IntN(12) {
				at[rng.IntN(len(b))] = true
			}
			var cuts []int
			for i := range len(b) {
				if at[i] {
					cuts = append(cuts, i)
				}
			}
			check(fmt.Sprintf("split at %v", cuts), Stream(Split(b, cuts...)...))
		}
		h := Stream()
		for i := range b {
			h.Pieces = append(h.Pieces, b[i:i+1])
		}
		check("a byte at a time", h)
	}
}

// asJSON is a reply as JSON, for messages.
func asJSON(r abi.EffectReply) string {
	b, _ := json.Marshal(r)
	return string(b)
}

// CheckRead checks one read of a stream: call on h replies want, and its
// deltas add up to wantDeltas, with one at most per read that brought any
// of the answer, none of them empty. name says which read, for messages.
func CheckRead(t testing.TB, name string, h *Host, want abi.EffectReply, wantDeltas abi.ModelDelta, call func(*Host) abi.EffectReply) {
	t.Helper()
	if got := call(h); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: reply\n%s\nwant\n%s", name, asJSON(got), asJSON(want))
	}
	if got := h.Joined(); !reflect.DeepEqual(got, wantDeltas) {
		t.Fatalf("%s: deltas add up to\n%+v\nwant\n%+v", name, got, wantDeltas)
	}
	if len(h.Deltas) > h.Reads {
		t.Fatalf("%s: %d deltas for %d reads", name, len(h.Deltas), h.Reads)
	}
	for _, d := range h.Deltas {
		if modelcall.Empty(d) {
			t.Fatalf("%s: an empty delta", name)
		}
	}
}
