/* quant/: the weight formats, one kit per type in one table: block
 * layouts, (de)quantization and the scalar reference dots the SIMD kernels
 * are tested against (quant.c, this file). The next types (MXFP4, IQ4_NL,
 * IQ4_XS) join as rows of the same table.
 *
 * quant: the type traits table, row dequantization (bit-identical to ggml's
 * dequantize_row_*), quantization (ggml's reference weight quantizers and the
 * x86 CPU backend's activation quantizers) and the scalar reference dots
 * (bit-identical to the float order of llama.cpp's x86 AVX2 matmuls).
 * Pure functions on caller buffers; no allocation, no state. */
#include "quant/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/util.h"

/* Every float expression here must round exactly like ggml's separately
 * rounded multiplies and adds (and numpy's, for the gguf package checks);
 * a fused multiply-add would change the last bit. GCC in ISO C mode already
 * never contracts; clang needs to be told. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define T(id, nm, bs, ts, dq, dot, vdt) \
    [id] = {.name = nm, .block_size = bs, .type_size = ts, .can_dequant = dq, .can_dot = dot, .vec_dot_type = vdt}

static const tl_type_traits k_traits[TL_TYPE_COUNT] = {
    T(TL_F32, "F32", 1, 4, 1, 1, TL_F32),
    T(TL_F16, "F16", 1, 2, 1, 1, TL_F16),
    T(TL_BF16, "BF16", 1, 2, 1, 1, TL_BF16),
    T(TL_Q4_0, "Q4_0", QK4_0, sizeof(block_q4_0), 1, 1, TL_Q8_0),
    T(TL_Q4_1, "Q4_1", QK4_1, sizeof(block_q4_1), 1, 1, TL_Q8_1),
    T(TL_Q5_0, "Q5_0", QK5_0, sizeof(block_q5_0), 1, 1, TL_Q8_0),
    T(TL_Q5_1, "Q5_1", QK5_1, sizeof(block_q5_1), 1, 1, TL_Q8_1),
    T(TL_Q8_0, "Q8_0", QK8_0, sizeof(block_q8_0), 1, 1, TL_Q8_0),
    T(TL_Q8_1, "Q8_1", QK8_1, sizeof(block_q8_1), 1, 0, TL_Q8_1),
    T(TL_Q2_K, "Q2_K", QK_K, sizeof(block_q2_K), 1, 1, TL_Q8_K),
    T(TL_Q3_K, "Q3_K", QK_K, sizeof(block_q3_K), 1, 1, TL_Q8_K),
    T(TL_Q4_K, "Q4_K", QK_K, sizeof(block_q4_K), 1, 1, TL_Q8_K),
    T(TL_Q5_K, "Q5_K", QK_K, sizeof(block_q5_K), 1, 1, TL_Q8_K),
    T(TL_Q6_K, "Q6_K", QK_K, sizeof(block_q6_K), 1, 1, TL_Q8_K),
    T(TL_Q8_K, "Q8_K", QK_K, sizeof(block_q8_K), 1, 0, TL_Q8_K),
    /* ggml's other types: known, so that a file holding them opens and is
     * described (`tokenloop info`) and the loader can name the tensor and
     * type it cannot run; no conversion or dot */
    T(16, "IQ2_XXS", QK_K, 66, 0, 0, 0),
    T(17, "IQ2_XS", QK_K, 74, 0, 0, 0),
    T(18, "IQ3_XXS", QK_K, 98, 0, 0, 0),
    T(19, "IQ1_S", QK_K, 50, 0, 0, 0),
    T(TL_IQ4_NL, "IQ4_NL", QK4_NL, sizeof(block_iq4_nl), 1, 1, TL_Q8_0),
    T(21, "IQ3_S", QK_K, 110, 0, 0, 0),
    T(22, "IQ2_S", QK_K, 82, 0, 0, 0),
    T(TL_IQ4_XS, "IQ4_XS", QK_K, sizeof(block_iq4_xs), 1, 1, TL_Q8_K),
    T(24, "I8", 1, 1, 0, 0, 0),
    T(25, "I16", 1, 2, 0, 0, 0),
    T(26, "I32", 1, 4, 0, 0, 0),
    T(27, "I64", 1, 8, 0, 0, 0),
    T(28, "F64", 1, 8, 0, 0, 0),
    T(29, "IQ1_M", QK_K, 56, 0, 0, 0),
    T(34, "TQ1_0", QK_K, 54, 0, 0, 0),
    T(35, "TQ2_0", QK_K, 66, 0, 0, 0),
    T(TL_MXFP4, "MXFP4", QK_MXFP4, sizeof(block_mxfp4), 1, 1, TL_Q8_0),
};
#undef T

const tl_type_traits *tl_type_info(uint32_t type) {
    if (type >= TL_TYPE_COUNT || !k_traits[type].name) return NULL;
    return &k_traits[type];
}

size_t tl_row_size(tl_type type, int64_t n) {
    const tl_type_traits *t = tl_type_info((uint32_t)type);
    if (!t || n < 0 || n % t->block_size) return 0;
    uint64_t bytes;
    if (tl_mul_u64((uint64_t)(n / t->block_size), t->type_size, &bytes) || bytes > SIZE_MAX) return 0;
    return (size_t)bytes;
}

/* ---- helpers ---------------------------------------------------------------- */

static inline float h2f(uint16_t h) { return tl_fp16_to_fp32(h); }
static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint16_t f2h(float f) { return tl_fp32_to_fp16(f); }

/* ggml's nearest_int: adding 1.5*2^23 leaves the integer in the low mantissa
 * bits, rounded half to even by the float add itself. Valid for |f| < 2^22. */
static inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }



/* ---- dequantization ------------------------------------------------------------ */

static void dq_q4_0(const block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0xF) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dq_q4_1(const block_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 0xF) * d + m;
            y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* The 5-bit quants of a Q5_0/Q5_1 block: low nibbles plus bit j of qh. */
static void q5_unpack(const uint8_t *qs, const uint8_t qh_bytes[4], int q[32]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
    }
}

static void dq_q5_0(const block_q5_0 *x, float *y, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = h2f(x[i].d);
        q5_unpack(x[i].qs, x[i].qh, q);
        for (int j = 0; j < 32; j++) y[j] = (float)(q[j] - 16) * d;
    }
}

static void dq_q5_1(const block_q5_1 *x, float *y, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        q5_unpack(x[i].qs, x[i].qh, q);
        for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d + m;
    }
}

static void dq_q8_0(const block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void dq_q8_1(const block_q8_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_1) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void dq_q8_K(const block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * (float)x[i].qs[j];
}

/* K-quants with 2- and 3-bit fields share one layout of qs: element
 * 128*h + 32*s + l sits in byte 32*h + l at bit 2*s. Sub-block of 16 = e/16. */
static inline int q2_field(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

static void dq_q2_K(const block_q2_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)(x[i].scales[s] & 0xF);
            const float ml = dmin * (float)(x[i].scales[s] >> 4);
            for (int e = 16 * s; e < 16 * s + 16; e++) y[e] = dl * (float)q2_field(x[i].qs, e) - ml;
        }
    }
}

/* Q3_K element e: 2 low bits as in Q2_K; its high bit is bit e/32 of hmask[e%32],
 * and a clear high bit means "subtract 4". */
static inline int q3_value(const block_q3_K *b, int e) {
    int hi = (b->hmask[e % 32] >> (e / 32)) & 1;
    return q2_field(b->qs, e) - (hi ? 0 : 4);
}

static void dq_q3_K(const block_q3_K *x, float *y, int64_t nb) {
    int8_t sc[16];
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(x[i].d);
        tl_q3k_scales(x[i].scales, sc);
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)sc[s];
            for (int e = 16 * s; e < 16 * s + 16; e++) y[e] = dl * (float)q3_value(&x[i], e);
        }
    }
}

/* Q4_K/Q5_K element e: sub-block e/32; nibble of qs[32*(e/64) + e%32], low for
 * even sub-blocks; Q5_K's fifth bit is bit e/32 of qh[e%32]. */
static inline int q4k_value(const uint8_t *qs, int e) {
    uint8_t b = qs[32 * (e / 64) + e % 32];
    return ((e / 32) & 1) ? b >> 4 : b & 0xF;
}

static void dq_q4_K(const block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, mn;
            scale_min_k4(s, x[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            for (int e = 32 * s; e < 32 * s + 32; e++) y[e] = d1 * (float)q4k_value(x[i].qs, e) - m1;
        }
    }
}

static inline int q5k_value(const block_q5_K *b, int e) {
    return q4k_value(b->qs, e) + (((b->qh[e % 32] >> (e / 32)) & 1) << 4);
}

static void dq_q5_K(const block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, mn;
            scale_min_k4(s, x[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            for (int e = 32 * s; e < 32 * s + 32; e++) y[e] = d1 * (float)q5k_value(&x[i], e) - m1;
        }
    }
}

/* Q6_K element e = 128*h + 32*s + l: low nibble from ql[64*h + l + 32*(s&1)]
 * (high nibble when s >= 2), two high bits at bit 2*s of qh[32*h + l]. */
static inline int q6k_value(const block_q6_K *b, int e) {
    int h = e / 128, s = (e % 128) / 32, l = e % 32;
    uint8_t lo = b->ql[64 * h + l + 32 * (s & 1)];
    int v = (s >= 2 ? lo >> 4 : lo & 0xF) | (((b->qh[32 * h + l] >> (2 * s)) & 3) << 4);
    return v - 32;
}

static void dq_q6_K(const block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(x[i].d);
        for (int e = 0; e < QK_K; e++) y[e] = d * (float)x[i].scales[e / 16] * (float)q6k_value(&x[i], e);
    }
}

/* ---- MXFP4 (ggml's block_mxfp4) ---------------------------------------------------- */

const int8_t tl_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void dq_mxfp4(const block_mxfp4 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tl_e8m0_half(x[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[i * QK_MXFP4 + j] = tl_kvalues_mxfp4[x[i].qs[j] & 0x0F] * d;
            y[i * QK_MXFP4 + j + QK_MXFP4 / 2] = tl_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

/* ---- IQ4_NL and IQ4_XS (ggml's block_iq4_nl, block_iq4_xs) -------------------- */

const int8_t tl_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void dq_iq4_nl(const block_iq4_nl *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            y[i * QK4_NL + j] = d * tl_kvalues_iq4nl[x[i].qs[j] & 0x0F];
            y[i * QK4_NL + j + QK4_NL / 2] = d * tl_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}


static void dq_iq4_xs(const block_iq4_xs *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * (float)tl_iq4_xs_scale(&x[i], ib);
            const uint8_t *qs = x[i].qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                y[i * QK_K + 32 * ib + j] = dl * tl_kvalues_iq4nl[qs[j] & 0x0F];
                y[i * QK_K + 32 * ib + j + 16] = dl * tl_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* ggml's best_index_int8: the nearest of 16 ascending values (the upper
 * one on a tie) by bisection */
static int iq4_best(float x) {
    const int8_t *v = tl_kvalues_iq4nl;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* ggml's quantize_row_iq4_nl_impl as llama-quantize runs it without an
 * importance matrix (weights x^2, 7 tries of the scale either side): per
 * 32-element block the scale that best fits the table by weighted least
 * squares; over n > 32 (IQ4_XS) those scales themselves as 6-bit multiples of
 * one f16 d. Float steps in ggml's order, none fused. */
static void q_iq4_impl(int n, const float *x, uint16_t *dh, uint8_t *q4, uint16_t *scales_h, uint8_t *scales_l) {
    enum { NTRY = 7 };
    const int8_t *values = tl_kvalues_iq4nl;
    float scales[QK_K / 32], weight[32];
    uint8_t L[QK_K];
    memset(q4, 0, (size_t)n / 2);
    memset(L, 0, sizeof L);
    *dh = f2h(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < n / 32; ib++) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) amax = ax, max = xb[j];
        }
        if (amax < 1e-15f) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float al = id * xb[j];
            const int l = iq4_best(al);
            Lb[j] = (uint8_t)l;
            const float q = values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -NTRY; itry <= NTRY; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float al = id * xb[j];
                const int l = iq4_best(al);
                const float q = values[l], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) amax_scale = abs_d, max_scale = d;
    }
    if (n > 32) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = f2h(d);
        const float id = d != 0.0f ? 1 / d : 0.f;
        for (int ib = 0; ib < n / 32; ib++) {
            int l = nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[ib * 32 + j] = (uint8_t)iq4_best(idl * x[ib * 32 + j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        *dh = f2h(scales[0]);
        const float id = scales[0] != 0.0f ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_best(id * x[j]);
    }
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void q_iq4_nl(const float *x, block_iq4_nl *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) q_iq4_impl(QK4_NL, x + i * QK4_NL, &y[i].d, y[i].qs, NULL, NULL);
}

static void q_iq4_xs(const float *x, block_iq4_xs *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) q_iq4_impl(QK_K, x + i * QK_K, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l);
}

/* ggml's quantize_row_mxfp4_ref: the exponent from the largest magnitude,
 * each value to the nearest table entry (the first on ties) */
static void q_mxfp4(const float *x, block_mxfp4 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[i * QK_MXFP4 + j])) amax = fabsf(x[i * QK_MXFP4 + j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = tl_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                const float v = x[i * QK_MXFP4 + j + h * QK_MXFP4 / 2];
                int best = 0;
                float best_err = fabsf(tl_kvalues_mxfp4[0] * d - v);
                for (int k = 1; k < 16; k++) {
                    const float err = fabsf(tl_kvalues_mxfp4[k] * d - v);
                    if (err < best_err) best = k, best_err = err;
                }
                q[h] = (uint8_t)best;
            }
            y[i].qs[j] = (uint8_t)(q[0] | q[1] << 4);
        }
    }
}

int tl_dequantize_row(tl_type type, const void *src, float *dst, int64_t n) {
    const tl_type_traits *t = tl_type_info((uint32_t)type);
    if (!t || !t->can_dequant || n < 0 || n % t->block_size) return -1;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case TL_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TL_F16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = tl_fp16_to_fp32(h[i]);
        break;
    }
    case TL_BF16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = tl_bf16_to_fp32(h[i]);
        break;
    }
    case TL_Q4_0: dq_q4_0(src, dst, nb); break;
    case TL_Q4_1: dq_q4_1(src, dst, nb); break;
    case TL_Q5_0: dq_q5_0(src, dst, nb); break;
    case TL_Q5_1: dq_q5_1(src, dst, nb); break;
    case TL_Q8_0: dq_q8_0(src, dst, nb); break;
    case TL_Q8_1: dq_q8_1(src, dst, nb); break;
    case TL_Q2_K: dq_q2_K(src, dst, nb); break;
    case TL_Q3_K: dq_q3_K(src, dst, nb); break;
    case TL_Q4_K: dq_q4_K(src, dst, nb); break;
    case TL_Q5_K: dq_q5_K(src, dst, nb); break;
    case TL_Q6_K: dq_q6_K(src, dst, nb); break;
    case TL_Q8_K: dq_q8_K(src, dst, nb); break;
    case TL_MXFP4: dq_mxfp4(src, dst, nb); break;
    case TL_IQ4_NL: dq_iq4_nl(src, dst, nb); break;
    case TL_IQ4_XS: dq_iq4_xs(src, dst, nb); break;
    default: return -1;
    }
    return 0;
}

/* ---- quantization: legacy weight formats (ggml's *_ref) --------------------------- */

/* The element of largest magnitude, sign kept (the first one on ties). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

static void q_q4_0(const float *x, block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            /* the int8 cast truncates, as ggml's does */
            int a = imin(15, (int8_t)(x[j] * id + 8.5f));
            int b = imin(15, (int8_t)(x[j + QK4_0 / 2] * id + 8.5f));
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

static void q_q4_1(const float *x, block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float mn, mx;
        min_max(x, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            int a = imin(15, (int8_t)((x[j] - mn) * id + 0.5f));
            int b = imin(15, (int8_t)((x[j + QK4_1 / 2] - mn) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

/* Packs 32 five-bit quants: low nibbles in qs, fifth bits in qh (bit j). */
static void q5_pack(const int q[32], uint8_t qs[16], uint8_t qh_bytes[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

static void q_q5_0(const float *x, block_q5_0 *y, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)imin(31, (int8_t)(x[j] * id + 16.5f));
        q5_pack(q, y[i].qs, y[i].qh);
    }
}

static void q_q5_1(const float *x, block_q5_1 *y, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float mn, mx;
        min_max(x, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(mn);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)((x[j] - mn) * id + 0.5f);
        q5_pack(q, y[i].qs, y[i].qh);
    }
}

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    return amax;
}

/* Weight Q8_0 (llama-quantize, gguf-py): d = amax/127, q = roundf(x / d). */
static void q_q8_0_ref(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        const float d = absmax(x, QK8_0) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ---- quantization: activation formats, as the x86 CPU backend does them ----------- */

/* x86 AVX Q8_0/Q8_1: multiplier 127/amax (not 1/d) and round half to even. */
static int act_q8_block(const float *x, int8_t *qs, float *d_out) {
    const float amax = absmax(x, 32);
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        float r = rintf(x[j] * id); /* default rounding mode: half to even */
        int v = r > 127.f ? 127 : r < -128.f ? -128 : (int)r;
        qs[j] = (int8_t)v;
        sum += v;
    }
    *d_out = amax / 127.f;
    return sum;
}

static void act_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float d;
        act_q8_block(x, y[i].qs, &d);
        y[i].d = f2h(d);
    }
}

static void act_q8_1(const float *x, block_q8_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        float d;
        int sum = act_q8_block(x, y[i].qs, &d);
        y[i].d = f2h(d);
        y[i].s = f2h(d * (float)sum);
    }
}

/* Q8_K: x86 uses the reference; d is a float, multiplier -127/max. */
static void act_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float max = signed_absmax(x, QK_K);
        memset(&y[i], 0, sizeof y[i]);
        if (max == 0.0f) continue;
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)imin(127, nearest_int(iscale * x[j]));
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

int tl_quantize_row_act(tl_type type, const float *src, void *dst, int64_t n) {
    const tl_type_traits *t = tl_type_info((uint32_t)type);
    if (!t || n < 0 || n % t->block_size) return -1;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case TL_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TL_F16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = tl_fp32_to_fp16(src[i]);
        break;
    }
    case TL_BF16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = tl_fp32_to_bf16(src[i]);
        break;
    }
    case TL_Q8_0: act_q8_0(src, dst, nb); break;
    case TL_Q8_1: act_q8_1(src, dst, nb); break;
    case TL_Q8_K: act_q8_K(src, dst, nb); break;
    default: return -1;
    }
    return 0;
}

/* ---- quantization: K-quant weight formats (ggml's *_ref, no importance matrix) ---- */

/* Asymmetric fit of n values to 0..nmax with a scale and a min (ggml's
 * make_qkx2_quants): starts from the min/max grid, then tries nstep+1 grid
 * stretches and keeps the weighted least-squares fit with least error, the
 * error summed as w * |diff| with mad (Q2_K), else w * diff^2.
 * Returns the scale; *neg_min gets -min (>= 0). */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                           float rmin, float rdelta, int nstep, int mad) {
    uint8_t Laux[32];
    float mn = x[0], mx = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0) mn = 0;
    if (mx == mn) {
        memset(L, 0, (size_t)n);
        *neg_min = -mn;
        return 0.f;
    }
    float iscale = nmax / (mx - mn), scale = 1 / iscale, best_err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)imax(0, imin(nmax, nearest_int(iscale * (x[i] - mn))));
        float diff = scale * L[i] + mn - x[i];
        best_err += w[i] * (mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (mx - mn);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(0, imin(nmax, nearest_int(iscale * (x[i] - mn))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            err += w[i] * (mad ? fabsf(diff) : diff * diff);
        }
        if (err < best_err) {
            memcpy(L, Laux, (size_t)n);
            best_err = err;
            scale = this_scale;
            mn = this_min;
        }
    }
    *neg_min = -mn;
    return scale;
}

/* Symmetric fit of n values to -nmax..nmax-1 (ggml's make_qx_quants with
 * rmse_type 1, no weights): tries 19 grid stretches around nmax/max and keeps
 * the best x^2-weighted least-squares scale. L gets the quants + nmax. */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float max = signed_absmax(x, n);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric fit of n values to -nmax..nmax-1 for Q3_K (ggml's make_q3_quants
 * with its rmse search): from the nmax/max grid, up to 5 passes that move one
 * quant at a time to the value that most improves the x^2-weighted
 * least-squares fit. L gets the quants + nmax; returns the fitted scale. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    const float max = signed_absmax(x, n);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * L[i] * L[i];
            const int l = imax(-nmax, imin(nmax - 1, nearest_int(x[i] * sl2 / slx)));
            if (l == L[i]) continue;
            slx += w * x[i] * l;
            sl2 += w * l * l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Packs four 2-bit quants of each 128 into Q2_K/Q3_K's qs (element j + 32 s
 * of a 128 in bits 2s of byte j). */
static void pack_q2(const uint8_t L[QK_K], uint8_t qs[QK_K / 4]) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* Q2_K: per 16 values an asymmetric 2-bit fit weighted by |x| against the
 * absolute error; the 16 scales and mins to 4 bits against the block's
 * largest, then the values re-fitted to the rounded ones. */
static void q_q2_K(const float *x, block_q2_K *y, int64_t nb) {
    uint8_t L[QK_K];
    float w[16], scales[16], mins[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = f2h(0.f);
        y[i].dmin = f2h(0.f);
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = f2h(max_scale / 15.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; j++) y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = f2h(max_min / 15.f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = h2f(y[i].d) * (y[i].scales[j] & 0xF);
            if (d == 0.0f) continue;
            const float dm = h2f(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)imax(0, imin(3, nearest_int((x[16 * j + l] + dm) / d)));
        }
        pack_q2(L, y[i].qs);
    }
}

/* Fits the 16 sub-blocks of a superblock with fit (fit_scale_q3 or
 * fit_scale_sym) and returns the scale largest in magnitude (the first on a
 * tie), which Q3_K and Q6_K quantize the others against. */
static float fit_sub16(float (*fit)(int, int, const float *, int8_t *), int nmax, const float *x, int8_t L[QK_K],
                       float scales[16]) {
    float max_scale = 0, amax = 0;
    for (int s = 0; s < 16; s++) {
        scales[s] = fit(16, nmax, x + 16 * s, L + 16 * s);
        if (fabsf(scales[s]) > amax) {
            amax = fabsf(scales[s]);
            max_scale = scales[s];
        }
    }
    return max_scale;
}

/* Q3_K: per 16 values a symmetric 3-bit fit (fit_scale_q3); the 16 scales to
 * 6 bits against the largest in magnitude (low nibbles in bytes 0-7, high
 * pairs in 8-11), the values re-fitted; the third bit of each quant in hmask
 * (bit j/32 of byte j%32). */
static void q_q3_K(const float *x, block_q3_K *y, int64_t nb) {
    int8_t L[QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float max_scale = fit_sub16(fit_scale_q3, 4, x, L, scales);
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = f2h(0.f);
        if (max_scale != 0.0f) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = imax(-32, imin(31, nearest_int(iscale * scales[j]))) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = f2h(1 / iscale);
        }
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
            const int sc = (lo | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            const float d = h2f(y[i].d) * sc;
            if (d == 0.0f) continue;
            for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(imax(-4, imin(3, nearest_int(x[16 * j + l] / d))) + 4);
        }
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        uint8_t U[QK_K];
        for (int j = 0; j < QK_K; j++) {
            U[j] = (uint8_t)(L[j] & 3);
            if (L[j] > 3) y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
        }
        pack_q2(U, y[i].qs);
    }
}

/* Packs 8 six-bit scales and mins into Q4_K/Q5_K's 12 bytes. */
static void pack_scale_min_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t out[12]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            out[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Q4_K and Q5_K share the scheme: per 32 values an asymmetric fit weighted by
 * rms + |x|, the 8 scales and mins re-quantized to 6 bits against the block's
 * largest, then the values re-fitted to the rounded scales. Fills L with the
 * quants (0..nmax) and the scale fields; the caller packs L. */
static void qk_fit_block(const float *x, int nmax, float rmin, int nstep, uint8_t L[QK_K], uint16_t *d_out,
                         uint16_t *dmin_out, uint8_t packed[12]) {
    uint8_t ls[8], lm[8];
    float w[32], mins[8], scales[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        /* the uint8 truncation before the clamp is ggml's */
        ls[j] = (uint8_t)imin(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        lm[j] = (uint8_t)imin(63, (uint8_t)nearest_int(inv_min * mins[j]));
    }
    memset(packed, 0, 12);
    pack_scale_min_k4(ls, lm, packed);
    *d_out = f2h(max_scale / 63.f);
    *dmin_out = f2h(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        scale_min_k4(j, packed, &sc, &mn);
        const float d = h2f(*d_out) * sc;
        if (d == 0.0f) continue;
        const float dm = h2f(*dmin_out) * mn;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)imax(0, imin(nmax, nearest_int((x[32 * j + l] + dm) / d)));
    }
}

static void q_q4_K(const float *x, block_q4_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        qk_fit_block(x, 15, -1.f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; l++) y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void q_q5_K(const float *x, block_q5_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        qk_fit_block(x, 31, -0.5f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) {
                int lo = L[j + l], hi = L[j + l + 32];
                y[i].qh[l] |= (uint8_t)(((lo >> 4) << (j / 32)) | ((hi >> 4) << (j / 32 + 1)));
                y[i].qs[j / 2 + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
            }
        }
    }
}

static void q_q6_K(const float *x, block_q6_K *y, int64_t nb) {
    int8_t L[QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float max_scale = fit_sub16(fit_scale_sym, 32, x, L, scales), max_abs = fabsf(max_scale);
        memset(&y[i], 0, sizeof y[i]);
        if (max_abs < 1e-15f) continue; /* all zero: d = 0 */
        const float iscale = -128.f / max_scale;
        y[i].d = f2h(1 / iscale);
        for (int s = 0; s < 16; s++) y[i].scales[s] = (int8_t)imin(127, nearest_int(iscale * scales[s]));
        for (int s = 0; s < 16; s++) {
            const float d = h2f(y[i].d) * y[i].scales[s];
            if (d == 0.0f) continue;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (int8_t)(imax(-32, imin(31, nearest_int(x[16 * s + l] / d))) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

int tl_quantize_row(tl_type type, const float *src, void *dst, int64_t n) {
    const tl_type_traits *t = tl_type_info((uint32_t)type);
    if (!t || n < 0 || n % t->block_size) return -1;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case TL_Q4_0: q_q4_0(src, dst, nb); return 0;
    case TL_Q4_1: q_q4_1(src, dst, nb); return 0;
    case TL_Q5_0: q_q5_0(src, dst, nb); return 0;
    case TL_Q5_1: q_q5_1(src, dst, nb); return 0;
    case TL_Q8_0: q_q8_0_ref(src, dst, nb); return 0;
    case TL_Q2_K: q_q2_K(src, dst, nb); return 0;
    case TL_Q3_K: q_q3_K(src, dst, nb); return 0;
    case TL_Q4_K: q_q4_K(src, dst, nb); return 0;
    case TL_Q5_K: q_q5_K(src, dst, nb); return 0;
    case TL_Q6_K: q_q6_K(src, dst, nb); return 0;
    case TL_MXFP4: q_mxfp4(src, dst, nb); return 0;
    case TL_IQ4_NL: q_iq4_nl(src, dst, nb); return 0;
    case TL_IQ4_XS: q_iq4_xs(src, dst, nb); return 0;
    default: return tl_quantize_row_act(type, src, dst, n);
    }
}

/* ---- reference dot products ------------------------------------------------------ */

/* Float formats: products rounded to float, summed in double, in order. */

static float dot_bf16(int64_t n, const uint16_t *x, const uint16_t *y) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)(tl_bf16_to_fp32(x[i]) * tl_bf16_to_fp32(y[i]));
    return (float)s;
}

/* The quantized dots reproduce llama.cpp's x86 AVX2 kernels bit for bit, since
 * a different float order in one matmul output flips the rounding of the next
 * 8-bit activation quantization. Their shape: per block, 8 float lanes that
 * hold exact integer partial sums, lane k the products of elements 4k..4k+3
 * (maddubs + madd); each lane gets acc[k] = fma(d, lane[k], acc[k]), block
 * after block; then ggml's hsum_float_8 tree below. */
static float hsum8(const float a[8]) {
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

/* w x a the way ggml multiplies signed bytes: |w| times a with w's sign
 * (vpsignb), where negating a = -128 wraps back to -128. Only reachable with
 * a = -128, which the activation quantizers never produce; kept so every level
 * agrees on any bytes. */
static inline int mul_signed(int w, int a) {
    int s = w < 0 ? -a : w ? a : 0;
    if (s == 128) s = -128;
    return (w < 0 ? -w : w) * s;
}

/* A 32-block's 8 lanes: q the weight quants in element order. */
static void lanes32(const int q[32], const int8_t *a, int is_signed, float lane[8]) {
    for (int k = 0; k < 8; k++) {
        int s = 0;
        for (int j = 4 * k; j < 4 * k + 4; j++) s += is_signed ? mul_signed(q[j], a[j]) : q[j] * a[j];
        lane[k] = (float)s;
    }
}

static void unpack_q4(const uint8_t *qs, int off, int q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) - off;
        q[j + 16] = (qs[j] >> 4) - off;
    }
}

/* Q4_0, Q5_0, Q8_0: scale d_w * d_a per block. */
static float dot_sym32(tl_type t, int64_t nb, const void *w, const block_q8_0 *y) {
    float acc[8] = {0}, lane[8];
    int q[32];
    for (int64_t i = 0; i < nb; i++) {
        uint16_t dw;
        if (t == TL_Q4_0) {
            const block_q4_0 *x = (const block_q4_0 *)w + i;
            unpack_q4(x->qs, 8, q);
            dw = x->d;
        } else if (t == TL_Q5_0) {
            const block_q5_0 *x = (const block_q5_0 *)w + i;
            q5_unpack(x->qs, x->qh, q);
            for (int j = 0; j < 32; j++) q[j] -= 16;
            dw = x->d;
        } else {
            const block_q8_0 *x = (const block_q8_0 *)w + i;
            for (int j = 0; j < 32; j++) q[j] = x->qs[j];
            dw = x->d;
        }
        lanes32(q, y[i].qs, 1, lane);
        const float d = h2f(dw) * h2f(y[i].d);
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, lane[k], acc[k]);
    }
    return hsum8(acc);
}

/* Q4_1, Q5_1 (x = d*q + m): plus m_w * s_a per block, a separate running sum
 * that ggml's compiler contracts into a scalar fma, added at the end. */
static float dot_asym32(tl_type t, int64_t nb, const void *w, const block_q8_1 *y) {
    float acc[8] = {0}, lane[8], summs = 0.0f;
    int q[32];
    for (int64_t i = 0; i < nb; i++) {
        uint16_t dw, mw;
        if (t == TL_Q4_1) {
            const block_q4_1 *x = (const block_q4_1 *)w + i;
            unpack_q4(x->qs, 0, q);
            dw = x->d, mw = x->m;
        } else {
            const block_q5_1 *x = (const block_q5_1 *)w + i;
            q5_unpack(x->qs, x->qh, q);
            dw = x->d, mw = x->m;
        }
        lanes32(q, y[i].qs, 0, lane);
        const float d = h2f(dw) * h2f(y[i].d);
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, lane[k], acc[k]);
        summs = fmaf(h2f(mw), h2f(y[i].s), summs);
    }
    return hsum8(acc) + summs;
}

/* F32 as tinyBLAS (AVX2) computes llama.cpp's F32-weight matmuls: the same
 * single 8-lane fma chain and tree as F16 below. */
static float dot_f32(int64_t n, const float *x, const float *y) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] = fmaf(x[i + k], y[i + k], acc[k]);
    float s = hsum8(acc);
    for (; i < n; i++) s = fmaf(x[i], y[i], s);
    return s;
}

/* F16 as llamafile's tinyBLAS (AVX2 + F16C) computes an output of llama.cpp's
 * attention scores: one 8-lane fma accumulator over chunks of 8, then
 * hsum_float_8. A tail shorter than 8 (never for head sizes) goes on in order. */
static float dot_f16(int64_t n, const uint16_t *x, const uint16_t *y) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] = fmaf(h2f(x[i + k]), h2f(y[i + k]), acc[k]);
    float s = hsum8(acc);
    for (; i < n; i++) s = fmaf(h2f(x[i]), h2f(y[i]), s);
    return s;
}

/* Q2_K, Q3_K: per super-block an integer sum of scale * (q . q8) and, with
 * mins, of min * bsum; one float update per block. Not ggml's float order.
 * The AVX2 level (kern_avx2.c) computes the same integers, so the same bits. */
static float dot_q2_K(int64_t nb, const block_q2_K *x, const block_q8_K *y) {
    float s = 0;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0, summs = 0;
        for (int g = 0; g < 16; g++) {
            int sub = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) sub += y[i].qs[e] * q2_field(x[i].qs, e);
            isum += (x[i].scales[g] & 0xF) * sub;
            summs += y[i].bsums[g] * (x[i].scales[g] >> 4);
        }
        const float dall = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        s += dall * (float)isum - dmin * (float)summs;
    }
    return s;
}

static float dot_q3_K(int64_t nb, const block_q3_K *x, const block_q8_K *y) {
    float s = 0;
    int8_t sc[16];
    for (int64_t i = 0; i < nb; i++) {
        tl_q3k_scales(x[i].scales, sc);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int sub = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) sub += y[i].qs[e] * q3_value(&x[i], e);
            isum += sc[g] * sub;
        }
        s += h2f(x[i].d) * y[i].d * (float)isum;
    }
    return s;
}

/* Q4_K as llama.cpp runs it on AVX2: its weights are repacked (q4_K_8x8, CPU
 * "extra buffer"), and one token's row goes through ggml_gemv_q4_K_8x8_q8_K:
 * per super-block the exact integer sums of scale*(q.q8) and of min*bsum,
 * each accumulated with one fma, the min total subtracted at the end.
 * (A batch's groups of 4 rows go through the gemm, which fmas per 64.) */
static float dot_q4_K(int64_t nb, const block_q4_K *x, const block_q8_K *y) {
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0, imin = 0;
        for (int g = 0; g < 8; g++) {
            uint8_t sc, mn;
            scale_min_k4(g, x[i].scales, &sc, &mn);
            int sub = 0;
            for (int e = 32 * g; e < 32 * g + 32; e++) sub += y[i].qs[e] * q4k_value(x[i].qs, e);
            isum += sc * sub;
            imin += mn * (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]);
        }
        acc = fmaf((float)isum, h2f(x[i].d) * y[i].d, acc);
        accm = fmaf((float)imin, h2f(x[i].dmin) * y[i].d, accm);
    }
    return acc - accm;
}

/* Q5_K, ggml's AVX2 vec_dot: int32 lane k = sum over the 8 sub-blocks of
 * scale * (products of the sub-block's elements 4k..4k+3); the min term is a
 * scalar running fma of -d_a*dmin_w with the block's integer sum. */
static float dot_q5_K(int64_t nb, const block_q5_K *x, const block_q8_K *y) {
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int lane[8] = {0}, imin = 0;
        for (int g = 0; g < 8; g++) {
            uint8_t sc, mn;
            scale_min_k4(g, x[i].scales, &sc, &mn);
            for (int k = 0; k < 8; k++) {
                int sub = 0;
                for (int e = 32 * g + 4 * k; e < 32 * g + 4 * k + 4; e++) sub += y[i].qs[e] * q5k_value(&x[i], e);
                lane[k] += sc * sub;
            }
            imin += mn * (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]);
        }
        const float d = y[i].d * h2f(x[i].d), dmin = -y[i].d * h2f(x[i].dmin);
        for (int k = 0; k < 8; k++) acc[k] = fmaf(d, (float)lane[k], acc[k]);
        summs = fmaf(dmin, (float)imin, summs);
    }
    return hsum8(acc) + summs;
}

/* Q6_K, ggml's AVX2 vec_dot: unsigned quants u = q + 32; int32 lane k holds,
 * for each 32-chunk c of each 128-half h, scale[8h + 2c + k/4] times the
 * products of the chunk's elements 4k..4k+3, minus 32 * (bsum * scale) of the
 * groups 2k and 2k+1. Those lanes can pass 2^24, so their exact grouping
 * matters for the float conversion too. */
static float dot_q6_K(int64_t nb, const block_q6_K *x, const block_q8_K *y) {
    float acc[8] = {0};
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *sc = x[i].scales;
        for (int k = 0; k < 8; k++) {
            int lane = -32 * (y[i].bsums[2 * k] * sc[2 * k] + y[i].bsums[2 * k + 1] * sc[2 * k + 1]);
            for (int h = 0; h < 2; h++)
                for (int c = 0; c < 4; c++) {
                    const int base = 128 * h + 32 * c + 4 * k;
                    int sub = 0;
                    for (int e = base; e < base + 4; e++) sub += (q6k_value(&x[i], e) + 32) * y[i].qs[e];
                    lane += sc[8 * h + 2 * c + k / 4] * sub;
                }
            acc[k] = fmaf(y[i].d * h2f(x[i].d), (float)lane, acc[k]);
        }
    }
    return hsum8(acc);
}

/* ggml_vec_dot_mxfp4_q8_0 and ggml_vec_dot_iq4_nl_q8_0 on AVX2 (mx: which):
 * blocks in pairs, even ones into one 8-lane accumulator and odd ones into
 * another, each lane the exact sum of 4 products (the block's low nibbles,
 * then its high ones, through the table) times (q8's d times the block's
 * scale) by fma; the two added lane by lane, then the x86 horizontal-sum
 * tree; an odd last block added after. */
static float dot_lut_pairs(int mx, int64_t nb, const void *vx, const block_q8_0 *y) {
    const size_t bs = mx ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const int8_t *tv = mx ? tl_kvalues_mxfp4 : tl_kvalues_iq4nl;
    float acc[2][8] = {{0}}, sumf;
    int64_t ib = 0;
    for (; ib + 1 < nb; ib += 2)
        for (int h = 0; h < 2; h++) {
            const uint8_t *b = (const uint8_t *)vx + (size_t)(ib + h) * bs, *qs = b + (mx ? 1 : 2);
            const block_q8_0 *a = &y[ib + h];
            const float scale = h2f(a->d) * (mx ? tl_e8m0_half(b[0]) : h2f(load_u16(b)));
            for (int l = 0; l < 8; l++) {
                int sum = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * l + k;
                    sum += tv[e < 16 ? qs[e] & 0x0F : qs[e - 16] >> 4] * a->qs[e];
                }
                acc[h][l] = fmaf(scale, (float)sum, acc[h][l]);
            }
        }
    float r[4];
    for (int l = 0; l < 4; l++) r[l] = (acc[0][l + 4] + acc[1][l + 4]) + (acc[0][l] + acc[1][l]);
    sumf = (r[0] + r[2]) + (r[1] + r[3]);
    for (; ib < nb; ib++) {
        const uint8_t *b = (const uint8_t *)vx + (size_t)ib * bs, *qs = b + (mx ? 1 : 2);
        const float d = h2f(y[ib].d) * (mx ? tl_e8m0_half(b[0]) : h2f(load_u16(b)));
        int s1 = 0, s2 = 0;
        for (int j = 0; j < 16; j++) {
            s1 += y[ib].qs[j] * tv[qs[j] & 0x0F];
            s2 += y[ib].qs[j + 16] * tv[qs[j] >> 4];
        }
        sumf += d * (float)(s1 + s2);
    }
    return sumf;
}

float tl_vec_dot_iq4_nl_ggml(int64_t n, const void *w, const void *a) { return dot_lut_pairs(0, n / QK4_NL, w, a); }

/* IQ4_NL as llama.cpp multiplies a matrix it does not repack (rows not a
 * multiple of 8) in a prompt: tinyBLAS_Q0_AVX (llamafile_sgemm takes IQ4_NL
 * for 2+ tokens), one 8-lane chain over every block, each lane the exact sum
 * of 4 products (the block's low nibbles then its high ones) times the two
 * scales' product by fma, then the x86 horizontal-sum tree. (Its one-token
 * ggml_vec_dot_iq4_nl_q8_0, MXFP4's two chains, is what mul_mat_id takes:
 * kern_ref.c's vec_dot_id.) */
static float dot_iq4_nl(int64_t nb, const block_iq4_nl *x, const block_q8_0 *y) {
    float acc[8] = {0};
    for (int64_t ib = 0; ib < nb; ib++) {
        const float scale = h2f(x[ib].d) * h2f(y[ib].d);
        for (int l = 0; l < 8; l++) {
            int sum = 0;
            for (int k = 0; k < 4; k++) {
                const int e = 4 * l + k;
                const uint8_t q = e < 16 ? x[ib].qs[e] & 0x0F : x[ib].qs[e - 16] >> 4;
                sum += tl_kvalues_iq4nl[q] * y[ib].qs[e];
            }
            acc[l] = fmaf(scale, (float)sum, acc[l]);
        }
    }
    float r[4];
    for (int l = 0; l < 4; l++) r[l] = acc[l + 4] + acc[l];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

/* ggml_vec_dot_iq4_xs_q8_K on AVX2: per super-block, 8 int32 lanes, lane l
 * the exact sum over sub-blocks of scale times the 4 products 4l..4l+3 of
 * each; then one fma per lane with d times q8's d; the horizontal-sum tree. */
static float dot_iq4_xs(int64_t nb, const block_iq4_xs *x, const block_q8_K *y) {
    float acc[8] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int32_t lane[8] = {0};
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int ls = tl_iq4_xs_scale(&x[i], ib);
            const uint8_t *qs = x[i].qs + 16 * ib;
            const int8_t *q8 = y[i].qs + 32 * ib;
            for (int l = 0; l < 8; l++) {
                int sum = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * l + k;
                    const uint8_t q = e < 16 ? qs[e] & 0x0F : qs[e - 16] >> 4;
                    sum += tl_kvalues_iq4nl[q] * q8[e];
                }
                lane[l] += ls * sum;
            }
        }
        const float d = h2f(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    float r[4];
    for (int l = 0; l < 4; l++) r[l] = acc[l + 4] + acc[l];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

float tl_vec_dot_ref(tl_type type, int64_t n, const void *w, const void *a) {
    const tl_type_traits *t = tl_type_info((uint32_t)type);
    if (!t || !t->can_dot || n < 0 || n % t->block_size) return NAN;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case TL_F32: return dot_f32(n, w, a);
    case TL_F16: return dot_f16(n, w, a);
    case TL_BF16: return dot_bf16(n, w, a);
    case TL_Q4_0:
    case TL_Q5_0:
    case TL_Q8_0: return dot_sym32(type, nb, w, a);
    case TL_Q4_1:
    case TL_Q5_1: return dot_asym32(type, nb, w, a);
    case TL_Q2_K: return dot_q2_K(nb, w, a);
    case TL_Q3_K: return dot_q3_K(nb, w, a);
    case TL_Q4_K: return dot_q4_K(nb, w, a);
    case TL_Q5_K: return dot_q5_K(nb, w, a);
    case TL_Q6_K: return dot_q6_K(nb, w, a);
    case TL_MXFP4: return dot_lut_pairs(1, nb, w, a);
    case TL_IQ4_NL: return dot_iq4_nl(nb, w, a);
    case TL_IQ4_XS: return dot_iq4_xs(nb, w, a);
    default: return NAN;
    }
}

const char *tl_supported_weight_types(void) {
    return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4";
}
