package runtime

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// What a tenant reads of a failure, and what the server's log keeps.
//
// A failure the runtime records (the failure of a step_failed event, the
// error of an effect's failed settlement, and so the Run's failure the
// Loop derives from them) is what every reader shows a tenant: the Run's
// snapshot, its event stream, `agenthost runs`. It carries the error class
// and a message in the runtime's own words, which name what failed (the
// builder, the model executor, the executor of a tool) and how (the
// class, said in words), and nothing of the host's wrapping (plugin and
// export names), of the store's or the network's errors, nor any path or
// address. The Loop frames it with the step, the tool and the attempts
// ("model step 2 failed after 3 attempt(s) (plugin_trap): …"), and each
// settlement in the events carries its attempt number.
//
// The one text from outside the runtime a failure keeps is a plugin's own
// words about its work: the error.message of a failed reply, and the
// message a plugin gave with error_set or after a sandbox refusal
// (PluginMessage), cut to MaxPluginMessageBytes. Everything else behind a
// failure goes to the server's log, in one line written where the failure
// is decided, with the tenant, the Run and the assignment key (or the
// step, for planning), so that an operator can go from what a tenant
// reports to the cause.

// MaxPluginMessageBytes bounds the plugin's own words that a failure
// carries; longer ones are cut, and the server's log keeps them whole.
const MaxPluginMessageBytes = 1024

// Errors of planning a model step that are not the builder's own.
var (
	errNoBuilder     = errors.New("runtime: the tenant has no builder configured")
	errHistoryUnread = errors.New("runtime: reading the session's history failed")
	errAgentGone     = errors.New("runtime: the Run's agent is no longer configured")
)

// builderSubject names the builder in failure messages.
const builderSubject = "the builder"

// effectSubject names the executor of e in failure messages, in the
// tenant's terms.
func effectSubject(e loop.Effect) string {
	if e.Kind == abi.KindTool {
		return fmt.Sprintf("the executor of tool %q", e.Tool)
	}
	return "the model executor"
}

// effectTarget names what e carries out, in the tenant's terms.
func effectTarget(e loop.Effect) string {
	if e.Kind == abi.KindTool {
		return fmt.Sprintf("tool %q", e.Tool)
	}
	return "the model"
}

// pluginText is a plugin's own words as a failure carries them: valid
// UTF-8, trimmed, at most MaxPluginMessageBytes, ending in "…" when cut.
func pluginText(s string) string {
	s = strings.TrimSpace(strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= MaxPluginMessageBytes {
		return s
	}
	cut := MaxPluginMessageBytes - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// callFailure is the failure a tenant reads for a plugin call of who that
// failed with err: the class of err's PluginError (executor_unavailable
// for any other error: the plugin could not be called), a message in the
// runtime's words, and the plugin's own words where err carries them
// (PluginMessage). Its retriable flag is the class's default.
func callFailure(who string, err error) *loop.Failure {
	class := abi.ClassExecutorUnavailable
	var pe *PluginError
	if errors.As(err, &pe) && pe.Class.Valid() {
		class = pe.Class
	}
	said := ""
	var pm *PluginMessage
	if errors.As(err, &pm) {
		said = pluginText(pm.Text)
	}
	return &loop.Failure{Class: class, Message: classMessage(who, class, said), Retriable: class.Retriable()}
}

// classMessage says in words what a failure of class means for who, with
// the plugin's own words (said) where it gave some.
func classMessage(who string, class abi.ErrorClass, said string) string {
	var msg string
	switch class {
	case abi.ClassPluginTrap:
		msg = who + " crashed"
	case abi.ClassPluginTimeout:
		msg = who + " did not answer within its call timeout"
	case abi.ClassPluginOOM:
		msg = who + " ran out of memory"
	case abi.ClassPluginOutputTooBig:
		msg = "the output of " + who + " was over its size limit"
	case abi.ClassPluginProtocol:
		if said != "" {
			return who + " returned an error: " + said
		}
		msg = "the reply of " + who + " broke the plugin ABI"
	case abi.ClassPluginDenied:
		if said != "" {
			return "the sandbox refused a request of " + who + ", which then failed: " + said
		}
		msg = "the sandbox refused a request of " + who
	case abi.ClassLost:
		msg = who + " holds no record of the attempt"
	case abi.ClassCancelled:
		msg = who + " cancelled the call"
	case abi.ClassExecutorUnavailable:
		msg = who + " could not be called"
	case abi.ClassLimitExceeded:
		msg = "the input to " + who + " was over the plugin's input limit"
	default:
		msg = who + " failed"
	}
	if said != "" {
		msg += ": " + said
	}
	return msg
}

// planFailure is the failure a tenant reads for a model step whose
// planning failed with err (from build).
func planFailure(err error) *loop.Failure {
	switch {
	case errors.Is(err, errNoBuilder):
		return &loop.Failure{Class: abi.ClassExecutorUnavailable, Message: "the tenant has no builder configured", Retriable: true}
	case errors.Is(err, errAgentGone):
		return &loop.Failure{Class: abi.ClassExecutorUnavailable, Message: "the Run's agent is no longer configured for the tenant", Retriable: true}
	case errors.Is(err, errHistoryUnread):
		return &loop.Failure{Class: abi.ClassExecutorUnavailable, Message: "the session's earlier Runs could not be read for " + builderSubject, Retriable: true}
	}
	return callFailure(builderSubject, err)
}

// logPlanFailure writes to the server's log the detail behind the failure
// of planning step of run: the tenant's message f, and the whole error.
func (rt *Runtime) logPlanFailure(run loop.Run, step int, f *loop.Failure, err error) {
	rt.log.Warn("planning a model step failed; the Run fails", "tenant", run.Tenant, "session", run.Session, "run", run.ID,
		"effect", loop.ModelEffectID(run.ID, step), "class", f.Class, "message", f.Message, "err", err)
}

// logEffectFailure writes to the server's log the detail behind the
// failure f an attempt of run (key, its assignment key) settles with: the
// tenant's message, and the whole error.
func (rt *Runtime) logEffectFailure(run loop.Run, key string, f *loop.Failure, detail error) {
	level := slog.LevelWarn
	if f.Class == abi.ClassPluginFailed || f.Class == abi.ClassRateLimited {
		level = slog.LevelInfo // the plugin's own verdict on its work
	}
	rt.log.Log(rt.life, level, "an effect attempt failed", "tenant", run.Tenant, "run", run.ID, "assignment_key", key,
		"class", f.Class, "message", f.Message, "err", detail)
}
