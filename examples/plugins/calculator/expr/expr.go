// Package expr evaluates arithmetic expressions for the calculator example
// plugin. It is plain Go, so its tests run on the host; the plugin
// (package main, built for wasip1) only wraps it.
//
// # Grammar
//
//	expr    = term { ("+" | "-") term }       left-associative
//	term    = unary { ("*" | "/" | "%") unary } left-associative
//	unary   = ("-" | "+") unary | power
//	power   = primary [ "^" unary ]           right-associative
//	primary = number | "(" expr ")"
//	number  = digits [ "." digits ] | "." digits
//
// So "^" binds tighter than unary minus, as in mathematics: -2^2 is -4,
// 2^-1 is 0.5, and 2^3^2 is 2^(3^2) = 512. "%" is the remainder of a
// truncated division, with the sign of the dividend (-7 % 3 is -1), as in
// Go and C. Spaces and tabs are ignored between tokens. Numbers are
// float64.
//
// # Errors
//
// A malformed expression, a division or remainder by zero, and a result
// that is not a finite number are errors whose message says what went
// wrong and where, by 1-based character position: "unexpected ')' at
// position 7". The C example (examples/plugins/calculator-c) gives the
// same results and messages; the examples' tests hold both to one table.
package expr

import (
	"fmt"
	"math"
	"strconv"
)

// Limits that keep a hostile expression from costing much.
const (
	MaxLength = 4096 // characters
	MaxDepth  = 64   // nested parentheses and unary operators
)

// Eval evaluates an expression and returns its value.
func Eval(s string) (float64, error) {
	if len(s) > MaxLength {
		return 0, fmt.Errorf("the expression is %d characters long; the limit is %d", len(s), MaxLength)
	}
	p := &parser{src: s}
	p.next()
	if p.err != nil {
		return 0, p.err
	}
	if p.tok.kind == tokEnd {
		return 0, fmt.Errorf("empty expression")
	}
	v := p.expr()
	if p.err != nil {
		return 0, p.err
	}
	if p.tok.kind != tokEnd {
		return 0, p.unexpected()
	}
	if math.IsInf(v, 0) {
		return 0, fmt.Errorf("the result is too large")
	}
	if math.IsNaN(v) {
		return 0, fmt.Errorf("the result is not a real number")
	}
	return v, nil
}

// Check reports whether s is a well-formed expression, without evaluating
// it: a division by zero in it is not an error here.
func Check(s string) error {
	if len(s) > MaxLength {
		return fmt.Errorf("the expression is %d characters long; the limit is %d", len(s), MaxLength)
	}
	p := &parser{src: s, noEval: true}
	p.next()
	if p.err == nil && p.tok.kind == tokEnd {
		return fmt.Errorf("empty expression")
	}
	if p.err == nil {
		p.expr()
	}
	if p.err == nil && p.tok.kind != tokEnd {
		p.err = p.unexpected()
	}
	return p.err
}

// Format renders a value the way the calculator answers: an integer
// without a decimal point when it is one (and below 1e15 in magnitude),
// otherwise 15 significant digits, as C's "%.15g" does.
func Format(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		if v == 0 {
			return "0" // not "-0"
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 15, 64)
}

type tokKind int

const (
	tokEnd tokKind = iota
	tokNum
	tokOp // one of + - * / % ^ ( )
)

type token struct {
	kind tokKind
	op   byte
	num  float64
	pos  int // 1-based
}

type parser struct {
	src    string
	i      int // next byte to read
	tok    token
	depth  int
	err    error
	noEval bool
}

// next reads the next token into p.tok.
func (p *parser) next() {
	for p.i < len(p.src) && (p.src[p.i] == ' ' || p.src[p.i] == '\t') {
		p.i++
	}
	pos := p.i + 1
	if p.i >= len(p.src) {
		p.tok = token{kind: tokEnd, pos: pos}
		return
	}
	c := p.src[p.i]
	switch {
	case isDigit(c) || c == '.':
		start := p.i
		for p.i < len(p.src) && isDigit(p.src[p.i]) {
			p.i++
		}
		if p.i < len(p.src) && p.src[p.i] == '.' {
			p.i++
			digits := p.i
			for p.i < len(p.src) && isDigit(p.src[p.i]) {
				p.i++
			}
			if p.i == digits {
				p.fail(fmt.Errorf("malformed number %q at position %d: expected a digit after '.'", p.src[start:p.i], pos))
				return
			}
		}
		v, err := strconv.ParseFloat(p.src[start:p.i], 64)
		if err != nil { // out of range: strconv says so
			p.fail(fmt.Errorf("number %q at position %d is too large", p.src[start:p.i], pos))
			return
		}
		p.tok = token{kind: tokNum, num: v, pos: pos}
	case c == '+' || c == '-' || c == '*' || c == '/' || c == '%' || c == '^' || c == '(' || c == ')':
		p.i++
		p.tok = token{kind: tokOp, op: c, pos: pos}
	default:
		p.fail(fmt.Errorf("unexpected character %s at position %d", quoteChar(p.src, p.i), pos))
	}
}

func (p *parser) fail(err error) {
	if p.err == nil {
		p.err = err
	}
	p.tok = token{kind: tokEnd, pos: len(p.src) + 1}
}

// unexpected describes the current token where it does not fit.
func (p *parser) unexpected() error {
	switch p.tok.kind {
	case tokEnd:
		return fmt.Errorf("unexpected end of expression: expected a number or '('")
	case tokNum:
		return fmt.Errorf("unexpected number at position %d: expected an operator", p.tok.pos)
	default:
		return fmt.Errorf("unexpected '%c' at position %d", p.tok.op, p.tok.pos)
	}
}

func (p *parser) isOp(ops string) (byte, bool) {
	if p.err != nil || p.tok.kind != tokOp {
		return 0, false
	}
	for i := 0; i < len(ops); i++ {
		if p.tok.op == ops[i] {
			return p.tok.op, true
		}
	}
	return 0, false
}

func (p *parser) expr() float64 {
	v := p.term()
	for {
		op, ok := p.isOp("+-")
		if !ok {
			return v
		}
		p.next()
		r := p.term()
		if op == '+' {
			v += r
		} else {
			v -= r
		}
	}
}

func (p *parser) term() float64 {
	v := p.unary()
	for {
		op, ok := p.isOp("*/%")
		if !ok {
			return v
		}
		pos := p.tok.pos
		p.next()
		r := p.unary()
		if p.err != nil {
			return 0
		}
		switch {
		case op == '*':
			v *= r
		case r == 0 && !p.noEval:
			what := "division"
			if op == '%' {
				what = "remainder"
			}
			p.fail(fmt.Errorf("%s by zero at position %d", what, pos))
			return 0
		case op == '/':
			v /= r
		default:
			v = math.Mod(v, r)
		}
	}
}

func (p *parser) unary() float64 {
	op, ok := p.isOp("+-")
	if !ok {
		return p.power()
	}
	if !p.enter() {
		return 0
	}
	defer p.leave()
	p.next()
	v := p.unary()
	if op == '-' {
		return -v
	}
	return v
}

func (p *parser) power() float64 {
	base := p.primary()
	if _, ok := p.isOp("^"); !ok {
		return base
	}
	p.next()
	exp := p.unary()
	return math.Pow(base, exp)
}

func (p *parser) primary() float64 {
	if p.err != nil {
		return 0
	}
	switch {
	case p.tok.kind == tokNum:
		v := p.tok.num
		p.next()
		return v
	case p.tok.kind == tokOp && p.tok.op == '(':
		if !p.enter() {
			return 0
		}
		defer p.leave()
		open := p.tok.pos
		p.next()
		if _, ok := p.isOp(")"); ok {
			p.fail(fmt.Errorf("empty parentheses at position %d", open))
			return 0
		}
		v := p.expr()
		if p.err != nil {
			return 0
		}
		if _, ok := p.isOp(")"); !ok {
			if p.tok.kind == tokEnd {
				p.fail(fmt.Errorf("missing ')' for the '(' at position %d", open))
			} else {
				p.fail(p.unexpected())
			}
			return 0
		}
		p.next()
		return v
	default:
		p.fail(p.unexpected())
		return 0
	}
}

func (p *parser) enter() bool {
	p.depth++
	if p.depth > MaxDepth {
		p.fail(fmt.Errorf("the expression nests deeper than %d levels", MaxDepth))
		return false
	}
	return true
}

func (p *parser) leave() { p.depth-- }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// quoteChar quotes the character at byte i for a message: printable ASCII
// as 'x', anything else as its byte in hex, so the C twin can match.
func quoteChar(s string, i int) string {
	c := s[i]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("'%c'", c)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
