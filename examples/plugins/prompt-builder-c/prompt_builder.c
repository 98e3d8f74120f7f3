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
#include "../c/gostr.h"
#include "../c/abishape.h"

AGENTHOST_ABI_V1

/* DefaultSystemPrompt of examples/plugins/prompt-builder/prompt, byte for byte. */
static const char default_system_prompt[] =
    "You are a careful, concise assistant running on agenthost. "
    "Use the tools you are offered when they help: use the calculate tool for arithmetic rather than working it out yourself, "
    "and call independent tools together in one message. When you have the answer, state it plainly.";

#define DEFAULT_HISTORY_WINDOW 20

/* ---- config ------------------------------------------------------------ */

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
        go_trim_space(v, strlen(v), &s, &e);
        if (s != e) {
            c->system_prompt = v;
            v = NULL;
        }
        free(v);
    }
    v = extism_config("history_window");
    if (v == NULL) return 1;
    go_trim_space(v, strlen(v), &s, &e);
    if (s != e) {
        long long n;
        if (!go_atoi(s, e, &n) || n < 0) {
            json_buf j = {0};
            jb_raw(&j, "prompt-builder: config history_window: ");
            go_quote(&j, v, strlen(v));
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
static int is_tool_message(const char *v) { return !is_null(v) && json_string_is(json_get(v, "role"), "tool"); }

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
    int32_t rc = check_describe_input();
    if (rc >= 0) return rc;
    const char *d = "{\"abi\":1,\"name\":\"prompt-builder\",\"version\":\"1.0.0\",\"role\":\"builder\",\"attach\":false}";
    return agenthost_output(d, strlen(d));
}

EXTISM_EXPORT(build) int32_t build(void) {
    char *in = agenthost_input(NULL);
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
    const char **h = json_elements(history, &n, &oom);
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
    int32_t rc = agenthost_output(j.b, j.n);
    free(j.b);
    return rc;
}
