// Package plugincatalog names the plugins this repository builds and where
// `make plugins` puts them, in one place for everything that looks them up:
// the tests (through conformance), `agenthost bench`, and the layout the
// Makefile writes (every directory under examples/plugins and
// conformance/plugins, built under one name).
package plugincatalog

import "path/filepath"

// The conformance plugins, by the name of their directory under
// conformance/plugins (and of their file under DIR/conformance/).
const (
	Builder  = "builder"
	Executor = "executor"
	SlowJob  = "slowjob"
	Hostile  = "hostile"
	// Scripted is the Wasm twin of conformance.ScriptedModel and
	// conformance.ScriptedTools.
	Scripted = "scripted"
	// Broken loads, but breaks the ABI in the ways the plugin ABI check
	// must catch.
	Broken = "broken"
	// KernelProbe is a well-behaved executor that also exports probe, an
	// interpreter of raw Extism kernel calls, for the differential test of
	// the host's call paths.
	KernelProbe = "kernelprobe"
)

// Conformance lists every conformance plugin.
var Conformance = []string{Builder, Executor, SlowJob, Hostile, Scripted, Broken, KernelProbe}

// The example plugins `agenthost bench` loads, by the name of their
// directory under examples/plugins (and of their file under DIR/).
const (
	PromptBuilder = "prompt-builder"
	ScriptedModel = "scripted-model"
	Calculator    = "calculator"
	SlowJobTool   = "slow-job"
	// CalculatorC is the C calculator (examples/plugins/calculator-c),
	// which `make plugins-c` builds, not `make plugins`: it needs clang.
	CalculatorC = "calculator-c"
	// PromptBuilderC is the C build of the prompt builder (`make
	// plugins-c`): the same requests as the Go build, which the examples'
	// differential test holds it to, at a small part of the guest's CPU.
	PromptBuilderC = "prompt-builder-c"
	// ScriptedModelC is the C build of the scripted model (`make
	// plugins-c`): the same replies as the Go build, which the examples'
	// differential test holds it to.
	ScriptedModelC = "scripted-model-c"
	// SlowJobToolC is the C build of slow-job (`make plugins-c`): the same
	// replies and KV records as the Go build, which the examples'
	// differential test holds it to.
	SlowJobToolC = "slow-job-c"
)

// Guests names which build of the example plugins a bench loads.
type Guests string

const (
	// GuestsGo loads the Go builds (`make plugins`).
	GuestsGo Guests = "go"
	// GuestsC loads the C builds (`make plugins-c`) in place of the
	// plugins that have one (the prompt builder, the scripted model, the
	// calculator and slow-job); the others stay Go.
	GuestsC Guests = "c"
	// DefaultGuests is the build a bench loads unless told otherwise, and
	// "" stands for it: the one config.example.yaml and `make run` load.
	DefaultGuests = GuestsC
)

// cBuilds maps each example plugin that has a C build to it.
var cBuilds = map[string]string{
	PromptBuilder: PromptBuilderC,
	ScriptedModel: ScriptedModelC,
	Calculator:    CalculatorC,
	SlowJobTool:   SlowJobToolC,
}

// Build returns the name under the plugins directory of the build of
// example plugin name that g loads ("" is DefaultGuests): name itself for
// GuestsGo and for a plugin with no C build, its C build's for GuestsC.
func Build(name string, g Guests) string {
	if g == "" {
		g = DefaultGuests
	}
	if c, ok := cBuilds[name]; ok && g == GuestsC {
		return c
	}
	return name
}

// Bench lists, as paths relative to the plugins directory without the
// .wasm suffix, every plugin some `agenthost bench` command loads.
var Bench = []string{
	PromptBuilder, ScriptedModel, Calculator, SlowJobTool,
	PromptBuilderC, ScriptedModelC, CalculatorC, SlowJobToolC,
	ConformanceName(Builder), ConformanceName(Executor), ConformanceName(Scripted), ConformanceName(Hostile),
}

// ConformanceDir is where the conformance plugins go under the plugins
// directory: a conformance plugin's name there is ConformanceDir+NAME.
const ConformanceDir = "conformance/"

// ConformanceName is a conformance plugin's name relative to the plugins
// directory: conformance/NAME.
func ConformanceName(name string) string { return ConformanceDir + name }

// Path is where `make plugins` (`make plugins-c` for the C builds) puts
// the plugin named rel (a name of Bench) under the plugins directory dir.
func Path(dir, rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)+".wasm") }
