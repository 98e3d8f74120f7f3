package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
)

// responseFormat is what TestAnAgentsOutputSchemaReachesTheModel reads
// of a request's response_format.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

// TestAnAgentsOutputSchemaReachesTheModel: through serve, the example
// prompt-builder and openai plugins, an agent's output_schema (written
// inline in the YAML, in camelCase) reaches an OpenAI-compatible server
// as response_format, keys as written; the server's first answer is not
// JSON, so the model is told why and asked again, and its second answer,
// the JSON, is the Run's result. GET /v1/agents/{name} shows the schema.
func TestAnAgentsOutputSchemaReachesTheModel(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "schema-token"
	const answer = `{"city":"Paris","tempC":21.5}`
	// The model's first answer is prose; to the Loop's request for the
	// schema's JSON, it answers the JSON.
	model := conformance.NewFakeOpenAI(t, agentsAPIKey)
	model.Script(func(req conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		if last := req.Messages[len(req.Messages)-1]; last.Role == "user" && strings.HasPrefix(last.Text(), loop.OutputRetryPrefix) {
			return conformance.OpenAIAnswer{Content: answer}, true
		}
		return conformance.OpenAIAnswer{Content: "It is 21.5 degrees in Paris."}, true
	})
	cfg := agentsConfig(t, dir, token, model, `
      weather:
        instructions: You report the weather.
        model: {plugin: openai}
        output_schema:
          type: object
          properties:
            city: {type: string}
            tempC: {type: number}
          required: [city, tempC]
          additionalProperties: false
`)
	const schema = `{"type":"object","properties":{"city":{"type":"string"},"tempC":{"type":"number"}},"required":["city","tempC"],"additionalProperties":false}`
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)

	var shown httpapi.AgentJSON
	if code, raw, err := c.Do("GET", "/v1/agents/weather", nil, nil, &shown); err != nil || code != http.StatusOK || string(shown.OutputSchema) != schema {
		t.Fatalf("GET /v1/agents/weather: %d %v %s; want the output schema %s", code, err, raw, schema)
	}

	run := c.submitAs(t, "s1", "weather", "What is the weather in Paris?")
	done := c.waitRun(t, run.ID, 60*time.Second, "to end", runView.terminal)
	if done.Status != "completed" || done.Result == nil || done.Result.Content != answer {
		t.Fatalf("the Run: %s, result %+v, failure %+v; want completed with %s", done.Status, done.Result, done.Failure, answer)
	}
	seen := model.Requests()
	if len(seen) != 2 {
		t.Fatalf("the model server saw %d requests, want 2 (the refused answer, then the JSON)", len(seen))
	}
	for i, req := range seen {
		var f responseFormat
		if err := json.Unmarshal(req.ResponseFormat, &f); err != nil || f.Type != "json_schema" || f.JSONSchema.Name != "output" || f.JSONSchema.Strict == nil || *f.JSONSchema.Strict {
			t.Fatalf("request %d's response_format: %s; want json_schema, named output, not strict", i+1, req.ResponseFormat)
		}
		var got, want any
		_ = json.Unmarshal(f.JSONSchema.Schema, &got)
		_ = json.Unmarshal([]byte(schema), &want)
		if gj, _ := json.Marshal(got); string(gj) != mustJSON(want) {
			t.Errorf("request %d's schema: %s, want %s (keys as the config writes them)", i+1, f.JSONSchema.Schema, schema)
		}
	}
	last := seen[1].Messages[len(seen[1].Messages)-1]
	if last.Role != "user" || !strings.Contains(last.Text(), "it is not valid JSON") || !strings.Contains(last.Text(), "The output schema: "+schema) {
		t.Errorf("the second request ends with a %s message %q; want the Loop's message saying why", last.Role, last.Text())
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
