/*
 * extism.h: the extism:host/env imports, declared by hand for C plugins
 * built with clang --target=wasm32-wasi, and small helpers over them:
 * read the call's input, set its output, set its error, read a config
 * value. No Extism PDK is needed.
 *
 * Every function of extism:host/env is declared here. An import that a
 * plugin never calls is dropped by the linker, so declaring all of them
 * costs nothing. The wasm types are Extism's: offsets and lengths are i64;
 * a byte is an i32.
 *
 * Memory: Extism keeps its own memory (the "kernel"), addressed by i64
 * offsets. The helpers copy between it and the plugin's memory (malloc).
 *
 * This header is for the agenthost examples; see docs/ABI.md, "Writing a
 * plugin", for a walk-through. It is single-file: include it in one .c
 * file (the helpers are static inline).
 */
#ifndef AGENTHOST_EXTISM_H
#define AGENTHOST_EXTISM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t extism_ptr; /* an offset in Extism's memory; 0 is none */

#define EXTISM_IMPORT(name) __attribute__((import_module("extism:host/env"), import_name(#name)))

/* input */
EXTISM_IMPORT(input_length) uint64_t extism_input_length(void);
EXTISM_IMPORT(input_load_u8) uint32_t extism_input_load_u8(uint64_t offset); /* i32: the byte, high bits 0 */
EXTISM_IMPORT(input_load_u64) uint64_t extism_input_load_u64(uint64_t offset);

/* Extism memory */
EXTISM_IMPORT(alloc) extism_ptr extism_alloc(uint64_t length);
EXTISM_IMPORT(free) void extism_free(extism_ptr p);
EXTISM_IMPORT(length) uint64_t extism_length(extism_ptr p);
EXTISM_IMPORT(length_unsafe) uint64_t extism_length_unsafe(extism_ptr p);
EXTISM_IMPORT(store_u8) void extism_store_u8(extism_ptr p, uint32_t v); /* i32: stores the low byte */
EXTISM_IMPORT(store_u64) void extism_store_u64(extism_ptr p, uint64_t v);
EXTISM_IMPORT(load_u8) uint32_t extism_load_u8(extism_ptr p); /* i32: the byte, high bits 0 */
EXTISM_IMPORT(load_u64) uint64_t extism_load_u64(extism_ptr p);

/* output and errors */
EXTISM_IMPORT(output_set) void extism_output_set(extism_ptr p, uint64_t length);
EXTISM_IMPORT(error_set) void extism_error_set(extism_ptr p);

/* config and variables (variables live in one instance: a cache, never a record) */
EXTISM_IMPORT(config_get) extism_ptr extism_config_get(extism_ptr key);
EXTISM_IMPORT(var_get) extism_ptr extism_var_get(extism_ptr key);
EXTISM_IMPORT(var_set) void extism_var_set(extism_ptr key, extism_ptr value);

/* logs */
EXTISM_IMPORT(log_info) void extism_log_info(extism_ptr message);
EXTISM_IMPORT(log_debug) void extism_log_debug(extism_ptr message);
EXTISM_IMPORT(log_warn) void extism_log_warn(extism_ptr message);
EXTISM_IMPORT(log_error) void extism_log_error(extism_ptr message);
EXTISM_IMPORT(get_log_level) int32_t extism_get_log_level(void);

/* Export a function under name: EXTISM_EXPORT(start) int32_t start(void). */
#define EXTISM_EXPORT(name) __attribute__((export_name(#name)))

/* extism_copy_in copies n bytes into a new block of Extism memory. It
 * returns 0 when the host cannot allocate. */
static inline extism_ptr extism_copy_in(const void *data, size_t n) {
    extism_ptr p = extism_alloc(n);
    if (p == 0 && n > 0) {
        return 0;
    }
    const uint8_t *b = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        extism_store_u64(p + i, w);
    }
    for (; i < n; i++) {
        extism_store_u8(p + i, b[i]);
    }
    return p;
}

/* extism_copy_out copies a block of Extism memory into a new NUL-terminated
 * buffer from malloc, and sets *n to its length (without the NUL). It
 * returns NULL when p is 0 or malloc fails. */
static inline char *extism_copy_out(extism_ptr p, size_t *n) {
    if (p == 0) {
        return NULL;
    }
    size_t len = (size_t)extism_length(p);
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        return NULL;
    }
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = extism_load_u64(p + i);
        memcpy(buf + i, &w, 8);
    }
    for (; i < len; i++) {
        buf[i] = (char)extism_load_u8(p + i);
    }
    buf[len] = 0;
    if (n) {
        *n = len;
    }
    return buf;
}

/* extism_input reads the call's input into a new NUL-terminated buffer
 * from malloc (free it), and sets *n to its length. NULL when malloc
 * fails. */
static inline char *extism_input(size_t *n) {
    size_t len = (size_t)extism_input_length();
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        return NULL;
    }
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = extism_input_load_u64(i);
        memcpy(buf + i, &w, 8);
    }
    for (; i < len; i++) {
        buf[i] = (char)extism_input_load_u8(i);
    }
    buf[len] = 0;
    if (n) {
        *n = len;
    }
    return buf;
}

/* extism_output sets the call's output to n bytes of data. It returns 0,
 * or 1 when the host cannot allocate. */
static inline int32_t extism_output(const char *data, size_t n) {
    extism_ptr p = extism_copy_in(data, n);
    if (p == 0 && n > 0) {
        return 1;
    }
    extism_output_set(p, n);
    return 0;
}

/* extism_error reports a protocol error with message and returns 1: return
 * it from the export, and the host fails the call with that message. */
static inline int32_t extism_error(const char *message) {
    extism_ptr p = extism_copy_in(message, strlen(message));
    if (p != 0) {
        extism_error_set(p);
    }
    return 1;
}

/* extism_config reads the plugin's config value for key (lower case: the
 * operator's YAML loader lowercases keys) into a new buffer from malloc,
 * or NULL when it is unset. */
static inline char *extism_config(const char *key) {
    extism_ptr k = extism_copy_in(key, strlen(key));
    if (k == 0) {
        return NULL;
    }
    extism_ptr v = extism_config_get(k);
    extism_free(k);
    char *out = extism_copy_out(v, NULL);
    if (v != 0) {
        extism_free(v);
    }
    return out;
}

#endif
