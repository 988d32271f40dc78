/* cpu/mathfn: the element-wise functions of the forward pass (SwiGLU, softmax,
 * the attention-weighted sum of V) computed in exactly the float operation
 * order of llama.cpp's x86 AVX2 CPU backend, so that our activations round the
 * same way its do. Each has an AVX2+FMA path and a scalar path (fmaf) that
 * give bitwise the same results. */
#ifndef TL_CPU_MATHFN_H
#define TL_CPU_MATHFN_H

#include <stdint.h>

/* exp(x) by the polynomial ggml uses on x86 (ARM optimized-routines' expf:
 * max error ~1.5 ulp), bitwise equal to its 8-lane AVX2 version. */
float tl_expf_fast(float x);

/* y[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)). */
void tl_swiglu(int n, float *y, const float *g, const float *u, int avx2);

/* s[j] = exp(s[j] - max) for j < n; returns their sum, added per group of 8
 * (pairwise within the group, the group sums in double) as ggml does. */
double tl_softmax_exp(int n, float *s, float max, int avx2);

/* s[j] = f16_round(s[j] * scale) for j < n. */
void tl_scale_round_f16(int n, float *s, float scale, int avx2);

/* out[d] = sum_j p[j] * v_j[d] over j < n, v_j = f16 row j (stride
 * v_stride elements) of width hd: 8 partial sums by j mod 8, each a chain of
 * fused multiply-adds in j order, then added pairwise (tinyBLAS's order).
 * acc is scratch of 8 * hd floats. */
void tl_attn_pv(int n, int hd, const float *p, const uint16_t *v, int64_t v_stride, float *acc,
                float *out, int avx2);

/* tl_attn_pv over a paged cache: p[j] weighs position j0 + j, whose row is
 * row (blk[(j0+j)/bs]*bs + (j0+j)%bs) of v (blk NULL: row j0 + j). The
 * partial sums still go by j mod 8. */
void tl_attn_pv_paged(int n, int hd, const float *p, const uint16_t *v, int64_t v_stride,
                      const int32_t *blk, int bs, int j0, float *acc, float *out, int avx2);

/* ggml's GELU table: for every f16 bit pattern h, f16(gelu_tanh(h)). */
void tl_gelu_table(uint16_t *table);

/* y[i] = gelu(g[i]) * u[i] as ggml's GeGLU with its table: 0 for g <= -10,
 * g*u for g >= 10, else table[f16(g)] * u. */
void tl_geglu(int n, float *y, const float *g, const float *u, const uint16_t *table, int avx2);

#endif
