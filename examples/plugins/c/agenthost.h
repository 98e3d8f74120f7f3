/*
 * agenthost.h: the agenthost ABI v1 for C plugins: the version marker and
 * the agenthost host functions (module extism:host/user), with the exact
 * wasm types the host checks at load (docs/ABI.md, "Host functions").
 * Include extism.h first.
 *
 * Every argument and result is an Extism memory offset (i64), except
 * agenthost_now_ms, whose result is a number: Unix milliseconds on the
 * host clock, and the stream and max arguments of agenthost_http_read and
 * agenthost_http_close, which are numbers, and the pointers and lengths of
 * agenthost_input_read and agenthost_output_set. Status results: 0 ok, 1
 * too large, 2 store unavailable, 3 refused.
 */
#ifndef AGENTHOST_AGENTHOST_H
#define AGENTHOST_AGENTHOST_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define AGENTHOST_IMPORT(name) __attribute__((import_module("extism:host/user"), import_name(#name)))

AGENTHOST_IMPORT(agenthost_kv_get) uint64_t agenthost_kv_get(uint64_t key);              /* value offset, 0 if missing */
AGENTHOST_IMPORT(agenthost_kv_set) uint64_t agenthost_kv_set(uint64_t key, uint64_t v);  /* status; empty value deletes */
AGENTHOST_IMPORT(agenthost_kv_delete) uint64_t agenthost_kv_delete(uint64_t key);        /* status */
AGENTHOST_IMPORT(agenthost_now_ms) int64_t agenthost_now_ms(void);                       /* a number, not an offset */
AGENTHOST_IMPORT(agenthost_emit) uint64_t agenthost_emit(uint64_t event_json);           /* status */
AGENTHOST_IMPORT(agenthost_http) uint64_t agenthost_http(uint64_t request_json);         /* response JSON offset */
/* A response body read as it arrives (docs/ABI.md, "agenthost_http_open, _read, _close"). */
AGENTHOST_IMPORT(agenthost_http_open) uint64_t agenthost_http_open(uint64_t request_json);            /* head JSON offset, with the stream */
AGENTHOST_IMPORT(agenthost_http_read) uint64_t agenthost_http_read(uint64_t stream, uint64_t max); /* next bytes' offset; 0 at the end */
AGENTHOST_IMPORT(agenthost_http_close) uint64_t agenthost_http_close(uint64_t stream);             /* end JSON offset */
/* The call's input and output in one call each, by pointer and length in
 * the plugin's own memory, not Extism offsets (docs/ABI.md,
 * "agenthost_input_read, agenthost_output_set"): input_read copies up to
 * len bytes of the input to ptr and returns the input's whole length;
 * output_set makes the len bytes at ptr the call's output. */
AGENTHOST_IMPORT(agenthost_input_read) uint64_t agenthost_input_read(uint64_t ptr, uint64_t len); /* the input's length */
AGENTHOST_IMPORT(agenthost_output_set) void agenthost_output_set(uint64_t ptr, uint64_t len);

/* agenthost_input reads the call's input into a new NUL-terminated buffer
 * from malloc (free it) with agenthost_input_read, and sets *n to its
 * length (n may be NULL). NULL when malloc fails. Two host calls, where
 * extism_input makes one for every 8 bytes. */
static inline char *agenthost_input(size_t *n) {
    size_t len = (size_t)agenthost_input_read(0, 0);
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        return NULL;
    }
    agenthost_input_read((uint64_t)(uintptr_t)buf, len);
    buf[len] = 0;
    if (n) {
        *n = len;
    }
    return buf;
}

/* agenthost_output makes n bytes of data the call's output, in one host
 * call (the host copies them before it returns), and returns 0, the ok
 * status. */
static inline int32_t agenthost_output(const char *data, size_t n) {
    agenthost_output_set((uint64_t)(uintptr_t)data, n);
    return 0;
}

/* AGENTHOST_ABI_V1 defines the marker export agenthost_abi_v1: a function
 * with no parameters and no results, which the host finds among the
 * exports and never calls. Put it once in the plugin. */
#define AGENTHOST_ABI_V1 \
    __attribute__((export_name("agenthost_abi_v1"))) void agenthost_abi_v1(void) {}

#endif
