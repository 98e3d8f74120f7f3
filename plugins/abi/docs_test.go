package abi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/abidoc"
)

// docExample is one JSON block of docs/ABI.md, marked for checking by a
// "<!-- check: what [args] -->" line right before its fence.
type docExample = abidoc.Example

func docExamples(t *testing.T) []docExample {
	t.Helper()
	out, err := abidoc.Read("../../docs/ABI.md")
	if err != nil {
		t.Fatalf("docs/ABI.md is the contract this package implements: %v", err)
	}
	return out
}

// strict decodes data into v, refusing fields the Go types do not have,
// so that a misspelt field in the docs fails here.
func strict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func TestABIDocExamplesAreValid(t *testing.T) {
	examples := docExamples(t)
	if len(examples) < 20 {
		t.Fatalf("found %d checked examples in docs/ABI.md; the markers were lost", len(examples))
	}
	for _, ex := range examples {
		ex := ex
		t.Run(strings.Join(ex.What, "_")+"@"+itoa(ex.Line), func(t *testing.T) {
			if err := checkDocExample(ex); err != nil {
				t.Fatalf("docs/ABI.md:%d: %v\n%s", ex.Line, err, ex.JSON)
			}
		})
	}
}

func checkDocExample(ex docExample) error {
	arg := func(i int) string {
		if i < len(ex.What) {
			return ex.What[i]
		}
		return ""
	}
	data := ex.JSON
	switch arg(0) {
	case "describe":
		var d Describe
		if err := strict(data, &d); err != nil {
			return err
		}
		_, err := DecodeDescribe(data, Role(arg(1)))
		return err
	case "build-input":
		var in BuildInput
		if err := strict(data, &in); err != nil {
			return err
		}
		if in.ABI != Version {
			return fmt.Errorf("abi is %d", in.ABI)
		}
		// The transcript and tools follow the same rules as a request.
		return ValidateBuildOutput(BuildOutput{Request: ModelRequest{Messages: in.Transcript, Tools: in.Tools}})
	case "build-output":
		var o BuildOutput
		if err := strict(data, &o); err != nil {
			return err
		}
		_, err := DecodeBuildOutput(data)
		return err
	case "effect-input":
		var in EffectInput
		if err := strict(data, &in); err != nil {
			return err
		}
		return checkEffectInput(in)
	case "effect-reply":
		var r EffectReply
		if err := strict(data, &r); err != nil {
			return err
		}
		_, err := DecodeEffectReply(data, EffectKind(arg(1)), arg(2))
		return err
	case "model-outcome":
		var m ModelOutcome
		if err := strict(data, &m); err != nil {
			return err
		}
		_, err := DecodeModelOutcome(data)
		return err
	case "tool-outcome":
		var o ToolOutcome
		if err := strict(data, &o); err != nil {
			return err
		}
		_, err := DecodeToolOutcome(data)
		return err
	case "describe-input":
		var in DescribeInput
		if err := strict(data, &in); err != nil {
			return err
		}
		if in.ABI != Version {
			return fmt.Errorf("abi is %d", in.ABI)
		}
		return nil
	case "cancel-reply":
		var r CancelReply
		if err := strict(data, &r); err != nil {
			return err
		}
		_, err := DecodeCancelReply(data, EffectKind(arg(1)))
		return err
	case "emit":
		var e EmitEvent
		return strict(data, &e)
	case "http-request":
		var r HTTPRequest
		return strict(data, &r)
	case "http-response":
		var r HTTPResponse
		return strict(data, &r)
	case "http-stream-head":
		var h HTTPStreamHead
		if err := strict(data, &h); err != nil {
			return err
		}
		if (h.Error == nil) == (h.Stream == 0) {
			return fmt.Errorf("a head has a stream (status %d) or an error (status 0), not both or neither", h.Status)
		}
		return nil
	case "http-stream-end":
		var e HTTPStreamEnd
		return strict(data, &e)
	default:
		return fmt.Errorf("unknown check %q", arg(0))
	}
}

// checkEffectInput checks an effect input the way the host builds one.
func checkEffectInput(in EffectInput) error {
	e := in.Effect
	switch {
	case in.ABI != Version:
		return fmt.Errorf("abi is %d", in.ABI)
	case e.Attempt < 1:
		return fmt.Errorf("attempt is %d", e.Attempt)
	case !strings.HasSuffix(e.AssignmentKey, "/"+e.ID+"#"+itoa(e.Attempt)) || strings.Count(e.AssignmentKey, "/") != 2:
		return fmt.Errorf("assignment_key %q is not <tenant>/<session>/%s#%d", e.AssignmentKey, e.ID, e.Attempt)
	}
	switch e.Kind {
	case KindModel:
		if e.Tool != "" || !strings.Contains(e.ID, ".m") {
			return fmt.Errorf("a model effect has an ID <run>.m<step> and no tool")
		}
		req, err := e.ModelRequest()
		if err != nil {
			return err
		}
		return ValidateBuildOutput(BuildOutput{Request: req})
	case KindTool:
		if !ValidToolName(e.Tool) || !strings.Contains(e.ID, ".t") {
			return fmt.Errorf("a tool effect has an ID <run>.t<step>.<i> and a tool name")
		}
		var args map[string]any
		return e.ToolArguments(&args)
	default:
		return fmt.Errorf("kind %q", e.Kind)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
