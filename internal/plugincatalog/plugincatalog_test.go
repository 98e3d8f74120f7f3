package plugincatalog

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Every name the catalog gives is a directory `make plugins` builds: an
// example under examples/plugins, or a conformance plugin under
// conformance/plugins; and Conformance lists every conformance plugin.
func TestNamesAreTheDirectoriesMakePluginsBuilds(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, rel := range Bench {
		dir := filepath.Join(root, "examples", "plugins", rel)
		if name, ok := strings.CutPrefix(rel, "conformance/"); ok {
			dir = filepath.Join(root, "conformance", "plugins", name)
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Errorf("bench plugin %q: no directory %s that make plugins builds", rel, dir)
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "conformance", "plugins"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "internal" {
			dirs = append(dirs, e.Name())
		}
	}
	got := slices.Sorted(slices.Values(Conformance))
	if !slices.Equal(got, dirs) {
		t.Errorf("Conformance lists %v, conformance/plugins holds %v", got, dirs)
	}
}

// Build gives the C build for GuestsC where there is one, and the plugin
// itself otherwise.
func TestBuildNamesTheCBuilds(t *testing.T) {
	for _, c := range []struct {
		name string
		g    Guests
		want string
	}{
		{PromptBuilder, GuestsGo, PromptBuilder},
		{PromptBuilder, GuestsC, PromptBuilderC},
		{ScriptedModel, GuestsC, ScriptedModelC},
		{ScriptedModel, GuestsGo, ScriptedModel},
		{ScriptedModel, "", ScriptedModelC},
		{SlowJobTool, GuestsC, SlowJobToolC},
		{SlowJobTool, GuestsGo, SlowJobTool},
		{Calculator, GuestsC, CalculatorC},
		{Calculator, GuestsGo, Calculator},
		{ConformanceName(Builder), GuestsC, ConformanceName(Builder)},
	} {
		if got := Build(c.name, c.g); got != c.want {
			t.Errorf("Build(%q, %q) = %q, want %q", c.name, c.g, got, c.want)
		}
	}
}
