package host

import (
	"errors"
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Sentinel errors of loading. Load wraps them with the plugin's name and
// what to do; check them with errors.Is.
var (
	// ErrABIMismatch: the module has no marker of an ABI version this host
	// supports.
	ErrABIMismatch = errors.New("host: ABI version mismatch")
	// ErrImportRefused: the module imports something the host does not
	// offer, or with another wasm type.
	ErrImportRefused = errors.New("host: import refused")
	// ErrExportMissing: an export its role requires is missing or has the
	// wrong wasm type.
	ErrExportMissing = errors.New("host: required export missing")
	// ErrHashMismatch: the file's sha256 is not the pinned one.
	ErrHashMismatch = errors.New("host: sha256 mismatch")
	// ErrDescribe: describe failed, or its reply breaks the ABI or names
	// another role than the caller expects.
	ErrDescribe = errors.New("host: describe refused")
	// ErrClosed: the host or the plugin is closed.
	ErrClosed = errors.New("host: closed")
)

// refusal is an error of this package that wraps others (a sentinel of
// errors.go, an abi.FieldError, …) and renders them under one prefix: the
// "host: " and "abi: " that open the wrapped errors' texts are cut, so that
// a message reads "host: plugin[calc] export[-]: load calc.wasm: import
// refused: …" rather than repeating "host: " at every level. errors.Is and
// errors.As see every wrapped error.
type refusal struct {
	text string
	errs []error
}

func (r *refusal) Error() string   { return r.text }
func (r *refusal) Unwrap() []error { return r.errs }

// refuse is fmt.Errorf, with every %w operand's package prefix cut from
// the text.
func refuse(format string, args ...any) error {
	var errs []error
	for i, a := range args {
		if err, ok := a.(error); ok {
			errs = append(errs, err)
			args[i] = unprefixed{err}
		}
	}
	return &refusal{text: fmt.Sprintf(strings.ReplaceAll(format, "%w", "%v"), args...), errs: errs}
}

// unprefixed renders an error without the package prefixes "host: " and
// "abi: " at its start.
type unprefixed struct{ err error }

func (u unprefixed) Error() string { return cutPrefixes(u.err.Error()) }

func cutPrefixes(s string) string {
	for {
		t, host := strings.CutPrefix(s, "host: ")
		t, abi := strings.CutPrefix(t, "abi: ")
		if !host && !abi {
			return s
		}
		s = t
	}
}

// withArticle renders a role with its indefinite article: "a builder",
// "an executor".
func withArticle(r abi.Role) string {
	if s := string(r); s != "" && strings.ContainsRune("aeiou", rune(s[0])) {
		return "an " + s
	}
	return "a " + string(r)
}
