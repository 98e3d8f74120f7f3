/*
 * abishape.h: checks that a JSON value has the shape Go's decoder needs to
 * decode it into an ABI v1 type (plugins/abi), so that a C example refuses
 * the inputs its Go twin refuses; and the starts of an array's elements.
 * Include json.h first (and extism.h and agenthost.h, for
 * read_effect_input); single-file, like it (the functions are static
 * inline).
 */
#ifndef AGENTHOST_ABISHAPE_H
#define AGENTHOST_ABISHAPE_H

/* The checks below refuse what Go's decoder refuses when it decodes an
 * input into an abi type: a member of the wrong JSON type. null is always
 * allowed (it leaves the zero value). Members are matched by their exact
 * names (Go's decoder also takes other cases of a name). */

static inline int is_null(const char *v) { return v == NULL || strncmp(v, "null", 4) == 0; }

static inline int is_string_or_null(const char *v) { return is_null(v) || *v == '"'; }

static inline int is_bool_or_null(const char *v) {
    return is_null(v) || strncmp(v, "true", 4) == 0 || strncmp(v, "false", 5) == 0;
}

static inline int is_int_or_null(const char *v) {
    long long n;
    return is_null(v) || json_int(v, &n);
}

static inline int is_object_or_null(const char *v) { return is_null(v) || *v == '{'; }

/* each_element calls f on each element of the (valid) array at a, and
 * stops at the first that f refuses. */
static inline int each_element(const char *a, int (*f)(const char *)) {
    const char *p = json_ws(json_ws(a) + 1);
    if (*p == ']') return 1;
    for (;;) {
        if (!f(p)) return 0;
        p = json_ws(json_skip(p));
        if (*p == ']') return 1;
        p = json_ws(p + 1);
    }
}

static inline int is_array_of(const char *v, int (*f)(const char *)) {
    if (is_null(v)) return 1;
    return *v == '[' && each_element(v, f);
}

/* Each check below finds the members it looks at in one walk of the
 * object (json_get_many). */

static inline int tool_call_ok(const char *v) {
    static const char *const keys[] = {"id", "name"};
    const char *m[2];
    if (!is_object_or_null(v)) return 0;
    json_get_many(v, keys, m, 2);
    return is_string_or_null(m[0]) && is_string_or_null(m[1]);
}

/* message_view is the members of an abi.Message (each NULL when absent). */
typedef struct {
    const char *role, *content, *tool_calls, *tool_call_id, *is_error;
} message_view;

/* message_view_of finds the members of the message at v and reports
 * whether it decodes into abi.Message. */
static inline int message_view_of(const char *v, message_view *out) {
    static const char *const keys[] = {"role", "content", "tool_calls", "tool_call_id", "is_error"};
    const char *m[5];
    if (!is_object_or_null(v)) return 0;
    json_get_many(is_null(v) ? NULL : v, keys, m, 5);
    *out = (message_view){.role = m[0], .content = m[1], .tool_calls = m[2], .tool_call_id = m[3], .is_error = m[4]};
    return is_string_or_null(m[0]) && is_string_or_null(m[1]) && is_array_of(m[2], tool_call_ok) &&
           is_string_or_null(m[3]) && is_bool_or_null(m[4]);
}

static inline int message_ok(const char *v) {
    message_view m;
    return message_view_of(v, &m);
}

/* tool_view is the members of an abi.Tool (each NULL when absent). */
typedef struct {
    const char *name, *description, *input_schema, *idempotent, *approval;
} tool_view;

/* tool_view_of finds the members of the tool at v and reports whether it
 * decodes into abi.Tool. */
static inline int tool_view_of(const char *v, tool_view *out) {
    static const char *const keys[] = {"name", "description", "input_schema", "idempotent", "approval"};
    const char *m[5];
    if (!is_object_or_null(v)) return 0;
    json_get_many(is_null(v) ? NULL : v, keys, m, 5);
    *out = (tool_view){.name = m[0], .description = m[1], .input_schema = m[2], .idempotent = m[3], .approval = m[4]};
    return is_string_or_null(m[0]) && is_string_or_null(m[1]) && is_bool_or_null(m[3]) && is_string_or_null(m[4]);
}

static inline int tool_ok(const char *v) {
    tool_view t;
    return tool_view_of(v, &t);
}

/* json_elements returns the starts of the elements of the array at a (NULL
 * or null: none) in a new array (free it), and sets *n. */
static inline const char **json_elements(const char *a, size_t *n, int *oom) {
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

/* effect_view is the members of an abi.Effect (each NULL when absent). */
typedef struct {
    const char *id, *assignment_key, *attempt, *kind, *tool, *request, *deadline_ms;
} effect_view;

/* effect_view_of finds the members of the effect at v and reports whether
 * it decodes into abi.Effect (its request, raw JSON, may be anything). */
static inline int effect_view_of(const char *v, effect_view *out) {
    static const char *const keys[] = {"id", "assignment_key", "attempt", "kind", "tool", "request", "deadline_ms"};
    const char *m[7];
    if (!is_object_or_null(v)) return 0;
    json_get_many(is_null(v) ? NULL : v, keys, m, 7);
    *out = (effect_view){.id = m[0], .assignment_key = m[1], .attempt = m[2], .kind = m[3], .tool = m[4], .request = m[5],
                         .deadline_ms = m[6]};
    return is_string_or_null(m[0]) && is_string_or_null(m[1]) && is_int_or_null(m[2]) && is_string_or_null(m[3]) &&
           is_string_or_null(m[4]) && is_int_or_null(m[6]);
}

/* effect_input_view returns NULL when the (valid) document decodes into
 * abi.EffectInput, with its effect's members in *e, or what is wrong. */
static inline const char *effect_input_view(const char *in, effect_view *e) {
    *e = (effect_view){0};
    in = json_ws(in);
    if (is_null(in)) return NULL;
    if (*in != '{') return "it is not a JSON object";
    static const char *const keys[] = {"abi", "effect", "handle"};
    const char *m[3];
    json_get_many(in, keys, m, 3);
    if (!is_int_or_null(m[0])) return "abi is not an integer";
    if (!effect_view_of(m[1], e)) return "effect is not an effect";
    if (!is_string_or_null(m[2])) return "handle is not a string";
    return NULL;
}

/* request_view is an abi.ModelRequest's messages and tools, each one's
 * members found (free both arrays). */
typedef struct {
    message_view *messages;
    tool_view *tools;
    size_t n_messages, n_tools;
} request_view;

/* views_of calls f(element, &views[i]) on each element of the (valid)
 * array at a (NULL or null: none), into a new array of views of size
 * bytes each (free it); it sets *n, and returns what is wrong (the
 * array is freed) or NULL. */
static inline const char *views_of(const char *a, size_t size, int (*f)(const char *, void *), void **views, size_t *n,
                                   const char *wrong, int *oom) {
    *views = NULL;
    *n = 0;
    if (is_null(a)) return NULL;
    if (*a != '[') return wrong;
    size_t cap = 0;
    char *v = NULL;
    const char *p = json_ws(json_ws(a) + 1);
    while (*p != ']') {
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            char *bigger = realloc(v, cap * size);
            if (bigger == NULL) {
                free(v);
                *oom = 1;
                return "out of memory";
            }
            v = bigger;
        }
        if (!f(p, v + *n * size)) {
            free(v);
            *n = 0;
            return wrong;
        }
        (*n)++;
        p = json_ws(json_skip(p));
        if (*p == ',') p = json_ws(p + 1);
    }
    *views = v;
    return NULL;
}

static inline int message_view_any(const char *v, void *out) { return message_view_of(v, out); }

static inline int tool_view_any(const char *v, void *out) { return tool_view_of(v, out); }

/* model_request_view returns NULL when the (valid) value decodes into
 * abi.ModelRequest, with its messages' and tools' members in *r, or what
 * is wrong (*r is then empty). Out of memory sets *oom. */
static inline const char *model_request_view(const char *v, request_view *r, int *oom) {
    *r = (request_view){0};
    v = json_ws(v);
    if (is_null(v)) return NULL;
    if (*v != '{') return "it is not a JSON object";
    static const char *const keys[] = {"messages", "tools", "params"};
    const char *m[3];
    json_get_many(v, keys, m, 3);
    void *views;
    const char *bad = views_of(m[0], sizeof(message_view), message_view_any, &views, &r->n_messages,
                               "messages is not an array of messages", oom);
    r->messages = views;
    if (bad == NULL) {
        bad = views_of(m[1], sizeof(tool_view), tool_view_any, &views, &r->n_tools, "tools is not an array of tools", oom);
        r->tools = views;
    }
    if (bad == NULL && !is_object_or_null(m[2])) bad = "params is not an object";
    if (bad != NULL) {
        free(r->messages);
        free(r->tools);
        *r = (request_view){0};
    }
    return bad;
}

/* json_string_is reports whether the JSON string at v, decoded, is s (a
 * string with no NUL): an escaped spelling counts too. */
static inline int json_string_is(const char *v, const char *s) {
    if (v == NULL || *v != '"') return 0;
    if (json_string_equals(v, s)) return 1;
    const char *end = json_skip_string(v);
    if (end == NULL || memchr(v, '\\', (size_t)(end - v)) == NULL) return 0;
    char *d = json_string(v);
    int is = d != NULL && strcmp(d, s) == 0;
    free(d);
    return is;
}

/* read_effect_input reads the input of start, poll, attach or cancel
 * (agenthost_input; include extism.h and agenthost.h first) and checks
 * that it names an effect attempt, with the words of the Go examples'
 * protocol errors. On success it returns the input (free it), its
 * effect's members in *effect and the attempt in *attempt; otherwise it
 * sets *rc to the status to return and returns NULL. */
static inline char *read_effect_input(effect_view *effect, long long *attempt, int32_t *rc) {
    char *in = agenthost_input(NULL);
    if (in == NULL) {
        *rc = extism_error("out of memory reading the input");
        return NULL;
    }
    const char *bad = json_valid(in) ? effect_input_view(in, effect) : "it is not JSON";
    if (bad != NULL) {
        char msg[160];
        snprintf(msg, sizeof msg, "the input is not an effect input: %s", bad);
        free(in);
        *rc = extism_error(msg);
        return NULL;
    }
    *attempt = 0;
    if (is_null(effect->id) || json_string_is(effect->id, "") || !json_int(effect->attempt, attempt) || *attempt < 1) {
        free(in);
        *rc = extism_error("the input names no effect attempt: effect.id and effect.attempt (from 1) are required");
        return NULL;
    }
    return in;
}

/* check_describe_input reads describe's input and checks that it is a
 * describe input (JSON: null, or an object whose abi is an integer). It
 * returns -1, or the status of the protocol error it reported. */
static inline int32_t check_describe_input(void) {
    char *in = agenthost_input(NULL);
    if (in == NULL) return extism_error("out of memory reading the input");
    const char *p = json_ws(in);
    int ok = json_valid(in) && (is_null(p) || (*p == '{' && is_int_or_null(json_get(p, "abi"))));
    free(in);
    return ok ? -1 : extism_error("describe: the input is not JSON: it is not a describe input");
}

#endif
