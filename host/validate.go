package host

// Minimal reply checks of the host, until plugins/abi's Validate functions
// land; then these become calls to them. Each returns nil or what is wrong.

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/agenthost/agenthost/plugins/abi"
)

func validateDescribe(d abi.Describe, role abi.Role, version int) error {
	if d.ABI != version {
		return fmt.Errorf("describe says abi %d, but the host chose %d", d.ABI, version)
	}
	if d.Name == "" {
		return fmt.Errorf("describe has no name")
	}
	if d.Role != role {
		return fmt.Errorf("describe says role %q, but it was loaded as %q", d.Role, role)
	}
	if role == abi.RoleExecutor {
		if len(d.Effects) == 0 {
			return fmt.Errorf("an executor must list the effects it carries out (model, tool)")
		}
		for _, e := range d.Effects {
			if e != abi.KindModel && e != abi.KindTool {
				return fmt.Errorf("effect kind %q is neither model nor tool", e)
			}
		}
	}
	seen := map[string]bool{}
	for _, t := range d.Tools {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("tool name %q is empty or repeated", t.Name)
		}
		seen[t.Name] = true
		if t.Approval != "" && t.Approval != abi.ApprovalNever && t.Approval != abi.ApprovalAlways {
			return fmt.Errorf("tool %q: approval %q is neither never nor always", t.Name, t.Approval)
		}
		if len(t.InputSchema) > 0 && !json.Valid(t.InputSchema) {
			return fmt.Errorf("tool %q: input_schema is not JSON", t.Name)
		}
	}
	return nil
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}

// validateEffectReply checks a start, poll or attach reply.
func validateEffectReply(export string, r abi.EffectReply) error {
	switch r.State {
	case abi.StateDone:
		if !isObject(r.Outcome) {
			return fmt.Errorf("state done needs an outcome object")
		}
	case abi.StatePending:
		if r.PollAfterMS < 0 {
			return fmt.Errorf("poll_after_ms is negative")
		}
	case abi.StateFailed:
		if r.Error == nil || r.Error.Message == "" {
			return fmt.Errorf("state failed needs error.message")
		}
	case abi.StateUnknown:
		if export == abi.ExportStart {
			return fmt.Errorf("start may not answer unknown (only poll and attach may)")
		}
	default:
		return fmt.Errorf("state %q is not one of done, pending, failed, unknown", r.State)
	}
	return nil
}

func validateCancelReply(r abi.CancelReply) error {
	switch r.State {
	case abi.StateCancelled, abi.StateUnknown:
	case abi.StateDone:
		if !isObject(r.Outcome) {
			return fmt.Errorf("state done needs an outcome object")
		}
	default:
		return fmt.Errorf("state %q is not one of cancelled, done, unknown", r.State)
	}
	return nil
}

func validateBuildOutput(o abi.BuildOutput) error {
	if len(o.Request.Messages) == 0 {
		return fmt.Errorf("request.messages is empty")
	}
	for i, m := range o.Request.Messages {
		switch m.Role {
		case abi.MessageSystem, abi.MessageUser, abi.MessageAssistant, abi.MessageTool:
		default:
			return fmt.Errorf("request.messages[%d].role %q is not system, user, assistant or tool", i, m.Role)
		}
	}
	return nil
}
