package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:]))
}

// execute runs the CLI and returns the process's exit code: 0 for success,
// the code of an *exitError, or 1 for any other error.
func execute(args []string) int {
	cmd := newRootCmd()
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(os.Stderr, "agenthost:", ee.msg)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "agenthost:", err)
	return 1
}

// Exit codes of `agenthost run` beyond 0 (completed) and 1 (an error, or
// a Run that failed or was cancelled).
const (
	exitFailed  = 1
	exitWaiting = 2
)

// exitError ends the process with code after printing msg (when set) on
// stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }
