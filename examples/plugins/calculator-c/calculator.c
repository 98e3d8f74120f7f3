/*
 * calculator-c: the calculator example in C. The tool "calculate"
 * evaluates an arithmetic expression with a recursive-descent parser
 * (../c/expr.h, which scripted-model-c shares):
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
#include "../c/expr.h"

AGENTHOST_ABI_V1

/* ---- the plugin ------------------------------------------------------- */

static int32_t reply(json_buf *j) {
    if (j->oom) {
        free(j->b);
        return extism_error("calculator-c: out of memory building the reply");
    }
    int32_t rc = agenthost_output(j->b, j->n);
    free(j->b);
    return rc;
}

static int32_t reply_raw(const char *json) { return agenthost_output(json, strlen(json)); }

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
    char *in = agenthost_input(NULL);
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
    char *in = agenthost_input(NULL);
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
    int ok = expr_eval(expression, out + 7, sizeof out - 7);
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
