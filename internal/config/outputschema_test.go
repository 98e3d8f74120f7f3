package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// weatherAgents are agents with output schemas: inline, in a file, none,
// and in a file that does not exist.
const weatherAgents = `
tenants:
  Acme:
    builder: b
    agents:
      Weather:
        model: {plugin: openai}
        output_schema:
          type: object
          properties:
            cityName: &text {type: string, maxLength: 80}
            tempC: {type: number, maximum: 60.5, minimum: -90}
            seen: {const: 2024-01-02}
            note: {<<: *text, description: "free text"}
          required: [cityName, tempC]
          additionalProperties: false
      list:
        model: {plugin: openai}
        output_schema_file: answer.json
      plain:
        model: {plugin: openai}
      other:
        model: {plugin: openai}
        output_schema_file: nowhere.json
`

// TestAnAgentsOutputSchemaIsReadAsWritten: an inline output_schema keeps
// the case of its keys (which viper lowercases everywhere else), their
// order, and its YAML anchors and merge keys, as compact JSON; one in a
// JSON file is read beside the config, or where a variable says; an agent
// without one has none.
func TestAnAgentsOutputSchemaIsReadAsWritten(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "answer.json"), []byte("{\n  \"type\": \"array\",\n  \"minItems\": 1\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "other.json"), []byte(`{"type":"string"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Parse(filepath.Join(dir, "agenthost.yaml"), []byte(agentPlugins+weatherAgents))
	if err == nil {
		t.Fatal("want other's missing file refused")
	}
	if text := strings.Join(problems(t, err), "\n"); !strings.Contains(text, "tenants.acme.agents.other.output_schema_file: "+filepath.Join(dir, "nowhere.json")+" does not exist") {
		t.Fatalf("problems:\n%s", text)
	}
	// A variable names the file.
	t.Setenv("AGENTHOST_TENANTS_ACME_AGENTS_OTHER_OUTPUT_SCHEMA_FILE", filepath.Join(dir, "other.json"))
	cfg, err := Parse(filepath.Join(dir, "agenthost.yaml"), []byte(agentPlugins+weatherAgents))
	if err != nil {
		t.Fatal(err)
	}
	agents := cfg.Tenants["acme"].Agents
	for name, want := range map[string]string{
		"weather": `{"type":"object","properties":{"cityName":{"type":"string","maxLength":80},"tempC":{"type":"number","maximum":60.5,"minimum":-90},` +
			`"seen":{"const":"2024-01-02"},"note":{"description":"free text","type":"string","maxLength":80}},"required":["cityName","tempC"],"additionalProperties":false}`,
		"list":  `{"type":"array","minItems":1}`,
		"other": `{"type":"string"}`,
		"plain": ``,
	} {
		if got := string(agents[name].OutputSchema); got != want {
			t.Errorf("%s's output schema:\n%s\nwant\n%s", name, got, want)
		}
	}
	if f := agents["list"].OutputSchemaFile; f != filepath.Join(dir, "answer.json") {
		t.Errorf("list's output_schema_file: %q", f)
	}
}

// TestBadOutputSchemasNameTheirKeys: an output schema that is not a map,
// not JSON, not a schema the Loop can check answers with, or given twice,
// is refused at load, naming its key path, what is wrong and what to do.
func TestBadOutputSchemasNameTheirKeys(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte(`{"type": "object",`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "list.json"), []byte(`["object"]`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Parse(filepath.Join(dir, "agenthost.yaml"), []byte(agentPlugins+`
tenants:
  acme:
    builder: b
    agents:
      text:
        model: {plugin: openai}
        output_schema: '{"type": "object"}'
      remote:
        model: {plugin: openai}
        output_schema: {$ref: "https://example.com/answer.json"}
      typo:
        model: {plugin: openai}
        output_schema: {type: objekt}
      both:
        model: {plugin: openai}
        output_schema: {type: object}
        output_schema_file: answer.json
      broken:
        model: {plugin: openai}
        output_schema_file: broken.json
      list:
        model: {plugin: openai}
        output_schema_file: list.json
      infinite:
        model: {plugin: openai}
        output_schema: {type: number, maximum: .inf}
`))
	text := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		`tenants.acme.agents.text.output_schema: want a map: the JSON Schema (2020-12) the agent's final answer must match`,
		`tenants.acme.agents.remote.output_schema: cannot check the agent's answers: failing loading "https://example.com/answer.json": ` +
			`https://example.com/answer.json is outside the schema: a schema here refers only to itself ("#/$defs/…"); fix the schema (JSON Schema 2020-12)`,
		`tenants.acme.agents.typo.output_schema: cannot check the agent's answers: "#" is not valid against metaschema`,
		`tenants.acme.agents.both.output_schema_file: is set, and so is output_schema: keep one of them`,
		`tenants.acme.agents.broken.output_schema_file: ` + filepath.Join(dir, "broken.json") + ` is not JSON`,
		`tenants.acme.agents.list.output_schema_file: ` + filepath.Join(dir, "list.json") + ` holds no JSON object`,
		`tenants.acme.agents.infinite.output_schema: at /maximum: .inf is not a number JSON can hold`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no problem says %q; got:\n%s", want, text)
		}
	}
}
