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
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/plugins/abicheck"
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

func verify(t *testing.T, path string, o Options, so abicheck.Options) (abicheck.Summary, []abicheck.Result) {
	t.Helper()
	s := open(t, path, o)
	so.Limits = s.SuiteLimits()
	rec := &abicheck.Recorder{}
	sum := abicheck.Run(context.Background(), s, so, rec)
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
			conformance.PluginSuite(context.Background(), s, abicheck.Options{Limits: s.SuiteLimits()}, conformance.TestReporter(t))
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
			path := conformance.ExampleWasm(t, name)
			s := open(t, path, Options{})
			sum := conformance.PluginSuite(context.Background(), s, abicheck.Options{Limits: s.SuiteLimits()}, conformance.TestReporter(t))
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
	sum, results := verify(t, path, Options{}, abicheck.Options{})
	if sum.OK() {
		t.Fatal("the broken plugin passed the suite")
	}
	want := map[string]struct {
		class    abi.ErrorClass
		fragment string
	}{
		"start reply (tool explode {})":          {abi.ClassPluginTrap, "the plugin trapped"},
		"replay is idempotent (tool counter {})": {abi.ClassPluginProtocol, "treat (effect.id, attempt) as an idempotency key"},
		"attach on an unknown effect":            {abi.ClassPluginProtocol, "which was never started: it must answer unknown"},
		"cancel on an unknown effect":            {abi.ClassPluginTrap, "the plugin trapped"},
		"malformed input (start)":                {abi.ClassPluginProtocol, "output that is not a JSON object"},
		"malformed input (attach)":               {abi.ClassPluginProtocol, "for input that is not valid JSON"},
	}
	failed := map[string]abicheck.Result{}
	for _, r := range results {
		if r.Verdict == abicheck.Fail {
			failed[r.Check] = r
		}
	}
	for check, w := range want {
		r, ok := failed[check]
		if !ok {
			t.Errorf("check %q did not fail", check)
			continue
		}
		if r.Class != w.class || !strings.Contains(r.Detail, w.fragment) {
			t.Errorf("check %q failed with %s, want class %s and it to say %q", check, r, w.class, w.fragment)
		}
	}
	mustNameTheClass(t, results)
	for _, r := range results {
		if r.Check == abicheck.CheckDescribe && r.Verdict != abicheck.Pass {
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
		{"not_json", host.Limits{}, abi.ClassPluginProtocol},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			sum, results := verify(t, path, Options{Limits: tc.limits}, abicheck.Options{Tool: tc.tool, Args: json.RawMessage(`{}`)})
			if sum.OK() {
				t.Fatalf("tool %s passed the suite", tc.tool)
			}
			var start abicheck.Result
			for _, r := range results {
				if strings.HasPrefix(r.Check, abicheck.CheckStart) {
					start = r
				}
			}
			if start.Verdict != abicheck.Fail || start.Class != tc.class {
				t.Errorf("start on %s: %s, want a FAIL of class %s", tc.tool, start, tc.class)
			}
			mustNameTheClass(t, results)
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
	sum, results := verify(t, path, Options{}, abicheck.Options{})
	if sum.Failed != 2 || sum.Passed != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.Contains(results[0].Detail, "not "+abi.Marker) || results[1].Check != "load" || results[1].Class != abi.ClassPluginProtocol {
		t.Fatalf("results %v", results)
	}
	mustNameTheClass(t, results)
}

// mustNameTheClass fails the test unless every FAIL line names its error
// class, as `agenthost plugin verify` prints it.
func mustNameTheClass(t *testing.T, results []abicheck.Result) {
	t.Helper()
	for _, r := range results {
		if r.Verdict != abicheck.Fail {
			continue
		}
		if r.Class == "" || !strings.HasPrefix(r.String(), "FAIL  "+r.Check+" ("+string(r.Class)+"): ") {
			t.Errorf("a FAIL line does not name its error class: %s", r)
		}
	}
}
