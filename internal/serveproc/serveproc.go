// Package serveproc runs `agenthost serve` as a child process and speaks
// to it over HTTP: a Child is the process (started on a free port of
// 127.0.0.1, killed, paused, waited for), a Client sends JSON requests
// to a server as one tenant, and TailFile reads the end of a log for
// error messages. The benches that kill or pause the server and the
// command's end-to-end tests share it.
package serveproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Child is an `agenthost serve` child process, for the benches and tests
// that kill or pause the server (chaos) and drive it over HTTP.
type Child struct {
	cmd         *exec.Cmd
	addr        string        // host:port it serves on
	metricsAddr string        // host:port of its /metrics, once printed
	done        chan struct{} // closed when the process has exited
	err         error         // cmd.Wait's, once done
}

// Start starts `bin serve --config cfgPath` on a free port of 127.0.0.1,
// and its /metrics on another, its stderr appended to logPath, and
// returns once it prints its addresses (it may not be ready yet: see
// WaitReady).
func Start(bin, cfgPath, logPath string, timeout time.Duration) (*Child, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", "--config", cfgPath, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	p := &Child{cmd: cmd, done: make(chan struct{})}
	addrc := make(chan [2]string, 1)
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(out)
		var addrs [2]string // the API's, then the metrics'
		for sc.Scan() {
			if _, rest, ok := strings.Cut(sc.Text(), "serving on http://"); ok {
				addrs[0] = strings.Fields(rest)[0]
			}
			if _, rest, ok := strings.Cut(sc.Text(), "metrics on http://"); ok {
				addrs[1] = strings.TrimSuffix(strings.Fields(rest)[0], "/metrics")
			}
			if addrs[0] != "" && addrs[1] != "" {
				once.Do(func() { addrc <- addrs })
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	select {
	case addrs := <-addrc:
		p.addr, p.metricsAddr = addrs[0], addrs[1]
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("agenthost serve exited before serving: %v\n%s", p.err, TailFile(logPath, 40))
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-p.done
		return nil, fmt.Errorf("agenthost serve did not print its address in %s\n%s", timeout, TailFile(logPath, 40))
	}
}

// Addr is the host:port the process serves on.
func (p *Child) Addr() string { return p.addr }

// MetricsAddr is the host:port the process serves /metrics on.
func (p *Child) MetricsAddr() string { return p.metricsAddr }

// Pid is the process's ID.
func (p *Child) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Child) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Exited reports whether the process has exited.
func (p *Child) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the process's exit error (cmd.Wait's) once Exited reports true.
func (p *Child) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// WaitExit waits up to timeout for the process to exit and returns its
// exit code (-1 when killed by a signal).
func (p *Child) WaitExit(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("agenthost serve (pid %d) did not exit within %s", p.cmd.Process.Pid, timeout)
	}
}

// Kill SIGKILLs the process and waits for it to exit.
func (p *Child) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// WaitReady polls /readyz until it answers 200, the process exits, or
// timeout passes.
func (p *Child) WaitReady(timeout time.Duration) error {
	c := NewClient(p.addr, "", 2*time.Second)
	deadline := time.Now().Add(timeout)
	var last string
	for {
		if p.Exited() {
			return fmt.Errorf("agenthost serve exited: %v", p.err)
		}
		code, raw, err := c.Do("GET", "/readyz", nil, nil, nil)
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %v %s", code, err, raw)
		if time.Now().After(deadline) {
			return fmt.Errorf("agenthost serve at %s not ready within %s: %s", p.addr, timeout, last)
		}
		time.Sleep(25 * time.Millisecond) // a poll's cadence, with the deadline above
	}
}

// Client speaks JSON to an agenthost server as one tenant.
type Client struct {
	Base  string       // the server's base URL, "http://host:port"
	Token string       // the tenant's bearer token ("" for none)
	HTTP  *http.Client // the connections, which Clients may share
}

// NewClient returns a Client of the server at addr (host:port) with its
// own connections, each request bounded by timeout.
func NewClient(addr, token string, timeout time.Duration) *Client {
	return &Client{Base: "http://" + addr, Token: token, HTTP: &http.Client{Timeout: timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0, IdleConnTimeout: 30 * time.Second}}}
}

// Do sends a request with a JSON body (when body is not nil) and decodes
// a JSON answer into out (when not nil and the status is 2xx). It returns
// the status and the raw body.
func (c *Client) Do(method, path string, body any, header map[string]string, out any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.Base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, raw, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, raw, fmt.Errorf("decoding %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, raw, nil
}

// TailFile returns the last n lines of a file, for error messages.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
