package examples_test

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/examples/plugins/calculator/expr"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

// calculatorAS is the calculator on Extism's AssemblyScript PDK, built by
// its build.sh with npm (conformance.BuildExampleWasm).
const calculatorAS = "calculator-as"

// The AssemblyScript calculator gives the same answers and errors as the
// Go and C ones, on the same table.
func TestCalculatorAS(t *testing.T) { testCalculator(t, calculatorAS) }

// randomExpression returns an expression for the cross-checks: mostly
// well formed (numbers of every size, decimals, operators, parentheses,
// spaces), sometimes a soup of tokens that is not.
func randomExpression(r *rand.Rand) string {
	number := func() string {
		switch r.Intn(8) {
		case 0:
			return strconv.Itoa(r.Intn(10))
		case 1:
			return strconv.Itoa(r.Intn(100000))
		case 2:
			return fmt.Sprintf("%d.%d", r.Intn(1000), r.Intn(1000000))
		case 3:
			return "." + strconv.Itoa(r.Intn(1000))
		case 4: // 16 to 40 digits: beyond what a double holds exactly
			var b strings.Builder
			for n := 16 + r.Intn(25); n > 0; n-- {
				b.WriteByte(byte('0' + r.Intn(10)))
			}
			if r.Intn(2) == 0 {
				s := b.String()
				i := 1 + r.Intn(len(s)-1)
				return s[:i] + "." + s[i:]
			}
			return b.String()
		case 5: // a tiny or a huge one
			if r.Intn(2) == 0 {
				return "0." + strings.Repeat("0", r.Intn(330)) + strconv.Itoa(1+r.Intn(99999))
			}
			return strconv.Itoa(1+r.Intn(9)) + strings.Repeat(strconv.Itoa(r.Intn(10)), 300+r.Intn(20))
		default:
			return strconv.FormatFloat(r.Float64()*math.Pow(10, float64(r.Intn(30)-15)), 'f', -1, 64)
		}
	}
	if r.Intn(5) == 0 {
		toks := []string{"(", ")", "+", "-", "*", "/", "%", "^", " ", ".", "1.", "x", "é", "\t", "0", number()}
		var b strings.Builder
		for n := r.Intn(8); n > 0; n-- {
			b.WriteString(toks[r.Intn(len(toks))])
		}
		return b.String()
	}
	var gen func(depth int) string
	gen = func(depth int) string {
		if depth <= 0 || r.Intn(3) == 0 {
			s := number()
			if r.Intn(6) == 0 {
				s = "-" + s
			}
			return s
		}
		switch r.Intn(4) {
		case 0:
			return "(" + gen(depth-1) + ")"
		case 1:
			return "-" + gen(depth-1)
		default:
			ops := "+-*/%^"
			sp := []string{"", " "}[r.Intn(2)]
			return gen(depth-1) + sp + string(ops[r.Intn(len(ops))]) + sp + gen(depth-1)
		}
	}
	return gen(1 + r.Intn(5))
}

// The AssemblyScript calculator answers digit for digit what the C one
// answers, on random expressions: the same results (strtod's rounding of
// every literal, printf's "%.15g" of every result, musl's pow and fmod)
// and the same errors. And what the Go one answers, wherever Go's math.Pow
// is not involved (it can differ from musl's in the last bit).
func TestCalculatorASMatchesCAndGo(t *testing.T) {
	e := newEnv(t)
	as := e.executor(t, calculatorAS, nil)
	c := e.executor(t, calculatorC, nil)
	ctx := context.Background()
	answer := func(x *host.Executor, i int, s string) abi.ToolOutcome {
		return tool(t)(x.Start(ctx, toolCall("run_1.t1.0", i, "calculate", map[string]string{"expression": s})))
	}
	// Where AssemblyScript's own library differs from C's and Go's: its
	// pow (JavaScript's special cases), its shortest-digits toString and
	// its 19-digit parseFloat; then random expressions.
	fixed := []string{
		"1^(10^400)", "(-1)^(10^400)", "(-1)^-(10^400)", "1^((-8)^0.5)", "0^0", "(0-0)^0.5", "(-0)^-1",
		"0.1+0.2", "0.1*3", "1e5", "2^53+1", "9007199254740993", "9007199254740993.0001",
		"123456789012345678901234567890", "0.30000000000000004441", "1/3*3", "2/3", "1000000000000000", "999999999999999.5",
		"1000000000000005", "1000000000000015", "1000000000000025", "-1000000000000035", "0.000001", "0.0000001234", "0.00001", "0.0001", "123456789012345.6", "1234567890123456.7", "5e-324", "." + strings.Repeat("0", 323) + "4940656458412465441765687928682213723651",
		"2^-1074", "2^-1075", "2^1023*1.9999999999999998", "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497791",
		"179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792",
		"2+é", "2+\x01", strings.Repeat("(", 64) + "1" + strings.Repeat(")", 64), strings.Repeat("(", 65) + "1" + strings.Repeat(")", 65),
		strings.Repeat("-", 65) + "1", strings.Repeat("1", 4097), "0." + strings.Repeat("3", 4094),
	}
	r := rand.New(rand.NewSource(1))
	n := 3000
	if testing.Short() || raceEnabled {
		n = 300
	}
	for i := 1; i <= len(fixed)+n; i++ {
		var s string
		if i <= len(fixed) {
			s = fixed[i-1]
		} else {
			s = randomExpression(r)
		}
		got, want := answer(as, i, s), answer(c, i, s)
		if got != want && !(strings.HasPrefix(got.Content, "error: number ") && strings.HasPrefix(want.Content, "error: number ")) {
			t.Errorf("%q: calculator-as %+v, calculator-c %+v", s, got, want)
		}
		if strings.Contains(s, "^") {
			continue
		}
		v, err := expr.Eval(s)
		gw := abi.ToolOutcome{Content: expr.Format(v)}
		if err != nil {
			gw = abi.ToolOutcome{Content: "error: " + err.Error(), IsError: true}
		}
		if got != gw {
			t.Errorf("%q: calculator-as %+v, Go's expr %+v", s, got, gw)
		}
	}
}
