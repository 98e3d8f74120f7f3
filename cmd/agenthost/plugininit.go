package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/plugininit"
)

func newInitCmd() *cobra.Command {
	var lang string
	cmd := &cobra.Command{
		Use:   "init --lang go|c|assemblyscript NAME [DIR]",
		Short: "Write a new tool plugin project (Go, C or AssemblyScript) that builds on its own",
		Long: `init writes a standalone plugin project into DIR (default: NAME, in the
current directory): a tool executor for ABI v1 with one example tool,
word_count, that checks its arguments and answers bad ones with a tool
error (never a trap). Each project has a README, build.sh (its own
toolchain: go; clang with wasi-libc; npm and AssemblyScript) and verify.sh,
which builds it and runs agenthost plugin verify and plugin call on it.
Nothing in the project refers to this repository: the Go one has its own
go.mod, requiring only github.com/extism/go-pdk, with the ABI's types in
abi.go. DIR must not exist, or be empty.`,
		Example: `  agenthost plugin init --lang go word-tools
  agenthost plugin init --lang c word-tools-c ~/src/word-tools-c
  agenthost plugin init --lang assemblyscript word-tools-as && cd word-tools-as && ./verify.sh`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if lang == "" {
				return fmt.Errorf("plugin init: --lang is required: one of %s", strings.Join(plugininit.Languages, ", "))
			}
			name := args[0]
			dir := name
			if len(args) == 2 {
				dir = args[1]
			}
			files, err := plugininit.Write(lang, name, dir)
			if err != nil {
				// One prefix: the command's, not the package's too.
				return fmt.Errorf("plugin init: %s", strings.TrimPrefix(err.Error(), "plugininit: "))
			}
			l, _ := plugininit.Lang(lang)
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "wrote the tool plugin %s (%s) in %s:\n", name, plugininit.DisplayNames[l], dir)
			for _, f := range files {
				fmt.Fprintf(out, "  %s\n", filepath.Join(dir, filepath.FromSlash(f)))
			}
			fmt.Fprintf(out, "next: cd %s && ./verify.sh   (build, then agenthost plugin verify and plugin call; README.md says more)\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&lang, "lang", "", "the language: "+strings.Join(plugininit.Languages, ", "))
	return cmd
}
