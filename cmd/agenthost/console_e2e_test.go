package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/serveproc"
)

// chromiumPath is Debian's chromium, which make deps installs.
const chromiumPath = "/usr/bin/chromium"

// The console test's tenants.
const (
	consoleDemoToken = "console-demo-token"
	consoleAcmeToken = "console-acme-token"
)

// TestConsoleInABrowser drives the web console in a real browser (Debian's
// chromium through playwright-core, testdata/e2e/console.test.mjs) against
// the real `agenthost serve` on 127.0.0.1 with the Wasm plugins: sign-in,
// a Run watched live to its end, the tenant's agents with their
// versions, instructions and tools (an agent tool linked to its agent), a
// Run started with one that is not the default and shown with its agent
// and version, the list filtered by agent, an agent the tenant does not
// have refused with the API's message, two parallel tool calls of which
// one is approved and one denied, a child Run (an agent called as a tool)
// whose approval its parent's page points to and whose own page answers
// it, linked both ways and in the list, a parent cancelled with its
// child, a stale answer refused with 412, a question
// answered, a cancel with a slow job in flight, a tool result of HTML
// shown as text, another tenant's Run not found, and a SIGKILL of the
// server mid-Run that the live view resumes from without losing or
// repeating an event, and a model's answer (the openai example against
// conformance.FakeOpenAI, held after its first pieces) that the Run's
// page shows growing while the Run runs, then replaced by the committed
// answer. The browser's screenshots of each step are kept, and their
// directory printed, when it fails.
func TestConsoleInABrowser(t *testing.T) {
	conformance.SkipInShort(t, "the console in a browser")
	for _, need := range []struct{ file, what string }{
		{chromiumPath, "chromium (apt-get install -y chromium; make deps does it)"},
		{"/usr/bin/node", "node (apt-get install -y nodejs npm; make deps does it)"},
		{"/usr/bin/npm", "npm (apt-get install -y nodejs npm; make deps does it)"},
	} {
		if _, err := os.Stat(need.file); err != nil {
			t.Fatalf("the console's browser test needs %s: %v", need.what, err)
		}
	}
	e2eDir, err := filepath.Abs("../../internal/console/testdata/e2e")
	if err != nil {
		t.Fatal(err)
	}
	conformance.NPMCI(t, e2eDir, "playwright-core")

	// Agent "streamer"'s model: its one answer streams in pieces of 4
	// runes. It waits to begin until the browser watches the Run's page
	// (STREAM: the deltas are not replayed to a stream that opens
	// later), and stops after the first two pieces until the browser has
	// seen them there (RELEASE).
	fake := conformance.NewFakeOpenAI(t, "")
	watching := make(chan struct{})
	var watchOnce sync.Once
	startStreaming := func() { watchOnce.Do(func() { close(watching) }) }
	t.Cleanup(startStreaming) // before the fake closes: a request it holds lets go
	fake.Script(func(conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		<-watching
		return conformance.OpenAIAnswer{Content: consoleStreamedAnswer}, true
	})
	hold := fake.Hold(2)

	bin := buildBinary(t)
	dir := t.TempDir()
	cfgPath := consoleConfig(t, dir, fake)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	addr := freeAddr(t)
	srv := startServeOn(t, bin, cfgPath, logPath, addr)

	shots, err := os.MkdirTemp("", "agenthost-console-shots-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("AGENTHOST_CONSOLE_KEEP_SHOTS") != "" {
			t.Logf("the browser's screenshots of each step are in %s", shots)
			return
		}
		os.RemoveAll(shots)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := exec.CommandContext(ctx, "node", "console.test.mjs")
	node.Dir = e2eDir
	node.Env = append(os.Environ(), "CONSOLE_URL=http://"+addr, "DEMO_TOKEN="+consoleDemoToken,
		"ACME_TOKEN="+consoleAcmeToken, "STREAMED_ANSWER="+consoleStreamedAnswer, "SHOTS="+shots, "CHROMIUM="+chromiumPath,
		"CONSOLE_SCREENSHOT="+os.Getenv("AGENTHOST_CONSOLE_SCREENSHOT"))
	var stderr bytes.Buffer
	node.Stderr = &stderr
	stdin, err := node.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	passed := false
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		switch {
		case line == "RESTART":
			// The browser watches a Run with a job in flight: kill the
			// server as a crash would, and start it again on the same
			// store and port.
			srv.Kill()
			srv = startServeOn(t, bin, cfgPath, logPath, addr)
			if _, err := io.WriteString(stdin, "RESTARTED\n"); err != nil {
				t.Errorf("telling the browser script the server is back: %v", err)
			}
		case line == "STREAM":
			// The browser watches the Run of agent streamer: its model
			// may begin to answer.
			startStreaming()
			if _, err := io.WriteString(stdin, "STREAMING\n"); err != nil {
				t.Errorf("telling the browser script the model answers: %v", err)
			}
		case line == "RELEASE":
			// The browser has seen the first pieces of the held answer:
			// let the rest come.
			select {
			case <-hold.Reached():
			case <-time.After(30 * time.Second):
				t.Errorf("the browser saw the answer's first pieces, but the fake OpenAI did not hold it after them")
			}
			hold.Release()
			if _, err := io.WriteString(stdin, "RELEASED\n"); err != nil {
				t.Errorf("telling the browser script the answer goes on: %v", err)
			}
		case line == "PASS":
			passed = true
		}
	}
	err = node.Wait()
	t.Logf("the browser script:\n%s", out.String())
	if stderr.Len() > 0 {
		t.Logf("its stderr:\n%s", stderr.String())
	}
	if err != nil || !passed {
		t.Fatalf("the console's browser test failed (%v); its screenshots are in %s", err, shots)
	}
	if reqs := fake.Requests(); len(reqs) != 1 || !reqs[0].Stream {
		t.Errorf("the fake OpenAI had %d requests, want 1 asking for a stream", len(reqs))
	}
	logs, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{consoleDemoToken, consoleAcmeToken} {
		if bytes.Contains(logs, []byte(token)) {
			t.Errorf("the server's log holds the token %q", token)
		}
	}
	// The console stays within the limits above: nothing it asked for
	// was refused for one.
	for _, line := range strings.Split(string(logs), "\n") {
		if strings.Contains(line, "status=429") || strings.Contains(line, "status=413") {
			t.Errorf("a request was refused for a limit: %s", line)
		}
	}
}

// consoleStreamedAnswer is what agent "streamer"'s model answers, in
// pieces of 4 runes.
const consoleStreamedAnswer = "The water boils at 93 degrees up there, since the air is thinner."

// consoleConfig writes the config of the console test: tenant demo on the
// example plugins (its calculate calls wait for approval), with five
// agents: "default" (the top-level form), "research" (its own instructions
// and model settings, the slow job only), "lead", whose one tool is the
// agent "helper", "helper" (the calculator, whose calls wait for
// approval), and "streamer", whose model is the openai example (which
// streams its answers) against the fake openai; tenant acme on the
// conformance builder and scripted model and tools (its input is the
// model's script); both with the slow-job example.
func consoleConfig(t *testing.T, dir string, openai *conformance.FakeOpenAI) string {
	t.Helper()
	ex := map[string]string{}
	for _, name := range []string{"prompt-builder", "scripted-model", "calculator", "slow-job", "openai"} {
		p := conformance.ExampleWasm(t, name)
		ex[name] = p
	}
	return writeConfig(t, dir, `
data_dir: data
sync_writes: true
cache_dir: `+conformance.WazeroCacheDir()+`
log: {format: text, level: info}
metrics: {listen: "off"}
# The hardening limits, tighter than their defaults: the console works
# within them (its pages are cut by bytes and read on from next_after).
http: {max_streams_per_tenant: 4, max_page_bytes: 4096, unauthenticated_rate: {per_second: 5, burst: 20}}
plugins:
  prompt-builder: {path: `+ex["prompt-builder"]+`, role: builder}
  scripted-model: {path: `+ex["scripted-model"]+`, role: executor}
  calculator: {path: `+ex["calculator"]+`, role: executor}
  slow-job: {path: `+ex["slow-job"]+`, role: executor}
  openai:
    path: `+ex["openai"]+`
    role: executor
    allowed_hosts: ["`+openai.Addr+`"]
    config: {base_url: "`+openai.URL+`", model: console-model}
  builder: {path: `+conformancePlugin(t, conformance.PluginBuilder)+`, role: builder}
  scripted: {path: `+conformancePlugin(t, conformance.PluginScripted)+`, role: executor}
tenants:
  demo:
    tokens_sha256: [`+httpapi.HashToken(consoleDemoToken)+`]
    builder: prompt-builder
    model: scripted-model
    tool_executors: [calculator, slow-job]
    tools:
      calculate: {approval: always}
    agents:
      research:
        description: Looks things up, slowly.
        instructions: You are RESEARCH. Take your time.
        model: {plugin: scripted-model, settings: {model: research-model, temperature: 0.9}}
        tools: [{plugin: slow-job}]
      lead:
        description: Hands the work to helper.
        model: {plugin: scripted-model}
        tools: [{agent: helper}]
      helper:
        model: {plugin: scripted-model}
        tools: [{plugin: calculator, approval: always}]
      streamer:
        description: Answers as the words come.
        model: {plugin: openai}
    rate_limits: {requests: {per_second: 50, burst: 100}}
    quotas: {max_concurrent_reads: 8, max_active_runs: 8}
  acme:
    tokens_sha256: [`+httpapi.HashToken(consoleAcmeToken)+`]
    builder: builder
    model: scripted
    tool_executors: [scripted, slow-job]
    model_policy: {mode: retry, max_attempts: 8, backoff: 100ms, max_backoff: 1s}
    rate_limits: {requests: {per_second: 50, burst: 100}}
    quotas: {max_concurrent_reads: 8, max_active_runs: 8}
`)
}

// freeAddr returns a free port of 127.0.0.1. The server keeps it across
// its restart, so that the browser's page (whose origin it is) stays.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// consoleServe is `agenthost serve` on a fixed address.
type consoleServe struct {
	cmd  *exec.Cmd
	once sync.Once
	done chan struct{}
}

// Kill SIGKILLs the process and waits for it.
func (s *consoleServe) Kill() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
}

// startServeOn starts `bin serve` on addr, its output appended to
// logPath, waits until it is ready, and kills it when the test ends.
func startServeOn(t *testing.T, bin, cfgPath, logPath, addr string) *consoleServe {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", "--config", cfgPath, "--listen", addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &consoleServe{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(s.Kill)
	c := serveproc.NewClient(addr, "", 2*time.Second)
	waitUntil(t, 60*time.Second, "agenthost serve ready on "+addr, func() (bool, error) {
		select {
		case <-s.done:
			t.Fatalf("agenthost serve exited before it was ready:\n%s", serveproc.TailFile(logPath, 40))
		default:
		}
		code, raw, err := c.Do("GET", "/readyz", nil, nil, nil)
		return err == nil && code == 200, fmt.Errorf("%d %v %s", code, err, raw)
	})
	return s
}
