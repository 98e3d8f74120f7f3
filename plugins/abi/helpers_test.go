package abi

import (
	"errors"
	"strings"
	"testing"
)

// ok is the want of a case that must be accepted; any other want is the
// JSON path of the field the error must name ("(reply)" for the reply as a
// whole).
const ok = "ok"

// checkVerdict fails t unless err matches want: nil for ok, otherwise a
// *FieldError wrapping ErrInvalidReply, whose message starts with "abi: "
// and which names the field want.
func checkVerdict(t *testing.T, err error, want string) {
	t.Helper()
	if want == ok {
		if err != nil {
			t.Fatalf("rejected a valid reply: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("accepted an invalid reply; want an error naming %s", want)
	}
	if !errors.Is(err, ErrInvalidReply) {
		t.Fatalf("error %q does not wrap ErrInvalidReply", err)
	}
	if errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("error %q blames the caller for the plugin's reply", err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %q is not a *FieldError", err)
	}
	got := fe.Field
	if got == "" {
		got = "(reply)"
	}
	if got != want {
		t.Fatalf("error names field %q, want %q: %v", got, want, err)
	}
	if !strings.HasPrefix(err.Error(), "abi: ") {
		t.Fatalf("message %q does not start with \"abi: \"", err)
	}
	if fe.Field != "" && !strings.Contains(err.Error(), fe.Field) {
		t.Fatalf("message %q does not name the field %q", err, fe.Field)
	}
}
