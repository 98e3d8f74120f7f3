package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/agenthost/agenthost/loop"
)

// An agent's output_schema is the JSON Schema (2020-12) its Runs' final
// answers must match (loop/output.go). It is written inline, as a YAML
// map under output_schema, or in a JSON file that output_schema_file
// names. The inline map is read from the file as written, not from
// viper's settings: viper lowercases every key, and a schema's keywords
// (additionalProperties, maxLength…) and property names are
// case-sensitive. So no environment variable reaches it.

// outputSchema reads the output schema of agent name of tenant at key k
// (ending in "."), inline or from its file, as compact JSON, and checks
// that the Loop can check answers with it. It returns nil when the agent
// has none, and the absolute path of the file it was read from ("" when
// inline).
func (d *decoder) outputSchema(k, tenant, name string, m map[string]any) (json.RawMessage, string) {
	inline := yamlAt(d.yaml, "tenants", tenant, "agents", name, "output_schema")
	if inline != nil && inline.ShortTag() == "!!null" {
		inline = nil
	}
	file := d.strAt(m, k, "output_schema_file", "")
	var raw json.RawMessage
	key := k + "output_schema"
	switch {
	case inline != nil && file != "":
		d.problem(k+"output_schema_file", "is set, and so is output_schema: keep one of them")
		return nil, ""
	case inline != nil:
		if inline.Kind != yaml.MappingNode {
			d.problem(key, "want a map: the JSON Schema (2020-12) the agent's final answer must match, such as {type: object, properties: {city: {type: string}}, required: [city]}; or name a JSON file of it with output_schema_file")
			return nil, ""
		}
		var b bytes.Buffer
		if err := yamlJSON(&b, inline, "", 0); err != nil {
			d.problem(key, "%v", err)
			return nil, ""
		}
		raw = b.Bytes()
	case file != "":
		key = k + "output_schema_file"
		file = d.path(key, file)
		b, err := readFileUpTo(file, maxSchemaFileBytes)
		switch {
		case errors.Is(err, os.ErrNotExist):
			d.problem(key, "%s does not exist: write the agent's output schema there as JSON, or inline it under output_schema (a relative path is read from the config file's directory)", file)
			return nil, file
		case err != nil:
			d.problem(key, "%s cannot be read: %v", file, err)
			return nil, file
		case len(b) > maxSchemaFileBytes:
			d.problem(key, "%s is over %d bytes: a schema may be at most %d bytes as compact JSON; make it smaller (shared parts can go in \"$defs\")", file, maxSchemaFileBytes, loop.MaxSchemaBytes)
			return nil, file
		}
		var c bytes.Buffer
		if err := json.Compact(&c, b); err != nil {
			d.problem(key, "%s is not JSON (%v): write the schema there as one JSON object", file, err)
			return nil, file
		}
		raw = c.Bytes()
		if !bytes.HasPrefix(raw, []byte("{")) {
			d.problem(key, "%s holds no JSON object: write the schema there as one, such as {\"type\": \"object\"}", file)
			return nil, file
		}
	default:
		return nil, ""
	}
	if _, err := loop.CompileOutputSchema(raw); err != nil {
		d.problem(key, "cannot check the agent's answers: %v; fix the schema (JSON Schema 2020-12)", err)
		return nil, file
	}
	return raw, file
}

// maxSchemaFileBytes bounds what is read of an output_schema_file: its
// compact JSON may be loop.MaxSchemaBytes, and white space can make the
// file larger.
const maxSchemaFileBytes = 1 << 20

// readFileUpTo reads the file at path, or its first n+1 bytes when it is
// longer.
func readFileUpTo(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n+1))
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// yamlAt finds the value at path in the YAML document root, matching
// each key as viper does (case-insensitively, path given in lower case),
// through aliases and merge keys; nil when there is none.
func yamlAt(root *yaml.Node, path ...string) *yaml.Node {
	n := root
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, key := range path {
		if n = yamlValue(n, key, map[*yaml.Node]bool{}); n == nil {
			return nil
		}
	}
	return n
}

// yamlValue is the value of key (lower case) in the mapping n, or in the
// mappings it merges ("<<"), the first of them first; nil when none. It
// looks in each mapping once (visited), however often it is merged.
func yamlValue(n *yaml.Node, key string, visited map[*yaml.Node]bool) *yaml.Node {
	n = yamlDeref(n)
	if n == nil || n.Kind != yaml.MappingNode || visited[n] {
		return nil
	}
	visited[n] = true
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge":
			merged = append(merged, yamlMerged(v)...)
		case k.Kind == yaml.ScalarNode && strings.ToLower(k.Value) == key:
			return yamlDeref(v)
		}
	}
	for _, m := range merged {
		if v := yamlValue(m, key, visited); v != nil {
			return v
		}
	}
	return nil
}

// yamlMerged lists the mappings a merge key's value names: one, or a
// sequence of them.
func yamlMerged(v *yaml.Node) []*yaml.Node {
	v = yamlDeref(v)
	if v != nil && v.Kind == yaml.SequenceNode {
		out := make([]*yaml.Node, 0, len(v.Content))
		for _, c := range v.Content {
			out = append(out, yamlDeref(c))
		}
		return out
	}
	return []*yaml.Node{v}
}

func yamlDeref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 64; i++ {
		n = n.Alias
	}
	return n
}

// yamlJSON writes the YAML value n, at path (a JSON Pointer) in the
// schema, as JSON to b: map keys as written, in their order, merge keys
// applied; a string, a timestamp or binary as its text. It refuses what
// JSON cannot hold, and stops past loop.MaxSchemaBytes or
// loop.MaxSchemaDepth (which the Loop refuses anyway), so that aliases
// cannot make it large.
func yamlJSON(b *bytes.Buffer, n *yaml.Node, path string, depth int) error {
	n = yamlDeref(n)
	where := "at " + path
	if path == "" {
		where = "at the top level"
	}
	switch {
	case n == nil || n.Kind == yaml.AliasNode:
		return fmt.Errorf("%s: an alias that leads nowhere: write the value out", where)
	case b.Len() > loop.MaxSchemaBytes:
		return fmt.Errorf("it is over %d bytes as JSON: make it smaller (shared parts can go in \"$defs\")", loop.MaxSchemaBytes)
	case depth > loop.MaxSchemaDepth:
		return fmt.Errorf("it nests over %d levels deep: make it flatter (shared parts can go in \"$defs\")", loop.MaxSchemaDepth)
	}
	switch n.Kind {
	case yaml.MappingNode:
		keys, values, err := yamlPairs(n, where, map[*yaml.Node]bool{})
		if err != nil {
			return err
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			kj, _ := json.Marshal(k)
			b.Write(kj)
			b.WriteByte(':')
			if err := yamlJSON(b, values[i], path+"/"+pointerEscaper.Replace(k), depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := yamlJSON(b, c, fmt.Sprintf("%s/%d", path, i), depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		var v any = n.Value
		switch n.ShortTag() {
		case "!!null":
			v = nil
		case "!!bool", "!!int", "!!float":
			if err := n.Decode(&v); err != nil {
				return fmt.Errorf("%s: %v", where, err)
			}
		}
		if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
			return fmt.Errorf("%s: %s is not a number JSON can hold: write a finite number", where, n.Value)
		}
		vj, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: %v", where, err)
		}
		b.Write(vj)
	default:
		return fmt.Errorf("%s: a YAML value JSON cannot hold", where)
	}
	return nil
}

// yamlPairs lists the keys of the mapping n in their order, then the
// keys its merge keys bring that it does not set itself, with their
// values. A mapping merged again (visited) brings nothing new, and is
// not read again.
func yamlPairs(n *yaml.Node, where string, visited map[*yaml.Node]bool) (keys []string, values []*yaml.Node, _ error) {
	visited[n] = true
	seen := map[string]bool{}
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge":
			merged = append(merged, yamlMerged(v)...)
		case k.Kind != yaml.ScalarNode:
			return nil, nil, fmt.Errorf("%s: a key that is not text: write each key as a string", where)
		case !seen[k.Value]:
			seen[k.Value] = true
			keys, values = append(keys, k.Value), append(values, v)
		}
	}
	for _, m := range merged {
		if m == nil || m.Kind != yaml.MappingNode {
			return nil, nil, fmt.Errorf("%s: a merge key (<<) that names no map", where)
		}
		if visited[m] {
			continue
		}
		mk, mv, err := yamlPairs(m, where, visited)
		if err != nil {
			return nil, nil, err
		}
		for i, k := range mk {
			if !seen[k] {
				seen[k] = true
				keys, values = append(keys, k), append(values, mv[i])
			}
		}
	}
	return keys, values, nil
}
