/* cpu/attn512: the fast attention's per-block work on 512-bit vectors, for
 * tl_attn_drive (cpu/mathfn.h). A key block's 16 slots fill one vector, so a
 * score row is one fma per dimension, and V sums go 16 dimensions at a time.
 * Every row's float operations are those of the scalar reference in mathfn.c
 * (one fma chain per score over the dimensions, the same softmax and sum
 * tree, V by fma in key order), so the bits equal every other level's.
 * Included by kern_avx512.c; defines attn512_fill(). */
#ifndef TL_CPU_ATTN512_H
#define TL_CPU_ATTN512_H

#include "cpu/mathfn.h"

/* The quantized instances of the decode path (attn512_direct) double this
 * file's compile time, which the SIMDe-emulated build (tests/simde) pays
 * many times over under ASan; it sets TL_ATTN512_QDIRECT 0 and runs
 * quantized decode through the widening path (the same bits). */
#ifndef TL_ATTN512_QDIRECT
#define TL_ATTN512_QDIRECT 1
#endif

/* The maxima of eight 8-lane rows, row r in lane r. */
AI __m256 attn512_max8x8(const __m256 *h) {
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_max_ps(_mm256_unpacklo_ps(h[2 * i], h[2 * i + 1]), _mm256_unpackhi_ps(h[2 * i], h[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        b[i] = _mm256_max_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xee));
    return _mm256_max_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

/* The sums of eight 8-lane rows, row r in lane r, each by the tree
 * ((0+4)+(2+6)) + ((1+5)+(3+7)) that hsum_f8 uses: the same pairs added in
 * the same order, eight rows at a time. */
AI __m256 attn512_sum8x8(const __m256 *h) {
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++) /* (row 2i lanes i+(i+4) | row 2i+1's) */
        a[i] = _mm256_add_ps(_mm256_permute2f128_ps(h[2 * i], h[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(h[2 * i], h[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++) /* (0+4)+(2+6) and (1+5)+(3+7) of rows 4i, 4i+2 | 4i+1, 4i+3 */
        b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xee));
    /* lanes (0, 2, 4, 6 | 1, 3, 5, 7) */
    const __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], 0x88), _mm256_shuffle_ps(b[0], b[1], 0xdd));
    return _mm256_permutevar8x32_ps(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* exp of 16 lanes: tl_expf_fast's steps (mathfn.c's expf8) on 512 bits,
 * inline, so the softmax needs no call and no trip through memory. */
AI __m512 attn512_exp(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(z), 23);
    const __m512 k = _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_castps_si512(_mm512_set1_ps(1))));
    const __m512 absn = _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(_mm512_set1_ps(-0.0f)),
                                                                _mm512_castps_si512(n)));
    const __mmask16 c = _mm512_cmp_ps_mask(absn, _mm512_set1_ps(126), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_mul_ps(_mm512_set1_ps(0x1.ffffecp-1f), b));
    const __m512 normal = _mm512_fmadd_ps(j, k, k);
    if (!c) return normal;
    const __m512i g = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                             _mm512_set1_epi32((int)0x82000000u));
    const __m512 s1 = _mm512_castsi512_ps(_mm512_add_epi32(g, _mm512_set1_epi32(0x7f000000)));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_sub_epi32(e, g));
    const __mmask16 d = _mm512_cmp_ps_mask(absn, _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 big = _mm512_mul_ps(_mm512_fmadd_ps(s2, j, s2), s1);
    return _mm512_mask_blend_ps(d, _mm512_mask_blend_ps(c, normal, big), _mm512_mul_ps(s1, s1));
}

/* 16 floats at element i of p: f32, or f16 widened (exactly) on the load. */
AI __m512 attn512_ld(const void *p, size_t i, int f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

AI __m256 attn512_ld8(const void *p, size_t i, int f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* 16 quants of a row from element c (c % 16 == 0) as floats, without
 * their d: Q8_0 (fmt 2) or Q4_0 (3). */
AI __m512 attn512_ldq(const uint8_t *row, int c, int fmt) {
    const uint8_t *b = row + (size_t)(c / 32) * (fmt == 2 ? 34 : 18);
    __m128i q;
    if (fmt == 2) {
        q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2 + c % 32));
    } else {
        q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
        if (c % 32) q = _mm_srli_epi16(q, 4);
        q = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

/* PASS(RN) with RN the constant equal to rn (1 to 4): the V sums' row
 * counts, each its own unrolled instance. */
#define ATTN512_BY_RN(rn, PASS)         \
    do {                                \
        switch (rn) {                   \
        case 1: PASS(1); break;         \
        case 2: PASS(2); break;         \
        case 3: PASS(3); break;         \
        default: PASS(4); break;        \
        }                               \
    } while (0)

/* tl_attn_vw and tl_attn_vo on 16 lanes. */
AI __m512 attn512_vw(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ);
    const __m512i u = _mm512_castps_si512(x);
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    return _mm512_maskz_mov_ps(keep, _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u))));
}

AI __m512 attn512_vo(__m512 o, __m512 alv) {
    const __m512 x = _mm512_mul_ps(o, alv);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ), x);
}

/* Group g's d of a quantized V block's 16 slots: widened (fmt 0: vd, as
 * [group][slot]) or from the cache's rows vs bytes apart (fmt 2, 3). */
AI __m512 attn512_vd(const void *vb, const float *vd, size_t vs, int g, int fmt) {
    if (fmt == 0) return _mm512_loadu_ps(vd + 16 * g);
    const uint8_t *b = (const uint8_t *)vb + (size_t)g * (fmt == 2 ? 34 : 18);
#if TL_ATTN512_QDIRECT
    /* each slot's d and the two bytes after it (its first quants) */
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)vs));
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(at, (const void *)b, 1)));
#else
    uint16_t h[16];
    for (int j = 0; j < 16; j++) memcpy(&h[j], b + (size_t)j * vs, 2);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)h));
#endif
}

/* R rows' weights w[r][g*16 + j] = tl_attn_vw(p_rj x d_jg) for ng groups,
 * p rows 16 apart (0 where not live). */
AI void attn512_vweights(int ng, int R, const float *p, const void *vb, const float *vd, size_t vs, int fmt,
                         float (*w)[8 * 16]) {
    for (int g = 0; g < ng; g++) {
        const __m512 d = attn512_vd(vb, vd, vs, g, fmt);
        for (int r = 0; r < R; r++) _mm512_storeu_ps(w[r] + 16 * g, attn512_vw(_mm512_mul_ps(_mm512_loadu_ps(p + 16 * r), d)));
    }
}

/* A quantized V's sum (mathfn.h) for R rows, slots st..st+n-1 with weights
 * w (attn512_vweights): o from tl_attn_vo, then fma(w, q, o) in key order,
 * W (16, 32 or 64) dimensions per pass from c0 on. The quants widened as
 * floats (fmt 0, rows hd apart) or the cache's rows (2, 3; vs bytes apart). */
AI void attn512_pvq_t(int hd, int R, int W, int c0, float *const *o, const float *al, const float (*w)[8 * 16], int st,
                      int n, const void *vf, size_t vs, int fmt) {
    for (; c0 + W <= hd; c0 += W) {
        __m512 acc[4][4];
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int i = 0; i < W / 16; i++) {
                const __m512 ov = _mm512_loadu_ps(o[r] + c0 + 16 * i);
                acc[r][i] = al[r] == 1.0f ? ov : attn512_vo(ov, _mm512_set1_ps(al[r]));
            }
        for (int j = st; j < st + n; j++) {
            __m512 v[4];
            UNROLL
            for (int i = 0; i < W / 16; i++)
                v[i] = fmt ? attn512_ldq((const uint8_t *)vf + (size_t)j * vs, c0 + 16 * i, fmt)
                           : _mm512_loadu_ps((const float *)vf + (size_t)j * hd + c0 + 16 * i);
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
                for (int h = 0; h < (W + 31) / 32; h++) { /* a weight per group: c0 % 32 == 0 or W == 16 */
                    const __m512 wb = _mm512_set1_ps(w[r][(c0 + 32 * h) / 32 * 16 + j]);
                    UNROLL
                    for (int i = 2 * h; i < 2 * h + 2; i++)
                        if (i < W / 16) acc[r][i] = _mm512_fmadd_ps(wb, v[i], acc[r][i]);
                }
        }
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int i = 0; i < W / 16; i++) _mm512_storeu_ps(o[r] + c0 + 16 * i, acc[r][i]);
    }
}

/* o = o*alpha, then o = fma(p_j, v_j, o) for the n keys, R rows sharing the
 * V loads, W (16, 32 or 64) dimensions per pass from c0 on. fmt: V rows of
 * f32 (0) or f16 (1) vs elements apart (a quantized V: attn512_pvq_t). */
AI void attn512_pv_t(int hd, int R, int W, int c0, float *const *o, const float *al, const float *const *p, int n,
                     const void *vf, size_t vs, int fmt) {
    for (; c0 + W <= hd; c0 += W) {
        __m512 acc[4][4];
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int i = 0; i < W / 16; i++)
                acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o[r] + c0 + 16 * i), _mm512_set1_ps(al[r]));
        for (int j = 0; j < n; j++) {
            const size_t vj = (size_t)j * vs + (size_t)c0;
            __m512 v[4];
            UNROLL
            for (int i = 0; i < W / 16; i++) v[i] = attn512_ld(vf, vj + 16 * (size_t)i, fmt);
            UNROLL
            for (int r = 0; r < R; r++) {
                const __m512 pj = _mm512_set1_ps(p[r][j]);
                UNROLL
                for (int i = 0; i < W / 16; i++) acc[r][i] = _mm512_fmadd_ps(pj, v[i], acc[r][i]);
            }
        }
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int i = 0; i < W / 16; i++) _mm512_storeu_ps(o[r] + c0 + 16 * i, acc[r][i]);
    }
}

AI void attn512_pv(int hd, int R, int W, int c0, float *const *o, const float *al, const float *const *p, int n,
                   const float *vf) {
    attn512_pv_t(hd, R, W, c0, o, al, p, n, vf, (size_t)hd, 0);
}

/* Element d of a transposed K block's 16 keys: f32 (fmt 0) or f16 (1). */
AI __m512 attn512_ldk(const void *kt, int d, int fmt) { return attn512_ld(kt, (size_t)d * 16, fmt); }

/* Four bytes as one int32 (a broadcast operand of vpdpbusd). */
AI int32_t attn512_q4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* R rows' integer scores (a quantized K, tl_attn_kint) against an integer K
 * block (tl_attn_kint_bytes: the cache's transposed block or its copy): per
 * group and run of 4 quants one vpdpbusd per row, K unsigned (Q8_0: k + 128
 * by its sign bit flipped; Q4_0: the nibble, k + 8) times the row's 4 signed
 * q8, from -(128 or 8) * the row's q8 sum over the group: the exact sum of
 * q8 * k8. Then the group's fma, as mathfn.c's reference. VNNI only. */
AI void attn512_scores_int(const tl_attn_rows *a, int R, const float *const *q, const uint8_t *kt, float *out) {
    const int ng = a->hd / 32, q8 = a->k_fmt == TL_ATTN_Q8_0;
    const size_t gb = (size_t)16 * (q8 ? 34 : 18);
    const int bias = q8 ? 128 : 8;
    __m512 acc[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        const uint8_t *gp = kt + (size_t)g * gb, *qs = gp + 32;
        /* two chains per row (runs 0-3, 4-7): a chain of 8 would wait on
         * vpdpbusd's latency */
        __m512i is[8], is2[8];
        const int8_t *qv[8];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            int32_t sum;
            memcpy(&sum, (const uint8_t *)(const void *)(q[r] + ng) + 4 * (size_t)g, 4);
            is[r] = _mm512_set1_epi32(-bias * sum);
            is2[r] = _mm512_setzero_si512();
            qv[r] = (const int8_t *)(const void *)(q[r] + 2 * ng) + 32 * g;
        }
#define QW(r, j) _mm512_set1_epi32(attn512_q4(qv[r] + 4 * (j)))
        if (q8) {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m512i f = _mm512_set1_epi8((char)0x80);
                const __m512i k0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qs + 64 * j)), f);
                const __m512i k1 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qs + 64 * (j + 4))), f);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    is[r] = _mm512_dpbusd_epi32(is[r], k0, QW(r, j));
                    is2[r] = _mm512_dpbusd_epi32(is2[r], k1, QW(r, j + 4));
                }
            }
        } else {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m512i b = _mm512_loadu_si512((const void *)(qs + 64 * j)), m4 = _mm512_set1_epi8(15);
                const __m512i lo = _mm512_and_si512(b, m4), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    is[r] = _mm512_dpbusd_epi32(is[r], lo, QW(r, j));
                    is2[r] = _mm512_dpbusd_epi32(is2[r], hi, QW(r, j + 4));
                }
            }
        }
#undef QW
        const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp));
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(is[r], is2[r])),
                                     _mm512_mul_ps(_mm512_set1_ps(q[r][g]), dk), acc[r]);
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + 16 * r, acc[r]);
}

#define ATTN512_SCORES_INT(R)                                                                                     \
    __attribute__((noinline)) static void attn512_scores_int_##R(const tl_attn_rows *a, const float *const *q,   \
                                                                 const uint8_t *kt, float *out) {                \
        attn512_scores_int(a, R, q, kt, out);                                                                     \
    }
ATTN512_SCORES_INT(1)
ATTN512_SCORES_INT(2)
ATTN512_SCORES_INT(3)
ATTN512_SCORES_INT(4)
ATTN512_SCORES_INT(5)
ATTN512_SCORES_INT(6)
ATTN512_SCORES_INT(7)
ATTN512_SCORES_INT(8)
#undef ATTN512_SCORES_INT

AI void attn512_scores_int_call(const tl_attn_rows *a, int R, const float *const *q, const void *kt, float *out) {
    const uint8_t *k = kt;
    switch (R) {
    case 1: attn512_scores_int_1(a, q, k, out); break;
    case 2: attn512_scores_int_2(a, q, k, out); break;
    case 3: attn512_scores_int_3(a, q, k, out); break;
    case 4: attn512_scores_int_4(a, q, k, out); break;
    case 5: attn512_scores_int_5(a, q, k, out); break;
    case 6: attn512_scores_int_6(a, q, k, out); break;
    case 7: attn512_scores_int_7(a, q, k, out); break;
    default: attn512_scores_int_8(a, q, k, out); break;
    }
}

/* attn512_scores_int for two blocks (kt0, kt1) at once: each broadcast of a
 * row's four q8 serves both blocks' vpdpbusd, and the two blocks' chains are
 * independent, so one chain per row and block (16 registers at 8 rows)
 * replaces the two per row the one-block form needs against vpdpbusd's
 * latency. The group's float step goes through out (the float accumulators
 * would not fit beside the integer chains); every score gets the same
 * integer sums and the same fmas in the same order as attn512_scores_int. */
AI void attn512_scores_int2(const tl_attn_rows *a, int R, const float *const *q, const uint8_t *kt0,
                            const uint8_t *kt1, float *out0, float *out1) {
    const int ng = a->hd / 32, q8 = a->k_fmt == TL_ATTN_Q8_0;
    const size_t gb = (size_t)16 * (q8 ? 34 : 18);
    const int bias = q8 ? 128 : 8;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out0 + 16 * r, _mm512_setzero_ps());
        _mm512_storeu_ps(out1 + 16 * r, _mm512_setzero_ps());
    }
    for (int g = 0; g < ng; g++) {
        const uint8_t *gp0 = kt0 + (size_t)g * gb, *gp1 = kt1 + (size_t)g * gb, *qs0 = gp0 + 32, *qs1 = gp1 + 32;
        __m512i is0[8], is1[8];
        const int8_t *qv[8];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            int32_t sum;
            memcpy(&sum, (const uint8_t *)(const void *)(q[r] + ng) + 4 * (size_t)g, 4);
            is0[r] = is1[r] = _mm512_set1_epi32(-bias * sum);
            qv[r] = (const int8_t *)(const void *)(q[r] + 2 * ng) + 32 * g;
        }
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            __m512i k0, k1;
            if (q8) {
                const __m512i f = _mm512_set1_epi8((char)0x80);
                k0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qs0 + 64 * j)), f);
                k1 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qs1 + 64 * j)), f);
            } else { /* run j < 4: low nibbles of the bytes of run j, else high of run j - 4 */
                const __m512i m4 = _mm512_set1_epi8(15);
                const __m512i b0 = _mm512_loadu_si512((const void *)(qs0 + 64 * (j & 3)));
                const __m512i b1 = _mm512_loadu_si512((const void *)(qs1 + 64 * (j & 3)));
                k0 = _mm512_and_si512(j < 4 ? b0 : _mm512_srli_epi16(b0, 4), m4);
                k1 = _mm512_and_si512(j < 4 ? b1 : _mm512_srli_epi16(b1, 4), m4);
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) {
                const __m512i w = _mm512_set1_epi32(attn512_q4(qv[r] + 4 * j));
                is0[r] = _mm512_dpbusd_epi32(is0[r], k0, w);
                is1[r] = _mm512_dpbusd_epi32(is1[r], k1, w);
            }
        }
        const __m512 dk0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp0));
        const __m512 dk1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp1));
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            const __m512 qg = _mm512_set1_ps(q[r][g]);
            _mm512_storeu_ps(out0 + 16 * r, _mm512_fmadd_ps(_mm512_cvtepi32_ps(is0[r]), _mm512_mul_ps(qg, dk0),
                                                            _mm512_loadu_ps(out0 + 16 * r)));
            _mm512_storeu_ps(out1 + 16 * r, _mm512_fmadd_ps(_mm512_cvtepi32_ps(is1[r]), _mm512_mul_ps(qg, dk1),
                                                            _mm512_loadu_ps(out1 + 16 * r)));
        }
    }
}

#define ATTN512_SCORES_INT2(R)                                                                                    \
    __attribute__((noinline)) static void attn512_scores_int2_##R(const tl_attn_rows *a, const float *const *q,  \
                                                                  const uint8_t *kt0, const uint8_t *kt1,        \
                                                                  float *out0, float *out1) {                    \
        attn512_scores_int2(a, R, q, kt0, kt1, out0, out1);                                                       \
    }
ATTN512_SCORES_INT2(1)
ATTN512_SCORES_INT2(2)
ATTN512_SCORES_INT2(3)
ATTN512_SCORES_INT2(4)
ATTN512_SCORES_INT2(5)
ATTN512_SCORES_INT2(6)
ATTN512_SCORES_INT2(7)
ATTN512_SCORES_INT2(8)
#undef ATTN512_SCORES_INT2

typedef void (*attn512_scores_int2_fn)(const tl_attn_rows *, const float *const *, const uint8_t *, const uint8_t *,
                                       float *, float *);
static const attn512_scores_int2_fn attn512_scores_int2_by_r[8] = {
    attn512_scores_int2_1, attn512_scores_int2_2, attn512_scores_int2_3, attn512_scores_int2_4,
    attn512_scores_int2_5, attn512_scores_int2_6, attn512_scores_int2_7, attn512_scores_int2_8};

/* R rows' score chains into out[r*16..], each accumulator a variable of its
 * own and stored right after the loop: live across the softmax's calls, GCC
 * kept them on the stack inside the loop. */
AI void attn512_scores_t(int hd, int R, const float *const *q, const void *kt, int fmt, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const float *q0 = q[0], *q1 = R > 1 ? q[1] : q0, *q2 = R > 2 ? q[2] : q0, *q3 = R > 3 ? q[3] : q0;
    const float *q4 = R > 4 ? q[4] : q0, *q5 = R > 5 ? q[5] : q0, *q6 = R > 6 ? q[6] : q0, *q7 = R > 7 ? q[7] : q0;
    for (int d = 0; d < hd; d++) {
        const __m512 k = attn512_ldk(kt, d, fmt);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), k, a0);
        if (R > 1) a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[d]), k, a1);
        if (R > 2) a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[d]), k, a2);
        if (R > 3) a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[d]), k, a3);
        if (R > 4) a4 = _mm512_fmadd_ps(_mm512_set1_ps(q4[d]), k, a4);
        if (R > 5) a5 = _mm512_fmadd_ps(_mm512_set1_ps(q5[d]), k, a5);
        if (R > 6) a6 = _mm512_fmadd_ps(_mm512_set1_ps(q6[d]), k, a6);
        if (R > 7) a7 = _mm512_fmadd_ps(_mm512_set1_ps(q7[d]), k, a7);
    }
    _mm512_storeu_ps(out, a0);
    if (R > 1) _mm512_storeu_ps(out + 16, a1);
    if (R > 2) _mm512_storeu_ps(out + 32, a2);
    if (R > 3) _mm512_storeu_ps(out + 48, a3);
    if (R > 4) _mm512_storeu_ps(out + 64, a4);
    if (R > 5) _mm512_storeu_ps(out + 80, a5);
    if (R > 6) _mm512_storeu_ps(out + 96, a6);
    if (R > 7) _mm512_storeu_ps(out + 112, a7);
}

AI void attn512_scores(int hd, int R, const float *const *q, const float *kt, float *out) {
    attn512_scores_t(hd, R, q, kt, 0, out);
}

/* The score loop as a function of its own per row count: within the whole
 * block function GCC 12 spilled most accumulators inside the loop. */
#define ATTN512_SCORES(R)                                                                                         \
    __attribute__((noinline)) static void attn512_scores_##R(int hd, const float *const *q, const float *kt,     \
                                                             float *out) {                                       \
        attn512_scores(hd, R, q, kt, out);                                                                        \
    }
ATTN512_SCORES(1)
ATTN512_SCORES(2)
ATTN512_SCORES(3)
ATTN512_SCORES(4)
ATTN512_SCORES(5)
ATTN512_SCORES(6)
ATTN512_SCORES(7)
ATTN512_SCORES(8)
#undef ATTN512_SCORES

AI void attn512_scores_call(int hd, int R, const float *const *q, const float *kt, float *out) {
    switch (R) {
    case 1: attn512_scores_1(hd, q, kt, out); break;
    case 2: attn512_scores_2(hd, q, kt, out); break;
    case 3: attn512_scores_3(hd, q, kt, out); break;
    case 4: attn512_scores_4(hd, q, kt, out); break;
    case 5: attn512_scores_5(hd, q, kt, out); break;
    case 6: attn512_scores_6(hd, q, kt, out); break;
    case 7: attn512_scores_7(hd, q, kt, out); break;
    default: attn512_scores_8(hd, q, kt, out); break;
    }
}

/* kt and vf: the widened block (fmt 0, V rows hd apart), or the cache's own
 * block (K transposed, V rows vs apart): f16 (fmt 1), Q8_0 (2), Q4_0 (3). */
AI void attn512_rows_t(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                       float *const *l, int st, int en, const void *kt, const void *vf, size_t vs, int fmt) {
    const int hd = a->hd;
    float sc[8 * 16], vdq[8 * 16];
    const float *vd = NULL;
    if (a->v_fmt != TL_ATTN_F16) { /* a quantized V's d: read before the scores, off their path */
        if (fmt)
            for (int g = 0; g < hd / 32; g++) _mm512_storeu_ps(vdq + 16 * g, attn512_vd(vf, NULL, vs, g, fmt));
        vd = fmt ? vdq : tl_attn_vd(a, (const float *)vf);
    }
    if (tl_attn_kint(a)) attn512_scores_int_call(a, R, q, kt, sc);
    else if (fmt) attn512_scores_t(hd, R, q, kt, fmt, sc);
    else attn512_scores_call(hd, R, q, (const float *)kt, sc);
    const __mmask16 live = (__mmask16)((((uint32_t)1 << (en + 1)) - 1) & ~(((uint32_t)1 << st) - 1));
    float t[8][16], al[8], mn[8], mo[8], lo[8];
    const float *p[8];
    __m512 s[8];
    __m256 h[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) {
        const int rr = r < R ? r : 0; /* rows past R repeat row 0; their results are dropped */
        if (r < R) s[r] = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), live, _mm512_loadu_ps(sc + 16 * r),
                                             _mm512_set1_ps(a->scale));
        mo[r] = *m[rr];
        lo[r] = *l[rr];
        h[r] = _mm256_max_ps(_mm512_castps512_ps256(s[rr]), _mm512_extractf32x8_ps(s[rr], 1));
    }
    /* the rows' block maxima as one vector (max is exact in any order), then
     * mn = max(m, block max) and alpha = exp(m - mn) (0 for a first block) */
    const __m256 mold = _mm256_loadu_ps(mo), mv = _mm256_max_ps(attn512_max8x8(h), mold);
    const __mmask8 first = _mm256_cmp_ps_mask(mold, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    const __m256 dm = _mm256_mask_blend_ps(first, _mm256_sub_ps(mold, mv), _mm256_setzero_ps());
    const __m256 alv = _mm256_mask_blend_ps(first, _mm512_castps512_ps256(attn512_exp(_mm512_castps256_ps512(dm))),
                                            _mm256_setzero_ps());
    _mm256_storeu_ps(al, alv);
    _mm256_storeu_ps(mn, mv);
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) {
        if (r >= R) { /* a row past R: its lane of the sums is dropped (each lane is its row's alone) */
            h[r] = _mm256_setzero_ps();
            continue;
        }
        const __m512 pv = _mm512_maskz_mov_ps(live, attn512_exp(_mm512_maskz_sub_ps(live, s[r], _mm512_set1_ps(mn[r]))));
        _mm512_storeu_ps(t[r], pv);
        p[r] = t[r] + st;
        h[r] = _mm256_add_ps(_mm512_castps512_ps256(pv), _mm512_extractf32x8_ps(pv, 1)); /* slots j + j+8 */
    }
    /* l = l*alpha + each row's sum by the tree ((0+4)+(2+6)) + ((1+5)+(3+7)) */
    float ln[8];
    _mm256_storeu_ps(ln, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(lo), alv), attn512_sum8x8(h)));
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) {
        *m[r] = mn[r];
        *l[r] = ln[r];
    }
    const int n = en - st + 1;
    if (a->v_fmt != TL_ATTN_F16) { /* the quants, weighed per group (mathfn.h) */
        float w[8][8 * 16];
        attn512_vweights(hd / 32, R, &t[0][0], vf, vd, vs, 0, w);
        for (int r0 = 0; r0 < R; r0 += 4) {
            const int rn = R - r0 < 4 ? R - r0 : 4;
#define PVQ_PASSES(RN)                                                                                  \
    do {                                                                                                \
        attn512_pvq_t(hd, RN, 64, 0, o + r0, al + r0, (const float (*)[8 * 16])(w + r0), st, n, vf, vs, fmt); \
        attn512_pvq_t(hd, RN, 16, hd / 64 * 64, o + r0, al + r0, (const float (*)[8 * 16])(w + r0), st, n, vf, vs, fmt); \
    } while (0)
            ATTN512_BY_RN(rn, PVQ_PASSES);
#undef PVQ_PASSES
        }
        return;
    }
    const void *v0 = fmt == 1 ? (const void *)((const uint16_t *)vf + (size_t)st * vs)
                              : (const void *)((const float *)vf + (size_t)st * vs);
    for (int r0 = 0; r0 < R; r0 += 4) { /* V sums four rows at a time (16 sums in registers) */
        const int rn = R - r0 < 4 ? R - r0 : 4;
        /* 64 dimensions per pass, then 16 */
#define PV_PASSES(RN)                                                                   \
    do {                                                                                \
        attn512_pv_t(hd, RN, 64, 0, o + r0, al + r0, p + r0, n, v0, vs, fmt);           \
        attn512_pv_t(hd, RN, 16, hd / 64 * 64, o + r0, al + r0, p + r0, n, v0, vs, fmt); \
    } while (0)
        ATTN512_BY_RN(rn, PV_PASSES);
#undef PV_PASSES
        for (int c0 = hd / 16 * 16; c0 < hd; c0 += 8) /* a last 8 dimensions */
            for (int r = r0; r < r0 + rn; r++) {
                __m256 s8 = _mm256_mul_ps(_mm256_loadu_ps(o[r] + c0), _mm256_set1_ps(al[r]));
                for (int j = 0; j < n; j++)
                    s8 = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), attn512_ld8(v0, (size_t)j * vs + (size_t)c0, fmt == 1), s8);
                _mm256_storeu_ps(o[r] + c0, s8);
            }
    }
}

AI void attn512_rows_r(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                       float *const *l, int st, int en, const float *kt, const float *vf) {
    attn512_rows_t(a, R, q, o, m, l, st, en, kt, vf, (size_t)a->hd, 0);
}

/* One function per row count: inlined into one, GCC's register allocation
 * over the whole switch spilled the score accumulators. */
#define ATTN512_ROWS(R)                                                                                       \
    __attribute__((noinline)) static void attn512_rows_##R(const tl_attn_rows *a, const float *const *q,     \
                                                           float *const *o, float *const *m, float *const *l, \
                                                           int st, int en, const float *kt, const float *vf) { \
        attn512_rows_r(a, R, q, o, m, l, st, en, kt, vf);                                                     \
    }
ATTN512_ROWS(1)
ATTN512_ROWS(2)
ATTN512_ROWS(3)
ATTN512_ROWS(4)
ATTN512_ROWS(5)
ATTN512_ROWS(6)
ATTN512_ROWS(7)
ATTN512_ROWS(8)
#undef ATTN512_ROWS

/* The row-count instances, by R - 1 (more than 8 rows go 8 at a time upstream). */
typedef void (*attn512_rows_fn)(const tl_attn_rows *, const float *const *, float *const *, float *const *,
                                float *const *, int, int, const float *, const float *);
static const attn512_rows_fn attn512_rows_by_r[8] = {attn512_rows_1, attn512_rows_2, attn512_rows_3, attn512_rows_4,
                                                     attn512_rows_5, attn512_rows_6, attn512_rows_7, attn512_rows_8};

static void attn512_rows(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                         float *const *l, int st, int en, const float *kt, const float *vf) {
    attn512_rows_by_r[(R >= 1 && R <= 8 ? R : 8) - 1](a, q, o, m, l, st, en, kt, vf);
}

/* R rows' score chains against two blocks at once (each K vector load and q
 * broadcast serves twice the fmas); every score is the same chain as
 * attn512_scores'. */
AI void attn512_scores2(int hd, int R, const float *const *q, const float *kt0, const float *kt1, float *out0,
                        float *out1) {
    __m512 a[8][2];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m512 k0 = _mm512_loadu_ps(kt0 + d * 16), k1 = _mm512_loadu_ps(kt1 + d * 16);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            const __m512 qb = _mm512_set1_ps(q[r][d]);
            a[r][0] = _mm512_fmadd_ps(qb, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(qb, k1, a[r][1]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out0 + 16 * r, a[r][0]);
        _mm512_storeu_ps(out1 + 16 * r, a[r][1]);
    }
}

#define ATTN512_SCORES2(R)                                                                                    \
    __attribute__((noinline)) static void attn512_scores2_##R(int hd, const float *const *q, const float *kt0, \
                                                              const float *kt1, float *out0, float *out1) {    \
        attn512_scores2(hd, R, q, kt0, kt1, out0, out1);                                                      \
    }
ATTN512_SCORES2(1)
ATTN512_SCORES2(2)
ATTN512_SCORES2(3)
ATTN512_SCORES2(4)
ATTN512_SCORES2(5)
ATTN512_SCORES2(6)
ATTN512_SCORES2(7)
ATTN512_SCORES2(8)
#undef ATTN512_SCORES2

AI void attn512_scores2_call(int hd, int R, const float *const *q, const float *kt0, const float *kt1, float *out0,
                             float *out1) {
    switch (R) {
    case 1: attn512_scores2_1(hd, q, kt0, kt1, out0, out1); break;
    case 2: attn512_scores2_2(hd, q, kt0, kt1, out0, out1); break;
    case 3: attn512_scores2_3(hd, q, kt0, kt1, out0, out1); break;
    case 4: attn512_scores2_4(hd, q, kt0, kt1, out0, out1); break;
    case 5: attn512_scores2_5(hd, q, kt0, kt1, out0, out1); break;
    case 6: attn512_scores2_6(hd, q, kt0, kt1, out0, out1); break;
    case 7: attn512_scores2_7(hd, q, kt0, kt1, out0, out1); break;
    default: attn512_scores2_8(hd, q, kt0, kt1, out0, out1); break;
    }
}

/* attn512_pv over nb blocks: o loaded once, then per block o*alpha and the
 * block's 16 fmas in key order, stored once (the same operations as nb
 * calls of attn512_pv, without o's trips through memory). p[k] holds block
 * k's weights, row r at p[k] + 16r; al[k][r] its alphas. */
AI void attn512_pv_multi(int hd, int R, int W, int c0, int r0, float *const *o, const float (*al)[8],
                         const unsigned char *one, const float (*p)[8 * 16], int nb, const float *vf) {
    const unsigned rows = ((1u << R) - 1) << r0;
    for (; c0 + W <= hd; c0 += W) {
        __m512 acc[4][4];
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int i = 0; i < W / 16; i++) acc[r][i] = _mm512_loadu_ps(o[r0 + r] + c0 + 16 * i);
        for (int k = 0; k < nb; k++) {
            /* o * 1 is o, bit for bit: past a context's first blocks a
             * row's maximum seldom moves and its alpha is exactly 1 */
            if ((one[k] & rows) != rows)
                UNROLL
                for (int r = 0; r < R; r++) {
                    const __m512 alv = _mm512_set1_ps(al[k][r0 + r]);
                    UNROLL
                    for (int i = 0; i < W / 16; i++) acc[r][i] = _mm512_mul_ps(acc[r][i], alv);
                }
            const float *vk = vf + (size_t)k * 16 * hd + c0;
            for (int j = 0; j < 16; j++) {
                __m512 v[4];
                UNROLL
                for (int i = 0; i < W / 16; i++) v[i] = _mm512_loadu_ps(vk + (size_t)j * hd + 16 * i);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const __m512 pj = _mm512_set1_ps(p[k][16 * (r0 + r) + j]);
                    UNROLL
                    for (int i = 0; i < W / 16; i++) acc[r][i] = _mm512_fmadd_ps(pj, v[i], acc[r][i]);
                }
            }
        }
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int i = 0; i < W / 16; i++) _mm512_storeu_ps(o[r0 + r] + c0 + 16 * i, acc[r][i]);
    }
}

/* R rows' W sums from c0 on: loaded from o (store 0) or stored to it. */
AI void attn512_acc_io(int R, int W, int c0, float *const *o, __m512 (*acc)[4], int store) {
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int i = 0; i < W / 16; i++) {
            if (store) _mm512_storeu_ps(o[r] + c0 + 16 * i, acc[r][i]);
            else acc[r][i] = _mm512_loadu_ps(o[r] + c0 + 16 * i);
        }
}

/* A quantized V's block start for R rows: tl_attn_vo with each row's alpha
 * (al[r]), the sums left as they are where it is 1. */
AI void attn512_acc_vo(int R, int W, const float *al, __m512 (*acc)[4]) {
    UNROLL
    for (int r = 0; r < R; r++) {
        if (al[r] == 1.0f) continue;
        const __m512 alv = _mm512_set1_ps(al[r]);
        UNROLL
        for (int i = 0; i < W / 16; i++) acc[r][i] = attn512_vo(acc[r][i], alv);
    }
}

/* attn512_pv_multi for a quantized V: block k's weights w[k][r] (as
 * attn512_vweights), o from tl_attn_vo at each block's start. */
AI void attn512_pvq_multi(int hd, int R, int W, int c0, int r0, float *const *o, const float (*al)[8],
                          const unsigned char *one, const float (*w)[8][8 * 16], int nb, const float *vf) {
    const unsigned rows = ((1u << R) - 1) << r0;
    for (; c0 + W <= hd; c0 += W) {
        __m512 acc[4][4];
        attn512_acc_io(R, W, c0, o + r0, acc, 0);
        for (int k = 0; k < nb; k++) {
            if ((one[k] & rows) != rows) attn512_acc_vo(R, W, al[k] + r0, acc);
            const float *vk = vf + (size_t)k * 16 * hd + c0;
            for (int j = 0; j < 16; j++) {
                __m512 v[4];
                UNROLL
                for (int i = 0; i < W / 16; i++) v[i] = _mm512_loadu_ps(vk + (size_t)j * hd + 16 * i);
                UNROLL
                for (int r = 0; r < R; r++)
                    UNROLL
                    for (int h = 0; h < (W + 31) / 32; h++) { /* a weight per group: c0 % 32 == 0 */
                        const __m512 wb = _mm512_set1_ps(w[k][r0 + r][(c0 / 32 + h) * 16 + j]);
                        UNROLL
                        for (int i = 2 * h; i < 2 * h + 2; i++)
                            if (i < W / 16) acc[r][i] = _mm512_fmadd_ps(wb, v[i], acc[r][i]);
                    }
            }
        }
        attn512_acc_io(R, W, c0, o + r0, acc, 1);
    }
}

#if R8_BF16
/* The same sums by vdpbf16ps, two keys an instruction: V as bf16 pairs
 * (tl_attn_vb: pair j's 16 dimensions from c at (j * hd/16 + c/16) * 16
 * lanes, lane i the earlier key's quant in its high half, the later's in
 * the low), and the weights as pairs the same way (wp[k][r][g*8 + j]).
 * vdpbf16ps adds the high halves' product first, then the low's: the
 * fmas of attn512_pvq_multi in the same order, with the same bits
 * (mathfn.h: every product exact, no partial sum subnormal). */
AI void attn512_pvb_multi(int hd, int R, int W, int c0, int r0, float *const *o, const float (*al)[8],
                          const unsigned char *one, const uint32_t (*wp)[8][4 * 16], int nb, const uint32_t *vb) {
    const unsigned rows = ((1u << R) - 1) << r0;
    const int nc = hd / 16;
    for (; c0 + W <= hd; c0 += W) {
        __m512 acc[4][4];
        attn512_acc_io(R, W, c0, o + r0, acc, 0);
        for (int k = 0; k < nb; k++) {
            if ((one[k] & rows) != rows) attn512_acc_vo(R, W, al[k] + r0, acc);
            const uint32_t *vk = vb + (size_t)k * 8 * 16 * nc + (size_t)c0;
            for (int j = 0; j < 8; j++) {
                __m512bh v[4];
                UNROLL
                for (int i = 0; i < W / 16; i++)
                    v[i] = (__m512bh)_mm512_loadu_si512((const void *)(vk + (size_t)j * 16 * nc + 16 * i));
                UNROLL
                for (int r = 0; r < R; r++)
                    UNROLL
                    for (int h = 0; h < (W + 31) / 32; h++) { /* a weight per group: c0 % 32 == 0 */
                        const __m512bh wb = (__m512bh)_mm512_set1_epi32((int)wp[k][r0 + r][(c0 / 32 + h) * 8 + j]);
                        UNROLL
                        for (int i = 2 * h; i < 2 * h + 2; i++)
                            if (i < W / 16) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], v[i], wb);
                    }
            }
        }
        attn512_acc_io(R, W, c0, o + r0, acc, 1);
    }
}
#endif

/* nb whole blocks (every slot live) for R rows: attn512_rows_r's steps block
 * after block, m and l in registers between blocks, the scores two blocks
 * at a time, and V summed over all nb blocks per pass over o. */
AI void attn512_multi_r(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                        float *const *l, int nb, const float *kt, const float *vf, int bf) {
    const int hd = a->hd;
    float sc[TL_ATTN_NB][8 * 16], al[TL_ATTN_NB][8];
    unsigned char one[TL_ATTN_NB]; /* block k: bit r when row r's alpha is 1 */
    int k = 0;
    if (tl_attn_kint(a)) {
        const uint8_t *kb = (const uint8_t *)(const void *)kt;
        const size_t bb = (size_t)16 * hd * sizeof(float); /* the widened blocks' stride */
        for (; k + 1 < nb; k += 2)
            attn512_scores_int2_by_r[R - 1](a, q, kb + (size_t)k * bb, kb + (size_t)(k + 1) * bb, sc[k], sc[k + 1]);
        if (k < nb) attn512_scores_int_call(a, R, q, kt + (size_t)k * 16 * hd, sc[k]);
    } else {
        for (; k + 1 < nb; k += 2)
            attn512_scores2_call(hd, R, q, kt + (size_t)k * 16 * hd, kt + (size_t)(k + 1) * 16 * hd, sc[k], sc[k + 1]);
        if (k < nb) attn512_scores_call(hd, R, q, kt + (size_t)k * 16 * hd, sc[k]);
    }
    float mo[8], lo[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) {
        const int rr = r < R ? r : 0; /* rows past R repeat row 0; their results are dropped */
        mo[r] = *m[rr];
        lo[r] = *l[rr];
    }
    __m256 mold = _mm256_loadu_ps(mo), lv = _mm256_loadu_ps(lo);
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (k = 0; k < nb; k++) {
        __m512 s[8];
        __m256 h[8];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < 8; r++) {
            const int rr = r < R ? r : 0;
            s[r] = _mm512_mul_ps(_mm512_loadu_ps(sc[k] + 16 * rr), scale);
            h[r] = _mm256_max_ps(_mm512_castps512_ps256(s[r]), _mm512_extractf32x8_ps(s[r], 1));
        }
        const __m256 mv = _mm256_max_ps(attn512_max8x8(h), mold);
        const __mmask8 first = _mm256_cmp_ps_mask(mold, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
        const __m256 dm = _mm256_mask_blend_ps(first, _mm256_sub_ps(mold, mv), _mm256_setzero_ps());
        const __m256 alv = _mm256_mask_blend_ps(
            first, _mm512_castps512_ps256(attn512_exp(_mm512_castps256_ps512(dm))), _mm256_setzero_ps());
        _mm256_storeu_ps(al[k], alv);
        one[k] = (unsigned char)_mm256_cmp_ps_mask(alv, _mm256_set1_ps(1.0f), _CMP_EQ_OQ);
        float mn[8];
        _mm256_storeu_ps(mn, mv);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < 8; r++) {
            if (r >= R) { /* a row past R: its lane of the sums is dropped */
                h[r] = _mm256_setzero_ps();
                continue;
            }
            const __m512 pv = attn512_exp(_mm512_sub_ps(s[r], _mm512_set1_ps(mn[r])));
            _mm512_storeu_ps(sc[k] + 16 * r, pv);
            h[r] = _mm256_add_ps(_mm512_castps512_ps256(pv), _mm512_extractf32x8_ps(pv, 1)); /* slots j + j+8 */
        }
        lv = _mm256_add_ps(_mm256_mul_ps(lv, alv), attn512_sum8x8(h));
        mold = mv;
    }
    _mm256_storeu_ps(mo, mold);
    _mm256_storeu_ps(lo, lv);
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) {
        *m[r] = mo[r];
        *l[r] = lo[r];
    }
    if (a->v_fmt != TL_ATTN_F16) { /* the quants, weighed per group (mathfn.h) */
        const int ng = hd / 32;
#if R8_BF16
        if (bf) {
            /* the weights as pairs: vcvtne2ps2bf16 rounds as tl_attn_vw,
             * zeroed below the threshold by its mask */
            uint32_t wp[TL_ATTN_NB][8][4 * 16];
            const __m512 tiny = _mm512_set1_ps(0x1p-100f);
            for (k = 0; k < nb; k++) {
                const float *vd = tl_attn_vd(a, vf + (size_t)k * 16 * hd);
                for (int g = 0; g < ng; g += 2) {
                    const __m512 d0 = _mm512_loadu_ps(vd + 16 * g);
                    const __m512 d1 = g + 1 < ng ? _mm512_loadu_ps(vd + 16 * (g + 1)) : _mm512_setzero_ps();
                    for (int r = 0; r < R; r++) {
                        const __m512 p = _mm512_loadu_ps(sc[k] + 16 * r);
                        const __m512 x0 = _mm512_mul_ps(p, d0), x1 = _mm512_mul_ps(p, d1);
                        const __mmask32 keep = _mm512_kunpackw(
                            _mm512_cmp_ps_mask(_mm512_abs_ps(x1), tiny, _CMP_GE_OQ),
                            _mm512_cmp_ps_mask(_mm512_abs_ps(x0), tiny, _CMP_GE_OQ));
                        const __m512i pr = (__m512i)_mm512_maskz_cvtne2ps_pbh(keep, x1, x0);
                        _mm512_storeu_si512((void *)(wp[k][r] + 8 * g), _mm512_rol_epi32(pr, 16));
                    }
                }
            }
            const uint32_t *vb = (const uint32_t *)(const void *)tl_attn_vb(a, vf);
            for (int r0 = 0; r0 < R; r0 += 4) {
                const int rn = R - r0 < 4 ? R - r0 : 4;
#define PVB_PASSES(RN)                                                                                     \
    do {                                                                                                   \
        attn512_pvb_multi(hd, RN, 64, 0, r0, o, al, one, (const uint32_t (*)[8][4 * 16])wp, nb, vb);       \
        attn512_pvb_multi(hd, RN, 16, hd / 64 * 64, r0, o, al, one, (const uint32_t (*)[8][4 * 16])wp, nb, vb); \
    } while (0)
                ATTN512_BY_RN(rn, PVB_PASSES);
#undef PVB_PASSES
            }
            return;
        }
#else
        (void)bf;
#endif
        float w[TL_ATTN_NB][8][8 * 16];
        for (k = 0; k < nb; k++)
            attn512_vweights(ng, R, sc[k], NULL, tl_attn_vd(a, vf + (size_t)k * 16 * hd), 0, 0, w[k]);
        for (int r0 = 0; r0 < R; r0 += 4) {
            const int rn = R - r0 < 4 ? R - r0 : 4;
#define PVQ_PASSES(RN)                                                                                      \
    do {                                                                                                    \
        attn512_pvq_multi(hd, RN, 64, 0, r0, o, al, one, (const float (*)[8][8 * 16])w, nb, vf);            \
        attn512_pvq_multi(hd, RN, 16, hd / 64 * 64, r0, o, al, one, (const float (*)[8][8 * 16])w, nb, vf); \
    } while (0)
            ATTN512_BY_RN(rn, PVQ_PASSES);
#undef PVQ_PASSES
        }
        return;
    }
    for (int r0 = 0; r0 < R; r0 += 4) { /* V sums four rows at a time (16 sums in registers) */
        const int rn = R - r0 < 4 ? R - r0 : 4;
#define PV_PASSES(RN)                                                                   \
    do {                                                                                \
        attn512_pv_multi(hd, RN, 64, 0, r0, o, al, one, sc, nb, vf);                    \
        attn512_pv_multi(hd, RN, 16, hd / 64 * 64, r0, o, al, one, sc, nb, vf);         \
    } while (0)
        ATTN512_BY_RN(rn, PV_PASSES);
#undef PV_PASSES
        for (int c0 = hd / 16 * 16; c0 < hd; c0 += 8) /* a last 8 dimensions */
            for (int r = r0; r < r0 + rn; r++) {
                __m256 s8 = _mm256_loadu_ps(o[r] + c0);
                for (k = 0; k < nb; k++) {
                    s8 = _mm256_mul_ps(s8, _mm256_set1_ps(al[k][r]));
                    const float *vk = vf + (size_t)k * 16 * hd;
                    for (int j = 0; j < 16; j++)
                        s8 = _mm256_fmadd_ps(_mm256_set1_ps(sc[k][16 * r + j]), _mm256_loadu_ps(vk + (size_t)j * hd + c0), s8);
                }
                _mm256_storeu_ps(o[r] + c0, s8);
            }
    }
}

#define ATTN512_MULTI(R)                                                                                      \
    __attribute__((noinline)) static void attn512_multi_##R(const tl_attn_rows *a, const float *const *q,    \
                                                            float *const *o, float *const *m, float *const *l, \
                                                            int nb, const float *kt, const float *vf) {        \
        attn512_multi_r(a, R, q, o, m, l, nb, kt, vf, 0);                                                     \
    }
ATTN512_MULTI(1)
ATTN512_MULTI(2)
ATTN512_MULTI(3)
ATTN512_MULTI(4)
ATTN512_MULTI(5)
ATTN512_MULTI(6)
ATTN512_MULTI(7)
ATTN512_MULTI(8)
#undef ATTN512_MULTI

typedef void (*attn512_multi_fn)(const tl_attn_rows *, const float *const *, float *const *, float *const *,
                                 float *const *, int, const float *, const float *);
static const attn512_multi_fn attn512_multi_by_r[8] = {attn512_multi_1, attn512_multi_2, attn512_multi_3,
                                                       attn512_multi_4, attn512_multi_5, attn512_multi_6,
                                                       attn512_multi_7, attn512_multi_8};

static void attn512_multi(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                          float *const *l, int nb, const float *kt, const float *vf) {
    attn512_multi_by_r[(R >= 1 && R <= 8 ? R : 8) - 1](a, q, o, m, l, nb, kt, vf);
}

/* Decode (one token, and each sequence's rows in a batched or verification
 * step): the rows read the cache's blocks as they are, K transposed, rather
 * than widening each block to scratch for the rows that share it. The same
 * float operations as tl_attn_drive's (the widening is exact), block by
 * block. One instance per row count and cache type (f16, and Q8_0 or Q4_0
 * for both K and V). */
#define ATTN512_ROWS16(R, F, NAME)                                                                             \
    __attribute__((noinline)) static void attn512_##NAME##_##R(const tl_attn_rows *a, const float *const *q,  \
                                                               float *const *o, float *const *m,               \
                                                               float *const *l, int st, int en, const void *kb, \
                                                               const void *vb) {                               \
        attn512_rows_t(a, R, q, o, m, l, st, en, kb, vb, F == 1 ? a->v_stride / 2 : a->v_stride, F);           \
    }
#define ATTN512_ROWS16_ALL(F, NAME)                                                                            \
    ATTN512_ROWS16(1, F, NAME)                                                                                 \
    ATTN512_ROWS16(2, F, NAME)                                                                                 \
    ATTN512_ROWS16(3, F, NAME)                                                                                 \
    ATTN512_ROWS16(4, F, NAME)                                                                                 \
    ATTN512_ROWS16(5, F, NAME)                                                                                 \
    ATTN512_ROWS16(6, F, NAME)                                                                                 \
    ATTN512_ROWS16(7, F, NAME)                                                                                 \
    ATTN512_ROWS16(8, F, NAME)
/* (TL_ATTN512_QDIRECT: at the top of this file.) */
ATTN512_ROWS16_ALL(1, rows16)
#if TL_ATTN512_QDIRECT
ATTN512_ROWS16_ALL(2, rowsq8)
ATTN512_ROWS16_ALL(3, rowsq4)
#endif
#undef ATTN512_ROWS16_ALL
#undef ATTN512_ROWS16

typedef void (*attn512_rows16_fn)(const tl_attn_rows *, const float *const *, float *const *, float *const *,
                                  float *const *, int, int, const void *, const void *);
static const attn512_rows16_fn attn512_rows16_by_r[3][8] = {
    {attn512_rows16_1, attn512_rows16_2, attn512_rows16_3, attn512_rows16_4, attn512_rows16_5, attn512_rows16_6,
     attn512_rows16_7, attn512_rows16_8},
#if TL_ATTN512_QDIRECT
    {attn512_rowsq8_1, attn512_rowsq8_2, attn512_rowsq8_3, attn512_rowsq8_4, attn512_rowsq8_5, attn512_rowsq8_6,
     attn512_rowsq8_7, attn512_rowsq8_8},
    {attn512_rowsq4_1, attn512_rowsq4_2, attn512_rowsq4_3, attn512_rowsq4_4, attn512_rowsq4_5, attn512_rowsq4_6,
     attn512_rowsq4_7, attn512_rowsq4_8},
#endif
};

/* One token, or a few whose rows fit one call per block (T x G <= 8: a
 * verification step of 2 tokens for 3 or 4 query heads per KV head). Block
 * by block as tl_attn_drive, rows with the same live slots together, but
 * without its widening: a 2-token step at a 4k context paid 1.5x a one-token
 * step (SmolLM2 Q4_1, AMD EPYC), 1.2x this way. Where a block serves two
 * calls or more, widening it once (and the multi-block calls) is as fast or
 * faster (T = 3, 8 and 16 measured). */
static void attn512_direct(const tl_attn_rows *a) {
    const int G = a->G, T = a->T;
    const attn512_rows16_fn *rows = attn512_rows16_by_r[a->k_fmt]; /* TL_ATTN_F16, _Q8_0, _Q4_0 */
    int lo, pos;
    tl_attn_keys(a, 0, &lo, &pos);
    const int first = lo / 16 * 16;
    tl_attn_keys(a, T - 1, &lo, &pos);
    const int last = pos;
    float *m = tl_attn_begin(a), *l = m + (size_t)G * T; /* [T][G] each */
    int folded = 0;
    for (int b0 = first; b0 <= last; b0 += 16) {
        if (b0 % TL_ATTN_SEG == 0 && b0 > first) {
            tl_attn_fold(a, m);
            folded = 1;
        }
        tl_attn_prefetch(a, b0);
        const void *kb = (const uint8_t *)a->k + (size_t)a->blk[b0 / 16] * 16 * a->k_stride;
        const void *vb = (const uint8_t *)a->v + (size_t)a->blk[b0 / 16] * 16 * a->v_stride;
        const float *q[8];
        float *o[8], *mm[8], *ll[8];
        int R = 0, gst = 0, gen = 0;
        for (int i = 0; i < T; i++) {
            tl_attn_keys(a, i, &lo, &pos);
            const int st = (b0 > lo ? b0 : lo) - b0, en = (b0 + 15 < pos ? b0 + 15 : pos) - b0;
            if (st > en) continue;
            for (int h = 0; h < G; h++) {
                if (R > 0 && (R == 8 || st != gst || en != gen)) {
                    rows[R - 1](a, q, o, mm, ll, gst, gen, kb, vb);
                    R = 0;
                }
                gst = st, gen = en;
                q[R] = tl_attn_qrow(a, i, h);
                o[R] = a->out + (size_t)i * a->out_tok + (size_t)h * a->out_stride;
                mm[R] = &m[i * G + h];
                ll[R] = &l[i * G + h];
                R++;
            }
        }
        if (R > 0) rows[R - 1](a, q, o, mm, ll, gst, gen, kb, vb);
    }
    tl_attn_finish(a, m, folded);
}

/* Whether the rows read the cache's blocks as they are (attn512_direct):
 * K transposed, one type for K and V, few rows. */
static int attn512_direct_ok(const tl_attn_rows *a) {
    return (a->T == 1 || a->T * a->G <= 8) && a->k_tr && a->bs == 16 && a->k_fmt == a->v_fmt &&
           (TL_ATTN512_QDIRECT || a->k_fmt == TL_ATTN_F16);
}

static void attn512_online(const tl_attn_rows *a) {
    if (attn512_direct_ok(a)) {
        attn512_direct(a);
        return;
    }
    tl_attn_drive(a, 8, tl_attn_widen_avx2, attn512_rows, attn512_multi);
}

#if R8_BF16
/* A quantized V's sums by vdpbf16ps (attn512_pvb_multi) in the runs of whole
 * blocks, where a block's bf16 pairs, made once, serve every row; a partial
 * block's rows and decode keep the fmas (the same bits). Where vdpbf16ps
 * issues at the fma's rate (AMD Zen 4: two keys an instruction against
 * one) this halves the V sum's instructions; on the Xeon measured it issues
 * at half that rate and gains nothing (docs/PERFORMANCE.md). */
#define ATTN512_MULTIB(R)                                                                                      \
    __attribute__((noinline)) static void attn512_multib_##R(const tl_attn_rows *a, const float *const *q,    \
                                                             float *const *o, float *const *m, float *const *l, \
                                                             int nb, const float *kt, const float *vf) {        \
        attn512_multi_r(a, R, q, o, m, l, nb, kt, vf, 1);                                                      \
    }
ATTN512_MULTIB(1)
ATTN512_MULTIB(2)
ATTN512_MULTIB(3)
ATTN512_MULTIB(4)
ATTN512_MULTIB(5)
ATTN512_MULTIB(6)
ATTN512_MULTIB(7)
ATTN512_MULTIB(8)
#undef ATTN512_MULTIB

static const attn512_multi_fn attn512_multib_by_r[8] = {attn512_multib_1, attn512_multib_2, attn512_multib_3,
                                                        attn512_multib_4, attn512_multib_5, attn512_multib_6,
                                                        attn512_multib_7, attn512_multib_8};

static void attn512_multib(const tl_attn_rows *a, int R, const float *const *q, float *const *o, float *const *m,
                           float *const *l, int nb, const float *kt, const float *vf) {
    attn512_multib_by_r[(R >= 1 && R <= 8 ? R : 8) - 1](a, q, o, m, l, nb, kt, vf);
}

/* tl_attn_widen_avx2, and for a whole block of a quantized V its bf16
 * pairs (attn512_pvb_multi's layout) from the widened quants: small
 * integers, so a float's high half is its bf16. */
static void attn512_widen_bf(const tl_attn_rows *a, int b0, int ws, int we, float *kt, float *vf) {
    tl_attn_widen_avx2(a, b0, ws, we, kt, vf);
    if (ws != b0 || we != b0 + 15) return; /* the runs of whole blocks alone read the pairs */
    const int hd = a->hd;
    uint32_t *vb = (uint32_t *)(void *)tl_attn_vb(a, vf);
    for (int j = 0; j < 8; j++) {
        const float *v0 = vf + (size_t)(2 * j) * hd, *v1 = v0 + hd;
        for (int c = 0; c < hd; c += 16)
            _mm512_storeu_si512((void *)(vb + (size_t)j * 16 * (hd / 16) + c),
                                _mm512_or_si512(_mm512_castps_si512(_mm512_loadu_ps(v0 + c)),
                                                _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(v1 + c)), 16)));
    }
}

static void attn512_online_bf(const tl_attn_rows *a) {
    if (a->v_fmt == TL_ATTN_F16 || attn512_direct_ok(a)) {
        attn512_online(a);
        return;
    }
    tl_attn_drive(a, 8, attn512_widen_bf, attn512_rows, attn512_multib);
}
#endif

/* Without VNNI a quantized K's integer scores are the AVX2 level's. */
static void attn512_online_novnni(const tl_attn_rows *a) {
    if (tl_attn_kint(a)) tl_attn_online(a, 1);
    else attn512_online(a);
}

static void attn512_fill(tl_kernels *k, int vnni) { k->math.attn_online = vnni ? attn512_online : attn512_online_novnni; }

#if R8_BF16
static void attn512_fill_bf(tl_kernels *k) { k->math.attn_online = attn512_online_bf; }
#endif

#endif
