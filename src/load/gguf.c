/* gguf: opens and validates GGUF v2/v3 files (mmap or caller buffer). Owns the
 * mapping, the kv and tensor tables, the string-array tables and the hash
 * indexes behind the lookups. Every count read from the file is checked against
 * the bytes left before anything is allocated or looped over, so a hostile
 * header costs at most time and memory linear in the file's size. */
#include "load/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"
#include "base/util.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DEPTH 8      /* array nesting levels (a top-level array is 1) */
#define GGUF_MAX_NAME 64      /* tensor names, as ggml's GGML_MAX_NAME (incl. NUL) */
#define GGUF_MAX_DIMS 4
/* Smallest possible encodings, used to bound counts before allocating:
 * a kv is key length (8) + >= 1 key byte + type (4) + >= 1 value byte;
 * a tensor info is name length (8) + >= 1 name byte + n_dims (4) + >= 1 dim (8)
 * + type (4) + offset (8). */
#define MIN_KV_BYTES 14
#define MIN_TENSOR_BYTES 33

/* A hash index over names (open addressing; slot value i+1, 0 = empty). */
typedef struct name_index {
    uint64_t *slots;
    uint64_t mask;
} name_index;

/* The public struct first, so a tl_gguf * is also a gguf_impl *. */
typedef struct gguf_impl {
    tl_gguf g;
    void *map; /* NULL for a caller buffer */
    size_t map_len;
    name_index kv_index, tensor_index;
} gguf_impl;

typedef struct reader {
    const uint8_t *buf;
    uint64_t size, pos;
    tl_error *err;
    char where[240]; /* what is being read, e.g. "key 5 'general.name'" */
} reader;

/* ---- little helpers ------------------------------------------------------ */

/* Printable form of untrusted bytes for messages: escapes, cut at ~48 chars. */
static void escape_str(char *dst, size_t cap, const char *p, uint64_t len) {
    size_t o = 0;
    uint64_t i;
    for (i = 0; i < len && o + 8 < cap && i < 48; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            dst[o++] = (char)c;
        else
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
    }
    if (i < len && o + 4 < cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

static uint64_t remaining(const reader *r) { return r->size - r->pos; }

/* Fails with the current position and context prefixed to the message. */
__attribute__((format(printf, 3, 4))) static int rfail(reader *r, int status, const char *fmt,
                                                        ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tl_fail(r->err, status, "%s%s%s (at byte %llu of %llu)", r->where,
                   r->where[0] ? ": " : "", msg, (unsigned long long)r->pos,
                   (unsigned long long)r->size);
}

static int need(reader *r, uint64_t n, const char *what) {
    if (n > remaining(r))
        return rfail(r, TL_ERR_FORMAT, "file ends inside %s (%llu bytes needed, %llu left)", what,
                     (unsigned long long)n, (unsigned long long)remaining(r));
    return TL_OK;
}

static int read_u32(reader *r, uint32_t *v, const char *what) {
    int rc = need(r, 4, what);
    if (rc) return rc;
    *v = tl_le_u32(r->buf + r->pos);
    r->pos += 4;
    return TL_OK;
}

static int read_u64(reader *r, uint64_t *v, const char *what) {
    int rc = need(r, 8, what);
    if (rc) return rc;
    *v = tl_le_u64(r->buf + r->pos);
    r->pos += 8;
    return TL_OK;
}

static int read_str(reader *r, tl_str *s, const char *what) {
    uint64_t len;
    int rc = read_u64(r, &len, what);
    if (rc) return rc;
    if (len > remaining(r)) {
        r->pos -= 8;
        return rfail(r, TL_ERR_FORMAT, "%s length %llu runs past the end of the file", what,
                     (unsigned long long)len);
    }
    s->ptr = (const char *)r->buf + r->pos;
    s->len = len;
    r->pos += len;
    return TL_OK;
}

/* The one table of metadata value sizes, shared with the writer. */
uint64_t tl_gguf_scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- name index ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *p, uint64_t len) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < len; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static int index_init(name_index *ix, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1; /* n is bounded by the file size, so no overflow */
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

/* Index i of the name equal to (p, len) among names[], or -1. get_name reads
 * the name of entry i from the table the index was built over. */
typedef tl_str (*get_name_fn)(const tl_gguf *g, uint64_t i);

static int64_t index_find(const name_index *ix, const tl_gguf *g, get_name_fn get, const char *p,
                          uint64_t len) {
    if (!ix->slots) return -1;
    for (uint64_t h = hash_bytes(p, len) & ix->mask;; h = (h + 1) & ix->mask) {
        uint64_t v = ix->slots[h];
        if (!v) return -1;
        tl_str s = get(g, v - 1);
        if (s.len == len && memcmp(s.ptr, p, len) == 0) return (int64_t)(v - 1);
    }
}

/* Adds entry i; returns the index of an existing equal name, or -1 if new. */
static int64_t index_add(name_index *ix, const tl_gguf *g, get_name_fn get, uint64_t i) {
    tl_str name = get(g, i);
    uint64_t h = hash_bytes(name.ptr, name.len) & ix->mask;
    for (; ix->slots[h]; h = (h + 1) & ix->mask) {
        tl_str s = get(g, ix->slots[h] - 1);
        if (s.len == name.len && memcmp(s.ptr, name.ptr, name.len) == 0)
            return (int64_t)(ix->slots[h] - 1);
    }
    ix->slots[h] = i + 1;
    return -1;
}

static tl_str kv_name(const tl_gguf *g, uint64_t i) { return g->kv[i].key; }
static tl_str tensor_name(const tl_gguf *g, uint64_t i) { return g->tensors[i].name; }

/* ---- metadata values ------------------------------------------------------ */

static int check_value_type(reader *r, uint32_t t, const char *what) {
    if (t >= GGUF_TYPE_COUNT)
        return rfail(r, TL_ERR_FORMAT, "invalid %s type %u (valid: 0..%d)", what, t,
                     GGUF_TYPE_COUNT - 1);
    return TL_OK;
}

/* Validates and skips n array elements of type t. Each element consumes at
 * least one byte (strings 8, nested arrays 12), so the loops below are bounded
 * by the file size after the count check. `depth` is this array's level. */
static int skip_array_body(reader *r, uint32_t t, uint64_t n, int depth) {
    uint64_t sz = tl_gguf_scalar_size(t), total;
    if (sz) {
        if (tl_mul_u64(n, sz, &total) || total > remaining(r))
            return rfail(r, TL_ERR_FORMAT, "array of %llu %s elements runs past the end of the file",
                         (unsigned long long)n, tl_gguf_type_name((tl_gguf_type)t));
        r->pos += total;
        return TL_OK;
    }
    if (t == GGUF_TYPE_STRING) {
        if (n > remaining(r) / 8)
            return rfail(r, TL_ERR_FORMAT, "array of %llu strings cannot fit in the %llu bytes left",
                         (unsigned long long)n, (unsigned long long)remaining(r));
        for (uint64_t i = 0; i < n; i++) {
            tl_str s;
            int rc = read_str(r, &s, "string in array");
            if (rc) return rc;
        }
        return TL_OK;
    }
    /* nested arrays: each is a type (4) and a count (8), then its elements */
    if (depth >= GGUF_MAX_DEPTH)
        return rfail(r, TL_ERR_FORMAT, "arrays nested deeper than %d levels", GGUF_MAX_DEPTH);
    if (n > remaining(r) / 12)
        return rfail(r, TL_ERR_FORMAT, "array of %llu arrays cannot fit in the %llu bytes left",
                     (unsigned long long)n, (unsigned long long)remaining(r));
    for (uint64_t i = 0; i < n; i++) {
        uint32_t et;
        uint64_t en;
        int rc = read_u32(r, &et, "nested array type");
        if (!rc) rc = check_value_type(r, et, "nested array element");
        if (!rc) rc = read_u64(r, &en, "nested array count");
        if (!rc) rc = skip_array_body(r, et, en, depth + 1);
        if (rc) return rc;
    }
    return TL_OK;
}

/* A top-level string array: records every string in kv->arr_str. */
static int read_string_array(reader *r, tl_gguf_kv *kv) {
    uint64_t n = kv->arr_n;
    if (n > remaining(r) / 8)
        return rfail(r, TL_ERR_FORMAT, "array of %llu strings cannot fit in the %llu bytes left",
                     (unsigned long long)n, (unsigned long long)remaining(r));
    tl_str *strs = calloc(n ? n : 1, sizeof *strs);
    if (!strs) return rfail(r, TL_ERR_NOMEM, "out of memory for %llu strings", (unsigned long long)n);
    kv->arr_str = strs; /* owned by kv from here, freed by close even on failure */
    for (uint64_t i = 0; i < n; i++) {
        int rc = read_str(r, &strs[i], "string in array");
        if (rc) {
            /* name the element only now: formatting it for every string costs */
            size_t len = strlen(r->err ? r->err->msg : "");
            if (r->err && len + 40 < sizeof r->err->msg)
                snprintf(r->err->msg + len, sizeof r->err->msg - len, " [element %llu of %llu]",
                         (unsigned long long)i, (unsigned long long)n);
            return rc;
        }
    }
    return TL_OK;
}

static int read_kv_value(reader *r, tl_gguf_kv *kv) {
    uint32_t t;
    int rc = read_u32(r, &t, "value type");
    if (!rc) rc = check_value_type(r, t, "value");
    if (rc) return rc;
    kv->type = (tl_gguf_type)t;
    if (t == GGUF_TYPE_ARRAY) {
        uint32_t et;
        rc = read_u32(r, &et, "array element type");
        if (!rc) rc = check_value_type(r, et, "array element");
        if (!rc) rc = read_u64(r, &kv->arr_n, "array count");
        if (rc) return rc;
        kv->arr_type = (tl_gguf_type)et;
        kv->data = r->buf + r->pos; /* the first element */
        if (et == GGUF_TYPE_STRING) return read_string_array(r, kv);
        return skip_array_body(r, et, kv->arr_n, 1);
    }
    kv->data = r->buf + r->pos;
    if (t == GGUF_TYPE_STRING) {
        tl_str s;
        return read_str(r, &s, "string value");
    }
    return skip_array_body(r, t, 1, 1);
}

static int read_kvs(reader *r, gguf_impl *im) {
    tl_gguf *g = &im->g;
    if (g->n_kv > remaining(r) / MIN_KV_BYTES)
        return rfail(r, TL_ERR_FORMAT, "%llu metadata entries cannot fit in the %llu bytes left",
                     (unsigned long long)g->n_kv, (unsigned long long)remaining(r));
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    if (!g->kv || index_init(&im->kv_index, g->n_kv))
        return tl_fail(r->err, TL_ERR_NOMEM, "out of memory for %llu metadata entries",
                       (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        tl_gguf_kv *kv = &g->kv[i];
        char name[200];
        snprintf(r->where, sizeof r->where, "metadata key %llu", (unsigned long long)i);
        int rc = read_str(r, &kv->key, "key");
        if (rc) return rc;
        if (kv->key.len == 0) return rfail(r, TL_ERR_FORMAT, "empty key");
        escape_str(name, sizeof name, kv->key.ptr, kv->key.len);
        snprintf(r->where, sizeof r->where, "metadata key %llu '%s'", (unsigned long long)i, name);
        int64_t dup = index_add(&im->kv_index, g, kv_name, i);
        if (dup >= 0)
            return rfail(r, TL_ERR_FORMAT, "duplicate key (also key %lld)", (long long)dup);
        rc = read_kv_value(r, kv);
        if (rc) return rc;
    }
    r->where[0] = '\0';
    return TL_OK;
}

static int read_alignment(reader *r, tl_gguf *g) {
    const tl_gguf_kv *kv = tl_gguf_find(g, "general.alignment");
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv) return TL_OK;
    if (kv->type != GGUF_TYPE_UINT32)
        return tl_fail(r->err, TL_ERR_FORMAT, "metadata key 'general.alignment' has type %s, expected u32",
                       tl_gguf_type_name(kv->type));
    uint32_t a = tl_le_u32(kv->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return tl_fail(r->err, TL_ERR_FORMAT, "general.alignment %u is not a power of two", a);
    g->alignment = a;
    return TL_OK;
}

/* ---- tensor table ----------------------------------------------------------- */

static int read_tensor_name(reader *r, gguf_impl *im, uint64_t i) {
    tl_gguf_tensor *t = &im->g.tensors[i];
    char name[200];
    int rc = read_str(r, &t->name, "tensor name");
    if (rc) return rc;
    escape_str(name, sizeof name, t->name.ptr, t->name.len);
    snprintf(r->where, sizeof r->where, "tensor %llu '%s'", (unsigned long long)i, name);
    if (t->name.len == 0) return rfail(r, TL_ERR_FORMAT, "empty tensor name");
    if (t->name.len >= GGUF_MAX_NAME)
        return rfail(r, TL_ERR_FORMAT, "name is %llu bytes, the limit is %d",
                     (unsigned long long)t->name.len, GGUF_MAX_NAME - 1);
    if (memchr(t->name.ptr, 0, t->name.len)) return rfail(r, TL_ERR_FORMAT, "name contains a NUL byte");
    int64_t dup = index_add(&im->tensor_index, &im->g, tensor_name, i);
    if (dup >= 0) return rfail(r, TL_ERR_FORMAT, "duplicate tensor name (also tensor %lld)", (long long)dup);
    return TL_OK;
}

static int read_tensor_shape(reader *r, tl_gguf_tensor *t) {
    int rc = read_u32(r, &t->n_dims, "tensor dimension count");
    if (rc) return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return rfail(r, TL_ERR_FORMAT, "%u dimensions (must be 1..%d)", t->n_dims, GGUF_MAX_DIMS);
    int64_t nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if (d < t->n_dims && (rc = read_u64(r, &v, "tensor dimension"))) return rc;
        if (v > (uint64_t)INT64_MAX)
            return rfail(r, TL_ERR_FORMAT, "dimension %u has a negative size %lld", d, (long long)v);
        t->ne[d] = (int64_t)v;
        /* the element count must stay representable, as in ggml */
        if (t->ne[d] > 1 && nel > INT64_MAX / t->ne[d])
            return rfail(r, TL_ERR_FORMAT, "shape [%lld, %lld, %lld, %lld] has more than INT64_MAX elements",
                         (long long)t->ne[0], (long long)(d > 0 ? t->ne[1] : 0),
                         (long long)(d > 1 ? t->ne[2] : 0), (long long)(d > 2 ? t->ne[3] : 0));
        nel *= t->ne[d];
    }
    return TL_OK;
}

static int read_tensor_type(reader *r, tl_gguf_tensor *t) {
    int rc = read_u32(r, &t->type, "tensor type");
    if (rc) return rc;
    const tl_type_traits *tt = tl_type_info(t->type);
    if (!tt || tt->block_size <= 0 || tt->type_size == 0)
        return rfail(r, TL_ERR_FORMAT, "unknown tensor type %u", t->type);
    if (t->ne[0] % tt->block_size != 0)
        return rfail(r, TL_ERR_FORMAT, "type %s needs rows of a multiple of %lld elements, ne[0] is %lld",
                     tt->name, (long long)tt->block_size, (long long)t->ne[0]);
    uint64_t nb = (uint64_t)(t->ne[0] / tt->block_size);
    int bad = tl_mul_u64(nb, tt->type_size, &nb);
    for (int d = 1; d < GGUF_MAX_DIMS; d++) bad |= tl_mul_u64(nb, (uint64_t)t->ne[d], &nb);
    if (bad || nb > (uint64_t)SIZE_MAX)
        return rfail(r, TL_ERR_FORMAT, "size in bytes of shape [%lld, %lld, %lld, %lld] overflows",
                     (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    t->nbytes = nb;
    return TL_OK;
}

static int read_tensor_infos(reader *r, gguf_impl *im) {
    tl_gguf *g = &im->g;
    if (g->n_tensors > remaining(r) / MIN_TENSOR_BYTES)
        return rfail(r, TL_ERR_FORMAT, "%llu tensor infos cannot fit in the %llu bytes left",
                     (unsigned long long)g->n_tensors, (unsigned long long)remaining(r));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors || index_init(&im->tensor_index, g->n_tensors))
        return tl_fail(r->err, TL_ERR_NOMEM, "out of memory for %llu tensors",
                       (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tl_gguf_tensor *t = &g->tensors[i];
        snprintf(r->where, sizeof r->where, "tensor %llu", (unsigned long long)i);
        int rc = read_tensor_name(r, im, i);
        if (!rc) rc = read_tensor_shape(r, t);
        if (!rc) rc = read_tensor_type(r, t);
        if (!rc) rc = read_u64(r, &t->offset, "tensor offset");
        if (rc) return rc;
    }
    r->where[0] = '\0';
    return TL_OK;
}

/* Tensors must lie in the file, aligned, in order and back to back with only
 * alignment padding between them: the layout llama.cpp writes and requires. */
static int place_tensors(reader *r, tl_gguf *g) {
    uint64_t a = g->alignment, header_end = r->pos, expect = 0;
    if (tl_add_u64(header_end, a - 1, &g->data_offset))
        return tl_fail(r->err, TL_ERR_FORMAT, "data offset overflows");
    g->data_offset &= ~(a - 1);
    if (g->n_tensors == 0) {
        /* vocab-only files need not pad their (empty) data section */
        if (g->data_offset > g->file_size) g->data_offset = g->file_size;
        return TL_OK;
    }
    if (g->data_offset > g->file_size)
        return tl_fail(r->err, TL_ERR_FORMAT,
                       "data section would start at byte %llu, past the end of the file (%llu bytes)",
                       (unsigned long long)g->data_offset, (unsigned long long)g->file_size);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tl_gguf_tensor *t = &g->tensors[i];
        char name[200];
        uint64_t start, end, padded;
        escape_str(name, sizeof name, t->name.ptr, t->name.len);
        if (t->offset % a != 0)
            return tl_fail(r->err, TL_ERR_FORMAT, "tensor %llu '%s': offset %llu is not a multiple of the alignment %llu",
                           (unsigned long long)i, name, (unsigned long long)t->offset, (unsigned long long)a);
        if (tl_add_u64(g->data_offset, t->offset, &start) || tl_add_u64(start, t->nbytes, &end) ||
            end > g->file_size)
            return tl_fail(r->err, TL_ERR_FORMAT,
                           "tensor %llu '%s': data (offset %llu, %llu bytes) runs past the end of the file (%llu bytes, data section at %llu)",
                           (unsigned long long)i, name, (unsigned long long)t->offset,
                           (unsigned long long)t->nbytes, (unsigned long long)g->file_size,
                           (unsigned long long)g->data_offset);
        if (t->offset != expect)
            return tl_fail(r->err, TL_ERR_FORMAT,
                           "tensor %llu '%s': offset %llu, expected %llu (tensor data must be in order, without gaps or overlap)",
                           (unsigned long long)i, name, (unsigned long long)t->offset, (unsigned long long)expect);
        /* end <= file_size, so padding it cannot overflow */
        padded = (t->offset + t->nbytes + a - 1) & ~(a - 1);
        expect = padded;
        t->data = g->base + start;
    }
    return TL_OK;
}

/* ---- open / close ------------------------------------------------------------ */

static int read_header(reader *r, tl_gguf *g) {
    snprintf(r->where, sizeof r->where, "header");
    if (r->size < 4 || memcmp(r->buf, "GGUF", 4) != 0)
        return tl_fail(r->err, TL_ERR_FORMAT, "not a GGUF file (bad magic)");
    if (r->size < 24)
        return tl_fail(r->err, TL_ERR_FORMAT, "file is %llu bytes, smaller than a GGUF header (24 bytes)",
                       (unsigned long long)r->size);
    r->pos = 4;
    read_u32(r, &g->version, "version");
    if (g->version == 1)
        return tl_fail(r->err, TL_ERR_UNSUPPORTED, "GGUF version 1 is no longer supported (only 2 and 3)");
    if (g->version != 2 && g->version != 3)
        return tl_fail(r->err, TL_ERR_UNSUPPORTED, "unsupported GGUF version %u (only 2 and 3)%s",
                       g->version, (g->version & 0xffff) == 0 ? "; a big-endian file?" : "");
    read_u64(r, &g->n_tensors, "tensor count");
    read_u64(r, &g->n_kv, "metadata count");
    r->where[0] = '\0';
    return TL_OK;
}

static int parse(gguf_impl *im, tl_error *err) {
    tl_gguf *g = &im->g;
    reader r = {.buf = g->base, .size = g->file_size, .pos = 0, .err = err};
    int rc = read_header(&r, g);
    if (!rc) rc = read_kvs(&r, im);
    if (!rc) rc = read_alignment(&r, g);
    if (!rc) rc = read_tensor_infos(&r, im);
    if (!rc) rc = place_tensors(&r, g);
    return rc;
}

int tl_gguf_open_buffer(const void *buf, size_t size, tl_gguf **out, tl_error *err) {
    if (!out) return tl_fail(err, TL_ERR_ARG, "tl_gguf_open_buffer: out is NULL");
    *out = NULL;
    if (!buf && size) return tl_fail(err, TL_ERR_ARG, "tl_gguf_open_buffer: buf is NULL");
    if (size == 0) return tl_fail(err, TL_ERR_FORMAT, "not a GGUF file (empty)");
    gguf_impl *im = calloc(1, sizeof *im);
    if (!im) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    im->g.base = buf;
    im->g.file_size = size;
    int rc = parse(im, err);
    if (rc) {
        tl_gguf_close(&im->g);
        return rc;
    }
    *out = &im->g;
    return TL_OK;
}

int tl_gguf_open(const char *path, tl_gguf **out, tl_error *err) {
    if (!out || !path) return tl_fail(err, TL_ERR_ARG, "tl_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tl_fail(err, TL_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tl_fail(err, TL_ERR_IO, "not a regular file");
    }
    if (st.st_size == 0) {
        close(fd);
        return tl_fail(err, TL_ERR_FORMAT, "not a GGUF file (empty)");
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) return tl_fail(err, TL_ERR_IO, "cannot map: %s", strerror(saved));
    tl_gguf *g = NULL;
    int rc = tl_gguf_open_buffer(map, (size_t)st.st_size, &g, err);
    if (rc) {
        munmap(map, (size_t)st.st_size);
        return rc;
    }
    gguf_impl *im = (gguf_impl *)g;
    im->map = map;
    im->map_len = (size_t)st.st_size;
    g->mapped = 1;
    *out = g;
    return TL_OK;
}

void tl_gguf_close(tl_gguf *g) {
    if (!g) return;
    gguf_impl *im = (gguf_impl *)g;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free((void *)g->kv[i].arr_str);
    free(g->kv);
    free(g->tensors);
    free(im->kv_index.slots);
    free(im->tensor_index.slots);
    if (im->map) munmap(im->map, im->map_len);
    free(im);
}

/* ---- lookups and getters --------------------------------------------------------- */

const tl_gguf_kv *tl_gguf_find(const tl_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    int64_t i = index_find(&((const gguf_impl *)g)->kv_index, g, kv_name, key, strlen(key));
    return i < 0 ? NULL : &g->kv[i];
}

const tl_gguf_tensor *tl_gguf_find_tensor(const tl_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    int64_t i = index_find(&((const gguf_impl *)g)->tensor_index, g, tensor_name, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

/* Integer element of type t at p; *ok = 0 if t is not an integer type or the
 * value does not fit in int64. */
static int64_t int_at(uint32_t t, const uint8_t *p, int *ok) {
    *ok = 1;
    switch (t) {
    case GGUF_TYPE_UINT8: return p[0];
    case GGUF_TYPE_INT8: return (int8_t)p[0];
    case GGUF_TYPE_UINT16: return tl_le_u16(p);
    case GGUF_TYPE_INT16: return (int16_t)tl_le_u16(p);
    case GGUF_TYPE_UINT32: return tl_le_u32(p);
    case GGUF_TYPE_INT32: return (int32_t)tl_le_u32(p);
    case GGUF_TYPE_INT64: return (int64_t)tl_le_u64(p);
    case GGUF_TYPE_UINT64: {
        uint64_t v = tl_le_u64(p);
        if (v > (uint64_t)INT64_MAX) break;
        return (int64_t)v;
    }
    default: break;
    }
    *ok = 0;
    return 0;
}

static double float_at(uint32_t t, const uint8_t *p, int *ok) {
    *ok = 1;
    if (t == GGUF_TYPE_FLOAT32) {
        uint32_t b = tl_le_u32(p);
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        uint64_t b = tl_le_u64(p);
        double d;
        memcpy(&d, &b, 8);
        return d;
    }
    *ok = 0;
    return 0;
}

int tl_gguf_get_int(const tl_gguf *g, const char *key, int64_t *out) {
    const tl_gguf_kv *kv = tl_gguf_find(g, key);
    if (!kv) return 0;
    int ok;
    int64_t v = int_at(kv->type, kv->data, &ok);
    if (!ok) return -1;
    if (out) *out = v;
    return 1;
}

int tl_gguf_get_float(const tl_gguf *g, const char *key, double *out) {
    const tl_gguf_kv *kv = tl_gguf_find(g, key);
    if (!kv) return 0;
    int ok;
    double v = float_at(kv->type, kv->data, &ok);
    if (!ok) return -1;
    if (out) *out = v;
    return 1;
}

int tl_gguf_get_bool(const tl_gguf *g, const char *key, int *out) {
    const tl_gguf_kv *kv = tl_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_TYPE_BOOL) return -1;
    if (out) *out = kv->data[0] != 0; /* any nonzero byte is true, as in llama.cpp */
    return 1;
}

int tl_gguf_get_str(const tl_gguf *g, const char *key, tl_str *out) {
    const tl_gguf_kv *kv = tl_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_TYPE_STRING) return -1;
    if (out) {
        out->len = tl_le_u64(kv->data);
        out->ptr = (const char *)kv->data + 8;
    }
    return 1;
}

int64_t tl_gguf_arr_int(const tl_gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n) return 0;
    uint64_t sz = tl_gguf_scalar_size(kv->arr_type);
    if (!sz) return 0;
    if (kv->arr_type == GGUF_TYPE_BOOL) return kv->data[i] != 0;
    int ok;
    int64_t v = int_at(kv->arr_type, kv->data + i * sz, &ok);
    if (ok) return v;
    if (kv->arr_type == GGUF_TYPE_UINT64) return INT64_MAX; /* saturate what does not fit */
    double d = float_at(kv->arr_type, kv->data + i * sz, &ok);
    if (!(d == d)) return 0;
    if (d >= 9.2233720368547758e18) return INT64_MAX;
    if (d <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)d;
}

double tl_gguf_arr_float(const tl_gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n) return 0;
    uint64_t sz = tl_gguf_scalar_size(kv->arr_type);
    if (!sz) return 0;
    const uint8_t *p = kv->data + i * sz;
    int ok;
    double d = float_at(kv->arr_type, p, &ok);
    if (ok) return d;
    if (kv->arr_type == GGUF_TYPE_BOOL) return p[0] != 0;
    if (kv->arr_type == GGUF_TYPE_UINT64) return (double)tl_le_u64(p);
    return (double)int_at(kv->arr_type, p, &ok);
}

const char *tl_gguf_type_name(tl_gguf_type t) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

int tl_str_eq(tl_str a, const char *s) {
    size_t n = strlen(s);
    return a.len == n && (n == 0 || memcmp(a.ptr, s, n) == 0);
}
