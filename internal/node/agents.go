package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// VersionPrefix begins every agent version.
const VersionPrefix = "v-"

// versionHexDigits is how many hex digits of the hash a version keeps:
// 48 bits, enough that two definitions of one agent do not collide.
const versionHexDigits = 12

// agentDefinition is what an agent's version is the hash of: everything
// that decides how its Runs run, resolved (the tools as their plugins
// describe them, or their MCP servers list them, with the config's
// overrides applied), with each plugin named by its ID and the sha256 of
// its file (an MCP server by "mcp/NAME", without a hash). Its JSON is deterministic:
// struct fields in order, map keys sorted, tools sorted by name. A
// plugin's own config (its config_get values) is not in it: it is the
// plugin's, not the agent's, and may hold secrets that rotate. The output
// schema is left out when the agent has none, so that adding it changed
// no version of an agent without one.
type agentDefinition struct {
	Description     string           `json:"description"`
	Instructions    string           `json:"instructions"`
	Settings        map[string]any   `json:"settings"`
	OutputSchema    json.RawMessage  `json:"output_schema,omitempty"`
	Builder         pluginIdentity   `json:"builder"`
	Model           pluginIdentity   `json:"model"`
	Tools           []toolDefinition `json:"tools"`
	Limits          loop.Limits      `json:"limits"`
	RunTimeoutMS    int64            `json:"run_timeout_ms"`
	WaitTimeoutMS   int64            `json:"wait_timeout_ms,omitempty"` // absent (0: no bound) keeps the versions of before it existed
	EffectTimeoutMS int64            `json:"effect_timeout_ms"`
	ModelPolicy     loop.Policy      `json:"model_policy"`
	HistoryRuns     int              `json:"history_runs"`
}

type pluginIdentity struct {
	ID     string `json:"id"`
	SHA256 string `json:"sha256"`
}

type toolDefinition struct {
	Descriptor abi.Tool       `json:"descriptor"`
	Spec       loop.ToolSpec  `json:"spec"`
	Executor   pluginIdentity `json:"executor"`
}

// AgentVersion returns the version of agent a as wired (ra): VersionPrefix
// and the first hex digits of the sha256 of its resolved definition
// (agentDefinition). The same config and plugin files give the same
// version on every node and at every start; a change of anything in the
// definition gives another. sha256Of returns a plugin's file hash;
// sources[i] is the plugin of ra.Tools[i]. It fails only for settings
// that are not JSON.
func AgentVersion(a config.Agent, ra *runtime.Agent, sha256Of func(plugin string) string, sources []string) (string, error) {
	def := agentDefinition{
		Description: a.Description, Instructions: a.Instructions, Settings: a.Settings, OutputSchema: a.OutputSchema,
		Builder: pluginIdentity{ID: a.Builder, SHA256: sha256Of(a.Builder)},
		Model:   pluginIdentity{ID: a.Model, SHA256: sha256Of(a.Model)},
		Limits:  ra.Limits, RunTimeoutMS: ra.RunTimeout.Milliseconds(), WaitTimeoutMS: ra.WaitTimeout.Milliseconds(), EffectTimeoutMS: ra.EffectTimeout.Milliseconds(),
		ModelPolicy: ra.ModelPolicy, HistoryRuns: ra.HistoryRuns,
		Tools: make([]toolDefinition, 0, len(ra.Tools)),
	}
	for i, tl := range ra.Tools {
		var executor pluginIdentity // none for an agent tool: its Spec names the agent
		if sources[i] != "" {
			executor = pluginIdentity{ID: sources[i], SHA256: sha256Of(sources[i])}
		}
		def.Tools = append(def.Tools, toolDefinition{Descriptor: tl.Descriptor, Spec: tl.Spec, Executor: executor})
	}
	slices.SortFunc(def.Tools, func(x, y toolDefinition) int { return strings.Compare(x.Spec.Name, y.Spec.Name) })
	raw, err := json.Marshal(def)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(raw)
	return VersionPrefix + hex.EncodeToString(sum[:])[:versionHexDigits], nil
}

// agentJSON is agent a, wired as ra, as the API shows it; sources[i] is
// the plugin of ra.Tools[i].
func agentJSON(a config.Agent, ra *runtime.Agent, sources []string) httpapi.AgentJSON {
	j := httpapi.AgentJSON{
		Name: a.Name, Version: ra.Version, Description: a.Description, Instructions: a.Instructions,
		Builder: a.Builder, Model: httpapi.AgentModelJSON{Plugin: a.Model, Settings: ra.Settings}, OutputSchema: ra.OutputSchema,
		Tools: make([]httpapi.AgentToolJSON, 0, len(ra.Tools)),
		Limits: httpapi.AgentLimitsJSON{
			MaxSteps: ra.Limits.MaxSteps, MaxToolCallsPerStep: ra.Limits.MaxToolCallsPerStep, MaxParallelToolCalls: ra.Limits.MaxParallelToolCalls,
			RunTimeout: ra.RunTimeout.String(), WaitTimeout: ra.WaitTimeout.String(), EffectTimeout: ra.EffectTimeout.String(),
		},
		HistoryRuns: ra.HistoryRuns,
	}
	for i, tl := range ra.Tools {
		tj := httpapi.AgentToolJSON{Name: tl.Spec.Name, Description: tl.Descriptor.Description, Plugin: sources[i],
			Agent: tl.Spec.Agent, Approval: string(tl.Descriptor.Approval), Idempotent: tl.Descriptor.Idempotent}
		if server, ok := strings.CutPrefix(sources[i], mcpSourcePrefix); ok {
			tj.Plugin, tj.MCP = "", server
		}
		j.Tools = append(j.Tools, tj)
	}
	return j
}

// agentInputSchema is the input schema of every agent tool: the task, in
// words, which becomes the child Run's input.
var agentInputSchema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string","minLength":1,` +
	`"description":"The task for the agent, in words: everything it needs to know, since it sees nothing else of this conversation."}},` +
	`"required":["input"],"additionalProperties":false}`)

// agentTool is the tool through which agent a calls the tenant's agent
// callee (entry names it): named after it, described by its description,
// taking the task as input. The runtime carries its calls out as child
// Runs (runtime/subagent.go). A child is found again by its ID whoever
// carries an attempt out, so the tool is idempotent, and its default
// policy retries.
func agentTool(a config.Agent, entry config.AgentTool, callee config.Agent) runtime.Tool {
	desc := callee.Description
	if desc == "" {
		desc = "Hands a task to the agent " + callee.Name + " and answers with its final answer."
	}
	approval := a.ToolApproval(entry, entry.Agent, abi.ApprovalNever)
	d := abi.Tool{Name: entry.Agent, Description: desc, InputSchema: agentInputSchema, Idempotent: true, Approval: abi.ApprovalNever}
	if approval {
		d.Approval = abi.ApprovalAlways
	}
	return runtime.Tool{Descriptor: d, Spec: loop.ToolSpec{Name: entry.Agent, Approval: approval, Agent: entry.Agent,
		Policy: a.ToolPolicy(entry, entry.Agent, true), InputSchema: agentInputSchema}}
}
