/* server/wire: what every part of the server's wire format uses (wire.c):
 * the error record, the byte buffer, UTF-8 repair, bodies loaded with a depth
 * limit, and typed jansson field access. Knows no request or reply. */
#ifndef TL_SERVER_WIRE_H
#define TL_SERVER_WIRE_H

#include <stddef.h>

#include <jansson.h>

/* What a rejected request answers: HTTP status and the OpenAI error fields. */
typedef struct api_err {
    int http;
    const char *type;   /* "invalid_request_error", ... (static) */
    char param[64];     /* "" = null */
    char code[48];      /* "" = null */
    char msg[384];
} api_err;

/* Fills e and returns -1 (for `return api_fail(...)`). */
int api_fail(api_err *e, int http, const char *type, const char *param, const char *code,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A growable byte buffer for stream frames. */
typedef struct api_buf {
    char *p;
    size_t n, cap;
} api_buf;
int api_buf_add(api_buf *b, const char *s, size_t n);
void api_buf_free(api_buf *b);

/* Nesting depth of a JSON text ([ and { outside strings). */
int api_json_depth(const char *s, size_t n);

/* Drops, in place, the bytes of a NUL-terminated string that are not whole
 * UTF-8 characters (what a cut at a byte limit leaves). */
void api_utf8_scrub(char *s);

/* Bytes -> valid UTF-8: each maximal subpart of a bad sequence (a lead byte
 * and the continuation bytes it could still take, or one stray byte) becomes
 * one U+FFFD, as Python's and llama-server's replacing decoders do.
 * malloc'ed, NUL-terminated. */
char *api_utf8_fix(const char *s, size_t n, size_t *out_len);

/* jansson helpers every reply builder uses. api_jset/api_jpush take v (set or
 * not) and return nonzero on failure, a NULL v (no memory) included;
 * api_field is NULL for a missing or null key; api_dump takes j and returns
 * its compact text (malloc'ed; NULL for a NULL j or no memory). */
int api_jset(json_t *o, const char *k, json_t *v);
int api_jpush(json_t *a, json_t *v);
json_t *api_field(json_t *o, const char *k);
char *api_dump(json_t *j, size_t *len);

/* The error body {"error":{message,type,param,code}}; malloc'ed. */
char *api_error_json(const api_err *e, size_t *len);

/* A JSON object body (depth-limited), or NULL with e filled. */
json_t *api_load_body(const char *body, size_t len, api_err *e);

/* Typed fields (null counts as absent): 0 if absent or set, -1 with e
 * filled when of the wrong type or outside [lo, hi] (lo_open: lo excluded). */
int api_get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, api_err *e);
int api_get_num(json_t *o, const char *k, double lo, double hi, int lo_open, float *out, api_err *e);
int api_get_bool(json_t *o, const char *k, int *out, api_err *e);
int api_get_str(json_t *o, const char *k, const char **out, api_err *e);
/* Whether k is in the NULL-terminated list l. */
int api_in_list(const char *const *l, const char *k);
/* A JSON string of n bytes made valid UTF-8; its code points; whether bytes are valid UTF-8. */
json_t *api_jstr_bytes(const char *s, size_t n);
size_t api_utf8_count(const char *s, size_t n);
int api_utf8_valid(const char *s, size_t n);

#endif
