package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/bench"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/plugins/abi"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "agenthost",
		Short: "A durable runtime host for AI-agent Runs",
		Long: `agenthost runs AI-agent Runs durably: a builder plugin assembles each model
request, executor plugins call the model and the tools, and every step is
committed to a durable store (embedded Badger, or PostgreSQL with
store.driver postgres) so that a crash loses nothing that was accepted.
Plugins are WebAssembly modules speaking ABI v1.`,
		Example: `  make plugins && agenthost run --config config.example.yaml "What is (2+3)*4?"
  agenthost serve --config config.example.yaml
  AGENTHOST_TOKEN=demo-token agenthost runs list --session s1
  agenthost plugin verify build/plugins/calculator.wasm
  AGENTHOST_DATA_DIR=/tmp/ah agenthost run "What is 2+3?"`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	g := &globals{}
	root.PersistentFlags().StringVar(&g.config, "config", "",
		"the YAML config file (default: $AGENTHOST_CONFIG, else ./agenthost.yaml, else ./config.example.yaml)")
	root.PersistentFlags().StringVar(&g.dataDir, "data-dir", "",
		"the Badger store's directory, overriding data_dir of the config")
	root.AddCommand(newVersionCmd(), newRunCmd(g), newServeCmd(g), newReloadCmd(g), newRunsCmd(g), newStoreCmd(g), newPluginCmd(), bench.NewCommand(version))
	return root
}

// globals are the flags every command shares.
type globals struct {
	config  string
	dataDir string
}

// loadConfig finds and reads the config, with the --data-dir override.
func (g *globals) loadConfig() (*config.Config, error) {
	path := g.config
	if path == "" {
		path = os.Getenv("AGENTHOST_CONFIG")
	}
	if path == "" {
		for _, candidate := range []string{"agenthost.yaml", "config.example.yaml"} {
			if _, err := os.Stat(candidate); err == nil {
				path = candidate
				break
			}
		}
	}
	if path == "" {
		return nil, errors.New("no config: pass --config FILE (or set AGENTHOST_CONFIG); config.example.yaml in the repository is a start")
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if g.dataDir != "" {
		if cfg.Store.Driver == config.DriverPostgres {
			return nil, fmt.Errorf("--data-dir %s names a Badger directory, but the store is %s (store.driver postgres): drop --data-dir, or set store.driver: badger",
				g.dataDir, cfg.StoreLocation())
		}
		abs, err := filepath.Abs(g.dataDir)
		if err != nil {
			return nil, fmt.Errorf("--data-dir %s: %w", g.dataDir, err)
		}
		if cfg.PIDFile == filepath.Join(cfg.DataDir, config.DefaultPIDFile) {
			cfg.PIDFile = filepath.Join(abs, config.DefaultPIDFile) // the default follows data_dir
		}
		cfg.DataDir = abs
	}
	return cfg, nil
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the agenthost version and the plugin ABI it speaks",
		Example: "  agenthost version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agenthost %s (plugin ABI v%d, %s, %s/%s)\n",
				v, abi.Version, goruntime.Version(), goruntime.GOOS, goruntime.GOARCH)
			return nil
		},
	}
}
