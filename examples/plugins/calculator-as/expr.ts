// expr.ts: the calculator's evaluator, a port of the Go one
// (examples/plugins/calculator/expr) with its grammar, results and error
// messages:
//
//   expr    = term { ("+" | "-") term }         left-associative
//   term    = unary { ("*" | "/" | "%") unary } left-associative
//   unary   = ("-" | "+") unary | power
//   power   = primary [ "^" unary ]             right-associative
//   primary = number | "(" expr ")"
//   number  = digits [ "." digits ] | "." digits
//
// It reads the expression's UTF-8 bytes, so lengths and positions (1-based)
// count bytes, as in Go and C. Numbers are f64; "%" is the remainder of a
// truncated division (fmod), "^" is C's pow.

import { parseDecimal } from "./number";

export const MAX_LENGTH = 4096; // bytes
export const MAX_DEPTH = 64; // nested parentheses and unary operators

// Result is a value, or an error message when err is not empty.
export class Result {
  value: f64 = 0;
  err: string = "";
}

const END = 0,
  NUM = 1,
  OP = 2;

class Parser {
  src: Uint8Array;
  i: i32 = 0; // next byte to read
  kind: i32 = END;
  op: u8 = 0;
  num: f64 = 0;
  pos: i32 = 0; // 1-based
  depth: i32 = 0;
  err: string = "";

  constructor(src: Uint8Array) {
    this.src = src;
  }

  isDigit(at: i32): bool {
    if (at >= this.src.length) return false;
    const c = this.src[at];
    return c >= 0x30 && c <= 0x39;
  }

  // next reads the next token.
  next(): void {
    const s = this.src;
    while (this.i < s.length && (s[this.i] == 0x20 || s[this.i] == 0x09)) this.i++;
    const pos = this.i + 1;
    if (this.i >= s.length) {
      this.kind = END;
      this.pos = pos;
      return;
    }
    const c = s[this.i];
    if (this.isDigit(this.i) || c == 0x2e) {
      const start = this.i;
      while (this.isDigit(this.i)) this.i++;
      if (this.i < s.length && s[this.i] == 0x2e) {
        this.i++;
        const digits = this.i;
        while (this.isDigit(this.i)) this.i++;
        if (this.i == digits) {
          this.fail("malformed number " + quoteASCII(s, start, this.i) + " at position " + pos.toString() + ": expected a digit after '.'");
          return;
        }
      }
      const lit = s.slice(start, this.i);
      const v = parseDecimal(lit, parseFloat(String.UTF8.decode(lit.buffer)));
      if (v == Infinity) {
        this.fail("number " + quoteASCII(s, start, this.i) + " at position " + pos.toString() + " is too large");
        return;
      }
      this.kind = NUM;
      this.num = v;
      this.pos = pos;
      return;
    }
    if (c == 0x2b || c == 0x2d || c == 0x2a || c == 0x2f || c == 0x25 || c == 0x5e || c == 0x28 || c == 0x29) {
      this.i++;
      this.kind = OP;
      this.op = c;
      this.pos = pos;
      return;
    }
    let what: string;
    if (c >= 0x20 && c < 0x7f) what = "'" + String.fromCharCode(c) + "'";
    else what = "byte 0x" + (c < 0x10 ? "0" : "") + (<u32>c).toString(16);
    this.fail("unexpected character " + what + " at position " + pos.toString());
  }

  // fail keeps the first error and ends the token stream.
  fail(msg: string): void {
    if (this.err.length == 0) this.err = msg;
    this.kind = END;
    this.pos = this.src.length + 1;
  }

  // unexpected describes the current token where it does not fit.
  unexpected(): string {
    if (this.kind == END) return "unexpected end of expression: expected a number or '('";
    if (this.kind == NUM) return "unexpected number at position " + this.pos.toString() + ": expected an operator";
    return "unexpected '" + String.fromCharCode(this.op) + "' at position " + this.pos.toString();
  }

  // isOp returns the current operator when it is one of ops, else 0.
  isOp(ops: string): u8 {
    if (this.err.length != 0 || this.kind != OP) return 0;
    for (let k = 0; k < ops.length; k++) {
      if (<i32>this.op == ops.charCodeAt(k)) return this.op;
    }
    return 0;
  }

  enter(): bool {
    this.depth++;
    if (this.depth > MAX_DEPTH) {
      this.fail("the expression nests deeper than " + MAX_DEPTH.toString() + " levels");
      return false;
    }
    return true;
  }

  expr(): f64 {
    let v = this.term();
    while (true) {
      const op = this.isOp("+-");
      if (op == 0) return v;
      this.next();
      const r = this.term();
      v = op == 0x2b ? v + r : v - r;
    }
  }

  term(): f64 {
    let v = this.unary();
    while (true) {
      const op = this.isOp("*/%");
      if (op == 0) return v;
      const pos = this.pos;
      this.next();
      const r = this.unary();
      if (this.err.length != 0) return 0;
      if (op == 0x2a) {
        v *= r;
      } else if (r == 0) {
        this.fail((op == 0x25 ? "remainder" : "division") + " by zero at position " + pos.toString());
        return 0;
      } else if (op == 0x2f) {
        v /= r;
      } else {
        v = v % r; // fmod: the sign of the dividend
      }
    }
  }

  unary(): f64 {
    const op = this.isOp("+-");
    if (op == 0) return this.power();
    if (!this.enter()) return 0;
    this.next();
    const v = this.unary();
    this.depth--;
    return op == 0x2d ? -v : v;
  }

  power(): f64 {
    const base = this.primary();
    if (this.isOp("^") == 0) return base;
    this.next();
    const e = this.unary();
    return pow(base, e);
  }

  primary(): f64 {
    if (this.err.length != 0) return 0;
    if (this.kind == NUM) {
      const v = this.num;
      this.next();
      return v;
    }
    if (this.kind == OP && this.op == 0x28) {
      if (!this.enter()) return 0;
      const open = this.pos;
      this.next();
      let v: f64 = 0;
      if (this.isOp(")") != 0) {
        this.fail("empty parentheses at position " + open.toString());
      } else {
        v = this.expr();
        if (this.err.length == 0 && this.isOp(")") == 0) {
          if (this.kind == END) this.fail("missing ')' for the '(' at position " + open.toString());
          else this.fail(this.unexpected());
        }
        if (this.err.length == 0) this.next();
      }
      this.depth--;
      return this.err.length != 0 ? 0 : v;
    }
    this.fail(this.unexpected());
    return 0;
  }
}

// pow is C's pow (and Go's math.Pow). AssemblyScript's Math.pow is musl's
// with JavaScript's special cases, where 1^y and (-1)^±Infinity are NaN;
// C99 and Go make them 1 (so "1^(10^400)" is 1 in every calculator).
function pow(x: f64, y: f64): f64 {
  if (x == 1 || (x == -1 && !isFinite(y) && !isNaN(y))) return 1;
  return Math.pow(x, y);
}

// quoteASCII quotes a number literal (digits and '.') as Go's %q does.
function quoteASCII(s: Uint8Array, from: i32, to: i32): string {
  return '"' + String.UTF8.decode(s.slice(from, to).buffer) + '"';
}

// evaluate evaluates the expression src (its UTF-8 bytes).
export function evaluate(src: Uint8Array): Result {
  const r = new Result();
  if (src.length > MAX_LENGTH) {
    r.err = "the expression is " + src.length.toString() + " characters long; the limit is " + MAX_LENGTH.toString();
    return r;
  }
  const p = new Parser(src);
  p.next();
  if (p.err.length == 0 && p.kind == END) {
    r.err = "empty expression";
    return r;
  }
  let v: f64 = 0;
  if (p.err.length == 0) v = p.expr();
  if (p.err.length == 0 && p.kind != END) p.fail(p.unexpected());
  if (p.err.length != 0) {
    r.err = p.err;
  } else if (!isFinite(v) && !isNaN(v)) {
    r.err = "the result is too large";
  } else if (isNaN(v)) {
    r.err = "the result is not a real number";
  } else {
    r.value = v;
  }
  return r;
}
