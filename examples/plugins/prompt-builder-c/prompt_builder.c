/*
 * prompt-builder-c: the prompt-builder example in C, with the same
 * behaviour and the same name ("prompt-builder"), so the two builds are
 * interchangeable. For each model step it makes the request: a system
 * message from its config (system_prompt), the session's history cut to
 * the last history_window messages less any tool messages at its start,
 * the Run's transcript, and the Run's tools.
 *
 * For speed it checks the input's shape, then copies the history and
 * transcript messages and the tools array as raw JSON text instead of
 * decoding and re-encoding them.
 *
 * Build: examples/plugins/prompt-builder-c/build.sh prompt-builder-c.wasm
 */
#include <stdio.h>

#include "../c/extism.h"
#include "../c/agenthost.h"
#include "../c/json.h"

AGENTHOST_ABI_V1

/* DefaultSystemPrompt of examples/plugins/prompt-builder/prompt, byte for byte. */
static const char default_system_prompt[] =
    "You are a careful, concise assistant running on agenthost. "
    "Use the tools you are offered when they help: use the calculate tool for arithmetic rather than working it out yourself, "
    "and call independent tools together in one message. When you have the answer, state it plainly.";

#define DEFAULT_HISTORY_WINDOW 20

/* ---- config ------------------------------------------------------------ */

/* utf8_rune decodes the rune at s (n bytes left) and sets *size; an
 * invalid byte is rune -1 of size 1, as Go's utf8.DecodeRuneInString
 * gives RuneError. */
static long utf8_rune(const unsigned char *s, size_t n, size_t *size) {
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

/* is_space is Go's unicode.IsSpace, which strings.TrimSpace trims. */
static int is_space(long r) {
    switch (r) {
    case '\t': case '\n': case '\v': case '\f': case '\r': case ' ':
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return 1;
    }
    return r >= 0x2000 && r <= 0x200A;
}

/* trim_space returns s with leading and trailing Unicode white space
 * cut, as [*start, *end). */
static void trim_space(const char *s, const char **start, const char **end) {
    const unsigned char *p = (const unsigned char *)s, *e = p + strlen(s);
    size_t size;
    while (p < e && is_space(utf8_rune(p, (size_t)(e - p), &size))) p += size;
    /* from the end: step back to the start of the last rune */
    while (e > p) {
        const unsigned char *q = e - 1;
        while (q > p && (*q & 0xC0) == 0x80 && e - q < 4) q--;
        long r = utf8_rune(q, (size_t)(e - q), &size);
        if (q + size != e) { /* not one whole rune: an invalid byte */
            break;
        }
        if (!is_space(r)) break;
        e = q;
    }
    *start = (const char *)p;
    *end = (const char *)e;
}

/* is_print approximates Go's strconv.IsPrint for the runes %q must
 * escape: controls, the Unicode spaces other than ' ', and the common
 * format characters. */
static int is_print(long r) {
    if (r < 0x20 || (r >= 0x7F && r < 0xA0)) return 0;
    if (r != ' ' && is_space(r)) return 0;
    if ((r >= 0x200B && r <= 0x200F) || (r >= 0x202A && r <= 0x202E) || (r >= 0x2060 && r <= 0x206F) || r == 0xFEFF ||
        r == 0xAD || (r >= 0xFFF9 && r <= 0xFFFB) || r == 0xFFFE || r == 0xFFFF)
        return 0;
    return 1;
}

/* go_quote writes s as Go's strconv.Quote (the %q verb) would. */
static void go_quote(json_buf *j, const char *s) {
    const unsigned char *p = (const unsigned char *)s, *e = p + strlen(s);
    char b[16];
    jb_raw(j, "\"");
    while (p < e) {
        size_t size;
        long r = utf8_rune(p, (size_t)(e - p), &size);
        if (r < 0) {
            snprintf(b, sizeof b, "\\x%02x", *p);
            jb_raw(j, b);
        } else if (r == '"' || r == '\\') {
            b[0] = '\\', b[1] = (char)r, b[2] = 0;
            jb_raw(j, b);
        } else if (is_print(r)) {
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

/* atoi_go parses [s, e) as strconv.Atoi does: an optional sign, then
 * decimal digits, within int64. */
static int atoi_go(const char *s, const char *e, long long *out) {
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

typedef struct {
    char *system_prompt; /* from the config, or NULL for the default */
    long long history_window;
} config;

/* parse_config reads the config as prompt.ParseConfig does. On a bad
 * value it returns 0 with the error in *err (free it). */
static int parse_config(config *c, char **err) {
    c->system_prompt = NULL;
    c->history_window = DEFAULT_HISTORY_WINDOW;
    const char *s, *e;
    char *v = extism_config("system_prompt");
    if (v != NULL) {
        trim_space(v, &s, &e);
        if (s != e) {
            c->system_prompt = v;
            v = NULL;
        }
        free(v);
    }
    v = extism_config("history_window");
    if (v == NULL) return 1;
    trim_space(v, &s, &e);
    if (s != e) {
        long long n;
        if (!atoi_go(s, e, &n) || n < 0) {
            json_buf j = {0};
            jb_raw(&j, "prompt-builder: config history_window: ");
            go_quote(&j, v);
            jb_raw(&j, " is not a whole number of messages (0 or more); set it to, for example, 20");
            free(v);
            *err = j.oom ? NULL : j.b;
            if (j.oom) free(j.b);
            return 0;
        }
        c->history_window = n;
    }
    free(v);
    return 1;
}

/* ---- the input's shape --------------------------------------------------- */

/* The checks below refuse what Go's decoder refuses when it decodes the
 * input into abi.BuildInput: a member of the wrong JSON type. null is
 * always allowed (it leaves the zero value). */

static int is_null(const char *v) { return v == NULL || strncmp(v, "null", 4) == 0; }

static int is_string_or_null(const char *v) { return is_null(v) || *v == '"'; }

static int is_bool_or_null(const char *v) {
    return is_null(v) || strncmp(v, "true", 4) == 0 || strncmp(v, "false", 5) == 0;
}

static int is_int_or_null(const char *v) {
    long long n;
    return is_null(v) || json_int(v, &n);
}

static int is_object_or_null(const char *v) { return is_null(v) || *v == '{'; }

/* each_element calls f on each element of the (valid) array at a, and
 * stops at the first that f refuses. */
static int each_element(const char *a, int (*f)(const char *)) {
    const char *p = json_ws(json_ws(a) + 1);
    if (*p == ']') return 1;
    for (;;) {
        if (!f(p)) return 0;
        p = json_ws(json_skip(p));
        if (*p == ']') return 1;
        p = json_ws(p + 1);
    }
}

static int is_array_of(const char *v, int (*f)(const char *)) {
    if (is_null(v)) return 1;
    return *v == '[' && each_element(v, f);
}

static int tool_call_ok(const char *v) {
    return is_object_or_null(v) && is_string_or_null(json_get(v, "id")) && is_string_or_null(json_get(v, "name"));
}

static int message_ok(const char *v) {
    return is_object_or_null(v) && is_string_or_null(json_get(v, "role")) && is_string_or_null(json_get(v, "content")) &&
           is_array_of(json_get(v, "tool_calls"), tool_call_ok) && is_string_or_null(json_get(v, "tool_call_id")) &&
           is_bool_or_null(json_get(v, "is_error"));
}

static int tool_ok(const char *v) {
    return is_object_or_null(v) && is_string_or_null(json_get(v, "name")) && is_string_or_null(json_get(v, "description")) &&
           is_bool_or_null(json_get(v, "idempotent")) && is_string_or_null(json_get(v, "approval"));
}

static int run_ok(const char *v) {
    return is_object_or_null(v) && is_string_or_null(json_get(v, "id")) && is_string_or_null(json_get(v, "tenant")) &&
           is_string_or_null(json_get(v, "session")) && is_int_or_null(json_get(v, "step")) &&
           is_string_or_null(json_get(v, "input"));
}

/* input_shape returns NULL when the (valid) document decodes into
 * abi.BuildInput, or what is wrong. */
static const char *input_shape(const char *in) {
    in = json_ws(in);
    if (is_null(in)) return NULL;
    if (*in != '{') return "it is not a JSON object";
    if (!is_int_or_null(json_get(in, "abi"))) return "abi is not an integer";
    if (!run_ok(json_get(in, "run"))) return "run is not a Run view";
    if (!is_array_of(json_get(in, "history"), message_ok)) return "history is not an array of messages";
    if (!is_array_of(json_get(in, "transcript"), message_ok)) return "transcript is not an array of messages";
    if (!is_array_of(json_get(in, "tools"), tool_ok)) return "tools is not an array of tools";
    return NULL;
}

/* ---- the request ----------------------------------------------------------- */

/* is_tool_message reports whether the message at v has the role "tool"
 * (decoded, so an escaped spelling counts too). */
static int is_tool_message(const char *v) {
    if (is_null(v)) return 0;
    const char *r = json_get(v, "role");
    if (is_null(r)) return 0;
    if (json_string_equals(r, "tool")) return 1;
    if (strchr(r, '\\') == NULL || r[1] == '"') return 0;
    char *s = json_string(r);
    int tool = s != NULL && strcmp(s, "tool") == 0;
    free(s);
    return tool;
}

/* elements returns the starts of the elements of the array at a (NULL
 * or null: none) in a new array (free it), and sets *n. */
static const char **elements(const char *a, size_t *n, int *oom) {
    *n = 0;
    if (is_null(a)) return NULL;
    size_t cap = 16;
    const char **e = malloc(cap * sizeof *e);
    if (e == NULL) {
        *oom = 1;
        return NULL;
    }
    const char *p = json_ws(json_ws(a) + 1);
    while (*p != ']') {
        if (*n == cap) {
            const char **bigger = realloc(e, 2 * cap * sizeof *e);
            if (bigger == NULL) {
                free(e);
                *oom = 1;
                return NULL;
            }
            e = bigger;
            cap *= 2;
        }
        e[(*n)++] = p;
        p = json_ws(json_skip(p));
        if (*p == ',') p = json_ws(p + 1);
    }
    return e;
}

/* write_raw copies the (valid) value at v as it is. */
static void write_raw(json_buf *j, const char *v) { jb_write(j, v, (size_t)(json_skip(v) - v)); }

/* write_elements copies the elements of the array at a, each after a comma. */
static void write_elements(json_buf *j, const char *a) {
    if (is_null(a)) return;
    const char *p = json_ws(json_ws(a) + 1);
    while (*p != ']') {
        jb_raw(j, ",");
        write_raw(j, p);
        p = json_ws(json_skip(p));
        if (*p == ',') p = json_ws(p + 1);
    }
}

static int is_empty_array(const char *a) { return is_null(a) || *json_ws(json_ws(a) + 1) == ']'; }

EXTISM_EXPORT(describe) int32_t describe(void) {
    char *in = extism_input(NULL);
    if (in == NULL) return extism_error("prompt-builder: out of memory reading the input");
    const char *p = json_ws(in);
    int ok = json_valid(in) && (is_null(p) || (*p == '{' && is_int_or_null(json_get(p, "abi"))));
    free(in);
    if (!ok) return extism_error("describe: the input is not JSON: it is not a describe input");
    const char *d = "{\"abi\":1,\"name\":\"prompt-builder\",\"version\":\"1.0.0\",\"role\":\"builder\",\"attach\":false}";
    return extism_output(d, strlen(d));
}

EXTISM_EXPORT(build) int32_t build(void) {
    char *in = extism_input(NULL);
    if (in == NULL) return extism_error("prompt-builder: out of memory reading the input");
    const char *bad = json_valid(in) ? input_shape(in) : "it is not JSON";
    if (bad != NULL) {
        free(in);
        char msg[160];
        snprintf(msg, sizeof msg, "prompt-builder: the input is not a build input: %s", bad);
        return extism_error(msg);
    }
    config c;
    char *err = NULL;
    if (!parse_config(&c, &err)) {
        free(in);
        int32_t rc = extism_error(err ? err : "prompt-builder: out of memory reading the config");
        free(err);
        return rc;
    }

    const char *doc = is_null(json_ws(in)) ? NULL : json_ws(in);
    const char *history = json_get(doc, "history"), *transcript = json_get(doc, "transcript"),
               *tools = json_get(doc, "tools");
    int oom = 0;
    size_t n;
    const char **h = elements(history, &n, &oom);
    /* The window: the last history_window messages, less any tool
     * messages at its start (their calls were cut off). */
    size_t from = n;
    if (c.history_window > 0) {
        from = (unsigned long long)c.history_window < n ? n - (size_t)c.history_window : 0;
        while (from < n && is_tool_message(h[from])) from++;
    }

    json_buf j = {0};
    jb_raw(&j, "{\"request\":{\"messages\":[{\"role\":\"system\",\"content\":");
    jb_string(&j, c.system_prompt ? c.system_prompt : default_system_prompt);
    jb_raw(&j, "}");
    for (size_t i = from; i < n; i++) {
        jb_raw(&j, ",");
        write_raw(&j, h[i]);
    }
    write_elements(&j, transcript);
    jb_raw(&j, "]");
    /* Go's tools field is omitempty: no tools, no field. */
    if (!is_empty_array(tools)) {
        jb_raw(&j, ",\"tools\":");
        write_raw(&j, json_ws(tools));
    }
    jb_raw(&j, "}}");
    free(h);
    free(c.system_prompt);
    free(in);
    if (j.oom || oom) {
        free(j.b);
        return extism_error("prompt-builder: out of memory building the request");
    }
    int32_t rc = extism_output(j.b, j.n);
    free(j.b);
    return rc;
}
