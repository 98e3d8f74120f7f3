package loop

import (
	"errors"
	"strings"
	"testing"
)

func TestIDGrammar(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"run_1", true}, {"A-z_09", true}, {strings.Repeat("a", 64), true},
		{"", false}, {strings.Repeat("a", 65), false}, {"a.b", false}, {"a/b", false},
		{"a b", false}, {"é", false}, {"a#1", false},
	} {
		if got := ValidID(tc.id); got != tc.ok {
			t.Errorf("ValidID(%q) = %v, want %v", tc.id, got, tc.ok)
		}
		if err := CheckID("run", tc.id); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidID)) {
			t.Errorf("CheckID(%q) = %v", tc.id, err)
		}
	}
}

func TestEffectIDsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want EffectRef
	}{
		{ModelEffectID("run_7", 1), EffectRef{Run: "run_7", Kind: "model", Step: 1}},
		{ToolEffectID("run_7", 12, 0), EffectRef{Run: "run_7", Kind: "tool", Step: 12, Index: 0}},
		{ToolEffectID("r", 3, 15), EffectRef{Run: "r", Kind: "tool", Step: 3, Index: 15}},
	} {
		got, err := ParseEffectID(tc.id)
		if err != nil || got != tc.want {
			t.Errorf("ParseEffectID(%q) = %+v, %v; want %+v", tc.id, got, err, tc.want)
		}
	}
	if ModelEffectID("run_7", 1) != "run_7.m1" || ToolEffectID("run_7", 1, 0) != "run_7.t1.0" {
		t.Fatal("effect IDs do not follow <run>.m<step> and <run>.t<step>.<i>")
	}
}

func TestMalformedEffectIDsAreRefused(t *testing.T) {
	for _, id := range []string{"", "run", "run.", "run.m", "run.m0", "run.m01", "run.x1", "run.t1", "run.t1.",
		"run.t0.1", "run.t1.01", "run.t1.-1", "bad id.m1", ".m1", "run.m1x", "run.t1.2.3"} {
		if _, err := ParseEffectID(id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ParseEffectID(%q) = %v, want ErrInvalidID", id, err)
		}
	}
}

func TestAssignmentKeyString(t *testing.T) {
	k := AssignmentKey{Tenant: "acme", Session: "s1", EffectID: "run_7.t1.0", Attempt: 2}
	if k.String() != "acme/s1/run_7.t1.0#2" {
		t.Fatalf("key = %q", k.String())
	}
}

func TestSettleCommandIDDependsOnlyOnEffectAndAttempt(t *testing.T) {
	if SettleCommandID("r.m1", 1) == SettleCommandID("r.m1", 2) || SettleCommandID("r.m1", 1) == SettleCommandID("r.m2", 1) {
		t.Fatal("command IDs collide")
	}
}
