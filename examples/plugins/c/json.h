/*
 * json.h: a tiny JSON reader and writer for C plugins, enough for ABI v1
 * payloads: check a document, find an object's member, decode a string or
 * an integer, and build a reply with escaped strings.
 *
 * Limits (by design; a plugin that needs more should use a real JSON
 * library):
 *   - reading walks the text in place; nothing is built but the strings
 *     json_string returns;
 *   - nesting deeper than JSON_MAX_DEPTH is refused as malformed;
 *   - numbers are checked for JSON syntax; json_int reads integers only;
 *   - json_string decodes every escape, \uXXXX surrogate pairs included,
 *     into UTF-8; a string holding \u0000 is refused (C strings end at
 *     NUL), unless read with json_string_n, which gives its length;
 *   - duplicate keys: json_get and json_get_many find the first;
 *   - a string's plain bytes are scanned 8 at a time (json_plain_run), in
 *     aligned words that may read up to 7 bytes past the text's NUL but
 *     never past the page that holds it, so never out of bounds (what
 *     libc's strlen does; only the bytes up to the NUL decide anything,
 *     and a memory checker such as ASan reports the read).
 *
 * Single-file: include it in one .c file (the functions are static inline).
 */
#ifndef AGENTHOST_JSON_H
#define AGENTHOST_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

static inline const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    return p;
}

static inline int json_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* json_plain_run returns the first byte at or after p that a string's
 * scan must look at: a quote, a backslash or a byte below 0x20 (the NUL
 * at the end of the text among them). It reads aligned 8-byte words: an
 * aligned word that holds one byte of the text lies in the same page (64
 * KiB in linear memory), so the bytes it reads past the NUL are never out
 * of bounds, and it stops at the NUL. */
static inline const char *json_plain_run(const char *p) {
    while (((uintptr_t)p & 7) != 0) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\' || c < 0x20) return p;
        p++;
    }
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    for (;;) {
        uint64_t w;
        __builtin_memcpy(&w, p, 8);
        uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
        /* a byte of x is 0 where (x - ones) & ~x has its high bit; a byte
         * below 0x20 where (w - 0x20 a byte) & ~w does */
        uint64_t stop = ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) | ((w - ones * 0x20) & ~w);
        if ((stop & highs) != 0) break;
        p += 8;
    }
    while (1) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\' || c < 0x20) return p;
        p++;
    }
}

/* json_skip_string returns the end of the string at p (after its closing
 * quote), or NULL when it is malformed. */
static inline const char *json_skip_string(const char *p) {
    if (*p != '"') return NULL;
    for (p = json_plain_run(p + 1); *p != '"'; p = json_plain_run(p + 1)) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20) return NULL;
        /* a backslash */
        p++;
        if (*p == 'u') {
            for (int i = 1; i <= 4; i++) {
                if (json_hex(p[i]) < 0) return NULL;
            }
            p += 4;
        } else if (*p == 0 || !strchr("\"\\/bfnrt", *p)) {
            return NULL;
        }
    }
    return p + 1;
}

static inline const char *json_skip_number(const char *p) {
    if (*p == '-') p++;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (*p >= '0' && *p <= '9') p++;
    } else {
        return NULL;
    }
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    return p;
}

/* json_skip returns the end of the value at p (leading white space
 * allowed), or NULL when it is malformed. */
static inline const char *json_skip_depth(const char *p, int depth) {
    if (depth > JSON_MAX_DEPTH) return NULL;
    p = json_ws(p);
    switch (*p) {
    case '"':
        return json_skip_string(p);
    case '{':
        p = json_ws(p + 1);
        if (*p == '}') return p + 1;
        for (;;) {
            p = json_skip_string(json_ws(p));
            if (p == NULL) return NULL;
            p = json_ws(p);
            if (*p != ':') return NULL;
            p = json_skip_depth(p + 1, depth + 1);
            if (p == NULL) return NULL;
            p = json_ws(p);
            if (*p == '}') return p + 1;
            if (*p != ',') return NULL;
            p++;
        }
    case '[':
        p = json_ws(p + 1);
        if (*p == ']') return p + 1;
        for (;;) {
            p = json_skip_depth(p, depth + 1);
            if (p == NULL) return NULL;
            p = json_ws(p);
            if (*p == ']') return p + 1;
            if (*p != ',') return NULL;
            p++;
        }
    case 't':
        return strncmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f':
        return strncmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n':
        return strncmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default:
        return json_skip_number(p);
    }
}

static inline const char *json_skip(const char *p) { return json_skip_depth(p, 0); }

/* json_valid reports whether doc is one JSON value and nothing else. */
static inline int json_valid(const char *doc) {
    const char *end = json_skip(doc);
    return end != NULL && *json_ws(end) == 0;
}

/* json_string_equals reports whether the JSON string at p, undecoded, is
 * exactly key (a key with no escapes in it). */
static inline int json_string_equals(const char *p, const char *key) {
    size_t n = strlen(key);
    return *p == '"' && strncmp(p + 1, key, n) == 0 && p[1 + n] == '"';
}

/* json_get returns the value of the member key of the object at obj, or
 * NULL when obj is not an object or has no such member. obj must be valid
 * JSON (check the document with json_valid first). */
static inline const char *json_get(const char *obj, const char *key) {
    if (obj == NULL) return NULL;
    const char *p = json_ws(obj);
    if (*p != '{') return NULL;
    p = json_ws(p + 1);
    while (*p == '"') {
        int match = json_string_equals(p, key);
        p = json_ws(json_skip_string(p));
        p = json_ws(p + 1); /* after ':' */
        if (match) return p;
        p = json_ws(json_skip(p));
        if (*p != ',') return NULL;
        p = json_ws(p + 1);
    }
    return NULL;
}

/* json_get_many finds the members keys[0..n) of the object at obj in one
 * pass over it, as json_get finds each (the first of a key, NULL when
 * there is none or obj is not an object), and sets vals[i] to keys[i]'s.
 * A value then costs one walk of the object, not one walk a key, and the
 * walk stops once every key is found. */
static inline void json_get_many(const char *obj, const char *const *keys, const char **vals, int n) {
    for (int i = 0; i < n; i++) vals[i] = NULL;
    if (obj == NULL) return;
    const char *p = json_ws(obj);
    if (*p != '{') return;
    p = json_ws(p + 1);
    int found = 0;
    while (*p == '"') {
        const char *key = p;
        p = json_ws(json_skip_string(p));
        p = json_ws(p + 1); /* after ':' */
        for (int i = 0; i < n; i++) {
            if (vals[i] == NULL && json_string_equals(key, keys[i])) {
                vals[i] = p;
                if (++found == n) return; /* the rest is not read */
                break;
            }
        }
        p = json_ws(json_skip(p));
        if (*p != ',') return;
        p = json_ws(p + 1);
    }
}

static inline void json_utf8(char **out, uint32_t cp) {
    char *o = *out;
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | (cp >> 6));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | (cp >> 12));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | (cp >> 18));
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    }
    *out = o;
}

static inline uint32_t json_u4(const char *p) {
    return (uint32_t)(json_hex(p[0]) << 12 | json_hex(p[1]) << 8 | json_hex(p[2]) << 4 | json_hex(p[3]));
}

/* json_string_n decodes the (valid) JSON string at p into a new
 * NUL-terminated UTF-8 buffer from malloc and sets *n to its length,
 * which counts any NUL decoded from \u0000. It returns NULL when p is not
 * a string or malloc fails. */
static inline char *json_string_n(const char *p, size_t *n) {
    if (p == NULL || *p != '"') return NULL;
    const char *end = json_skip_string(p);
    if (end == NULL) return NULL;
    char *out = malloc((size_t)(end - p) + 1); /* decoding never grows */
    if (out == NULL) return NULL;
    char *o = out;
    for (p++; *p != '"'; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp = json_u4(p + 1);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
                uint32_t lo = json_u4(p + 3);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* a lone surrogate */
            json_utf8(&o, cp);
            break;
        }
        default: *o++ = *p; /* " \ / */
        }
    }
    *o = 0;
    *n = (size_t)(o - out);
    return out;
}

/* json_string decodes the (valid) JSON string at p into a new
 * NUL-terminated UTF-8 buffer from malloc. It returns NULL when p is not a
 * string, holds \u0000, or malloc fails. */
static inline char *json_string(const char *p) {
    size_t n;
    char *out = json_string_n(p, &n);
    if (out != NULL && strlen(out) != n) {
        free(out);
        return NULL;
    }
    return out;
}

/* json_int reads the integer at p into *out; it returns 0 when p is not an
 * integer that fits. */
static inline int json_int(const char *p, long long *out) {
    if (p == NULL) return 0;
    const char *end = json_skip_number(p);
    if (end == NULL) return 0;
    long long v = 0;
    int neg = *p == '-';
    const char *q = p + neg;
    for (; q < end; q++) {
        if (*q < '0' || *q > '9') return 0; /* a fraction or an exponent */
        if (v > (INT64_MAX - (*q - '0')) / 10) return 0;
        v = v * 10 + (*q - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

/* json_buf builds a JSON document. A failed allocation sets oom, and
 * every later write is dropped. */
typedef struct {
    char *b;
    size_t n, cap;
    int oom;
} json_buf;

static inline void jb_write(json_buf *j, const char *s, size_t n) {
    if (j->oom) return;
    if (j->n + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 256;
        while (cap < j->n + n + 1) cap *= 2;
        char *b = realloc(j->b, cap);
        if (b == NULL) {
            j->oom = 1;
            return;
        }
        j->b = b;
        j->cap = cap;
    }
    memcpy(j->b + j->n, s, n);
    j->n += n;
    j->b[j->n] = 0;
}

static inline void jb_raw(json_buf *j, const char *s) { jb_write(j, s, strlen(s)); }

/* jb_string_n writes the n bytes at s as a JSON string, quoted and
 * escaped. */
static inline void jb_string_n(json_buf *j, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    jb_write(j, "\"", 1);
    for (const char *e = s + n; s < e; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '"': jb_raw(j, "\\\""); break;
        case '\\': jb_raw(j, "\\\\"); break;
        case '\n': jb_raw(j, "\\n"); break;
        case '\r': jb_raw(j, "\\r"); break;
        case '\t': jb_raw(j, "\\t"); break;
        default:
            if (c < 0x20) {
                char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
                jb_raw(j, u);
            } else {
                jb_write(j, (const char *)&c, 1);
            }
        }
    }
    jb_write(j, "\"", 1);
}

/* jb_string writes s as a JSON string, quoted and escaped. */
static inline void jb_string(json_buf *j, const char *s) { jb_string_n(j, s, strlen(s)); }

#endif
