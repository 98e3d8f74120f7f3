package conformance

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func newFaultHarness(t *testing.T, opts FaultOptions) (*harness, *FaultStore, *MemStore) {
	clock := NewFakeClock(time.Time{})
	inner := NewMemStore(clock, KVLimits{})
	fs := NewFaultStore(inner, opts)
	t.Cleanup(func() { _ = inner.Close() })
	return &harness{t: t, s: fs, clock: clock, ctx: context.Background()}, fs, inner
}

func TestFaultStoreWithoutFaultsPassesTheStoreSuite(t *testing.T) {
	StoreSuite(t, func(t *testing.T, cfg StoreConfig) runtime.Store {
		return NewFaultStore(NewMemStore(cfg.Clock, cfg.KV), FaultOptions{Seed: 1})
	})
}

func TestFaultStoreKnowsEveryStoreMethod(t *testing.T) {
	st := reflect.TypeFor[runtime.Store]()
	for i := range st.NumMethod() {
		if _, ok := faultMethods[st.Method(i).Name]; !ok {
			t.Errorf("runtime.Store.%s is missing from faultMethods", st.Method(i).Name)
		}
	}
	if len(faultMethods) != st.NumMethod() {
		t.Errorf("faultMethods names %d methods, runtime.Store has %d", len(faultMethods), st.NumMethod())
	}
}

// faultLog makes calls calls through a FaultStore, the i-th (from 0) to
// method(i) ("KVGet", "KVSet" or "LoadRun"; "off" and "on" call
// SetEnabled instead), and returns its log.
func faultLog(t *testing.T, opts FaultOptions, calls int, method func(i int) string) []InjectedFault {
	t.Helper()
	fs := NewFaultStore(NewMemStore(nil, KVLimits{}), opts)
	ctx := context.Background()
	for i := range calls {
		var err error
		switch m := method(i); m {
		case "KVGet":
			_, err = fs.KVGet(ctx, "t", "p", []byte("k"))
		case "KVSet":
			err = fs.KVSet(ctx, "t", "p", []byte("k"), []byte("v"))
		case "LoadRun":
			_, err = fs.LoadRun(ctx, "t", "r")
			if errors.Is(err, runtime.ErrRunNotFound) {
				err = nil
			}
		case "off", "on":
			fs.SetEnabled(m == "on")
			_, err = fs.KVGet(ctx, "t", "p", []byte("k"))
		}
		if err != nil && !errors.Is(err, ErrInjected) {
			t.Fatalf("call %d: an error that was not injected: %v", i, err)
		}
	}
	log := fs.Injected()
	for i := range log {
		log[i].Method = "" // compared across methods below
	}
	return log
}

func TestFaultStoreSameSeedSameDecisions(t *testing.T) {
	opts := FaultOptions{Seed: 42, Rate: 0.3, Kinds: []FaultKind{FaultError, FaultTimeout}}
	always := func(m string) func(int) string { return func(int) string { return m } }
	a := faultLog(t, opts, 300, always("KVGet"))
	if len(a) < 50 || len(a) > 130 {
		t.Fatalf("%d faults in 300 calls at rate 0.3", len(a))
	}
	if b := faultLog(t, opts, 300, always("KVGet")); !reflect.DeepEqual(a, b) {
		t.Fatalf("the same seed gave different faults:\n%v\n%v", a, b)
	}
	// The decision depends on (Seed, n) only: not on the method called,
	if b := faultLog(t, opts, 300, always("LoadRun")); !reflect.DeepEqual(a, b) {
		t.Fatalf("another method under the same seed gave different faults:\n%v\n%v", a, b)
	}
	// nor on calls before it that could not fault,
	only := func(keep func(n uint64) bool) []InjectedFault {
		out := []InjectedFault{}
		for _, f := range a {
			if keep(f.Call) {
				out = append(out, f)
			}
		}
		return out
	}
	kvOpts := opts
	kvOpts.Methods = []string{"KVGet"}
	b := faultLog(t, kvOpts, 300, func(i int) string { return [2]string{"KVGet", "KVSet"}[i%2] })
	if want := only(func(n uint64) bool { return n%2 == 1 }); !reflect.DeepEqual(b, want) {
		t.Fatalf("with every other call not eligible:\n%v\nwant\n%v", b, want)
	}
	// nor on whether faults were off for a while.
	b = faultLog(t, opts, 300, func(i int) string {
		switch i {
		case 100:
			return "off"
		case 200:
			return "on"
		}
		return "KVGet"
	})
	if want := only(func(n uint64) bool { return n <= 100 || n > 200 }); !reflect.DeepEqual(b, want) {
		t.Fatalf("with faults off for calls 101..200:\n%v\nwant\n%v", b, want)
	}
	opts.Seed = 43
	if c := faultLog(t, opts, 300, always("KVGet")); reflect.DeepEqual(a, c) {
		t.Fatal("seeds 42 and 43 gave the same faults")
	}
}

func TestFaultStoreLostReplyWritesButFailsAndTheRetryIsADuplicate(t *testing.T) {
	h, fs, inner := newFaultHarness(t, FaultOptions{})
	r := h.create("t", "s", "r", "")
	c := h.step(r, 0, "start-1", started())
	fs.FailNext("Commit", FaultLostReply, 1)
	_, err := fs.Commit(h.ctx, c)
	if !errors.Is(err, ErrInjected) || !errors.Is(err, runtime.ErrStoreUnavailable) {
		t.Fatalf("a commit whose reply was lost: %v; want ErrInjected and ErrStoreUnavailable", err)
	}
	if got, err := inner.LoadRun(h.ctx, "t", "r"); err != nil || got.Seq != c.Run.Seq || got.Status != loop.StatusRunning {
		t.Fatalf("the inner store after a lost reply: Seq %d %s, %v; want the commit written (Seq %d)", got.Seq, got.Status, err, c.Run.Seq)
	}
	res, err := fs.Commit(h.ctx, c)
	if err != nil || !res.Duplicate || res.Seq != c.Run.Seq {
		t.Fatalf("the retried commit = %+v, %v; want Duplicate at Seq %d", res, err, c.Run.Seq)
	}
	if got := fs.Injected(); len(got) != 1 || got[0] != (InjectedFault{Call: 2, Method: "Commit", Kind: FaultLostReply}) {
		t.Fatalf("Injected = %+v", got)
	}
	// On a read, a lost reply is an error: nothing to lose.
	fs.FailNext("LoadRun", FaultLostReply, 1)
	_, err = fs.LoadRun(h.ctx, "t", "r")
	h.wantErr(err, ErrInjected, "LoadRun with a lost reply")
	if got := fs.Counts(); got[FaultLostReply] != 1 || got[FaultError] != 1 {
		t.Fatalf("Counts = %v; want one lost reply (Commit) and one error (LoadRun)", got)
	}
}

func TestFaultStoreErrorAndTimeoutWriteNothing(t *testing.T) {
	h, fs, inner := newFaultHarness(t, FaultOptions{})
	fs.FailNext("KVSet", FaultTimeout, 1)
	err := fs.KVSet(h.ctx, "t", "p", []byte("k"), []byte("v1"))
	if !errors.Is(err, ErrInjected) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an injected timeout: %v; want ErrInjected and DeadlineExceeded", err)
	}
	fs.FailNext("CreateRun", FaultError, 1)
	_, err = fs.CreateRun(h.ctx, h.createReq("t", "s", "r", "create-1"))
	if !errors.Is(err, ErrInjected) || !errors.Is(err, runtime.ErrStoreUnavailable) {
		t.Fatalf("an injected error: %v; want ErrInjected and ErrStoreUnavailable", err)
	}
	if v, err := inner.KVGet(h.ctx, "t", "p", []byte("k")); err != nil || v != nil {
		t.Fatalf("a timed-out KVSet wrote: %q, %v", v, err)
	}
	_, err = inner.LoadRun(h.ctx, "t", "r")
	h.wantErr(err, runtime.ErrRunNotFound, "the Run of a failed CreateRun")
}

func TestFaultStoreFailNextHitsExactlyN(t *testing.T) {
	h, fs, _ := newFaultHarness(t, FaultOptions{})
	fs.FailNext("KVGet", FaultError, 3)
	var got []bool
	for i := range 5 {
		_, err := fs.KVGet(h.ctx, "t", "p", []byte("k"))
		got = append(got, err != nil)
		// Other methods neither fail nor use up the count.
		if err := fs.KVSet(h.ctx, "t", "p", []byte("k"), []byte{byte('a' + i)}); err != nil {
			t.Fatalf("KVSet %d: %v", i, err)
		}
	}
	if fmt.Sprint(got) != "[true true true false false]" {
		t.Fatalf("KVGet failures = %v; want the first 3", got)
	}
	// A new FailNext replaces the count; 0 cancels it.
	fs.FailNext("KVGet", FaultTimeout, 5)
	fs.FailNext("KVGet", FaultTimeout, 0)
	if _, err := fs.KVGet(h.ctx, "t", "p", []byte("k")); err != nil {
		t.Fatalf("KVGet after FailNext 0: %v", err)
	}
	want := []InjectedFault{{1, "KVGet", FaultError}, {3, "KVGet", FaultError}, {5, "KVGet", FaultError}}
	if got := fs.Injected(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Injected = %v, want %v", got, want)
	}
}

func TestFaultStoreSetEnabledFalseStopsRandomFaults(t *testing.T) {
	h, fs, _ := newFaultHarness(t, FaultOptions{Seed: 7, Rate: 1})
	failures := func() int {
		n := 0
		for range 20 {
			if _, err := fs.KVGet(h.ctx, "t", "p", []byte("k")); err != nil {
				n++
			}
		}
		return n
	}
	if n := failures(); n != 20 {
		t.Fatalf("%d of 20 calls failed at rate 1", n)
	}
	fs.SetEnabled(false)
	if n := failures(); n != 0 {
		t.Fatalf("%d of 20 calls failed with faults disabled", n)
	}
	// FailNext is obeyed even when random faults are off.
	fs.FailNext("KVGet", FaultError, 1)
	if n := failures(); n != 1 {
		t.Fatalf("%d calls failed with one FailNext and faults disabled", n)
	}
	fs.SetEnabled(true)
	if n := failures(); n != 20 {
		t.Fatalf("%d of 20 calls failed once enabled again", n)
	}
	// Close gets no random fault unless Methods names it.
	if err := fs.Close(); err != nil {
		t.Fatalf("Close at rate 1: %v", err)
	}
}

func TestFaultStoreMethodsAndKindsLimitRandomFaults(t *testing.T) {
	h, fs, _ := newFaultHarness(t, FaultOptions{Seed: 3, Rate: 1, Methods: []string{"Commit"}, Kinds: []FaultKind{FaultLostReply}})
	h.register("n", time.Hour) // RegisterNode, CreateRun and ClaimSession are not in Methods
	e := h.claim("t", "s", "n")
	r := h.create("t", "s", "r", "")
	for range 3 {
		_, err := fs.Commit(h.ctx, h.step(r, e, "start", started()))
		h.wantErr(err, ErrInjected, "a Commit at rate 1")
	}
	if got := fs.Counts(); got[FaultLostReply] != 3 || len(got) != 1 {
		t.Fatalf("Counts = %v; want 3 lost replies only", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("FailNext of a method runtime.Store does not have did not panic")
		}
	}()
	fs.FailNext("Comit", FaultError, 1)
}

func TestFaultStoreFailWhenPicksCallsByArguments(t *testing.T) {
	h, fs, inner := newFaultHarness(t, FaultOptions{})
	fs.FailWhen(func(method string, args any) (FaultKind, bool) {
		c, ok := args.(runtime.Commit)
		return FaultLostReply, ok && strings.HasPrefix(c.CommandID, "settle/")
	})
	r := h.create("t", "s", "r", "")
	r = h.toExecuting(r, 0) // commits without a command ID go through
	eff := loop.ModelEffectID("r", 1)
	settle := h.step(r, 0, loop.SettleCommandID(eff, 1), answered(eff, 1, "4"))
	_, err := fs.Commit(h.ctx, settle)
	h.wantErr(err, ErrInjected, "a settlement under FailWhen")
	if got, _ := inner.LoadRun(h.ctx, "t", "r"); got.Seq != settle.Run.Seq {
		t.Fatalf("the lost settlement was not written: Seq %d, want %d", got.Seq, settle.Run.Seq)
	}
	// Session-scoped calls get a FaultArgs.
	fs.FailWhen(func(method string, args any) (FaultKind, bool) {
		a, ok := args.(FaultArgs)
		return FaultTimeout, ok && method == "ActiveRuns" && a.Tenant == "t" && a.Session == "s"
	})
	_, err = fs.ActiveRuns(h.ctx, "t", "s")
	h.wantErr(err, context.DeadlineExceeded, "ActiveRuns of t/s under FailWhen")
	if _, err := fs.ActiveRuns(h.ctx, "t", "other"); err != nil {
		t.Fatalf("ActiveRuns of t/other: %v", err)
	}
	fs.FailWhen(nil)
	if _, err := fs.ActiveRuns(h.ctx, "t", "s"); err != nil {
		t.Fatalf("ActiveRuns after FailWhen(nil): %v", err)
	}
}
