// number.ts: decimal <-> f64 conversions that round exactly as C's strtod
// and printf("%.15g") (and Go's strconv) do, so that calculator-as answers
// digit for digit what the C and Go calculators answer.
//
// AssemblyScript's own f64.toString prints the shortest round-trip digits
// ("0.30000000000000004"), and its parseFloat keeps 19 digits; both are
// close, not exact. Here every conversion goes through exact big-integer
// arithmetic instead: a double is m * 2^e, an integer times a power of two,
// and a decimal literal is an integer divided by a power of ten.

// ---- a small unsigned big integer: little-endian base-2^32 limbs --------

class Big {
  limbs: Array<u32> = new Array<u32>();

  static of(v: u64): Big {
    const b = new Big();
    while (v != 0) {
      b.limbs.push(<u32>v);
      v >>= 32;
    }
    return b;
  }

  clone(): Big {
    const b = new Big();
    b.limbs = this.limbs.slice(0);
    return b;
  }

  isZero(): bool {
    return this.limbs.length == 0;
  }

  // mulAdd sets this to this*m + a.
  mulAdd(m: u32, a: u32): void {
    let carry: u64 = a;
    for (let i = 0; i < this.limbs.length; i++) {
      const p = <u64>unchecked(this.limbs[i]) * m + carry;
      unchecked((this.limbs[i] = <u32>p));
      carry = p >> 32;
    }
    if (carry != 0) this.limbs.push(<u32>carry);
    this.trim();
  }

  // mulPow5 multiplies this by 5^k.
  mulPow5(k: i32): void {
    while (k >= 13) {
      this.mulAdd(1220703125, 0); // 5^13
      k -= 13;
    }
    let m: u32 = 1;
    for (; k > 0; k--) m *= 5;
    if (m != 1) this.mulAdd(m, 0);
  }

  // mul returns this*o.
  mul(o: Big): Big {
    const r = new Big();
    const n = this.limbs.length,
      k = o.limbs.length;
    if (n == 0 || k == 0) return r;
    for (let i = 0; i < n + k; i++) r.limbs.push(0);
    for (let i = 0; i < n; i++) {
      let carry: u64 = 0;
      const a = <u64>unchecked(this.limbs[i]);
      for (let j = 0; j < k; j++) {
        const p = a * unchecked(o.limbs[j]) + unchecked(r.limbs[i + j]) + carry;
        unchecked((r.limbs[i + j] = <u32>p));
        carry = p >> 32;
      }
      let at = i + k;
      while (carry != 0) {
        const s = <u64>unchecked(r.limbs[at]) + carry;
        unchecked((r.limbs[at] = <u32>s));
        carry = s >> 32;
        at++;
      }
    }
    r.trim();
    return r;
  }

  // shl returns this * 2^k.
  shl(k: i32): Big {
    const r = new Big();
    if (this.isZero()) return r;
    const words = k >> 5,
      bits = k & 31;
    for (let i = 0; i < words; i++) r.limbs.push(0);
    let carry: u32 = 0;
    for (let i = 0; i < this.limbs.length; i++) {
      const v = unchecked(this.limbs[i]);
      r.limbs.push(bits == 0 ? v : (v << bits) | carry);
      carry = bits == 0 ? 0 : v >> (32 - bits);
    }
    if (carry != 0) r.limbs.push(carry);
    return r;
  }

  // divSmall divides this by d in place and returns the remainder.
  divSmall(d: u32): u32 {
    let rem: u64 = 0;
    for (let i = this.limbs.length - 1; i >= 0; i--) {
      const cur = (rem << 32) | unchecked(this.limbs[i]);
      unchecked((this.limbs[i] = <u32>(cur / d)));
      rem = cur % d;
    }
    this.trim();
    return <u32>rem;
  }

  // decimal returns the base-10 digits, most significant first ("0" for zero).
  decimal(): string {
    if (this.isZero()) return "0";
    const t = this.clone();
    const chunks = new Array<u32>();
    while (!t.isZero()) chunks.push(t.divSmall(1000000000));
    let s = chunks[chunks.length - 1].toString();
    for (let i = chunks.length - 2; i >= 0; i--) s += chunks[i].toString().padStart(9, "0");
    return s;
  }

  trim(): void {
    while (this.limbs.length > 0 && this.limbs[this.limbs.length - 1] == 0) this.limbs.pop();
  }
}

function cmp(a: Big, b: Big): i32 {
  const n = a.limbs.length,
    k = b.limbs.length;
  if (n != k) return n < k ? -1 : 1;
  for (let i = n - 1; i >= 0; i--) {
    const x = unchecked(a.limbs[i]),
      y = unchecked(b.limbs[i]);
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

// ---- the parts of a double ----------------------------------------------

const FRAC_MASK: u64 = (<u64>1 << 52) - 1;
const HIDDEN: u64 = <u64>1 << 52;

// mantissa and exponent of a finite x >= 0: x = mant(x) * 2^exp2(x).
function mant(x: f64): u64 {
  const bits = reinterpret<u64>(x);
  const field = (bits >> 52) & 0x7ff;
  return field == 0 ? bits & FRAC_MASK : (bits & FRAC_MASK) | HIDDEN;
}

function exp2(x: f64): i32 {
  const field = <i32>((reinterpret<u64>(x) >> 52) & 0x7ff);
  return field == 0 ? -1074 : field - 1075;
}

// ---- parsing: strtod's answer for a literal of the calculator's grammar --

// Decimal is a literal digits[.digits] as an integer and a count of
// fraction digits: value = digits / 10^scale.
class Decimal {
  digits: Big = new Big();
  scale: i32 = 0;
  scaled5: Big = Big.of(1); // 5^scale, computed once
}

// cmpWith compares d's value with n * 2^p.
function cmpWith(d: Decimal, n: u64, p: i32): i32 {
  // d.digits / 10^s  vs  n * 2^p   <=>   d.digits  vs  n * 5^s * 2^(p+s)
  const rhs = Big.of(n).mul(d.scaled5);
  const q = p + d.scale;
  if (q >= 0) return cmp(d.digits, rhs.shl(q));
  return cmp(d.digits.shl(-q), rhs);
}

// parseDecimal returns the double nearest to the literal s (ASCII digits
// with at most one '.'; ties to even), Infinity when it is too large for
// a double, 0 when it is too small. approx is any estimate of it (within
// a few units in the last place); it is corrected by exact comparison.
export function parseDecimal(s: Uint8Array, approx: f64): f64 {
  const d = new Decimal();
  let chunk: u32 = 0,
    n = 0,
    frac = false;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c == 0x2e) {
      frac = true;
      continue;
    }
    chunk = chunk * 10 + (c - 0x30);
    n++;
    if (frac) d.scale++;
    if (n == 9) {
      d.digits.mulAdd(1000000000, chunk);
      chunk = 0;
      n = 0;
    }
  }
  if (n > 0) {
    let m: u32 = 1;
    for (let i = 0; i < n; i++) m *= 10;
    d.digits.mulAdd(m, chunk);
  }
  d.scaled5.mulPow5(d.scale);
  if (d.digits.isZero()) return 0;

  let x = approx;
  if (!(x >= 0)) x = 0; // NaN or negative: start from 0
  if (x > f64.MAX_VALUE) x = f64.MAX_VALUE;
  // Each step moves x one unit toward the value; the estimate is close,
  // so this ends in a few steps. The bound only guards against a bad one.
  for (let step = 0; step < 4096; step++) {
    const m = mant(x),
      e = exp2(x);
    // The midpoint with the next double up: (2m+1) * 2^(e-1).
    let c = cmpWith(d, 2 * m + 1, e - 1);
    if (c > 0 || (c == 0 && (m & 1) == 1)) {
      x = reinterpret<f64>(reinterpret<u64>(x) + 1); // may become Infinity
      if (c == 0 || x == Infinity) return x;
      continue;
    }
    if (x == 0) return 0;
    // The midpoint with the next double down; at a power of two whose
    // predecessor has a smaller unit: (4m-1) * 2^(e-2).
    if (m == HIDDEN && e > -1074) c = cmpWith(d, 4 * m - 1, e - 2);
    else c = cmpWith(d, 2 * m - 1, e - 1);
    if (c < 0 || (c == 0 && (m & 1) == 1)) {
      x = reinterpret<f64>(reinterpret<u64>(x) - 1);
      if (c == 0) return x;
      continue;
    }
    return x;
  }
  return x;
}

// ---- formatting: printf("%.0f") for integers, printf("%.15g") otherwise --

// format renders a finite value the way every calculator answers: an
// integer without a decimal point when it is one and below 1e15 in
// magnitude, otherwise 15 significant digits as C's "%.15g".
export function format(v: f64): string {
  if (v == Math.trunc(v) && Math.abs(v) < 1e15) {
    if (v == 0) return "0"; // not "-0"
    return (<i64>v).toString();
  }
  return formatG(v, 15);
}

// formatG is C's "%.{prec}g" for a finite v, rounded from the exact
// binary value, ties to even.
export function formatG(v: f64, prec: i32): string {
  let sign = "";
  if (v < 0 || (v == 0 && 1 / v < 0)) {
    sign = "-";
    v = -v;
  }
  if (v == 0) return sign + "0";
  // The exact decimal digits of v = m * 2^e, and the position of the
  // decimal point: value = 0.<digits> * 10^point.
  const m = mant(v),
    e = exp2(v);
  let digits: string;
  let point: i32;
  if (e >= 0) {
    digits = Big.of(m).shl(e).decimal();
    point = digits.length;
  } else {
    // m * 2^e = m * 5^-e / 10^-e
    const b = Big.of(m);
    b.mulPow5(-e);
    digits = b.decimal();
    point = digits.length + e;
  }
  // Round to prec significant digits.
  if (digits.length > prec) {
    const next = digits.charCodeAt(prec);
    let up = next > 0x35;
    if (next == 0x35) {
      let rest = false;
      for (let i = prec + 1; i < digits.length; i++) {
        if (digits.charCodeAt(i) != 0x30) {
          rest = true;
          break;
        }
      }
      up = rest || (digits.charCodeAt(prec - 1) - 0x30) % 2 == 1;
    }
    digits = digits.slice(0, prec);
    if (up) {
      const r = roundUp(digits);
      digits = r;
      if (r.length > prec) {
        digits = r.slice(0, prec);
        point++;
      }
    }
  }
  // Drop trailing zeros (%g without '#').
  let end = digits.length;
  while (end > 1 && digits.charCodeAt(end - 1) == 0x30) end--;
  digits = digits.slice(0, end);

  const x = point - 1; // the decimal exponent
  if (x < -4 || x >= prec) {
    let s = sign + digits.slice(0, 1);
    if (digits.length > 1) s += "." + digits.slice(1);
    const ax = x < 0 ? -x : x;
    return s + (x < 0 ? "e-" : "e+") + (ax < 10 ? "0" : "") + ax.toString();
  }
  if (point <= 0) return sign + "0." + "0".repeat(-point) + digits;
  if (point >= digits.length) return sign + digits + "0".repeat(point - digits.length);
  return sign + digits.slice(0, point) + "." + digits.slice(point);
}

// roundUp adds one to the decimal integer s ("999" -> "1000").
function roundUp(s: string): string {
  let i = s.length - 1;
  while (i >= 0 && s.charCodeAt(i) == 0x39) i--;
  if (i < 0) return "1" + "0".repeat(s.length);
  return s.slice(0, i) + String.fromCharCode(s.charCodeAt(i) + 1) + "0".repeat(s.length - 1 - i);
}
