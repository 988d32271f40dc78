/* cpu/mathfn: element-wise functions in llama.cpp's operation order; see
 * mathfn.h. The AVX2 paths are compiled with target attributes so this file
 * needs no special flags; the scalar paths use fmaf for every fused step. */
#include "cpu/mathfn.h"

#include <math.h>
#include <string.h>

#include "base/util.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TL_X86 1
#endif

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float tl_expf_fast(float x) {
    const float r = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, r);
    float n = z - r;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t e = f2u(z) << 23;
    float k = u2f(e + f2u(1.0f));
    float u = b * b;
    float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                   u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k);
    uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    float s1 = u2f(g + 0x7f000000u), s2 = u2f(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

/* Row of position j: through a block table of bs-row blocks, or j itself. */
static inline int64_t pv_row(const int32_t *blk, int bs, int j) {
    return blk ? (int64_t)blk[j / bs] * bs + j % bs : j;
}

#ifdef TL_X86
__attribute__((target("avx2,fma"))) static __m256 expf8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 c = _mm256_cmp_ps(absn, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(j, k, k);
    if (!_mm256_movemask_ps(c)) return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(absn, _mm256_set1_ps(192), _CMP_GT_OQ);
    const __m256 big = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    return _mm256_blendv_ps(_mm256_blendv_ps(normal, big, c), _mm256_mul_ps(s1, s1), d);
}

/* ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)): the x86 horizontal-sum tree. */
__attribute__((target("avx2,fma"))) static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void swiglu_avx2(int n, float *y, const float *g, const float *u) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__attribute__((target("avx2,fma"))) static double softmax_exp_avx2(int n, float *s, float max) {
    double sum = 0.0;
    int i = 0;
    __m256 mx = _mm256_set1_ps(max);
    for (; i + 8 <= n; i += 8) {
        __m256 v = expf8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mx));
        _mm256_storeu_ps(s + i, v);
        sum += (double)hsum8(v);
    }
    if (i < n) { /* the last partial group: missing lanes are exact zeros */
        float t[8] = {0};
        memcpy(t, s + i, (size_t)(n - i) * sizeof *t);
        __m256 v = expf8(_mm256_sub_ps(_mm256_loadu_ps(t), mx));
        v = _mm256_blendv_ps(_mm256_setzero_ps(), v,
                             _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - i),
                                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        _mm256_storeu_ps(t, v);
        memcpy(s + i, t, (size_t)(n - i) * sizeof *t);
        sum += (double)hsum8(v);
    }
    return sum;
}

__attribute__((target("avx2,fma,f16c"))) static void scale_round_avx2(int n, float *s, float scale) {
    int i = 0;
    __m256 sc = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + i), sc), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(s + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) s[i] = tl_fp16_to_fp32(tl_fp32_to_fp16(s[i] * scale));
}

__attribute__((target("avx2,fma,f16c"))) static void attn_pv_avx2(int n, int hd, const float *p,
                                                                  const uint16_t *v, int64_t vs,
                                                                  const int32_t *blk, int bs, int j0,
                                                                  float *acc, float *out) {
    memset(acc, 0, (size_t)8 * hd * sizeof *acc);
    for (int j = 0; j < n; j++) {
        float *a = acc + (size_t)(j & 7) * hd;
        const uint16_t *vj = v + pv_row(blk, bs, j0 + j) * vs;
        __m256 pj = _mm256_set1_ps(p[j]);
        int d = 0;
        for (; d + 8 <= hd; d += 8) {
            __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vj + d)));
            _mm256_storeu_ps(a + d, _mm256_fmadd_ps(vv, pj, _mm256_loadu_ps(a + d)));
        }
        for (; d < hd; d++) a[d] = fmaf(tl_fp16_to_fp32(vj[d]), p[j], a[d]);
    }
    for (int d = 0; d < hd; d++) {
        const float *a = acc + d;
        out[d] = ((a[0] + a[4 * hd]) + (a[2 * hd] + a[6 * hd])) +
                 ((a[1 * hd] + a[5 * hd]) + (a[3 * hd] + a[7 * hd]));
    }
}
#endif

/* ---- RMSNorm and f16 rows ---- */

/* ggml's order: (float)(x*x) added in one double chain. */

/* The fast order's sum of squares: ggml's float squares, added in 16 double
 * lanes (lane i % 16), then lanes i and i+8, i+4, i+2, i+1 added. Only the
 * double additions are reordered, so the float mean nearly always rounds as
 * ggml's does (Gemma 3's perplexity moved 0.35% at -c 2048 when the squares
 * were exact doubles instead). */
static double sumsq_tree(double l[16]) {
    for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) l[i] += l[i + h];
    return l[0];
}

static void rmsnorm_finish(float *out, const float *x, const float *w, int n, float eps, double sum) {
    const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void tl_rmsnorm_exact(float *out, const float *x, const float *w, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    rmsnorm_finish(out, x, w, n, eps, sum);
}

void tl_rmsnorm_fast(float *out, const float *x, const float *w, int n, float eps) {
    double l[16] = {0};
    for (int i = 0; i < n; i++) l[i & 15] += (double)(x[i] * x[i]);
    rmsnorm_finish(out, x, w, n, eps, sumsq_tree(l));
}

void tl_f16_row(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = tl_fp32_to_fp16(x[i]);
}

void tl_fwht(float *x, int n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int j = 0; j < n; j++) x[j] *= scale;
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                const float u = x[j], w = x[j + len];
                x[j] = u + w;
                x[j + len] = u - w;
            }
}

#ifdef TL_X86
/* rmsnorm_finish, eight at a time (two multiplies each, as the scalar). */
__attribute__((target("avx2"))) static void rmsnorm_finish_avx2(float *out, const float *x, const float *w, int n,
                                                               float eps, double sum) {
    const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    const __m256 s8 = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s8), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

__attribute__((target("avx2,fma"))) static void rmsnorm_fast_avx2(float *out, const float *x, const float *w,
                                                                   int n, float eps) {
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int q = 0; q < 4; q++) {
            const __m128 v = _mm_loadu_ps(x + i + 4 * q);
            a[q] = _mm256_add_pd(a[q], _mm256_cvtps_pd(_mm_mul_ps(v, v)));
        }
    double l[16];
    for (int q = 0; q < 4; q++) _mm256_storeu_pd(l + 4 * q, a[q]);
    for (; i < n; i++) l[i & 15] += (double)(x[i] * x[i]);
    rmsnorm_finish_avx2(out, x, w, n, eps, sumsq_tree(l));
}

__attribute__((target("avx2,f16c"))) static void rmsnorm_exact_avx2(float *out, const float *x, const float *w,
                                                                    int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    rmsnorm_finish_avx2(out, x, w, n, eps, sum);
}

/* tl_fwht eight lanes at a time: strides 1, 2 and 4 inside a vector (the
 * partner by a permute; each lane's sum or difference is the scalar's, u + w
 * being w + u exactly and the difference always taken as u - w), the wider
 * strides between vectors. n a multiple of 8. */
__attribute__((target("avx2"))) static void fwht_avx2(float *x, int n) {
    const __m256 sc = _mm256_set1_ps(1.0f / sqrtf((float)n));
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
        __m256 p = _mm256_permute_ps(v, 0xB1); /* lanes swapped in pairs */
        v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xAA);
        p = _mm256_permute_ps(v, 0x4E); /* pairs swapped in fours */
        v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xCC);
        p = _mm256_permute2f128_ps(v, v, 0x01); /* halves swapped */
        v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xF0);
        _mm256_storeu_ps(x + i, v);
    }
    for (int len = 8; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j += 8) {
                const __m256 u = _mm256_loadu_ps(x + j), w = _mm256_loadu_ps(x + j + len);
                _mm256_storeu_ps(x + j, _mm256_add_ps(u, w));
                _mm256_storeu_ps(x + j + len, _mm256_sub_ps(u, w));
            }
}

/* vcvtps2ph rounds to nearest even as tl_fp32_to_fp16 does (NaN payloads aside). */
__attribute__((target("avx2,f16c"))) static void f16_row_avx2(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = tl_fp32_to_fp16(x[i]);
}
#endif

/* ---- RoPE ---- */

/* Pairs i0..half-1 of one head. */
static void rope_pairs(float *x, int half, int i0, const float *cs, int neox) {
    for (int i = i0; i < half; i++) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b], co = cs[2 * i], si = cs[2 * i + 1];
        /* libggml-cpu's build fuses these (gcc -ffp-contract=fast, read off
         * its disassembly): x0's products exact inside the FMAs, x1's
         * rounded, in both pairings. Its vectorized adjacent-pair loop
         * leaves a lone last pair (odd pair count) unfused. */
        if (!neox && (half & 1) && i == half - 1) {
            x[a] = x0 * co - x1 * si;
            x[b] = x0 * si + x1 * co;
        } else {
            x[a] = fmaf(x0, co, -(x1 * si));
            x[b] = fmaf(x0, si, x1 * co);
        }
    }
}

void tl_rope(float *v, int n_heads, int head_dim, int n_rot, const float *cs, int neox) {
    for (int h = 0; h < n_heads; h++) rope_pairs(v + (size_t)h * head_dim, n_rot / 2, 0, cs, neox);
}

#ifdef TL_X86
/* tl_rope eight pairs at a time, the same fused steps; the remaining pairs
 * (and the adjacent layout's lone odd one) as tl_rope does them. */
__attribute__((target("avx2,fma"))) static void rope_avx2(float *v, int n_heads, int head_dim, int n_rot,
                                                           const float *cs, int neox) {
    const int half = n_rot / 2;
    const __m256 even_neg = _mm256_castsi256_ps(_mm256_set_epi32(0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN));
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        int i = 0;
        if (neox) {
            for (; i + 8 <= half; i += 8) {
                const __m256 c0 = _mm256_loadu_ps(cs + 2 * i), c1 = _mm256_loadu_ps(cs + 2 * i + 8);
                const __m256 co = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(c0, c1, 0x88)), 0xD8));
                const __m256 si = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(c0, c1, 0xDD)), 0xD8));
                const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + half);
                _mm256_storeu_ps(x + i, _mm256_fmadd_ps(x0, co, _mm256_xor_ps(_mm256_mul_ps(x1, si), _mm256_set1_ps(-0.0f))));
                _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(x0, si, _mm256_mul_ps(x1, co)));
            }
        } else {
            /* lanes (x0, x1) of four pairs against (co, si): even lanes
             * fma(x0, co, -(x1*si)), odd lanes fma(x0, si, x1*co) */
            const int fused = (half & 1) ? half - 1 : half;
            for (; i + 4 <= fused; i += 4) {
                const __m256 xv = _mm256_loadu_ps(x + 2 * i), c = _mm256_loadu_ps(cs + 2 * i);
                const __m256 x0 = _mm256_moveldup_ps(xv), x1 = _mm256_movehdup_ps(xv);
                const __m256 sw = _mm256_permute_ps(c, 0xB1); /* (si, co) */
                _mm256_storeu_ps(x + 2 * i, _mm256_fmadd_ps(x0, c, _mm256_xor_ps(_mm256_mul_ps(x1, sw), even_neg)));
            }
        }
        rope_pairs(x, half, i, cs, neox);
    }
}
#endif

void tl_swiglu(int n, float *y, const float *g, const float *u, int avx2) {
#ifdef TL_X86
    if (avx2) {
        swiglu_avx2(n, y, g, u);
        return;
    }
#endif
    int i = 0, nv = n & ~7; /* ggml's vector loop covers whole groups of 8 */
    for (; i < nv; i++) y[i] = g[i] / (1.0f + tl_expf_fast(0.0f - g[i])) * u[i];
    for (; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

double tl_softmax_exp(int n, float *s, float max, int avx2) {
#ifdef TL_X86
    if (avx2) return softmax_exp_avx2(n, s, max);
#endif
    double sum = 0.0;
    for (int i = 0; i < n; i += 8) {
        float e[8] = {0};
        for (int l = 0; l < 8 && i + l < n; l++) s[i + l] = e[l] = tl_expf_fast(s[i + l] - max);
        sum += (double)(((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7])));
    }
    return sum;
}

void tl_scale_round_f16(int n, float *s, float scale, int avx2) {
#ifdef TL_X86
    if (avx2) {
        scale_round_avx2(n, s, scale);
        return;
    }
#endif
    for (int i = 0; i < n; i++) s[i] = tl_fp16_to_fp32(tl_fp32_to_fp16(s[i] * scale));
}

void tl_attn_pv(int n, int hd, const float *p, const uint16_t *v, int64_t vs, float *acc,
                float *out, int avx2) {
    tl_attn_pv_paged(n, hd, p, v, vs, NULL, 0, 0, acc, out, avx2);
}

void tl_attn_pv_paged(int n, int hd, const float *p, const uint16_t *v, int64_t vs,
                      const int32_t *blk, int bs, int j0, float *acc, float *out, int avx2) {
#ifdef TL_X86
    if (avx2) {
        attn_pv_avx2(n, hd, p, v, vs, blk, bs, j0, acc, out);
        return;
    }
#endif
    memset(acc, 0, (size_t)8 * hd * sizeof *acc);
    for (int j = 0; j < n; j++) {
        float *a = acc + (size_t)(j & 7) * hd;
        const uint16_t *vj = v + pv_row(blk, bs, j0 + j) * vs;
        for (int d = 0; d < hd; d++) a[d] = fmaf(tl_fp16_to_fp32(vj[d]), p[j], a[d]);
    }
    for (int d = 0; d < hd; d++) {
        const float *a = acc + d;
        out[d] = ((a[0] + a[4 * hd]) + (a[2 * hd] + a[6 * hd])) +
                 ((a[1 * hd] + a[5 * hd]) + (a[3 * hd] + a[7 * hd]));
    }
}

/* 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in ggml's operation order.
 * Its build contracts 1 + (a*x)*x into one FMA: without it one table entry
 * (f16 0xbfff) differs, checked against libggml-cpu's own table. */
static float gelu_f32(float x) {
    const float a = 0.044715f, s2pi = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(s2pi * x * fmaf(a * x, x, 1.0f)));
}

void tl_gelu_table(uint16_t *table) {
    for (uint32_t i = 0; i < 65536; i++)
        table[i] = tl_fp32_to_fp16(gelu_f32(tl_fp16_to_fp32((uint16_t)i)));
}

#ifdef TL_X86
/* Eight at a time: F16C rounds to the table index as tl_fp32_to_fp16 does
 * (the inputs that reach the table are finite and below 10 in magnitude). */
__attribute__((target("avx2,fma,f16c"))) static int geglu_avx2(int n, float *y, const float *g,
                                                                const float *u, const uint16_t *table) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
        uint16_t h[8], t[8];
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        for (int l = 0; l < 8; l++) t[l] = table[h[l]];
        __m256 r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t)), uv);
        r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
        r = _mm256_blendv_ps(r, _mm256_mul_ps(x, uv), _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
        _mm256_storeu_ps(y + i, r);
    }
    return i;
}
#endif

void tl_geglu(int n, float *y, const float *g, const float *u, const uint16_t *table, int avx2) {
    int i = 0;
#ifdef TL_X86
    if (avx2) i = geglu_avx2(n, y, g, u, table);
#endif
    for (; i < n; i++) {
        float x = g[i];
        if (x <= -10.0f) y[i] = 0.0f;
        else if (x >= 10.0f) y[i] = x * u[i];
        else y[i] = tl_fp16_to_fp32(table[tl_fp32_to_fp16(x)]) * u[i];
    }
}

/* ---- the fast numerics' attention (see mathfn.h) ----
 * A block's keys are widened to f32 transposed, kt[d*16 + slot] (slot = the
 * position's offset in its 16-position block), so that a vector lane holds
 * one key and a score is one fma chain over the dimensions with no
 * horizontal sums. V is widened as rows, vf[slot*hd + d]. */

#define SLOTS 16

static float score_int_ref(const tl_attn_rows *a, const float *rec, const uint8_t *kt, int s);

/* A row's step over the block's slots st..en (live keys), as every level does it. */
static void row_block_ref(const tl_attn_rows *a, const float *q, float *o, float *m, float *l, int st, int en,
                          const float *kt, const float *vf) {
    const int hd = a->hd;
    float s[SLOTS];
    float mb = -INFINITY;
    for (int j = st; j <= en; j++) {
        float acc = 0.0f;
        if (tl_attn_kint(a)) acc = score_int_ref(a, q, (const uint8_t *)kt, j);
        else
            for (int d = 0; d < hd; d++) acc = fmaf(q[d], kt[d * SLOTS + j], acc);
        s[j] = acc * a->scale;
        if (s[j] > mb) mb = s[j];
    }
    const float mn = mb > *m ? mb : *m;
    const float alpha = *m == -INFINITY ? 0.0f : tl_expf_fast(*m - mn);
    *m = mn;
    /* the block's weights summed as two 8-lane vectors (slots j and j+8, zero
     * where not live) added lane by lane, then the x86 horizontal-sum tree */
    float v[8];
    for (int i = 0; i < 8; i++) {
        const int j0 = i, j1 = i + 8;
        const float p0 = j0 >= st && j0 <= en ? tl_expf_fast(s[j0] - mn) : 0.0f;
        const float p1 = j1 >= st && j1 <= en ? tl_expf_fast(s[j1] - mn) : 0.0f;
        s[j0] = p0;
        s[j1] = p1;
        v[i] = p0 + p1;
    }
    *l = *l * alpha + (((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])));
    if (a->v_fmt != TL_ATTN_F16) { /* the quants, weighed per group (mathfn.h) */
        const float *vd = tl_attn_vd(a, vf);
        for (int d = 0; d < hd; d++) {
            float acc = tl_attn_vo(o[d], alpha);
            for (int j = st; j <= en; j++)
                acc = fmaf(tl_attn_vw(s[j] * vd[d / 32 * SLOTS + j]), vf[(size_t)j * hd + d], acc);
            o[d] = acc;
        }
        return;
    }
    for (int d = 0; d < hd; d++) {
        float acc = o[d] * alpha;
        for (int j = st; j <= en; j++) acc = fmaf(s[j], vf[(size_t)j * hd + d], acc);
        o[d] = acc;
    }
}

/* Position p's row offset (bytes) from a K or V head base of row stride rs. */
static size_t kv_row_at(const tl_attn_rows *a, int p, size_t rs) {
    return ((size_t)a->blk[p / a->bs] * a->bs + (size_t)(p % a->bs)) * rs;
}

static uint16_t ld_u16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* Element d of a row in format fmt: f16 widened, or a quant as it is (its
 * block's d apart: row_d). */
static float row_elem(const uint8_t *row, int fmt, int d) {
    if (fmt == TL_ATTN_F16) return tl_fp16_to_fp32(ld_u16(row + 2 * (size_t)d));
    const uint8_t *b = row + (size_t)(d / 32) * (fmt == TL_ATTN_Q8_0 ? 34 : 18);
    if (fmt == TL_ATTN_Q8_0) return (float)(int8_t)b[2 + d % 32];
    const uint8_t q = b[2 + d % 16];
    return (float)((d % 32 < 16 ? q & 15 : q >> 4) - 8);
}

/* Group g's d of a quantized row. */
static float row_d(const uint8_t *row, int fmt, int g) {
    return tl_fp16_to_fp32(ld_u16(row + (size_t)g * (fmt == TL_ATTN_Q8_0 ? 34 : 18)));
}

void tl_attn_kint_block(const tl_attn_rows *a, int b0, int ws, int we, uint8_t *kt) {
    const int ng = a->hd / 32;
    const size_t bb = a->k_fmt == TL_ATTN_Q8_0 ? 34 : 18, nq = bb - 2, n = tl_attn_kint_bytes(a->k_fmt, a->hd);
    if (a->k_tr && a->bs == SLOTS) { /* the cache's own layout */
        memcpy(kt, (const uint8_t *)a->k + (size_t)a->blk[b0 / SLOTS] * SLOTS * a->k_stride, n);
        return;
    }
    memset(kt, 0, n);
    for (int p = ws; p <= we; p++) {
        const int s = p - b0, sb = p % a->bs;
        for (int g = 0; g < ng; g++) {
            const uint8_t *d, *qs; /* the slot's d, and its quant byte i at qs[i * step] */
            size_t step;
            if (a->k_tr) {
                const uint8_t *gp = (const uint8_t *)a->k + (size_t)a->blk[p / a->bs] * a->bs * a->k_stride +
                                    (size_t)g * a->bs * bb;
                d = gp + 2 * (size_t)sb;
                qs = gp + 2 * (size_t)a->bs + tl_attn_kq_at(a->bs, sb, 0);
                step = 0;
            } else {
                d = (const uint8_t *)a->k + kv_row_at(a, p, a->k_stride) + (size_t)g * bb;
                qs = d + 2;
                step = 1;
            }
            uint8_t *o = kt + (size_t)g * SLOTS * bb;
            memcpy(o + 2 * s, d, 2);
            for (int i = 0; i < (int)nq; i++)
                o[2 * SLOTS + tl_attn_kq_at(SLOTS, s, i)] = step ? qs[i] : qs[tl_attn_kq_at(a->bs, 0, i)];
        }
    }
}

/* A query row rounded for the integer scores (tl_attn_qrec_floats). */
static void attn_round_q(const float *q, int hd, float *rec) {
    const int ng = hd / 32;
    int32_t *sum = (int32_t *)(void *)(rec + ng);
    int8_t *q8 = (int8_t *)(void *)(rec + 2 * ng);
    for (int g = 0; g < ng; g++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(q[g * 32 + i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t s = 0;
        for (int i = 0; i < 32; i++) {
            /* to nearest even, as nearbyintf (|x| <= 127: adding 1.5 * 2^23
             * leaves the integer in the low bits), without its call */
            const int v = (int)((q[g * 32 + i] * id + 0x1.8p23f) - 0x1.8p23f);
            q8[g * 32 + i] = (int8_t)v;
            s += v;
        }
        rec[g] = d;
        sum[g] = s;
    }
}

/* A row's raw score against slot s of an integer K block (no scale yet). */
static float score_int_ref(const tl_attn_rows *a, const float *rec, const uint8_t *kt, int s) {
    const int ng = a->hd / 32, q8 = a->k_fmt == TL_ATTN_Q8_0;
    const size_t gb = (size_t)SLOTS * (q8 ? 34 : 18);
    const int8_t *qv = (const int8_t *)(const void *)(rec + 2 * ng);
    float acc = 0.0f;
    for (int g = 0; g < ng; g++) {
        const uint8_t *gp = kt + (size_t)g * gb, *qs = gp + 2 * SLOTS;
        int32_t isum = 0;
        for (int i = 0; i < 32; i++) {
            const int b = q8 ? i : i % 16;
            const uint8_t byte = qs[tl_attn_kq_at(SLOTS, s, b)];
            const int k = q8 ? (int8_t)byte : (i < 16 ? byte & 15 : byte >> 4) - 8;
            isum += k * qv[g * 32 + i];
        }
        acc = fmaf((float)isum, rec[g] * tl_fp16_to_fp32(ld_u16(gp + 2 * s)), acc);
    }
    return acc;
}

/* Position p's dimension d of an f16 K, in either layout (a quantized K is
 * read in integers: tl_attn_kint_block). */
static float k_elem(const tl_attn_rows *a, int p, int d) {
    const uint8_t *k = a->k;
    if (a->k_tr)
        return tl_fp16_to_fp32(ld_u16(k + (size_t)a->blk[p / a->bs] * a->bs * a->k_stride +
                                      2 * ((size_t)d * a->bs + (size_t)(p % a->bs))));
    return row_elem(k + kv_row_at(a, p, a->k_stride), TL_ATTN_F16, d);
}

/* The block at b0: K transposed for its live slots, V rows ws..we. */
static void widen_block_ref(const tl_attn_rows *a, int b0, int ws, int we, float *kt, float *vf) {
    const int kint = tl_attn_kint(a), ng = a->hd / 32;
    float *vd = a->v_fmt != TL_ATTN_F16 ? tl_attn_vd(a, vf) : NULL;
    if (vd) memset(vd, 0, SLOTS * (size_t)ng * sizeof *vd); /* slots not live weigh 0 x 0 */
    if (kint) tl_attn_kint_block(a, b0, ws, we, (uint8_t *)kt);
    for (int p = ws; p <= we; p++) {
        const uint8_t *vr = (const uint8_t *)a->v + kv_row_at(a, p, a->v_stride);
        for (int d = 0; d < a->hd; d++) {
            if (!kint) kt[d * SLOTS + (p - b0)] = k_elem(a, p, d);
            vf[(size_t)(p - b0) * a->hd + d] = row_elem(vr, a->v_fmt, d);
        }
        for (int g = 0; vd && g < ng; g++) vd[g * SLOTS + (p - b0)] = row_d(vr, a->v_fmt, g);
    }
}

#ifdef TL_X86
#define AVX2_AI __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

#ifndef TL_ATTN_PF
#define TL_ATTN_PF 8 /* blocks ahead: a block's K and V sit wherever the pool put them */
#endif
#ifndef TL_ATTN_PF_HINT
#define TL_ATTN_PF_HINT _MM_HINT_T1
#endif
/* Every line of the n rows of bytes at p, rs apart, once each. */
static void prefetch_rows(const char *p, int n, size_t rs, size_t bytes) {
    uintptr_t next = 0; /* the first line not yet asked for (rows go upward) */
    for (int i = 0; i < n; i++, p += rs) {
        uintptr_t at = (uintptr_t)p & ~(uintptr_t)63;
        if (at < next) at = next;
        for (; at < (uintptr_t)p + bytes; at += 64) _mm_prefetch((const char *)at, TL_ATTN_PF_HINT);
        next = at;
    }
}

void tl_attn_prefetch(const tl_attn_rows *a, int b0) {
    const int hd = a->hd;
    if (TL_ATTN_PF > 0 && a->bs == SLOTS && b0 + TL_ATTN_PF * SLOTS <= a->pos0 + a->T - 1) {
        /* This block's neighbours in the cache are other sequences' or other
         * layers', so the hardware prefetcher cannot run ahead across blocks:
         * decode at a long context waited on DRAM here (a third of its time).
         * The block's rows are found once and each line asked for once: a
         * division per row and lines asked for twice made decode's attention
         * 8% slower with the cache in L2. */
        const size_t blk = (size_t)a->blk[(b0 + TL_ATTN_PF * SLOTS) / SLOTS] * SLOTS;
        const size_t kb = tl_attn_fmt_bytes(a->k_fmt, hd), vb = tl_attn_fmt_bytes(a->v_fmt, hd);
        if (a->k_tr) prefetch_rows((const char *)a->k + blk * a->k_stride, 1, 0, kb * SLOTS);
        else prefetch_rows((const char *)a->k + blk * a->k_stride, SLOTS, a->k_stride, kb);
        prefetch_rows((const char *)a->v + blk * a->v_stride, SLOTS, a->v_stride, vb);
    }
}

/* A quantized V row (hd elements) into vo as its quants, group g's d into
 * vd[g * 16]. */
AVX2_AI void widen_v_q(int fmt, int hd, const uint8_t *row, float *vo, float *vd) {
    const __m128i m4 = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
    for (int g = 0; g < hd / 32; g++) {
        const uint8_t *b = row + (size_t)g * (fmt == TL_ATTN_Q8_0 ? 34 : 18);
        vd[g * SLOTS] = tl_fp16_to_fp32(ld_u16(b));
        float *o = vo + g * 32;
        if (fmt == TL_ATTN_Q8_0) {
            for (int j = 0; j < 4; j++) {
                const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + 8 * j));
                _mm256_storeu_ps(o + 8 * j, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
            }
            continue;
        }
        const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), e8);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), e8);
        _mm256_storeu_ps(o, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
        _mm256_storeu_ps(o + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
        _mm256_storeu_ps(o + 16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
        _mm256_storeu_ps(o + 24, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    }
}

/* A block with a quantized K or V: K transposed at bs 16 by the vector
 * widening, other layouts element by element; V rows ws..we. */
AVX2_AI void widen_q_avx2(const tl_attn_rows *a, int b0, int ws, int we, float *kt, float *vf) {
    const int hd = a->hd;
    if (tl_attn_kint(a)) {
        tl_attn_kint_block(a, b0, ws, we, (uint8_t *)kt);
    } else if (a->k_tr && a->bs == SLOTS) {
        const uint8_t *kb = (const uint8_t *)a->k + (size_t)a->blk[b0 / SLOTS] * SLOTS * a->k_stride;
        for (int d = 0; d < hd; d++)
            for (int i = 0; i < SLOTS; i += 8)
                _mm256_storeu_ps(kt + d * SLOTS + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                                         (const __m128i *)(const void *)(kb + 2 * (d * SLOTS + i)))));
    } else {
        for (int p = ws; p <= we; p++)
            for (int d = 0; d < hd; d++) kt[d * SLOTS + (p - b0)] = k_elem(a, p, d);
    }
    if (a->v_fmt != TL_ATTN_F16) memset(tl_attn_vd(a, vf), 0, SLOTS * (size_t)(hd / 32) * sizeof(float));
    for (int p = ws; p <= we; p++) {
        const uint8_t *vr = (const uint8_t *)a->v + kv_row_at(a, p, a->v_stride);
        float *vo = vf + (size_t)(p - b0) * hd;
        if (a->v_fmt == TL_ATTN_F16)
            for (int c = 0; c < hd; c += 8)
                _mm256_storeu_ps(vo + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(vr + 2 * c))));
        else
            widen_v_q(a->v_fmt, hd, vr, vo, tl_attn_vd(a, vf) + (p - b0));
    }
}

/* K transposed 8 slots x 8 dims at a time (slot groups with a live slot; the
 * others' lanes are masked), V rows ws..we. Slots outside ws..we in a group
 * read their block's stored rows, which are ignored. */
__attribute__((target("avx2,fma,f16c"))) void tl_attn_widen_avx2(const tl_attn_rows *a, int b0, int ws, int we,
                                                                   float *kt, float *vf) {
    const int hd = a->hd;
    tl_attn_prefetch(a, b0);
    if (a->k_fmt != TL_ATTN_F16 || a->v_fmt != TL_ATTN_F16 || (a->k_tr && a->bs == SLOTS)) {
        widen_q_avx2(a, b0, ws, we, kt, vf);
        return;
    }
    for (int sg = 0; sg < SLOTS && b0 + sg <= we; sg += 8) {
        if (b0 + sg + 7 < ws) continue;
        if (a->k_tr) { /* a shorter block: slot by slot */
            for (int i = 0; i < 8 && b0 + sg + i < b0 + a->bs; i++)
                for (int d = 0; d < hd; d++) kt[d * SLOTS + sg + i] = k_elem(a, b0 + sg + i, d);
            continue;
        }
        const uint16_t *kr[8];
        for (int i = 0; i < 8; i++) {
            const int p = b0 + sg + i < b0 + a->bs ? b0 + sg + i : b0 + a->bs - 1;
            kr[i] = (const uint16_t *)(const void *)((const uint8_t *)a->k + kv_row_at(a, p, a->k_stride));
        }
        for (int d0 = 0; d0 < hd; d0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr[i] + d0)));
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
            const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
            const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *o = kt + (size_t)d0 * SLOTS + sg;
            _mm256_storeu_ps(o + 0 * SLOTS, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(o + 1 * SLOTS, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(o + 2 * SLOTS, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(o + 3 * SLOTS, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(o + 4 * SLOTS, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(o + 5 * SLOTS, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(o + 6 * SLOTS, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(o + 7 * SLOTS, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
    for (int p = ws; p <= we; p++) {
        const uint16_t *vr = (const uint16_t *)(const void *)((const uint8_t *)a->v + kv_row_at(a, p, a->v_stride));
        float *vo = vf + (size_t)(p - b0) * hd;
        for (int c = 0; c < hd; c += 8) _mm256_storeu_ps(vo + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + c))));
    }
}

/* R (<= 4) rows' scores against the 16 slots: lane j of s[r][h] is slot 8h+j,
 * one fma chain over the dimensions, the key loads shared by the rows. */
AVX2_AI void scores_avx2(int hd, int R, const float *const *q, const float *kt, __m256 s[4][2]) {
    __m256 acc[4][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m256 k0 = _mm256_loadu_ps(kt + d * SLOTS), k1 = _mm256_loadu_ps(kt + d * SLOTS + 8);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m256 qb = _mm256_broadcast_ss(q[r] + d);
            acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) s[r][0] = acc[r][0], s[r][1] = acc[r][1];
}

/* The same from an integer K block (tl_attn_kint_bytes) and rounded rows:
 * per group the exact sums as |q| x (k signed as q) in 16-bit pairs (at most
 * 2*127*128: no saturation), then the group's fma. */
AVX2_AI void scores_int_avx2(const tl_attn_rows *a, int R, const float *const *q, const uint8_t *kt, __m256 s[4][2]) {
    const int ng = a->hd / 32, q8 = a->k_fmt == TL_ATTN_Q8_0;
    const size_t gb = (size_t)SLOTS * (q8 ? 34 : 18);
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15), e8 = _mm256_set1_epi8(8);
    __m256 acc[4][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        const uint8_t *gp = kt + (size_t)g * gb, *qs = gp + 2 * SLOTS;
        __m256i is[4][2];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) { /* elements 4j..4j+3 of the group */
            __m256i k0, k1;
            if (q8) {
                k0 = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 64 * j));
                k1 = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 64 * j + 32));
            } else {
                const int sh = j < 4 ? 0 : 4; /* elements 16.. are the high nibbles */
                const uint8_t *b = qs + 64 * (j % 4);
                k0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(const void *)b), sh), m4), e8);
                k1 = _mm256_sub_epi8(
                    _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(b + 32)), sh), m4), e8);
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                int32_t w;
                memcpy(&w, (const int8_t *)(const void *)(q[r] + 2 * ng) + g * 32 + 4 * j, 4);
                const __m256i qb = _mm256_set1_epi32(w), qa = _mm256_abs_epi8(qb);
                is[r][0] = _mm256_add_epi32(is[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k0, qb)), ones));
                is[r][1] = _mm256_add_epi32(is[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k1, qb)), ones));
            }
        }
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)gp));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(gp + 16)));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m256 dq = _mm256_set1_ps(q[r][g]);
            acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][0]), _mm256_mul_ps(dq, d0), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][1]), _mm256_mul_ps(dq, d1), acc[r][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) s[r][0] = acc[r][0], s[r][1] = acc[r][1];
}

/* A row's scores (two vectors of 8 slots) -> weights in t[16] (zero where not
 * live), m and l updated; returns alpha. */
AVX2_AI float softmax_step_avx2(const tl_attn_rows *a, __m256 s0, __m256 s1, int st, int en, float *t, float *m,
                                float *l) {
    const __m256 sc = _mm256_set1_ps(a->scale), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i i0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), i1 = _mm256_add_epi32(i0, _mm256_set1_epi32(8));
    const __m256i lo = _mm256_set1_epi32(st - 1), hi = _mm256_set1_epi32(en + 1);
    const __m256 live0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(i0, lo), _mm256_cmpgt_epi32(hi, i0)));
    const __m256 live1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(i1, lo), _mm256_cmpgt_epi32(hi, i1)));
    s0 = _mm256_blendv_ps(ninf, _mm256_mul_ps(s0, sc), live0);
    s1 = _mm256_blendv_ps(ninf, _mm256_mul_ps(s1, sc), live1);
    __m256 mx = _mm256_max_ps(s0, s1);
    mx = _mm256_max_ps(mx, _mm256_permute2f128_ps(mx, mx, 1));
    mx = _mm256_max_ps(mx, _mm256_shuffle_ps(mx, mx, 0x4e));
    mx = _mm256_max_ps(mx, _mm256_shuffle_ps(mx, mx, 0xb1));
    const float mb = _mm256_cvtss_f32(mx);
    const float mn = mb > *m ? mb : *m;
    /* exp(m - m') as lane 0 of the 8-lane exp: the bits of tl_expf_fast */
    const float alpha = *m == -INFINITY ? 0.0f : _mm256_cvtss_f32(expf8(_mm256_set1_ps(*m - mn)));
    *m = mn;
    const __m256 mv = _mm256_set1_ps(mn);
    const __m256 p0 = _mm256_and_ps(expf8(_mm256_sub_ps(_mm256_blendv_ps(mv, s0, live0), mv)), live0);
    const __m256 p1 = _mm256_and_ps(expf8(_mm256_sub_ps(_mm256_blendv_ps(mv, s1, live1), mv)), live1);
    _mm256_storeu_ps(t, p0);
    _mm256_storeu_ps(t + 8, p1);
    *l = *l * alpha + hsum8(_mm256_add_ps(p0, p1));
    return alpha;
}

/* o = o*alpha, then o = fma(p_j, v_j, o) in key order, for R (<= 4) rows
 * sharing the V loads: W dims per pass (R x W/8 sums in registers). */
AVX2_AI void pv_pass_avx2(int hd, int R, int W, float *const *o, const float *al, const float *const *p, int n,
                          const float *vf) {
    for (int c0 = 0; c0 < hd; c0 += W) {
        __m256 acc[4][4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++)
                acc[r][i] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + c0 + 8 * i), _mm256_set1_ps(al[r]));
        for (int j = 0; j < n; j++) {
            const float *vj = vf + (size_t)j * hd + c0;
            __m256 v[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++) v[i] = _mm256_loadu_ps(vj + 8 * i);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const __m256 pj = _mm256_set1_ps(p[r][j]);
                _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++) acc[r][i] = _mm256_fmadd_ps(pj, v[i], acc[r][i]);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++) _mm256_storeu_ps(o[r] + c0 + 8 * i, acc[r][i]);
    }
}

AVX2_AI void pv_rows_avx2(int hd, int R, float *const *o, const float *al, const float *const *p, int n,
                          const float *vf) {
    if (hd % 32 == 0 && R <= 2) pv_pass_avx2(hd, R, 32, o, al, p, n, vf);
    else if (hd % 16 == 0) pv_pass_avx2(hd, R, 16, o, al, p, n, vf);
    else pv_pass_avx2(hd, R, 8, o, al, p, n, vf);
}

/* tl_attn_vw on 8 lanes (|x| < 2^16). */
AVX2_AI __m256 attn_vw8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(0x1p-100f), _CMP_GE_OQ);
    const __m256i u = _mm256_castps_si256(x);
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                           _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    return _mm256_and_ps(_mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u))), keep);
}

/* tl_attn_vo on 8 lanes. */
AVX2_AI __m256 attn_vo8(__m256 o, float alpha) {
    if (alpha == 1.0f) return o;
    const __m256 x = _mm256_mul_ps(o, _mm256_set1_ps(alpha));
    return _mm256_and_ps(x, _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(0x1p-100f), _CMP_GE_OQ));
}

/* A quantized V's sum (mathfn.h) for R (<= 4) rows: w[r][g*16 + j] the
 * weight of slot j in group g, vf the block's quants (rows hd apart), slots
 * st.. n of them; W (16 or 32) dimensions per pass, each within a group. */
AVX2_AI void pvq_pass_avx2(int hd, int R, int W, float *const *o, const float *al, const float (*w)[8 * SLOTS],
                           int st, int n, const float *vf) {
    for (int c0 = 0; c0 < hd; c0 += W) {
        const int g = c0 / 32;
        __m256 acc[4][4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++)
                acc[r][i] = attn_vo8(_mm256_loadu_ps(o[r] + c0 + 8 * i), al[r]);
        for (int j = st; j < st + n; j++) {
            const float *vj = vf + (size_t)j * hd + c0;
            __m256 v[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++) v[i] = _mm256_loadu_ps(vj + 8 * i);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const __m256 wj = _mm256_set1_ps(w[r][g * SLOTS + j]);
                _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++) acc[r][i] = _mm256_fmadd_ps(wj, v[i], acc[r][i]);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int i = 0; i < W / 8; i++) _mm256_storeu_ps(o[r] + c0 + 8 * i, acc[r][i]);
    }
}

/* R (<= 4) rows of one token (so the same live slots st..en) over a widened
 * block; each row's float operations are those of row_block_ref. */
AVX2_AI void rows_block_r_avx2(const tl_attn_rows *a, int R, const float *const *q, float *const *o,
                               float *const *m, float *const *l, int st, int en, const float *kt, const float *vf) {
    __m256 s[4][2];
    float t[4][SLOTS], al[4];
    const float *p[4];
    if (tl_attn_kint(a)) scores_int_avx2(a, R, q, (const uint8_t *)kt, s);
    else scores_avx2(a->hd, R, q, kt, s);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        al[r] = softmax_step_avx2(a, s[r][0], s[r][1], st, en, t[r], m[r], l[r]);
        p[r] = t[r] + st;
    }
    if (a->v_fmt != TL_ATTN_F16) { /* weights per group: p x the slots' d, as bf16 */
        const int ng = a->hd / 32;
        const float *vd = tl_attn_vd(a, vf);
        float w[4][8 * SLOTS];
        for (int g = 0; g < ng; g++)
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                for (int h = 0; h < SLOTS; h += 8)
                    _mm256_storeu_ps(w[r] + g * SLOTS + h, attn_vw8(_mm256_mul_ps(_mm256_loadu_ps(t[r] + h),
                                                                                  _mm256_loadu_ps(vd + g * SLOTS + h))));
        if (R <= 2) pvq_pass_avx2(a->hd, R, 32, o, al, (const float (*)[8 * SLOTS])w, st, en - st + 1, vf);
        else pvq_pass_avx2(a->hd, R, 16, o, al, (const float (*)[8 * SLOTS])w, st, en - st + 1, vf);
        return;
    }
    pv_rows_avx2(a->hd, R, o, al, p, en - st + 1, vf + (size_t)st * a->hd);
}

__attribute__((target("avx2,fma,f16c"))) static void rows_block_avx2(const tl_attn_rows *a, int R,
                                                                       const float *const *q, float *const *o,
                                                                       float *const *m, float *const *l, int st,
                                                                       int en, const float *kt, const float *vf) {
    switch (R) {
    case 1: rows_block_r_avx2(a, 1, q, o, m, l, st, en, kt, vf); break;
    case 2: rows_block_r_avx2(a, 2, q, o, m, l, st, en, kt, vf); break;
    case 3: rows_block_r_avx2(a, 3, q, o, m, l, st, en, kt, vf); break;
    default: rows_block_r_avx2(a, 4, q, o, m, l, st, en, kt, vf); break;
    }
}
#endif

void tl_attn_keys(const tl_attn_rows *a, int i, int *lo, int *hi) {
    const int w = a->n_swa > 0 ? a->pos0 + i - a->n_swa + 1 : 0;
    *lo = w > 0 ? w : 0;
    *hi = a->pos0 + i;
    if (a->seg > 0) {
        const int s0 = (a->seg - 1) * TL_ATTN_SEG;
        if (*lo < s0) *lo = s0;
        if (*hi > s0 + TL_ATTN_SEG - 1) *hi = s0 + TL_ATTN_SEG - 1;
    }
}

static int attn_lo(const tl_attn_rows *a, int i) {
    int lo, hi;
    tl_attn_keys(a, i, &lo, &hi);
    return lo;
}

static int attn_hi(const tl_attn_rows *a, int i) {
    int lo, hi;
    tl_attn_keys(a, i, &lo, &hi);
    return hi;
}

void tl_attn_merge(int hd, float *ma, float *la, float *oa, float m, float l, const float *o) {
    if (*ma == -INFINITY) {
        *ma = m;
        *la = l;
        memcpy(oa, o, (size_t)hd * sizeof *oa);
        return;
    }
    const float mn = m > *ma ? m : *ma;
    /* the larger side's factor is exp(0), exactly 1 (test_mathfn checks it) */
    const float ea = *ma == mn ? 1.0f : tl_expf_fast(*ma - mn), eb = m == mn ? 1.0f : tl_expf_fast(m - mn);
    *ma = mn;
    *la = *la * ea + l * eb;
    int d = 0;
#ifdef TL_X86
    /* a long context folds every row at each segment: 4 lanes (x86-64's
     * baseline), the same operations per element */
    const __m128 va = _mm_set1_ps(ea), vb = _mm_set1_ps(eb);
    for (; d + 4 <= hd; d += 4)
        _mm_storeu_ps(oa + d, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(oa + d), va), _mm_mul_ps(_mm_loadu_ps(o + d), vb)));
#endif
    for (; d < hd; d++) oa[d] = oa[d] * ea + o[d] * eb;
}

void tl_attn_sink(int hd, float *m, float *l, float *o, float s) {
    if (s > *m) {
        const float e = tl_expf_fast(*m - s);
        *m = s;
        *l = *l * e + 1.0f;
        for (int d = 0; d < hd; d++) o[d] = o[d] * e;
    } else {
        *l = *l + tl_expf_fast(s - *m);
    }
}

void tl_attn_divide(int hd, const float *o, float l, float *out) {
    const float inv = 1.0f / l;
    for (int d = 0; d < hd; d++) out[d] = o[d] * inv;
}

/* The state after the widened blocks: m, l, then the accumulated ma, la
 * ([T][G] each) and oa ([T][G][hd]). */
static float *attn_state(const tl_attn_rows *a) { return a->scratch + 2 * (size_t)TL_ATTN_NB * SLOTS * a->hd; }

static float *attn_out(const tl_attn_rows *a, int i, int h) {
    return a->out + (size_t)i * a->out_tok + (size_t)h * a->out_stride;
}

float *tl_attn_begin(const tl_attn_rows *a) {
    const int n = a->G * a->T;
    float *m = attn_state(a), *l = m + n, *ma = l + n;
    for (int i = 0; i < a->T; i++)
        for (int h = 0; h < a->G; h++) {
            const int k = i * a->G + h;
            m[k] = ma[k] = -INFINITY;
            l[k] = 0.0f;
            memset(attn_out(a, i, h), 0, (size_t)a->hd * sizeof(float));
            if (tl_attn_kint(a))
                attn_round_q(a->q + (size_t)i * a->q_tok + (size_t)h * a->q_stride, a->hd, tl_attn_qrec(a, i, h));
        }
    return m;
}

void tl_attn_fold(const tl_attn_rows *a, float *m) {
    const int n = a->G * a->T;
    float *l = m + n, *ma = l + n, *la = ma + n, *oa = la + n;
    for (int i = 0; i < a->T; i++)
        for (int h = 0; h < a->G; h++) {
            const int k = i * a->G + h;
            if (m[k] == -INFINITY) continue;
            float *o = attn_out(a, i, h);
            tl_attn_merge(a->hd, &ma[k], &la[k], oa + (size_t)k * a->hd, m[k], l[k], o);
            m[k] = -INFINITY;
            l[k] = 0.0f;
            memset(o, 0, (size_t)a->hd * sizeof *o);
        }
}

void tl_attn_finish(const tl_attn_rows *a, float *m, int folded) {
    const int n = a->G * a->T, hd = a->hd;
    float *l = m + n, *la = l + 2 * n, *oa = la + n;
    if (a->seg > 0) {
        for (int k = 0; k < n; k++) {
            a->part[2 * k] = m[k];
            a->part[2 * k + 1] = l[k];
        }
        return;
    }
    if (folded) tl_attn_fold(a, m);
    float *ma = la - n;
    for (int i = 0; i < a->T; i++)
        for (int h = 0; h < a->G; h++) {
            const int k = i * a->G + h;
            float *o = attn_out(a, i, h), *os = folded ? oa + (size_t)k * hd : o, *ls = folded ? &la[k] : &l[k];
            if (a->sinks) tl_attn_sink(hd, folded ? &ma[k] : &m[k], ls, os, a->sinks[h]);
            tl_attn_divide(hd, os, *ls, o);
        }
}

/* Rows waiting for one call of the level's block function: same live slots. */
typedef struct attn_group {
    int R, st, en;
    const float *q[8];
    float *o[8], *m[8], *l[8];
} attn_group;

void tl_attn_drive(const tl_attn_rows *a, int rmax, tl_attn_widen_fn widen, tl_attn_block_fn rows,
                   tl_attn_multi_fn multi) {
    const int hd = a->hd, G = a->G, bs = a->bs, T = a->T;
    float *kt = a->scratch, *vf = kt + (size_t)TL_ATTN_NB * SLOTS * hd;
    float *m = tl_attn_begin(a), *l = m + (size_t)G * T; /* [T][G] each */
    int folded = 0;
    if (rmax > 8) rmax = 8;
    const int last = attn_hi(a, T - 1), first = attn_lo(a, 0) / bs * bs;
    /* Blocks every token sees whole: from the last token's first key (the
     * window's start moves with the token) to the first token's last. */
    const int full_lo = attn_lo(a, T - 1), full_hi = attn_hi(a, 0);
    if (bs != SLOTS) multi = NULL;
    /* Blocks by absolute position; each widened once for all T tokens, each
     * token taking the part of it within its own keys lo_i..pos_i. Rows with
     * the same live slots (the heads of a token, and of the tokens that see
     * the whole block) go to the block function together, up to rmax: they
     * share its K and V loads, and their score chains run side by side. */
    for (int b0 = first; b0 <= last;) {
        if (b0 % TL_ATTN_SEG == 0 && b0 > first) {
            tl_attn_fold(a, m);
            folded = 1;
        }
        if (multi && b0 >= full_lo && b0 + bs - 1 <= full_hi) {
            /* a run of whole blocks within a segment: all rows in order,
             * rmax at a time */
            int nb = 0;
            while (nb < TL_ATTN_NB && b0 + (nb + 1) * bs - 1 <= full_hi &&
                   (nb == 0 || (b0 + nb * bs) % TL_ATTN_SEG != 0)) {
                const int bk = b0 + nb * bs;
                widen(a, bk, bk, bk + bs - 1, kt + (size_t)nb * SLOTS * hd, vf + (size_t)nb * SLOTS * hd);
                nb++;
            }
            attn_group g = {0, 0, 0, {0}, {0}, {0}, {0}};
            for (int i = 0; i < T; i++)
                for (int h = 0; h < G; h++) {
                    g.q[g.R] = tl_attn_qrow(a, i, h);
                    g.o[g.R] = a->out + (size_t)i * a->out_tok + (size_t)h * a->out_stride;
                    g.m[g.R] = &m[i * G + h];
                    g.l[g.R] = &l[i * G + h];
                    if (++g.R == rmax) {
                        multi(a, g.R, g.q, g.o, g.m, g.l, nb, kt, vf);
                        g.R = 0;
                    }
                }
            if (g.R > 0) multi(a, g.R, g.q, g.o, g.m, g.l, nb, kt, vf);
            b0 += nb * bs;
            continue;
        }
        const int ws = b0 > attn_lo(a, 0) ? b0 : attn_lo(a, 0);
        const int we = b0 + bs - 1 < last ? b0 + bs - 1 : last;
        widen(a, b0, ws, we, kt, vf);
        attn_group g = {0, 0, 0, {0}, {0}, {0}, {0}};
        for (int i = 0; i < T; i++) {
            int lo, pos;
            tl_attn_keys(a, i, &lo, &pos);
            const int st = (ws > lo ? ws : lo) - b0, en = (we < pos ? we : pos) - b0;
            if (st > en) continue;
            for (int h = 0; h < G; h++) {
                if (g.R > 0 && (g.R == rmax || st != g.st || en != g.en)) {
                    rows(a, g.R, g.q, g.o, g.m, g.l, g.st, g.en, kt, vf);
                    g.R = 0;
                }
                g.st = st, g.en = en;
                g.q[g.R] = tl_attn_qrow(a, i, h);
                g.o[g.R] = a->out + (size_t)i * a->out_tok + (size_t)h * a->out_stride;
                g.m[g.R] = &m[i * G + h];
                g.l[g.R] = &l[i * G + h];
                g.R++;
            }
        }
        if (g.R > 0) rows(a, g.R, g.q, g.o, g.m, g.l, g.st, g.en, kt, vf);
        b0 += bs;
    }
    tl_attn_finish(a, m, folded);
}

static void rows_block_ref(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                           float *const *l, int st, int en, const float *kt, const float *vf) {
    for (int r = 0; r < R; r++) row_block_ref(a, q[r], o[r], m[r], l[r], st, en, kt, vf);
}

void tl_attn_online(const tl_attn_rows *a, int avx2) {
#ifdef TL_X86
    if (avx2) {
        tl_attn_drive(a, 4, tl_attn_widen_avx2, rows_block_avx2, NULL);
        return;
    }
#endif
    (void)avx2;
    tl_attn_drive(a, 4, widen_block_ref, rows_block_ref, NULL);
}

void tl_mul_add(int n, float *o, const float *y, float w, int first) {
    for (int i = 0; i < n; i++) {
        const float v = y[i] * w;
        o[i] = first ? v : o[i] + v;
    }
}

#ifdef TL_X86
__attribute__((target("avx2"))) static void mul_add_avx2(int n, float *o, const float *y, float w, int first) {
    const __m256 vw = _mm256_set1_ps(w);
    int i = 0;
    if (first)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vw));
    else
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i), _mm256_mul_ps(_mm256_loadu_ps(y + i), vw)));
    tl_mul_add(n - i, o + i, y + i, w, first);
}
#endif

/* ---- bound to a level (tl_mathfn_bind) ---- */

#define BIND(NAME, AVX2)                                                                                    \
    static void NAME##_swiglu(int n, float *y, const float *g, const float *u) { tl_swiglu(n, y, g, u, AVX2); } \
    static void NAME##_geglu(int n, float *y, const float *g, const float *u, const uint16_t *t) {          \
        tl_geglu(n, y, g, u, t, AVX2);                                                                      \
    }                                                                                                       \
    static double NAME##_softmax(int n, float *s, float max) { return tl_softmax_exp(n, s, max, AVX2); }     \
    static void NAME##_round(int n, float *s, float scale) { tl_scale_round_f16(n, s, scale, AVX2); }        \
    static void NAME##_pv(int n, int hd, const float *p, const uint16_t *v, int64_t vs, const int32_t *blk,  \
                          int bs, int j0, float *acc, float *out) {                                         \
        tl_attn_pv_paged(n, hd, p, v, vs, blk, bs, j0, acc, out, AVX2);                                     \
    }                                                                                                       \
    static void NAME##_online(const tl_attn_rows *a) { tl_attn_online(a, AVX2); }
BIND(ref, 0)
BIND(avx2, 1)
#undef BIND

void tl_mathfn_bind(tl_mathfn *m, int avx2, int fast) {
    if (avx2) *m = (tl_mathfn){avx2_swiglu, avx2_geglu, avx2_softmax, avx2_round, avx2_pv, avx2_online, NULL, NULL, NULL, NULL, NULL};
    else *m = (tl_mathfn){ref_swiglu, ref_geglu, ref_softmax, ref_round, ref_pv, ref_online, NULL, NULL, NULL, NULL, NULL};
    m->rmsnorm = fast ? tl_rmsnorm_fast : tl_rmsnorm_exact;
    m->f16_row = tl_f16_row;
    m->rope = tl_rope;
    m->fwht = tl_fwht;
    m->mul_add = tl_mul_add;
#ifdef TL_X86
    if (avx2) {
        m->mul_add = mul_add_avx2;
        m->fwht = fwht_avx2;
        m->rope = rope_avx2;
        m->rmsnorm = fast ? rmsnorm_fast_avx2 : rmsnorm_exact_avx2;
        m->f16_row = f16_row_avx2;
    }
#endif
}
