/*
 * gostr.h: the few Go string functions the C examples reproduce, so that
 * each C build answers byte for byte as its Go twin: UTF-8 decoding,
 * strings.TrimSpace, strings.ToLower as far as ASCII text can tell,
 * clipping to a number of runes, and strconv.Quote (the %q verb).
 *
 * Every function works on a span (a pointer and a length), so a string
 * need not end in NUL. Include json.h first; single-file, like it (the
 * functions are static inline).
 */
#ifndef AGENTHOST_GOSTR_H
#define AGENTHOST_GOSTR_H

#include <stdio.h>

/* go_utf8_rune decodes the rune at s (n bytes left, at least 1) and sets
 * *size; an invalid byte is rune -1 of size 1, as Go's
 * utf8.DecodeRuneInString gives RuneError. */
static inline long go_utf8_rune(const unsigned char *s, size_t n, size_t *size) {
    unsigned char c = s[0];
    *size = 1;
    if (c < 0x80) return c;
    int len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (len == 0 || (size_t)len > n || c >= 0xF5) return -1;
    long r = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        r = r << 6 | (s[i] & 0x3F);
    }
    if ((len == 3 && r < 0x800) || (len == 4 && (r < 0x10000 || r > 0x10FFFF)) || (r >= 0xD800 && r < 0xE000)) return -1;
    *size = (size_t)len;
    return r;
}

/* go_is_space is Go's unicode.IsSpace, which strings.TrimSpace trims. */
static inline int go_is_space(long r) {
    switch (r) {
    case '\t': case '\n': case '\v': case '\f': case '\r': case ' ':
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return 1;
    }
    return r >= 0x2000 && r <= 0x200A;
}

/* go_trim_space returns the n bytes at s with leading and trailing
 * Unicode white space cut, as [*start, *end): strings.TrimSpace. */
static inline void go_trim_space(const char *s, size_t n, const char **start, const char **end) {
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    size_t size;
    while (p < e && go_is_space(go_utf8_rune(p, (size_t)(e - p), &size))) p += size;
    /* from the end: step back to the start of the last rune */
    while (e > p) {
        const unsigned char *q = e - 1;
        while (q > p && (*q & 0xC0) == 0x80 && e - q < 4) q--;
        long r = go_utf8_rune(q, (size_t)(e - q), &size);
        if (q + size != e) { /* not one whole rune: an invalid byte */
            break;
        }
        if (!go_is_space(r)) break;
        e = q;
    }
    *start = (const char *)p;
    *end = (const char *)e;
}

/* go_is_print approximates Go's strconv.IsPrint for the runes %q must
 * escape: controls, the Unicode spaces other than ' ', and the common
 * format characters. */
static inline int go_is_print(long r) {
    if (r < 0x20 || (r >= 0x7F && r < 0xA0)) return 0;
    if (r != ' ' && go_is_space(r)) return 0;
    if ((r >= 0x200B && r <= 0x200F) || (r >= 0x202A && r <= 0x202E) || (r >= 0x2060 && r <= 0x206F) || r == 0xFEFF ||
        r == 0xAD || (r >= 0xFFF9 && r <= 0xFFFB) || r == 0xFFFE || r == 0xFFFF)
        return 0;
    return 1;
}

/* go_quote writes the n bytes at s as Go's strconv.Quote (the %q verb)
 * would. */
static inline void go_quote(json_buf *j, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    char b[16];
    jb_raw(j, "\"");
    while (p < e) {
        size_t size;
        long r = go_utf8_rune(p, (size_t)(e - p), &size);
        if (r < 0) {
            snprintf(b, sizeof b, "\\x%02x", *p);
            jb_raw(j, b);
        } else if (r == '"' || r == '\\') {
            b[0] = '\\', b[1] = (char)r, b[2] = 0;
            jb_raw(j, b);
        } else if (go_is_print(r)) {
            jb_write(j, (const char *)p, size);
        } else {
            switch (r) {
            case '\a': jb_raw(j, "\\a"); break;
            case '\b': jb_raw(j, "\\b"); break;
            case '\f': jb_raw(j, "\\f"); break;
            case '\n': jb_raw(j, "\\n"); break;
            case '\r': jb_raw(j, "\\r"); break;
            case '\t': jb_raw(j, "\\t"); break;
            case '\v': jb_raw(j, "\\v"); break;
            default:
                if (r < 0x20 || r == 0x7F) snprintf(b, sizeof b, "\\x%02lx", r);
                else if (r < 0x10000) snprintf(b, sizeof b, "\\u%04lx", r);
                else snprintf(b, sizeof b, "\\U%08lx", r);
                jb_raw(j, b);
            }
        }
        p += size;
    }
    jb_raw(j, "\"");
}

/* go_clip writes the n bytes at s as Go's
 *
 *	r := []rune(strings.TrimSpace(s)); if len(r) > max { r = append(r[:max], '…') }; string(r)
 *
 * does: white space trimmed, each invalid byte turned into U+FFFD, and
 * at most max runes, then "…" when there were more. */
static inline void go_clip(json_buf *j, const char *s, size_t n, size_t max) {
    const char *p, *e;
    go_trim_space(s, n, &p, &e);
    for (size_t runes = 0; p < e; runes++) {
        if (runes == max) {
            jb_raw(j, "\xE2\x80\xA6");
            return;
        }
        size_t size;
        if (go_utf8_rune((const unsigned char *)p, (size_t)(e - p), &size) < 0) {
            jb_raw(j, "\xEF\xBF\xBD");
        } else {
            jb_write(j, p, size);
        }
        p += size;
    }
}

/* go_lower writes the n bytes at s lower-cased as far as ASCII text can
 * tell: ASCII letters lowered, and the two runes whose strings.ToLower is
 * ASCII (U+212A KELVIN SIGN to k, U+0130 to i); every other byte as it
 * is. Go lowers other letters too, but never into ASCII, and replaces an
 * invalid byte with U+FFFD, so ASCII words, ASCII digits and the ASCII
 * letters around them are where they are in Go's. */
static inline void go_lower(json_buf *j, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 'A' && c <= 'Z') {
            char l = (char)(c + 'a' - 'A');
            jb_write(j, &l, 1);
        } else if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x84 && (unsigned char)s[i + 2] == 0xAA) {
            jb_raw(j, "k");
            i += 2;
        } else if (c == 0xC4 && i + 1 < n && (unsigned char)s[i + 1] == 0xB0) {
            jb_raw(j, "i");
            i += 1;
        } else {
            jb_write(j, (const char *)&c, 1);
        }
    }
}

/* go_atoi parses [s, e) as strconv.Atoi (and ParseInt(s, 10, 64)) do:
 * an optional sign, then decimal digits, within int64. */
static inline int go_atoi(const char *s, const char *e, long long *out) {
    int neg = 0;
    if (s < e && (*s == '+' || *s == '-')) neg = *s++ == '-';
    if (s == e) return 0;
    unsigned long long v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9') return 0;
        if (v > (9223372036854775808ULL - (unsigned)(*s - '0')) / 10) return 0;
        v = v * 10 + (unsigned)(*s - '0');
    }
    if (!neg && v > 9223372036854775807ULL) return 0;
    *out = neg ? (long long)(0 - v) : (long long)v;
    return 1;
}

/* go_float writes v, positive and finite, as Go writes a float64: the
 * shortest decimal that reads back as v, in plain notation (plain set:
 * strconv.FormatFloat(v, 'f', -1, 64)), or as encoding/json does (plain
 * set to 0): plain from 1e-6 up to 1e21, else in exponent notation with
 * at least one exponent digit after a minus and two after a plus. */
static inline void go_float(json_buf *j, double v, int plain) {
    char b[40];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(b, sizeof b, "%.*e", prec - 1, v);
        if (strtod(b, NULL) == v) break;
    }
    snprintf(b, sizeof b, "%.*e", prec - 1, v);
    /* b is d[.ddd]e±XX */
    char digits[24];
    int nd = 0;
    const char *p = b;
    for (; *p != 'e'; p++) {
        if (*p != '.') digits[nd++] = *p;
    }
    int exp = atoi(p + 1);
    if (!plain && (v < 1e-6 || v >= 1e21)) {
        jb_write(j, digits, 1);
        if (nd > 1) {
            jb_raw(j, ".");
            jb_write(j, digits + 1, (size_t)nd - 1);
        }
        if (exp < 0) {
            snprintf(b, sizeof b, "e-%d", -exp);
        } else {
            snprintf(b, sizeof b, "e+%02d", exp);
        }
        jb_raw(j, b);
        return;
    }
    if (exp < 0) {
        jb_raw(j, "0.");
        for (int z = -1; z > exp; z--) jb_raw(j, "0");
        jb_write(j, digits, (size_t)nd);
    } else if (exp >= nd - 1) {
        jb_write(j, digits, (size_t)nd);
        for (int z = nd - 1; z < exp; z++) jb_raw(j, "0");
    } else {
        jb_write(j, digits, (size_t)exp + 1);
        jb_raw(j, ".");
        jb_write(j, digits + exp + 1, (size_t)(nd - exp - 1));
    }
}

/* go_json_string writes the n bytes at s as a JSON string the way Go's
 * encoding/json does: besides the quote, the backslash and the controls,
 * it escapes <, > and & (\u003c…), U+2028 and U+2029, and writes each
 * invalid byte as \ufffd; so a C example writes the bytes its Go twin
 * writes. */
static inline void go_json_string(json_buf *j, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    jb_raw(j, "\"");
    while (p < e) {
        size_t size;
        long r = go_utf8_rune(p, (size_t)(e - p), &size);
        if (r < 0) {
            jb_raw(j, "\\ufffd");
        } else if (r == '"' || r == '\\') {
            char b[3] = {'\\', (char)r, 0};
            jb_raw(j, b);
        } else if (r == '\n') {
            jb_raw(j, "\\n");
        } else if (r == '\r') {
            jb_raw(j, "\\r");
        } else if (r == '\t') {
            jb_raw(j, "\\t");
        } else if (r < 0x20 || r == '<' || r == '>' || r == '&') {
            char u[7] = {'\\', 'u', '0', '0', hex[r >> 4], hex[r & 15], 0};
            jb_raw(j, u);
        } else if (r == 0x2028 || r == 0x2029) {
            jb_raw(j, r == 0x2028 ? "\\u2028" : "\\u2029");
        } else {
            jb_write(j, (const char *)p, size);
        }
        p += size;
    }
    jb_raw(j, "\"");
}

#endif
