package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/pluginverify"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The effect a plugin call with --tool makes up.
const (
	callEffectID = "call_run.t1.0"
	callAssign   = pluginverify.Tenant + "/call/" + callEffectID + "#1"
)

func newCallCmd() *cobra.Command {
	var f verifyFlags
	var input, tool string
	var allowHosts, config []string
	cmd := &cobra.Command{
		Use:   "call FILE.wasm EXPORT [--input JSON | --input @FILE.json | -]",
		Short: "Call one export of a plugin with your input; print the full reply, what it emitted and logged, and the time and memory",
		Long: `call loads the plugin on the real plugin host (its own, with an in-memory KV,
the system clock and, for agenthost_http, only the hosts --allow-host
lists), calls one export once with the input you give, and prints the
reply in full, pretty-printed, then what the plugin emitted
(agenthost_emit) and what it logged (log_*): the first 1000 events and
lines, 1 MiB of each at most, with a count of the rest, so that a plugin
that logs in a loop cannot exhaust memory; then what its KV holds after
the call, how long the call took and how much linear memory its instance
holds.

The input is --input JSON, --input @FILE.json, or - (or --input -) for
stdin. describe takes {"abi":1} when no input is given. With --tool NAME,
the input is the tool's arguments: call wraps them in the effect input
that start (or poll, attach, cancel) takes, for the effect
` + callEffectID + `, attempt 1.

It exits 1 when the call fails (a trap, a timeout, a non-zero status) or
the reply breaks the ABI, with the reason; plugin verify runs the whole
conformance suite.`,
		Example: `  agenthost plugin call word-tools.wasm describe
  agenthost plugin call word-tools.wasm start --tool word_count --input '{"text":"one two three"}'
  agenthost plugin call word-tools.wasm start --input @effect.json
  echo '{"expression":"2^10"}' | agenthost plugin call calculator.wasm start --tool calculate -
  agenthost plugin call openai.wasm start --input @request.json --allow-host api.openai.com --config model=gpt-4o-mini`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, argv []string) error {
			path, export := argv[0], argv[1]
			if len(argv) == 3 {
				if argv[2] != "-" {
					return fmt.Errorf("plugin call: unexpected argument %q: give the input with --input JSON, --input @FILE.json, or - for stdin", argv[2])
				}
				if input != "" {
					return fmt.Errorf("plugin call: both --input and - are given: give the input once")
				}
				input = "-"
			}
			if err := checkWasmFile(path); err != nil {
				return err
			}
			var in []byte
			if input != "" {
				b, err := readJSONArg("--input", input, cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("plugin call: %w", err)
				}
				in = b
			}
			sandbox := host.Sandbox{AllowedHosts: allowHosts}
			if len(config) > 0 {
				sandbox.Config = map[string]string{}
				for _, kv := range config {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return fmt.Errorf("plugin call: --config %q: want KEY=VALUE", kv)
					}
					sandbox.Config[strings.ToLower(k)] = v
				}
			}
			rec := &callRecorder{}
			s, err := f.openWith(cmd.Context(), path, func(o *pluginverify.Options) {
				o.Sandbox = sandbox
				o.Events = rec
				o.Logger = slog.New(rec)
				o.RealClock = true
			})
			if err != nil {
				return err
			}
			defer s.Close(context.WithoutCancel(cmd.Context()))
			if s.LoadError() != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("plugin call: the host refuses %s: %v", path, s.LoadError())}
			}
			var exports []string
			for _, e := range s.Inspection().Exports {
				exports = append(exports, e.Name)
			}
			if !slices.Contains(exports, export) {
				return fmt.Errorf("plugin call: %s has no export %q: it exports %s", path, export, strings.Join(exports, ", "))
			}
			if _, ok := abi.ParseMarker(export); ok || export == "_initialize" {
				return fmt.Errorf("plugin call: %s is not called with an input (the marker and _initialize take none): call describe, %s", export, callableExports(exports))
			}
			in, err = callInput(export, tool, in)
			if err != nil {
				return fmt.Errorf("plugin call: %w", err)
			}
			return printCall(cmd.Context(), cmd.OutOrStdout(), s, rec, path, export, tool, in)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&input, "input", "", "the export's input: JSON, @FILE.json, or - for stdin (with --tool: the tool's arguments)")
	cmd.Flags().StringVar(&tool, "tool", "", "the input is this tool's arguments: wrap them in an effect input (for start, poll, attach, cancel)")
	cmd.Flags().StringSliceVar(&allowHosts, "allow-host", nil, "a host agenthost_http may reach, as in a plugin's allowed_hosts (repeat it, or comma-separate; default: none)")
	cmd.Flags().StringArrayVar(&config, "config", nil, "a config value the plugin reads with config_get, KEY=VALUE (repeat it)")
	return cmd
}

func callableExports(exports []string) string {
	var out []string
	for _, e := range exports {
		if _, ok := abi.ParseMarker(e); !ok && e != "_initialize" {
			out = append(out, e)
		}
	}
	return strings.Join(out, ", ")
}

// checkWasmFile refuses a path that is not a readable file, before the
// host tries it.
func checkWasmFile(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("plugin call: there is no file %s: pass the path of a plugin .wasm (its build.sh writes one; `make plugins` builds the examples into build/plugins/)", path)
	case err != nil:
		return fmt.Errorf("plugin call: %w", err)
	case fi.IsDir():
		return fmt.Errorf("plugin call: %s is a directory: pass the path of a plugin .wasm", path)
	}
	return nil
}

// callInput returns the input of the call: in as it is, {"abi":1} for a
// describe without input, or, with tool, the arguments in wrapped in an
// effect input.
func callInput(export, tool string, in []byte) ([]byte, error) {
	if tool == "" {
		switch {
		case in != nil:
			return in, nil
		case export == abi.ExportDescribe:
			return []byte(`{"abi":1}`), nil
		}
		return nil, fmt.Errorf("%s needs an input: --input JSON, --input @FILE.json or - for stdin (for a tool, --tool NAME --input ARGUMENTS)", export)
	}
	switch export {
	case abi.ExportStart, abi.ExportPoll, abi.ExportAttach, abi.ExportCancel:
	default:
		return nil, fmt.Errorf("--tool is for start, poll, attach and cancel, not %s", export)
	}
	if !abi.ValidToolName(tool) {
		return nil, fmt.Errorf("--tool %q is not a tool name: it must match [A-Za-z0-9_-]{1,64}", tool)
	}
	if in == nil {
		in = []byte(`{}`)
	}
	if t := bytes.TrimSpace(in); len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("--input: the arguments of %s are not a JSON object; pass one, e.g. --input '{\"text\":\"one two\"}'", tool)
	}
	req, _ := json.Marshal(abi.ToolRequest{Arguments: in})
	return json.Marshal(abi.EffectInput{ABI: abi.Version, Effect: abi.Effect{
		ID: callEffectID, AssignmentKey: callAssign, Attempt: 1, Kind: abi.KindTool, Tool: tool, Request: req,
	}})
}

func printCall(ctx context.Context, w io.Writer, s *pluginverify.Subject, rec *callRecorder, path, export, tool string, in []byte) error {
	fmt.Fprintf(w, "call:    %s %s (input %d bytes)\n", path, export, len(in))
	if tool != "" {
		fmt.Fprintf(w, "input:   %s\n", indentJSON(in, "         "))
	}
	began := time.Now()
	out, err := s.Call(ctx, export, in)
	elapsed := time.Since(began)
	var problem string
	switch {
	case err != nil:
		fmt.Fprintf(w, "error:   %v\n", err)
		problem = err.Error()
	case !json.Valid(out):
		fmt.Fprintf(w, "reply:   (%d bytes, not JSON)\n%s\n", len(out), out)
		problem = fmt.Sprintf("the reply of %s is not JSON: %v", export, checkJSON(out))
	default:
		fmt.Fprintf(w, "reply:   %s\n", indentJSON(out, "         "))
		switch checked, err := checkReply(export, kindOf(in), out, s); {
		case err != nil:
			fmt.Fprintf(w, "abi:     the reply breaks ABI v%d: %v\n", abi.Version, err)
			problem = "the reply breaks the ABI: " + err.Error()
		case checked:
			fmt.Fprintf(w, "abi:     a valid %s reply\n", export)
		default:
			fmt.Fprintf(w, "abi:     %s is not an ABI export: its reply is not checked\n", export)
		}
	}
	events, logs := rec.take()
	fmt.Fprintf(w, "emitted: %d%s\n", events.total, events.dropped("events"))
	for _, e := range events.kept {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "logged:  %d%s\n", logs.total, logs.dropped("lines"))
	for _, l := range logs.kept {
		fmt.Fprintf(w, "  %s\n", l)
	}
	kv := s.KV()
	fmt.Fprintf(w, "kv:      %d keys\n", len(kv))
	for _, e := range kv {
		fmt.Fprintf(w, "  %q = %q\n", e.Key, e.Value)
	}
	fmt.Fprintf(w, "time:    %s\n", elapsed.Round(10*time.Microsecond))
	lim := s.SuiteLimits()
	fmt.Fprintf(w, "memory:  %d KiB of linear memory in use (the cap is %d KiB an instance, memory_pages %d)\n",
		s.MemoryBytes()>>10, int64(lim.MemoryPages)*64, lim.MemoryPages)
	if problem != "" {
		return &exitError{code: 1, msg: "plugin call: " + problem}
	}
	return nil
}

// kindOf is effect.kind of an effect input, for checking the reply.
func kindOf(in []byte) abi.EffectKind {
	var ei abi.EffectInput
	_ = json.Unmarshal(in, &ei)
	return ei.Effect.Kind
}

// checkReply holds the reply of export to the ABI, as the host would;
// checked is false for an export the ABI does not define.
func checkReply(export string, kind abi.EffectKind, out []byte, s *pluginverify.Subject) (checked bool, err error) {
	switch export {
	case abi.ExportDescribe:
		_, err = abi.DecodeDescribe(out, s.Plugin().Describe().Role)
	case abi.ExportBuild:
		_, err = abi.DecodeBuildOutput(out)
	case abi.ExportStart, abi.ExportPoll, abi.ExportAttach, abi.ExportCancel:
		switch {
		case kind == "":
			err = fmt.Errorf("the input has no effect.kind to check the reply against")
		case export == abi.ExportCancel:
			_, err = abi.DecodeCancelReply(out, kind)
		default:
			_, err = abi.DecodeEffectReply(out, kind, export)
		}
	default:
		return false, nil
	}
	return true, err
}

// indentJSON pretty-prints valid JSON, its lines after the first
// indented by prefix.
func indentJSON(b []byte, prefix string) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, prefix, "  "); err != nil {
		return string(b)
	}
	return buf.String()
}

// What plugin call keeps of what a plugin emits and logs in one call:
// the first maxKeptLines events and as many log lines, maxKeptBytes of
// each at most, every one cut at maxKeptLineBytes. A plugin that logs or
// emits in a loop would otherwise have the command hold all of it in
// memory until the call ends (the host bounds each message, not how
// many); past the bounds the recorder counts what it drops, and the
// output says so.
const (
	maxKeptLines     = 1000
	maxKeptBytes     = 1 << 20
	maxKeptLineBytes = 4 << 10
)

// keptLines is the part of a stream of lines a callRecorder keeps, and
// the count of all of them.
type keptLines struct {
	kept         []string
	keptBytes    int
	total        int64
	droppedBytes int64
}

// add keeps line if the bounds leave room for it, cut at
// maxKeptLineBytes, and counts it either way.
func (k *keptLines) add(line string) {
	k.total++
	if len(line) > maxKeptLineBytes {
		line = fmt.Sprintf("%s… (%d bytes in all)", strings.ToValidUTF8(line[:maxKeptLineBytes], ""), len(line))
	}
	if len(k.kept) >= maxKeptLines || k.keptBytes+len(line) > maxKeptBytes {
		k.droppedBytes += int64(len(line))
		return
	}
	k.kept = append(k.kept, line)
	k.keptBytes += len(line)
}

// dropped says how many of the lines (what: "lines", "events") were not
// kept, or "" when all were.
func (k *keptLines) dropped(what string) string {
	n := k.total - int64(len(k.kept))
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (the first %d shown; %d more %s, %d bytes, were not kept: plugin call keeps %d %s and %d KiB of a call)",
		len(k.kept), n, what, k.droppedBytes, maxKeptLines, what, maxKeptBytes>>10)
}

// callRecorder keeps what the plugin emits (a runtime.EventSink) and logs
// (a slog.Handler that takes the host's "plugin log" records, at debug so
// that the plugin's get_log_level answers debug), within the bounds
// above.
type callRecorder struct {
	mu     sync.Mutex
	events keptLines // each event as JSON
	logs   keptLines // "LEVEL: message"
}

var (
	_ runtime.EventSink = (*callRecorder)(nil)
	_ slog.Handler      = (*callRecorder)(nil)
)

func (r *callRecorder) Emit(_ context.Context, _ runtime.EmitScope, ev abi.EmitEvent) error {
	b, _ := json.Marshal(ev)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events.add(string(b))
	return nil
}

func (r *callRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *callRecorder) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "plugin log" {
		return nil // the host's own debug logs
	}
	var level, msg string
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "level":
			level = a.Value.String()
		case "message":
			msg = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs.add(level + ": " + msg)
	return nil
}

func (r *callRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *callRecorder) WithGroup(string) slog.Handler      { return r }

func (r *callRecorder) take() (events, logs keptLines) {
	r.mu.Lock()
	defer r.mu.Unlock()
	events, logs = r.events, r.logs
	r.events, r.logs = keptLines{}, keptLines{}
	return events, logs
}
