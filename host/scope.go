package host

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// callScope is what one plugin call may touch: it reaches the host
// functions through the call's context, so an instance never learns (or
// keeps) a tenant of its own.
type callScope struct {
	plugin   *Plugin
	export   string
	tenant   string // "" during describe: no KV then
	session  string
	runID    string
	effectID string
	kind     abi.EffectKind // the effect's kind; "" outside an effect call
	attempt  int            // the effect's attempt

	// input is the call's input, which agenthost_input_read copies from;
	// (*Plugin).run sets it.
	input []byte

	// deltas counts the model_delta emits of the call: each one's seq.
	deltas atomic.Int64

	mu     sync.Mutex
	denied string               // the first refusal the sandbox made
	abort  *runtime.PluginError // set by a host function that had to end the call

	// streams are the HTTP response bodies the call holds open
	// (httpstream.go), by number; lastStream is the last number given,
	// and streamsClosed says the call has ended and closed them.
	streams       map[int64]*httpStream
	lastStream    int64
	streamsClosed bool
}

type scopeKey struct{}

func withScope(ctx context.Context, s *callScope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

func scopeFrom(ctx context.Context) *callScope {
	s, _ := ctx.Value(scopeKey{}).(*callScope)
	return s
}

// deny records a refusal; the first one explains a failed reply.
func (s *callScope) deny(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.denied == "" {
		s.denied = reason
	}
}

func (s *callScope) deniedReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.denied
}

// abortCall records why a host function ends the call; the host function
// then panics, which unwinds the guest.
func (s *callScope) abortCall(class abi.ErrorClass, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abort == nil {
		s.abort = &runtime.PluginError{Class: class, Plugin: s.plugin.name, Export: s.export, Err: err}
	}
}

func (s *callScope) aborted() *runtime.PluginError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abort
}
