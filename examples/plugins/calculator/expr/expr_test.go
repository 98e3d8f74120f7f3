package expr

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// Case is one row of testdata/cases.json, the table the Go evaluator and
// the C example are both held to.
type Case struct {
	Expr  string `json:"expr"`
	Want  string `json:"want"`
	Error string `json:"error"`
}

func loadCases(t *testing.T) []Case {
	t.Helper()
	b, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cs []Case
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestEvalTable(t *testing.T) {
	for _, c := range loadCases(t) {
		v, err := Eval(c.Expr)
		switch {
		case c.Error != "":
			if err == nil || err.Error() != c.Error {
				t.Errorf("Eval(%q) = %s, %v; want error %q", c.Expr, Format(v), err, c.Error)
			}
		case err != nil:
			t.Errorf("Eval(%q): %v; want %s", c.Expr, err, c.Want)
		case Format(v) != c.Want:
			t.Errorf("Eval(%q) = %s; want %s", c.Expr, Format(v), c.Want)
		}
	}
}

func TestCheckDoesNotEvaluate(t *testing.T) {
	for _, s := range []string{"2+3", "(2+3)*4", "1/0", "5%0"} {
		if err := Check(s); err != nil {
			t.Errorf("Check(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "2+", "(2", "2 3", "what"} {
		if Check(s) == nil {
			t.Errorf("Check(%q) accepted a malformed expression", s)
		}
	}
}

func TestLimits(t *testing.T) {
	deep := strings.Repeat("(", MaxDepth+1) + "1" + strings.Repeat(")", MaxDepth+1)
	if _, err := Eval(deep); err == nil || !strings.Contains(err.Error(), "nests deeper") {
		t.Errorf("deep nesting: %v", err)
	}
	ok := strings.Repeat("(", MaxDepth) + "1" + strings.Repeat(")", MaxDepth)
	if v, err := Eval(ok); err != nil || v != 1 {
		t.Errorf("nesting at the limit: %v %v", v, err)
	}
	if _, err := Eval(strings.Repeat("-", MaxDepth+1) + "1"); err == nil {
		t.Error("a long run of unary minus passed the depth limit")
	}
	if _, err := Eval(strings.Repeat("1+", MaxLength)); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("over-long expression: %v", err)
	}
}

func TestFormat(t *testing.T) {
	for v, want := range map[float64]string{0: "0", -1: "-1", 1e15: "1e+15", 0.5: "0.5", 123456789: "123456789"} {
		if got := Format(v); got != want {
			t.Errorf("Format(%v) = %q, want %q", v, got, want)
		}
	}
}

func FuzzEval(f *testing.F) {
	for _, s := range []string{"(2+3)*4", "2^3^2", "-(1/0)", "((", "1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Eval(s)
		if err == nil && Check(s) != nil {
			t.Fatalf("Eval(%q) = %v but Check refuses it", s, v)
		}
	})
}
