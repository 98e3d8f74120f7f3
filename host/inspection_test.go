package host

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

func TestInspectReportsMarkerExportsAndImports(t *testing.T) {
	path, err := conformance.BuildPlugin(conformance.PluginExecutor)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{CacheDir: conformance.WazeroCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	in, err := h.Inspect(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if in.ABIVersion != abi.Version || len(in.Markers) != 1 || in.Handshake != nil || in.ImportsRefused != nil {
		t.Fatalf("inspection: %+v", in)
	}
	if in.Role != abi.RoleExecutor {
		t.Errorf("role from exports: %q", in.Role)
	}
	var names []string
	for _, f := range in.Exports {
		names = append(names, f.String())
	}
	joined := strings.Join(names, "\n")
	for _, want := range []string{"agenthost_abi_v1 () -> ()", "start () -> i32", "attach () -> i32"} {
		if !strings.Contains(joined, want) {
			t.Errorf("exports lack %q:\n%s", want, joined)
		}
	}
	found := false
	for _, f := range in.Imports {
		if f.Module == abi.HostModule && f.Name == abi.HostKVGet && f.Signature == "(i64) -> i64" {
			found = true
		}
	}
	if !found {
		t.Errorf("imports lack %s.%s: %v", abi.HostModule, abi.HostKVGet, in.Imports)
	}
}

func TestInspectNamesTheMissingMarker(t *testing.T) {
	h, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	// A module with one export, "start" () -> i32, and no marker.
	path := writeModule(t, tinyModule(nil, []wExport{{name: "start", typ: wFuncType{results: []byte{wI32}}}}))
	in, err := h.Inspect(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(in.Handshake, ErrABIMismatch) || !strings.Contains(in.Handshake.Error(), abi.Marker) {
		t.Fatalf("handshake: %v", in.Handshake)
	}
	if _, err := h.Inspect(context.Background(), writeModule(t, []byte("not wasm"))); err == nil || !strings.Contains(err.Error(), "not a valid WebAssembly module") {
		t.Fatalf("garbage: %v", err)
	}
}

func TestCallRawReturnsTheUndecodedReplyAndClassifiesFailures(t *testing.T) {
	e := newEnv(t, Config{})
	p := e.load(t, conformance.PluginExecutor, abi.RoleExecutor, nil)
	out, err := p.CallRaw(context.Background(), "t1", abi.ExportDescribe, []byte(`{"abi":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var d abi.Describe
	if err := json.Unmarshal(out, &d); err != nil || d.Name != "conformance-executor" {
		t.Fatalf("describe through CallRaw: %s (%v)", out, err)
	}
	hostile := e.load(t, conformance.PluginHostile, abi.RoleExecutor, nil)
	in, _ := json.Marshal(abi.EffectInput{ABI: 1, Effect: abi.Effect{ID: "r.t1.0", Attempt: 1, Kind: abi.KindTool, Tool: "trap", Request: json.RawMessage(`{"arguments":{}}`)}})
	_, err = hostile.CallRaw(context.Background(), "t1", abi.ExportStart, in)
	var pe *runtime.PluginError
	if !errors.As(err, &pe) || pe.Class != abi.ClassPluginTrap {
		t.Fatalf("a trap through CallRaw: %v", err)
	}
	if _, err := p.CallRaw(context.Background(), "", abi.ExportStart, in); err == nil {
		t.Fatal("a call with no tenant must fail")
	}
}
