/*
 * scripted-model-c: the scripted-model example in C, with the same rules,
 * the same replies and the same name ("scripted-model"), so the two
 * builds are interchangeable: the examples' differential test holds this
 * one to the Go model (examples/plugins/scripted-model/model), reply for
 * reply. It is the build `make run` loads, at a small part of the Go
 * guest's CPU a call.
 *
 * How it answers (the Go package's documentation has the rules table): it
 * looks at the conversation since the last user message; when results
 * came back for the tool calls it asked for, it answers with them;
 * otherwise it tries the rules in order on the last user message (use
 * TOOL {JSON}, slow job, arithmetic, time, capabilities, greeting,
 * thanks), and falls back to saying what it is.
 *
 * Where it differs from the Go build (README.md): the use form's
 * arguments nested deeper than 64 levels are "not JSON", and a syntax
 * error in them is described in other words.
 *
 * Build: examples/plugins/scripted-model-c/build.sh scripted-model-c.wasm
 */
#include <math.h>
#include <stdio.h>

#include "../c/extism.h"
#include "../c/agenthost.h"
#include "../c/json.h"
#include "../c/gostr.h"
#include "../c/abishape.h"
#include "../c/expr.h"

AGENTHOST_ABI_V1

#define NAME "scripted-model"

/* The texts of examples/plugins/scripted-model/model, byte for byte. */
static const char configure_hint[] =
    "For real answers, configure a real model: load the openai example plugin (examples/plugins/openai) as the tenant's "
    "model executor, with base_url, model and api_key in its config; it speaks to OpenAI, Ollama or vLLM. For "
    "Anthropic's Messages API, load the anthropic one (examples/plugins/anthropic) the same way.";
static const char fallback_text[] =
    "I am agenthost's scripted demo model: I follow a small rules table and do not understand free text.";

#define TOOL_CALCULATE "calculate"
#define TOOL_SLOW_JOB "slow_job"
#define DEFAULT_SLOW_JOB_SECONDS 5

/* ---- the request ------------------------------------------------------------ */

/* text is a decoded string: its bytes and length. */
typedef struct {
    char *s;
    size_t n;
} text;

/* request is the model request, its values still JSON text in the input
 * (decoded when a rule needs them). */
typedef struct {
    request_view v;
    text *tool_names; /* the tools' names, decoded */
    int oom;          /* memory ran out: the call fails */
} request;

/* decode returns the string at v decoded ("" for absent or null); when
 * memory runs out it sets r->oom and returns "". */
static text decode(request *r, const char *v) {
    if (is_null(v)) return (text){.s = NULL, .n = 0};
    size_t n;
    char *s = json_string_n(v, &n);
    if (s == NULL) {
        r->oom = 1;
        return (text){.s = NULL, .n = 0};
    }
    return (text){.s = s, .n = n};
}

static const char *str(text t) { return t.s ? t.s : ""; }

static void drop(text t) { free(t.s); }

static int role_is(const message_view *m, const char *role) { return json_string_is(m->role, role); }

static int is_true(const char *v) { return v != NULL && strncmp(v, "true", 4) == 0; }

/* has_elements reports whether the array at v (or null) holds any. */
static int has_elements(const char *v) { return !is_null(v) && *json_ws(json_ws(v) + 1) != ']'; }

static int offers(const request *r, const char *name, size_t n) {
    for (size_t i = 0; i < r->v.n_tools; i++) {
        if (r->tool_names[i].n == n && memcmp(str(r->tool_names[i]), name, n) == 0) return 1;
    }
    return 0;
}

/* ---- the reply ----------------------------------------------------------------- */

/* reply is the assistant's message: its content, and its tool calls as
 * JSON elements (each after a comma). */
typedef struct {
    json_buf content;
    json_buf calls;
    int n_calls;
    long long out_words;
} reply;

/* words counts the runs of text between separators (space, newline, tab,
 * and " , : { }): the Go model's usage estimate. */
static long long words(const char *s, size_t n) {
    long long w = 0;
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case ' ': case '\n': case '\t': case '"': case ',': case ':': case '{': case '}':
            in = 0;
            break;
        default:
            if (!in) w++;
            in = 1;
        }
    }
    return w;
}

/* json_words is words of the JSON string at v, decoded on the fly (an
 * escape is one character of the decoded text); null or absent is none. */
static long long json_words(const char *v) {
    if (v == NULL || *v != '"') return 0;
    long long w = 0;
    int in = 0;
    for (const char *p = v + 1; *p != '"'; p++) {
        int sep;
        if (*p != '\\') {
            sep = strchr(" \n\t,:{}", *p) != NULL;
        } else {
            p++;
            switch (*p) {
            case 'n': case 't': case '"':
                sep = 1;
                break;
            case 'u': {
                uint32_t cp = json_u4(p + 1);
                p += 4;
                sep = cp < 0x80 && strchr(" \n\t\",:{}", (int)cp) != NULL && cp != 0;
                break;
            }
            default:
                sep = 0;
            }
        }
        if (sep) {
            in = 0;
        } else if (!in) {
            w++;
            in = 1;
        }
    }
    return w;
}

/* raw_words is words of the value at v as it is written (raw JSON). */
static long long raw_words(const char *v) {
    if (v == NULL) return 0;
    v = json_ws(v);
    return words(v, (size_t)(json_skip(v) - v));
}

/* call_id names tool call i of the model's turn-th message since the
 * question. */
static void call_id(char *b, size_t n, int turn, int i) { snprintf(b, n, "call_%d_%d", turn, i + 1); }

/* add_call adds a tool call with its (compact) arguments. */
static void add_call(reply *out, int turn, const char *name, size_t name_n, const char *args, size_t args_n) {
    char id[48];
    call_id(id, sizeof id, turn, out->n_calls);
    jb_raw(&out->calls, out->n_calls ? ",{\"id\":" : "{\"id\":");
    jb_string(&out->calls, id);
    jb_raw(&out->calls, ",\"name\":");
    jb_string_n(&out->calls, name, name_n);
    jb_raw(&out->calls, ",\"arguments\":");
    jb_write(&out->calls, args, args_n);
    jb_raw(&out->calls, "}");
    out->out_words += words(name, name_n) + words(args, args_n);
    out->n_calls++;
}

static void say(reply *out, const char *s) { jb_raw(&out->content, s); }

static void say_n(reply *out, const char *s, size_t n) { jb_write(&out->content, s, n); }

/* ---- answering with the results ----------------------------------------- */

/* expression_of writes the expression argument of a calculate call, or
 * "the expression" when there is none: what Go's decoder makes of the
 * arguments in struct{Expression string}, which matches the member's
 * name in any case, takes the last, and fails on arguments that are
 * absent, not an object, or whose expression is not a string. */
static void expression_of(request *r, const char *args, json_buf *to) {
    const char *found = NULL;
    int ok = args != NULL && (is_null(args) || *json_ws(args) == '{');
    if (ok && !is_null(args)) {
        const char *p = json_ws(json_ws(args) + 1);
        while (*p == '"') {
            size_t n;
            char *key = json_string_n(p, &n);
            r->oom |= key == NULL;
            int match = key != NULL && n == 10;
            for (size_t i = 0; match && i < n; i++) {
                char k = key[i];
                match = (k >= 'A' && k <= 'Z' ? k - 'A' + 'a' : k) == "expression"[i];
            }
            free(key);
            p = json_ws(json_ws(json_skip_string(p)) + 1); /* after ':' */
            if (match && *p == '"') {
                found = p;
            } else if (match && !is_null(p)) {
                ok = 0;
            }
            p = json_ws(json_skip(p));
            if (*p != ',') break;
            p = json_ws(p + 1);
        }
    }
    text e = ok && found != NULL ? decode(r, found) : (text){0};
    if (e.n == 0) {
        jb_raw(to, "the expression");
    } else {
        jb_write(to, e.s, e.n);
    }
    drop(e);
}

/* summarize answers from the results of the calls the model asked for
 * (the message at asked), in the order it asked; the results are the
 * tool messages from index from on, the last for an ID counting. */
static void summarize(request *r, const message_view *asked, size_t from, reply *out) {
    json_buf s = {0};
    int oom = 0;
    size_t n;
    const char **calls = json_elements(asked->tool_calls, &n, &oom);
    r->oom |= oom;
    for (size_t k = 0; k < n; k++) {
        const char *c = calls[k];
        text id = decode(r, json_get(c, "id")), name = decode(r, json_get(c, "name"));
        const message_view *result = NULL;
        for (size_t i = r->v.n_messages; i > from; i--) {
            const message_view *m = &r->v.messages[i - 1];
            if (!role_is(m, "tool")) continue;
            text tid = decode(r, m->tool_call_id);
            int same = tid.n == id.n && memcmp(str(tid), str(id), id.n) == 0;
            drop(tid);
            if (same) {
                result = m;
                break;
            }
        }
        if (k > 0) jb_raw(&s, " and ");
        int calculate = name.n == strlen(TOOL_CALCULATE) && memcmp(str(name), TOOL_CALCULATE, name.n) == 0;
        if (result == NULL) {
            jb_raw(&s, "the ");
            jb_write(&s, str(name), name.n);
            jb_raw(&s, " call ");
            jb_write(&s, str(id), id.n);
            jb_raw(&s, " has no result");
        } else {
            text content = decode(r, result->content);
            const char *cs, *ce;
            go_trim_space(str(content), content.n, &cs, &ce);
            size_t cn = (size_t)(ce - cs);
            int is_error = is_true(result->is_error);
            if (calculate && !is_error && !(cn >= 5 && memcmp(cs, "error", 5) == 0)) {
                expression_of(r, json_get(c, "arguments"), &s);
                jb_raw(&s, " = ");
                jb_write(&s, cs, cn);
            } else if (calculate) {
                jb_raw(&s, "I could not compute ");
                expression_of(r, json_get(c, "arguments"), &s);
                jb_raw(&s, " (");
                jb_write(&s, cs, cn);
                jb_raw(&s, ")");
            } else {
                jb_raw(&s, "the ");
                jb_write(&s, str(name), name.n);
                jb_raw(&s, is_error ? " tool failed: " : " tool answered: ");
                jb_write(&s, cs, cn);
            }
            drop(content);
        }
        drop(id);
        drop(name);
    }
    free(calls);
    /* strings.ToUpper(s[:1]) + strings.TrimRight(s[1:], ".") + ".": a
     * first byte outside ASCII is not a rune of its own, and Go's
     * ToUpper turns it into U+FFFD. */
    if (s.n > 0 && !s.oom) {
        unsigned char c0 = (unsigned char)s.b[0];
        if (c0 >= 0x80) {
            say(out, "\xEF\xBF\xBD");
        } else {
            char u = (char)(c0 >= 'a' && c0 <= 'z' ? c0 - 'a' + 'A' : c0);
            say_n(out, &u, 1);
        }
        size_t end = s.n;
        while (end > 1 && s.b[end - 1] == '.') end--;
        say_n(out, s.b + 1, end - 1);
        say(out, ".");
    }
    r->oom |= s.oom;
    free(s.b);
}

/* ---- the rules ------------------------------------------------------------------ */

static int is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* contains_phrase reports whether s holds p bounded by non-letters on
 * both sides ("hi" is not in "this"). */
static int contains_phrase(const char *s, size_t n, const char *p) {
    size_t m = strlen(p);
    for (size_t i = 0; i + m <= n; i++) {
        if (memcmp(s + i, p, m) != 0) continue;
        if ((i == 0 || !is_letter(s[i - 1])) && (i + m == n || !is_letter(s[i + m]))) return 1;
    }
    return 0;
}

static int contains_any(const char *s, size_t n, const char *const *phrases) {
    for (; *phrases; phrases++) {
        if (contains_phrase(s, n, *phrases)) return 1;
    }
    return 0;
}

static int contains(const char *s, size_t n, const char *p) {
    size_t m = strlen(p);
    for (size_t i = 0; i + m <= n; i++) {
        if (memcmp(s + i, p, m) == 0) return 1;
    }
    return 0;
}

/* is_re_space is RE2's \s: [\t\n\f\r ]. */
static int is_re_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'; }

/* name_char returns the size of the character of a tool name that the
 * use form's [A-Za-z0-9_-] takes at s (n bytes left) under (?i): an ASCII
 * one, or the two runes that fold to ASCII letters, U+212A (k) and U+017F
 * (s); 0 for any other. */
static size_t name_char(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') return 1;
    if (c == 0xE2 && n >= 3 && s[1] == 0x84 && s[2] == 0xAA) return 3;
    if (c == 0xC5 && n >= 2 && s[1] == 0xBF) return 2;
    return 0;
}

/* compact writes the (valid) JSON value at [p, end) without the white
 * space between its tokens: json.Compact. */
static void compact(json_buf *j, const char *p, const char *end) {
    while (p < end) {
        if (*p == '"') {
            const char *e = json_skip_string(p);
            jb_write(j, p, (size_t)(e - p));
            p = e;
        } else {
            if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') jb_write(j, p, 1);
            p++;
        }
    }
}

/* say_tools says which tools the Run offers: none when it offers none,
 * else some, then their names and a full stop. */
static void say_tools(const request *r, reply *out, const char *none, const char *some) {
    if (r->v.n_tools == 0) {
        say(out, none);
        return;
    }
    say(out, some);
    for (size_t i = 0; i < r->v.n_tools; i++) {
        if (i > 0) say(out, ", ");
        say_n(out, str(r->tool_names[i]), r->tool_names[i].n);
    }
    say(out, ".");
}

/* use_rule is the explicit form `use TOOL {JSON arguments}`, as the Go
 * model's regular expression (?is)^\s*use\s+([A-Za-z0-9_-]{1,64})(.*)$
 * reads it. */
static int use_rule(request *r, const char *t, size_t n, int turn, reply *out) {
    const unsigned char *p = (const unsigned char *)t, *e = p + n;
    while (p < e && is_re_space(*p)) p++;
    if (p == e || (*p != 'u' && *p != 'U')) return 0;
    p++;
    if (p < e && (*p == 's' || *p == 'S')) {
        p++;
    } else if (e - p >= 2 && p[0] == 0xC5 && p[1] == 0xBF) {
        p += 2;
    } else {
        return 0;
    }
    if (p == e || (*p != 'e' && *p != 'E')) return 0;
    p++;
    if (p == e || !is_re_space(*p)) return 0;
    while (p < e && is_re_space(*p)) p++;
    const char *name = (const char *)p;
    size_t k, runes = 0;
    while (p < e && runes < 64 && (k = name_char(p, (size_t)(e - p))) > 0) {
        p += k;
        runes++;
    }
    if (runes == 0) return 0;
    size_t name_n = (size_t)((const char *)p - name);
    const char *rest, *rest_end;
    go_trim_space((const char *)p, (size_t)(e - p), &rest, &rest_end);
    size_t rest_n = (size_t)(rest_end - rest);
    int offered = offers(r, name, name_n);
    if (!offered && (rest_n == 0 || rest[0] != '{')) return 0;
    if (!offered) {
        say(out, "I would call the tool ");
        say_n(out, name, name_n);
        say(out, ", but this Run does not offer it. ");
        say_tools(r, out, "It offers no tools.", "It offers: ");
        say(out, " Write `use TOOL {JSON arguments}` with one of those, or add the plugin that offers ");
        say_n(out, name, name_n);
        say(out, " to the tenant's tool_executors.");
        return 1;
    }
    json_buf why = {0}, args = {0};
    if (rest_n == 0) {
        jb_raw(&args, "{}");
    } else if (rest[0] != '{') {
        json_buf clip = {0};
        go_clip(&clip, rest, rest_n, 40);
        go_quote(&why, clip.b ? clip.b : "", clip.n);
        jb_raw(&why, " is not a JSON object");
        free(clip.b);
    } else {
        /* rest ends where the text ends, in NUL */
        const char *end = json_skip(rest);
        if (end == NULL) {
            jb_raw(&why, "they are not JSON: check its quotes, commas, colons and braces");
        } else {
            const char *ts, *te;
            go_trim_space(end, (size_t)(rest_end - end), &ts, &te);
            if (ts != te) {
                json_buf clip = {0};
                go_clip(&clip, ts, (size_t)(te - ts), 40);
                go_quote(&why, clip.b ? clip.b : "", clip.n);
                jb_raw(&why, " follows the JSON object");
                free(clip.b);
            } else {
                compact(&args, rest, end);
            }
        }
    }
    if (why.n > 0) {
        say(out, "I could not read the arguments for ");
        say_n(out, name, name_n);
        say(out, ": ");
        say_n(out, why.b, why.n);
        say(out, ". Write them as one JSON object after the tool's name, e.g. use ");
        say_n(out, name, name_n);
        say(out, " {\"key\": \"value\"}.");
    } else {
        add_call(out, turn, name, name_n, args.b ? args.b : "", args.n);
    }
    r->oom |= why.oom || args.oom;
    free(why.b);
    free(args.b);
    return 1;
}

/* is_word is RE2's \w: [0-9A-Za-z_]. */
static int is_word(char c) { return is_letter(c) || (c >= '0' && c <= '9') || c == '_'; }

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* unit_at returns the end of (?:seconds?|secs?|s)\b at s[i] (after \s*),
 * or 0 when none matches; s has n bytes. */
static size_t unit_at(const char *s, size_t n, size_t i) {
    while (i < n && is_re_space((unsigned char)s[i])) i++;
    static const char *const units[] = {"seconds", "second", "secs", "sec", "s"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t m = strlen(units[u]);
        if (i + m <= n && memcmp(s + i, units[u], m) == 0 && (i + m == n || !is_word(s[i + m]))) return i + m;
    }
    return 0;
}

/* seconds_in finds the leftmost match of the Go model's
 * (\d+(?:\.\d+)?)\s*(?:seconds?|secs?|s)\b in s and sets the number's
 * span; 0 when there is none. */
static int seconds_in(const char *s, size_t n, size_t *from, size_t *to) {
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(s[i])) continue;
        size_t d = i;
        while (d < n && is_digit(s[d])) d++;
        if (d + 1 < n && s[d] == '.' && is_digit(s[d + 1])) {
            size_t f = d + 1;
            while (f < n && is_digit(s[f])) f++;
            if (unit_at(s, n, f)) {
                *from = i, *to = f;
                return 1;
            }
        }
        if (unit_at(s, n, d)) {
            *from = i, *to = d;
            return 1;
        }
    }
    return 0;
}

static int slow_job_rule(request *r, const char *lower, size_t n, int turn, reply *out) {
    if (!contains(lower, n, "slow job") && !contains(lower, n, "slow_job") && !contains(lower, n, "slow-job")) return 0;
    if (!offers(r, TOOL_SLOW_JOB, strlen(TOOL_SLOW_JOB))) {
        say(out, "I would start a slow job with the slow_job tool, but this Run does not offer it. Add the slow-job plugin to the tenant's tools.");
        return 1;
    }
    double secs = DEFAULT_SLOW_JOB_SECONDS;
    size_t from, to;
    if (seconds_in(lower, n, &from, &to)) {
        /* strconv.ParseFloat: past the largest float64 is an error, and
         * the default stays */
        json_buf num = {0};
        jb_write(&num, lower + from, to - from);
        double v = num.b ? strtod(num.b, NULL) : 0;
        if (!isinf(v) && v > 0) secs = v;
        r->oom |= num.oom;
        free(num.b);
    }
    json_buf args = {0};
    jb_raw(&args, "{\"label\":\"demo\",\"seconds\":");
    go_float(&args, secs, 0);
    jb_raw(&args, "}");
    add_call(out, turn, TOOL_SLOW_JOB, strlen(TOOL_SLOW_JOB), args.b ? args.b : "", args.n);
    r->oom |= args.oom;
    free(args.b);
    return 1;
}

static int is_expr_char(char c) { return is_digit(c) || (c != 0 && strchr("-+*/%^(). \t", c) != NULL); }

/* has_binary_op reports whether s applies an operator to two operands:
 * "-3" alone is a number, not a question. */
static int has_binary_op(const char *s, size_t n) {
    int operand = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (is_digit(c) || c == ')') {
            operand = 1;
        } else if (strchr("+-*/%^", c) && operand) {
            return 1;
        } else if (c != ' ' && c != '\t' && c != '.') {
            operand = 0;
        }
    }
    return 0;
}

/* expressions appends to list the arithmetic expressions in t, each as a
 * NUL-terminated string, and returns how many: the runs of expression
 * characters that, trimmed of space and a full stop, parse and hold a
 * binary operator. */
static int expressions(const char *t, size_t n, json_buf *list) {
    int count = 0;
    for (size_t i = 0; i < n;) {
        if (!is_expr_char(t[i])) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && is_expr_char(t[j])) j++;
        size_t s = i, e = j;
        while (s < e && (t[s] == ' ' || t[s] == '\t')) s++;
        while (e > s && (t[e - 1] == ' ' || t[e - 1] == '\t')) e--;
        while (e > s && t[e - 1] == '.') e--;
        while (e > s && (t[e - 1] == ' ' || t[e - 1] == '\t')) e--;
        size_t at = list->n;
        jb_write(list, t + s, e - s);
        jb_write(list, "", 1);
        if (!list->oom && has_binary_op(t + s, e - s) && expr_check(list->b + at)) {
            count++;
        } else if (!list->oom) {
            list->n = at;
        }
        i = j;
    }
    return count;
}

static int arithmetic_rule(request *r, const char *t, size_t n, int turn, reply *out) {
    json_buf list = {0};
    int count = expressions(t, n, &list);
    r->oom |= list.oom;
    if (count == 0) {
        free(list.b);
        return 0;
    }
    if (!offers(r, TOOL_CALCULATE, strlen(TOOL_CALCULATE))) {
        say(out, "I would use the calculate tool for ");
        const char *e = list.b;
        for (int i = 0; i < count; i++, e += strlen(e) + 1) {
            if (i > 0) say(out, " and ");
            say(out, e);
        }
        say(out, ", but this Run does not offer it, and a scripted model does no arithmetic of its own. Add the calculator plugin to the tenant's tools.");
    } else {
        const char *e = list.b;
        for (int i = 0; i < count; i++, e += strlen(e) + 1) {
            json_buf args = {0};
            jb_raw(&args, "{\"expression\":");
            jb_string(&args, e);
            jb_raw(&args, "}");
            add_call(out, turn, TOOL_CALCULATE, strlen(TOOL_CALCULATE), args.b ? args.b : "", args.n);
            r->oom |= args.oom;
            free(args.b);
        }
    }
    free(list.b);
    return 1;
}

static const char *const time_phrases[] = {"what time", "what's the time", "the time now", "what day", "today's date", "what date", NULL};
static const char *const capability_phrases[] = {"what can you do", "what do you do", "help", NULL};
static const char *const greeting_phrases[] = {"hello", "hi", "hey", "good morning", "good afternoon", "good evening", NULL};
static const char *const thanks_phrases[] = {"thanks", "thank you", NULL};

static void capabilities(const request *r, reply *out) {
    say(out, "I am agenthost's scripted demo model. I can: answer arithmetic questions with the calculate tool "
             "(\"What is (2+3)*4?\", or two at once: \"What is 2+3 and 4*5?\"); start a slow job with the slow_job tool "
             "(\"run a slow job for 3 seconds\"); greet you; tell you that I cannot know the time; and call any tool the "
             "Run offers when you write use TOOL {JSON arguments} (use calculate {\"expression\": \"2^10\"}). ");
    say_tools(r, out, "This Run offers no tools.", "This Run offers the tools: ");
}

/* answer_question tries the rules in order on the question t. */
static void answer_question(request *r, const char *t, size_t n, int turn, reply *out) {
    if (use_rule(r, t, n, turn, out)) return;
    json_buf lower = {0};
    go_lower(&lower, t, n);
    const char *l = lower.b ? lower.b : "";
    size_t ln = lower.n;
    r->oom |= lower.oom;
    if (slow_job_rule(r, l, ln, turn, out)) {
    } else if (arithmetic_rule(r, t, n, turn, out)) {
    } else if (contains_any(l, ln, time_phrases)) {
        say(out, "I can't know the time: I am a scripted demo model with no clock, and I answer the same way every time. Your computer's clock knows.");
    } else if (contains_any(l, ln, capability_phrases)) {
        capabilities(r, out);
    } else if (contains_any(l, ln, greeting_phrases)) {
        say(out, "Hello! I am agenthost's scripted demo model. Ask me an arithmetic question such as \"What is (2+3)*4?\", or ask what I can do.");
    } else if (contains_any(l, ln, thanks_phrases)) {
        say(out, "You're welcome.");
    } else {
        say(out, fallback_text);
        say(out, " I have no rule for ");
        json_buf clip = {0};
        go_clip(&clip, t, n, 80);
        go_quote(&out->content, clip.b ? clip.b : "", clip.n);
        r->oom |= clip.oom;
        free(clip.b);
        say(out, ". Try \"What is (2+3)*4?\", \"What is 2+3 and 4*5?\", \"run a slow job\" or \"what can you do\". ");
        say(out, configure_hint);
    }
    free(lower.b);
}

/* decide makes the model's message. */
static void decide(request *r, reply *out) {
    const message_view *msgs = r->v.messages;
    size_t n = r->v.n_messages, last = n;
    for (size_t i = 0; i < n; i++) {
        if (role_is(&msgs[i], "user")) last = i;
    }
    if (last == n) {
        say(out, "I was given no user message to answer. ");
        say(out, configure_hint);
        return;
    }
    /* turn counts the assistant messages since the question, so that
     * tool call IDs differ from one step to the next. */
    int turn = 1;
    const message_view *asked = NULL;
    size_t asked_at = 0;
    int results = 0;
    for (size_t i = last + 1; i < n; i++) {
        if (role_is(&msgs[i], "assistant")) {
            turn++;
            if (has_elements(msgs[i].tool_calls)) {
                asked = &msgs[i];
                asked_at = i;
                results = 0;
            }
        } else if (role_is(&msgs[i], "tool")) {
            results++;
        }
    }
    if (asked != NULL && results > 0) {
        summarize(r, asked, asked_at + 1, out);
        return;
    }
    text q = decode(r, msgs[last].content);
    answer_question(r, str(q), q.n, turn, out);
    drop(q);
}

/* input_words counts the request's words for the usage estimate: the
 * messages' content, tool call names and arguments, and the tools'
 * names, descriptions and input schemas. */
static long long input_words(const request *r) {
    static const char *const keys[] = {"name", "arguments"};
    long long w = 0;
    for (size_t i = 0; i < r->v.n_messages; i++) {
        const message_view *m = &r->v.messages[i];
        w += json_words(m->content);
        if (is_null(m->tool_calls)) continue;
        const char *p = json_ws(json_ws(m->tool_calls) + 1);
        while (*p != ']') {
            const char *call[2];
            json_get_many(p, keys, call, 2);
            w += json_words(call[0]) + raw_words(call[1]);
            p = json_ws(json_skip(p));
            if (*p == ',') p = json_ws(p + 1);
        }
    }
    for (size_t i = 0; i < r->v.n_tools; i++) {
        const tool_view *t = &r->v.tools[i];
        w += json_words(t->name) + json_words(t->description) + raw_words(t->input_schema);
    }
    return w;
}

static long long tokens(long long words) { return (words * 4 + 2) / 3; }

/* ---- the exports --------------------------------------------------------------- */

static int32_t output(json_buf *j, const char *what) {
    if (j->oom) {
        free(j->b);
        char msg[96];
        snprintf(msg, sizeof msg, NAME ": out of memory %s", what);
        return extism_error(msg);
    }
    int32_t rc = agenthost_output(j->b, j->n);
    free(j->b);
    return rc;
}

static int32_t failed(const char *message) {
    json_buf j = {0};
    jb_raw(&j, "{\"state\":\"failed\",\"error\":{\"message\":");
    jb_string(&j, message);
    jb_raw(&j, ",\"retriable\":false}}");
    return output(&j, "building the reply");
}

/* effect_input is read_effect_input without the attempt. */
static char *effect_input(effect_view *effect, int32_t *rc) {
    long long attempt;
    return read_effect_input(effect, &attempt, rc);
}

EXTISM_EXPORT(describe) int32_t describe(void) {
    int32_t rc = check_describe_input();
    if (rc >= 0) return rc;
    const char *d = "{\"abi\":1,\"name\":\"" NAME "\",\"version\":\"1.0.0\",\"role\":\"executor\",\"effects\":[\"model\"],\"attach\":false}";
    return agenthost_output(d, strlen(d));
}

EXTISM_EXPORT(start) int32_t start(void) {
    effect_view effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;

    request r = {0};
    text id = decode(&r, effect.id);
    const char *kind = effect.kind, *req = effect.request;
    if (!json_string_is(kind, "model")) {
        json_buf msg = {0};
        text k = decode(&r, kind);
        jb_raw(&msg, NAME ": effect ");
        jb_write(&msg, str(id), id.n);
        jb_raw(&msg, " is of kind ");
        go_quote(&msg, str(k), k.n);
        jb_raw(&msg, "; this plugin carries out model effects only");
        drop(k);
        drop(id);
        free(in);
        rc = msg.oom ? extism_error(NAME ": out of memory") : failed(msg.b);
        free(msg.b);
        return rc;
    }
    const char *bad = req == NULL ? "unexpected end of JSON input" : model_request_view(req, &r.v, &r.oom);
    if (bad != NULL) {
        json_buf msg = {0};
        jb_raw(&msg, NAME ": abi: effect ");
        jb_write(&msg, str(id), id.n);
        jb_raw(&msg, ": request is not a model request: ");
        jb_raw(&msg, bad);
        drop(id);
        free(in);
        rc = msg.oom ? extism_error(NAME ": out of memory") : failed(msg.b);
        free(msg.b);
        return rc;
    }
    drop(id);

    r.tool_names = calloc(r.v.n_tools ? r.v.n_tools : 1, sizeof *r.tool_names);
    r.oom |= r.tool_names == NULL;
    for (size_t i = 0; !r.oom && i < r.v.n_tools; i++) r.tool_names[i] = decode(&r, r.v.tools[i].name);

    reply out = {0};
    json_buf j = {0};
    if (!r.oom) decide(&r, &out);
    if (!r.oom) {
        jb_raw(&j, "{\"state\":\"done\",\"outcome\":{\"message\":{\"role\":\"assistant\",\"content\":");
        jb_string_n(&j, out.content.b ? out.content.b : "", out.content.n);
        if (out.n_calls > 0) {
            jb_raw(&j, ",\"tool_calls\":[");
            jb_write(&j, out.calls.b, out.calls.n);
            jb_raw(&j, "]");
        }
        char usage[96];
        long long out_words = out.out_words + words(out.content.b ? out.content.b : "", out.content.n);
        snprintf(usage, sizeof usage, "},\"usage\":{\"input_tokens\":%lld,\"output_tokens\":%lld}}}",
                 tokens(input_words(&r)), tokens(out_words));
        jb_raw(&j, usage);
    }
    j.oom |= r.oom || out.content.oom || out.calls.oom;
    for (size_t i = 0; r.tool_names != NULL && i < r.v.n_tools; i++) drop(r.tool_names[i]);
    free(r.tool_names);
    free(r.v.messages);
    free(r.v.tools);
    free(out.content.b);
    free(out.calls.b);
    free(in);
    return output(&j, "answering the request");
}

/* poll and attach: the model answers in the call that starts it, so it
 * holds no record of any attempt. */
static int32_t no_record(void) {
    effect_view effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;
    free(in);
    const char *d = "{\"state\":\"unknown\"}";
    return agenthost_output(d, strlen(d));
}

EXTISM_EXPORT(poll) int32_t poll(void) { return no_record(); }

EXTISM_EXPORT(attach) int32_t attach(void) { return no_record(); }

EXTISM_EXPORT(cancel) int32_t cancel(void) {
    effect_view effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;
    free(in);
    const char *d = "{\"state\":\"cancelled\"}";
    return agenthost_output(d, strlen(d));
}
