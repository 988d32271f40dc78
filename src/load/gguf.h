/* gguf: the mapped GGUF file (versions 2 and 3). Owns the mapping, the parsed
 * header, the metadata table and the tensor table. Every count, offset and size
 * is validated against the file with overflow-checked arithmetic at open time,
 * so everything returned afterwards is safe to read. Knows nothing of models. */
#ifndef TL_GGUF_H
#define TL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "tokenloop.h"

typedef enum tl_gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} tl_gguf_type;

/* Bytes per element of a fixed-size metadata type; 0 for string, array and unknown. */
uint64_t tl_gguf_scalar_size(uint32_t t);

/* A string inside the mapping: not NUL-terminated. */
typedef struct tl_str {
    const char *ptr;
    uint64_t len;
} tl_str;

typedef struct tl_gguf_kv {
    tl_str key;
    tl_gguf_type type;
    const uint8_t *data;   /* the value's bytes in the file (little-endian, unaligned);
                            * a string: its u64 length, then the bytes; an array:
                            * its first element */
    /* arrays only: */
    tl_gguf_type arr_type;
    uint64_t arr_n;
    const tl_str *arr_str; /* arr_n strings when arr_type is STRING (else NULL) */
} tl_gguf_kv;

typedef struct tl_gguf_tensor {
    tl_str name;
    uint32_t n_dims;  /* 1..4 */
    int64_t ne[4];    /* elements per dimension, ne[0] innermost; unused = 1 */
    uint32_t type;    /* tl_type id (validated: known, with a block size dividing ne[0]) */
    uint64_t offset;  /* from the start of the data section */
    uint64_t nbytes;
    const void *data; /* inside the mapping, within the file */
} tl_gguf_tensor;

typedef struct tl_gguf {
    const uint8_t *base; /* the mapping */
    uint64_t file_size;
    uint32_t version;
    uint64_t n_kv;
    tl_gguf_kv *kv;
    uint64_t n_tensors;
    tl_gguf_tensor *tensors;
    uint64_t alignment; /* general.alignment or 32 */
    uint64_t data_offset;
    int mapped;         /* 1: base is a read-only private mapping of the file (pages may be dropped) */
} tl_gguf;

/* Maps and validates path. On failure returns a status, fills err with what is
 * wrong and where (e.g. "tensor 3 'blk.0.attn_q.weight': data ends at byte
 * 1234 past the end of the file (1000 bytes)"), and leaves *out NULL. */
int tl_gguf_open(const char *path, tl_gguf **out, tl_error *err);
/* Same on a caller-owned buffer (tests, fuzzing); buf must outlive the result. */
int tl_gguf_open_buffer(const void *buf, size_t size, tl_gguf **out, tl_error *err);
void tl_gguf_close(tl_gguf *g);

const tl_gguf_kv *tl_gguf_find(const tl_gguf *g, const char *key);
const tl_gguf_tensor *tl_gguf_find_tensor(const tl_gguf *g, const char *name);

/* Typed getters. Return 1 if the key exists with a compatible type (any
 * integer type whose value fits, for get_int; float32/64 for get_float; bool;
 * string), 0 if absent, -1 if present with an incompatible type. */
int tl_gguf_get_int(const tl_gguf *g, const char *key, int64_t *out);
int tl_gguf_get_float(const tl_gguf *g, const char *key, double *out);
int tl_gguf_get_bool(const tl_gguf *g, const char *key, int *out);
int tl_gguf_get_str(const tl_gguf *g, const char *key, tl_str *out);
/* Array element i (< arr_n) of a scalar-typed array, converted. */
int64_t tl_gguf_arr_int(const tl_gguf_kv *kv, uint64_t i);
double tl_gguf_arr_float(const tl_gguf_kv *kv, uint64_t i);

const char *tl_gguf_type_name(tl_gguf_type t);
/* 1 if the tl_str equals the C string s. */
int tl_str_eq(tl_str a, const char *s);

#endif
