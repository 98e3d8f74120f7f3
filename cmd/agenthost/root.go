package main

import (
	"fmt"
	goruntime "runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

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
committed to an embedded Badger store so that a crash loses nothing that
was accepted. Plugins are WebAssembly modules speaking ABI v1.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCmd())
	return root
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
