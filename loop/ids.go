package loop

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strconv"
	"strings"
)

// MaxIDLen is the longest tenant, session or run ID.
const MaxIDLen = 64

// ValidID reports whether s matches [A-Za-z0-9_-]{1,64}, the grammar of
// tenant, session and run IDs.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// CheckID returns an error naming what (for example "session") when id is
// not a valid ID.
func CheckID(what, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: %s %q must match [A-Za-z0-9_-]{1,64}", ErrInvalidID, what, id)
	}
	return nil
}

// ModelEffectID is the EffectID of the model step of a Run: "<run>.m<step>".
func ModelEffectID(run string, step int) string {
	return run + ".m" + strconv.Itoa(step)
}

// ToolEffectID is the EffectID of tool call i of a step: "<run>.t<step>.<i>".
func ToolEffectID(run string, step, i int) string {
	return run + ".t" + strconv.Itoa(step) + "." + strconv.Itoa(i)
}

// ChildRunID is the ID of the child Run that attempt of the agent-tool
// effect effectID starts, and of the child's session: "sub-" and 32
// base-32 characters of the SHA-256 of the assignment. It is a function
// of the attempt alone, so whoever carries the attempt out (the node that
// dispatched it, a node that took its session over, a replay) finds the
// same child instead of starting another. Effect IDs hold their Run's ID,
// which is unique in its tenant, so two attempts never share a child.
func ChildRunID(effectID string, attempt int) string {
	sum := sha256.Sum256([]byte("agenthost child run\x00" + effectID + "#" + strconv.Itoa(attempt)))
	return "sub-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}

// EffectRef is a parsed EffectID.
type EffectRef struct {
	Run   string
	Kind  string // "model" or "tool"
	Step  int
	Index int // tool call index; 0 for a model step
}

// ParseEffectID parses an EffectID made by ModelEffectID or ToolEffectID.
func ParseEffectID(id string) (EffectRef, error) {
	dot := strings.IndexByte(id, '.')
	if dot < 0 {
		return EffectRef{}, fmt.Errorf("%w: effect id %q has no '.'", ErrInvalidID, id)
	}
	ref := EffectRef{Run: id[:dot]}
	if !ValidID(ref.Run) {
		return EffectRef{}, fmt.Errorf("%w: effect id %q: bad run id", ErrInvalidID, id)
	}
	rest := id[dot+1:]
	bad := func() (EffectRef, error) {
		return EffectRef{}, fmt.Errorf("%w: effect id %q is neither <run>.m<step> nor <run>.t<step>.<i>", ErrInvalidID, id)
	}
	if len(rest) < 2 {
		return bad()
	}
	switch rest[0] {
	case 'm':
		n, ok := parseNat(rest[1:])
		if !ok || n < 1 {
			return bad()
		}
		ref.Kind, ref.Step = "model", n
	case 't':
		stepS, idxS, ok := strings.Cut(rest[1:], ".")
		if !ok {
			return bad()
		}
		s, ok1 := parseNat(stepS)
		i, ok2 := parseNat(idxS)
		if !ok1 || !ok2 || s < 1 {
			return bad()
		}
		ref.Kind, ref.Step, ref.Index = "tool", s, i
	default:
		return bad()
	}
	return ref, nil
}

// parseNat parses a canonical decimal natural number (no sign, no leading
// zero), so that every EffectID has exactly one spelling.
func parseNat(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

// AssignmentKey routes an outcome to exactly one effect attempt:
// "<tenant>/<session>/<effect>#<attempt>".
type AssignmentKey struct {
	Tenant   string
	Session  string
	EffectID string
	Attempt  int
}

// String renders the key.
func (k AssignmentKey) String() string {
	return k.Tenant + "/" + k.Session + "/" + k.EffectID + "#" + strconv.Itoa(k.Attempt)
}

// SettleCommandID is the one command ID under which every settlement of an
// (EffectID, attempt) is committed, whoever issues it and whatever the
// outcome (docs/DESIGN.md §5). The store applies the first and makes the rest
// no-ops.
func SettleCommandID(effectID string, attempt int) string {
	return "settle/" + effectID + "#" + strconv.Itoa(attempt)
}
