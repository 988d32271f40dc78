/* cpu/kern_avx512: the AVX-512 (F/BW/VL/DQ) dots, with VNNI (vpdpbusd, vpdpwssd)
 * in the vnni variant: the exact integer partial sums of two 32-blocks or 64
 * K-quant elements per 512-bit vector, then the float accumulation in the 8-lane
 * order of llama.cpp's AVX2 kernels (see quant.c), so that every level gives the
 * same bits. The activation quantizers and the F16 dot stay the AVX2 ones. The
 * fast mode's r8 tiles (cpu/r8_tile.h), its attention (cpu/attn512.h) and, with
 * AVX-512 BF16, its BF16 gemm on vdpbf16ps live here too. */
#include "cpu/kernels.h"
#include "cpu/simd256.h"

/* Every float operation here is spelled out: clang would otherwise fuse a*b + c. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The helpers take vnni as an argument; forced inlining (AI) with a constant
 * folds the branch so each public kernel exists once per variant. */

AI int hsum_i32x16(__m512i v) {
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* u (0..128) x s (-127..127) bytes -> 16 exact int32 sums of 4 products. */
AI __m512i dot_us8(__m512i u, __m512i s, int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

/* Signed x signed as |x| x (y negated where x < 0): there is no 512-bit vpsignb. */
AI __m512i dot_ss8(__m512i x, __m512i y, int vnni) {
    const __mmask64 neg = _mm512_movepi8_mask(x);
    return dot_us8(_mm512_abs_epi8(x), _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y), vnni);
}

/* 32 bytes at p0 then 32 at p1. */
AI __m512i load2x32(const void *p0, const void *p1) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)p0), b = _mm256_loadu_si256((const __m256i *)p1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* Two blocks' 16 bytes of nibbles -> their 2x32 quants in element order. */
AI __m512i nibbles2x32(const uint8_t *p0, const uint8_t *p1) {
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                              _mm_loadu_si128((const __m128i *)p1), 1);
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
    const __m512i v = _mm512_and_si512(w, _mm512_set1_epi8(0x0F)); /* lo0 lo1 hi0 hi1 */
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), v);
}

/* Two blocks' 32 fifth bits: bit k of the mask is element k of the pair. */
AI __mmask64 bits2x32(const uint8_t *p0, const uint8_t *p1) {
    uint32_t a, b;
    memcpy(&a, p0, 4);
    memcpy(&b, p1, 4);
    return (__mmask64)a | ((__mmask64)b << 32);
}

/* ---- 32-blocks, two per vector. Each sums2_* gives the integer dots of blocks
 * 0 and 1 as float lanes [block 0 x8 | block 1 x8] (exact partial sums). */

#define PAIR_ARGS(WT, AT) const WT *x0, const WT *x1, const AT *y0, const AT *y1, int vnni

AI __m512 sums2_q4_0(PAIR_ARGS(block_q4_0, block_q8_0)) {
    const __m512i qx = _mm512_sub_epi8(nibbles2x32(x0->qs, x1->qs), _mm512_set1_epi8(8));
    return _mm512_cvtepi32_ps(dot_ss8(qx, load2x32(y0->qs, y1->qs), vnni));
}

AI __m512 sums2_q4_1(PAIR_ARGS(block_q4_1, block_q8_1)) {
    return _mm512_cvtepi32_ps(dot_us8(nibbles2x32(x0->qs, x1->qs), load2x32(y0->qs, y1->qs), vnni));
}

/* q - 16: the nibble where the 5th bit is set, nibble - 16 where not. */
AI __m512 sums2_q5_0(PAIR_ARGS(block_q5_0, block_q8_0)) {
    const __m512i nib = nibbles2x32(x0->qs, x1->qs);
    const __m512i q = _mm512_mask_sub_epi8(nib, (__mmask64)~bits2x32(x0->qh, x1->qh), nib, _mm512_set1_epi8(16));
    return _mm512_cvtepi32_ps(dot_ss8(q, load2x32(y0->qs, y1->qs), vnni));
}

AI __m512 sums2_q5_1(PAIR_ARGS(block_q5_1, block_q8_1)) {
    const __m512i nib = nibbles2x32(x0->qs, x1->qs);
    const __m512i q = _mm512_mask_add_epi8(nib, bits2x32(x0->qh, x1->qh), nib, _mm512_set1_epi8(16));
    return _mm512_cvtepi32_ps(dot_us8(q, load2x32(y0->qs, y1->qs), vnni));
}

AI __m512 sums2_q8_0(PAIR_ARGS(block_q8_0, block_q8_0)) {
    return _mm512_cvtepi32_ps(dot_ss8(load2x32(x0->qs, x1->qs), load2x32(y0->qs, y1->qs), vnni));
}


AI __m256 lo8(__m512 v) { return _mm512_castps512_ps256(v); }
AI __m256 hi8(__m512 v) { return _mm512_extractf32x8_ps(v, 1); }

/* Integer sums two blocks at a time, but one 8-lane float accumulator fed block
 * after block with d_w*d_a, as ggml's AVX2 loop. For Q4_1/Q5_1 (BIASED) the
 * m_w*s_a terms form a separate running fma, added after the horizontal sum. */
#define DOT_PAIRS(NAME, WT, AT, SUMS2, BIASED)                                                  \
    AI float NAME(int64_t n, const void *vw, const void *va, int vnni) {                        \
        const WT *x = vw;                                                                        \
        const AT *y = va;                                                                        \
        const int64_t nb = n / 32;                                                               \
        __m256 acc = _mm256_setzero_ps();                                                        \
        float summs = 0.0f;                                                                      \
        /* a pair per step; a last lone block is paired with itself, its copy unused */      \
        for (int64_t i = 0; i < nb; i += 2) {                                                    \
            const int64_t j = i + 1 < nb ? i + 1 : i;                                            \
            const __m512 p = SUMS2(x + i, x + j, y + i, y + j, vnni);                            \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), lo8(p), acc);       \
            if (BIASED) summs = fma1(h2f_at(x + i, 1), h2f_at(y + i, 1), summs);                 \
            if (j == i) break;                                                                   \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[j].d) * h2f(y[j].d)), hi8(p), acc);       \
            if (BIASED) summs = fma1(h2f_at(x + j, 1), h2f_at(y + j, 1), summs);                 \
        }                                                                                        \
        return BIASED ? hsum_f8(acc) + summs : hsum_f8(acc);                                     \
    }

DOT_PAIRS(dot_q4_0, block_q4_0, block_q8_0, sums2_q4_0, 0)
DOT_PAIRS(dot_q4_1, block_q4_1, block_q8_1, sums2_q4_1, 1)
DOT_PAIRS(dot_q5_0, block_q5_0, block_q8_0, sums2_q5_0, 0)
DOT_PAIRS(dot_q5_1, block_q5_1, block_q8_1, sums2_q5_1, 1)
DOT_PAIRS(dot_q8_0, block_q8_0, block_q8_0, sums2_q8_0, 0)

/* ---- K-quants: 64 elements (two 32 sub-blocks, or four 16 groups) per vector -- */

/* The 12 packed bytes -> 8 scales then 8 mins, as bytes (Q4_K/Q5_K). */
AI __m128i k_scales(const uint8_t *p) {
    uint32_t a, b, c;
    memcpy(&a, p, 4);
    memcpy(&b, p + 4, 4);
    memcpy(&c, p + 8, 4);
    const uint32_t s_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    return _mm_setr_epi32((int)(a & 0x3f3f3f3fu), (int)s_hi, (int)(b & 0x3f3f3f3fu), (int)m_hi);
}

/* int16 lanes 0..31 <- sc16[first + lane / per]: with per = 16 one scale per 32
 * sub-block (Q4_K/Q5_K), with per = 8 one per group of 16 (Q6_K). */
AI __m512i pick_scales(__m512i sc16, int first, int per) {
    static const short div16[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const short div8[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const __m512i idx = _mm512_add_epi16(_mm512_loadu_si512(per == 16 ? div16 : div8),
                                         _mm512_set1_epi16((short)first));
    return _mm512_permutexvar_epi16(idx, sc16);
}

/* sumi += (u x q8 pairs) * scales, exact int32 (u <= 63 keeps maddubs in int16). */
AI __m512i scaled_acc(__m512i sumi, __m512i u, __m512i q8, __m512i scales, int vnni) {
    const __m512i p16 = _mm512_maddubs_epi16(u, q8);
    if (vnni) return _mm512_dpwssd_epi32(sumi, p16, scales);
    return _mm512_add_epi32(sumi, _mm512_madd_epi16(p16, scales));
}

AI int k_min_dot(__m128i mins, const int16_t *bsums) {
    const __m128i b = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                     _mm_loadu_si128((const __m128i *)(bsums + 8)));
    const __m128i p = _mm_madd_epi16(b, mins);
    __m128i s = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* Q4_K (qh NULL) and Q5_K: 16 int32 lanes of scale * (q . q8), lanes 0..7 from
 * the even sub-blocks and 8..15 from the odd ones, each lane k / k+8 the
 * elements 4k..4k+3 of its sub-block; *imin gets the integer min term. */
AI __m512i k45_superblock(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, const block_q8_K *y,
                          int *imin, int vnni) {
    const __m256i sm = _mm256_cvtepu8_epi16(k_scales(scales));
    const __m512i sc = _mm512_castsi256_si512(sm); /* lanes 0..7 scales; the rest unused */
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __mmask64 hbits[4] = {0, 0, 0, 0};
    if (qh) { /* element 64j + l takes bit 2j of qh[l], element 64j + 32 + l bit 2j+1 */
        const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        for (int j = 0; j < 4; j++) {
            const __mmask32 lo = _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(1 << (2 * j))));
            const __mmask32 hi = _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(2 << (2 * j))));
            hbits[j] = (__mmask64)lo | ((__mmask64)hi << 32);
        }
    }
    __m512i sumi = _mm512_setzero_si512();
    for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
        __m512i u = _mm512_and_si512(w, m4);
        if (qh) u = _mm512_mask_add_epi8(u, hbits[j], u, _mm512_set1_epi8(16));
        sumi = scaled_acc(sumi, u, _mm512_loadu_si512(y->qs + 64 * j), pick_scales(sc, 2 * j, 16), vnni);
    }
    *imin = k_min_dot(_mm256_extracti128_si256(sm, 1), y->bsums);
    return sumi;
}

/* Q4_K in the order of llama.cpp's repacked AVX2 gemv: per superblock one fma
 * of the integer total, the mins in a second sum. */
AI float dot_q4_K(int64_t n, const void *vw, const void *va, int vnni) {
    const block_q4_K *x = vw;
    const block_q8_K *y = va;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int imin;
        const int isum = hsum_i32x16(k45_superblock(x[i].scales, x[i].qs, NULL, y + i, &imin, vnni));
        acc = fma1((float)isum, h2f(x[i].d) * y[i].d, acc);
        accm = fma1((float)imin, h2f(x[i].dmin) * y[i].d, accm);
    }
    return acc - accm;
}

/* Q5_K as ggml's AVX2 vec_dot: the two sub-block halves folded into its 8 lanes. */
AI float dot_q5_K(int64_t n, const void *vw, const void *va, int vnni) {
    const block_q5_K *x = vw;
    const block_q8_K *y = va;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int imin;
        const __m512i s = k45_superblock(x[i].scales, x[i].qs, x[i].qh, y + i, &imin, vnni);
        const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        const float d = y[i].d * h2f(x[i].d), dmin = -y[i].d * h2f(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s8), acc);
        summs = fma1(dmin, (float)imin, summs);
    }
    return hsum_f8(acc) + summs;
}

/* Q6_K: q = (4 low bits | 2 high bits << 4) - 32, int8 scale per 16; the -32 is
 * applied once per superblock through the activation group sums. */
AI float dot_q6_K(int64_t n, const void *vw, const void *va, int vnni) {
    const block_q6_K *x = vw;
    const block_q8_K *y = va;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256i sc256 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i sc = _mm512_castsi256_si512(sc256);
        const __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), sc256);
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512(x[i].ql + 64 * h); /* bytes of u0,u1 | u2,u3 nibbles */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const __m512i h01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(qh, 4)),
                                                   _mm256_slli_epi16(qh, 2), 1);
            const __m512i h23 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i ua = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(h01, m30));
            const __m512i ub = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                               _mm512_and_si512(h23, m30));
            const int8_t *q8 = y[i].qs + 128 * h;
            sumi = scaled_acc(sumi, ua, _mm512_loadu_si512(q8), pick_scales(sc, 8 * h, 8), vnni);
            sumi = scaled_acc(sumi, ub, _mm512_loadu_si512(q8 + 64), pick_scales(sc, 8 * h + 4, 8), vnni);
        }
        __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        s = _mm256_sub_epi32(s, _mm256_slli_epi32(bias, 5));
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum_f8(acc);
}

/* One named function per (kernel, variant): the table holds plain pointers. */
#define VARIANTS(K)                                                                                   \
    static float K##_512(int64_t n, const void *w, const void *a) { return K(n, w, a, 0); }          \
    static float K##_vnni(int64_t n, const void *w, const void *a) { return K(n, w, a, 1); }
VARIANTS(dot_q4_0)
VARIANTS(dot_q4_1)
VARIANTS(dot_q5_0)
VARIANTS(dot_q5_1)
VARIANTS(dot_q8_0)
VARIANTS(dot_q4_K)
VARIANTS(dot_q5_K)
VARIANTS(dot_q6_K)

/* The gemm tiles with vpdpbusd on 256-bit vectors (AVX-512 VL + VNNI): the same
 * exact int32 sums as AVX2's maddubs + madd in one instruction. */
#define TILE_DOT(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define TILE_DM 2 /* decode rows: as measured best with AVX2 (see tile32.h) */
#define TILE_PM 4 /* prompt rows x 4 tokens: 16 accumulators in 32 registers */
#include "cpu/tile32.h"

/* The fast gemm with vpdpbusd; 32 registers hold 2 groups x 4 tokens. (The
 * SIMDe-emulated test build takes smaller tiles of the same code: emulated,
 * every instance costs a minute of compile time.) */
#define R8_VNNI 1
#ifndef R8_ZMM
#define R8_ZMM 1
#endif
#ifndef R8_PM
#define R8_PM 2
#endif
#ifndef R8_PN
#define R8_PN 4
#endif
#include "cpu/r8_tile.h"
#ifndef R8_BF16
#define R8_BF16 1
#endif
#include "cpu/attn512.h"

/* ---- BF16 with vdpbf16ps (AVX-512 BF16): one instruction is two steps of
 * the r8h BF16 chain (cpu/r8.c) for 8 rows (ymm) or two groups' 16 (zmm); the
 * levels below emulate it (r8h_gemm_bf16 in cpu/r8_tile.h). */
#if R8_BF16
AI __m512bh r8bz_x(const uint8_t *a, int64_t p) {
    int32_t v;
    memcpy(&v, a + 4 * (size_t)p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

AI void r8bz_tile(int M, int N, int64_t np, const uint16_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                  float *y, size_t ys) {
    __m512 acc[2][4];
    UNROLL
    for (int m = 0; m < M; m++)
        UNROLL
        for (int t = 0; t < N; t++) acc[m][t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        __m512bh x[4];
        UNROLL
        for (int t = 0; t < N; t++) x[t] = r8bz_x(a + (size_t)t * as, p);
        UNROLL
        for (int m = 0; m < M; m++) {
            const uint16_t *q0 = w + (size_t)(2 * m) * gs + 16 * (size_t)p, *q1 = q0 + gs;
            if ((p & 1) == 0) { /* a line per 2 pairs and group */
                R8_PF((const uint8_t *)q0 + R8_PREFETCH);
                R8_PF((const uint8_t *)q1 + R8_PREFETCH);
            }
            const __m512bh wv = (__m512bh)load2x32(q0, q1);
            UNROLL
            for (int t = 0; t < N; t++) acc[m][t] = _mm512_dpbf16_ps(acc[m][t], wv, x[t]);
        }
    }
    UNROLL
    for (int m = 0; m < M; m++)
        UNROLL
        for (int t = 0; t < N; t++) r8_store16(y + (size_t)t * ys + 16 * (size_t)m, acc[m][t], nr - 16 * m);
}

/* one group (M is 1: the signature of the other tiles, for R8H_TOKENS) */
AI void r8by_tile(int M, int N, int64_t np, const uint16_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                  float *y, size_t ys) {
    (void)M, (void)gs;
    __m256 acc[4];
    UNROLL
    for (int t = 0; t < N; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        const uint16_t *q = w + 16 * (size_t)p;
        if ((p & 1) == 0) R8_PF((const uint8_t *)q + R8_PREFETCH);
        const __m256bh wv = (__m256bh)_mm256_loadu_si256((const __m256i *)(const void *)q);
        UNROLL
        for (int t = 0; t < N; t++) {
            int32_t v;
            memcpy(&v, a + (size_t)t * as + 4 * (size_t)p, 4);
            acc[t] = _mm256_dpbf16_ps(acc[t], wv, (__m256bh)_mm256_set1_epi32(v));
        }
    }
    UNROLL
    for (int t = 0; t < N; t++) r8_store8(y + (size_t)t * ys, acc[t], nr);
}

static void r8b_gemm_dp(int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                        size_t ys) {
    const uint16_t *w = vw;
    const uint8_t *a = va;
    const size_t gs = 8 * ws / sizeof(uint16_t);
    const int64_t np = (n + 1) / 2;
    const int ng = (nr + 7) / 8;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        const uint8_t *at = a + (size_t)t0 * as;
        float *yt = y + (size_t)t0 * ys;
        int g = 0;
        /* 32 rows (a prompt's tile, forward.c's MM_ROW_TILE) x up to 4 tokens, or in
         * decode two chains of 16 rows: 4 groups streamed */
        for (; g + 4 <= ng; g += 4) R8H_TOKENS(r8bz_tile, 2, tn, np, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
        for (; g + 2 <= ng; g += 2) R8H_TOKENS(r8bz_tile, 1, tn, np, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
        for (; g < ng; g++) R8H_TOKENS(r8by_tile, 1, tn, np, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
    }
}
#endif

void tl_r8q6_gemm_zmm(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y, size_t ys) {
    r8q6_gemm(n, w, ws, nr, a, as, nt, y, ys);
}

void tl_r8k_gemm_zmm(int q5, int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                     size_t ys) {
    r8k_gemm(q5, 1, n, w, ws, nr, a, as, nt, y, ys);
}

void tl_kernels_fill_avx512bf16(tl_kernels *k, tl_num_mode mode, int dp_attn) {
#if R8_BF16
    if (mode == TL_NUM_FAST) k->gemm[TL_BF16] = r8b_gemm_dp;
    if (mode == TL_NUM_FAST && dp_attn) attn512_fill_bf(k);
#else
    (void)k, (void)mode, (void)dp_attn;
#endif
}

void tl_kernels_fill_avx512(tl_kernels *k, int vnni, tl_num_mode mode) {
    if (vnni) tile32_fill(k);
    if (vnni && mode == TL_NUM_FAST) r8_fill(k);
    if (mode == TL_NUM_FAST) attn512_fill(k, vnni);
    k->vec_dot[TL_Q4_0] = vnni ? dot_q4_0_vnni : dot_q4_0_512;
    k->vec_dot[TL_Q4_1] = vnni ? dot_q4_1_vnni : dot_q4_1_512;
    k->vec_dot[TL_Q5_0] = vnni ? dot_q5_0_vnni : dot_q5_0_512;
    k->vec_dot[TL_Q5_1] = vnni ? dot_q5_1_vnni : dot_q5_1_512;
    k->vec_dot[TL_Q8_0] = vnni ? dot_q8_0_vnni : dot_q8_0_512;
    k->vec_dot[TL_Q4_K] = vnni ? dot_q4_K_vnni : dot_q4_K_512;
    k->vec_dot[TL_Q5_K] = vnni ? dot_q5_K_vnni : dot_q5_K_512;
    k->vec_dot[TL_Q6_K] = vnni ? dot_q6_K_vnni : dot_q6_K_512;
}
