package runtime

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// A Run stored before descriptors were pinned has tool specs without one.
// Its builder is given the Run's own tools, each as the tenant describes it
// now, and never a tool the tenant added since: the Loop would refuse its
// calls.
func TestAnOldRunIsOfferedItsOwnToolsAsTheTenantNowDescribesThem(t *testing.T) {
	schema := json.RawMessage(`{"type":"object"}`)
	tenant := &Tenant{ID: "acme", Tools: []Tool{
		{Descriptor: abi.Tool{Name: "echo", Description: "echo, described today", InputSchema: schema, Idempotent: true, Approval: abi.ApprovalNever},
			Spec: loop.ToolSpec{Name: "echo", Policy: loop.DefaultToolPolicy(true)}},
		{Descriptor: abi.Tool{Name: "calculate", Description: "added since", InputSchema: schema},
			Spec: loop.ToolSpec{Name: "calculate", Policy: loop.DefaultToolPolicy(false)}},
	}}
	old := loop.Run{Spec: loop.Spec{Tenant: "acme", Tools: []loop.ToolSpec{
		{Name: "echo", Policy: loop.DefaultToolPolicy(true), InputSchema: schema},
		// A tool the tenant no longer has: offered as the Run holds it.
		{Name: "wire", Approval: true, Policy: loop.DefaultToolPolicy(false), InputSchema: schema},
	}}}
	want := []abi.Tool{
		tenant.Tools[0].Descriptor,
		{Name: "wire", InputSchema: schema, Approval: abi.ApprovalAlways},
	}
	if got := tenant.toolsOffered(old); !reflect.DeepEqual(got, want) {
		t.Errorf("an old Run is offered %+v, want %+v", got, want)
	}

	// A Run created now pins its descriptors: it is offered them whatever
	// the tenant's tools become.
	fresh := tenant.spec("s1", "r1", "hi", nil)
	pinned := []abi.Tool{tenant.Tools[0].Descriptor, tenant.Tools[1].Descriptor}
	later := &Tenant{ID: "acme"}
	if got := later.toolsOffered(loop.Run{Spec: fresh}); !reflect.DeepEqual(got, pinned) {
		t.Errorf("a new Run is offered %+v, want its pinned %+v", got, pinned)
	}
	if got := later.toolsOffered(loop.Run{}); got == nil || len(got) != 0 {
		t.Errorf("a Run with no tools is offered %#v, want an empty list", got)
	}
}
