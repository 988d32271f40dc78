/* cpu/kern_avx2: the AVX2 + FMA + F16C kernels: quantized weight-row x activation-row
 * dots and the activation quantizers, all bit-identical to the scalar references in
 * quant.c, whose float order is that of llama.cpp's own x86 AVX2 kernels. */
#include "cpu/kernels.h"
#include "cpu/simd256.h"

/* Every float operation here is spelled out: clang would otherwise fuse a*b + c. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- helpers -------------------------------------------------------------------- */

/* u (0..128) x s (-127..127) bytes -> 8 exact int32 partial sums (no int16
 * saturation: 2*128*127 < 32768). */
static inline __m256i dot_us8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Signed x signed via |x| and sign(x)*y, ggml's own trick, including its one
 * inexact case: y = -128 against x < 0 (negating -128 wraps), which the
 * activation quantizers never produce and quant.c's reference mirrors. */
static inline __m256i dot_ss8(__m256i x, __m256i y) {
    return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ---- Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 ------------------------------------------------ */

/* Each sums_* gives one 32-block's integer dot as 8 float lanes (exact partial sums). */
static inline __m256 sums_q4_0(const block_q4_0 *x, const block_q8_0 *y) {
    const __m256i qx = _mm256_sub_epi8(nibbles32(x->qs), _mm256_set1_epi8(8));
    return _mm256_cvtepi32_ps(dot_ss8(qx, load32(y->qs)));
}

static inline __m256 sums_q4_1(const block_q4_1 *x, const block_q8_1 *y) {
    return _mm256_cvtepi32_ps(dot_us8(nibbles32(x->qs), load32(y->qs)));
}

/* q - 16 as a signed byte: the nibble where the 5th bit is set, nibble | 0xF0 where not. */
static inline __m256 sums_q5_0(const block_q5_0 *x, const block_q8_0 *y) {
    const __m256i hi = _mm256_andnot_si256(bits32(x->qh), _mm256_set1_epi8((char)0xF0));
    const __m256i qx = _mm256_or_si256(nibbles32(x->qs), hi);
    return _mm256_cvtepi32_ps(dot_ss8(qx, load32(y->qs)));
}

static inline __m256 sums_q5_1(const block_q5_1 *x, const block_q8_1 *y) {
    const __m256i hi = _mm256_and_si256(bits32(x->qh), _mm256_set1_epi8(0x10));
    const __m256i qx = _mm256_or_si256(nibbles32(x->qs), hi);
    return _mm256_cvtepi32_ps(dot_us8(qx, load32(y->qs)));
}

static inline __m256 sums_q8_0(const block_q8_0 *x, const block_q8_0 *y) {
    return _mm256_cvtepi32_ps(dot_ss8(load32(x->qs), load32(y->qs)));
}

/* One accumulator, block after block, as ggml: acc = fma(d_w*d_a, lanes, acc).
 * The FMA chain bounds the speed, so the loop is kept as plain as ggml's. For
 * Q4_1/Q5_1 (BIASED, x = d*q + m) the m_w*s_a terms form their own running
 * fma, added after the horizontal sum. */
#define DOT_32(NAME, WT, AT, SUMS, BIASED)                                                 \
    static float NAME(int64_t n, const void *vw, const void *va) {                        \
        const WT *x = vw;                                                                 \
        const AT *y = va;                                                                 \
        const int64_t nb = n / 32;                                                        \
        __m256 acc = _mm256_setzero_ps();                                                 \
        float summs = 0.0f;                                                               \
        for (int64_t i = 0; i < nb; i++) {                                                \
            const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));                   \
            acc = _mm256_fmadd_ps(d, SUMS(x + i, y + i), acc);                            \
            if (BIASED) summs = fma1(h2f_at(x + i, 1), h2f_at(y + i, 1), summs);          \
        }                                                                                 \
        return BIASED ? hsum_f8(acc) + summs : hsum_f8(acc);                              \
    }

DOT_32(dot_q4_0, block_q4_0, block_q8_0, sums_q4_0, 0)
DOT_32(dot_q4_1, block_q4_1, block_q8_1, sums_q4_1, 1)
DOT_32(dot_q5_0, block_q5_0, block_q8_0, sums_q5_0, 0)
DOT_32(dot_q5_1, block_q5_1, block_q8_1, sums_q5_1, 1)
DOT_32(dot_q8_0, block_q8_0, block_q8_0, sums_q8_0, 0)


/* ---- gemm tiles on packed rows ------------------------------------------------------- */

#define TILE_DOT(u, s) dot_us8(u, s)
#include "cpu/tile32.h"
#define R8_VNNI 0
#include "cpu/r8_tile.h"

/* ---- K-quants against Q8_K: one 256-superblock per step ----------------------------- */

/* The 12 packed bytes -> 16 int16: the 8 six-bit scales, then the 8 six-bit mins
 * (Q4_K/Q5_K). */
static inline __m128i k_scales(const uint8_t *p) {
    uint32_t a, b, c;
    memcpy(&a, p, 4);
    memcpy(&b, p + 4, 4);
    memcpy(&c, p + 8, 4);
    const uint32_t s_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    return _mm_setr_epi32((int)(a & 0x3f3f3f3fu), (int)s_hi, (int)(b & 0x3f3f3f3fu), (int)m_hi);
}

/* sum over the 8 sub-blocks of 32 of min * (sum of their activation quants);
 * mins: 8 int16. */
static inline int k_min_dot(__m128i mins, const int16_t *bsums) {
    const __m128i b = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                     _mm_loadu_si128((const __m128i *)(bsums + 8)));
    const __m128i p = _mm_madd_epi16(b, mins);
    __m128i s = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* u (0..63) x q8 bytes, times int16 scale number s of sc (both lanes hold the
 * 8 scales) for all 32 -> 8 int32. */
static inline __m256i scaled_dot32(__m256i u, __m256i q8, __m256i sc, int s) {
    const __m256i pick = _mm256_set1_epi16((short)(0x0100 + 0x0202 * s));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q8), _mm256_shuffle_epi8(sc, pick));
}

/* 64 elements of a Q4_K/Q5_K superblock: sub-blocks 2j (low nibbles) and 2j+1
 * (high nibbles), with their 5th bits from qh bits 2j and 2j+1 when qh is given.
 * Called with literal j so the shuffle and mask constants fold. */
static inline __m256i k_chunk64(const uint8_t *qs, const uint8_t *qh, const int8_t *q8, __m256i sc, int j) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i q = load32(qs + 32 * j);
    __m256i lo = _mm256_and_si256(q, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if (qh) {
        const __m256i h = load32(qh), b4 = _mm256_set1_epi8(0x10);
        const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * j))), bh = _mm256_set1_epi8((char)(2 << (2 * j)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bl), bl), b4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bh), bh), b4));
    }
    const __m256i p0 = scaled_dot32(lo, load32(q8 + 64 * j), sc, 2 * j);
    const __m256i p1 = scaled_dot32(hi, load32(q8 + 64 * j + 32), sc, 2 * j + 1);
    return _mm256_add_epi32(p0, p1);
}

/* A Q4_K/Q5_K superblock's 8 int32 lanes of scale * (q . q8) (lane k: elements
 * 4k..4k+3 of each sub-block, as ggml's vec_dot) and, in *imin, the integer
 * min term sum of min * bsum. qh is NULL for Q4_K. */
static inline __m256i k45_superblock(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                                     const block_q8_K *y, int *imin) {
    const __m256i sm = _mm256_cvtepu8_epi16(k_scales(scales));
    const __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00);
    const __m256i s01 = _mm256_add_epi32(k_chunk64(qs, qh, y->qs, sc, 0), k_chunk64(qs, qh, y->qs, sc, 1));
    const __m256i s23 = _mm256_add_epi32(k_chunk64(qs, qh, y->qs, sc, 2), k_chunk64(qs, qh, y->qs, sc, 3));
    *imin = k_min_dot(_mm256_extracti128_si256(sm, 1), y->bsums);
    return _mm256_add_epi32(s01, s23);
}

/* Q4_K in the order of llama.cpp's repacked AVX2 gemv (see quant.c): per
 * superblock one fma of the integer total, the mins in a second sum. */
static float dot_q4_K(int64_t n, const void *vw, const void *va) {
    const block_q4_K *x = vw;
    const block_q8_K *y = va;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int imin;
        const int isum = hsum_i8x32(k45_superblock(x[i].scales, x[i].qs, NULL, y + i, &imin));
        acc = fma1((float)isum, h2f(x[i].d) * y[i].d, acc);
        accm = fma1((float)imin, h2f(x[i].dmin) * y[i].d, accm);
    }
    return acc - accm;
}

/* Q5_K as ggml's AVX2 vec_dot: 8 lanes per superblock, min term a scalar fma. */
static float dot_q5_K(int64_t n, const void *vw, const void *va) {
    const block_q5_K *x = vw;
    const block_q8_K *y = va;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int imin;
        const __m256i sumi = k45_superblock(x[i].scales, x[i].qs, x[i].qh, y + i, &imin);
        const float d = y[i].d * h2f(x[i].d), dmin = -y[i].d * h2f(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        summs = fma1(dmin, (float)imin, summs);
    }
    return hsum_f8(acc) + summs;
}

/* u (0..63) x q8 bytes; int8 scales sc[g] for the first 16, sc[g+1] for the next. */
static inline __m256i q6_dot32(__m256i u, __m256i q8, __m128i scales, int g) {
    const __m128i sel = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                     _mm_set1_epi8((char)g));
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, sel));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q8), s16);
}

/* q = (4 low bits | 2 high bits << 4) - 32; the -32 is applied once per superblock
 * through the activation group sums. The 8 int32 lanes are ggml's (see quant.c):
 * they can pass 2^24, so even their float conversion depends on the grouping. */
static float dot_q6_K(int64_t n, const void *vw, const void *va) {
    const block_q6_K *x = vw;
    const block_q8_K *y = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i bias = _mm256_madd_epi16(load32(y[i].bsums), _mm256_cvtepi8_epi16(scales));
        __m256i sumi = _mm256_slli_epi32(bias, 5);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = load32(x[i].ql + 64 * h), l1 = load32(x[i].ql + 64 * h + 32);
            const __m256i qh = load32(x[i].qh + 32 * h);
            const int8_t *q8 = y[i].qs + 128 * h;
            const __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            const __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_and_si256(qh, m30));
            const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            const __m256i p0 = q6_dot32(u0, load32(q8), scales, 8 * h + 0);
            const __m256i p1 = q6_dot32(u1, load32(q8 + 32), scales, 8 * h + 2);
            const __m256i p2 = q6_dot32(u2, load32(q8 + 64), scales, 8 * h + 4);
            const __m256i p3 = q6_dot32(u3, load32(q8 + 96), scales, 8 * h + 6);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p0, p1),
                                                           _mm256_add_epi32(p2, p3)));
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f8(acc);
}

/* IQ4_NL, MXFP4 and IQ4_XS in ggml's AVX2 orders (quant.c's references, the
 * same bits): the table lookup by vpshufb, each int32 lane the exact sum of 4
 * products (|w| x a with w's sign through maddubs, then madd). */
AI __m256i lut_dot32(__m256i table, const uint8_t *qs, const int8_t *a) {
    const __m256i w = _mm256_shuffle_epi8(table, nibbles32(qs)), q = load32(a);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
}

/* IQ4_NL and MXFP4 (ggml_vec_dot_*_q8_0): blocks in pairs, even ones into one
 * accumulator and odd ones into another, added lane by lane, the tree; an odd
 * last block after, as a scalar. */
AI float dot_lut32(int mx, int64_t n, const void *vw, const void *va) {
    const int64_t nb = n / 32;
    const uint8_t *x = vw;
    const block_q8_0 *y = va;
    const size_t bs = mx ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const __m256i table = bcast16(mx ? tl_kvalues_mxfp4 : tl_kvalues_iq4nl), one = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t ib = 0;
    for (; ib + 1 < nb; ib += 2)
        for (int h = 0; h < 2; h++) {
            const uint8_t *b = x + (size_t)(ib + h) * bs;
            const block_q8_0 *a = &y[ib + h];
            const float scale = h2f(a->d) * (mx ? tl_e8m0_half(b[0]) : h2f_at(b, 0));
            const __m256i sum = _mm256_madd_epi16(lut_dot32(table, b + (mx ? 1 : 2), a->qs), one);
            acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sum), acc[h]);
        }
    float sumf = hsum_f8(_mm256_add_ps(acc[0], acc[1]));
    for (; ib < nb; ib++) {
        const uint8_t *b = x + (size_t)ib * bs, *qs = b + (mx ? 1 : 2);
        const int8_t *tv = mx ? tl_kvalues_mxfp4 : tl_kvalues_iq4nl;
        const float d = h2f(y[ib].d) * (mx ? tl_e8m0_half(b[0]) : h2f_at(b, 0));
        int s1 = 0, s2 = 0;
        for (int j = 0; j < 16; j++) {
            s1 += y[ib].qs[j] * tv[qs[j] & 0x0F];
            s2 += y[ib].qs[j + 16] * tv[qs[j] >> 4];
        }
        sumf += d * (float)(s1 + s2);
    }
    return sumf;
}

/* The same weights as llama.cpp runs them once repacked (kernels.h
 * vec_dot_x8): one chain over the blocks, each block's exact sum first. */
static const int8_t q4_0_values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
/* mx: 0 IQ4_NL, 1 MXFP4, 2 Q4_0 (its nibble - 8 as the table; block_q4_0 is
 * laid out as block_iq4_nl) */
AI float dot_lut32_x8(int mx, int64_t n, const void *vw, const void *va) {
    const uint8_t *x = vw;
    const block_q8_0 *y = va;
    const size_t bs = mx == 1 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const __m256i table = bcast16(mx == 1 ? tl_kvalues_mxfp4 : mx == 2 ? q4_0_values : tl_kvalues_iq4nl),
                  one = _mm256_set1_epi16(1);
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        const uint8_t *b = x + (size_t)ib * bs;
        const __m256i s = _mm256_madd_epi16(lut_dot32(table, b + (mx == 1 ? 1 : 2), y[ib].qs), one);
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        const float dw = mx == 1 ? tl_e8m0_half(b[0]) : h2f_at(b, 0);
        acc = fmaf((float)_mm_cvtsi128_si32(h), dw * h2f(y[ib].d), acc);
    }
    return acc;
}

/* IQ4_NL as tinyBLAS multiplies a matrix llama.cpp does not repack (quant.c's
 * reference): one 8-lane chain over every block, the tree. */
static float dot_iq4_nl(int64_t n, const void *vw, const void *va) {
    const uint8_t *x = vw;
    const block_q8_0 *y = va;
    const __m256i table = bcast16(tl_kvalues_iq4nl), one = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ib++) {
        const uint8_t *b = x + (size_t)ib * sizeof(block_iq4_nl);
        const __m256i sum = _mm256_madd_epi16(lut_dot32(table, b + 2, y[ib].qs), one);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_at(b, 0) * h2f(y[ib].d)), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum_f8(acc);
}
static float dot_iq4_nl_ggml(int64_t n, const void *w, const void *a) { return dot_lut32(0, n, w, a); }
static float dot_iq4_nl_x8(int64_t n, const void *w, const void *a) { return dot_lut32_x8(0, n, w, a); }
static float dot_mxfp4_x8(int64_t n, const void *w, const void *a) { return dot_lut32_x8(1, n, w, a); }
static float dot_q4_0_x8(int64_t n, const void *w, const void *a) { return dot_lut32_x8(2, n, w, a); }
static float dot_mxfp4(int64_t n, const void *w, const void *a) { return dot_lut32(1, n, w, a); }

/* IQ4_XS (ggml_vec_dot_iq4_xs_q8_K): per super-block 8 int32 lanes summing
 * scale x (4 products) over the sub-blocks, one fma per lane, the tree. */
static float dot_iq4_xs(int64_t n, const void *vw, const void *va) {
    const block_iq4_xs *x = vw;
    const block_q8_K *y = va;
    const __m256i table = bcast16(tl_kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i lane = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int ls = tl_iq4_xs_scale(&x[i], ib);
            const __m256i p = lut_dot32(table, x[i].qs + 16 * ib, y[i].qs + 32 * ib);
            lane = _mm256_add_epi32(lane, _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lane), acc);
    }
    return hsum_f8(acc);
}

/* Q2_K and Q3_K: the reference's exact integer sums per super-block (scale x
 * (q . q8) and, Q2_K, min x bsum), then its scalar float steps, so the same
 * bits (see quant.c; neither is ggml's float order). A 32-byte quant vector is
 * elements 128h + 32j .. +31: 16-element groups 8h + 2j and 8h + 2j + 1, whose
 * int16 pair sums madd with their two scales. */
AI __m256i k2_group_scales(const int8_t *sc, int g) {
    return _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
}

static float dot_q2_K(int64_t n, const void *vw, const void *va) {
    const block_q2_K *x = vw;
    const block_q8_K *y = va;
    const __m256i m3 = _mm256_set1_epi8(3);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        int summs = 0;
        for (int g = 0; g < 16; g++) {
            sc[g] = (int8_t)(x[i].scales[g] & 0xF);
            summs += y[i].bsums[g] * (x[i].scales[g] >> 4);
        }
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = load32(x[i].qs + 32 * h);
            for (int j = 0; j < 4; j++) {
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                const __m256i p = _mm256_maddubs_epi16(u, load32(y[i].qs + 128 * h + 32 * j));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, k2_group_scales(sc, 8 * h + 2 * j)));
            }
        }
        const int isum = hsum_i8x32(acc);
        const float dall = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        s += dall * (float)isum - dmin * (float)summs;
    }
    return s;
}

/* Q3_K's value is its 2 low bits, less 4 where the high bit is clear: two
 * maddubs (2 x 3 x 128 and 2 x 4 x 128 fit int16), one subtract. */
static float dot_q3_K(int64_t n, const void *vw, const void *va) {
    const block_q3_K *x = vw;
    const block_q8_K *y = va;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        tl_q3k_scales(x[i].scales, sc);
        const __m256i hm = load32(x[i].hmask);
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = load32(x[i].qs + 32 * h);
            for (int j = 0; j < 4; j++) {
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one);
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                const __m256i neg = _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2); /* 4: high bit clear */
                const __m256i a = load32(y[i].qs + 128 * h + 32 * j);
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a), _mm256_maddubs_epi16(neg, a));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, k2_group_scales(sc, 8 * h + 2 * j)));
            }
        }
        const int isum = hsum_i8x32(acc);
        s += h2f(x[i].d) * y[i].d * (float)isum;
    }
    return s;
}

/* ---- K-quant gemm: one weight row x up to 4 tokens, unpacked once ------------------ */

/* Q4_K: the superblock's quants and scales are unpacked once for N tokens; each
 * token's integer totals are exact, and its two float sums see the operations of
 * dot_q4_K in the same order. */
AI void tile_q4_K(int N, int64_t n, const block_q4_K *x, const block_q8_K *const *y, float *out, size_t ys) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float acc[4] = {0}, accm[4] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256i sm = _mm256_cvtepu8_epi16(k_scales(x[i].scales));
        const __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00);
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        __m256i isum[4];
        UNROLL
        for (int t = 0; t < N; t++) isum[t] = _mm256_setzero_si256();
        UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256i q = load32(x[i].qs + 32 * j);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            UNROLL
            for (int t = 0; t < N; t++) {
                const int8_t *q8 = y[t][i].qs + 64 * j;
                const __m256i p = _mm256_add_epi32(scaled_dot32(lo, load32(q8), sc, 2 * j),
                                                   scaled_dot32(hi, load32(q8 + 32), sc, 2 * j + 1));
                isum[t] = _mm256_add_epi32(isum[t], p);
            }
        }
        UNROLL
        for (int t = 0; t < N; t++) {
            const float dy = y[t][i].d;
            acc[t] = fma1((float)hsum_i8x32(isum[t]), h2f(x[i].d) * dy, acc[t]);
            accm[t] = fma1((float)k_min_dot(mins, y[t][i].bsums), h2f(x[i].dmin) * dy, accm[t]);
        }
    }
    UNROLL
    for (int t = 0; t < N; t++) out[(size_t)t * ys] = acc[t] - accm[t];
}

/* Q6_K: the unpacked quants and scales of each half-superblock serve N tokens;
 * each token's 8 int32 lanes are dot_q6_K's, then the same float steps. */
AI void tile_q6_K(int N, int64_t n, const block_q6_K *x, const block_q8_K *const *y, float *out, size_t ys) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    UNROLL
    for (int t = 0; t < N; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i s16 = _mm256_cvtepi8_epi16(scales);
        __m256i sumi[4];
        UNROLL
        for (int t = 0; t < N; t++) {
            const __m256i bias = _mm256_madd_epi16(load32(y[t][i].bsums), s16);
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bias, 5));
        }
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = load32(x[i].ql + 64 * h), l1 = load32(x[i].ql + 64 * h + 32);
            const __m256i qh = load32(x[i].qh + 32 * h);
            const __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            const __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            UNROLL
            for (int t = 0; t < N; t++) {
                const int8_t *q8 = y[t][i].qs + 128 * h;
                const __m256i p0 = q6_dot32(u0, load32(q8), scales, 8 * h + 0);
                const __m256i p1 = q6_dot32(u1, load32(q8 + 32), scales, 8 * h + 2);
                const __m256i p2 = q6_dot32(u2, load32(q8 + 64), scales, 8 * h + 4);
                const __m256i p3 = q6_dot32(u3, load32(q8 + 96), scales, 8 * h + 6);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
            }
        }
        UNROLL
        for (int t = 0; t < N; t++) {
            const float d = y[t][i].d * h2f(x[i].d);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < N; t++) out[(size_t)t * ys] = hsum_f8(acc[t]);
}

/* Rows one by one (a K-quant row's unpacking is the shared work), tokens by 4.
 * Weights as stored (no packed layout), activations plain Q8_K rows. */
#define GEMM_K(NAME, WT, TILE)                                                                      \
    static void NAME(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt,  \
                     float *y, size_t ys) {                                                         \
        for (int t0 = 0; t0 < nt; t0 += 4) {                                                        \
            const int tn = nt - t0 < 4 ? nt - t0 : 4;                                               \
            const block_q8_K *yt[4];                                                                \
            for (int t = 0; t < tn; t++) yt[t] = (const block_q8_K *)((const uint8_t *)a + (size_t)(t0 + t) * as); \
            for (int r = 0; r < nr; r++) {                                                          \
                const WT *x = (const WT *)((const uint8_t *)w + (size_t)r * ws);                    \
                float *o = y + (size_t)t0 * ys + r;                                                 \
                switch (tn) {                                                                       \
                case 1: TILE(1, n, x, yt, o, ys); break;                                            \
                case 2: TILE(2, n, x, yt, o, ys); break;                                            \
                case 3: TILE(3, n, x, yt, o, ys); break;                                            \
                default: TILE(4, n, x, yt, o, ys); break;                                           \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }
GEMM_K(gemm_q4_K, block_q4_K, tile_q4_K)
GEMM_K(gemm_q6_K, block_q6_K, tile_q6_K)
#undef GEMM_K

/* ---- F16 -------------------------------------------------------------------------- */

static inline __m256 load_h8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* llamafile tinyBLAS's order (see quant.c): one accumulator, 8 at a time. */
static float dot_f16_f16(int64_t n, const uint16_t *x, const uint16_t *y) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(load_h8(x + i), load_h8(y + i), acc);
    float s = hsum_f8(acc);
    for (; i < n; i++) s = fma1(h2f(x[i]), h2f(y[i]), s);
    return s;
}

/* Four rows x (x, x + xs, ...) against one y: four independent FMA chains, each
 * in dot_f16_f16's order (attention scores of four keys). */
static void dot_f16_x4(int64_t n, const uint16_t *x, size_t xs, const uint16_t *y, float out[4]) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 yv = load_h8(y + i);
        for (int r = 0; r < 4; r++) acc[r] = _mm256_fmadd_ps(load_h8(x + (size_t)r * xs + i), yv, acc[r]);
    }
    for (int r = 0; r < 4; r++) {
        float s = hsum_f8(acc[r]);
        for (int64_t k = i; k < n; k++) s = fma1(h2f(x[(size_t)r * xs + k]), h2f(y[k]), s);
        out[r] = s;
    }
}

static float dot_f16(int64_t n, const void *w, const void *a) { return dot_f16_f16(n, w, a); }

/* F32 weights: tinyBLAS's F32 order, as the F16 one above. */
static float dot_f32(int64_t n, const void *w, const void *a) {
    const float *x = w, *y = a;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
    float s = hsum_f8(acc);
    for (; i < n; i++) s = fma1(x[i], y[i], s);
    return s;
}

/* ggml_vec_dot_f32's order (kern_ref.c's ref_dot_f32_ggml, bit for bit):
 * four 8-lane fma chains over steps of 32, folded 0+2, 1+3, then 0+1, the
 * halves added and two hadds; the leftovers in blocks of 8 and 4 multiplied
 * and added in order, the last 0-3 fused. The reference's fmaf is a libm call
 * per element in a generic build: the encoders' attention spends its time
 * there. */
static float dot_f32_ggml(int64_t n, const void *w, const void *a) {
    const float *x = w, *y = a;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), c2);
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), c3);
    }
    const __m256 v = _mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3));
    __m128 t = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    t = _mm_hadd_ps(t, t);
    t = _mm_hadd_ps(t, t);
    float s = _mm_cvtss_f32(t);
    const int64_t rem = n - np, fused = np + (rem & ~(int64_t)7) + ((rem & 7) >= 4 ? 4 : 0);
    int64_t i = np;
    for (; i < fused; i++) s += x[i] * y[i];
    for (; i < n; i++) s = fma1(x[i], y[i], s);
    return s;
}

/* F32 rows x F32 activations, 2 rows x 4 tokens at a time: eight
 * independent chains, each dot_f32's (one accumulator, 8 at a time, the same
 * tail), so every output has dot_f32's bits; one chain alone waits on each
 * fma's latency (an F32 router over a prompt). y[t * ys + r]. */
static void tile_f32(int64_t n, const float *w, size_t ws, int nr, const float *a, size_t as, int nt, float *y,
                     size_t ys) {
    for (int r0 = 0; r0 < nr; r0 += 2) {
        const int rn = nr - r0 < 2 ? nr - r0 : 2;
        for (int t0 = 0; t0 < nt; t0 += 4) {
            const int tn = nt - t0 < 4 ? nt - t0 : 4;
            __m256 acc[2][4];
            for (int r = 0; r < 2; r++)
                for (int t = 0; t < 4; t++) acc[r][t] = _mm256_setzero_ps();
            const float *w0 = w + (size_t)r0 * ws, *w1 = w0 + (rn > 1 ? ws : 0);
            const float *a0 = a + (size_t)t0 * as, *a1 = a0 + (tn > 1 ? as : 0), *a2 = a0 + (tn > 2 ? 2 * as : 0),
                        *a3 = a0 + (tn > 3 ? 3 * as : 0);
            int64_t i = 0;
            for (; i + 8 <= n; i += 8) {
                const __m256 x0 = _mm256_loadu_ps(w0 + i), x1 = _mm256_loadu_ps(w1 + i);
                const __m256 b0 = _mm256_loadu_ps(a0 + i), b1 = _mm256_loadu_ps(a1 + i), b2 = _mm256_loadu_ps(a2 + i),
                             b3 = _mm256_loadu_ps(a3 + i);
                acc[0][0] = _mm256_fmadd_ps(x0, b0, acc[0][0]);
                acc[0][1] = _mm256_fmadd_ps(x0, b1, acc[0][1]);
                acc[0][2] = _mm256_fmadd_ps(x0, b2, acc[0][2]);
                acc[0][3] = _mm256_fmadd_ps(x0, b3, acc[0][3]);
                acc[1][0] = _mm256_fmadd_ps(x1, b0, acc[1][0]);
                acc[1][1] = _mm256_fmadd_ps(x1, b1, acc[1][1]);
                acc[1][2] = _mm256_fmadd_ps(x1, b2, acc[1][2]);
                acc[1][3] = _mm256_fmadd_ps(x1, b3, acc[1][3]);
            }
            const float *wr[2] = {w0, w1}, *at[4] = {a0, a1, a2, a3};
            for (int r = 0; r < rn; r++)
                for (int t = 0; t < tn; t++) {
                    float s = hsum_f8(acc[r][t]);
                    for (int64_t k = i; k < n; k++) s = fma1(wr[r][k], at[t][k], s);
                    y[(size_t)(t0 + t) * ys + (size_t)(r0 + r)] = s;
                }
        }
    }
}

/* ---- activation quantizers ------------------------------------------------------------ */

static inline float hmax_f8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Rounds half to even and packs 4x8 int32 into 32 int8 in element order;
 * returns the int32 sum of the quants. */
static inline int round_pack32(const __m256 v[4], __m256 mul, int8_t *out) {
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(
            _mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const int sum = hsum_i8x32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    /* packs work per 128-bit lane: the permute restores element order */
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p8);
    return sum;
}

/* One 32-block as x86 ggml does it: multiplier 127/amax (not 1/d), d = amax/127. */
static inline int quant_blk32(const float *x, int8_t *qs, float *d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    const float m = hmax_f8(amax);
    *d = m / 127.f;
    return round_pack32(v, _mm256_set1_ps(m != 0.0f ? 127.f / m : 0.0f), qs);
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d;
        quant_blk32(x + 32 * i, y[i].qs, &d);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        float d;
        const int sum = quant_blk32(x + 32 * i, y[i].qs, &d);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
    }
}

/* tl_r8_act_make's row (cpu/r8.c: the quants, then per block d and s as
 * their half floats widened, then the quants' sums) without a block_q8_1 in
 * between: quant_blk32 has the sum already. A call and a byte loop per
 * block made SmolLM2's activation rows ~10% of a 512-token prompt. */
static void r8_act_q8_1(const float *x, void *row, int64_t n) {
    const int64_t nb = n / 32;
    int8_t *q = row;
    float *d = (float *)(void *)((uint8_t *)row + n), *s = d + nb;
    int32_t *sum = (int32_t *)(void *)(s + nb);
    for (int64_t b = 0; b < nb; b++) {
        float db;
        const int t = quant_blk32(x + 32 * b, q + 32 * b, &db);
        const __m128 h = _mm_cvtph_ps(_mm_cvtps_ph(_mm_setr_ps(db, db * (float)t, 0.0f, 0.0f), _MM_FROUND_TO_NEAREST_INT));
        d[b] = _mm_cvtss_f32(h);
        s[b] = _mm_cvtss_f32(_mm_movehdup_ps(h));
        sum[b] = t;
    }
}

/* Q8_K as the reference: scale -127/max where max is the first element of largest
 * magnitude (its sign matters), d = 1/scale kept as float, group sums of 16. */
static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        memset(&y[i], 0, sizeof y[i]);
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8)
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), amax);
        const float am = hmax_f8(amax);
        if (am == 0.0f) continue;
        const __m256 vam = _mm256_set1_ps(am);
        float max = 0.0f;
        for (int k = 0; k < QK_K; k += 8) {
            const __m256 ax = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(ax, vam, _CMP_EQ_OQ));
            if (hit) {
                max = x[k + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 32) {
            const __m256 v[4] = {_mm256_loadu_ps(x + k), _mm256_loadu_ps(x + k + 8),
                                 _mm256_loadu_ps(x + k + 16), _mm256_loadu_ps(x + k + 24)};
            round_pack32(v, mul, y[i].qs + k);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y[i].qs + 16 * g)));
            y[i].bsums[g] = (int16_t)hsum_i8x32(_mm256_madd_epi16(q, _mm256_set1_epi16(1)));
        }
        y[i].d = 1 / iscale;
    }
}

/* f32 -> f16 round to nearest even; NaNs become the reference's quiet NaN
 * (sign | 0x7e00) rather than keeping their payload as F16C does. */
static inline __m128i f32_to_h8(__m256 v) {
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    const __m128i qnan = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7e00));
    return _mm_blendv_epi8(h, qnan, nan);
}

static void quantize_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), f32_to_h8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float tmp[8] = {0};
        uint16_t out[8];
        memcpy(tmp, x + i, (size_t)(n - i) * sizeof(float));
        _mm_storeu_si128((__m128i *)out, f32_to_h8(_mm256_loadu_ps(tmp)));
        memcpy(y + i, out, (size_t)(n - i) * sizeof(uint16_t));
    }
}

void tl_kernels_fill_avx2(tl_kernels *k, tl_num_mode mode) {
    k->vec_dot[TL_Q4_0] = dot_q4_0;
    k->vec_dot[TL_Q4_1] = dot_q4_1;
    tile32_fill(k);
    k->gemm[TL_Q4_K] = gemm_q4_K;
    k->gemm[TL_Q6_K] = gemm_q6_K;
    if (mode == TL_NUM_FAST) r8_fill(k); /* last: it replaces exact-order entries */
    k->vec_dot[TL_Q5_0] = dot_q5_0;
    k->vec_dot[TL_Q5_1] = dot_q5_1;
    k->vec_dot[TL_Q8_0] = dot_q8_0;
    k->vec_dot[TL_Q4_K] = dot_q4_K;
    k->vec_dot[TL_Q5_K] = dot_q5_K;
    k->vec_dot[TL_Q6_K] = dot_q6_K;
    k->vec_dot[TL_Q2_K] = dot_q2_K;
    k->vec_dot[TL_Q3_K] = dot_q3_K;
    k->vec_dot[TL_IQ4_NL] = dot_iq4_nl;
    k->vec_dot[TL_MXFP4] = dot_mxfp4;
    k->vec_dot_x8[TL_IQ4_NL] = dot_iq4_nl_x8;
    k->vec_dot_x8[TL_MXFP4] = dot_mxfp4_x8;
    k->vec_dot_x8[TL_Q4_0] = dot_q4_0_x8;
    k->vec_dot[TL_IQ4_XS] = dot_iq4_xs;
    k->vec_dot[TL_F16] = dot_f16;
    k->vec_dot[TL_F32] = dot_f32;
    k->vec_dot_id[TL_F32] = dot_f32_ggml;
    k->vec_dot_id[TL_IQ4_NL] = dot_iq4_nl_ggml;
    k->tile_f32 = tile_f32;
    k->quantize[TL_Q8_0] = quantize_q8_0;
    k->quantize[TL_Q8_1] = quantize_q8_1;
    k->r8_act = r8_act_q8_1;
    k->quantize[TL_Q8_K] = quantize_q8_K;
    k->quantize[TL_F16] = quantize_f16;
    k->dot_f16 = dot_f16_f16;
    k->dot_f16_x4 = dot_f16_x4;
}
