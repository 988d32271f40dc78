/* kvfmt: what the KV cache holds per element, as a descriptor the forward
 * pass goes through instead of assuming f16: a row's bytes, how a row of
 * floats is stored, and which attention paths read the format. F16
 * (llama.cpp's default cache type) is the one there is; a quantized cache
 * adds an entry here and its widening in the attention. */
#ifndef TL_KVFMT_H
#define TL_KVFMT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/mathfn.h"
#include "quant/quant.h"

typedef struct tl_kv_format {
    const char *name;
    tl_type type;
    /* bytes of a row of n elements (n a multiple of the format's block) */
    size_t (*row_bytes)(int64_t n);
    /* x[0..n) rounded into a row with the level's conversions; the cache's only write */
    void (*store)(const tl_mathfn *m, const float *x, void *row, int64_t n);
    /* The same into slot `slot` of a block of bs rows kept transposed
     * (element i at i*bs + slot): the fast attention's K layout, where one
     * vector load gives a dimension of all the block's keys. */
    void (*store_tr)(const tl_mathfn *m, const float *x, void *block, int slot, int bs, int64_t n);
    /* The exact attention's q.k and p.V (llama.cpp's f16 dots) read it. */
    int exact_attn;
    /* The fast attention widens it (tl_attn_online reads f16 rows). */
    int fast_attn;
} tl_kv_format;

/* The descriptor of a cache type, or NULL when the cache cannot hold it. */
const tl_kv_format *tl_kv_format_of(tl_type type);

#endif
