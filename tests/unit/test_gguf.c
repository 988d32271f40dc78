/* test_gguf: the GGUF reader on files built here in memory (v2/v3, every value
 * type, nested arrays, aligned tensors), on corrupt variants of them (each must
 * fail cleanly), on the real models and on the vocabulary-only files. */
#include <glob.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "load/gguf.h"
#include "quant/quant.h"
#include "tl_test.h"
#include "tokenloop.h"

/* ---- a little GGUF writer ------------------------------------------------ */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 1024) + n;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(buf *b, uint16_t v) { put(b, &v, 2); } /* host is little-endian */
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s, size_t len) {
    put_u64(b, len);
    put(b, s, len);
}
static void put_cstr(buf *b, const char *s) { put_str(b, s, strlen(s)); }
static void key(buf *b, const char *k, uint32_t type) {
    put_cstr(b, k);
    put_u32(b, type);
}
static void arr(buf *b, const char *k, uint32_t et, uint64_t n) {
    key(b, k, GGUF_TYPE_ARRAY);
    put_u32(b, et);
    put_u64(b, n);
}
static void pad_to(buf *b, size_t align) {
    while (b->n % align) put_u8(b, 0);
}
static void set_u32(buf *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static void set_u64(buf *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* Where the interesting fields of the sample file are, for corrupting them. */
typedef struct layout {
    size_t n_tensors, n_kv;
    size_t key0_len;       /* length of the first key */
    size_t str_len;        /* length of the k.str value */
    size_t i8_key_name;    /* the bytes of "k.i8" */
    size_t type_u8;        /* value type of k.u8 */
    size_t arr_u8_type, arr_u8_n;
    size_t arr_str_n, arr_str_len1; /* count, length of its second string */
    size_t nested_n, nested_inner_type;
    size_t t_name[3], t_ndims[3], t_ne0[3], t_ne1[3], t_type[3], t_off[3];
    size_t data_offset;
    uint64_t t_offset[3], t_nbytes[3];
} layout;

#define N_SAMPLE_KV 24

/* The sample: every metadata type, nested arrays, three tensors. alignment 0
 * means no general.alignment key (default 32). */
static void make_sample(buf *b, layout *L, uint32_t version, uint32_t alignment) {
    b->n = 0;
    put(b, "GGUF", 4);
    put_u32(b, version);
    L->n_tensors = b->n;
    put_u64(b, 3);
    L->n_kv = b->n;
    put_u64(b, N_SAMPLE_KV - (alignment ? 0 : 1));
    L->key0_len = b->n;
    key(b, "general.architecture", GGUF_TYPE_STRING);
    put_cstr(b, "llama");
    key(b, "k.u8", GGUF_TYPE_UINT8);
    L->type_u8 = b->n - 4;
    put_u8(b, 200);
    L->i8_key_name = b->n + 8;
    key(b, "k.i8", GGUF_TYPE_INT8);
    put_u8(b, (uint8_t)-5);
    key(b, "k.u16", GGUF_TYPE_UINT16), put_u16(b, 60000);
    key(b, "k.i16", GGUF_TYPE_INT16), put_u16(b, (uint16_t)-30000);
    key(b, "k.u32", GGUF_TYPE_UINT32), put_u32(b, 4000000000u);
    key(b, "k.i32", GGUF_TYPE_INT32), put_u32(b, (uint32_t)-2000000000);
    float f = 1.5f;
    key(b, "k.f32", GGUF_TYPE_FLOAT32), put(b, &f, 4);
    key(b, "k.bool", GGUF_TYPE_BOOL), put_u8(b, 1);
    key(b, "k.bool2", GGUF_TYPE_BOOL), put_u8(b, 2); /* nonzero is true, as in llama.cpp */
    key(b, "k.str", GGUF_TYPE_STRING);
    L->str_len = b->n;
    put_str(b, "h\xffllo\0w", 7);
    key(b, "k.u64", GGUF_TYPE_UINT64), put_u64(b, (1ull << 63) + 5);
    key(b, "k.i64", GGUF_TYPE_INT64), put_u64(b, (uint64_t)-(1ll << 40));
    double d = 3.25;
    key(b, "k.f64", GGUF_TYPE_FLOAT64), put(b, &d, 8);
    arr(b, "a.u8", GGUF_TYPE_UINT8, 3);
    L->arr_u8_type = b->n - 12;
    L->arr_u8_n = b->n - 8;
    put_u8(b, 1), put_u8(b, 2), put_u8(b, 250);
    arr(b, "a.i32", GGUF_TYPE_INT32, 2), put_u32(b, (uint32_t)-1), put_u32(b, 7);
    arr(b, "a.f32", GGUF_TYPE_FLOAT32, 2);
    f = -0.25f, put(b, &f, 4);
    f = 8.0f, put(b, &f, 4);
    arr(b, "a.str", GGUF_TYPE_STRING, 3);
    L->arr_str_n = b->n - 8;
    put_cstr(b, "a");
    L->arr_str_len1 = b->n;
    put_cstr(b, "");
    put_cstr(b, "ccc");
    arr(b, "a.bool", GGUF_TYPE_BOOL, 2), put_u8(b, 0), put_u8(b, 1);
    arr(b, "a.u64", GGUF_TYPE_UINT64, 1), put_u64(b, 123456789012345ull);
    /* [[1, 2], [3]] of i16 */
    arr(b, "a.nested", GGUF_TYPE_ARRAY, 2);
    L->nested_n = b->n - 8;
    L->nested_inner_type = b->n;
    put_u32(b, GGUF_TYPE_INT16), put_u64(b, 2), put_u16(b, 1), put_u16(b, 2);
    put_u32(b, GGUF_TYPE_INT16), put_u64(b, 1), put_u16(b, 3);
    /* [["x"], []] of strings */
    arr(b, "a.nested_str", GGUF_TYPE_ARRAY, 2);
    put_u32(b, GGUF_TYPE_STRING), put_u64(b, 1), put_cstr(b, "x");
    put_u32(b, GGUF_TYPE_STRING), put_u64(b, 0);
    arr(b, "a.empty", GGUF_TYPE_FLOAT64, 0);
    if (alignment) key(b, "general.alignment", GGUF_TYPE_UINT32), put_u32(b, alignment);

    uint32_t a = alignment ? alignment : 32;
    static const char *const names[3] = {"t.f32", "t.q80", "t.q4k"};
    static const uint32_t types[3] = {TL_F32, TL_Q8_0, TL_Q4_K};
    static const int64_t ne0[3] = {4, 64, 256}, ne1[3] = {3, 2, 1};
    static const uint32_t ndims[3] = {2, 2, 1};
    static const uint64_t nbytes[3] = {48, 2 * 2 * 34, 144};
    uint64_t off = 0;
    for (int i = 0; i < 3; i++) {
        L->t_name[i] = b->n + 8;
        put_cstr(b, names[i]);
        L->t_ndims[i] = b->n;
        put_u32(b, ndims[i]);
        L->t_ne0[i] = b->n;
        put_u64(b, (uint64_t)ne0[i]);
        L->t_ne1[i] = b->n;
        if (ndims[i] > 1) put_u64(b, (uint64_t)ne1[i]);
        L->t_type[i] = b->n;
        put_u32(b, types[i]);
        L->t_off[i] = b->n;
        put_u64(b, off);
        L->t_offset[i] = off;
        L->t_nbytes[i] = nbytes[i];
        off = (off + nbytes[i] + a - 1) / a * a;
    }
    pad_to(b, a);
    L->data_offset = b->n;
    for (int i = 0; i < 3; i++) {
        while (b->n < L->data_offset + L->t_offset[i]) put_u8(b, 0);
        for (uint64_t j = 0; j < nbytes[i]; j++) put_u8(b, (uint8_t)(i * 50 + j));
    }
    /* no padding after the last tensor: then every proper prefix is corrupt */
}

/* ---- valid files ------------------------------------------------------------ */

static void check_sample(const tl_gguf *g, const layout *L, const uint8_t *base, uint32_t version,
                         uint32_t alignment) {
    int64_t iv;
    double fv;
    int bv;
    tl_str s;
    CHECK(g->version == version, "version %u", g->version);
    CHECK(g->n_tensors == 3, "n_tensors %llu", (unsigned long long)g->n_tensors);
    CHECK(g->n_kv == N_SAMPLE_KV - (alignment ? 0u : 1u), "n_kv %llu", (unsigned long long)g->n_kv);
    CHECK(g->alignment == (alignment ? alignment : 32), "alignment %llu", (unsigned long long)g->alignment);
    CHECK(g->data_offset == L->data_offset, "data_offset %llu vs %zu",
          (unsigned long long)g->data_offset, L->data_offset);
    CHECK(g->data_offset % g->alignment == 0, "data offset aligned");
    CHECK(tl_gguf_get_str(g, "general.architecture", &s) == 1 && tl_str_eq(s, "llama"), "arch");
    CHECK(tl_gguf_get_int(g, "k.u8", &iv) == 1 && iv == 200, "u8 %lld", (long long)iv);
    CHECK(tl_gguf_get_int(g, "k.i8", &iv) == 1 && iv == -5, "i8 %lld", (long long)iv);
    CHECK(tl_gguf_get_int(g, "k.u16", &iv) == 1 && iv == 60000, "u16");
    CHECK(tl_gguf_get_int(g, "k.i16", &iv) == 1 && iv == -30000, "i16");
    CHECK(tl_gguf_get_int(g, "k.u32", &iv) == 1 && iv == 4000000000ll, "u32");
    CHECK(tl_gguf_get_int(g, "k.i32", &iv) == 1 && iv == -2000000000ll, "i32");
    CHECK(tl_gguf_get_float(g, "k.f32", &fv) == 1 && fv == 1.5, "f32");
    CHECK(tl_gguf_get_bool(g, "k.bool", &bv) == 1 && bv == 1, "bool");
    CHECK(tl_gguf_get_bool(g, "k.bool2", &bv) == 1 && bv == 1, "bool 2");
    CHECK(tl_gguf_get_str(g, "k.str", &s) == 1 && s.len == 7 && memcmp(s.ptr, "h\xffllo\0w", 7) == 0,
          "str");
    CHECK(tl_gguf_get_int(g, "k.u64", &iv) == -1, "u64 above INT64_MAX does not fit");
    CHECK(tl_gguf_get_int(g, "k.i64", &iv) == 1 && iv == -(1ll << 40), "i64");
    CHECK(tl_gguf_get_float(g, "k.f64", &fv) == 1 && fv == 3.25, "f64");
    CHECK(tl_gguf_get_int(g, "k.f32", &iv) == -1, "f32 is not an int");
    CHECK(tl_gguf_get_float(g, "k.u8", &fv) == -1, "u8 is not a float");
    CHECK(tl_gguf_get_str(g, "k.u8", &s) == -1, "u8 is not a string");
    CHECK(tl_gguf_get_bool(g, "k.u8", &bv) == -1, "u8 is not a bool");
    CHECK(tl_gguf_get_int(g, "nope", &iv) == 0 && tl_gguf_find(g, "nope") == NULL, "absent");
    CHECK(tl_gguf_find(g, "k.u") == NULL && tl_gguf_find(g, "k.u88") == NULL, "no prefix match");

    const tl_gguf_kv *kv = tl_gguf_find(g, "a.u8");
    CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_UINT8 && kv->arr_n == 3 &&
              tl_gguf_arr_int(kv, 0) == 1 && tl_gguf_arr_int(kv, 2) == 250 && kv->arr_str == NULL,
          "a.u8");
    kv = tl_gguf_find(g, "a.i32");
    CHECK(kv && kv->arr_n == 2 && tl_gguf_arr_int(kv, 0) == -1 && tl_gguf_arr_int(kv, 1) == 7, "a.i32");
    CHECK(kv && tl_gguf_arr_float(kv, 0) == -1.0, "a.i32 as float");
    kv = tl_gguf_find(g, "a.f32");
    CHECK(kv && kv->arr_n == 2 && tl_gguf_arr_float(kv, 0) == -0.25 && tl_gguf_arr_float(kv, 1) == 8.0,
          "a.f32");
    kv = tl_gguf_find(g, "a.str");
    CHECK(kv && kv->arr_type == GGUF_TYPE_STRING && kv->arr_n == 3 && kv->arr_str &&
              tl_str_eq(kv->arr_str[0], "a") && tl_str_eq(kv->arr_str[1], "") &&
              tl_str_eq(kv->arr_str[2], "ccc"),
          "a.str");
    kv = tl_gguf_find(g, "a.bool");
    CHECK(kv && tl_gguf_arr_int(kv, 0) == 0 && tl_gguf_arr_int(kv, 1) == 1, "a.bool");
    kv = tl_gguf_find(g, "a.u64");
    CHECK(kv && tl_gguf_arr_int(kv, 0) == 123456789012345ll, "a.u64");
    kv = tl_gguf_find(g, "a.nested");
    CHECK(kv && kv->arr_type == GGUF_TYPE_ARRAY && kv->arr_n == 2 &&
              kv->data == base + L->nested_inner_type,
          "a.nested");
    kv = tl_gguf_find(g, "a.nested_str");
    CHECK(kv && kv->arr_type == GGUF_TYPE_ARRAY && kv->arr_n == 2 && kv->arr_str == NULL, "nested str");
    kv = tl_gguf_find(g, "a.empty");
    CHECK(kv && kv->arr_type == GGUF_TYPE_FLOAT64 && kv->arr_n == 0, "a.empty");
    /* key order is the file's */
    CHECK(tl_str_eq(g->kv[0].key, "general.architecture") && tl_str_eq(g->kv[1].key, "k.u8"), "kv order");

    static const char *const names[3] = {"t.f32", "t.q80", "t.q4k"};
    static const uint32_t types[3] = {TL_F32, TL_Q8_0, TL_Q4_K};
    for (int i = 0; i < 3; i++) {
        const tl_gguf_tensor *t = tl_gguf_find_tensor(g, names[i]);
        CHECK(t == &g->tensors[i], "tensor %s found", names[i]);
        if (!t) continue;
        CHECK(t->type == types[i], "type of %s", names[i]);
        CHECK(t->offset == L->t_offset[i] && t->offset % g->alignment == 0, "offset of %s: %llu",
              names[i], (unsigned long long)t->offset);
        CHECK(t->nbytes == L->t_nbytes[i], "nbytes of %s: %llu", names[i], (unsigned long long)t->nbytes);
        CHECK(t->data == base + L->data_offset + L->t_offset[i], "data of %s", names[i]);
        CHECK(((const uint8_t *)t->data)[1] == (uint8_t)(i * 50 + 1), "data bytes of %s", names[i]);
    }
    const tl_gguf_tensor *t = &g->tensors[1];
    CHECK(t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 2 && t->ne[2] == 1 && t->ne[3] == 1, "q8 shape");
    t = &g->tensors[2];
    CHECK(t->n_dims == 1 && t->ne[0] == 256 && t->ne[1] == 1, "q4k shape");
    CHECK(tl_gguf_find_tensor(g, "t.f3") == NULL, "absent tensor");
}

static void test_valid(void) {
    static const uint32_t versions[2] = {2, 3};
    static const uint32_t aligns[4] = {0, 32, 64, 8};
    for (int v = 0; v < 2; v++) {
        for (int a = 0; a < 4; a++) {
            buf b = {0};
            layout L;
            make_sample(&b, &L, versions[v], aligns[a]);
            tl_gguf *g = NULL;
            tl_error err = {0};
            int rc = tl_gguf_open_buffer(b.p, b.n, &g, &err);
            CHECK(rc == 0 && g, "v%u align %u: %s", versions[v], aligns[a], err.msg);
            if (g) check_sample(g, &L, b.p, versions[v], aligns[a]);
            tl_gguf_close(g);
            free(b.p);
        }
    }
}

/* The same sample through tl_gguf_open (mmap) from a temporary file. */
static void test_open_file(void) {
    buf b = {0};
    layout L;
    make_sample(&b, &L, 3, 64);
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    CHECK(write(fd, b.p, b.n) == (ssize_t)b.n, "write");
    close(fd);
    tl_gguf *g = NULL;
    tl_error err = {0};
    CHECK(tl_gguf_open(path, &g, &err) == 0 && g, "open: %s", err.msg);
    if (g) {
        check_sample(g, &L, g->base, 3, 64);
        CHECK(g->file_size == b.n, "file_size");
    }
    tl_gguf_close(g);

    /* a corrupt file's message names the tensor */
    set_u32(&b, L.t_type[0], 99);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b.p, 1, b.n, f) == b.n, "rewrite");
    if (f) fclose(f);
    g = NULL;
    int rc = tl_gguf_open(path, &g, &err);
    CHECK(rc == TL_ERR_FORMAT && !g && strstr(err.msg, "t.f32"), "%s", err.msg);
    unlink(path);

    rc = tl_gguf_open(path, &g, &err);
    CHECK(rc == TL_ERR_IO && !g && err.msg[0], "missing file: %s", err.msg);
    rc = tl_gguf_open("/tmp", &g, &err);
    CHECK(rc == TL_ERR_IO && !g && err.msg[0], "directory: %s", err.msg);
    free(b.p);
}

/* Arrays nested `depth` levels (a top-level array is level 1). */
static void make_nested(buf *b, int depth) {
    b->n = 0;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, 0);
    put_u64(b, 1);
    arr(b, "bomb", depth > 1 ? GGUF_TYPE_ARRAY : GGUF_TYPE_UINT8, 1);
    for (int l = 2; l <= depth; l++) {
        put_u32(b, l < depth ? GGUF_TYPE_ARRAY : GGUF_TYPE_UINT8);
        put_u64(b, 1);
    }
    put_u8(b, 42);
}

/* ---- corrupt files -------------------------------------------------------------- */

/* Opens b and expects a clean failure; `want` is a substring of the message
 * (or NULL). Returns the status. */
static int expect_fail(const buf *b, const char *what, const char *want) {
    tl_gguf *g = (tl_gguf *)1;
    tl_error err = {0};
    int rc = tl_gguf_open_buffer(b->p, b->n, &g, &err);
    CHECK(rc < 0 && g == NULL && err.msg[0] && err.status == rc, "%s: rc %d msg '%s'", what, rc, err.msg);
    if (want) CHECK(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    if (rc == 0) tl_gguf_close(g);
    return rc;
}

static void test_truncations(void) {
    buf b = {0};
    layout L;
    make_sample(&b, &L, 3, 0);
    size_t full = b.n;
    int failed_ok = 0;
    for (size_t n = 0; n < full; n++) {
        tl_gguf *g = (tl_gguf *)1;
        tl_error err = {0};
        /* a fresh copy of exactly n bytes, so ASan sees any read past it */
        uint8_t *p = malloc(n ? n : 1);
        if (!p) break;
        memcpy(p, b.p, n);
        int rc = tl_gguf_open_buffer(p, n, &g, &err);
        if (rc < 0 && g == NULL && err.msg[0]) failed_ok++;
        else fprintf(stderr, "truncated at %zu: rc %d msg '%s'\n", n, rc, err.msg);
        if (rc == 0) tl_gguf_close(g);
        free(p);
    }
    CHECK(failed_ok == (int)full, "%d of %zu truncations failed cleanly", failed_ok, full);
    free(b.p);
}

typedef struct patch {
    const char *what;
    int size; /* 4 or 8 */
    size_t layout_off;  /* offsetof(layout, field) */
    size_t extra;       /* added to the field's position */
    uint64_t value;
    const char *want;   /* substring of the message */
} patch;

#define AT(field) offsetof(layout, field)

static void test_patches(void) {
    const uint64_t huge = 1ull << 60, umax = UINT64_MAX;
    const patch patches[] = {
        {"version 1", 4, SIZE_MAX, 4, 1, "version 1"},
        {"version 99", 4, SIZE_MAX, 4, 99, "version 99"},
        {"version 0", 4, SIZE_MAX, 4, 0, "version"},
        {"big-endian version", 4, SIZE_MAX, 4, 0x03000000, "version"},
        {"n_tensors 2^60", 8, AT(n_tensors), 0, huge, "tensor"},
        {"n_tensors max", 8, AT(n_tensors), 0, umax, "tensor"},
        {"n_tensors 4", 8, AT(n_tensors), 0, 4, NULL},
        {"n_kv 2^60", 8, AT(n_kv), 0, huge, "metadata"},
        {"n_kv max", 8, AT(n_kv), 0, umax, "metadata"},
        {"n_kv + 1", 8, AT(n_kv), 0, N_SAMPLE_KV, NULL},
        {"key length 2^63", 8, AT(key0_len), 0, 1ull << 63, "length"},
        {"key length max", 8, AT(key0_len), 0, umax, "length"},
        {"key length 0", 8, AT(key0_len), 0, 0, "empty key"},
        {"string length huge", 8, AT(str_len), 0, huge, "k.str"},
        {"string length max", 8, AT(str_len), 0, umax, "k.str"},
        {"value type 13", 4, AT(type_u8), 0, 13, "k.u8"},
        {"value type max", 4, AT(type_u8), 0, UINT32_MAX, "invalid"},
        {"array element type 13", 4, AT(arr_u8_type), 0, 13, "a.u8"},
        {"array count 2^60", 8, AT(arr_u8_n), 0, huge, "a.u8"},
        {"array count max", 8, AT(arr_u8_n), 0, umax, "a.u8"},
        {"string array count 2^60", 8, AT(arr_str_n), 0, huge, "a.str"},
        {"string array count max", 8, AT(arr_str_n), 0, umax, "a.str"},
        {"string in array length max", 8, AT(arr_str_len1), 0, umax, "a.str"},
        {"nested array count max", 8, AT(nested_n), 0, umax, "a.nested"},
        {"nested inner type 13", 4, AT(nested_inner_type), 0, 13, "a.nested"},
        {"nested inner count max", 8, AT(nested_inner_type), 4, umax, "a.nested"},
        {"tensor name length max", 8, AT(t_name), 0 - 8, umax, "tensor 0"},
        {"n_dims 0", 4, AT(t_ndims), 0, 0, "dimensions"},
        {"n_dims 5", 4, AT(t_ndims), 0, 5, "dimensions"},
        {"n_dims max", 4, AT(t_ndims), 0, UINT32_MAX, "dimensions"},
        {"negative ne", 8, AT(t_ne0), 0, (uint64_t)-1, "negative"},
        {"elements overflow", 8, AT(t_ne0), 0, 1ull << 62, "INT64_MAX"},
        {"unknown type 99", 4, AT(t_type), 0, 99, "unknown tensor type"},
        {"unknown type 4 (removed Q4_2)", 4, AT(t_type), 0, 4, "unknown tensor type"},
        {"unknown type max", 4, AT(t_type), 0, UINT32_MAX, "unknown tensor type"},
        {"offset past the end", 8, AT(t_off), 0, 1ull << 40, "past the end"},
        {"offset max", 8, AT(t_off), 0, umax & ~(uint64_t)63, "past the end"},
        {"misaligned offset", 8, AT(t_off), 0, 1, "alignment"},
    };
    for (size_t i = 0; i < sizeof patches / sizeof *patches; i++) {
        const patch *p = &patches[i];
        buf b = {0};
        layout L;
        make_sample(&b, &L, 3, 0);
        size_t at = p->layout_off == SIZE_MAX ? 0 : *(const size_t *)((const char *)&L + p->layout_off);
        at += p->extra;
        if (p->size == 4) set_u32(&b, at, (uint32_t)p->value);
        else set_u64(&b, at, p->value);
        expect_fail(&b, p->what, p->want);
        free(b.p);
    }
}

static void test_corrupt_misc(void) {
    buf b = {0};
    layout L;
    make_sample(&b, &L, 3, 0);
    b.p[0] = 'X';
    expect_fail(&b, "bad magic", "not a GGUF file");
    b.p[0] = 'G';

    /* the last tensor (1-D Q4_K) as F32 with 2^62 elements: 2^64 bytes */
    set_u32(&b, L.t_type[2], TL_F32);
    set_u64(&b, L.t_ne0[2], 1ull << 62);
    expect_fail(&b, "byte size overflow", "overflows");
    free(b.p), b = (buf){0};

    make_sample(&b, &L, 3, 0);
    set_u64(&b, L.t_ne0[1], 33); /* Q8_0 rows need multiples of 32 */
    expect_fail(&b, "ne0 not a block multiple", "multiple");
    free(b.p), b = (buf){0};

    make_sample(&b, &L, 3, 0);
    memcpy(b.p + L.t_name[1], "t.f32", 5);
    expect_fail(&b, "duplicate tensor names", "duplicate tensor name");
    free(b.p), b = (buf){0};

    make_sample(&b, &L, 3, 0);
    memcpy(b.p + L.i8_key_name, "k.u8", 4);
    expect_fail(&b, "duplicate keys", "duplicate key");
    free(b.p), b = (buf){0};

    /* tensor 1 placed over tensor 0 (aligned, in the file) */
    make_sample(&b, &L, 3, 0);
    set_u64(&b, L.t_off[1], 0);
    expect_fail(&b, "overlapping tensors", "t.q80");
    free(b.p), b = (buf){0};

    static const uint32_t bad_aligns[2] = {3, 48};
    for (int i = 0; i < 2; i++) {
        make_sample(&b, &L, 3, bad_aligns[i]);
        expect_fail(&b, "bad alignment", NULL);
        free(b.p), b = (buf){0};
    }
    /* alignment 0: build with 32, then patch the value (the last key) */
    make_sample(&b, &L, 3, 32);
    set_u32(&b, L.t_name[0] - 8 - 4, 0);
    expect_fail(&b, "alignment 0", "power of two");
    set_u32(&b, L.t_name[0] - 8 - 4, 0x80000000u); /* valid, but the data would start past the end */
    expect_fail(&b, "alignment 2^31", "past the end");
    set_u32(&b, L.t_name[0] - 8 - 8, GGUF_TYPE_INT32);
    set_u32(&b, L.t_name[0] - 8 - 4, 32);
    expect_fail(&b, "alignment of type i32", "general.alignment");
    free(b.p), b = (buf){0};

    make_nested(&b, 8);
    tl_gguf *g = NULL;
    tl_error err = {0};
    CHECK(tl_gguf_open_buffer(b.p, b.n, &g, &err) == 0, "depth 8 is fine: %s", err.msg);
    CHECK(g && g->n_kv == 1 && g->kv[0].arr_type == GGUF_TYPE_ARRAY, "depth 8 kv");
    tl_gguf_close(g);
    make_nested(&b, 9);
    expect_fail(&b, "depth 9", "nested");
    make_nested(&b, 100000);
    expect_fail(&b, "depth bomb", "nested");
    free(b.p), b = (buf){0};

    CHECK(tl_gguf_open_buffer("", 0, &g, &err) < 0 && !g && err.msg[0], "empty buffer");
    CHECK(tl_gguf_open_buffer("GGUF\3\0\0", 7, &g, &err) < 0 && !g && strstr(err.msg, "header"),
          "short header: %s", err.msg);
    tl_gguf_close(NULL);
}

/* ---- real files ------------------------------------------------------------------ */

static void check_tensors_sane(const tl_gguf *g, const char *what) {
    int bad = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tl_gguf_tensor *t = &g->tensors[i];
        const uint8_t *p = t->data;
        if (p < g->base + g->data_offset || p + t->nbytes > g->base + g->file_size ||
            t->offset % g->alignment || !tl_type_info(t->type))
            bad++;
    }
    CHECK(bad == 0, "%s: %d tensors out of place", what, bad);
}

static void test_models(void) {
    tl_gguf *g = NULL;
    tl_error err = {0};
    int64_t iv;
    int rc = tl_gguf_open("models/SmolLM2-135M-Instruct.Q4_1.gguf", &g, &err);
    CHECK(rc == 0 && g, "SmolLM2: %s", err.msg);
    if (g) {
        CHECK(g->n_tensors == 272, "SmolLM2 tensors %llu", (unsigned long long)g->n_tensors);
        CHECK(tl_gguf_get_int(g, "llama.block_count", &iv) == 1 && iv == 30, "block_count");
        const tl_gguf_tensor *t = tl_gguf_find_tensor(g, "token_embd.weight");
        CHECK(t && t->type == TL_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152,
              "token_embd.weight");
        CHECK(t && t->nbytes == 49152ull * 18 * 34, "token_embd bytes");
        const tl_gguf_kv *kv = tl_gguf_find(g, "tokenizer.ggml.tokens");
        CHECK(kv && kv->arr_n == 49152 && kv->arr_str && tl_str_eq(kv->arr_str[1], "<|im_start|>"),
              "SmolLM2 vocab");
        check_tensors_sane(g, "SmolLM2");
        tl_gguf_close(g);
    }
    g = NULL;
    rc = tl_gguf_open("models/gemma-3-270m-q4_k_m.gguf", &g, &err);
    CHECK(rc == 0 && g, "gemma: %s", err.msg);
    if (g) {
        CHECK(g->n_tensors == 236, "gemma tensors %llu", (unsigned long long)g->n_tensors);
        tl_str s;
        CHECK(tl_gguf_get_str(g, "general.architecture", &s) == 1 && tl_str_eq(s, "gemma3"), "gemma arch");
        check_tensors_sane(g, "gemma");
        tl_gguf_close(g);
    }
}

static void test_vocab_files(void) {
    glob_t gl;
    int n = 0;
    const char *vd = getenv("TL_VOCAB_DIR");
    char pat[1024];
    snprintf(pat, sizeof pat, "%s/*.gguf", vd && *vd ? vd : "../shared/vocab");
    if (glob(pat, 0, NULL, &gl) == 0) {
        for (size_t i = 0; i < gl.gl_pathc; i++) {
            tl_gguf *g = NULL;
            tl_error err = {0};
            int rc = tl_gguf_open(gl.gl_pathv[i], &g, &err);
            CHECK(rc == 0 && g, "%s: %s", gl.gl_pathv[i], err.msg);
            if (!g) continue;
            const tl_gguf_kv *kv = tl_gguf_find(g, "tokenizer.ggml.tokens");
            CHECK(g->n_tensors == 0 && kv && kv->arr_str && kv->arr_n > 1000, "%s vocab", gl.gl_pathv[i]);
            tl_gguf_close(g);
            n++;
        }
        globfree(&gl);
    }
    CHECK(n >= 10, "%d vocab files found in ../shared/vocab", n);
}

/* Reads the whole describe output of path into a malloc'ed string. */
static char *describe(const char *path, int *rc, tl_error *err) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    *rc = tl_gguf_describe(path, f, err);
    long n = ftell(f);
    char *s = malloc((size_t)n + 1);
    rewind(f);
    if (s) s[fread(s, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return s;
}

static void test_describe(void) {
    int rc;
    tl_error err = {0};
    char *s = describe("models/SmolLM2-135M-Instruct.Q4_1.gguf", &rc, &err);
    CHECK(rc == 0 && s, "describe SmolLM2: %s", err.msg);
    if (s) {
        CHECK(strstr(s, "architecture: llama") && strstr(s, "llama.block_count = 30") &&
                  strstr(s, "llama.rope.freq_base = 100000") && strstr(s, "tensors: 272") &&
                  strstr(s, "vocab size: 49152") && strstr(s, "Q8_0") && strstr(s, "Q4_1") &&
                  strstr(s, "bos = 1 \"<|im_start|>\"") && strstr(s, "chat template: yes"),
              "describe output:\n%s", s);
        free(s);
    }
    char spm[1024];
    const char *vdir = getenv("TL_VOCAB_DIR");
    snprintf(spm, sizeof spm, "%s/ggml-vocab-llama-spm.gguf", vdir && *vdir ? vdir : "../shared/vocab");
    s = describe(spm, &rc, &err);
    CHECK(rc == 0 && s && strstr(s, "tensors: 0") && strstr(s, "vocab size: 32000") &&
              strstr(s, "tokenizer model: \"llama\""),
          "describe vocab-only: %s", s ? s : err.msg);
    free(s);
    s = describe("/nonexistent.gguf", &rc, &err);
    CHECK(rc == TL_ERR_IO && err.msg[0], "describe missing file");
    free(s);
}

int main(void) {
    test_valid();
    test_open_file();
    test_truncations();
    test_patches();
    test_corrupt_misc();
    test_models();
    test_vocab_files();
    test_describe();
    return tl_test_summary();
}
