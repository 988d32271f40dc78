/* kvfmt: the KV cache's element formats (see kvfmt.h). */
#include "kvfmt.h"

#include "util.h"

static size_t f16_row_bytes(int64_t n) { return (size_t)n * sizeof(uint16_t); }

static void f16_store(const tl_mathfn *m, const float *x, void *row, int64_t n) { m->f16_row(x, row, n); }

static const tl_kv_format kv_f16 = {"f16", TL_F16, f16_row_bytes, f16_store, 1, 1};

const tl_kv_format *tl_kv_format_of(tl_type type) { return type == TL_F16 ? &kv_f16 : NULL; }
