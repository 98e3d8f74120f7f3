package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
)

// How `agenthost reload` reaches a running serve: serve writes its process
// ID to pid_file, and the outcome of each reload to the status file beside
// it (config.ReloadStatusFile); reload sends SIGHUP to the process and
// waits for the status file to say how the reload it asked for went.

// reloadStatus is the status file: the outcome of the last reload of the
// serve of PID (Seq 0 is the start, before any reload).
type reloadStatus struct {
	PID     int      `json:"pid"`
	Seq     int64    `json:"seq"`
	Result  string   `json:"result"` // started, applied or refused
	Error   string   `json:"error,omitempty"`
	Changes []string `json:"changes,omitempty"`
	At      string   `json:"at"`
}

// writePIDFile writes this process's ID to path, making its directory if
// need be.
func writePIDFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("pid_file %s: %w", path, err)
	}
	if err := writeFileAtomic(path, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return fmt.Errorf("pid_file %s: %w", path, err)
	}
	return nil
}

// removePIDFile removes the PID file and the status file, when they are
// still this process's.
func removePIDFile(cfg *config.Config) {
	if pid, err := readPIDFile(cfg.PIDFile); err == nil && pid == os.Getpid() {
		_ = os.Remove(cfg.PIDFile)
		_ = os.Remove(cfg.ReloadStatusFile())
	}
}

func readPIDFile(path string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s holds no process ID (%q)", path, strings.TrimSpace(string(raw)))
	}
	return pid, nil
}

// writeReloadStatus writes st to the status file of cfg.
func writeReloadStatus(cfg *config.Config, st reloadStatus) error {
	st.PID, st.At = os.Getpid(), time.Now().UTC().Format(time.RFC3339Nano)
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return writeFileAtomic(cfg.ReloadStatusFile(), append(raw, '\n'))
}

func readReloadStatus(path string) (reloadStatus, error) {
	var st reloadStatus
	raw, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(raw, &st)
}

// writeFileAtomic writes data to path through a temporary file renamed
// over it, so that a reader sees the old content or the new, whole.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func newReloadCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Make the running serve read its config again and apply it",
		Long: `reload sends SIGHUP to the serve whose process ID is in pid_file (by default
agenthost.pid in data_dir), then waits for it to report how the reload went.

serve reads the config file again and applies it whole, or not at all: tenants
with their tokens, quotas, rate limits and agents; plugins added, removed or
changed (a new file at a plugin's path loads beside the old one, which is
closed once its calls in progress are done); MCP servers. Runs in flight keep
the agent they pinned at creation; new Runs get the new one. A config that
fails a check of the start, or changes a key only a restart applies (listen,
store, data_dir, lease_ttl, http, metrics, log, a plugin's budget, ...), is
refused with the start's error, and the config in force stays.

It reads the config first, as serve will: a file that does not load is
refused with the start's error before the serve is signalled. It prints what
changed, or why the reload was refused, and exits 1 when it was refused. kill -HUP PID (systemd's ExecReload) does the same without the
report; the serve's log and agenthost_config_reloads_total{result} have it.`,
		Example: `  agenthost reload --config /etc/agenthost/agenthost.yaml
  systemctl reload agenthost   # ExecReload=/bin/kill -HUP $MAINPID`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err // the serve would refuse it with this error
			}
			pid, err := readPIDFile(cfg.PIDFile)
			if err != nil {
				return fmt.Errorf("reload: no running serve found: %w (is serve running with this config? pid_file names where it writes its process ID)", err)
			}
			before, err := readReloadStatus(cfg.ReloadStatusFile())
			if err != nil {
				return fmt.Errorf("reload: reading %s: %w (is serve %d running with this config?)", cfg.ReloadStatusFile(), err, pid)
			}
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				return fmt.Errorf("reload: signalling serve %d (from %s): %w", pid, cfg.PIDFile, err)
			}
			deadline := time.Now().Add(timeout)
			for {
				st, err := readReloadStatus(cfg.ReloadStatusFile())
				if err == nil && (st.PID != before.PID || st.Seq > before.Seq) {
					if st.Result != "applied" {
						return fmt.Errorf("reload refused; the config in force stays:\n%s", st.Error)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "reloaded %s (serve %d): %s\n", cfg.File, pid, strings.Join(st.Changes, "; "))
					return nil
				}
				if time.Now().After(deadline) {
					return errors.New("reload: serve was signalled but reported no outcome within --timeout; see its log")
				}
				time.Sleep(50 * time.Millisecond)
			}
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the serve's report (a changed plugin is compiled, MCP servers are connected)")
	return cmd
}
