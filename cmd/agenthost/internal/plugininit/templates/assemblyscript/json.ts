// json.ts: a small JSON reader and writer, enough for ABI v1 payloads.
//
// parse checks a whole document (RFC 8259) and builds a tree of Values;
// strings are decoded to UTF-8 bytes (\u escapes included; a lone
// surrogate becomes U+FFFD, as Go's encoding/json does). Duplicate keys:
// the last one wins, as in Go. Nesting deeper than MAX_DEPTH is refused as
// malformed, so a hostile input cannot exhaust the stack. quote writes a
// JSON string.

export const MAX_DEPTH = 512;

export enum Kind {
  Null,
  Bool,
  Number,
  String,
  Array,
  Object,
}

export class Value {
  kind: Kind = Kind.Null;
  num: f64 = 0;
  isInt: bool = false; // a number written without fraction or exponent
  bytes: Uint8Array = new Uint8Array(0); // a string's UTF-8
  keys: Array<string> = new Array<string>();
  values: Array<Value> = new Array<Value>(); // members, or an array's items

  constructor(kind: Kind) {
    this.kind = kind;
  }

  // get returns the member key of an object, or null when this is not an
  // object or has no such member.
  get(key: string): Value | null {
    if (this.kind != Kind.Object) return null;
    for (let i = this.keys.length - 1; i >= 0; i--) {
      if (this.keys[i] == key) return this.values[i];
    }
    return null;
  }

  // text returns a string's value, or null when this is not a string.
  text(): string | null {
    if (this.kind != Kind.String) return null;
    return String.UTF8.decode(this.bytes.buffer);
  }
}

// isNull: missing or null.
export function isNull(v: Value | null): bool {
  return v === null || v.kind == Kind.Null;
}

class Parser {
  s: Uint8Array;
  i: i32 = 0;
  depth: i32 = 0;

  constructor(s: Uint8Array) {
    this.s = s;
  }

  ws(): void {
    while (this.i < this.s.length) {
      const c = this.s[this.i];
      if (c != 0x20 && c != 0x09 && c != 0x0a && c != 0x0d) return;
      this.i++;
    }
  }

  peek(): i32 {
    return this.i < this.s.length ? <i32>this.s[this.i] : -1;
  }

  literal(word: string, v: Value): Value | null {
    for (let k = 0; k < word.length; k++) {
      if (this.peek() != word.charCodeAt(k)) return null;
      this.i++;
    }
    return v;
  }

  value(): Value | null {
    this.ws();
    const c = this.peek();
    if (c == 0x7b || c == 0x5b) {
      if (++this.depth > MAX_DEPTH) return null;
      const v = c == 0x7b ? this.object() : this.array();
      this.depth--;
      return v;
    }
    if (c == 0x22) return this.string();
    if (c == 0x2d || (c >= 0x30 && c <= 0x39)) return this.number();
    if (c == 0x74) {
      const v = new Value(Kind.Bool);
      v.num = 1;
      return this.literal("true", v);
    }
    if (c == 0x66) return this.literal("false", new Value(Kind.Bool));
    if (c == 0x6e) return this.literal("null", new Value(Kind.Null));
    return null;
  }

  object(): Value | null {
    const v = new Value(Kind.Object);
    this.i++; // {
    this.ws();
    if (this.peek() == 0x7d) {
      this.i++;
      return v;
    }
    while (true) {
      this.ws();
      if (this.peek() != 0x22) return null;
      const k = this.string();
      if (k === null) return null;
      this.ws();
      if (this.peek() != 0x3a) return null;
      this.i++;
      const m = this.value();
      if (m === null) return null;
      v.keys.push(String.UTF8.decode(k.bytes.buffer));
      v.values.push(m);
      this.ws();
      const c = this.peek();
      this.i++;
      if (c == 0x7d) return v;
      if (c != 0x2c) return null;
    }
  }

  array(): Value | null {
    const v = new Value(Kind.Array);
    this.i++; // [
    this.ws();
    if (this.peek() == 0x5d) {
      this.i++;
      return v;
    }
    while (true) {
      const item = this.value();
      if (item === null) return null;
      v.values.push(item);
      this.ws();
      const c = this.peek();
      this.i++;
      if (c == 0x5d) return v;
      if (c != 0x2c) return null;
    }
  }

  digits(): i32 {
    const from = this.i;
    while (this.peek() >= 0x30 && this.peek() <= 0x39) this.i++;
    return this.i - from;
  }

  number(): Value | null {
    const from = this.i;
    let isInt = true;
    if (this.peek() == 0x2d) this.i++;
    if (this.peek() == 0x30) {
      this.i++;
    } else if (this.digits() == 0) {
      return null;
    }
    if (this.peek() == 0x2e) {
      this.i++;
      isInt = false;
      if (this.digits() == 0) return null;
    }
    if (this.peek() == 0x65 || this.peek() == 0x45) {
      this.i++;
      isInt = false;
      if (this.peek() == 0x2b || this.peek() == 0x2d) this.i++;
      if (this.digits() == 0) return null;
    }
    const v = new Value(Kind.Number);
    v.isInt = isInt;
    v.num = parseFloat(String.UTF8.decode(this.s.slice(from, this.i).buffer));
    return v;
  }

  hex4(): i32 {
    if (this.i + 4 > this.s.length) return -1;
    let r = 0;
    for (let k = 0; k < 4; k++) {
      const c = <i32>this.s[this.i + k];
      let d = -1;
      if (c >= 0x30 && c <= 0x39) d = c - 0x30;
      else if (c >= 0x61 && c <= 0x66) d = c - 0x61 + 10;
      else if (c >= 0x41 && c <= 0x46) d = c - 0x41 + 10;
      if (d < 0) return -1;
      r = (r << 4) | d;
    }
    this.i += 4;
    return r;
  }

  string(): Value | null {
    this.i++; // "
    const out = new Array<u8>();
    while (true) {
      if (this.i >= this.s.length) return null;
      const c = this.s[this.i++];
      if (c == 0x22) break;
      if (c < 0x20) return null;
      if (c != 0x5c) {
        out.push(c);
        continue;
      }
      if (this.i >= this.s.length) return null;
      const e = this.s[this.i++];
      if (e == 0x22 || e == 0x5c || e == 0x2f) out.push(e);
      else if (e == 0x62) out.push(0x08);
      else if (e == 0x66) out.push(0x0c);
      else if (e == 0x6e) out.push(0x0a);
      else if (e == 0x72) out.push(0x0d);
      else if (e == 0x74) out.push(0x09);
      else if (e == 0x75) {
        let cp = this.hex4();
        if (cp < 0) return null;
        if (cp >= 0xd800 && cp < 0xdc00) {
          // a high surrogate: a low one must follow, or it is U+FFFD
          let lo = -1;
          if (this.i + 1 < this.s.length && this.s[this.i] == 0x5c && this.s[this.i + 1] == 0x75) {
            const at = this.i;
            this.i += 2;
            lo = this.hex4();
            if (lo < 0) return null;
            if (lo < 0xdc00 || lo >= 0xe000) {
              this.i = at; // not a pair: read that escape on its own
              lo = -1;
            }
          }
          cp = lo < 0 ? 0xfffd : 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
          cp = 0xfffd;
        }
        utf8(out, cp);
      } else return null;
    }
    const v = new Value(Kind.String);
    const b = new Uint8Array(out.length);
    for (let k = 0; k < out.length; k++) b[k] = out[k];
    v.bytes = b;
    return v;
  }
}

function utf8(out: Array<u8>, cp: i32): void {
  if (cp < 0x80) {
    out.push(<u8>cp);
  } else if (cp < 0x800) {
    out.push(<u8>(0xc0 | (cp >> 6)));
    out.push(<u8>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push(<u8>(0xe0 | (cp >> 12)));
    out.push(<u8>(0x80 | ((cp >> 6) & 0x3f)));
    out.push(<u8>(0x80 | (cp & 0x3f)));
  } else {
    out.push(<u8>(0xf0 | (cp >> 18)));
    out.push(<u8>(0x80 | ((cp >> 12) & 0x3f)));
    out.push(<u8>(0x80 | ((cp >> 6) & 0x3f)));
    out.push(<u8>(0x80 | (cp & 0x3f)));
  }
}

// parse reads one JSON document, with nothing but white space after it;
// null when it is malformed.
export function parse(s: Uint8Array): Value | null {
  const p = new Parser(s);
  const v = p.value();
  if (v === null) return null;
  p.ws();
  return p.i == s.length ? v : null;
}

const HEX = "0123456789abcdef";

// quote writes s as a JSON string.
export function quote(s: string): string {
  let out = '"';
  let from = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let esc = "";
    if (c == 0x22) esc = '\\"';
    else if (c == 0x5c) esc = "\\\\";
    else if (c == 0x0a) esc = "\\n";
    else if (c == 0x0d) esc = "\\r";
    else if (c == 0x09) esc = "\\t";
    else if (c < 0x20) esc = "\\u00" + HEX.charAt(c >> 4) + HEX.charAt(c & 15);
    else continue;
    out += s.slice(from, i) + esc;
    from = i + 1;
  }
  return out + s.slice(from) + '"';
}
