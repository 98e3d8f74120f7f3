package schema_test

import (
	"testing"
)

// TestTheBuildInputsAgentIsDescribed: build-input.json takes an input with
// an agent or without one (an older host's), and refuses an agent without
// a name, settings or an output schema that are not an object or
// instructions that are not a string.
func TestTheBuildInputsAgentIsDescribed(t *testing.T) {
	c := compiler(t)
	const head = `{"abi": 1, "run": {"id": "r", "tenant": "t", "session": "s", "step": 1, "input": "hi"}, "history": [], "transcript": [], "tools": []`
	for _, k := range []struct {
		agent string
		valid bool
	}{
		{``, true},
		{`, "agent": {"name": "support", "version": "v-3f9a1c0d2b4e", "instructions": "Be kind.", "settings": {"model": "m", "temperature": 0.2}}`, true},
		{`, "agent": {"name": "default"}`, true},
		{`, "agent": {"name": "support", "output_schema": {"type": "object", "required": ["city"]}}`, true},
		{`, "agent": {"name": "support", "output_schema": "{\"type\": \"object\"}"}`, false},
		{`, "agent": {"version": "v-1"}`, false},
		{`, "agent": {"name": "support", "settings": [1]}`, false},
		{`, "agent": {"name": "support", "instructions": 3}`, false},
		{`, "agent": {"name": "Support"}`, false},
		{`, "agent": "support"`, false},
	} {
		err := validate(t, c, "build-input.json", []byte(head+k.agent+`}`))
		if (err == nil) != k.valid {
			t.Errorf("agent %s: valid=%v, the schema says %v", k.agent, k.valid, err)
		}
	}
}
