/* server/wire: what every part of the server's wire format uses: the error
 * record (api_err, api_fail) and its JSON, the byte buffer of stream frames,
 * UTF-8 repair, bodies loaded with a depth limit, and typed field access on
 * jansson values (null counts as absent). No request or reply knowledge. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "api.h"
#include "chat/chat.h"
#include "tokenize/unicode.h"
#include "tools.h"

#define MAX_DEPTH 32
#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* ---- small helpers ----------------------------------------------------------- */

int api_fail(api_err *e, int http, const char *type, const char *param, const char *code,
             const char *fmt, ...) {
    e->http = http;
    e->type = type ? type : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    /* a client's string cut at a byte limit ('%.40s', or these fields' size)
     * may end mid-character: JSON needs whole ones */
    api_utf8_scrub(e->param);
    api_utf8_scrub(e->code);
    api_utf8_scrub(e->msg);
    return -1;
}

int api_buf_add(api_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void api_buf_free(api_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void api_utf8_scrub(char *s) {
    size_t n = strlen(s), j = 0;
    for (size_t i = 0; i < n;) {
        size_t k = tl_utf8_char((const unsigned char *)s + i, n - i);
        if (k) memmove(s + j, s + i, k), j += k, i += k;
        else i++;
    }
    s[j] = 0;
}

int api_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = tl_utf8_char((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

char *api_utf8_fix(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1); /* each bad byte may become 3 bytes */
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        size_t k = tl_utf8_char((const unsigned char *)s + i, n - i);
        if (k) {
            memcpy(o + j, s + i, k);
            j += k;
            i += k;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i += tl_utf8_bad((const unsigned char *)s + i, n - i);
        }
    }
    o[j] = 0;
    if (out_len) *out_len = j;
    return o;
}

size_t api_utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/* A JSON string of arbitrary bytes (bad UTF-8 -> U+FFFD). */
json_t *api_jstr_bytes(const char *s, size_t n) {
    size_t fl;
    char *f = api_utf8_fix(s, n, &fl);
    if (!f) return NULL;
    json_t *j = json_stringn(f, fl);
    free(f);
    return j;
}

int api_json_depth(const char *s, size_t n) {
    int d = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++d > max) max = d;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    return max;
}

json_t *api_load_body(const char *body, size_t len, api_err *e) {
    if (api_json_depth(body, len) > MAX_DEPTH) {
        BAD(NULL, "JSON nesting deeper than %d levels", MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        BAD(NULL, "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        BAD(NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- typed field access (null counts as absent) ------------------------------- */

json_t *api_field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

/* Integers, or reals with an integral value, within lo..hi. 1 set, 0 absent, -1 bad. */
int api_get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || d < -9.2e18 || d > 9.2e18) return BAD(k, "'%s' must be an integer", k);
        x = (long long)d;
    } else {
        return BAD(k, "'%s' must be an integer", k);
    }
    if (x < lo || x > hi) return BAD(k, "'%s' must be in %lld..%lld, got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

int api_get_num(json_t *o, const char *k, double lo, double hi, int lo_open, float *out,
                   api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return BAD(k, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (lo_open && d == lo))
        return BAD(k, "'%s' must be in %s%g..%g, got %g", k, lo_open ? "(" : "", lo, hi, d);
    *out = (float)d;
    return 1;
}

int api_get_bool(json_t *o, const char *k, int *out, api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return BAD(k, "'%s' must be true or false", k);
    *out = json_is_true(v);
    return 1;
}

int api_get_str(json_t *o, const char *k, const char **out, api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    if (!json_is_string(v)) return BAD(k, "'%s' must be a string", k);
    if (out) *out = json_string_value(v);
    return 1;
}

/* ---- replies ----------------------------------------------------------------- */

int api_jset(json_t *o, const char *k, json_t *v) { return !v || json_object_set_new(o, k, v); }
int api_jpush(json_t *a, json_t *v) { return !v || json_array_append_new(a, v); }

char *api_dump(json_t *j, size_t *len) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (s && len) *len = strlen(s);
    return s;
}

char *api_error_json(const api_err *e, size_t *len) {
    json_t *err = json_object(), *root = json_object();
    if (!err || !root || api_jset(err, "message", api_jstr_bytes(e->msg, strlen(e->msg))) ||
        api_jset(err, "type", json_string(e->type ? e->type : "invalid_request_error")) ||
        api_jset(err, "param", e->param[0] ? json_string(e->param) : json_null()) ||
        api_jset(err, "code", e->code[0] ? json_string(e->code) : json_null()) ||
        json_object_set_new(root, "error", err)) {
        json_decref(err);
        json_decref(root);
        return NULL;
    }
    return api_dump(root, len);
}

int api_in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}
