/* kvfmt: the KV cache's element formats (see kvfmt.h). */
#include "forward/kvfmt.h"

#include "base/util.h"

static size_t f16_row_bytes(int64_t n) { return (size_t)n * sizeof(uint16_t); }

static void f16_store(const tl_mathfn *m, const float *x, void *row, int64_t n) { m->f16_row(x, row, n); }

static void f16_store_tr(const tl_mathfn *m, const float *x, void *block, int slot, int bs, int64_t n) {
    uint16_t tmp[64], *h = block;
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const int64_t k = n - i0 < 64 ? n - i0 : 64;
        m->f16_row(x + i0, tmp, k);
        for (int64_t i = 0; i < k; i++) h[(i0 + i) * bs + slot] = tmp[i];
    }
}

static const tl_kv_format kv_f16 = {"f16", TL_F16, f16_row_bytes, f16_store, f16_store_tr, 1, 1};

const tl_kv_format *tl_kv_format_of(tl_type type) { return type == TL_F16 ? &kv_f16 : NULL; }
