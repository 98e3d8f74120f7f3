package host

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
)

// A load holds nothing that the calls of other plugins need (no host-wide
// lock, no share of the memory budget they wait on): while plugin b's
// load is stopped midway, its module compiled and its describe instance
// live, plugin a serves calls for new tenants (new pools, new instances
// under the host-wide memory budget), plugin c loads, and the host lists
// its plugins; then b's load completes. A reload that loads a new version
// of one plugin so never stalls the Runs of the others.
func TestCallsOfAPluginProceedWhileAnotherLoads(t *testing.T) {
	reached, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	e := newEnv(t, Config{describing: func(plugin string) {
		if plugin == "b" {
			close(reached)
			<-release
		}
	}})
	// However the test ends, b's load goes on before the host closes
	// (cleanups run last first).
	t.Cleanup(letGo)
	a := e.executor(t, conformance.PluginExecutor, nil)
	path := pluginPath(t, conformance.PluginExecutor)

	loaded := make(chan error, 1)
	go func() {
		_, err := e.h.Load(context.Background(), PluginSpec{Name: "b", Path: path, Role: abi.RoleExecutor})
		loaded <- err
	}()
	select {
	case <-reached:
	case err := <-loaded:
		t.Fatalf("b's load ended without stopping at describe: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("b's load did not reach describe within 2 minutes")
	}

	// within runs f while b's load is stopped, and fails the test if f
	// does not end: a lock b's load held would hold f up for good.
	within := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s while b loads: %v", what, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s did not end within a minute while b's load was stopped: the load holds something it needs", what)
		}
	}
	ctx := context.Background()
	for i, tenant := range []string{"acme", "globex", "initech"} {
		within(fmt.Sprintf("a's call for %s", tenant), func() error {
			r, err := a.Start(ctx, toolCall(tenant, fmt.Sprintf("r.t%d.0", i), 1, "echo", map[string]string{"text": "hello"}))
			if err == nil && r.State != abi.StateDone {
				err = fmt.Errorf("state %q, want done (reply %+v)", r.State, r)
			}
			return err
		})
	}
	within("loading c", func() error {
		_, err := e.h.Load(ctx, PluginSpec{Name: "c", Path: path, Role: abi.RoleExecutor})
		return err
	})
	within("listing the plugins", func() error {
		if got, want := e.h.Plugins(), []string{"c", conformance.PluginExecutor}; !slices.Equal(got, want) {
			return fmt.Errorf("plugins %v, want %v (b is not loaded yet)", got, want)
		}
		return nil
	})

	letGo()
	if err := <-loaded; err != nil {
		t.Fatalf("b's load, let go: %v", err)
	}
	b, ok := e.h.Plugin("b")
	if !ok {
		t.Fatal("b is not registered after its load")
	}
	x, err := b.Executor()
	if err != nil {
		t.Fatal(err)
	}
	doneIn(t)(x.Start(ctx, toolCall("acme", "r.t9.0", 1, "echo", map[string]string{"text": "hello"})))
}

// A file loaded again while a plugin of it is loaded shares its compiled
// code: under another name and another config, the second load compiles
// nothing, each plugin serves calls, and the code is closed with the last
// plugin that holds it; a load after that compiles the file again.
func TestALoadOfAFileLoadedAlreadySharesItsCode(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	path := pluginPath(t, conformance.PluginExecutor)
	load := func(name string, sb Sandbox) *Plugin {
		t.Helper()
		p, err := e.h.Load(ctx, PluginSpec{Name: name, Path: path, Role: abi.RoleExecutor, Sandbox: sb})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	call := func(p *Plugin, effect string) {
		t.Helper()
		x, err := p.Executor()
		if err != nil {
			t.Fatal(err)
		}
		doneIn(t)(x.Start(ctx, toolCall("acme", effect, 1, "echo", map[string]string{"text": "hello"})))
	}
	codes := func() int {
		e.h.mu.Lock()
		defer e.h.mu.Unlock()
		return len(e.h.codes)
	}

	a := load("a", Sandbox{})
	b := load("b", Sandbox{Config: map[string]string{"greeting": "hi"}})
	if a.code != b.code {
		t.Fatal("a second load of the same file compiled it again")
	}
	call(a, "r.t1.0")
	call(b, "r.t2.0")
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	call(b, "r.t3.0") // a's close left the code b holds open
	if n := codes(); n != 1 {
		t.Fatalf("%d shared codes while b is loaded, want 1", n)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := codes(); n != 0 {
		t.Fatalf("%d shared codes after the last plugin of the file closed, want 0", n)
	}
	c := load("c", Sandbox{})
	if c.code == a.code {
		t.Fatal("a load after every plugin of the file closed found the closed code")
	}
	call(c, "r.t4.0")
}
