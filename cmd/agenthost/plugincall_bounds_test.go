package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// TestPluginCallKeepsABoundedPartOfWhatAPluginLogsInALoop is issue 33's
// finding: `agenthost plugin call` kept every line a plugin logged (and
// every event it emitted) in memory until the call ended, 872 MB in 10 s
// for a plugin that logs in a loop. Now it keeps the first maxKeptLines
// of each, maxKeptBytes at most, and says how many it dropped.
func TestPluginCallKeepsABoundedPartOfWhatAPluginLogsInALoop(t *testing.T) {
	wasm, err := conformance.BuildPackage("cmd/agenthost/testdata/logflood")
	if err != nil {
		t.Fatal(err)
	}
	const lines, emits = 5 * maxKeptLines, 2 * maxKeptLines
	cmd := newPluginCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"call", "--cache-dir", conformance.WazeroCacheDir(), "--timeout", "5m",
		wasm, "start", "--tool", "flood", "--input", `{"lines": 5000, "emits": 2000}`})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("plugin call: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	text := out.String()
	for _, want := range []string{
		`"content": "flooded"`,
		"logged:  5000 (the first 1000 shown; 4000 more lines,",
		"emitted: 2000 (the first 1000 shown; 1000 more events,",
		"  INFO: flood line 999 of 5000\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the output has no %q", want)
		}
	}
	kept := strings.Count(text, "  INFO: flood line ")
	keptEvents := strings.Count(text, `"message":"flood event `)
	if kept != maxKeptLines || keptEvents != maxKeptLines {
		t.Errorf("the output shows %d of the %d lines logged and %d of the %d events emitted; want the first %d of each, the rest counted, not kept",
			kept, lines, keptEvents, emits, maxKeptLines)
	}
	if strings.Contains(text, "flood line 1000 of") {
		t.Error("the output shows a line past the first 1000")
	}
	if t.Failed() {
		t.Logf("output (%d bytes), first lines:\n%.3000s", len(text), text)
	}
}

// The recorder keeps maxKeptBytes of lines at most, each cut at
// maxKeptLineBytes, however long the lines a plugin logs.
func TestPluginCallRecorderBoundsTheBytesItKeeps(t *testing.T) {
	var k keptLines
	long := strings.Repeat("é", 10<<10) // 20 KiB of two-byte runes
	for i := 0; i < 2000; i++ {
		k.add(long)
	}
	if k.total != 2000 {
		t.Fatalf("counted %d lines, want 2000", k.total)
	}
	if k.keptBytes > maxKeptBytes || len(k.kept) == 0 || len(k.kept) >= maxKeptLines {
		t.Fatalf("kept %d lines, %d bytes; want some, within %d bytes", len(k.kept), k.keptBytes, maxKeptBytes)
	}
	for _, l := range k.kept {
		if len(l) > maxKeptLineBytes+64 || !strings.HasSuffix(l, "… (20480 bytes in all)") || !strings.HasPrefix(l, "éé") {
			t.Fatalf("a kept line of %d bytes ends %q; want it cut at %d bytes and say how long it was", len(l), l[len(l)-40:], maxKeptLineBytes)
		}
	}
	if got := k.dropped("lines"); !strings.Contains(got, "more lines") {
		t.Errorf("dropped says %q", got)
	}
}
