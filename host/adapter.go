package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Executor makes an executor plugin a runtime.Executor. Each call runs on
// an instance of the call's tenant, with KV, emit and limits scoped to
// (tenant, plugin, Run, effect).
type Executor struct{ p *Plugin }

// Builder makes a builder plugin a runtime.Builder.
type Builder struct{ p *Plugin }

var (
	_ runtime.Executor = (*Executor)(nil)
	_ runtime.Builder  = (*Builder)(nil)
)

// Executor returns the plugin as a runtime.Executor; it fails unless the
// plugin was loaded as an executor.
func (p *Plugin) Executor() (*Executor, error) {
	if p.spec.Role != abi.RoleExecutor {
		return nil, fmt.Errorf("host: plugin[%s] export[-]: loaded as %s, not an executor: load it with role %q to use it as one", p.name, withArticle(p.spec.Role), abi.RoleExecutor)
	}
	return &Executor{p: p}, nil
}

// Builder returns the plugin as a runtime.Builder; it fails unless the
// plugin was loaded as a builder.
func (p *Plugin) Builder() (*Builder, error) {
	if p.spec.Role != abi.RoleBuilder {
		return nil, fmt.Errorf("host: plugin[%s] export[-]: loaded as %s, not a builder: load it with role %q to use it as one", p.name, withArticle(p.spec.Role), abi.RoleBuilder)
	}
	return &Builder{p: p}, nil
}

// Plugin is the plugin behind the adapter.
func (e *Executor) Plugin() *Plugin { return e.p }

// Plugin is the plugin behind the adapter.
func (b *Builder) Plugin() *Plugin { return b.p }

// Endpoint implements runtime.EndpointNamer: the plugin's name, its ID in
// the config.
func (e *Executor) Endpoint() string { return e.p.name }

// PluginRef implements runtime.PluginReporter: the plugin's name, the
// version its describe declares and its file's sha256.
func (e *Executor) PluginRef() (loop.PluginRef, bool) {
	return loop.PluginRef{Name: e.p.name, Version: e.p.desc.Version, SHA256: e.p.sha256}, true
}

// WaitsForCapacity implements runtime.CapacityWaiter: a call may wait for
// one of the tenant's pool instances, and its timeout starts once it has
// one (Plugin.call).
func (e *Executor) WaitsForCapacity() {}

// WaitsForCapacity implements runtime.CapacityWaiter, as Executor's.
func (b *Builder) WaitsForCapacity() {}

// Start implements runtime.Executor.
func (e *Executor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return e.effect(ctx, abi.ExportStart, c)
}

// Poll implements runtime.Executor.
func (e *Executor) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return e.effect(ctx, abi.ExportPoll, c)
}

// Attach implements runtime.Executor.
func (e *Executor) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return e.effect(ctx, abi.ExportAttach, c)
}

// Cancel implements runtime.Executor.
func (e *Executor) Cancel(ctx context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	_, out, err := e.invoke(ctx, abi.ExportCancel, c)
	if err != nil {
		return abi.CancelReply{}, err
	}
	r, err := abi.DecodeCancelReply(out, c.Input.Effect.Kind)
	if err != nil {
		return abi.CancelReply{}, e.p.pluginErr(abi.ExportCancel, abi.ClassPluginProtocol, refuse("the reply breaks the ABI: %w", err))
	}
	return r, nil
}

func (e *Executor) invoke(ctx context.Context, export string, c runtime.EffectCall) (*callScope, []byte, error) {
	if c.Tenant == "" {
		return nil, nil, fmt.Errorf("host: plugin[%s] export[%s]: the call has no tenant", e.p.name, export)
	}
	in := c.Input
	in.ABI = e.p.info.abiVersion
	b, err := json.Marshal(in)
	if err != nil {
		return nil, nil, fmt.Errorf("host: plugin[%s] export[%s]: encoding the input: %w", e.p.name, export, err)
	}
	s := &callScope{plugin: e.p, export: export, tenant: c.Tenant, session: c.Session, runID: c.RunID, effectID: in.Effect.ID,
		kind: in.Effect.Kind, attempt: in.Effect.Attempt}
	out, err := e.p.call(ctx, s, b)
	return s, out, err
}

func (e *Executor) effect(ctx context.Context, export string, c runtime.EffectCall) (abi.EffectReply, error) {
	s, out, err := e.invoke(ctx, export, c)
	if err != nil {
		return abi.EffectReply{}, err
	}
	r, err := abi.DecodeEffectReply(out, c.Input.Effect.Kind, export)
	if err != nil {
		return abi.EffectReply{}, e.p.pluginErr(export, abi.ClassPluginProtocol, refuse("the reply breaks the ABI: %w", err))
	}
	if r.State == abi.StateFailed {
		if why := s.deniedReason(); why != "" {
			return abi.EffectReply{}, e.p.pluginErr(export, abi.ClassPluginDenied, fmt.Errorf("the sandbox refused %s; the plugin then failed: %w", why, &runtime.PluginMessage{Text: r.Error.Message}))
		}
	}
	return r, nil
}

// Build implements runtime.Builder.
func (b *Builder) Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error) {
	p := b.p
	if tenant == "" {
		return abi.BuildOutput{}, fmt.Errorf("host: plugin[%s] export[%s]: the call has no tenant", p.name, abi.ExportBuild)
	}
	in.ABI = p.info.abiVersion
	raw, err := json.Marshal(in)
	if err != nil {
		return abi.BuildOutput{}, fmt.Errorf("host: plugin[%s] export[%s]: encoding the input: %w", p.name, abi.ExportBuild, err)
	}
	s := &callScope{plugin: p, export: abi.ExportBuild, tenant: tenant, session: in.Run.Session, runID: in.Run.ID}
	out, err := p.call(ctx, s, raw)
	if err != nil {
		return abi.BuildOutput{}, err
	}
	o, err := abi.DecodeBuildOutput(out)
	if err != nil {
		return abi.BuildOutput{}, p.pluginErr(abi.ExportBuild, abi.ClassPluginProtocol, refuse("the reply breaks the ABI: %w", err))
	}
	return o, nil
}

// describe calls describe on a throwaway instance, outside every tenant
// (no KV, no emit), and checks the reply against the expected role.
func (p *Plugin) describe(ctx context.Context) (abi.Describe, error) {
	in, err := p.newInstance(ctx, abi.ExportDescribe)
	if err != nil {
		var pe *runtime.PluginError
		if errors.As(err, &pe) {
			// The guest runtime's initialisation failed: describe could
			// not be called.
			pe.Err = refuse("%w: %w", ErrDescribe, pe.Err)
			return abi.Describe{}, pe
		}
		return abi.Describe{}, fmt.Errorf("host: plugin[%s] export[%s]: %w", p.name, abi.ExportDescribe, err)
	}
	defer in.close(context.WithoutCancel(ctx))
	if p.h.cfg.describing != nil {
		p.h.cfg.describing(p.name)
	}
	raw, _ := json.Marshal(abi.DescribeInput{ABI: p.info.abiVersion})
	s := &callScope{plugin: p, export: abi.ExportDescribe}
	out, _, err := p.run(ctx, in, s, raw)
	if err != nil {
		var pe *runtime.PluginError
		if errors.As(err, &pe) {
			pe.Err = refuse("%w: %w", ErrDescribe, pe.Err)
			return abi.Describe{}, pe
		}
		return abi.Describe{}, refuse("host: plugin[%s] export[%s]: %w: %w", p.name, abi.ExportDescribe, ErrDescribe, err)
	}
	d, err := abi.DecodeDescribe(out, p.spec.Role)
	advice := "fix the plugin's describe reply (docs/ABI.md, \"describe\")"
	switch {
	case err != nil && (errors.Is(err, abi.ErrRoleMismatch) || errors.Is(err, abi.ErrUnsupportedVersion)):
		advice = "" // the abi's message says what to do
	case err == nil && d.ABI != p.info.abiVersion:
		err = fmt.Errorf("describe says abi %d, but the host chose %d from the module's marker", d.ABI, p.info.abiVersion)
		advice = fmt.Sprintf("answer describe with \"abi\": %d, the version of the marker the module exports", p.info.abiVersion)
	case err == nil:
		err = checkToolSchemas(d)
		advice = "fix the tool's input_schema (docs/ABI.md, \"Argument validation\")"
	}
	if err != nil {
		if advice != "" {
			err = refuse("%w: %w: "+strings.ReplaceAll(advice, "%", "%%"), ErrDescribe, err)
		} else {
			err = refuse("%w: %w", ErrDescribe, err)
		}
		return abi.Describe{}, p.pluginErr(abi.ExportDescribe, abi.ClassPluginProtocol, err)
	}
	return d, nil
}

// checkToolSchemas compiles every tool's input_schema the way the Loop
// will to check the model's arguments, so that a schema the check cannot
// use is refused at load rather than failing every call of its tool.
func checkToolSchemas(d abi.Describe) error {
	for i, t := range d.Tools {
		if len(t.InputSchema) == 0 || string(t.InputSchema) == "null" {
			continue
		}
		if _, err := loop.CompileToolSchema(t.InputSchema); err != nil {
			return fmt.Errorf("describe reply: tools[%d].input_schema (tool %s) cannot check arguments: %v", i, t.Name, err)
		}
	}
	return nil
}
