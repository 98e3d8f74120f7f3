package config

import (
	"errors"
	"os"
	"testing"
)

// FuzzConfig feeds arbitrary bytes to Parse: it must never panic, and
// whatever it refuses it refuses with a *config.Error.
func FuzzConfig(f *testing.F) {
	example, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example),
		minimal,
		"",
		"- a\n- b\n",
		"tenants: [1, 2]\n",
		"plugins: {x: 3}\n",
		"tenants: {a: {tools: {t: {policy: 7}}}}\n",
		"log: {level: [1]}\nretention: 1.5\n",
		"data_dir: !!binary aGVsbG8=\n",
		"1: 2\n",
		"tenants:\n  acme:\n    limits: {max_steps: 1e300}\n",
		"a: &x [*x]\n",
		"store: {driver: postgres, dsn: \"postgres://u:pw@h/db\", postgres: {max_conns: -1, schema: \"X\"}}\n",
		"store: {driver: [1], dsn: 3, postgres: 4}\n",
		"\t\tbad: [\n",
		"tenants:\n  acme:\n    agents:\n      x:\n        output_schema: {type: object, properties: {A: &n {maximum: .nan}}, <<: {b: *n}, 1: [~]}\n",
		"tenants:\n  Acme:\n    agents:\n      X: &x\n        output_schema_file: s.json\n      y: {<<: *x, output_schema: {}}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("a refusal must be a *config.Error with problems, got %T %v", err, err)
			}
			return
		}
		if len(cfg.Tenants) == 0 {
			t.Fatal("a config without tenants was accepted")
		}
		for id, tn := range cfg.Tenants {
			if _, ok := cfg.Plugins[tn.Builder]; !ok {
				t.Fatalf("tenant %s accepted with undeclared builder %q", id, tn.Builder)
			}
		}
	})
}
