package abi

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
)

// The Decode functions turn the bytes a plugin wrote into a checked value.
// They decode the way ABI v1 says a payload is read: the reply must be one
// JSON object; an unknown field is ignored; a missing field takes its zero
// value; a field of the wrong JSON type is an error that names the field.
// Then they run the matching Validate function. On any error they return
// the zero value and a *FieldError wrapping ErrInvalidReply (or an error
// wrapping ErrInvalidArgument when the caller passed a bad kind, export or
// role).
//
// encoding/json matches field names without regard to case; plugins must
// still send them in lower case, exactly as docs/ABI.md spells them.

// DecodeDescribe decodes and validates a describe reply (see
// ValidateDescribe).
func DecodeDescribe(data []byte, wantRole Role) (Describe, error) {
	if err := checkWantRole("DecodeDescribe", wantRole); err != nil {
		return Describe{}, err
	}
	var d Describe
	if err := (checker{reply: ExportDescribe + " reply"}).decodeObject("", data, &d); err != nil {
		return Describe{}, err
	}
	if err := ValidateDescribe(d, wantRole); err != nil {
		return Describe{}, err
	}
	return d, nil
}

// DecodeBuildOutput decodes and validates a build reply (see
// ValidateBuildOutput).
func DecodeBuildOutput(data []byte) (BuildOutput, error) {
	var o BuildOutput
	if err := (checker{reply: ExportBuild + " reply"}).decodeObject("", data, &o); err != nil {
		return BuildOutput{}, err
	}
	if err := ValidateBuildOutput(o); err != nil {
		return BuildOutput{}, err
	}
	return o, nil
}

// DecodeEffectReply decodes and validates the reply of export (start, poll
// or attach) for an effect of the given kind (see ValidateEffectReply).
func DecodeEffectReply(data []byte, kind EffectKind, export string) (EffectReply, error) {
	// Check the arguments first, so that a caller's bug is not reported as
	// the plugin's.
	if err := checkKind("DecodeEffectReply", kind); err != nil {
		return EffectReply{}, err
	}
	if err := checkEffectExport("DecodeEffectReply", export); err != nil {
		return EffectReply{}, err
	}
	var r EffectReply
	if err := (checker{reply: export + " reply"}).decodeObject("", data, &r); err != nil {
		return EffectReply{}, err
	}
	if err := ValidateEffectReply(r, kind, export); err != nil {
		return EffectReply{}, err
	}
	return r, nil
}

// DecodeCancelReply decodes and validates a cancel reply for an effect of
// the given kind (see ValidateCancelReply).
func DecodeCancelReply(data []byte, kind EffectKind) (CancelReply, error) {
	if err := checkKind("DecodeCancelReply", kind); err != nil {
		return CancelReply{}, err
	}
	var r CancelReply
	if err := (checker{reply: ExportCancel + " reply"}).decodeObject("", data, &r); err != nil {
		return CancelReply{}, err
	}
	if err := ValidateCancelReply(r, kind); err != nil {
		return CancelReply{}, err
	}
	return r, nil
}

// DecodeModelOutcome decodes and validates the outcome of a done model
// effect, such as EffectReply.Outcome (see ValidateModelOutcome). A
// missing or null outcome is an error.
func DecodeModelOutcome(raw json.RawMessage) (ModelOutcome, error) {
	c := checker{reply: "model outcome"}
	if absent(raw) {
		return ModelOutcome{}, c.errf("", "is missing; a done model effect carries {\"message\": {…}}")
	}
	return c.decodeModelOutcome("", raw)
}

// DecodeToolOutcome decodes the outcome of a done tool effect, such as
// EffectReply.Outcome: a JSON object {"content": "…", "is_error": false}.
// A missing or null outcome is an error.
func DecodeToolOutcome(raw json.RawMessage) (ToolOutcome, error) {
	c := checker{reply: "tool outcome"}
	if absent(raw) {
		return ToolOutcome{}, c.errf("", "is missing; a done tool effect carries {\"content\": \"…\"}")
	}
	return c.decodeToolOutcome("", raw)
}

// decodeObject unmarshals one JSON object into v, and turns a JSON error
// into a FieldError that names the field at path.
func (c checker) decodeObject(path string, data []byte, v any) error {
	t := trimSpace(data)
	if len(t) == 0 {
		what := "is empty"
		if path == "" {
			what += "; write the reply with Extism's output"
		}
		return c.errf(path, "%s", what)
	}
	lead := int64(len(data) - len(trimLeft(data)))
	if t[0] != '{' {
		var value json.RawMessage
		if err := json.Unmarshal(t, &value); err != nil {
			var syntaxErr *json.SyntaxError
			if errors.As(err, &syntaxErr) {
				return &FieldError{Reply: c.reply, Field: path, Problem: "is not valid JSON (want a JSON object): " +
					syntaxErr.Error() + " " + syntaxContext(data, lead+syntaxErr.Offset, isEOF(syntaxErr)), Cause: err}
			}
			return c.errf(path, "is not valid JSON; want a JSON object %s", syntaxContext(data, lead, false))
		}
		return c.errf(path, "is %s; want a JSON object", jsonKind(t))
	}
	err := json.Unmarshal(t, v)
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return &FieldError{Reply: c.reply, Field: join(path, typeErr.Field),
			Problem: "is a JSON " + typeErr.Value + "; want " + jsonTypeOf(typeErr.Type), Cause: err}
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return &FieldError{Reply: c.reply, Field: path, Problem: "is not valid JSON: " + syntaxErr.Error() + " " +
			syntaxContext(data, lead+syntaxErr.Offset, isEOF(syntaxErr)), Cause: err}
	}
	return &FieldError{Reply: c.reply, Field: path, Problem: "does not decode: " + err.Error(), Cause: err}
}

// syntaxContext says where in data a JSON error lies: "(at byte 17 of 42:
// …"{\"abi\": fa" ⟨here⟩ " lse}"…)". Offset counts the bytes read before
// the error, as json.SyntaxError does. The excerpt is quoted, so control
// bytes and invalid UTF-8 show as escapes.
//
// eof says the reply ended too soon: the mark then stands after its last
// byte.
func syntaxContext(data []byte, offset int64, eof bool) string {
	const span = 24
	n := int64(len(data))
	if offset < 0 {
		offset = 0
	}
	if offset > n {
		offset = n
	}
	// The byte that stopped the decoder is the last one it read.
	at := offset - 1
	if eof || at < 0 {
		at = offset
	}
	from, to := at-span, at+span
	if from < 0 {
		from = 0
	}
	if to > n {
		to = n
	}
	before, after := "", ""
	if from > 0 {
		before = "…"
	}
	if to < n {
		after = "…"
	}
	pos := fmt.Sprintf("at byte %d of %d", at+1, n)
	if at >= n {
		pos = fmt.Sprintf("at the end, after byte %d", n)
	}
	return fmt.Sprintf("(%s: %s%s ⟨here⟩ %s%s)", pos, before, strconv.Quote(string(data[from:at])), strconv.Quote(string(data[at:to])), after)
}

func isEOF(e *json.SyntaxError) bool { return e.Error() == "unexpected end of JSON input" }

func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// jsonTypeOf names the JSON type a Go field of type t takes.
func jsonTypeOf(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer (" + t.Kind().String() + ")"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return jsonTypeOf(t.Elem())
	default:
		return "another type"
	}
}
