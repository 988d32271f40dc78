/* gguf_write: builds a GGUF v3 file. Owns copies of every key's serialized
 * value (so a source file may be closed or its keys replaced), the tensor
 * table, and the output FILE. Everything is little-endian on disk; the header
 * is written before any tensor data so the data can be streamed in one pass. */
#include "load/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "base/util.h"

#define WRITE_BUF (4u << 20)
#define MAX_VALUE_DEPTH 8

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* the serialized value, as it follows the type in the file */
    size_t len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t n_dims, type;
    int64_t ne[4];
    uint64_t offset, nbytes;
} wtensor;

struct tl_gguf_writer {
    uint64_t alignment;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    uint64_t data_size; /* the data section, padded */
    FILE *f;
    char *path;
    char *buf; /* stdio buffer: large writes, few syscalls */
    size_t cur;        /* tensor being streamed */
    uint64_t cur_done; /* its bytes written so far */
};

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int tl_gguf_writer_new(uint64_t alignment, tl_gguf_writer **out, tl_error *err) {
    *out = NULL;
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1))
        return tl_fail(err, TL_ERR_ARG, "gguf writer: alignment %llu is not a power of two",
                       (unsigned long long)alignment);
    tl_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
    w->alignment = alignment;
    *out = w;
    return TL_OK;
}

void tl_gguf_writer_free(tl_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w->buf);
    free(w);
}

/* ---- metadata ------------------------------------------------------------ */

/* Byte length of a serialized value of type t at p (before end), or 0 if it
 * does not fit. The source was validated on open; this only re-walks it. */
static uint64_t value_extent(uint32_t t, const uint8_t *p, const uint8_t *end, int depth) {
    uint64_t avail = (uint64_t)(end - p), n, sz, total;
    if (depth > MAX_VALUE_DEPTH) return 0;
    if (t == GGUF_TYPE_STRING) {
        if (avail < 8 || tl_le_u64(p) > avail - 8) return 0;
        return 8 + tl_le_u64(p);
    }
    if (t != GGUF_TYPE_ARRAY) {
        sz = tl_gguf_scalar_size(t);
        return sz && sz <= avail ? sz : 0;
    }
    if (avail < 12) return 0;
    uint32_t et = tl_le_u32(p);
    n = tl_le_u64(p + 4);
    total = 12;
    sz = tl_gguf_scalar_size(et);
    if (sz) {
        if (tl_mul_u64(n, sz, &sz) || sz > avail - 12) return 0;
        return 12 + sz;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t e = value_extent(et, p + total, end, depth + 1);
        if (!e) return 0;
        total += e;
    }
    return total;
}

static int find_kv(const tl_gguf_writer *w, const char *key, size_t klen) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strlen(w->kv[i].key) == klen && !memcmp(w->kv[i].key, key, klen)) return (int)i;
    return -1;
}

/* Appends (a copy of) key = value bytes, dropping an existing value. */
static int put_kv(tl_gguf_writer *w, const char *key, size_t klen, uint32_t type,
                  const void *val, size_t len, tl_error *err) {
    uint8_t *v = malloc(len ? len : 1);
    if (!v) return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory for key '%.*s'", (int)klen, key);
    memcpy(v, val, len);
    int i = find_kv(w, key, klen);
    if (i >= 0) { /* ggml's gguf_set_* moves a replaced key to the end: so do we */
        free(w->kv[i].key);
        free(w->kv[i].val);
        memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - (size_t)i - 1) * sizeof *w->kv);
        w->n_kv--;
    }
    if (w->n_kv == w->cap_kv) {
        size_t nc = w->cap_kv ? w->cap_kv * 2 : 64;
        wkv *nk = realloc(w->kv, nc * sizeof *nk);
        if (!nk) {
            free(v);
            return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
        }
        w->kv = nk;
        w->cap_kv = nc;
    }
    char *k = malloc(klen + 1);
    if (!k) {
        free(v);
        return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
    }
    memcpy(k, key, klen);
    k[klen] = 0;
    w->kv[w->n_kv++] = (wkv){k, type, v, len};
    return TL_OK;
}

int tl_gguf_writer_copy_kvs(tl_gguf_writer *w, const tl_gguf *src, tl_error *err) {
    const uint8_t *end = src->base + src->file_size;
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const tl_gguf_kv *kv = &src->kv[i];
        /* kv->data is the value, or an array's first element after its
         * 4-byte element type and 8-byte count. */
        const uint8_t *start = kv->type == GGUF_TYPE_ARRAY ? kv->data - 12 : kv->data;
        uint64_t len = value_extent(kv->type, start, end, 0);
        if (!len)
            return tl_fail(err, TL_ERR_FORMAT, "gguf writer: cannot copy key '%.*s'",
                           (int)kv->key.len, kv->key.ptr);
        int rc = put_kv(w, kv->key.ptr, (size_t)kv->key.len, kv->type, start, (size_t)len, err);
        if (rc) return rc;
    }
    return TL_OK;
}

int tl_gguf_writer_set_u32(tl_gguf_writer *w, const char *key, uint32_t v, tl_error *err) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return put_kv(w, key, strlen(key), GGUF_TYPE_UINT32, b, 4, err);
}

int tl_gguf_writer_set_f32(tl_gguf_writer *w, const char *key, float v, tl_error *err) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    return put_kv(w, key, strlen(key), GGUF_TYPE_FLOAT32, b, 4, err);
}

int tl_gguf_writer_set_str(tl_gguf_writer *w, const char *key, const char *v, tl_error *err) {
    size_t n = strlen(v);
    uint8_t *b = malloc(8 + n);
    if (!b) return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, v, n);
    int rc = put_kv(w, key, strlen(key), GGUF_TYPE_STRING, b, 8 + n, err);
    free(b);
    return rc;
}

void tl_gguf_writer_remove(tl_gguf_writer *w, const char *key) {
    int i = find_kv(w, key, strlen(key));
    if (i < 0) return;
    free(w->kv[i].key);
    free(w->kv[i].val);
    memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - (size_t)i - 1) * sizeof *w->kv);
    w->n_kv--;
}

/* ---- tensors ------------------------------------------------------------- */

int tl_gguf_writer_add_tensor(tl_gguf_writer *w, const char *name, uint32_t n_dims,
                              const int64_t ne[4], uint32_t type, tl_error *err) {
    if (w->f) return tl_fail(err, TL_ERR_ARG, "gguf writer: tensor '%s' added after open", name);
    if (n_dims < 1 || n_dims > 4)
        return tl_fail(err, TL_ERR_ARG, "gguf writer: tensor '%s' has %u dims", name, n_dims);
    if (strlen(name) >= 64)
        return tl_fail(err, TL_ERR_ARG, "gguf writer: tensor name '%s' is too long", name);
    uint64_t rows = 1;
    for (uint32_t d = 1; d < 4; d++) {
        if (ne[d] < 1 || (d >= n_dims && ne[d] != 1) || tl_mul_u64(rows, (uint64_t)ne[d], &rows))
            return tl_fail(err, TL_ERR_ARG, "gguf writer: tensor '%s' has a bad shape", name);
    }
    size_t row = ne[0] > 0 ? tl_row_size((tl_type)type, ne[0]) : 0;
    uint64_t nbytes, end;
    if (!row || tl_mul_u64(rows, row, &nbytes))
        return tl_fail(err, TL_ERR_ARG, "gguf writer: tensor '%s': %lld elements per row do not fit type %u",
                       name, (long long)ne[0], type);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return tl_fail(err, TL_ERR_ARG, "gguf writer: duplicate tensor '%s'", name);
    if (tl_add_u64(w->data_size, nbytes, &end) || end > UINT64_MAX - w->alignment)
        return tl_fail(err, TL_ERR_ARG, "gguf writer: data section overflows");
    if (w->n_t == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 256;
        wtensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
        w->t = nt;
        w->cap_t = nc;
    }
    char *nm = strdup(name);
    if (!nm) return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
    wtensor *t = &w->t[w->n_t++];
    *t = (wtensor){.name = nm, .n_dims = n_dims, .type = type, .offset = w->data_size, .nbytes = nbytes};
    memcpy(t->ne, ne, sizeof t->ne);
    w->data_size = pad_to(end, w->alignment);
    return TL_OK;
}

uint64_t tl_gguf_writer_tensor_nbytes(const tl_gguf_writer *w, uint64_t i) {
    return i < w->n_t ? w->t[i].nbytes : 0;
}

static uint64_t header_size(const tl_gguf_writer *w) {
    uint64_t n = 4 + 4 + 8 + 8;
    for (size_t i = 0; i < w->n_kv; i++) n += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].len;
    for (size_t i = 0; i < w->n_t; i++) n += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 4 + 8;
    return pad_to(n, w->alignment);
}

uint64_t tl_gguf_writer_file_size(const tl_gguf_writer *w) { return header_size(w) + w->data_size; }

/* ---- output -------------------------------------------------------------- */

static int put(tl_gguf_writer *w, const void *p, size_t n, tl_error *err) {
    if (n && fwrite(p, 1, n, w->f) != n)
        return tl_fail(err, TL_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
    return TL_OK;
}

static int put_u32(tl_gguf_writer *w, uint32_t v, tl_error *err) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return put(w, b, 4, err);
}

static int put_u64(tl_gguf_writer *w, uint64_t v, tl_error *err) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, 8, err);
}

static int put_zeros(tl_gguf_writer *w, uint64_t n, tl_error *err) {
    static const uint8_t zero[64];
    while (n) {
        size_t k = n < sizeof zero ? (size_t)n : sizeof zero;
        int rc = put(w, zero, k, err);
        if (rc) return rc;
        n -= k;
    }
    return TL_OK;
}

static int put_str(tl_gguf_writer *w, const char *s, tl_error *err) {
    size_t n = strlen(s);
    int rc = put_u64(w, n, err);
    return rc ? rc : put(w, s, n, err);
}

static int write_header(tl_gguf_writer *w, tl_error *err) {
    int rc = put(w, "GGUF", 4, err);
    if (!rc) rc = put_u32(w, 3, err);
    if (!rc) rc = put_u64(w, w->n_t, err);
    if (!rc) rc = put_u64(w, w->n_kv, err);
    for (size_t i = 0; !rc && i < w->n_kv; i++) {
        rc = put_str(w, w->kv[i].key, err);
        if (!rc) rc = put_u32(w, w->kv[i].type, err);
        if (!rc) rc = put(w, w->kv[i].val, w->kv[i].len, err);
    }
    for (size_t i = 0; !rc && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        rc = put_str(w, t->name, err);
        if (!rc) rc = put_u32(w, t->n_dims, err);
        for (uint32_t d = 0; !rc && d < t->n_dims; d++) rc = put_u64(w, (uint64_t)t->ne[d], err);
        if (!rc) rc = put_u32(w, t->type, err);
        if (!rc) rc = put_u64(w, t->offset, err);
    }
    if (rc) return rc;
    long pos = ftell(w->f);
    if (pos < 0) return tl_fail(err, TL_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
    return put_zeros(w, pad_to((uint64_t)pos, w->alignment) - (uint64_t)pos, err);
}

int tl_gguf_writer_open(tl_gguf_writer *w, const char *path, tl_error *err) {
    if (w->f) return tl_fail(err, TL_ERR_ARG, "gguf writer: already open");
    w->path = strdup(path);
    w->buf = malloc(WRITE_BUF);
    if (!w->path || !w->buf) return tl_fail(err, TL_ERR_NOMEM, "gguf writer: out of memory");
    w->f = fopen(path, "wb");
    if (!w->f) return tl_fail(err, TL_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    setvbuf(w->f, w->buf, _IOFBF, WRITE_BUF);
    w->cur = 0;
    w->cur_done = 0;
    return write_header(w, err);
}

int tl_gguf_writer_write(tl_gguf_writer *w, const void *data, size_t n, tl_error *err) {
    const uint8_t *p = data;
    if (!w->f) return tl_fail(err, TL_ERR_ARG, "gguf writer: not open");
    while (n) {
        if (w->cur >= w->n_t)
            return tl_fail(err, TL_ERR_ARG, "gguf writer: %zu bytes past the last tensor's data", n);
        const wtensor *t = &w->t[w->cur];
        uint64_t left = t->nbytes - w->cur_done;
        size_t k = n < left ? n : (size_t)left;
        int rc = put(w, p, k, err);
        if (rc) return rc;
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            rc = put_zeros(w, pad_to(t->nbytes, w->alignment) - t->nbytes, err);
            if (rc) return rc;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return TL_OK;
}

int tl_gguf_writer_close(tl_gguf_writer *w, tl_error *err) {
    if (!w->f) return tl_fail(err, TL_ERR_ARG, "gguf writer: not open");
    /* Empty tensors complete without a write call. */
    while (w->cur < w->n_t && w->t[w->cur].nbytes == 0) w->cur++;
    int rc = TL_OK;
    if (w->cur < w->n_t)
        rc = tl_fail(err, TL_ERR_ARG, "gguf writer: tensor '%s' got %llu of %llu bytes", w->t[w->cur].name,
                     (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
    if (fflush(w->f) != 0 && !rc) rc = tl_fail(err, TL_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
    if (ferror(w->f) && !rc) rc = tl_fail(err, TL_ERR_IO, "cannot write %s", w->path);
    if (fclose(w->f) != 0 && !rc) rc = tl_fail(err, TL_ERR_IO, "cannot close %s: %s", w->path, strerror(errno));
    w->f = NULL;
    return rc;
}
