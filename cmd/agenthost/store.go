package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/storecopy"
)

// newStoreCmd is `store`: the commands that work on a store as a whole.
func newStoreCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Work on a store as a whole: copy it to another (Badger ↔ PostgreSQL)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(storecopy.NewCommand(g.explicitConfig))
	return cmd
}

// explicitConfig is the config of --config or $AGENTHOST_CONFIG, or nil
// when neither names one: `store copy` needs no config, and reads the
// tenants and the schema of one only when it is given.
func (g *globals) explicitConfig() (*config.Config, error) {
	if g.config == "" && os.Getenv("AGENTHOST_CONFIG") == "" {
		return nil, nil
	}
	return g.loadConfig()
}
