// Package prompt is the logic of the prompt-builder example: it turns a
// build input into the model request. It is plain Go, so its tests run on
// the host; the plugin (package main, built for wasip1) reads the config
// and wraps it.
package prompt

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Config keys, in lower case: the operator's YAML loader (viper)
// lowercases every key.
const (
	KeySystemPrompt  = "system_prompt"
	KeyHistoryWindow = "history_window"
)

// DefaultSystemPrompt is the system message when the config sets none.
const DefaultSystemPrompt = "You are a careful, concise assistant running on agenthost. " +
	"Use the tools you are offered when they help: use the calculate tool for arithmetic rather than working it out yourself, " +
	"and call independent tools together in one message. When you have the answer, state it plainly."

// DefaultHistoryWindow is how many messages of the session's history the
// request keeps when the config says nothing.
const DefaultHistoryWindow = 20

// Config is the builder's configuration.
type Config struct {
	SystemPrompt  string
	HistoryWindow int // messages of history kept; 0 keeps none
}

// ParseConfig reads the config values through get (the plugin passes
// Extism's config_get). A missing key takes its default; a value that is
// not valid is an error that names the key.
func ParseConfig(get func(key string) (string, bool)) (Config, error) {
	c := Config{SystemPrompt: DefaultSystemPrompt, HistoryWindow: DefaultHistoryWindow}
	if s, ok := get(KeySystemPrompt); ok && strings.TrimSpace(s) != "" {
		c.SystemPrompt = s
	}
	if s, ok := get(KeyHistoryWindow); ok && strings.TrimSpace(s) != "" {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return Config{}, fmt.Errorf("prompt-builder: config %s: %q is not a whole number of messages (0 or more); set it to, for example, %d", KeyHistoryWindow, s, DefaultHistoryWindow)
		}
		c.HistoryWindow = n
	}
	return c, nil
}

// Build makes the model request: the system message, the last
// HistoryWindow messages of the session's history, the Run's transcript,
// and the Run's tools. A window that would begin with tool results whose
// calls were cut off drops them, since a model API refuses a tool result
// with no call before it.
//
// The system message is the Run's agent's instructions when it has some,
// else the config's system_prompt; the agent's settings (a JSON object)
// become the request's params as they are, for the model executor, and
// its output schema, when it has one, the param output_schema
// (abi.ParamOutputSchema), over any setting of that name. An input
// without an agent (from a host older than agents) builds as before.
func Build(c Config, in abi.BuildInput) abi.BuildOutput {
	system := c.SystemPrompt
	var params map[string]any
	if a := in.Agent; a != nil {
		if a.Instructions != "" {
			system = a.Instructions
		}
		// Settings the host sends are a JSON object; anything else is
		// left out rather than failing the step.
		_ = json.Unmarshal(a.Settings, &params)
		var schema map[string]any
		if json.Unmarshal(a.OutputSchema, &schema) == nil && schema != nil {
			if params == nil {
				params = map[string]any{}
			}
			params[abi.ParamOutputSchema] = schema
		}
	}
	msgs := make([]abi.Message, 0, 1+c.HistoryWindow+len(in.Transcript))
	msgs = append(msgs, abi.Message{Role: abi.MessageSystem, Content: system})
	msgs = append(msgs, Window(in.History, c.HistoryWindow)...)
	msgs = append(msgs, in.Transcript...)
	return abi.BuildOutput{Request: abi.ModelRequest{Messages: msgs, Tools: in.Tools, Params: params}}
}

// Window returns the last n messages of history, less any tool messages at
// its start.
func Window(history []abi.Message, n int) []abi.Message {
	if n <= 0 {
		return nil
	}
	if len(history) > n {
		history = history[len(history)-n:]
	}
	for len(history) > 0 && history[0].Role == abi.MessageTool {
		history = history[1:]
	}
	return history
}
