/*
 * calculator-c: the calculator example in C. The tool "calculate"
 * evaluates an arithmetic expression with a recursive-descent parser:
 * + - * / % ^, parentheses, unary minus and decimals, with the grammar,
 * results and error messages of the Go calculator
 * (examples/plugins/calculator/expr); the examples' tests hold both to one
 * table. A malformed expression or a division by zero is a tool result
 * with is_error true, never a trap.
 *
 * Build: examples/plugins/calculator-c/build.sh calculator-c.wasm
 */
#include <math.h>
#include <stdio.h>

#include "../c/extism.h"
#include "../c/agenthost.h"
#include "../c/json.h"

AGENTHOST_ABI_V1

/* ---- the evaluator ---------------------------------------------------- */

#define MAX_LENGTH 4096
#define MAX_DEPTH 64

enum tok_kind { TOK_END, TOK_NUM, TOK_OP };

typedef struct {
    enum tok_kind kind;
    char op;
    double num;
    int pos; /* 1-based */
} token;

typedef struct {
    const char *src;
    size_t len, i;
    token tok;
    int depth;
    char err[160]; /* empty: no error */
} parser;

static void fail(parser *p, const char *msg) {
    if (p->err[0] == 0) {
        snprintf(p->err, sizeof p->err, "%s", msg);
    }
    p->tok = (token){.kind = TOK_END, .pos = (int)p->len + 1};
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static void next(parser *p) {
    while (p->i < p->len && (p->src[p->i] == ' ' || p->src[p->i] == '\t')) {
        p->i++;
    }
    int pos = (int)p->i + 1;
    if (p->i >= p->len) {
        p->tok = (token){.kind = TOK_END, .pos = pos};
        return;
    }
    char c = p->src[p->i];
    char msg[160];
    if (is_digit(c) || c == '.') {
        size_t start = p->i;
        while (p->i < p->len && is_digit(p->src[p->i])) p->i++;
        if (p->i < p->len && p->src[p->i] == '.') {
            p->i++;
            size_t digits = p->i;
            while (p->i < p->len && is_digit(p->src[p->i])) p->i++;
            if (p->i == digits) {
                snprintf(msg, sizeof msg, "malformed number \"%.*s\" at position %d: expected a digit after '.'",
                         (int)(p->i - start), p->src + start, pos);
                fail(p, msg);
                return;
            }
        }
        char num[MAX_LENGTH + 1];
        memcpy(num, p->src + start, p->i - start);
        num[p->i - start] = 0;
        double v = strtod(num, NULL);
        if (isinf(v)) {
            snprintf(msg, sizeof msg, "number \"%.40s\" at position %d is too large", num, pos);
            fail(p, msg);
            return;
        }
        p->tok = (token){.kind = TOK_NUM, .num = v, .pos = pos};
        return;
    }
    if (strchr("+-*/%^()", c)) {
        p->i++;
        p->tok = (token){.kind = TOK_OP, .op = c, .pos = pos};
        return;
    }
    unsigned char u = (unsigned char)c;
    if (u >= 0x20 && u < 0x7f) {
        snprintf(msg, sizeof msg, "unexpected character '%c' at position %d", c, pos);
    } else {
        snprintf(msg, sizeof msg, "unexpected character byte 0x%02x at position %d", u, pos);
    }
    fail(p, msg);
}

/* unexpected describes the current token where it does not fit. */
static void unexpected(parser *p) {
    char msg[160];
    switch (p->tok.kind) {
    case TOK_END:
        snprintf(msg, sizeof msg, "unexpected end of expression: expected a number or '('");
        break;
    case TOK_NUM:
        snprintf(msg, sizeof msg, "unexpected number at position %d: expected an operator", p->tok.pos);
        break;
    default:
        snprintf(msg, sizeof msg, "unexpected '%c' at position %d", p->tok.op, p->tok.pos);
    }
    fail(p, msg);
}

/* is_op returns the current operator when it is one of ops, else 0. */
static char is_op(parser *p, const char *ops) {
    if (p->err[0] || p->tok.kind != TOK_OP || !strchr(ops, p->tok.op)) return 0;
    return p->tok.op;
}

static int enter(parser *p) {
    if (++p->depth > MAX_DEPTH) {
        char msg[80];
        snprintf(msg, sizeof msg, "the expression nests deeper than %d levels", MAX_DEPTH);
        fail(p, msg);
        return 0;
    }
    return 1;
}

static double expr(parser *p);
static double unary(parser *p);

static double primary(parser *p) {
    if (p->err[0]) return 0;
    if (p->tok.kind == TOK_NUM) {
        double v = p->tok.num;
        next(p);
        return v;
    }
    if (p->tok.kind == TOK_OP && p->tok.op == '(') {
        if (!enter(p)) return 0;
        int open = p->tok.pos;
        char msg[80];
        double v = 0;
        next(p);
        if (is_op(p, ")")) {
            snprintf(msg, sizeof msg, "empty parentheses at position %d", open);
            fail(p, msg);
        } else {
            v = expr(p);
            if (!p->err[0] && !is_op(p, ")")) {
                if (p->tok.kind == TOK_END) {
                    snprintf(msg, sizeof msg, "missing ')' for the '(' at position %d", open);
                    fail(p, msg);
                } else {
                    unexpected(p);
                }
            }
            if (!p->err[0]) next(p);
        }
        p->depth--;
        return p->err[0] ? 0 : v;
    }
    unexpected(p);
    return 0;
}

/* power = primary [ "^" unary ]: right-associative, tighter than unary minus. */
static double power(parser *p) {
    double base = primary(p);
    if (!is_op(p, "^")) return base;
    next(p);
    double e = unary(p);
    return pow(base, e);
}

static double unary(parser *p) {
    char op = is_op(p, "+-");
    if (!op) return power(p);
    if (!enter(p)) return 0;
    next(p);
    double v = unary(p);
    p->depth--;
    return op == '-' ? -v : v;
}

static double term(parser *p) {
    double v = unary(p);
    char op;
    while ((op = is_op(p, "*/%"))) {
        int pos = p->tok.pos;
        next(p);
        double r = unary(p);
        if (p->err[0]) return 0;
        if (op == '*') {
            v *= r;
        } else if (r == 0) {
            char msg[80];
            snprintf(msg, sizeof msg, "%s by zero at position %d", op == '%' ? "remainder" : "division", pos);
            fail(p, msg);
            return 0;
        } else if (op == '/') {
            v /= r;
        } else {
            v = fmod(v, r);
        }
    }
    return v;
}

static double expr(parser *p) {
    double v = term(p);
    char op;
    while ((op = is_op(p, "+-"))) {
        next(p);
        double r = term(p);
        v = op == '+' ? v + r : v - r;
    }
    return v;
}

/* eval evaluates s. It returns 1 and writes the result to out, or 0 and
 * writes the error message to out. */
static int eval(const char *s, char *out, size_t n) {
    parser p = {.src = s, .len = strlen(s)};
    if (p.len > MAX_LENGTH) {
        snprintf(out, n, "the expression is %zu characters long; the limit is %d", p.len, MAX_LENGTH);
        return 0;
    }
    next(&p);
    if (!p.err[0] && p.tok.kind == TOK_END) {
        snprintf(out, n, "empty expression");
        return 0;
    }
    double v = 0;
    if (!p.err[0]) v = expr(&p);
    if (!p.err[0] && p.tok.kind != TOK_END) unexpected(&p);
    if (p.err[0]) {
        snprintf(out, n, "%s", p.err);
        return 0;
    }
    if (isinf(v)) {
        snprintf(out, n, "the result is too large");
        return 0;
    }
    if (isnan(v)) {
        snprintf(out, n, "the result is not a real number");
        return 0;
    }
    /* An integer without a decimal point (below 1e15), else 15 significant digits. */
    if (v == trunc(v) && fabs(v) < 1e15) {
        snprintf(out, n, "%.0f", v == 0 ? 0.0 : v);
    } else {
        snprintf(out, n, "%.15g", v);
    }
    return 1;
}

/* ---- the plugin ------------------------------------------------------- */

static int32_t reply(json_buf *j) {
    if (j->oom) {
        free(j->b);
        return extism_error("calculator-c: out of memory building the reply");
    }
    int32_t rc = extism_output(j->b, j->n);
    free(j->b);
    return rc;
}

static int32_t reply_raw(const char *json) { return extism_output(json, strlen(json)); }

static int32_t tool_result(const char *content, int is_error) {
    json_buf j = {0};
    jb_raw(&j, "{\"state\":\"done\",\"outcome\":{\"content\":");
    jb_string(&j, content);
    jb_raw(&j, is_error ? ",\"is_error\":true}}" : ",\"is_error\":false}}");
    return reply(&j);
}

static int32_t failed(const char *message) {
    json_buf j = {0};
    jb_raw(&j, "{\"state\":\"failed\",\"error\":{\"message\":");
    jb_string(&j, message);
    jb_raw(&j, ",\"retriable\":false}}");
    return reply(&j);
}

/* effect_input reads the input of start, poll, attach or cancel, and
 * checks that it names an effect attempt. On success it returns the input
 * (free it) and sets *effect; otherwise it sets *rc to the status to
 * return and returns NULL. */
static char *effect_input(const char **effect, int32_t *rc) {
    char *in = extism_input(NULL);
    if (in == NULL) {
        *rc = extism_error("calculator-c: out of memory reading the input");
        return NULL;
    }
    if (!json_valid(in)) {
        free(in);
        *rc = extism_error("the input is not an effect input: it is not JSON");
        return NULL;
    }
    *effect = json_get(in, "effect");
    char *id = json_string(json_get(*effect, "id"));
    long long attempt = 0;
    int ok = id != NULL && id[0] != 0 && json_int(json_get(*effect, "attempt"), &attempt) && attempt >= 1;
    free(id);
    if (!ok) {
        free(in);
        *rc = extism_error("the input names no effect attempt: effect.id and effect.attempt (from 1) are required");
        return NULL;
    }
    return in;
}

EXTISM_EXPORT(describe) int32_t describe(void) {
    char *in = extism_input(NULL);
    int ok = in != NULL && json_valid(in);
    free(in);
    if (!ok) return extism_error("describe: the input is not JSON");
    return reply_raw(
        "{\"abi\":1,\"name\":\"calculator-c\",\"version\":\"1.0.0\",\"role\":\"executor\",\"effects\":[\"tool\"],"
        "\"tools\":[{\"name\":\"calculate\","
        "\"description\":\"Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus and decimals. Example: (2+3)*4\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"expression\":{\"type\":\"string\",\"description\":\"the expression, e.g. (2+3)*4\"}},\"required\":[\"expression\"]},"
        "\"idempotent\":true,\"approval\":\"never\"}],"
        "\"attach\":false}");
}

static int is_null(const char *v) { return v == NULL || strncmp(v, "null", 4) == 0; }

EXTISM_EXPORT(start) int32_t start(void) {
    const char *effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;

    char *kind = json_string(json_get(effect, "kind"));
    char *tool = json_string(json_get(effect, "tool"));
    if (kind == NULL || tool == NULL || strcmp(kind, "tool") != 0 || strcmp(tool, "calculate") != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "calculator: no tool \"%.64s\" of kind \"%.16s\" here; this plugin offers the tool \"calculate\"",
                 tool ? tool : "", kind ? kind : "");
        free(kind);
        free(tool);
        free(in);
        return failed(msg);
    }
    free(kind);
    free(tool);

    /* request.arguments.expression; a missing or null request or
     * arguments is {} */
    const char *request = json_get(effect, "request");
    const char *args = is_null(request) ? NULL : json_get(request, "arguments");
    if (!is_null(request) && *json_ws(request) != '{') args = "[";
    if (args != NULL && !is_null(args) && *json_ws(args) != '{') {
        free(in);
        return tool_result("error: the arguments must be {\"expression\": \"...\"}: they are not a JSON object", 1);
    }
    const char *e = is_null(args) ? NULL : json_get(args, "expression");
    if (is_null(e)) {
        free(in);
        return tool_result("error: the argument \"expression\" is missing; pass {\"expression\": \"(2+3)*4\"}", 1);
    }
    char *expression = json_string(e);
    free(in);
    if (expression == NULL) {
        return tool_result("error: the arguments must be {\"expression\": \"...\"}: expression is not a string", 1);
    }
    char out[256] = "error: ";
    int ok = eval(expression, out + 7, sizeof out - 7);
    free(expression);
    return ok ? tool_result(out + 7, 0) : tool_result(out, 1);
}

/* poll and attach: the calculator never answers pending, so it holds no
 * record of any attempt. */
static int32_t no_record(void) {
    const char *effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;
    free(in);
    return reply_raw("{\"state\":\"unknown\"}");
}

EXTISM_EXPORT(poll) int32_t poll(void) { return no_record(); }

EXTISM_EXPORT(attach) int32_t attach(void) { return no_record(); }

EXTISM_EXPORT(cancel) int32_t cancel(void) {
    const char *effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;
    free(in);
    return reply_raw("{\"state\":\"cancelled\"}");
}
