/* cpu/r8_tile: the fast gemm of the 32-block formats on r8 rows (cpu/r8.c),
 * in tiles of 8-row groups x tokens. Included by a kernel file after it defines
 * R8_VNNI: 1 for vpdpbusd on 256-bit vectors (AVX-512 VL + VNNI), 0 for AVX2's
 * maddubs. Lane r of every vector is row r of a group, so one integer dot
 * instruction gives 8 rows x 4 products, and the block's float work is one
 * convert, one multiply and one fma for 8 rows. The result is bitwise that of
 * the scalar reference in cpu/r8.c, whatever the tile. Defines r8_fill(). */
#ifndef TL_CPU_R8_TILE_H
#define TL_CPU_R8_TILE_H

#include "cpu/kernels.h"
#include "cpu/simd256.h"

/* Tiles: R8_DM groups for one token (decode), R8_PM groups x R8_PN tokens for
 * prompts, within the registers (16 ymm on AVX2, 32 with AVX-512 VL). Decode
 * reads one group (one stream) at a time: on an AMD EPYC (Zen 4, DRAM-bound
 * files) two side by side read ~15% slower than one, on AVX2 and AVX-512. */
#ifndef R8_DM
#define R8_DM 1
#endif
/* Up to R8_DTN tokens (a decode step's rows: forward.c's decode path takes
 * 1-3) go one group at a time too: a verification step of 2 rows, which the
 * 512-bit pair tiles read as four streams, took 1.6x a one-row step on
 * SmolLM2 Q4_1 (AMD EPYC), 1.35x this way. */
#ifndef R8_DTN
#define R8_DTN 3
#endif
#ifndef R8_PM
#define R8_PM 1
#endif
#ifndef R8_PN
#define R8_PN 4
#endif
/* 512-bit tiles (kern_avx512.c): R8Z_PM group pairs x up to 4 tokens. */
#ifndef R8_ZMM
#define R8_ZMM 0
#endif
#ifndef R8Z_PM
#define R8Z_PM 2
#endif
_Static_assert(!R8_ZMM || R8_PN == 4, "the 512-bit token switch makes 1..4");
_Static_assert(R8_PN == 4 || R8_PN == 6 || R8_PN == 8, "the token switch below makes 1..R8_PN");

/* Each group stream asks TL_WEIGHT_PREFETCH bytes ahead (kernels.h); only
 * Intel asks (on AMD the decode tiles leave the stream to the core:
 * hw_stream). */
#ifndef R8_PREFETCH
#define R8_PREFETCH TL_WEIGHT_PREFETCH
#endif
#ifndef R8_HINT
#define R8_HINT _MM_HINT_T1
#endif
#ifdef R8_NOPF
#define R8_PF(p) ((void)(p))
#else
#define R8_PF(p) _mm_prefetch((const char *)(p), R8_HINT)
#endif
/* The decode tiles (one group, a few tokens) can go without: their bytes are
 * read in address order, which the core's own prefetchers follow. On an AMD
 * EPYC (Zen 4; two cores each decoding a DRAM-sized matrix) leaving them out
 * read Q4_K ~1.6x, Q8_0 1.15x, Q6_K 1.1x, Q4_1 1.08x as fast, Q4_0 the same.
 * r8_fill picks by the CPU (kernels.h's hw_stream); Intel keeps them. */

enum { R_Q4_0, R_Q4_1, R_Q5_0, R_Q5_1, R_Q8_0, R_LUT };
/* The table formats share one compiled tile (R_LUT) and differ by a run-time
 * kind, read once per block, outside the integer loop: every tile instance
 * costs compile time (a minute each in the SIMDe-emulated ASan build). */
enum { LK_NL, LK_MX, LK_XS }; /* IQ4_NL, MXFP4, IQ4_XS */

AI int r_biased(int f) { return f == R_Q4_1 || f == R_Q5_1; }
AI int r_q5(int f) { return f == R_Q5_0 || f == R_Q5_1; }
AI int r_lut(int f) { return f == R_LUT; }
/* signed 8-bit weights in the integer dot (Q8_0's, or a table's values) */
AI int r_s8(int f) { return f == R_Q8_0 || r_lut(f); }
/* one block of a group: 8 rows' d (e for MXFP4, sc for IQ4_XS), m, qh and quants */
AI size_t r_blk(int f, int lk) {
    if (r_lut(f)) return lk == LK_NL ? 16 + 128 : 8 + 128;
    return 16 + (r_biased(f) ? 16 : 0) + (r_q5(f) ? 32 : 0) + (f == R_Q8_0 ? 256 : 128);
}
AI size_t r_qh_off(int f) { return 16 + (r_biased(f) ? 16 : 0); }
AI size_t r_qs_off(int f, int lk) {
    if (r_lut(f)) return lk == LK_NL ? 16 : 8;
    return r_qh_off(f) + (r_q5(f) ? 32 : 0);
}
/* block b within a group (IQ4_XS: after its superblock's d[8]) */
AI size_t r_boff(int f, int lk, int64_t b) {
    if (r_lut(f) && lk == LK_XS) return (size_t)(b >> 3) * 8 * R8_XS_SB + 16 + (size_t)(b & 7) * R8_XS_BLK;
    return (size_t)b * r_blk(f, lk);
}
/* A table in both 128-bit lanes, for vpshufb: with VNNI plus 128 (unsigned
 * operands; the offset goes through the activation sums as Q8_0's does). */
AI __m256i r_table(int f, int lk) {
    if (!r_lut(f)) return _mm256_setzero_si256();
    const __m256i t = bcast16(lk == LK_MX ? tl_kvalues_mxfp4 : tl_kvalues_iq4nl);
    return R8_VNNI ? _mm256_xor_si256(t, _mm256_set1_epi8((char)0x80)) : t;
}
/* MXFP4's 8 E8M0 bytes -> 2^(e-128) (0 for e < 2), as tl_r8_e8m0 */
AI __m256 r_e8m0(const uint8_t *e) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)e));
    const __m256i m = _mm256_sub_epi32(_mm256_max_epu32(v, _mm256_set1_epi32(1)), _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_slli_epi32(m, 23));
}
/* The 8 rows' weight scales of block b (blk: its address, grp: the group's). */
AI __m256 r_dw(int f, int lk, const uint8_t *grp, int64_t b, const uint8_t *blk) {
    if (r_lut(f) && lk == LK_MX) return r_e8m0(blk);
    if (r_lut(f) && lk == LK_XS) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + (size_t)(b >> 3) * 8 * R8_XS_SB)));
        const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)blk));
        return _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
}

/* Full unrolling: the k loops run 8 times and their vectors must stay in registers. */
#ifndef UNROLL8
#define UNROLL8 _Pragma("GCC unroll 8")
#endif

/* Weight vector k of a block: 8 rows x 4 quants, pairing with activation bytes
 * 4k..4k+3. Q4/Q5 give the unsigned quants (their offset goes through the
 * activation sums); Q8_0 the signed bytes, with VNNI plus 128 as unsigned
 * (its sum again). */
AI __m256i r_wvec(int f, int lk, __m256i tab, const uint8_t *blk, int k) {
    const uint8_t *qs = blk + r_qs_off(f, lk);
    if (f == R_Q8_0) {
        const __m256i v = load32(qs + 32 * k);
        return R8_VNNI ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
    }
    const __m256i v = load32(qs + 32 * (k & 3)), m4 = _mm256_set1_epi8(0x0F);
    __m256i u = _mm256_and_si256(k < 4 ? v : _mm256_srli_epi16(v, 4), m4);
    if (r_lut(f)) return _mm256_shuffle_epi8(tab, u);
    if (r_q5(f)) { /* bit k of each qh byte to bit 4 (within the byte: see cpu/r8.c) */
        const __m256i h = load32(blk + r_qh_off(f));
        const __m256i hk = k < 4 ? _mm256_slli_epi16(h, 4 - k) : k > 4 ? _mm256_srli_epi16(h, k - 4) : h;
        u = _mm256_or_si256(u, _mm256_and_si256(hk, _mm256_set1_epi8(0x10)));
    }
    return u;
}

/* How much each activation sum is taken away: the quants' offset. */
AI int r_off(int f) { return f == R_Q4_0 ? 8 : f == R_Q5_0 ? 16 : (r_s8(f) && R8_VNNI) ? 128 : 0; }

AI __m256i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* One weight vector into a running integer dot. With VNNI the int32 lanes
 * accumulate directly. AVX2's maddubs gives int16 pair sums: 8 x 2*15*127 (Q4)
 * stay below 32768 and go to int32 once per block; Q5 (2*31*127) is widened
 * every 4 vectors, Q8_0 (|w| x a with w's sign, 2*128*127) every vector. */
AI __m256i r_dot(int f, __m256i acc, __m256i wv, __m256i a) {
#if R8_VNNI
    (void)f;
    return _mm256_dpbusd_epi32(acc, wv, a);
#else
    if (r_s8(f))
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv),
                                                                            _mm256_sign_epi8(a, wv)),
                                                       _mm256_set1_epi16(1)));
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(wv, a));
#endif
}

/* AVX2 int16 pair sums -> int32 added to acc32 (a no-op where acc is int32 already). */
AI int r_widen_at(int f, int k) {
#if R8_VNNI
    (void)f, (void)k;
    return 0;
#else
    return !r_s8(f) && (k == 7 || (r_q5(f) && k == 3));
#endif
}

/* One group's 8 outputs: rows past nr (a padded last group) are not stored. */
AI void r8_store8(float *y, __m256 v, int nr) {
    if (nr >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    for (int r = 0; r < nr; r++) y[r] = tmp[r];
}

/* M groups x N tokens; rows past nr (a padded last group) are not stored. The
 * block's vectors are made one at a time and used by every token, so the
 * registers hold the M x N integer and float sums and little else. */
AI void r8_tile(int f, int pf, int M, int N, int64_t n, const uint8_t *w, size_t gs, int nr, const uint8_t *a,
                size_t as, float *y, size_t ys, int lk) {
    const int64_t nb = n / 32;
    const __m256i tab = r_table(f, lk);
    const int avx2_16 = !R8_VNNI && !r_s8(f); /* int16 partial sums (see r_dot) */
    __m256 acc[4][8];
    UNROLL
    for (int g = 0; g < M; g++)
        UNROLL8
        for (int t = 0; t < N; t++) acc[g][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i is[4][8], h[4][8];
        UNROLL
        for (int g = 0; g < M; g++) {
            const uint8_t *blk = w + (size_t)g * gs + r_boff(f, lk, b);
            if (pf) {
                R8_PF(blk + R8_PREFETCH);
                R8_PF(blk + R8_PREFETCH + 64);
                R8_PF(blk + R8_PREFETCH + 128);
                if (r_blk(f, lk) > 192) R8_PF(blk + R8_PREFETCH + 192);
                if (r_blk(f, lk) > 256) R8_PF(blk + R8_PREFETCH + 256);
            }
            UNROLL8
            for (int t = 0; t < N; t++) {
                const int32_t *sum = (const int32_t *)(const void *)(a + (size_t)t * as + n + 8 * (size_t)nb);
                is[g][t] = _mm256_set1_epi32(-r_off(f) * sum[b]);
                h[g][t] = _mm256_setzero_si256();
            }
        }
        UNROLL8
        for (int k = 0; k < 8; k++)
            UNROLL
            for (int g = 0; g < M; g++) {
                const __m256i wv = r_wvec(f, lk, tab, w + (size_t)g * gs + r_boff(f, lk, b), k);
                UNROLL8
                for (int t = 0; t < N; t++) {
                    const __m256i av = bcast4(a + (size_t)t * as + 32 * (size_t)b + 4 * (size_t)k);
                    if (avx2_16) {
                        h[g][t] = r_dot(f, h[g][t], wv, av);
                        if (r_widen_at(f, k)) {
                            is[g][t] = _mm256_add_epi32(is[g][t], _mm256_madd_epi16(h[g][t], _mm256_set1_epi16(1)));
                            h[g][t] = _mm256_setzero_si256();
                        }
                    } else if (N == 1 && R8_VNNI && (k & 1)) { /* decode: two chains, not one of 8 */
                        h[g][t] = r_dot(f, h[g][t], wv, av);
                    } else {
                        is[g][t] = r_dot(f, is[g][t], wv, av);
                    }
                }
            }
        if (N == 1 && R8_VNNI)
            UNROLL
            for (int g = 0; g < M; g++) is[g][0] = _mm256_add_epi32(is[g][0], h[g][0]);
        UNROLL
        for (int g = 0; g < M; g++) {
            const uint8_t *grp = w + (size_t)g * gs, *blk = grp + r_boff(f, lk, b);
            const __m256 dw = r_dw(f, lk, grp, b, blk);
            UNROLL8
            for (int t = 0; t < N; t++) {
                const float *ad = (const float *)(const void *)(a + (size_t)t * as + n);
                const __m256 d = _mm256_mul_ps(dw, _mm256_broadcast_ss(ad + b));
                acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[g][t]), d, acc[g][t]);
                if (r_biased(f)) {
                    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
                    acc[g][t] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(ad + nb + b), acc[g][t]);
                }
            }
        }
    }
    UNROLL
    for (int g = 0; g < M; g++)
        UNROLL8
        for (int t = 0; t < N; t++) {
            r8_store8(y + (size_t)t * ys + 8 * (size_t)g, acc[g][t], nr - 8 * g);
        }
}

#if R8_ZMM
#include "cpu/pair512.h"

/* ---- 512-bit tiles (AVX-512 F/BW + VNNI): a vector holds two adjacent groups,
 * lanes 0..7 group g and lanes 8..15 group g+1, so each instruction does the
 * work of two 256-bit ones. Every lane's integer and float steps are those of
 * r8_tile, so the bits are the same whichever tile a row lands in. */

/* Weight vector k of block b for the group pair starting at b0 (b1 = b0 + gs). */
AI __m512i rz_wvec(int f, int lk, __m512i tab, const uint8_t *b0, const uint8_t *b1, int k) {
    const int off = (int)r_qs_off(f, lk) + (f == R_Q8_0 ? 32 * k : 32 * (k & 3));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(load32(b0 + off)), load32(b1 + off), 1);
    if (f == R_Q8_0) return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    __m512i u = _mm512_and_si512(k < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
    if (r_lut(f)) return _mm512_shuffle_epi8(tab, u);
    if (r_q5(f)) {
        const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(load32(b0 + r_qh_off(f))), load32(b1 + r_qh_off(f)), 1);
        const __m512i hk = k < 4 ? _mm512_slli_epi16(h, 4 - k) : k > 4 ? _mm512_srli_epi16(h, k - 4) : h;
        u = _mm512_or_si512(u, _mm512_and_si512(hk, _mm512_set1_epi8(0x10)));
    }
    return u;
}

/* The pair's 16 weight scales of block b (g0, g1: the groups' starts), as r_dw. */
AI __m512 rz_dw(int f, int lk, const uint8_t *g0, const uint8_t *g1, int64_t b, const uint8_t *b0, const uint8_t *b1) {
    if (r_lut(f) && lk != LK_NL)
        return _mm512_insertf32x8(_mm512_castps256_ps512(r_dw(f, lk, g0, b, b0)), r_dw(f, lk, g1, b, b1), 1);
    return rz_halves(b0, b1, 0);
}

/* A pair's 16 outputs: rows past nr (a padded last group) are not stored. */
AI void r8_store16(float *y, __m512 v, int nr) {
    if (nr >= 16) {
        _mm512_storeu_ps(y, v);
        return;
    }
    float tmp[16];
    _mm512_storeu_ps(tmp, v);
    for (int r = 0; r < nr; r++) y[r] = tmp[r];
}

/* M group pairs x N tokens; nr counts rows from the first pair's first row. */
AI void r8z_tile(int f, int M, int N, int64_t n, const uint8_t *w, size_t gs, int nr, const uint8_t *a,
                 size_t as, float *y, size_t ys, int lk) {
    const int64_t nb = n / 32;
    const __m256i tab8 = r_table(f, lk);
    const __m512i tab = _mm512_inserti64x4(_mm512_castsi256_si512(tab8), tab8, 1);
    __m512 acc[2][R8_PN];
    UNROLL
    for (int p = 0; p < M; p++)
        UNROLL8
        for (int t = 0; t < N; t++) acc[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i is[2][R8_PN], h[2];
        const uint8_t *b0[2], *b1[2];
        UNROLL
        for (int p = 0; p < M; p++) {
            b0[p] = w + (size_t)(2 * p) * gs + r_boff(f, lk, b);
            b1[p] = b0[p] + gs;
            for (size_t o = 0; o < r_blk(f, lk); o += 64) {
                R8_PF(b0[p] + R8_PREFETCH + o);
                R8_PF(b1[p] + R8_PREFETCH + o);
            }
            h[p] = _mm512_setzero_si512();
            UNROLL8
            for (int t = 0; t < N; t++) {
                const int32_t *sum = (const int32_t *)(const void *)(a + (size_t)t * as + n + 8 * (size_t)nb);
                is[p][t] = _mm512_set1_epi32(-r_off(f) * sum[b]);
            }
        }
        UNROLL8
        for (int k = 0; k < 8; k++)
            UNROLL
            for (int p = 0; p < M; p++) {
                const __m512i wv = rz_wvec(f, lk, tab, b0[p], b1[p], k);
                UNROLL8
                for (int t = 0; t < N; t++) {
                    int32_t x;
                    memcpy(&x, a + (size_t)t * as + 32 * (size_t)b + 4 * (size_t)k, 4);
                    if (N == 1 && (k & 1)) h[p] = _mm512_dpbusd_epi32(h[p], wv, _mm512_set1_epi32(x));
                    else is[p][t] = _mm512_dpbusd_epi32(is[p][t], wv, _mm512_set1_epi32(x));
                }
            }
        UNROLL
        for (int p = 0; p < M; p++) {
            if (N == 1) is[p][0] = _mm512_add_epi32(is[p][0], h[p]);
            const __m512 dw = rz_dw(f, lk, w + (size_t)(2 * p) * gs, w + (size_t)(2 * p + 1) * gs, b, b0[p], b1[p]);
            UNROLL8
            for (int t = 0; t < N; t++) {
                const float *ad = (const float *)(const void *)(a + (size_t)t * as + n);
                const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(ad[b]));
                acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[p][t]), d, acc[p][t]);
                if (r_biased(f))
                    acc[p][t] = _mm512_fmadd_ps(rz_halves(b0[p], b1[p], 16), _mm512_set1_ps(ad[nb + b]), acc[p][t]);
            }
        }
    }
    UNROLL
    for (int p = 0; p < M; p++)
        UNROLL8
        for (int t = 0; t < N; t++) r8_store16(y + (size_t)t * ys + 16 * (size_t)p, acc[p][t], nr - 16 * p);
}
#endif

/* Token counts 1..R8_PN, each its own unrolled tile; only those instances are made. */
#if R8_PN >= 8
#define R8_T78(M, ...) case 7: r8_tile(f, pf, M, 7, __VA_ARGS__); break; case 8: r8_tile(f, pf, M, 8, __VA_ARGS__); break;
#else
#define R8_T78(M, ...)
#endif
#if R8_PN >= 6
#define R8_T56(M, ...) case 5: r8_tile(f, pf, M, 5, __VA_ARGS__); break; case 6: r8_tile(f, pf, M, 6, __VA_ARGS__); break;
#else
#define R8_T56(M, ...)
#endif
#define R8_TOKENS(M, TN, ...)                       \
    switch (TN) {                                   \
    case 1: r8_tile(f, pf, M, 1, __VA_ARGS__); break;   \
    case 2: r8_tile(f, pf, M, 2, __VA_ARGS__); break;   \
    case 3: r8_tile(f, pf, M, 3, __VA_ARGS__); break;   \
    case 4: r8_tile(f, pf, M, 4, __VA_ARGS__); break;   \
    R8_T56(M, __VA_ARGS__)                          \
    R8_T78(M, __VA_ARGS__)                          \
    default: break;                                 \
    }
#if R8_ZMM
#define R8Z_TOKENS(M, TN, ...)                      \
    switch (TN) {                                   \
    case 1: r8z_tile(f, M, 1, __VA_ARGS__); break;  \
    case 2: r8z_tile(f, M, 2, __VA_ARGS__); break;  \
    case 3: r8z_tile(f, M, 3, __VA_ARGS__); break;  \
    case 4: r8z_tile(f, M, 4, __VA_ARGS__); break;  \
    default: break;                                 \
    }
#endif

/* nr rows (from a group boundary) x nt tokens. */
AI void r8_gemm(int f, int lk, int pf, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt,
                float *y, size_t ys) {
    const uint8_t *w = vw, *a = va;
    const size_t gs = 8 * ws;
    const int ng = (nr + 7) / 8;
    for (int t0 = 0; t0 < nt; t0 += R8_PN) {
        const int tn = nt - t0 < R8_PN ? nt - t0 : R8_PN;
        const uint8_t *at = a + (size_t)t0 * as;
        float *yt = y + (size_t)t0 * ys;
        int g = 0;
#if R8_ZMM
        /* prompts only: for Q8_0 decode, the pair tile's four streams read
         * DRAM 10-20% slower on the AMD EPYC than the one-group tile's one
         * (it had been +4-7% on a Xeon whose L3 held the file) */
        if (tn > R8_DTN) {
            for (; g + 2 * R8Z_PM <= ng; g += 2 * R8Z_PM) R8Z_TOKENS(R8Z_PM, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys, lk)
            for (; g + 2 <= ng; g += 2) R8Z_TOKENS(1, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys, lk)
        }
#endif
        if (tn <= R8_DTN)
            for (; g + R8_DM <= ng; g += R8_DM) R8_TOKENS(R8_DM, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys, lk)
        else
            for (; g + R8_PM <= ng; g += R8_PM) R8_TOKENS(R8_PM, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys, lk)
        for (; g < ng; g++) R8_TOKENS(1, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys, lk)
    }
}

/* A format's gemm, tl_gemm_fn's signature, as twins: NAME with the decode
 * tile's software prefetches (pf 1, see R8_PREFETCH), NAME_hw without, which
 * leaves the stream to the CPU (kernels.h's hw_stream; r8_fill picks). FN
 * takes its leading arguments, then pf, then the gemm's. */
#define R8_GEMM_SIG(NAME)                                                                             \
    static void NAME(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt,   \
                     float *y, size_t ys)
#define R8_GEMM_ARGS n, w, ws, nr, a, as, nt, y, ys
#define R8_TWINS(NAME, FN, ...)                                                                       \
    R8_GEMM_SIG(NAME) { FN(__VA_ARGS__, 1, R8_GEMM_ARGS); }                                           \
    R8_GEMM_SIG(NAME##_hw) { FN(__VA_ARGS__, 0, R8_GEMM_ARGS); }
#define R8_PICK(k, NAME) ((k)->hw_stream ? NAME##_hw : NAME)
R8_TWINS(r8_gemm_q4_0, r8_gemm, R_Q4_0, 0)
R8_TWINS(r8_gemm_q4_1, r8_gemm, R_Q4_1, 0)
R8_TWINS(r8_gemm_q5_0, r8_gemm, R_Q5_0, 0)
R8_TWINS(r8_gemm_q5_1, r8_gemm, R_Q5_1, 0)
R8_TWINS(r8_gemm_q8_0, r8_gemm, R_Q8_0, 0)
/* the table formats: one compiled gemm, the kind passed at run time; pf is
 * split here so that each copy's tile sees it as a constant */
__attribute__((noinline)) static void r8_gemm_lut(int lk, int pf, int64_t n, const void *w, size_t ws, int nr,
                                                  const void *a, size_t as, int nt, float *y, size_t ys) {
    if (pf) r8_gemm(R_LUT, lk, 1, n, w, ws, nr, a, as, nt, y, ys);
    else r8_gemm(R_LUT, lk, 0, n, w, ws, nr, a, as, nt, y, ys);
}
R8_TWINS(r8_gemm_iq4_nl, r8_gemm_lut, LK_NL)
R8_TWINS(r8_gemm_mxfp4, r8_gemm_lut, LK_MX)
R8_TWINS(r8_gemm_iq4_xs, r8_gemm_lut, LK_XS)

/* ---- Q4_K and Q5_K on r8k rows (cpu/r8.c): per superblock and sub-block j
 * the 8 rows' exact dots, times their scales (vpmulld), the mins against the
 * activation's block sums, then two fmas. Q8_K activation rows as they are. */
#define R8K_SB 148
#define R8K5_SB 180

AI void r8k_tile(int q5, int pf, int M, int N, int64_t n, const uint8_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                 float *y, size_t ys) {
    const int64_t nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m16 = _mm256_set1_epi8(0x10);
    const size_t sb = q5 ? R8K5_SB : R8K_SB;
    __m256 acc[2][4];
    UNROLL
    for (int g = 0; g < M; g++)
        UNROLL
        for (int t = 0; t < N; t++) acc[g][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        UNROLL
        for (int g = 0; g < M; g++) {
            const uint8_t *o = w + (size_t)g * gs + (size_t)b * 8 * sb;
            if (pf)
                for (size_t p = 0; p < 8 * sb; p += 64) R8_PF(o + R8_PREFETCH + p);
            __m256i isum[4], imin[4];
            UNROLL
            for (int t = 0; t < N; t++) {
                const block_q8_K *q8 = (const block_q8_K *)(const void *)(a + (size_t)t * as) + b;
                /* mins: sum_j mn_j * (bsums[2j] + bsums[2j+1]) */
                __m256i mn = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) {
                    const __m256i m8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 96 + 8 * j)));
                    mn = _mm256_add_epi32(mn, _mm256_mullo_epi32(m8, _mm256_set1_epi32(q8->bsums[2 * j] + q8->bsums[2 * j + 1])));
                }
                imin[t] = mn;
                isum[t] = _mm256_setzero_si256();
            }
            for (int i = 0; i < 4; i++) { /* sub-blocks 2i (low nibbles) and 2i+1 (high) */
                __m256i lo[4], hi[4];
                UNROLL
                for (int t = 0; t < N; t++) lo[t] = hi[t] = _mm256_setzero_si256();
                UNROLL8
                for (int k = 0; k < 8; k++) {
                    const __m256i v = load32(o + 160 + 32 * (8 * i + k));
                    __m256i ul = _mm256_and_si256(v, m4), uh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (q5) { /* bits 2i and 2i+1 of qh: the fifth bits of sub-blocks 2i and 2i+1 */
                        const __m256i hs = _mm256_srl_epi16(load32(o + 8 * R8K_SB + 32 * k), _mm_cvtsi32_si128(2 * i));
                        ul = _mm256_or_si256(ul, _mm256_and_si256(_mm256_slli_epi16(hs, 4), m16));
                        uh = _mm256_or_si256(uh, _mm256_and_si256(_mm256_slli_epi16(hs, 3), m16));
                    }
                    UNROLL
                    for (int t = 0; t < N; t++) {
                        const int8_t *qs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->qs;
                        const __m256i al = bcast4((const uint8_t *)qs + 64 * i + 4 * k);
                        const __m256i ah = bcast4((const uint8_t *)qs + 64 * i + 32 + 4 * k);
#if R8_VNNI
                        lo[t] = _mm256_dpbusd_epi32(lo[t], ul, al);
                        hi[t] = _mm256_dpbusd_epi32(hi[t], uh, ah);
#else
                        if (q5) { /* 2*31*127: widened at once */
                            lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ul, al), _mm256_set1_epi16(1)));
                            hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(uh, ah), _mm256_set1_epi16(1)));
                        } else { /* int16 pair sums: 8 x 2*15*127 stay below 32768 */
                            lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(ul, al));
                            hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(uh, ah));
                        }
#endif
                    }
                }
                const __m256i sl = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 32 + 8 * (2 * i))));
                const __m256i sh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 32 + 8 * (2 * i + 1))));
                UNROLL
                for (int t = 0; t < N; t++) {
#if !R8_VNNI
                    if (!q5) {
                        lo[t] = _mm256_madd_epi16(lo[t], _mm256_set1_epi16(1));
                        hi[t] = _mm256_madd_epi16(hi[t], _mm256_set1_epi16(1));
                    }
#endif
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(lo[t], sl),
                                                                         _mm256_mullo_epi32(hi[t], sh)));
                }
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16)));
            UNROLL
            for (int t = 0; t < N; t++) {
                const float da = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->d;
                const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(da));
                const __m256 dmn = _mm256_xor_ps(_mm256_mul_ps(dm, _mm256_set1_ps(da)), _mm256_set1_ps(-0.0f));
                acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), d, acc[g][t]);
                acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[t]), dmn, acc[g][t]);
            }
        }
    }
    UNROLL
    for (int g = 0; g < M; g++)
        UNROLL
        for (int t = 0; t < N; t++) {
            r8_store8(y + (size_t)t * ys + 8 * (size_t)g, acc[g][t], nr - 8 * g);
        }
}

#if R8_ZMM
/* Two groups (16 rows) x N tokens, lanes 8..15 the second group: r8k_tile's
 * exact integer sums (the mins by sub-block pairs with vpdpwssd) and its
 * float steps per lane. Scales and mins are 6-bit, so signed widening is safe. */
AI void r8kz_tile(int q5, int N, int64_t n, const uint8_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                  float *y, size_t ys) {
    const int64_t nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const size_t sb = q5 ? R8K5_SB : R8K_SB;
    __m512 acc[4];
    UNROLL
    for (int t = 0; t < N; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o0 = w + (size_t)b * 8 * sb, *o1 = o0 + gs;
        for (size_t p = 0; p < 8 * sb; p += 64) {
            R8_PF(o0 + R8_PREFETCH + p);
            R8_PF(o1 + R8_PREFETCH + p);
        }
        __m512i isum[4], imin[4];
        {
            __m512i mnp[4];
            UNROLL
            for (int i = 0; i < 4; i++) mnp[i] = rz_pairs16(o0 + 96 + 16 * i, o1 + 96 + 16 * i);
            UNROLL
            for (int t = 0; t < N; t++) {
                const int16_t *bs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->bsums;
                imin[t] = isum[t] = _mm512_setzero_si512();
                UNROLL
                for (int i = 0; i < 4; i++) {
                    const uint32_t s0 = (uint16_t)(bs[4 * i] + bs[4 * i + 1]), s1 = (uint16_t)(bs[4 * i + 2] + bs[4 * i + 3]);
                    imin[t] = _mm512_dpwssd_epi32(imin[t], mnp[i], _mm512_set1_epi32((int32_t)(s0 | s1 << 16)));
                }
            }
        }
        for (int i = 0; i < 4; i++) {
            __m512i lo[4], hi[4];
            UNROLL
            for (int t = 0; t < N; t++) lo[t] = hi[t] = _mm512_setzero_si512();
            UNROLL8
            for (int k = 0; k < 8; k++) {
                const size_t at = 160 + 32 * (8 * (size_t)i + (size_t)k);
                const __m512i v = rz_load2(o0 + at, o1 + at);
                __m512i ul = _mm512_and_si512(v, m4), uh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) {
                    const size_t hat = 8 * R8K_SB + 32 * (size_t)k;
                    rz_q5k_bits(rz_load2(o0 + hat, o1 + hat), i, &ul, &uh);
                }
                UNROLL
                for (int t = 0; t < N; t++) {
                    const int8_t *qs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->qs;
                    int32_t al, ah;
                    memcpy(&al, qs + 64 * i + 4 * k, 4);
                    memcpy(&ah, qs + 64 * i + 32 + 4 * k, 4);
                    lo[t] = _mm512_dpbusd_epi32(lo[t], ul, _mm512_set1_epi32(al));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], uh, _mm512_set1_epi32(ah));
                }
            }
            const __m512i sl = rz_bytes8(o0 + 32 + 16 * i, o1 + 32 + 16 * i);
            const __m512i sh = rz_bytes8(o0 + 40 + 16 * i, o1 + 40 + 16 * i);
            UNROLL
            for (int t = 0; t < N; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl), _mm512_mullo_epi32(hi[t], sh)));
        }
        const __m512 dw = rz_halves(o0, o1, 0), dm = rz_halves(o0, o1, 16);
        UNROLL
        for (int t = 0; t < N; t++) {
            const float da = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->d;
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(da));
            const __m512 dmn = _mm512_xor_ps(_mm512_mul_ps(dm, _mm512_set1_ps(da)), _mm512_set1_ps(-0.0f));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), d, acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[t]), dmn, acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < N; t++) r8_store16(y + (size_t)t * ys, acc[t], nr);
}
#endif

AI void r8k_gemm(int q5, int pf, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                          size_t ys) {
    const uint8_t *w = vw, *a = va;
    const size_t gs = 8 * ws;
    const int ng = (nr + 7) / 8;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        const uint8_t *at = a + (size_t)t0 * as;
        float *yt = y + (size_t)t0 * ys;
        int g = 0;
        /* decode: one group at a time (below), one memory stream (R8_DM) */
#if R8_ZMM
        if (tn > 1)
            for (; g + 2 <= ng; g += 2) {
                switch (tn) {
                case 2: r8kz_tile(q5, 2, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
                case 3: r8kz_tile(q5, 3, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
                default: r8kz_tile(q5, 4, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
                }
            }
#endif
        for (; g < ng; g++) {
            switch (tn) {
            case 1: r8k_tile(q5, pf, 1, 1, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
            case 2: r8k_tile(q5, pf, 1, 2, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
            case 3: r8k_tile(q5, pf, 1, 3, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
            default: r8k_tile(q5, pf, 1, 4, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys); break;
            }
        }
    }
}

R8_TWINS(r8k_gemm_q4_K, r8k_gemm, 0)
R8_TWINS(r8k_gemm_q5_K, r8k_gemm, 1)

/* ---- Q6_K on r8 rows (cpu/r8.c): unsigned 6-bit quants rebuilt from the
 * interleaved ql and qh, exact dots per 16-element sub-block times the int8
 * scales, the -32 offset through the activation's block sums, one fma. */
#define R8Q6_SB 210

/* Run x (0..3) of a Q6_K half as unsigned 6-bit bytes: its low nibbles
 * from L (x < 2 the low half of each byte, else the high), its two high bits
 * from H (bits 2x, 2x+1 of each byte) moved to bits 4-5. */
AI __m256i q6_run8(__m256i L, __m256i H, int x, __m256i m4, __m256i m30) {
    const __m256i lo = x < 2 ? _mm256_and_si256(L, m4) : _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
    const __m256i hb = x == 0 ? _mm256_slli_epi16(H, 4) : x == 1 ? _mm256_slli_epi16(H, 2) : x == 2 ? H : _mm256_srli_epi16(H, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
}

AI void r8q6_tile(int pf, int N, int64_t n, const uint8_t *w, int nr, const uint8_t *a, size_t as, float *y, size_t ys) {
    const int64_t nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    UNROLL
    for (int t = 0; t < N; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = w + (size_t)b * 8 * R8Q6_SB;
        if (pf)
            for (int p = 0; p < 8 * R8Q6_SB; p += 64) R8_PF(o + R8_PREFETCH + p);
        __m256i isum[4];
        UNROLL
        for (int t = 0; t < N; t++) {
            /* the offset: -32 * sum_s sc_s * bsum_s */
            const block_q8_K *q8 = (const block_q8_K *)(const void *)(a + (size_t)t * as) + b;
            __m256i bias = _mm256_setzero_si256();
            for (int sb = 0; sb < 16; sb++) {
                const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 16 + 8 * sb)));
                bias = _mm256_add_epi32(bias, _mm256_mullo_epi32(sc, _mm256_set1_epi32(q8->bsums[sb])));
            }
            isum[t] = _mm256_mullo_epi32(bias, _mm256_set1_epi32(-32));
        }
        if (N <= 2) {
            /* decode and pairs: the four 32-element runs x of a half share
             * their loads (the high bits once, each low-bit vector twice);
             * 4N accumulators fit the 16 ymm registers up to N = 2 */
            for (int h = 0; h < 2; h++)
                for (int half = 0; half < 2; half++) {
                    __m256i d[4][2];
                    UNROLL
                    for (int x = 0; x < 4; x++)
                        UNROLL
                        for (int t = 0; t < N; t++) d[x][t] = _mm256_setzero_si256();
                    UNROLL
                    for (int kk = 0; kk < 4; kk++) {
                        const int k = 4 * half + kk;
                        const __m256i L0 = load32(o + tl_r8q6_ql(2 * h, k));
                        const __m256i L1 = load32(o + tl_r8q6_ql(2 * h + 1, k));
                        const __m256i H = load32(o + tl_r8q6_qh(h, k));
                        UNROLL
                        for (int x = 0; x < 4; x++) {
                            const __m256i L = x & 1 ? L1 : L0;
                            const __m256i u = q6_run8(L, H, x, m4, m30);
                            UNROLL
                            for (int t = 0; t < N; t++) {
                                const int8_t *qs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->qs;
                                const __m256i av = bcast4((const uint8_t *)qs + 128 * h + 32 * x + 4 * k);
#if R8_VNNI
                                d[x][t] = _mm256_dpbusd_epi32(d[x][t], u, av);
#else
                                const __m256i p = _mm256_maddubs_epi16(u, av);
                                d[x][t] = _mm256_add_epi32(d[x][t], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
                            }
                        }
                    }
                    /* integer sums: exact, so this order gives the same bits */
                    UNROLL
                    for (int x = 0; x < 4; x++) {
                        const int sb = 8 * h + 2 * x + half;
                        const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 16 + 8 * sb)));
                        UNROLL
                        for (int t = 0; t < N; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(d[x][t], sc));
                    }
                }
        } else {
        for (int h = 0; h < 2; h++)
            for (int x = 0; x < 4; x++) /* elements 128h + 32x .. +31: sub-blocks 8h+2x and 8h+2x+1 */
                for (int half = 0; half < 2; half++) {
                    __m256i d[4];
                    UNROLL
                    for (int t = 0; t < N; t++) d[t] = _mm256_setzero_si256();
                    UNROLL
                    for (int kk = 0; kk < 4; kk++) {
                        const int k = 4 * half + kk;
                        const __m256i L = load32(o + tl_r8q6_ql(2 * h + (x & 1), k));
                        const __m256i H = load32(o + tl_r8q6_qh(h, k));
                        const __m256i u = q6_run8(L, H, x, m4, m30);
                        UNROLL
                        for (int t = 0; t < N; t++) {
                            const int8_t *qs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->qs;
                            const __m256i av = bcast4((const uint8_t *)qs + 128 * h + 32 * x + 4 * k);
#if R8_VNNI
                            d[t] = _mm256_dpbusd_epi32(d[t], u, av);
#else
                            /* int16 pair sums (2*63*127) widened to int32 each time */
                            const __m256i p = _mm256_maddubs_epi16(u, av);
                            d[t] = _mm256_add_epi32(d[t], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
                        }
                    }
                    const int sb = 8 * h + 2 * x + half;
                    const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 16 + 8 * sb)));
                    UNROLL
                    for (int t = 0; t < N; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(d[t], sc));
                }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
        UNROLL
        for (int t = 0; t < N; t++) {
            const float da = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->d;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < N; t++) {
        r8_store8(y + (size_t)t * ys, acc[t], nr);
    }
}

#if R8_ZMM
/* Two groups (16 rows) x N tokens: lanes 8..15 are the second group. The
 * integer sums are r8q6_tile's (exact, so their order is free); the offset's
 * sum_s sc_s * bsum_s is taken by sub-block pairs with vpdpwssd. The float
 * steps per lane are r8q6_tile's. */
/* q6_run8 on two groups' 256 bits at once. */
AI __m512i q6_run16(__m512i L, __m512i H, int x, __m512i m4, __m512i m30) {
    const __m512i lo = x < 2 ? _mm512_and_si512(L, m4) : _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
    const __m512i hb = x == 0 ? _mm512_slli_epi16(H, 4) : x == 1 ? _mm512_slli_epi16(H, 2) : x == 2 ? H : _mm512_srli_epi16(H, 2);
    return _mm512_or_si512(lo, _mm512_and_si512(hb, m30));
}

/* The offset -32 * sum_s sc_s * bsum_s of superblock b for N tokens, by
 * sub-block pairs (scp[j]: the int16 pairs of sub-blocks 2j and 2j+1). The
 * r8q6z and r8q6w tiles both start their integer sums here, so their bits
 * are one. */
AI void q6z_bias(int N, const __m512i scp[8], const uint8_t *a, size_t as, int64_t b, __m512i isum[4]) {
    UNROLL
    for (int t = 0; t < N; t++) {
        const int16_t *bs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->bsums;
        __m512i bias = _mm512_setzero_si512();
        UNROLL8
        for (int j = 0; j < 8; j++) {
            int32_t pr;
            memcpy(&pr, bs + 2 * j, 4);
            bias = _mm512_dpwssd_epi32(bias, scp[j], _mm512_set1_epi32(pr));
        }
        isum[t] = _mm512_mullo_epi32(bias, _mm512_set1_epi32(-32));
    }
}

/* The float step of superblock b (r8q6_tile's per lane): acc += isum * (dw * da). */
AI void q6z_acc(int N, __m512 dw, const __m512i isum[4], const uint8_t *a, size_t as, int64_t b, __m512 acc[4]) {
    UNROLL
    for (int t = 0; t < N; t++) {
        const float da = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->d;
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(da)), acc[t]);
    }
}

AI void r8q6z_tile(int N, int64_t n, const uint8_t *w, size_t gs, int nr, const uint8_t *a, size_t as, float *y,
                   size_t ys) {
    const int64_t nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[4];
    UNROLL
    for (int t = 0; t < N; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o0 = w + (size_t)b * 8 * R8Q6_SB, *o1 = o0 + gs;
        for (int p = 0; p < 8 * R8Q6_SB; p += 64) {
            R8_PF(o0 + R8_PREFETCH + p);
            R8_PF(o1 + R8_PREFETCH + p);
        }
        __m512i isum[4];
        {
            /* int16 pairs (sc of sub-blocks 2j and 2j+1) per row of both groups */
            __m512i scp[8];
            UNROLL8
            for (int j = 0; j < 8; j++) scp[j] = rz_pairs16(o0 + 16 + 16 * j, o1 + 16 + 16 * j);
            q6z_bias(N, scp, a, as, b, isum);
        }
        /* The four 32-element runs x of a half share their loads: the high
         * bits H serve all four, each low-bit vector two (x and x + 2). */
        for (int h = 0; h < 2; h++)
            for (int half = 0; half < 2; half++) {
                __m512i d[4][4];
                UNROLL
                for (int x = 0; x < 4; x++)
                    UNROLL
                    for (int t = 0; t < N; t++) d[x][t] = _mm512_setzero_si512();
                UNROLL
                for (int kk = 0; kk < 4; kk++) {
                    const int k = 4 * half + kk;
                    const size_t lo0 = tl_r8q6_ql(2 * h, k), lo1 = tl_r8q6_ql(2 * h + 1, k), hi_at = tl_r8q6_qh(h, k);
                    const __m512i L0 = rz_load2(o0 + lo0, o1 + lo0), L1 = rz_load2(o0 + lo1, o1 + lo1);
                    const __m512i H = rz_load2(o0 + hi_at, o1 + hi_at);
                    UNROLL
                    for (int x = 0; x < 4; x++) {
                        const __m512i L = x & 1 ? L1 : L0;
                        const __m512i u = q6_run16(L, H, x, m4, m30);
                        UNROLL
                        for (int t = 0; t < N; t++) {
                            const int8_t *qs = ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->qs;
                            int32_t av;
                            memcpy(&av, qs + 128 * h + 32 * x + 4 * k, 4);
                            d[x][t] = _mm512_dpbusd_epi32(d[x][t], u, _mm512_set1_epi32(av));
                        }
                    }
                }
                /* integer sums: exact, so adding them in this order gives the
                 * reference's bits */
                UNROLL
                for (int x = 0; x < 4; x++) {
                    const int sb = 8 * h + 2 * x + half;
                    const __m512i sc = rz_bytes8(o0 + 16 + 8 * sb, o1 + 16 + 8 * sb);
                    UNROLL
                    for (int t = 0; t < N; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(d[x][t], sc));
                }
            }
        q6z_acc(N, rz_halves(o0, o1, 0), isum, a, as, b, acc);
    }
    UNROLL
    for (int t = 0; t < N; t++) r8_store16(y + (size_t)t * ys, acc[t], nr);
}
#endif

#if R8_ZMM
/* Q6_K for prompts through its unpacked copy (TL_R8Q6W_SB): the r8q6z
 * tile's unpacking (about one vector op per vpdpbusd at 4 tokens) done
 * once per row tile instead of once per 4 tokens. The integer sums are the
 * same exact integers and the float steps per lane r8q6_tile's, so the bits
 * are the gemm's. */
static void r8q6w_unpack(const void *vw, size_t ws, int nr, int64_t n, void *out) {
    const uint8_t *w = vw;
    const size_t gs = 8 * ws;
    const int64_t nb = n / QK_K;
    const int ng = (nr + 7) / 8;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int g = 0; g < ng; g += 2) {
        /* an odd last group pairs with itself; its second half is never stored */
        const uint8_t *g0 = w + (size_t)g * gs, *g1 = g + 1 < ng ? g0 + gs : g0;
        uint8_t *q = (uint8_t *)out + (size_t)(g / 2) * (size_t)nb * TL_R8Q6W_SB;
        for (int64_t b = 0; b < nb; b++, q += TL_R8Q6W_SB) {
            const uint8_t *o0 = g0 + (size_t)b * 8 * R8Q6_SB, *o1 = g1 + (size_t)b * 8 * R8Q6_SB;
            _mm512_storeu_ps(q, rz_halves(o0, o1, 0));
            for (int sb = 0; sb < 16; sb++)
                _mm512_storeu_si512(q + 64 + 64 * sb, rz_bytes8(o0 + 16 + 8 * sb, o1 + 16 + 8 * sb));
            for (int j = 0; j < 8; j++)
                _mm512_storeu_si512(q + 1088 + 64 * j, rz_pairs16(o0 + 16 + 16 * j, o1 + 16 + 16 * j));
            uint8_t *qq = q + 1600;
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 8; k++) {
                    const size_t lo0 = tl_r8q6_ql(2 * h, k), lo1 = tl_r8q6_ql(2 * h + 1, k), hi_at = tl_r8q6_qh(h, k);
                    const __m512i L0 = rz_load2(o0 + lo0, o1 + lo0), L1 = rz_load2(o0 + lo1, o1 + lo1);
                    const __m512i H = rz_load2(o0 + hi_at, o1 + hi_at);
                    UNROLL
                    for (int x = 0; x < 4; x++) /* elements 128h + 32x + 4k .. +3 */
                        _mm512_storeu_si512(qq + (size_t)(32 * h + 8 * x + k) * 64, q6_run16(x & 1 ? L1 : L0, H, x, m4, m30));
                }
        }
    }
}

/* 16 rows (one pair of the unpacked copy) x N tokens. */
AI void r8q6w_tile(int N, int64_t n, const uint8_t *w, int nr, const uint8_t *a, size_t as, float *y, size_t ys) {
    const int64_t nb = n / QK_K;
    __m512 acc[4];
    UNROLL
    for (int t = 0; t < N; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = w + (size_t)b * TL_R8Q6W_SB, *sc = q + 64, *scp = q + 1088, *qq = q + 1600;
        __m512i isum[4], pairs[8];
        UNROLL8
        for (int j = 0; j < 8; j++) pairs[j] = _mm512_loadu_si512((const void *)(scp + 64 * j));
        q6z_bias(N, pairs, a, as, b, isum);
        for (int s = 0; s < 16; s++) {
            __m512i d[4];
            UNROLL
            for (int t = 0; t < N; t++) d[t] = _mm512_setzero_si512();
            UNROLL
            for (int kk = 0; kk < 4; kk++) {
                const __m512i u = _mm512_loadu_si512((const void *)(qq + (size_t)(4 * s + kk) * 64));
                UNROLL
                for (int t = 0; t < N; t++) {
                    int32_t av;
                    memcpy(&av, ((const block_q8_K *)(const void *)(a + (size_t)t * as) + b)->qs + 16 * s + 4 * kk, 4);
                    d[t] = _mm512_dpbusd_epi32(d[t], u, _mm512_set1_epi32(av));
                }
            }
            const __m512i scv = _mm512_loadu_si512((const void *)(sc + 64 * s));
            UNROLL
            for (int t = 0; t < N; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(d[t], scv));
        }
        q6z_acc(N, _mm512_loadu_ps((const float *)(const void *)q), isum, a, as, b, acc);
    }
    UNROLL
    for (int t = 0; t < N; t++) r8_store16(y + (size_t)t * ys, acc[t], nr);
}

/* The gemm over r8q6w_unpack's copy of nr rows (ws: unused, the copy's
 * layout follows from n). */
static void r8q6w_gemm(int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                       size_t ys) {
    (void)ws;
    const uint8_t *w = vw, *a = va;
    const size_t ps = (size_t)(n / QK_K) * TL_R8Q6W_SB;
    const int np = (nr + 15) / 16;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        for (int p = 0; p < np; p++) {
            const uint8_t *wp = w + p * ps, *at = a + (size_t)t0 * as;
            float *yt = y + (size_t)t0 * ys + 16 * p;
            switch (tn) {
            case 1: r8q6w_tile(1, n, wp, nr - 16 * p, at, as, yt, ys); break;
            case 2: r8q6w_tile(2, n, wp, nr - 16 * p, at, as, yt, ys); break;
            case 3: r8q6w_tile(3, n, wp, nr - 16 * p, at, as, yt, ys); break;
            default: r8q6w_tile(4, n, wp, nr - 16 * p, at, as, yt, ys); break;
            }
        }
    }
}
#endif

AI void r8q6_gemm_pf(int pf, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                      size_t ys) {
    const uint8_t *w = vw, *a = va;
    const size_t gs = 8 * ws;
    const int ng = (nr + 7) / 8;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        int g0 = 0;
#if R8_ZMM
        /* prompts; decode goes one group at a time (below), one memory
         * stream (R8_DM): with the L2 prefetch that read the random 1B
         * file's Q6_K output matrix faster on the AMD EPYC than this tile's two */
        for (; g0 + 2 <= ng && tn > 1; g0 += 2) {
            const uint8_t *wg = w + g0 * gs, *at = a + (size_t)t0 * as;
            float *yt = y + (size_t)t0 * ys + 8 * g0;
            switch (tn) {
            case 1: r8q6z_tile(1, n, wg, gs, nr - 8 * g0, at, as, yt, ys); break;
            case 2: r8q6z_tile(2, n, wg, gs, nr - 8 * g0, at, as, yt, ys); break;
            case 3: r8q6z_tile(3, n, wg, gs, nr - 8 * g0, at, as, yt, ys); break;
            default: r8q6z_tile(4, n, wg, gs, nr - 8 * g0, at, as, yt, ys); break;
            }
        }
#endif
        for (int g = g0; g < ng; g++) {
            const uint8_t *wg = w + g * gs, *at = a + (size_t)t0 * as;
            float *yt = y + (size_t)t0 * ys + 8 * g;
            switch (tn) {
            case 1: r8q6_tile(pf, 1, n, wg, nr - 8 * g, at, as, yt, ys); break;
            case 2: r8q6_tile(pf, 2, n, wg, nr - 8 * g, at, as, yt, ys); break;
            case 3: r8q6_tile(pf, 3, n, wg, nr - 8 * g, at, as, yt, ys); break;
            default: r8q6_tile(pf, 4, n, wg, nr - 8 * g, at, as, yt, ys); break;
            }
        }
    }
}

R8_GEMM_SIG(r8q6_gemm) { r8q6_gemm_pf(1, R8_GEMM_ARGS); }
R8_GEMM_SIG(r8q6_gemm_hw) { r8q6_gemm_pf(0, R8_GEMM_ARGS); }

/* ---- F16 on r8h rows (cpu/r8.c): element j of a group is 8 rows' values,
 * widened exactly, times the token's f32 x_j broadcast, one fma chain per
 * (row, token) over the elements. */
AI __m256 r8h_wvec(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }

AI void r8h_tile(int M, int N, int64_t n, const uint16_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                 float *y, size_t ys) {
    __m256 acc[8][4];
    _Pragma("GCC unroll 8")
    for (int g = 0; g < M; g++)
        UNROLL
        for (int t = 0; t < N; t++) acc[g][t] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        _Pragma("GCC unroll 8")
        for (int g = 0; g < M; g++) {
            const uint16_t *p = w + (size_t)g * gs + 8 * (size_t)j;
            if ((j & 3) == 0) R8_PF(p + R8_PREFETCH); /* a line per 4 elements */
            const __m256 wv = r8h_wvec(p);
            UNROLL
            for (int t = 0; t < N; t++) {
                const float *x = (const float *)(const void *)(a + (size_t)t * as);
                acc[g][t] = _mm256_fmadd_ps(wv, _mm256_broadcast_ss(x + j), acc[g][t]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int g = 0; g < M; g++)
        UNROLL
        for (int t = 0; t < N; t++) r8_store8(y + (size_t)t * ys + 8 * (size_t)g, acc[g][t], nr - 8 * g);
}

#if R8_ZMM
/* two groups per 512-bit vector */
AI void r8hz_tile(int M, int N, int64_t n, const uint16_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                  float *y, size_t ys) {
    __m512 acc[8][4];
    _Pragma("GCC unroll 8")
    for (int p = 0; p < M; p++)
        UNROLL
        for (int t = 0; t < N; t++) acc[p][t] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        _Pragma("GCC unroll 8")
        for (int p = 0; p < M; p++) {
            const uint16_t *p0 = w + (size_t)(2 * p) * gs + 8 * (size_t)j, *p1 = p0 + gs;
            if ((j & 3) == 0) { /* a line per 4 elements and group */
                R8_PF(p0 + R8_PREFETCH);
                R8_PF(p1 + R8_PREFETCH);
            }
            const __m256i h = rz_pair16(p0, p1);
            const __m512 wv = _mm512_cvtph_ps(h);
            UNROLL
            for (int t = 0; t < N; t++) {
                const float *x = (const float *)(const void *)(a + (size_t)t * as);
                acc[p][t] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[j]), acc[p][t]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int p = 0; p < M; p++)
        UNROLL
        for (int t = 0; t < N; t++) r8_store16(y + (size_t)t * ys + 16 * (size_t)p, acc[p][t], nr - 16 * p);
}
#endif

#define R8H_TOKENS(TILE, M, TN, ...)                 \
    switch (TN) {                                    \
    case 1: TILE(M, 1, __VA_ARGS__); break;          \
    case 2: TILE(M, 2, __VA_ARGS__); break;          \
    case 3: TILE(M, 3, __VA_ARGS__); break;          \
    default: TILE(M, 4, __VA_ARGS__); break;         \
    }

static void r8h_gemm_f16(int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                         size_t ys) {
    const uint16_t *w = vw;
    const uint8_t *a = va;
    const size_t gs = 8 * ws / sizeof(uint16_t); /* a group, in elements */
    const int ng = (nr + 7) / 8;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        const uint8_t *at = a + (size_t)t0 * as;
        float *yt = y + (size_t)t0 * ys;
        int g = 0;
#if R8_ZMM
        if (tn > 1) {
            for (; g + 4 <= ng; g += 4) R8H_TOKENS(r8hz_tile, 2, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
            for (; g + 2 <= ng; g += 2) R8H_TOKENS(r8hz_tile, 1, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
        } else { /* decode: 8 fma chains in flight, 16 rows each */
            for (; g + 16 <= ng; g += 16) r8hz_tile(8, 1, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys);
        }
#endif
        /* decode: 8 independent fma chains hide the fma latency */
        if (tn == 1)
            for (; g + 8 <= ng; g += 8) r8h_tile(8, 1, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys);
        if (tn == 1)
            for (; g + 4 <= ng; g += 4) r8h_tile(4, 1, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys);
        else
            for (; g + 2 <= ng; g += 2) R8H_TOKENS(r8h_tile, 2, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
        for (; g < ng; g++) R8H_TOKENS(r8h_tile, 1, tn, n, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
    }
}

/* ---- BF16 on r8h pair rows (cpu/r8.c): vdpbf16ps emulated. A 32-bit lane
 * holds one row's pair with the odd element in its high half, so a mask gives
 * that element as a float and a shift the even one; per pair, the odd
 * product's fma, then the even one's, with MXCSR's flush to zero on, as the
 * instruction flushes. */
AI __m256 r8b_hi(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))); }
AI __m256 r8b_lo(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

AI void r8b_tile(int M, int N, int64_t np, const uint16_t *w, size_t gs, int nr, const uint8_t *a, size_t as,
                 float *y, size_t ys) {
    __m256 acc[4][4];
    UNROLL
    for (int g = 0; g < M; g++)
        UNROLL
        for (int t = 0; t < N; t++) acc[g][t] = _mm256_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        __m256 xh[4], xl[4];
        UNROLL
        for (int t = 0; t < N; t++) {
            int32_t v;
            memcpy(&v, a + (size_t)t * as + 4 * (size_t)p, 4);
            const __m256i b = _mm256_set1_epi32(v);
            xh[t] = r8b_hi(b);
            xl[t] = r8b_lo(b);
        }
        UNROLL
        for (int g = 0; g < M; g++) {
            const uint16_t *q = w + (size_t)g * gs + 16 * (size_t)p;
            if ((p & 1) == 0) R8_PF((const uint8_t *)q + R8_PREFETCH); /* a line per 2 pairs */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)q);
            const __m256 wh = r8b_hi(v), wl = r8b_lo(v);
            UNROLL
            for (int t = 0; t < N; t++) {
                acc[g][t] = _mm256_fmadd_ps(wh, xh[t], acc[g][t]);
                acc[g][t] = _mm256_fmadd_ps(wl, xl[t], acc[g][t]);
            }
        }
    }
    UNROLL
    for (int g = 0; g < M; g++)
        UNROLL
        for (int t = 0; t < N; t++) r8_store8(y + (size_t)t * ys + 8 * (size_t)g, acc[g][t], nr - 8 * g);
}

/* Prompt tiles: 2 groups x 4 tokens where 32 registers hold them, else 1. */
#define R8B_PM (R8_ZMM ? 2 : 1)

static void r8h_gemm_bf16(int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                          size_t ys) {
    const uint16_t *w = vw;
    const uint8_t *a = va;
    const size_t gs = 8 * ws / sizeof(uint16_t);
    const int64_t np = (n + 1) / 2;
    const int ng = (nr + 7) / 8;
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8000); /* FTZ; the fmas below sit between this and the restore */
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        const uint8_t *at = a + (size_t)t0 * as;
        float *yt = y + (size_t)t0 * ys;
        int g = 0;
        if (tn == 1) /* decode: 4 chains */
            for (; g + 4 <= ng; g += 4) r8b_tile(4, 1, np, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys);
        else
            for (; g + R8B_PM <= ng; g += R8B_PM)
                R8H_TOKENS(r8b_tile, R8B_PM, tn, np, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
        for (; g < ng; g++) R8H_TOKENS(r8b_tile, 1, tn, np, w + g * gs, gs, nr - 8 * g, at, as, yt + 8 * g, ys)
    }
    _mm_setcsr(csr);
}

static void r8_fill(tl_kernels *k) {
    k->gemm[TL_Q4_0] = R8_PICK(k, r8_gemm_q4_0);
    k->gemm[TL_Q4_1] = R8_PICK(k, r8_gemm_q4_1);
    k->gemm[TL_Q5_0] = R8_PICK(k, r8_gemm_q5_0);
    k->gemm[TL_Q5_1] = R8_PICK(k, r8_gemm_q5_1);
    k->gemm[TL_Q8_0] = R8_PICK(k, r8_gemm_q8_0);
    k->gemm[TL_IQ4_NL] = R8_PICK(k, r8_gemm_iq4_nl);
    k->gemm[TL_MXFP4] = R8_PICK(k, r8_gemm_mxfp4);
    k->gemm[TL_IQ4_XS] = R8_PICK(k, r8_gemm_iq4_xs);
    k->gemm[TL_Q4_K] = R8_PICK(k, r8k_gemm_q4_K);
    k->gemm[TL_Q5_K] = R8_PICK(k, r8k_gemm_q5_K);
    k->gemm[TL_Q6_K] = R8_PICK(k, r8q6_gemm);
    k->gemm[TL_F16] = r8h_gemm_f16;
    k->gemm[TL_BF16] = r8h_gemm_bf16;
    k->widen[TL_Q4_0] = k->widen[TL_Q5_0] = NULL;
#if R8_ZMM
    k->unpack[TL_Q6_K] = r8q6w_unpack;
    k->wgemm[TL_Q6_K] = r8q6w_gemm;
#endif
}

#endif
