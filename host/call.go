package host

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tetratelabs/wazero/sys"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// errCallTimeout is the cause of a call's own timeout, which tells it
// apart from the caller's context ending.
var errCallTimeout = errors.New("call timeout")

// pluginErr builds the classified error of a call.
func (p *Plugin) pluginErr(export string, class abi.ErrorClass, err error) *runtime.PluginError {
	return &runtime.PluginError{Class: class, Plugin: p.name, Export: export, Err: err}
}

// call runs one export on an instance of the scope's tenant and returns
// its raw output. Every failure that is the plugin's is a
// *runtime.PluginError; the instance that failed is closed, never reused.
// Errors that are not the plugin's (the caller's context ended, the plugin
// is closed, the memory cap) say so and wrap their cause.
//
// These errors are for the server's log: a tenant reads a failure in the
// runtime's words, which keep of the error only its class and the plugin's
// own words (a *runtime.PluginMessage in the chain).
func (p *Plugin) call(ctx context.Context, s *callScope, input []byte) ([]byte, error) {
	ctx, span := startCallSpan(ctx, s)
	out, err := p.callTraced(ctx, s, input)
	runtime.EndSpan(span, err)
	return out, err
}

// callTraced is call, inside the call's span.
func (p *Plugin) callTraced(ctx context.Context, s *callScope, input []byte) ([]byte, error) {
	export := s.export
	if len(input) > p.spec.Limits.MaxInputBytes {
		return nil, p.pluginErr(export, abi.ClassLimitExceeded, fmt.Errorf(
			"the input is %d bytes, over the plugin's max_input_bytes of %d: shorten the history or raise the limit",
			len(input), p.spec.Limits.MaxInputBytes))
	}
	pl, err := p.pool(s.tenant)
	if err != nil {
		return nil, fmt.Errorf("host: plugin[%s] export[%s]: %w", p.name, export, err)
	}
	in, err := pl.acquire(ctx, export)
	if err != nil {
		var pe *runtime.PluginError
		if errors.As(err, &pe) {
			return nil, pe // the new instance's initialisation failed: the plugin's fault
		}
		return nil, fmt.Errorf("host: plugin[%s] export[%s]: no instance: %w", p.name, export, err)
	}
	// The runtime's call timeout, when it hands one over, runs from here:
	// the wait for the instance does not count against it.
	ctx, cancel := runtime.BeginCall(ctx)
	defer cancel()
	out, keep, err := p.run(ctx, in, s, input)
	pl.release(context.WithoutCancel(ctx), in, keep)
	return out, err
}

// run calls the export on in and classifies the result; keep says whether
// the instance may serve again.
func (p *Plugin) run(ctx context.Context, in *instance, s *callScope, input []byte) (out []byte, keep bool, err error) {
	export := s.export
	s.input = input
	in.scope.Store(s)
	defer in.scope.Store(nil)
	// The call's end, on either call path, closes the HTTP streams it
	// left open (httpstream.go): no connection outlives its call.
	defer s.closeStreams()
	in.mem.refused.Store(false)
	in.stderr.take()

	res := in.g.call(ctx, s, export, input, p.spec.Limits.CallTimeout)
	rc, out, callErr := res.rc, res.out, res.err
	if res.spent {
		defer func() { keep = false }()
	}

	// 1. A host function ended the call (a store outage in kv_get).
	if ab := s.aborted(); ab != nil {
		return nil, false, ab
	}
	// 2. The call did not finish: a timeout, the caller, an exit, a trap.
	// Checked before rc (docs/DESIGN.md §10): go-sdk fills err whatever rc is.
	if callErr != nil {
		var exit *sys.ExitError
		if errors.As(callErr, &exit) {
			switch exit.ExitCode() {
			case sys.ExitCodeDeadlineExceeded, sys.ExitCodeContextCanceled:
				if res.timedOut || ctx.Err() == nil {
					return nil, false, p.pluginErr(export, abi.ClassPluginTimeout, fmt.Errorf(
						"the call ran past its timeout of %s and was stopped; the instance is discarded: raise call_timeout if the work is legitimate", p.spec.Limits.CallTimeout))
				}
				return nil, false, fmt.Errorf("host: plugin[%s] export[%s]: the caller gave up, the outcome is unknown: %w", p.name, export, ctx.Err())
			}
			if in.mem.refused.Load() {
				return nil, false, p.oomErr(export, in, callErr)
			}
			return nil, false, p.pluginErr(export, abi.ClassPluginTrap, fmt.Errorf("the plugin exited with code %d%s", exit.ExitCode(), stderrNote(in)))
		}
		if msg := in.g.errorMessage(ctx); msg != "" && msg == callErr.Error() {
			// The plugin reported an error with error_set: its own words,
			// which the failure a tenant reads keeps.
			if rc != 0 {
				return nil, true, p.pluginErr(export, abi.ClassPluginProtocol, fmt.Errorf("the plugin returned status %d: %w", rc, &runtime.PluginMessage{Text: msg}))
			}
		} else {
			if in.mem.refused.Load() {
				return nil, false, p.oomErr(export, in, callErr)
			}
			return nil, false, p.pluginErr(export, abi.ClassPluginTrap, fmt.Errorf("%s%s", firstLine(callErr.Error()), stderrNote(in)))
		}
	}
	if rc != 0 {
		return nil, true, p.pluginErr(export, abi.ClassPluginProtocol, fmt.Errorf(
			"the plugin returned status %d with no error message (0 is ok; call error_set to say why)", rc))
	}
	if len(out) > p.spec.Limits.MaxOutputBytes {
		return nil, false, p.pluginErr(export, abi.ClassPluginOutputTooBig, fmt.Errorf(
			"the output is %d bytes, over max_output_bytes of %d; the instance is discarded", len(out), p.spec.Limits.MaxOutputBytes))
	}
	return out, true, nil
}

func (p *Plugin) oomErr(export string, in *instance, cause error) *runtime.PluginError {
	return p.pluginErr(export, abi.ClassPluginOOM, fmt.Errorf(
		"the plugin ran out of memory (a memory.grow past its cap of %d pages, or past the host-wide cap, was refused) and then failed: %s%s; the instance is discarded: raise memory_pages if the plugin needs more",
		p.spec.Limits.MemoryPages, firstLine(cause.Error()), stderrNote(in)))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// stderrNote is the start of what the guest printed to stderr, if
// anything (a Go plugin prints its panic there).
func stderrNote(in *instance) string {
	s := strings.TrimSpace(in.stderr.take())
	if s == "" {
		return ""
	}
	if i := strings.Index(s, "\n\ngoroutine "); i >= 0 {
		s = s[:i]
	}
	return " (stderr: " + strings.ReplaceAll(s, "\n", " | ") + ")"
}
