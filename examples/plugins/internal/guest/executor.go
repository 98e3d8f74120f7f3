//go:build wasip1

package guest

import (
	"fmt"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Host is the host's functions a model call uses (modelcall.Host): the
// wrappers of this package.
type Host struct{}

var _ modelcall.Host = Host{}

// The methods of Host are the functions of this package of the same
// names.

func (Host) HTTP(req abi.HTTPRequest) abi.HTTPResponse       { return HTTP(req) }
func (Host) HTTPOpen(req abi.HTTPRequest) abi.HTTPStreamHead { return HTTPOpen(req) }
func (Host) HTTPRead(stream int64, max int) []byte           { return HTTPRead(stream, max) }
func (Host) HTTPClose(stream int64) abi.HTTPStreamEnd        { return HTTPClose(stream) }
func (Host) EmitDelta(d abi.ModelDelta)                      { EmitDelta(d) }
func (Host) NowMS() int64                                    { return NowMS() }

// ModelExecutor is a model executor that answers every effect in the
// call that starts it, as the example model executors do: start answers
// done or failed; poll and attach answer unknown, since nothing is ever
// left pending, and cancel answers cancelled. A plugin's exports call its
// methods; Call is what differs from one provider to the next.
type ModelExecutor struct {
	// Name and Version are describe's.
	Name, Version string
	// Call carries out one model request: it reads the config, sends the
	// request and returns the reply. Start has checked the effect's kind
	// and decoded its request.
	Call func(req abi.ModelRequest) abi.EffectReply
}

// Describe answers describe: an executor of model effects, without
// attach.
func (x ModelExecutor) Describe() int32 {
	return Describe(abi.Describe{Name: x.Name, Version: x.Version, Role: abi.RoleExecutor, Effects: []abi.EffectKind{abi.KindModel}, Attach: false})
}

// Start answers start: it fails an effect that is not a model effect, or
// whose request is not a model request, not retriable; else it replies
// what Call answers.
func (x ModelExecutor) Start() int32 {
	in, req, rc, ok := modelEffectInput()
	if !ok {
		return rc
	}
	if in.Effect.Kind != abi.KindModel {
		return Reply(abi.Failed(fmt.Sprintf("%s: effect %s is of kind %q; this plugin carries out model effects only", x.Name, in.Effect.ID, in.Effect.Kind), false))
	}
	if req == nil {
		r, err := ModelRequest(in.Effect)
		if err != nil {
			return Reply(abi.Failed(x.Name+": "+err.Error(), false))
		}
		req = &r
	}
	return Reply(x.Call(*req))
}

// modelStartInput is abi.EffectInput with the effect's request decoded
// as a model request in the same pass, rather than kept as raw JSON to be
// decoded a second time.
type modelStartInput struct {
	ABI    int `json:"abi"`
	Effect struct {
		abi.Effect
		// Request shadows abi.Effect's raw request: nil when absent or
		// null.
		Request *abi.ModelRequest `json:"request"`
	} `json:"effect"`
	Handle string `json:"handle"`
}

// modelEffectInput is EffectInput for a model executor's start, with the
// request decoded in one pass with the rest. When that pass fails, or
// leaves the request nil (absent or null), it decodes as EffectInput
// does and returns a nil request, for ModelRequest to decode or refuse
// with the words it always had: the replies are the same either way. In
// the one pass the effect's raw request is left empty: the request is
// the one returned.
func modelEffectInput() (abi.EffectInput, *abi.ModelRequest, int32, bool) {
	var one modelStartInput
	if err := Input(&one); err == nil && one.Effect.Request != nil && one.Effect.ID != "" && one.Effect.Attempt >= 1 {
		return abi.EffectInput{ABI: one.ABI, Effect: one.Effect.Effect, Handle: one.Handle}, one.Effect.Request, 0, true
	}
	in, rc, ok := EffectInput()
	return in, nil, rc, ok
}

// NoRecord answers poll and attach: nothing is ever left pending, so the
// plugin holds no record of any attempt.
func (ModelExecutor) NoRecord() int32 {
	if _, rc, ok := EffectInput(); !ok {
		return rc
	}
	return Reply(abi.Unknown())
}

// Cancel answers cancel: cancelled, since nothing is left to stop.
func (ModelExecutor) Cancel() int32 {
	if _, rc, ok := EffectInput(); !ok {
		return rc
	}
	return Reply(abi.Cancelled())
}
