/*
 * expr.h: the arithmetic of the C examples: a recursive-descent parser and
 * evaluator of + - * / % ^, parentheses, unary minus and decimals, with
 * the grammar, results and error messages of the Go calculator
 * (examples/plugins/calculator/expr). calculator-c evaluates with
 * expr_eval; scripted-model-c finds the expressions in a question with
 * expr_check.
 *
 * Single-file: include it in one .c file, after <math.h> and <stdio.h>
 * (the functions are static inline).
 */
#ifndef AGENTHOST_EXPR_H
#define AGENTHOST_EXPR_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#define EXPR_MAX_LENGTH 4096
#define EXPR_MAX_DEPTH 64

enum expr_tok_kind { EXPR_END, EXPR_NUM, EXPR_OP };

typedef struct {
    enum expr_tok_kind kind;
    char op;
    double num;
    int pos; /* 1-based */
} expr_token;

typedef struct {
    const char *src;
    size_t len, i;
    expr_token tok;
    int depth;
    int no_eval; /* parse only: no division by zero is an error */
    char err[160]; /* empty: no error */
} expr_parser;

static inline void expr_fail(expr_parser *p, const char *msg) {
    if (p->err[0] == 0) {
        snprintf(p->err, sizeof p->err, "%s", msg);
    }
    p->tok = (expr_token){.kind = EXPR_END, .pos = (int)p->len + 1};
}

static inline int expr_is_digit(char c) { return c >= '0' && c <= '9'; }

static inline void expr_next(expr_parser *p) {
    while (p->i < p->len && (p->src[p->i] == ' ' || p->src[p->i] == '\t')) {
        p->i++;
    }
    int pos = (int)p->i + 1;
    if (p->i >= p->len) {
        p->tok = (expr_token){.kind = EXPR_END, .pos = pos};
        return;
    }
    char c = p->src[p->i];
    char msg[160];
    if (expr_is_digit(c) || c == '.') {
        size_t start = p->i;
        while (p->i < p->len && expr_is_digit(p->src[p->i])) p->i++;
        if (p->i < p->len && p->src[p->i] == '.') {
            p->i++;
            size_t digits = p->i;
            while (p->i < p->len && expr_is_digit(p->src[p->i])) p->i++;
            if (p->i == digits) {
                snprintf(msg, sizeof msg, "malformed number \"%.*s\" at position %d: expected a digit after '.'",
                         (int)(p->i - start), p->src + start, pos);
                expr_fail(p, msg);
                return;
            }
        }
        char num[EXPR_MAX_LENGTH + 1];
        memcpy(num, p->src + start, p->i - start);
        num[p->i - start] = 0;
        double v = strtod(num, NULL);
        if (isinf(v)) {
            snprintf(msg, sizeof msg, "number \"%.40s\" at position %d is too large", num, pos);
            expr_fail(p, msg);
            return;
        }
        p->tok = (expr_token){.kind = EXPR_NUM, .num = v, .pos = pos};
        return;
    }
    if (strchr("+-*/%^()", c)) {
        p->i++;
        p->tok = (expr_token){.kind = EXPR_OP, .op = c, .pos = pos};
        return;
    }
    unsigned char u = (unsigned char)c;
    if (u >= 0x20 && u < 0x7f) {
        snprintf(msg, sizeof msg, "unexpected character '%c' at position %d", c, pos);
    } else {
        snprintf(msg, sizeof msg, "unexpected character byte 0x%02x at position %d", u, pos);
    }
    expr_fail(p, msg);
}

/* unexpected describes the current token where it does not fit. */
static inline void expr_unexpected(expr_parser *p) {
    char msg[160];
    switch (p->tok.kind) {
    case EXPR_END:
        snprintf(msg, sizeof msg, "unexpected end of expression: expected a number or '('");
        break;
    case EXPR_NUM:
        snprintf(msg, sizeof msg, "unexpected number at position %d: expected an operator", p->tok.pos);
        break;
    default:
        snprintf(msg, sizeof msg, "unexpected '%c' at position %d", p->tok.op, p->tok.pos);
    }
    expr_fail(p, msg);
}

/* is_op returns the current operator when it is one of ops, else 0. */
static inline char expr_is_op(expr_parser *p, const char *ops) {
    if (p->err[0] || p->tok.kind != EXPR_OP || !strchr(ops, p->tok.op)) return 0;
    return p->tok.op;
}

static inline int expr_enter(expr_parser *p) {
    if (++p->depth > EXPR_MAX_DEPTH) {
        char msg[80];
        snprintf(msg, sizeof msg, "the expression nests deeper than %d levels", EXPR_MAX_DEPTH);
        expr_fail(p, msg);
        return 0;
    }
    return 1;
}

static inline double expr_sum(expr_parser *p);
static inline double expr_unary(expr_parser *p);

static inline double expr_primary(expr_parser *p) {
    if (p->err[0]) return 0;
    if (p->tok.kind == EXPR_NUM) {
        double v = p->tok.num;
        expr_next(p);
        return v;
    }
    if (p->tok.kind == EXPR_OP && p->tok.op == '(') {
        if (!expr_enter(p)) return 0;
        int open = p->tok.pos;
        char msg[80];
        double v = 0;
        expr_next(p);
        if (expr_is_op(p, ")")) {
            snprintf(msg, sizeof msg, "empty parentheses at position %d", open);
            expr_fail(p, msg);
        } else {
            v = expr_sum(p);
            if (!p->err[0] && !expr_is_op(p, ")")) {
                if (p->tok.kind == EXPR_END) {
                    snprintf(msg, sizeof msg, "missing ')' for the '(' at position %d", open);
                    expr_fail(p, msg);
                } else {
                    expr_unexpected(p);
                }
            }
            if (!p->err[0]) expr_next(p);
        }
        p->depth--;
        return p->err[0] ? 0 : v;
    }
    expr_unexpected(p);
    return 0;
}

/* power = primary [ "^" unary ]: right-associative, tighter than unary minus. */
static inline double expr_power(expr_parser *p) {
    double base = expr_primary(p);
    if (!expr_is_op(p, "^")) return base;
    expr_next(p);
    double e = expr_unary(p);
    return pow(base, e);
}

static inline double expr_unary(expr_parser *p) {
    char op = expr_is_op(p, "+-");
    if (!op) return expr_power(p);
    if (!expr_enter(p)) return 0;
    expr_next(p);
    double v = expr_unary(p);
    p->depth--;
    return op == '-' ? -v : v;
}

static inline double expr_term(expr_parser *p) {
    double v = expr_unary(p);
    char op;
    while ((op = expr_is_op(p, "*/%"))) {
        int pos = p->tok.pos;
        expr_next(p);
        double r = expr_unary(p);
        if (p->err[0]) return 0;
        if (op == '*') {
            v *= r;
        } else if (r == 0 && !p->no_eval) {
            char msg[80];
            snprintf(msg, sizeof msg, "%s by zero at position %d", op == '%' ? "remainder" : "division", pos);
            expr_fail(p, msg);
            return 0;
        } else if (op == '/') {
            v /= r;
        } else {
            v = fmod(v, r);
        }
    }
    return v;
}

static inline double expr_sum(expr_parser *p) {
    double v = expr_term(p);
    char op;
    while ((op = expr_is_op(p, "+-"))) {
        expr_next(p);
        double r = expr_term(p);
        v = op == '+' ? v + r : v - r;
    }
    return v;
}

/* expr_eval evaluates s. It returns 1 and writes the result to out, or 0 and
 * writes the error message to out. */
static inline int expr_eval(const char *s, char *out, size_t n) {
    expr_parser p = {.src = s, .len = strlen(s)};
    if (p.len > EXPR_MAX_LENGTH) {
        snprintf(out, n, "the expression is %zu characters long; the limit is %d", p.len, EXPR_MAX_LENGTH);
        return 0;
    }
    expr_next(&p);
    if (!p.err[0] && p.tok.kind == EXPR_END) {
        snprintf(out, n, "empty expression");
        return 0;
    }
    double v = 0;
    if (!p.err[0]) v = expr_sum(&p);
    if (!p.err[0] && p.tok.kind != EXPR_END) expr_unexpected(&p);
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

/* expr_check reports whether s parses, as Check of the Go package expr
 * does: it writes nothing and evaluates nothing, so a division by zero is
 * not an error, and returns 1 when s is an expression. */
static inline int expr_check(const char *s) {
    expr_parser p = {.src = s, .len = strlen(s), .no_eval = 1};
    if (p.len > EXPR_MAX_LENGTH) return 0;
    expr_next(&p);
    if (p.err[0] || p.tok.kind == EXPR_END) return 0;
    expr_sum(&p);
    if (!p.err[0] && p.tok.kind != EXPR_END) expr_unexpected(&p);
    return !p.err[0];
}

#endif
