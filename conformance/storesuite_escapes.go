package conformance

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite case here holds the stores to keeping a tenant's text in
// their JSON as it is: encoding/json escapes <, > and & as six bytes each
// (\u003c), which would make text full of them (code, HTML: what tools
// take and return) cost up to six times its length in every stored JSON
// copy, and in the tenant's storage quota.

// testJSONEscapesAreNotStoredSixTimesOver runs the same Run for two
// tenants whose IDs are as long, one with 10,000 bytes of "<a&b>" text
// and one with as many bytes of plain text, in its input (the
// run_created event), in its model step's request (raw JSON, as a
// builder writes it) and in the model's answer (the settlement): the two
// tenants' stored bytes are the same, and the text reads back as it was
// written.
func testJSONEscapesAreNotStoredSixTimesOver(t *testing.T, h *harness) {
	const size = 10_000
	texts := map[string]string{
		"esc": strings.Repeat("<a&b>", size/5),
		"pln": strings.Repeat("xaxbx", size/5),
	}
	for tenant, text := range texts {
		spec := testSpec(tenant, "s", "r")
		spec.Input = text
		created := loop.RunCreated(spec, h.nowMS())
		r, err := loop.Apply(loop.Run{}, created)
		if err != nil {
			t.Fatalf("apply run_created: %v", err)
		}
		created.Seq = 1
		res, err := h.s.CreateRun(h.ctx, runtime.CreateRun{Run: r, Event: created})
		if err != nil {
			t.Fatalf("CreateRun for tenant %s: %v", tenant, err)
		}
		r = res.Run
		// The builder's request holds the text unescaped, as
		// runcodec.MarshalJSON writes it (the runtime's build does).
		request := json.RawMessage(`{"model":"test","messages":[{"role":"user","content":"` + text + `"}]}`)
		if !json.Valid(request) {
			t.Fatalf("the request for tenant %s is not JSON: %.80s", tenant, request)
		}
		r = h.commit(r, 0, "", started(), loop.Event{Type: loop.EventModelStepPlanned, Step: 1, Request: request})
		r = h.commit(r, 0, "", dispatched(loop.ModelEffectID(r.ID, r.Step), 1, 0))
		r = h.commit(r, 0, "", answered(loop.ModelEffectID(r.ID, r.Step), 1, text))
		h.commit(r, 0, "", completed())

		// What was stored reads back as it was written.
		evs := h.events(tenant, "r", 0, 0)
		if len(evs) != 6 {
			t.Fatalf("tenant %s: %d events read back, want 6", tenant, len(evs))
		}
		if evs[0].Spec == nil || evs[0].Spec.Input != text {
			t.Fatalf("tenant %s: the run_created event read back does not hold the input as it was written", tenant)
		}
		var req struct {
			Messages []struct{ Content string }
		}
		if err := json.Unmarshal(evs[2].Request, &req); err != nil || len(req.Messages) != 1 || req.Messages[0].Content != text {
			t.Fatalf("tenant %s: the model step's request read back is not the one written (%v): %.80s", tenant, err, evs[2].Request)
		}
		if o := evs[4].Outcome; o == nil || o.Model == nil || o.Model.Message.Content != text {
			t.Fatalf("tenant %s: the settlement read back does not hold the answer as it was written", tenant)
		}
		// Every store counts the events as runcodec.MarshalJSON writes
		// them, escapes or none.
		h.wantStored(tenant, h.held(tenant, "r"), "after a Run holding the text three times")
	}
	escaped, plain := h.stored("esc"), h.stored("pln")
	if escaped != plain {
		t.Fatalf("a Run holding %d bytes of <a&b> text three times stores %d bytes, one holding as many bytes of plain text %d: "+
			"%.2f times as much (the store's JSON escapes HTML characters)", size, escaped, plain, float64(escaped)/float64(plain))
	}
}
