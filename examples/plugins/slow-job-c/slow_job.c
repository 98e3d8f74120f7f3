/*
 * slow-job-c: the slow-job example in C, with the same tool, the same
 * replies, the same name ("slow-job") and the same KV records, so that
 * either build takes over the jobs the other started: the examples'
 * differential test holds it to the Go build (examples/plugins/slow-job/job)
 * call for call, KV included. It is the build `make run` and the
 * recovery bench load.
 *
 * The tool slow_job runs for a given number of seconds on the host clock.
 * start creates the job's record in the host KV, keyed by (effect id,
 * attempt), and answers pending; poll and attach answer from the record,
 * in any instance, after any restart; cancel marks it cancelled.
 *
 *   job/<effect id>#<attempt>   the record: {"state","label","seconds","start_ms","due_ms","exec"}
 *   exec/<effect id>#<attempt>  how many times a start created the job: 1, never more
 *
 * Where it differs from the Go build (README.md): the words after
 * "corrupt: " or after the arguments' usage line, where Go quotes its
 * JSON decoder.
 *
 * Build: examples/plugins/slow-job-c/build.sh slow-job-c.wasm
 */
#include <math.h>
#include <stdio.h>

#include "../c/extism.h"
#include "../c/agenthost.h"
#include "../c/json.h"
#include "../c/gostr.h"
#include "../c/abishape.h"

AGENTHOST_ABI_V1

#define NAME "slow-job"
#define TOOL "slow_job"
#define MAX_SECONDS (24 * 60 * 60)
#define MIN_POLL_MS 100
#define MAX_POLL_MS 1000

/* ---- replies -------------------------------------------------------------- */

static int32_t output(json_buf *j) {
    if (j->oom) {
        free(j->b);
        return extism_error(NAME ": out of memory building the reply");
    }
    int32_t rc = agenthost_output(j->b, j->n);
    free(j->b);
    return rc;
}

static int32_t reply_raw(const char *json) { return agenthost_output(json, strlen(json)); }

static void write_failed(json_buf *j, const char *message, size_t n, int retriable) {
    jb_raw(j, "{\"state\":\"failed\",\"error\":{\"message\":");
    go_json_string(j, message, n);
    jb_raw(j, retriable ? ",\"retriable\":true}}" : ",\"retriable\":false}}");
}

static int32_t failed(json_buf *msg, int retriable) {
    json_buf j = {0};
    write_failed(&j, msg->b ? msg->b : "", msg->n, retriable);
    j.oom |= msg->oom;
    free(msg->b);
    return output(&j);
}

static int32_t tool_error(json_buf *msg) {
    json_buf j = {0};
    jb_raw(&j, "{\"state\":\"done\",\"outcome\":{\"content\":");
    go_json_string(&j, msg->b ? msg->b : "", msg->n);
    jb_raw(&j, ",\"is_error\":true}}");
    j.oom |= msg->oom;
    free(msg->b);
    return output(&j);
}

/* ---- the KV ------------------------------------------------------------------- */

/* kv_get reads key into a new buffer (free it) and sets *n; NULL when the
 * key is missing, or, with *oom set, when memory ran out. A store that
 * fails makes the host abort the call: missing is really missing. */
static char *kv_get(const char *key, size_t *n, int *oom) {
    extism_ptr k = extism_copy_in(key, strlen(key));
    if (k == 0) {
        *oom = 1;
        return NULL;
    }
    extism_ptr v = agenthost_kv_get(k);
    extism_free(k);
    if (v == 0) return NULL;
    char *out = extism_copy_out(v, n);
    extism_free(v);
    if (out == NULL) *oom = 1;
    return out;
}

/* kv_set writes n bytes to key durably and returns the host's status (3,
 * refused, when the plugin cannot hand it the bytes). */
static uint64_t kv_set(const char *key, const char *value, size_t n) {
    extism_ptr k = extism_copy_in(key, strlen(key));
    extism_ptr v = k ? extism_copy_in(value, n) : 0;
    uint64_t status = k && v ? agenthost_kv_set(k, v) : 3;
    if (k) extism_free(k);
    if (v) extism_free(v);
    return status;
}

/* ---- the job ------------------------------------------------------------------ */

/* job is an effect attempt's job: its keys, and its record once read. */
typedef struct {
    char *id;        /* the effect's ID, decoded */
    long long attempt;
    char job_key[512], exec_key[512];
    /* the record */
    char *state, *label;
    double seconds;
    long long start_ms, due_ms, exec;
    int pending; /* the reply made was pending */
} job;

static void job_free(job *j) {
    free(j->id);
    free(j->state);
    free(j->label);
}

/* keys formats the job's KV keys; 0 when the effect ID is too long for
 * them (the host bounds IDs well below). */
static int keys(job *j) {
    int a = snprintf(j->job_key, sizeof j->job_key, "job/%s#%lld", j->id, j->attempt);
    int b = snprintf(j->exec_key, sizeof j->exec_key, "exec/%s#%lld", j->id, j->attempt);
    return a > 0 && (size_t)a < sizeof j->job_key && b > 0 && (size_t)b < sizeof j->exec_key;
}

enum { LOAD_OK, LOAD_MISSING, LOAD_CORRUPT, LOAD_OOM };

/* load reads the job's record. A record that is not the JSON of one
 * (its members of the wrong type) is corrupt. */
static int load(job *j) {
    size_t n;
    int oom = 0;
    char *b = kv_get(j->job_key, &n, &oom);
    if (b == NULL) return oom ? LOAD_OOM : LOAD_MISSING;
    static const char *const names[] = {"state", "label", "seconds", "start_ms", "due_ms", "exec"};
    const char *m[6];
    const char *p = json_ws(b);
    int ok = json_valid(b) && (*p == '{' || is_null(p)); /* null: a zero record, as Go reads it */
    if (ok) json_get_many(p, names, m, 6);
    if (ok) {
        ok = is_string_or_null(m[0]) && is_string_or_null(m[1]) && is_int_or_null(m[3]) && is_int_or_null(m[4]) &&
             is_int_or_null(m[5]) && (is_null(m[2]) || json_skip_number(m[2]) != NULL);
    }
    if (ok) {
        size_t sn;
        j->state = is_null(m[0]) ? calloc(1, 1) : json_string_n(m[0], &sn);
        j->label = is_null(m[1]) ? calloc(1, 1) : json_string_n(m[1], &sn);
        j->seconds = is_null(m[2]) ? 0 : strtod(m[2], NULL);
        j->start_ms = j->due_ms = j->exec = 0;
        if (!is_null(m[3])) json_int(m[3], &j->start_ms);
        if (!is_null(m[4])) json_int(m[4], &j->due_ms);
        if (!is_null(m[5])) json_int(m[5], &j->exec);
        ok = !isinf(j->seconds);
        if (j->state == NULL || j->label == NULL) {
            free(b);
            return LOAD_OOM;
        }
    }
    free(b);
    return ok ? LOAD_OK : LOAD_CORRUPT;
}

/* save writes the record as the Go build's json.Marshal of job.Record. */
static uint64_t save(job *j) {
    json_buf r = {0};
    jb_raw(&r, "{\"state\":");
    go_json_string(&r, j->state, strlen(j->state));
    jb_raw(&r, ",\"label\":");
    go_json_string(&r, j->label, strlen(j->label));
    jb_raw(&r, ",\"seconds\":");
    if (j->seconds == 0) {
        jb_raw(&r, "0");
    } else {
        if (j->seconds < 0) jb_raw(&r, "-");
        go_float(&r, fabs(j->seconds), 0);
    }
    char nums[96];
    snprintf(nums, sizeof nums, ",\"start_ms\":%lld,\"due_ms\":%lld,\"exec\":%lld}", j->start_ms, j->due_ms, j->exec);
    jb_raw(&r, nums);
    uint64_t status = r.oom ? 3 : kv_set(j->job_key, r.b, r.n);
    free(r.b);
    return status;
}

static int32_t status_failed(const char *what, uint64_t status) {
    json_buf msg = {0};
    char b[128];
    snprintf(b, sizeof b, NAME ": cannot %s (kv_set status %llu); try again", what, (unsigned long long)status);
    jb_raw(&msg, b);
    return failed(&msg, 1);
}

static int32_t corrupt_counter(job *j, char *raw) {
    json_buf msg = {0};
    jb_raw(&msg, NAME ": the counter ");
    jb_raw(&msg, j->exec_key);
    jb_raw(&msg, " is corrupt: ");
    go_quote(&msg, raw, strlen(raw));
    free(raw);
    return failed(&msg, 0);
}

/* read_count reads how many times a start created the job (0: never)
 * into *count. It returns -1, or, when the count cannot be read, the
 * status of the reply it made. */
static int32_t read_count(job *j, long long *count) {
    size_t n;
    int oom = 0;
    *count = 0;
    char *raw = kv_get(j->exec_key, &n, &oom);
    if (raw == NULL) return oom ? extism_error(NAME ": out of memory reading the counter") : -1;
    if (!go_atoi(raw, raw + n, count)) return corrupt_counter(j, raw);
    free(raw);
    return -1;
}

/* repair brings the exec count up to the record's, after a crash between
 * the record's write and the count's; it never increments. It returns -1
 * when all is well, else the status of the reply it made. */
static int32_t repair(job *j) {
    long long n;
    int32_t rc = read_count(j, &n);
    if (rc >= 0) return rc;
    if (n >= j->exec) return -1;
    char b[32];
    snprintf(b, sizeof b, "%lld", j->exec);
    uint64_t status = kv_set(j->exec_key, b, strlen(b));
    return status == 0 ? -1 : status_failed("count the job", status);
}

/* result is the job's answer: slow job "LABEL" finished after N s. */
static void result(json_buf *out, job *j) {
    jb_raw(out, "slow job ");
    go_quote(out, j->label, strlen(j->label));
    jb_raw(out, " finished after ");
    if (j->seconds == 0) {
        jb_raw(out, "0");
    } else {
        if (j->seconds < 0) jb_raw(out, "-");
        go_float(out, fabs(j->seconds), 1);
    }
    jb_raw(out, " s");
}

/* done replies done, with the job's result. */
static int32_t done(job *j) {
    json_buf r = {0}, out = {0};
    result(&r, j);
    jb_raw(&out, "{\"state\":\"done\",\"outcome\":{\"content\":");
    go_json_string(&out, r.b ? r.b : "", r.n);
    jb_raw(&out, ",\"is_error\":false}}");
    out.oom |= r.oom;
    free(r.b);
    return output(&out);
}

/* answer replies from the record: failed when cancelled, done when due,
 * else pending with the time left (between 100 and 1000 ms). */
static int32_t answer(job *j) {
    if (strcmp(j->state, "cancelled") == 0) {
        json_buf msg = {0};
        jb_raw(&msg, NAME ": job ");
        go_quote(&msg, j->label, strlen(j->label));
        char b[64];
        snprintf(b, sizeof b, "#%lld was cancelled", j->attempt);
        jb_raw(&msg, " of ");
        jb_raw(&msg, j->id);
        jb_raw(&msg, b);
        return failed(&msg, 0);
    }
    long long left = j->due_ms - agenthost_now_ms();
    json_buf out = {0};
    if (left <= 0) return done(j);
    long long after = left < MIN_POLL_MS ? MIN_POLL_MS : left > MAX_POLL_MS ? MAX_POLL_MS : left;
    j->pending = 1;
    jb_raw(&out, "{\"state\":\"pending\",\"handle\":");
    go_json_string(&out, j->job_key, strlen(j->job_key));
    char b[48];
    snprintf(b, sizeof b, ",\"poll_after_ms\":%lld}", after);
    jb_raw(&out, b);
    return output(&out);
}

static int32_t corrupt_record(job *j) {
    json_buf msg = {0};
    jb_raw(&msg, NAME ": the record ");
    jb_raw(&msg, j->job_key);
    jb_raw(&msg, " is corrupt: it is not the JSON of a job record");
    return failed(&msg, 0);
}

/* ---- the exports -------------------------------------------------------------- */

/* effect_job reads the input of start, poll, attach or cancel, checks it
 * names an effect attempt (read_effect_input), and fills j.
 * On success it returns the input (free it) and sets *effect; otherwise
 * it sets *rc and returns NULL. */
static char *effect_job(effect_view *effect, job *j, int32_t *rc) {
    *j = (job){0};
    char *in = read_effect_input(effect, &j->attempt, rc);
    if (in == NULL) return NULL;
    size_t n;
    j->id = json_string_n(effect->id, &n);
    if (j->id == NULL || strlen(j->id) != n || !keys(j)) {
        free(in);
        job_free(j);
        *rc = extism_error(NAME ": the effect's ID is too long, or holds NUL, for a KV key");
        return NULL;
    }
    return in;
}

/* arguments reads the tool's arguments as the Go build's
 * e.ToolArguments(&Args{Seconds *float64, Label string}) does: absent or
 * null request or arguments are {}; members matched in any case, the last
 * taken. It returns NULL or what is wrong; *seconds is NAN when absent. */
static const char *arguments(const char *request, double *seconds, const char **label) {
    *seconds = NAN;
    *label = NULL;
    if (is_null(request)) return NULL;
    if (*request != '{') return "the request is not {\"arguments\": {…}}";
    const char *args = json_get(request, "arguments");
    if (is_null(args)) return NULL;
    if (*args != '{') return "the arguments are not a JSON object";
    const char *p = json_ws(args + 1);
    while (*p == '"') {
        size_t n;
        char *key = json_string_n(p, &n);
        if (key == NULL) return "out of memory";
        for (size_t i = 0; i < n; i++) {
            if (key[i] >= 'A' && key[i] <= 'Z') key[i] = (char)(key[i] - 'A' + 'a');
        }
        p = json_ws(json_ws(json_skip_string(p)) + 1); /* the value */
        if (n == 7 && memcmp(key, "seconds", 7) == 0) {
            if (*p == '-' || (*p >= '0' && *p <= '9')) {
                *seconds = strtod(p, NULL);
                if (isinf(*seconds)) {
                    free(key);
                    return "seconds is out of range";
                }
            } else if (!is_null(p)) {
                free(key);
                return "seconds is not a number";
            } else {
                *seconds = NAN;
            }
        } else if (n == 5 && memcmp(key, "label", 5) == 0) {
            if (*p == '"') {
                *label = p;
            } else if (!is_null(p)) {
                free(key);
                return "label is not a string";
            }
        }
        free(key);
        p = json_ws(json_skip(p));
        if (*p != ',') break;
        p = json_ws(p + 1);
    }
    return NULL;
}

static int32_t start_job(job *j, const char *request) {
    double seconds;
    const char *label_json;
    const char *bad = arguments(request, &seconds, &label_json);
    if (bad != NULL) {
        json_buf msg = {0};
        jb_raw(&msg, "error: the arguments must be {\"seconds\": number, \"label\": string}: ");
        jb_raw(&msg, bad);
        return tool_error(&msg);
    }
    if (isnan(seconds) || seconds <= 0 || seconds > MAX_SECONDS) {
        json_buf msg = {0};
        char b[96];
        snprintf(b, sizeof b, "error: \"seconds\" must be a number above 0 and at most %d", MAX_SECONDS);
        jb_raw(&msg, b);
        return tool_error(&msg);
    }
    size_t n;
    j->label = label_json ? json_string_n(label_json, &n) : calloc(1, 1);
    j->state = malloc(sizeof "running");
    if (j->label == NULL || j->state == NULL) return extism_error(NAME ": out of memory");
    strcpy(j->state, "running");
    if (j->label[0] == 0) {
        free(j->label);
        j->label = malloc(sizeof "job");
        if (j->label == NULL) return extism_error(NAME ": out of memory");
        strcpy(j->label, "job");
    }
    long long count;
    int32_t rc = read_count(j, &count);
    if (rc >= 0) return rc;
    long long now = agenthost_now_ms();
    j->seconds = seconds;
    j->start_ms = now;
    j->due_ms = now + (long long)ceil(seconds * 1000);
    j->exec = count + 1;
    /* The record first: it is the job. Then the count, which a repeated
     * start repairs from the record if a crash fell in between. */
    uint64_t status = save(j);
    if (status != 0) return status_failed("record the job", status);
    char b[32];
    snprintf(b, sizeof b, "%lld", j->exec);
    status = kv_set(j->exec_key, b, strlen(b));
    if (status != 0) return status_failed("count the job", status);
    return answer(j);
}

/* progress puts "slow job ID#N running" on the Run's event stream. */
static void progress(job *j) {
    json_buf ev = {0}, msg = {0};
    char b[32];
    snprintf(b, sizeof b, "#%lld running", j->attempt);
    jb_raw(&msg, "slow job ");
    jb_raw(&msg, j->id);
    jb_raw(&msg, b);
    jb_raw(&ev, "{\"type\":\"progress\",\"message\":");
    go_json_string(&ev, msg.b ? msg.b : "", msg.n);
    jb_raw(&ev, "}");
    if (!ev.oom && !msg.oom) {
        extism_ptr p = extism_copy_in(ev.b, ev.n);
        if (p != 0) {
            agenthost_emit(p);
            extism_free(p);
        }
    }
    free(ev.b);
    free(msg.b);
}

/* from_record answers from the job's record: repaired (repair), then as
 * answer says; with no record, as missing says (its request is the
 * effect's). */
static int32_t from_record(job *j, int32_t (*missing)(job *, const char *), const char *request) {
    switch (load(j)) {
    case LOAD_OK: {
        int32_t rc = repair(j);
        return rc < 0 ? answer(j) : rc;
    }
    case LOAD_MISSING:
        return missing(j, request);
    case LOAD_CORRUPT:
        return corrupt_record(j);
    default:
        return extism_error(NAME ": out of memory reading the record");
    }
}

/* unknown is poll's and attach's answer when there is no record. */
static int32_t unknown(job *j, const char *request) {
    (void)j, (void)request;
    return reply_raw("{\"state\":\"unknown\"}");
}

EXTISM_EXPORT(describe) int32_t describe(void) {
    int32_t rc = check_describe_input();
    if (rc >= 0) return rc;
    /* The version and attaches_from come from the config, so that plugin
     * upgrades can be shown with one file, as with the Go build. */
    char *version = extism_config("version");
    char *from = extism_config("attaches_from");
    json_buf d = {0};
    jb_raw(&d, "{\"abi\":1,\"name\":\"" NAME "\",\"version\":");
    if (version != NULL && version[0] != 0) {
        go_json_string(&d, version, strlen(version));
    } else {
        jb_raw(&d, "\"1.0.0\"");
    }
    jb_raw(&d, ",\"role\":\"executor\",\"effects\":[\"tool\"],\"tools\":[{\"name\":\"" TOOL "\","
               "\"description\":\"Run a job that takes the given number of seconds, then report that it finished. For demonstrations of long-running work.\","
               "\"input_schema\":{\"type\":\"object\",\"properties\":{\"seconds\":{\"type\":\"number\",\"description\":\"how long the job runs, in seconds\"},\"label\":{\"type\":\"string\",\"description\":\"a name for the job\"}},\"required\":[\"seconds\"]},"
               "\"approval\":\"never\"}],\"attach\":true");
    if (from != NULL && from[0] != 0) {
        /* strings.Split(from, ","): every piece, empty ones too */
        jb_raw(&d, ",\"attaches_from\":[");
        const char *s = from;
        for (;;) {
            const char *comma = strchr(s, ',');
            size_t n = comma ? (size_t)(comma - s) : strlen(s);
            go_json_string(&d, s, n);
            if (comma == NULL) break;
            jb_raw(&d, ",");
            s = comma + 1;
        }
        jb_raw(&d, "]");
    }
    jb_raw(&d, "}");
    free(version);
    free(from);
    return output(&d);
}

EXTISM_EXPORT(start) int32_t start(void) {
    effect_view effect;
    job j;
    int32_t rc;
    char *in = effect_job(&effect, &j, &rc);
    if (in == NULL) return rc;
    if (!json_string_is(effect.tool, TOOL)) {
        json_buf msg = {0};
        size_t n = 0;
        char *tool = is_null(effect.tool) ? NULL : json_string_n(effect.tool, &n);
        jb_raw(&msg, NAME ": no tool ");
        go_quote(&msg, tool ? tool : "", n);
        jb_raw(&msg, " here; this plugin offers \"" TOOL "\"");
        free(tool);
        job_free(&j);
        free(in);
        return failed(&msg, 0);
    }
    /* The same attempt again, after a crash, answers from its record. */
    rc = from_record(&j, start_job, effect.request);
    /* A pending job says so on the Run's event stream, as the Go build's
     * start does after its reply is made. */
    if (rc == 0 && j.pending) progress(&j);
    job_free(&j);
    free(in);
    return rc;
}

/* lookup answers poll and attach from the record: unknown without one. */
static int32_t lookup(void) {
    effect_view effect;
    job j;
    int32_t rc;
    char *in = effect_job(&effect, &j, &rc);
    if (in == NULL) return rc;
    rc = from_record(&j, unknown, NULL);
    job_free(&j);
    free(in);
    return rc;
}

EXTISM_EXPORT(poll) int32_t poll(void) { return lookup(); }

EXTISM_EXPORT(attach) int32_t attach(void) { return lookup(); }

EXTISM_EXPORT(cancel) int32_t cancel(void) {
    effect_view effect;
    job j;
    int32_t rc;
    char *in = effect_job(&effect, &j, &rc);
    if (in == NULL) return rc;
    switch (load(&j)) {
    case LOAD_MISSING:
        rc = reply_raw("{\"state\":\"unknown\"}");
        break;
    case LOAD_CORRUPT: {
        char msg[600];
        snprintf(msg, sizeof msg, NAME ": the record %s is corrupt: it is not the JSON of a job record", j.job_key);
        rc = extism_error(msg);
        break;
    }
    case LOAD_OK:
        if (strcmp(j.state, "cancelled") == 0) {
            rc = reply_raw("{\"state\":\"cancelled\"}");
        } else if (agenthost_now_ms() >= j.due_ms) {
            rc = done(&j);
        } else {
            free(j.state);
            j.state = malloc(sizeof "cancelled");
            if (j.state == NULL) {
                rc = extism_error(NAME ": out of memory");
                break;
            }
            strcpy(j.state, "cancelled");
            uint64_t status = save(&j);
            if (status != 0) {
                char msg[96];
                snprintf(msg, sizeof msg, NAME ": cannot record the cancellation (kv_set status %llu)", (unsigned long long)status);
                rc = extism_error(msg);
            } else {
                rc = reply_raw("{\"state\":\"cancelled\"}");
            }
        }
        break;
    default:
        rc = extism_error(NAME ": out of memory reading the record");
    }
    job_free(&j);
    free(in);
    return rc;
}
