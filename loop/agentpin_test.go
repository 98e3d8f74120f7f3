package loop

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestARunKeepsTheAgentItWasCreatedWith: RunCreated's agent pin is the
// Run's, a copy that a change of the event's does not reach, and one
// whose name is not an ID is refused.
func TestARunKeepsTheAgentItWasCreatedWith(t *testing.T) {
	pin := &AgentPin{Name: "support", Version: "v-1", Instructions: "Be kind.", Settings: json.RawMessage(`{"temperature":0.2}`)}
	spec := Spec{Tenant: "acme", Session: "s1", ID: "r1", Input: "hi", Limits: DefaultLimits, ModelPolicy: DefaultModelPolicy, Agent: pin}
	run, err := Apply(Run{}, RunCreated(spec, 1))
	if err != nil {
		t.Fatal(err)
	}
	pin.Name = "research"
	if run.Agent == nil || run.Agent.Name != "support" || run.Agent.Instructions != "Be kind." {
		t.Fatalf("the Run's agent is %+v, want support as created", run.Agent)
	}
	for _, bad := range []string{"", "a b", "x/y"} {
		spec.Agent = &AgentPin{Name: bad}
		if _, err := Apply(Run{}, RunCreated(spec, 1)); !errors.Is(err, ErrInvalidID) {
			t.Errorf("agent name %q: %v, want ErrInvalidID", bad, err)
		}
	}
}
