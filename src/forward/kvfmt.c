/* kvfmt: the KV cache's element formats (see kvfmt.h). */
#include "forward/kvfmt.h"

#include <string.h>

#include "base/util.h"

static size_t f16_row_bytes(int64_t n) { return (size_t)n * sizeof(uint16_t); }
static size_t q8_0_row_bytes(int64_t n) { return (size_t)n / 32 * sizeof(block_q8_0); }
static size_t q4_0_row_bytes(int64_t n) { return (size_t)n / 32 * sizeof(block_q4_0); }

static void f16_store(const tl_mathfn *m, const float *x, void *row, int64_t n) { m->f16_row(x, row, n); }

static void f16_store_tr(const tl_mathfn *m, const float *x, void *block, int slot, int bs, int64_t n) {
    uint16_t tmp[64], *h = block;
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const int64_t k = n - i0 < 64 ? n - i0 : 64;
        m->f16_row(x + i0, tmp, k);
        for (int64_t i = 0; i < k; i++) h[(i0 + i) * bs + slot] = tmp[i];
    }
}

/* llama.cpp writes the cache with its CPU backend's from_float: for Q8_0
 * the activation quantizer (x*127/amax, half to even), for Q4_0 the
 * reference one. */
static void q8_0_store(const tl_mathfn *m, const float *x, void *row, int64_t n) {
    (void)m;
    tl_quantize_row_act(TL_Q8_0, x, row, n);
}

static void q4_0_store(const tl_mathfn *m, const float *x, void *row, int64_t n) {
    (void)m;
    tl_quantize_row(TL_Q4_0, x, row, n);
}

/* Block by block into the transposed layout: group g at g*bs*(block bytes),
 * the bs slots' d, then the quants in 4-byte runs per slot (see
 * tl_attn_rows.k_tr): the integer scores' vector loads; a Q4_0 byte holds
 * two elements, so its 16 bytes go as Q8_0's 32 do. */
static void quant_store_tr(tl_type t, const float *x, void *block, int slot, int bs, int64_t n) {
    const size_t bb = t == TL_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    uint8_t *b = block, q[sizeof(block_q8_0)];
    for (int64_t g = 0; g < n / 32; g++) {
        if (t == TL_Q8_0) tl_quantize_row_act(TL_Q8_0, x + g * 32, q, 32);
        else tl_quantize_row(TL_Q4_0, x + g * 32, q, 32);
        uint8_t *gp = b + (size_t)g * bs * bb;
        memcpy(gp + 2 * (size_t)slot, q, 2); /* d */
        for (int i = 0; i < (int)bb - 2; i++) gp[2 * (size_t)bs + tl_attn_kq_at(bs, slot, i)] = q[2 + i];
    }
}

static void q8_0_store_tr(const tl_mathfn *m, const float *x, void *block, int slot, int bs, int64_t n) {
    (void)m;
    quant_store_tr(TL_Q8_0, x, block, slot, bs, n);
}

static void q4_0_store_tr(const tl_mathfn *m, const float *x, void *block, int slot, int bs, int64_t n) {
    (void)m;
    quant_store_tr(TL_Q4_0, x, block, slot, bs, n);
}

static const tl_kv_format kv_f16 = {"f16", TL_F16, TL_ATTN_F16, 1, f16_row_bytes, f16_store, f16_store_tr};
static const tl_kv_format kv_q8_0 = {"q8_0", TL_Q8_0, TL_ATTN_Q8_0, 32, q8_0_row_bytes, q8_0_store, q8_0_store_tr};
static const tl_kv_format kv_q4_0 = {"q4_0", TL_Q4_0, TL_ATTN_Q4_0, 32, q4_0_row_bytes, q4_0_store, q4_0_store_tr};

const tl_kv_format *tl_kv_format_of(tl_type type) {
    switch (type) {
    case TL_F16: return &kv_f16;
    case TL_Q8_0: return &kv_q8_0;
    case TL_Q4_0: return &kv_q4_0;
    default: return NULL;
    }
}
