package loop

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Tool-call arguments are checked against the tool's input_schema (JSON
// Schema 2020-12) when the model's outcome opens the call, before anything
// is dispatched: a call whose arguments fail settles at once as
// invalid_arguments, a tool error the model sees, and the plugin is never
// called. See RATIONALE.md, "Why does the host check tool arguments
// against the schema?" and "Why santhosh-tekuri/jsonschema?".
//
// Both the schema (a plugin's describe reply) and the arguments (a model's
// answer) are untrusted, so the check is bounded and total:
//
//   - a schema loads nothing: every $ref outside the schema document is
//     refused, and so are $dynamicRef and $recursiveRef, whose targets
//     depend on the path taken;
//   - a $ref cycle that does not descend into the instance is refused when
//     the schema is compiled;
//   - the arguments are one JSON object, at most MaxArgumentDepth levels
//     deep, with no key twice in one object (the plugin and the check must
//     read the same value);
//   - before it validates, the check bounds the number of (schema node,
//     argument value) evaluations from the compiled schema's graph and the
//     arguments' shape, and the regular-expression work (string and key
//     bytes times pattern lengths), and refuses arguments over
//     MaxArgumentChecks or MaxArgumentTextWork rather than run;
//   - regular expressions are Go's (RE2, linear time);
//   - a panic in the schema library becomes an error.
//
// The result is a function of the schema bytes and the arguments bytes
// alone (errors are sorted, nothing depends on map order or on the
// cache), so Apply stays deterministic.

// Limits of the argument check.
const (
	// MaxArgumentDepth is how deeply tool-call arguments may nest (the
	// object itself is depth 1).
	MaxArgumentDepth = 64
	// MaxArgumentChecks bounds the schema evaluations one check may need.
	MaxArgumentChecks = 100_000
	// MaxArgumentTextWork bounds the regular-expression work of one check:
	// the bytes of each string (or object key) times the length of each
	// pattern it is matched against.
	MaxArgumentTextWork = 50_000_000
	// MaxSchemaBytes bounds the size of a tool's input_schema, and
	// MaxSchemaDepth how deeply its JSON nests: compiling a schema takes
	// time that grows with both (faster than linearly with the depth).
	MaxSchemaBytes = 64 << 10
	MaxSchemaDepth = 64
	// maxArgumentMessage bounds the text of an invalid_arguments failure.
	maxArgumentMessage = 1024
	// maxCachedSchemas bounds the compiled-schema cache; when it is full it
	// is emptied (the results do not depend on it).
	maxCachedSchemas = 512
)

// schemaURL is the base URL a tool's input_schema is compiled under. It
// resolves nowhere: a $ref to any other document is refused.
const schemaURL = "https://input-schema.agenthost.invalid/tool.json"

// ToolSchema is a compiled JSON Schema under the rules above: a tool's
// input_schema, or an agent's output_schema (output.go), which is
// compiled and bounded the same way. It is safe for concurrent use.
type ToolSchema struct {
	schema *jsonschema.Schema
	// cost[d] bounds the schema evaluations one argument value at depth d
	// (the root object is depth 0) can cause; strCost[d] and keyCost[d]
	// bound the regular-expression work per byte of a string value at
	// depth d and of the keys of an object at depth d.
	cost, strCost, keyCost [MaxArgumentDepth + 1]int64
}

var schemaCache struct {
	sync.Mutex
	m map[[sha256.Size]byte]schemaEntry
}

type schemaEntry struct {
	s   *ToolSchema
	err error
}

// CompileToolSchema compiles a tool's input_schema, or says why it cannot
// be used to check arguments. Results are cached by the schema's bytes.
// host checks every describe reply's schemas with it, so a Run never
// meets a schema that does not compile.
func CompileToolSchema(raw json.RawMessage) (*ToolSchema, error) {
	key := sha256.Sum256(raw)
	schemaCache.Lock()
	e, ok := schemaCache.m[key]
	schemaCache.Unlock()
	if ok {
		return e.s, e.err
	}
	s, err := compileToolSchema(raw)
	schemaCache.Lock()
	if schemaCache.m == nil || len(schemaCache.m) >= maxCachedSchemas {
		schemaCache.m = map[[sha256.Size]byte]schemaEntry{}
	}
	schemaCache.m[key] = schemaEntry{s, err}
	schemaCache.Unlock()
	return s, err
}

// jsonDepth is how deeply the objects and arrays of a JSON text nest,
// counted without decoding it.
func jsonDepth(raw []byte) int {
	depth, max, inString, escaped := 0, 0, false, false
	for _, c := range raw {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			if depth > max {
				max = depth
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return max
}

type refusingLoader struct{}

func (refusingLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s is outside the schema: a schema here refers only to itself (\"#/$defs/…\")", url)
}

func compileToolSchema(raw json.RawMessage) (s *ToolSchema, err error) {
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("the schema library failed on it (%v)", p)
		}
	}()
	if len(raw) > MaxSchemaBytes {
		return nil, fmt.Errorf("it is %d bytes, over the limit of %d: make it smaller (shared parts can go in \"$defs\")", len(raw), MaxSchemaBytes)
	}
	if d := jsonDepth(raw); d > MaxSchemaDepth {
		return nil, fmt.Errorf("it nests %d levels deep, over the limit of %d: make it flatter (shared parts can go in \"$defs\")", d, MaxSchemaDepth)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("it is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refusingLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, errors.New(oneLine(strings.ReplaceAll(err.Error(), schemaURL, "")))
	}
	s = &ToolSchema{schema: sch}
	if err := s.bound(); err != nil {
		return nil, err
	}
	return s, nil
}

// bound computes s.cost from the schema graph: cost[d] is the number of
// paths from the root that take d steps into the instance (a property, an
// item), each schema node weighted by what it compares. Paths that stay
// on one value (allOf, $ref, …) must not cycle.
func (s *ToolSchema) bound() error {
	// Every node reachable from the root, by either kind of edge.
	var nodes []*jsonschema.Schema
	seen := map[*jsonschema.Schema]bool{s.schema: true}
	for q := []*jsonschema.Schema{s.schema}; len(q) > 0; q = q[1:] {
		n := q[0]
		if n.DynamicRef != nil || n.RecursiveRef != nil {
			return fmt.Errorf("it uses $dynamicRef or $recursiveRef (at %s), which a schema here may not", location(n))
		}
		nodes = append(nodes, n)
		for _, c := range append(sameValue(n), descending(n)...) {
			if !seen[c] {
				seen[c] = true
				q = append(q, c)
			}
		}
	}
	// order lists every node after its same-value children; a cycle of
	// same-value edges is refused.
	var order []*jsonschema.Schema
	state := map[*jsonschema.Schema]int{}
	var visit func(n *jsonschema.Schema) error
	visit = func(n *jsonschema.Schema) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("it has a $ref cycle that does not descend into the arguments (at %s): such a schema can never pass", location(n))
		case 2:
			return nil
		}
		state[n] = 1
		for _, c := range sameValue(n) {
			if err := visit(c); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, n)
		return nil
	}
	for _, n := range nodes {
		if err := visit(n); err != nil {
			return err
		}
	}
	s.cost = pathWeights(order, s.schema, weight)
	s.strCost = pathWeights(order, s.schema, stringWeight)
	s.keyCost = pathWeights(order, s.schema, keyWeight)
	return nil
}

// pathWeights sums w over the paths from root that take d steps into the
// instance, for each d. order lists every node after its same-value
// children, so one pass per depth fills that depth.
func pathWeights(order []*jsonschema.Schema, root *jsonschema.Schema, w func(*jsonschema.Schema) int64) [MaxArgumentDepth + 1]int64 {
	var out [MaxArgumentDepth + 1]int64
	prev := map[*jsonschema.Schema]int64{}
	for d := 0; d <= MaxArgumentDepth; d++ {
		cur := make(map[*jsonschema.Schema]int64, len(order))
		for _, n := range order {
			var c int64
			if d == 0 {
				c = w(n)
			}
			for _, k := range sameValue(n) {
				c = satAdd(c, cur[k])
			}
			if d > 0 {
				for _, k := range descending(n) {
					c = satAdd(c, prev[k])
				}
			}
			cur[n] = c
		}
		out[d] = cur[root]
		prev = cur
	}
	return out
}

// stringWeight is what one evaluation of n costs per byte of a string
// value: its pattern's length (RE2 runs in time linear in the input and
// the expression), and one for a length bound (which counts runes).
func stringWeight(n *jsonschema.Schema) int64 {
	var w int64
	if n.Pattern != nil {
		w += int64(len(n.Pattern.String())) + 1
	}
	if n.MinLength != nil || n.MaxLength != nil {
		w++
	}
	return w
}

// keyWeight is what one evaluation of n costs per byte of an object's
// keys: the patternProperties it matches every key against.
func keyWeight(n *jsonschema.Schema) int64 {
	var w int64
	for re := range n.PatternProperties {
		w += int64(len(re.String())) + 1
	}
	return w
}

// location renders where n is in the tool's schema: "#/properties/n".
func location(n *jsonschema.Schema) string { return schemaLocation(n.Location) }

func schemaLocation(url string) string {
	l := strings.TrimPrefix(url, schemaURL)
	if l == "" {
		return "#"
	}
	return l
}

// weight is what one evaluation of n compares, beyond its children: one,
// plus the size of its const and enum values, which it compares the
// value with.
func weight(n *jsonschema.Schema) int64 {
	w := int64(1)
	if n.Enum != nil {
		for _, v := range n.Enum.Values {
			w = satAdd(w, valueSize(v))
		}
	}
	if n.Const != nil {
		w = satAdd(w, valueSize(*n.Const))
	}
	return w
}

// valueSize counts the values in a decoded JSON value.
func valueSize(v any) int64 {
	n := int64(1)
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			n = satAdd(n, valueSize(e))
		}
	case []any:
		for _, e := range v {
			n = satAdd(n, valueSize(e))
		}
	}
	return n
}

const satMax = int64(1) << 50

func satAdd(a, b int64) int64 {
	if a+b > satMax {
		return satMax
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > satMax/b {
		return satMax
	}
	return a * b
}

// sameValue lists the subschemas n applies to the value it is applied to.
func sameValue(n *jsonschema.Schema) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	add := func(ss ...*jsonschema.Schema) {
		for _, s := range ss {
			if s != nil {
				out = append(out, s)
			}
		}
	}
	add(n.Ref, n.Not, n.If, n.Then, n.Else)
	add(n.AllOf...)
	add(n.AnyOf...)
	add(n.OneOf...)
	for _, k := range sortedKeys(n.DependentSchemas) {
		add(n.DependentSchemas[k])
	}
	for _, k := range sortedKeys(n.Dependencies) {
		if s, ok := n.Dependencies[k].(*jsonschema.Schema); ok {
			add(s)
		}
	}
	return out
}

// descending lists the subschemas n applies to the members of the value
// (its properties, property names or items).
func descending(n *jsonschema.Schema) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	add := func(ss ...*jsonschema.Schema) {
		for _, s := range ss {
			if s != nil {
				out = append(out, s)
			}
		}
	}
	for _, k := range sortedKeys(n.Properties) {
		add(n.Properties[k])
	}
	pats := make([]string, 0, len(n.PatternProperties))
	byPat := map[string]*jsonschema.Schema{}
	for re, s := range n.PatternProperties {
		pats = append(pats, re.String())
		byPat[re.String()] = s
	}
	slices.Sort(pats)
	for _, p := range pats {
		add(byPat[p])
	}
	if s, ok := n.AdditionalProperties.(*jsonschema.Schema); ok {
		add(s)
	}
	add(n.PropertyNames, n.UnevaluatedProperties, n.Contains, n.Items2020, n.UnevaluatedItems, n.ContentSchema)
	add(n.PrefixItems...)
	switch it := n.Items.(type) {
	case *jsonschema.Schema:
		add(it)
	case []*jsonschema.Schema:
		add(it...)
	}
	if s, ok := n.AdditionalItems.(*jsonschema.Schema); ok {
		add(s)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// ArgumentsError says why tool-call arguments fail their tool's
// input_schema.
type ArgumentsError struct {
	// Path is the JSON Pointer of the first offending value in the
	// arguments ("" for the arguments as a whole).
	Path string
	// Keyword is the schema location of the rule it breaks, such as
	// "#/properties/n/type"; empty when the arguments are not a JSON object
	// the check can read.
	Keyword string
	// Problem says what is wrong.
	Problem string
	// More counts the other problems found.
	More int
}

func (e *ArgumentsError) Error() string {
	var b strings.Builder
	switch {
	case e.Path != "":
		b.WriteString("at " + e.Path + ": ")
	case e.Keyword != "":
		b.WriteString("at the top level: ")
	}
	b.WriteString(e.Problem)
	if e.Keyword != "" {
		fmt.Fprintf(&b, " (rule %s)", e.Keyword)
	}
	if e.More > 0 {
		fmt.Fprintf(&b, "; and %d more problem(s)", e.More)
	}
	return b.String()
}

// Check validates tool-call arguments (a JSON object; empty or null reads
// as {}) against the schema. It returns nil or an *ArgumentsError.
func (s *ToolSchema) Check(args json.RawMessage) error {
	v, shape, aerr := readArguments(args)
	if aerr != nil {
		return aerr
	}
	leaves, err := s.validate(v, shape, &argumentWords)
	if err != nil || len(leaves) == 0 {
		return err
	}
	first := leaves[0]
	first.More = len(leaves) - 1
	return &first
}

// validate bounds the work of checking v (whose shape readJSON counted)
// against the schema, then checks it. It returns the problems found,
// sorted (problems), or an *ArgumentsError when the check would cost too
// much or the library failed; w words the messages for what v is.
func (s *ToolSchema) validate(v any, shape []depthShape, w *valueWords) (leaves []ArgumentsError, err error) {
	var cost, text int64
	for d, n := range shape {
		cost = satAdd(cost, satMul(n.values, s.cost[d]))
		text = satAdd(text, satAdd(satMul(n.stringBytes, s.strCost[d]), satMul(n.keyBytes, s.keyCost[d])))
	}
	if cost > MaxArgumentChecks {
		return nil, &ArgumentsError{Problem: fmt.Sprintf("checking %s against %s could take up to %d schema evaluations, over the limit of %d: %s", w.them, w.schema, cost, MaxArgumentChecks, w.smaller)}
	}
	if text > MaxArgumentTextWork {
		return nil, &ArgumentsError{Problem: fmt.Sprintf("checking %s strings against %s patterns could take up to %d steps, over the limit of %d: %s", w.their, w.schema, text, MaxArgumentTextWork, w.shorter)}
	}
	defer func() {
		if p := recover(); p != nil {
			leaves, err = nil, &ArgumentsError{Problem: fmt.Sprintf("the schema library failed on %s (%v)", w.them, p)}
		}
	}()
	verr := s.schema.Validate(v)
	if verr == nil {
		return nil, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(verr, &ve) {
		return nil, &ArgumentsError{Problem: verr.Error()}
	}
	return problems(ve, w), nil
}

var printer = message.NewPrinter(language.English)

// problems returns the leaf errors of ve sorted by (instance path,
// schema location, text), so that a message made of them does not depend
// on the order the library visited maps in. Each problem's text is
// bounded; there is at least one.
func problems(ve *jsonschema.ValidationError, w *valueWords) []ArgumentsError {
	var leaves []ArgumentsError
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		if k, ok := e.ErrorKind.(*kind.AdditionalProperties); ok {
			slices.Sort(k.Properties)
		}
		kw := schemaLocation(e.SchemaURL)
		if p := e.ErrorKind.KeywordPath(); len(p) > 0 {
			kw = strings.TrimSuffix(kw, "/") + "/" + strings.Join(p, "/")
			if !strings.HasPrefix(kw, "#") {
				kw = "#" + kw
			}
		}
		leaves = append(leaves, ArgumentsError{Path: pointer(e.InstanceLocation), Keyword: kw,
			Problem: truncateText(e.ErrorKind.LocalizedString(printer), maxArgumentMessage/2)})
	}
	walk(ve)
	if len(leaves) == 0 {
		return []ArgumentsError{{Problem: fmt.Sprintf("%s %s", w.notMatch, w.schema)}}
	}
	slices.SortFunc(leaves, func(a, b ArgumentsError) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		if c := strings.Compare(a.Keyword, b.Keyword); c != 0 {
			return c
		}
		return strings.Compare(a.Problem, b.Problem)
	})
	return leaves
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// pointer renders an instance location as a JSON Pointer.
func pointer(toks []string) string {
	var b strings.Builder
	for _, t := range toks {
		b.WriteByte('/')
		b.WriteString(pointerEscaper.Replace(t))
	}
	return b.String()
}

// oneLine folds the library's indented, multi-line error text into one
// line.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "- ")); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// valueWords word the problems of a check for what is checked: a tool
// call's arguments ("they") or an agent's final answer ("it").
type valueWords struct {
	are, nests, notMatch, them, their string
	schema                            string // the schema, as the message names it
	follows                           string // what the first value is, when something follows it
	once                              string // the advice for a key that appears twice
	smaller, shorter                  string // the advice when the check would cost too much
}

// argumentWords word the problems of tool-call arguments.
var argumentWords = valueWords{
	are: "they are", nests: "they nest", notMatch: "they do not match", them: "them", their: "their",
	schema: "the tool's input_schema", follows: "the object", once: "send it once",
	smaller: "send smaller arguments", shorter: "send shorter strings",
}

// readArguments decodes tool-call arguments into the values the schema
// library reads (numbers as json.Number), and counts the values at each
// depth. It refuses what is not one JSON object, nests deeper than
// MaxArgumentDepth, or repeats a key in one object.
func readArguments(raw json.RawMessage) (any, []depthShape, *ArgumentsError) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		t = []byte("{}")
	}
	v, shape, err := readJSON(t, &argumentWords)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, nil, &ArgumentsError{Problem: "they must be a JSON object (the tool's input)"}
	}
	return v, shape, nil
}

// readJSON decodes one JSON value into the values the schema library
// reads (numbers as json.Number), and counts the values at each depth. It
// refuses what is not one JSON value, nests deeper than MaxArgumentDepth,
// or repeats a key in one object; w words its problems.
func readJSON(t []byte, w *valueWords) (any, []depthShape, *ArgumentsError) {
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	r := argReader{dec: dec, w: w}
	v, err := r.value(0)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = &ArgumentsError{Problem: fmt.Sprintf("%s not one JSON value: something follows %s", w.are, w.follows)}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return v, r.perDepth, nil
}

// depthShape is what the arguments hold at one depth.
type depthShape struct {
	values      int64 // values at this depth
	stringBytes int64 // bytes of the strings among them
	keyBytes    int64 // bytes of the keys of the objects among them
}

type argReader struct {
	dec      *json.Decoder
	w        *valueWords
	perDepth []depthShape
	path     []string
}

// value reads one value at depth; r.path holds the tokens of its JSON
// Pointer, rendered only for an error.
func (r *argReader) value(depth int) (any, *ArgumentsError) {
	fail := func(format string, args ...any) (any, *ArgumentsError) {
		return nil, &ArgumentsError{Path: pointer(r.path), Problem: fmt.Sprintf(format, args...)}
	}
	if depth >= MaxArgumentDepth {
		return fail("%s deeper than %d levels", r.w.nests, MaxArgumentDepth)
	}
	for len(r.perDepth) <= depth {
		r.perDepth = append(r.perDepth, depthShape{})
	}
	r.perDepth[depth].values++
	tok, err := r.dec.Token()
	if err != nil {
		return fail("%s not valid JSON: %v", r.w.are, err)
	}
	switch tok := tok.(type) {
	case json.Delim:
		switch tok {
		case '{':
			obj := map[string]any{}
			for r.dec.More() {
				kt, err := r.dec.Token()
				if err != nil {
					return fail("%s not valid JSON: %v", r.w.are, err)
				}
				k, _ := kt.(string)
				r.perDepth[depth].keyBytes += int64(len(k))
				r.path = append(r.path, k)
				if _, dup := obj[k]; dup {
					return fail("the key %q appears twice in one object; %s", truncateText(k, 64), r.w.once)
				}
				v, aerr := r.value(depth + 1)
				if aerr != nil {
					return nil, aerr
				}
				r.path = r.path[:len(r.path)-1]
				obj[k] = v
			}
			if _, err := r.dec.Token(); err != nil {
				return fail("%s not valid JSON: %v", r.w.are, err)
			}
			return obj, nil
		case '[':
			arr := []any{}
			for i := 0; r.dec.More(); i++ {
				r.path = append(r.path, strconv.Itoa(i))
				v, aerr := r.value(depth + 1)
				if aerr != nil {
					return nil, aerr
				}
				r.path = r.path[:len(r.path)-1]
				arr = append(arr, v)
			}
			if _, err := r.dec.Token(); err != nil {
				return fail("%s not valid JSON: %v", r.w.are, err)
			}
			return arr, nil
		}
		return fail("%s not valid JSON: unexpected %v", r.w.are, tok)
	case string:
		r.perDepth[depth].stringBytes += int64(len(tok))
		return tok, nil
	default:
		return tok, nil
	}
}

// checkArguments settles the verdict of the argument check for one tool
// call: nil when the call may go ahead (the tool declares no schema, or
// the arguments pass), or the failure the call settles with.
func checkArguments(spec ToolSpec, args json.RawMessage) *Failure {
	if absentJSON(spec.InputSchema) {
		return nil
	}
	s, err := CompileToolSchema(spec.InputSchema)
	if err != nil {
		return &Failure{Class: abi.ClassPluginProtocol, Message: truncateText(fmt.Sprintf(
			"tool %s cannot be called: its input_schema cannot check arguments (%v); the plugin's describe reply must be fixed", spec.Name, err), maxArgumentMessage)}
	}
	if err := s.Check(args); err != nil {
		why := "its arguments were refused"
		if ae, ok := err.(*ArgumentsError); ok && ae.Keyword != "" {
			why = "its arguments do not match its input_schema"
		}
		return &Failure{Class: abi.ClassInvalidArguments, Message: truncateText(fmt.Sprintf(
			"tool %s was not called: %s: %v", spec.Name, why, err), maxArgumentMessage)}
	}
	return nil
}

func absentJSON(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}
