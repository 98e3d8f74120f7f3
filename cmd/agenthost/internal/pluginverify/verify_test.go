package pluginverify

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/conformance/pluginsuite"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

func open(t *testing.T, path string, o Options) *Subject {
	t.Helper()
	o.CacheDir = conformance.WazeroCacheDir()
	s, err := Open(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func verify(t *testing.T, path string, o Options, so pluginsuite.Options) (pluginsuite.Summary, []pluginsuite.Result) {
	t.Helper()
	s := open(t, path, o)
	so.Limits = s.SuiteLimits()
	rec := &pluginsuite.Recorder{}
	sum := pluginsuite.Run(context.Background(), s, so, rec)
	for _, r := range rec.Results {
		t.Log(r)
	}
	return sum, rec.Results
}

// The conformance plugins that behave pass the whole suite.
func TestWellBehavedConformancePluginsPass(t *testing.T) {
	for _, name := range []string{conformance.PluginBuilder, conformance.PluginExecutor, conformance.PluginSlowJob} {
		t.Run(name, func(t *testing.T) {
			path, err := conformance.BuildPlugin(name)
			if err != nil {
				t.Fatal(err)
			}
			s := open(t, path, Options{})
			conformance.PluginSuite(context.Background(), s, pluginsuite.Options{Limits: s.SuiteLimits()}, conformance.TestReporter(t))
		})
	}
}

// Every example under examples/plugins passes the whole suite, the C one
// included.
func TestExamplePluginsPass(t *testing.T) {
	names, err := conformance.ListExamplePlugins()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Skip("examples/plugins holds no example yet")
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			path, err := conformance.BuildExampleWasm(name)
			if err != nil {
				t.Fatal(err)
			}
			s := open(t, path, Options{})
			sum := conformance.PluginSuite(context.Background(), s, pluginsuite.Options{Limits: s.SuiteLimits()}, conformance.TestReporter(t))
			if sum.Passed == 0 {
				t.Fatal("no check passed")
			}
		})
	}
}

// The broken plugin fails, each check for the right reason.
func TestBrokenPluginFailsWithTheRightMessages(t *testing.T) {
	path, err := conformance.BuildPlugin(conformance.PluginBroken)
	if err != nil {
		t.Fatal(err)
	}
	sum, results := verify(t, path, Options{}, pluginsuite.Options{})
	if sum.OK() {
		t.Fatal("the broken plugin passed the suite")
	}
	want := map[string]string{
		"start reply (tool explode {})":          "the plugin trapped (plugin_trap)",
		"replay is idempotent (tool counter {})": "treat (effect.id, attempt) as an idempotency key",
		"attach on an unknown effect":            "which was never started: it must answer unknown",
		"cancel on an unknown effect":            "the plugin trapped (plugin_trap)",
		"malformed input (start)":                "output that is not a JSON object",
		"malformed input (attach)":               "for input that is not valid JSON",
	}
	failed := map[string]string{}
	for _, r := range results {
		if r.Verdict == pluginsuite.Fail {
			failed[r.Check] = r.Detail
		}
	}
	for check, fragment := range want {
		detail, ok := failed[check]
		if !ok {
			t.Errorf("check %q did not fail", check)
			continue
		}
		if !strings.Contains(detail, fragment) {
			t.Errorf("check %q failed with %q, want it to say %q", check, detail, fragment)
		}
	}
	for _, r := range results {
		if r.Check == pluginsuite.CheckDescribe && r.Verdict != pluginsuite.Pass {
			t.Errorf("the broken plugin's describe is valid, got %s", r)
		}
	}
}

// Hostile behaviour is reported by its classified error.
func TestHostileBehaviourIsReportedByClass(t *testing.T) {
	path, err := conformance.BuildPlugin(conformance.PluginHostile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tool   string
		limits host.Limits
		class  abi.ErrorClass
	}{
		{"loop", host.Limits{CallTimeout: time.Second}, abi.ClassPluginTimeout},
		{"oom", host.Limits{MemoryPages: 512, CallTimeout: 5 * time.Second}, abi.ClassPluginOOM},
		{"not_json", host.Limits{}, ""},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			sum, results := verify(t, path, Options{Limits: tc.limits}, pluginsuite.Options{Tool: tc.tool, Args: json.RawMessage(`{}`)})
			if sum.OK() {
				t.Fatalf("tool %s passed the suite", tc.tool)
			}
			var detail string
			for _, r := range results {
				if strings.HasPrefix(r.Check, pluginsuite.CheckStart) {
					detail = r.Detail
				}
			}
			want := "the reply breaks the ABI"
			if tc.class != "" {
				want = "(" + string(tc.class) + ")"
			}
			if !strings.Contains(detail, want) {
				t.Errorf("start on %s: %q, want %q", tc.tool, detail, want)
			}
		})
	}
}

// A module the host refuses fails the marker and load checks and nothing
// is called.
func TestRefusedModuleFailsTheMarker(t *testing.T) {
	// A wasm module with no exports at all: the magic and version only.
	path := filepath.Join(t.TempDir(), "empty.wasm")
	if err := os.WriteFile(path, []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, results := verify(t, path, Options{}, pluginsuite.Options{})
	if sum.Failed != 2 || sum.Passed != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.Contains(results[0].Detail, "not "+abi.Marker) || results[1].Check != "load" {
		t.Fatalf("results %v", results)
	}
}
