/* kvfmt: what the KV cache holds per element, as a descriptor the forward
 * pass goes through instead of assuming f16: a row's bytes, how a row of
 * floats is stored (as rows, and transposed for the fast attention's K), and
 * how the attention reads it. F16 is llama.cpp's default cache type; Q8_0
 * and Q4_0 are its -ctk/-ctv types, stored as llama.cpp stores them (its CPU
 * backend's quantizers), so the exact attention reads ggml's blocks. */
#ifndef TL_KVFMT_H
#define TL_KVFMT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/mathfn.h"
#include "quant/quant.h"

typedef struct tl_kv_format {
    const char *name; /* as llama.cpp's --cache-type-k spells it */
    tl_type type;
    int attn_fmt;     /* TL_ATTN_F16, TL_ATTN_Q8_0, TL_ATTN_Q4_0: the fast attention's view */
    int block;        /* elements a row's length must be a multiple of (a head's too) */
    /* bytes of a row of n elements (n a multiple of block) */
    size_t (*row_bytes)(int64_t n);
    /* x[0..n) rounded into a row: ggml's conversion to the cache type */
    void (*store)(const tl_mathfn *m, const float *x, void *row, int64_t n);
    /* The same into slot `slot` of a block of bs rows kept transposed
     * (tl_attn_rows.k_tr's layout): the fast attention's K, where one vector
     * load gives an element of all the block's keys. Rounded as store. */
    void (*store_tr)(const tl_mathfn *m, const float *x, void *block, int slot, int bs, int64_t n);
} tl_kv_format;

/* The descriptor of a cache type (TL_F16, TL_Q8_0, TL_Q4_0), or NULL. */
const tl_kv_format *tl_kv_format_of(tl_type type);

#endif
