/* forward/pool: mean pooling as llama.cpp computes it.
 *
 * llama.cpp's mean (build_pooling) is a matmul of the transposed hidden
 * states by a column of 1/n. On its x86 AVX2 CPU build that matmul has one
 * column for one sequence, which llamafile's tinyBLAS declines (n < 2), so
 * each output element is ggml_vec_dot_f32 over the n tokens: four 8-lane fma
 * chains over steps of 32 tokens, folded as ggml's reduce does, then the rest
 * as GCC compiled vec.cpp's leftover loop: in blocks of 8, then of 4, the
 * products rounded and added one by one in order, and the last 0-3 fused
 * (vfmadd231ss).
 * That walks the tokens in order, so each element keeps its 32 lanes here and
 * a text cut into calls of any size gives the same bits. */
#include "forward/pool.h"

#include <math.h>
#include <stdlib.h>

int tl_mean_pool_init(tl_mean_pool *p, int d, size_t n) {
    p->d = d;
    p->n = n;
    p->seen = 0;
    p->inv = 1.0f / (float)n;
    p->acc = calloc((size_t)d * 32, sizeof *p->acc);
    p->tail = calloc((size_t)d, sizeof *p->tail);
    if (!p->acc || !p->tail) {
        tl_mean_pool_free(p);
        return -1;
    }
    return 0;
}

void tl_mean_pool_free(tl_mean_pool *p) {
    free(p->acc);
    free(p->tail);
    p->acc = p->tail = NULL;
}

/* ggml's GGML_F32x8_REDUCE over four chains: 0+2, 1+3, then 0+1; the two
 * 128-bit halves added; two hadds. */
static float fold32(const float *a) {
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    const float h0 = v[0] + v[4], h1 = v[1] + v[5], h2 = v[2] + v[6], h3 = v[3] + v[7];
    return (h0 + h1) + (h2 + h3);
}

void tl_mean_pool_add(tl_mean_pool *p, const float *rows, int nr) {
    const int d = p->d;
    const float inv = p->inv;
    const size_t np = p->n & ~(size_t)31, rem = p->n - np;
    /* the leftovers: products rounded and added below `fused`, fused above */
    const size_t fused = np + (rem & ~(size_t)7) + ((rem & 7) >= 4 ? 4 : 0);
    for (int t = 0; t < nr; t++, p->seen++) {
        const float *h = rows + (size_t)t * d;
        const size_t i = p->seen;
        if (i < np) {
            float *acc = p->acc + i % 32;
            for (int e = 0; e < d; e++) acc[(size_t)e * 32] = fmaf(h[e], inv, acc[(size_t)e * 32]);
            continue;
        }
        if (i == np && np > 0)
            for (int e = 0; e < d; e++) p->tail[e] = fold32(p->acc + (size_t)e * 32);
        if (i < fused)
            for (int e = 0; e < d; e++) p->tail[e] += h[e] * inv;
        else
            for (int e = 0; e < d; e++) p->tail[e] = fmaf(h[e], inv, p->tail[e]);
    }
}

void tl_mean_pool_finish(tl_mean_pool *p, float *out) {
    const int d = p->d;
    const size_t np = p->n & ~(size_t)31;
    for (int e = 0; e < d; e++) out[e] = np == p->n ? fold32(p->acc + (size_t)e * 32) : p->tail[e];
}
