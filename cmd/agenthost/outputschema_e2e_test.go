package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
)

// structuredRequest is what TestAnAgentsOutputSchemaReachesTheModel
// reads of one chat-completions request.
type structuredRequest struct {
	Messages []struct {
		Role    string  `json:"role"`
		Content *string `json:"content"`
	} `json:"messages"`
	ResponseFormat *struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	} `json:"response_format"`
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
	var mu sync.Mutex
	var seen []structuredRequest
	model := &chatModel{}
	model.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req structuredRequest
		if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
			http.Error(w, `{"error":{"message":"not a chat completion"}}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen = append(seen, req)
		mu.Unlock()
		content := "It is 21.5 degrees in Paris."
		if last := req.Messages[len(req.Messages)-1]; last.Role == "user" && last.Content != nil && strings.HasPrefix(*last.Content, loop.OutputRetryPrefix) {
			content = answer
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": content}, "finish_reason": "stop"}},
			"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 5},
		})
	}))
	t.Cleanup(model.srv.Close)
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
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("the model server saw %d requests, want 2 (the refused answer, then the JSON)", len(seen))
	}
	for i, req := range seen {
		f := req.ResponseFormat
		if f == nil || f.Type != "json_schema" || f.JSONSchema.Name != "output" || f.JSONSchema.Strict == nil || *f.JSONSchema.Strict {
			t.Fatalf("request %d's response_format: %+v; want json_schema, named output, not strict", i+1, f)
		}
		var got, want any
		_ = json.Unmarshal(f.JSONSchema.Schema, &got)
		_ = json.Unmarshal([]byte(schema), &want)
		if gj, _ := json.Marshal(got); string(gj) != mustJSON(want) {
			t.Errorf("request %d's schema: %s, want %s (keys as the config writes them)", i+1, f.JSONSchema.Schema, schema)
		}
	}
	last := seen[1].Messages[len(seen[1].Messages)-1]
	if last.Content == nil || !strings.Contains(*last.Content, "it is not valid JSON") || !strings.Contains(*last.Content, "The output schema: "+schema) {
		t.Errorf("the second request ends with %+v; want the Loop's message saying why", last)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
