package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/pluginverify"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/plugins/abicheck"
)

func newPluginCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plugin",
		Short: "Write, check and try plugins",
		Long: `plugin init writes a new tool plugin project (Go, C or AssemblyScript);
plugin inspect shows what a plugin .wasm declares; plugin verify runs it on
the real plugin host and holds it to ABI v1 (docs/ABI.md); plugin call
calls one export with your input and prints the full reply.`,
		Example: `  agenthost plugin init --lang go word-tools
  agenthost plugin inspect build/plugins/calculator.wasm
  agenthost plugin verify build/plugins/calculator.wasm --tool calculate --args '{"expression":"2*(3+4)"}'
  agenthost plugin call build/plugins/calculator.wasm start --tool calculate --input '{"expression":"2^10"}'`,
	}
	cmd.AddCommand(newInitCmd(), newInspectCmd(), newVerifyCmd(), newCallCmd())
	return cmd
}

// verifyFlags are the load options inspect and verify share.
type verifyFlags struct {
	role        string
	timeout     time.Duration
	memoryPages uint32
	cacheDir    string
}

func (f *verifyFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.role, "role", "", "load the plugin as builder or executor (default: what its exports suggest)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "the call timeout (default: the host's, 10s)")
	cmd.Flags().Uint32Var(&f.memoryPages, "memory-pages", 0, "the memory cap per instance, in 64 KiB pages (default: the host's, 1024)")
	cmd.Flags().StringVar(&f.cacheDir, "cache-dir", "", "a wazero compilation cache directory (default: none)")
}

func (f *verifyFlags) open(ctx context.Context, path string) (*pluginverify.Subject, error) {
	return f.openWith(ctx, path, nil)
}

// openWith opens the plugin with the flags' options, changed by mod.
func (f *verifyFlags) openWith(ctx context.Context, path string, mod func(*pluginverify.Options)) (*pluginverify.Subject, error) {
	role := abi.Role(strings.ToLower(f.role))
	if role != "" && role != abi.RoleBuilder && role != abi.RoleExecutor {
		return nil, fmt.Errorf("plugin: --role %q: want builder or executor", f.role)
	}
	o := pluginverify.Options{
		Role:     role,
		Limits:   host.Limits{CallTimeout: f.timeout, MemoryPages: f.memoryPages},
		CacheDir: f.cacheDir,
	}
	if mod != nil {
		mod(&o)
	}
	s, err := pluginverify.Open(ctx, path, o)
	if err != nil {
		return nil, fmt.Errorf("plugin: %w: pass the path of a plugin .wasm (`make plugins` builds the examples into build/plugins/)", err)
	}
	return s, nil
}

func newInspectCmd() *cobra.Command {
	var f verifyFlags
	cmd := &cobra.Command{
		Use:   "inspect FILE.wasm",
		Short: "Show a plugin's ABI marker, describe reply, imports and exports",
		Example: `  agenthost plugin inspect build/plugins/calculator.wasm
  agenthost plugin inspect --role builder build/plugins/prompt-builder.wasm`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := f.open(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer s.Close(context.WithoutCancel(cmd.Context()))
			printInspection(cmd.OutOrStdout(), args[0], s)
			if s.LoadError() != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("plugin inspect: the host refuses %s: %v", args[0], s.LoadError())}
			}
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func printInspection(w io.Writer, path string, s *pluginverify.Subject) {
	in := s.Inspection()
	fmt.Fprintf(w, "file:    %s\nsha256:  %s\n", path, in.SHA256)
	switch {
	case in.Handshake != nil:
		fmt.Fprintf(w, "marker:  refused: %v\n", in.Handshake)
	default:
		fmt.Fprintf(w, "marker:  %s (ABI v%d; markers found: %v)\n", abi.MarkerFor(in.ABIVersion), in.ABIVersion, in.Markers)
	}
	if in.ImportsRefused != nil {
		fmt.Fprintf(w, "imports: refused: %v\n", in.ImportsRefused)
	}
	if p := s.Plugin(); p != nil {
		d, _ := json.MarshalIndent(p.Describe(), "         ", "  ")
		fmt.Fprintf(w, "describe: %s\n", d)
	} else if s.LoadError() != nil {
		fmt.Fprintf(w, "describe: not available: %v\n", s.LoadError())
	}
	fmt.Fprintf(w, "exports (%d):\n", len(in.Exports))
	for _, e := range in.Exports {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintf(w, "imports (%d):\n", len(in.Imports))
	for _, i := range in.Imports {
		fmt.Fprintf(w, "  %s\n", i)
	}
}

func newVerifyCmd() *cobra.Command {
	var f verifyFlags
	var tool, args string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "verify FILE.wasm",
		Short: "Run the plugin conformance suite on a plugin; exit non-zero on any failure",
		Long: `verify loads the plugin on the real plugin host (its own, with an in-memory KV
and a clock that stands still) and checks it against ABI v1: the marker,
describe, the reply schema for sample inputs, that replaying an effect id and
attempt gets the same reply, that attach on an unknown effect answers
unknown, that cancel on an unknown effect does not trap, that malformed
input gives an error without trapping, and the time and memory of its calls
against the limits. It prints one line per check, PASS, FAIL or WARN, with
why, and exits 1 if any check fails. -v prints every call the suite makes,
with its input and its full reply, before the check's line.`,
		Example: `  agenthost plugin verify build/plugins/calculator.wasm
  agenthost plugin verify build/plugins/calculator.wasm --tool calculate --args '{"expression":"(2+3)*4"}'
  agenthost plugin verify build/plugins/calculator.wasm --tool calculate --args @args.json -v
  agenthost plugin verify --role builder --timeout 2s --memory-pages 256 build/plugins/prompt-builder.wasm`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var raw json.RawMessage
			if args != "" {
				if tool == "" {
					return fmt.Errorf("plugin verify: --args needs --tool: name the tool the arguments are for")
				}
				b, err := readJSONArg("--args", args, cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("plugin verify: %w", err)
				}
				if t := bytes.TrimSpace(b); t[0] != '{' {
					return fmt.Errorf("plugin verify: --args: the arguments are not a JSON object: pass one, e.g. --args '{\"expression\":\"2+3\"}' or --args @args.json")
				}
				raw = json.RawMessage(b)
			}
			out := cmd.OutOrStdout()
			s, err := f.openWith(cmd.Context(), argv[0], func(o *pluginverify.Options) {
				if verbose {
					o.OnCall = func(export string, input, output []byte, err error) {
						printVerboseCall(out, export, input, output, err)
					}
				}
			})
			if err != nil {
				return err
			}
			defer s.Close(context.WithoutCancel(cmd.Context()))
			fmt.Fprintf(out, "verifying %s\n", argv[0])
			sum := abicheck.Run(cmd.Context(), s, abicheck.Options{
				Role: abi.Role(strings.ToLower(f.role)), Tool: tool, Args: raw, Limits: s.SuiteLimits(),
			}, lineReporter{out})
			fmt.Fprintf(out, "%d passed, %d failed, %d warnings\n", sum.Passed, sum.Failed, sum.Warned)
			if !sum.OK() {
				return &exitError{code: 1, msg: fmt.Sprintf("plugin verify: %s fails %d check(s) of ABI v%d; see the FAIL lines above", argv[0], sum.Failed, abi.Version)}
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&tool, "tool", "", "check only this tool")
	cmd.Flags().StringVar(&args, "args", "", "the tool's arguments, a JSON object, @FILE.json, or - for stdin (with --tool; default: derived from its input_schema)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print every call with its input and full reply")
	return cmd
}

// printVerboseCall prints one call of the suite for verify -v: its
// export, its input and its reply, in full.
func printVerboseCall(w io.Writer, export string, input, output []byte, err error) {
	fmt.Fprintf(w, "  call %s, input (%d bytes): %s\n", export, len(input), input)
	switch {
	case err != nil:
		fmt.Fprintf(w, "  error: %v\n", err)
	case json.Valid(output):
		fmt.Fprintf(w, "  reply (%d bytes): %s\n", len(output), indentJSON(output, "  "))
	default:
		fmt.Fprintf(w, "  reply (%d bytes, not JSON): %q\n", len(output), output)
	}
}

// lineReporter prints one line per check.
type lineReporter struct{ w io.Writer }

func (r lineReporter) Report(res abicheck.Result) { fmt.Fprintln(r.w, res) }
