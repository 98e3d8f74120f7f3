package badgerstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// TestActiveSessionsMatchesMemStore checks the merge of ActiveSessions
// (lexWalk over the length-prefixed 'l' index) against MemStore's sort, on
// random IDs of every length from a small alphabet, from random cursors
// and with random limits.
func TestActiveSessionsMatchesMemStore(t *testing.T) {
	ctx := context.Background()
	bs := openT(t, t.TempDir(), Options{Logger: quietLogger()})
	ms := conformance.NewMemStore(nil, conformance.KVLimits{})
	rng := rand.New(rand.NewPCG(7, 7))
	id := func() string {
		const alphabet = "-0ABab_z"
		b := make([]byte, 1+rng.IntN(6))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	var tenants []string
	for range 12 {
		tenants = append(tenants, id())
	}
	for i := range 300 {
		spec := loop.Spec{Tenant: tenants[rng.IntN(len(tenants))], Session: id(), ID: fmt.Sprintf("r%d", i),
			Input: "x", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
		ev := loop.RunCreated(spec, 1)
		r, err := loop.Apply(loop.Run{}, ev)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = 1
		cancel := i%4 == 0 // a quarter of the Runs end at once
		var c runtime.Commit
		if cancel {
			c = runtime.Commit{Tenant: spec.Tenant, Session: spec.Session, RunID: spec.ID, ExpectedSeq: 1, Run: r}
			for _, e := range []loop.Event{{Type: loop.EventCancelRequested, Reason: "test"}, {Type: loop.EventRunCancelled}} {
				if c.Run, err = loop.Apply(c.Run, e); err != nil {
					t.Fatal(err)
				}
				e.Seq = c.Run.Seq
				c.Events = append(c.Events, e)
			}
		}
		for _, s := range []runtime.Store{bs, ms} {
			if _, err := s.CreateRun(ctx, runtime.CreateRun{Run: r, Event: ev}); err != nil {
				t.Fatal(err)
			}
			if cancel {
				if _, err := s.Commit(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for i := range 400 {
		tenant, session, limit := "", "", rng.IntN(12)-1
		switch i % 4 {
		case 1:
			tenant = id()
		case 2, 3:
			tenant, session = tenants[rng.IntN(len(tenants))], id()
		}
		want, err := ms.ActiveSessions(ctx, tenant, session, limit)
		if err != nil {
			t.Fatal(err)
		}
		got, err := bs.ActiveSessions(ctx, tenant, session, limit)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("ActiveSessions(%q, %q, %d):\nbadger %v\nmemory %v", tenant, session, limit, got, want)
		}
	}
}
