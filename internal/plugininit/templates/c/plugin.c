/*
 * __NAME__: an agenthost tool plugin in C (ABI v1, docs/ABI.md). It offers
 * the tool word_count, which counts the words of a text. Bad arguments
 * are a tool result with is_error true, which the model reads and can
 * correct: never a trap, never a failed effect.
 *
 * Build:  ./build.sh     (clang --target=wasm32-wasi -mexec-model=reactor ...)
 * Check:  ./verify.sh    (agenthost plugin verify __NAME__.wasm, and a call)
 *
 * extism.h declares the extism:host/env imports by hand (no PDK needed),
 * agenthost.h the agenthost host functions and the marker, json.h a small
 * JSON reader and writer.
 */
#include <stdio.h>

#include "extism.h"
#include "agenthost.h"
#include "json.h"

AGENTHOST_ABI_V1

#define TOOL "word_count"

/* count_words counts the runs of bytes between ASCII white space (space,
 * tab, line feed, carriage return, form feed, vertical tab): "héllo wörld"
 * is two words. */
static long count_words(const char *s) {
    long n = 0;
    int in = 0;
    for (; *s; s++) {
        if (strchr(" \t\n\r\f\v", *s) != NULL) {
            in = 0;
        } else {
            if (!in) n++;
            in = 1;
        }
    }
    return n;
}

/* ---- replies ------------------------------------------------------------ */

static int32_t reply(json_buf *j) {
    if (j->oom) {
        free(j->b);
        return extism_error("__NAME__: out of memory building the reply");
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

/* progress puts a progress event on the Run's event stream (`agenthost
 * plugin call` prints it); a failure to emit changes nothing. */
static void progress(const char *message) {
    json_buf j = {0};
    jb_raw(&j, "{\"type\":\"progress\",\"message\":");
    jb_string(&j, message);
    jb_raw(&j, "}");
    if (!j.oom) {
        extism_ptr p = extism_copy_in(j.b, j.n);
        if (p != 0) {
            agenthost_emit(p);
            extism_free(p);
        }
    }
    free(j.b);
}

/* log_info writes a line to the host's log (at debug; `agenthost plugin
 * call` prints it). */
static void log_info(const char *message) {
    extism_ptr p = extism_copy_in(message, strlen(message));
    if (p != 0) extism_log_info(p); /* the host frees it */
}

/* ---- input -------------------------------------------------------------- */

/* effect_input reads the input of start, poll, attach or cancel, and
 * checks that it names an effect attempt. On success it returns the input
 * (free it) and sets *effect; otherwise it sets *rc to the status to
 * return (a protocol error) and returns NULL. */
static char *effect_input(const char **effect, int32_t *rc) {
    char *in = extism_input(NULL);
    if (in == NULL) {
        *rc = extism_error("__NAME__: out of memory reading the input");
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

static int is_null(const char *v) { return v == NULL || strncmp(v, "null", 4) == 0; }

/* ---- the exports -------------------------------------------------------- */

EXTISM_EXPORT(describe) int32_t describe(void) {
    char *in = extism_input(NULL);
    int ok = in != NULL && json_valid(in);
    free(in);
    if (!ok) return extism_error("describe: the input is not JSON");
    return reply_raw(
        "{\"abi\":1,\"name\":\"__NAME__\",\"version\":\"0.1.0\",\"role\":\"executor\",\"effects\":[\"tool\"],"
        "\"tools\":[{\"name\":\"word_count\","
        "\"description\":\"Count the words of a text: runs of characters between spaces, tabs and line breaks. Example: {\\\"text\\\": \\\"one two three\\\"} gives 3\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\",\"description\":\"the text whose words to count\",\"examples\":[\"one two three\"]}},\"required\":[\"text\"]},"
        "\"idempotent\":true,\"approval\":\"never\"}],"
        "\"attach\":false}");
}

EXTISM_EXPORT(start) int32_t start(void) {
    const char *effect;
    int32_t rc;
    char *in = effect_input(&effect, &rc);
    if (in == NULL) return rc;

    char *kind = json_string(json_get(effect, "kind"));
    char *tool = json_string(json_get(effect, "tool"));
    if (kind == NULL || tool == NULL || strcmp(kind, "tool") != 0 || strcmp(tool, TOOL) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "__NAME__: no tool \"%.64s\" of kind \"%.16s\" here; this plugin offers the tool \"" TOOL "\"",
                 tool ? tool : "", kind ? kind : "");
        free(kind);
        free(tool);
        free(in);
        return failed(msg);
    }
    free(kind);
    free(tool);

    /* request.arguments.text; a missing or null request or arguments is {} */
    const char *request = json_get(effect, "request");
    const char *args = is_null(request) ? NULL : json_get(request, "arguments");
    if (!is_null(request) && *json_ws(request) != '{') args = "[";
    if (args != NULL && !is_null(args) && *json_ws(args) != '{') {
        free(in);
        return tool_result("error: the arguments must be a JSON object, {\"text\": \"...\"}", 1);
    }
    const char *t = is_null(args) ? NULL : json_get(args, "text");
    if (t == NULL) {
        free(in);
        return tool_result("error: the argument \"text\" is missing; pass {\"text\": \"one two three\"}", 1);
    }
    char *text = json_string(t);
    if (text == NULL) {
        const char *kinds = *t == 'n' ? "null" : *t == 't' || *t == 'f' ? "a boolean" : *t == '[' ? "an array" : *t == '{' ? "an object" : *t == '"' ? "a string holding \\u0000" : "a number";
        char msg[128];
        snprintf(msg, sizeof msg, "error: the argument \"text\" must be a string, not %s", kinds);
        free(in);
        return tool_result(msg, 1);
    }
    free(in);
    char msg[64];
    snprintf(msg, sizeof msg, "word_count: %zu bytes of text", strlen(text));
    log_info(msg);
    char count[32];
    snprintf(count, sizeof count, "%ld", count_words(text));
    free(text);
    char done[64];
    snprintf(done, sizeof done, "counted: %s words", count);
    progress(done);
    return tool_result(count, 0);
}

/* poll and attach: the tool never answers pending, so it holds no record
 * of any attempt. A tool that runs long answers pending from start, keeps
 * its state in the host KV (agenthost_kv_set), and answers here from it. */
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
