/* cpu/tile32: the gemm kernels of the 32-block formats (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0) on packed weight rows (tl_pack_rows32), for tiles of weight rows x
 * tokens. Included by a kernel file after it defines TILE_DOT(u, s): the exact
 * int32 sums of 4 products of unsigned u and signed s bytes (maddubs + madd on
 * AVX2, vpdpbusd with VNNI). Defines static gemm_q* and tile32_fill(). */
#ifndef TL_CPU_TILE32_H
#define TL_CPU_TILE32_H

#include "cpu/kernels.h"
#include "cpu/simd256.h"

/* Tile shapes: TILE_DM rows for one token (decode; half for Q8_0, whose rows
 * are twice as long in bytes), TILE_PM rows x 4 tokens for prompts: as many
 * accumulators as the registers hold (16 ymm on AVX2; the AVX-512 file has 32
 * and takes 4 x 4 for prompts). Decode streams weights from memory on two
 * threads: there 2 rows (1 for Q8_0) beat 4 (2) on every model measured, by up
 * to 1.5x on the Q8_0 output matrices (SmolLM2 Q8_0 127 -> 197 tok/s, Gemma 3
 * 67 -> 103), though one thread in cache prefers 4. */
#ifndef TILE_DM
#define TILE_DM 2
#endif
#ifndef TILE_PM
#define TILE_PM 2
#endif
_Static_assert(TILE_PM <= 4 && TILE_DM <= 8, "tile32 holds 8 rows, and the vector m*s sums 4");

/* How far ahead (bytes) each row of a tile asks for its data: measured on
 * 49152 x 576 Q8_0 and 65536 x 576 Q4_1 out of cache and 16384 x 2048 Q4_0, 4096 beat 256..2048 and 8192. */
#define TILE_PREFETCH 4096

/* The 32-block formats by number, so one always-inline body serves them all. */
enum { F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0 };


AI int biased(int f) { return f == F_Q4_1 || f == F_Q5_1; }
AI int has_qh(int f) { return f == F_Q5_0 || f == F_Q5_1; }
AI size_t qs_bytes(int f) { return f == F_Q8_0 ? 32 : 16; }
/* bytes of one block, packed or not */
AI size_t blk_bytes(int f) { return 2 + (biased(f) ? 2 : 0) + (has_qh(f) ? 4 : 0) + qs_bytes(f); }
/* Activation blocks: Q8_1 (d, s, qs) for the biased formats, Q8_0 (d, qs) else. */
AI size_t ablk_size(int f) { return biased(f) ? sizeof(block_q8_1) : sizeof(block_q8_0); }

/* Block j's quants as bytes, from a packed group of k blocks (tl_pack_rows32). */
AI __m256i wexp_packed(int f, const uint8_t *grp, int k, int j) {
    const uint8_t *qh = grp + (size_t)(2 + (biased(f) ? 2 : 0)) * (size_t)k + 4 * (size_t)j;
    const uint8_t *qs = grp + (blk_bytes(f) - qs_bytes(f)) * (size_t)k + qs_bytes(f) * (size_t)j;
    switch (f) {
    case F_Q4_0: return _mm256_sub_epi8(nibbles32(qs), _mm256_set1_epi8(8));
    case F_Q4_1: return nibbles32(qs);
    case F_Q5_0: return _mm256_or_si256(nibbles32(qs), _mm256_andnot_si256(bits32(qh), _mm256_set1_epi8((char)0xF0)));
    case F_Q5_1: return _mm256_or_si256(nibbles32(qs), _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10)));
    default: return load32(qs);
    }
}

/* A packed group's k half-float scales (field at byte off) as floats. */
AI void group_scales(const uint8_t *grp, size_t off, int k, float out[8]) {
    if (k == 8) {
        _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + off))));
        return;
    }
    for (int j = 0; j < k; j++) out[j] = h2f_at(grp + off, j);
}

/* The M x N dots of one tile. Every output keeps its own 8-lane accumulator and
 * sees exactly the operations of the single-row kernels above, in the same order,
 * so results are bitwise equal to vec_dot; the tile only shares each weight
 * block's unpacking across N tokens and each activation block across M rows,
 * and takes the scales from the packed groups and the activations' float copies.
 * The biased formats' running m*s sums are scalar fma chains; with N >= 2 they
 * run as lane (r & 1) * 4 + t of vector S[r / 2] (a lane-wise fma rounds as the
 * scalar one), fed from sa4: the N tokens' s of each block, interleaved by 4. */
AI void tile32(int f, int M, int N, int64_t n, const uint8_t *w, size_t ws, const uint8_t *a,
               size_t as, const float *sa4, float *y, size_t ys) {
    const int vs = biased(f) && N >= 2; /* vector m*s sums (M <= 4 then) */
    __m256 acc[8][4], S[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    float s[8][4];
    UNROLL
    for (int r = 0; r < M; r++)
        UNROLL
        for (int t = 0; t < N; t++) {
            acc[r][t] = _mm256_setzero_ps();
            s[r][t] = 0.0f;
        }
    const int64_t nb = n / 32;
    const size_t abs_ = ablk_size(f);
    const size_t soff = tl_act_scales_off(biased(f) ? TL_Q8_1 : TL_Q8_0, n);
    for (int64_t g = 0; g < nb; g += 8) {
        const int k = nb - g < 8 ? (int)(nb - g) : 8;
        float dw[8][8], mw[8][8];
        const uint8_t *grp[8];
        UNROLL
        for (int r = 0; r < M; r++) {
            grp[r] = w + (size_t)r * ws + (size_t)g * blk_bytes(f);
            /* M rows stream side by side; without asking for what comes next,
             * that measured slower from memory than one row at a time. */
            _mm_prefetch((const char *)grp[r] + TILE_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)grp[r] + TILE_PREFETCH + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)grp[r] + TILE_PREFETCH + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)grp[r] + TILE_PREFETCH + 192, _MM_HINT_T0);
            group_scales(grp[r], 0, k, dw[r]);
            if (biased(f)) group_scales(grp[r], 2 * (size_t)k, k, mw[r]);
        }
        for (int j = 0; j < k; j++) {
            const int64_t i = g + j;
            __m256i qx[8], ux[8];
            __m256 bw[8];
            UNROLL
            for (int r = 0; r < M; r++) {
                qx[r] = wexp_packed(f, grp[r], k, j);
                ux[r] = biased(f) ? qx[r] : _mm256_sign_epi8(qx[r], qx[r]);
                bw[r] = _mm256_broadcast_ss(&dw[r][j]);
            }
            if (vs) {
                const __m256 sa = _mm256_broadcast_ps((const __m128 *)(sa4 + 4 * i));
                for (int h = 0; h < (M + 1) / 2; h++) {
                    const __m128 m0 = _mm_broadcast_ss(&mw[2 * h][j]);
                    const __m128 m1 = 2 * h + 1 < M ? _mm_broadcast_ss(&mw[2 * h + 1][j]) : _mm_setzero_ps();
                    S[h] = _mm256_fmadd_ps(_mm256_set_m128(m1, m0), sa, S[h]);
                }
            }
            UNROLL
            for (int t = 0; t < N; t++) {
                const uint8_t *ar = a + (size_t)t * as;
                const float *sc = (const float *)(const void *)(ar + soff);
                const __m256i ya = load32(ar + (size_t)i * abs_ + (biased(f) ? 4 : 2));
                const __m256 ba = _mm256_broadcast_ss(sc + i);
                UNROLL
                for (int r = 0; r < M; r++) {
                    const __m256i sy = biased(f) ? ya : _mm256_sign_epi8(ya, qx[r]);
                    const __m256 d = _mm256_mul_ps(bw[r], ba);
                    acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(TILE_DOT(ux[r], sy)), acc[r][t]);
                    if (biased(f) && !vs) s[r][t] = fma1(mw[r][j], sc[nb + i], s[r][t]);
                }
            }
        }
    }
    float sv[16];
    _mm256_storeu_ps(sv, S[0]);
    _mm256_storeu_ps(sv + 8, S[1]);
    UNROLL
    for (int r = 0; r < M; r++)
        UNROLL
        for (int t = 0; t < N; t++) {
            const float m = vs ? sv[r * 4 + t] : s[r][t]; /* lane (r & 1) * 4 + t of S[r / 2] */
            y[(size_t)t * ys + r] = biased(f) ? hsum_f8(acc[r][t]) + m : hsum_f8(acc[r][t]);
        }
}

/* Up to 4 tokens' s of every block, interleaved (see tile32); 0 where no token. */
#define SA4_MAX_BLOCKS 1024
AI void gather_sa4(int f, int64_t n, const uint8_t *a, size_t as, int tn, float *sa4) {
    const int64_t nb = n / 32;
    const size_t soff = tl_act_scales_off(TL_Q8_1, n);
    for (int t = 0; t < 4; t++) {
        const float *sc = t < tn ? (const float *)(const void *)(a + (size_t)t * as + soff) + nb : NULL;
        for (int64_t i = 0; i < nb; i++) sa4[4 * i + t] = sc ? sc[i] : 0.0f;
    }
}

/* nr x nt outputs (any sizes) in tiles: 4 rows x 1 token for decode (four
 * independent FMA chains instead of one), 2 rows x up to 4 tokens for prompts. */
AI void gemm32(int f, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as,
               int nt, float *y, size_t ys) {
    const uint8_t *w = vw, *a = va;
    float sa4[biased(f) ? 4 * SA4_MAX_BLOCKS : 1];
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int tn = nt - t0 < 4 ? nt - t0 : 4;
        const uint8_t *at = a + (size_t)t0 * as;
        float *yt = y + (size_t)t0 * ys;
        int r = 0;
        if (biased(f) && tn >= 2) {
            if (n / 32 > SA4_MAX_BLOCKS) { /* too wide for sa4: pair by pair */
                for (; r < nr; r++)
                    for (int t = 0; t < tn; t++)
                        tile32(f, 1, 1, n, w + r * ws, ws, at + (size_t)t * as, as, NULL, yt + (size_t)t * ys + r, ys);
                continue;
            }
            gather_sa4(f, n, at, as, tn, sa4);
        }
        if (tn == 1 && f == F_Q8_0) /* twice the bytes per row: half the rows */
            for (; r + TILE_DM / 2 <= nr; r += TILE_DM / 2)
                tile32(f, TILE_DM / 2, 1, n, w + r * ws, ws, at, as, sa4, yt + r, ys);
        else if (tn == 1)
            for (; r + TILE_DM <= nr; r += TILE_DM) tile32(f, TILE_DM, 1, n, w + r * ws, ws, at, as, sa4, yt + r, ys);
        else
            for (; r + TILE_PM <= nr; r += TILE_PM) {
                const uint8_t *wr = w + r * ws;
                switch (tn) {
                case 2: tile32(f, TILE_PM, 2, n, wr, ws, at, as, sa4, yt + r, ys); break;
                case 3: tile32(f, TILE_PM, 3, n, wr, ws, at, as, sa4, yt + r, ys); break;
                default: tile32(f, TILE_PM, 4, n, wr, ws, at, as, sa4, yt + r, ys); break;
                }
            }
        for (; r < nr; r++) {
            const uint8_t *wr = w + r * ws;
            switch (tn) {
            case 1: tile32(f, 1, 1, n, wr, ws, at, as, sa4, yt + r, ys); break;
            case 2: tile32(f, 1, 2, n, wr, ws, at, as, sa4, yt + r, ys); break;
            case 3: tile32(f, 1, 3, n, wr, ws, at, as, sa4, yt + r, ys); break;
            default: tile32(f, 1, 4, n, wr, ws, at, as, sa4, yt + r, ys); break;
            }
        }
    }
}

#define GEMM32(NAME, F)                                                                          \
    static void NAME(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, \
                     float *y, size_t ys) {                                                      \
        gemm32(F, n, w, ws, nr, a, as, nt, y, ys);                                               \
    }
GEMM32(gemm_q4_0, F_Q4_0)
GEMM32(gemm_q4_1, F_Q4_1)
GEMM32(gemm_q5_0, F_Q5_0)
GEMM32(gemm_q5_1, F_Q5_1)
GEMM32(gemm_q8_0, F_Q8_0)

/* Packed Q4_0/Q5_0 rows widened to packed Q8_0 rows (the signed quant bytes
 * q - 8 or q - 16, the same d). The Q8_0 tile on them computes bitwise what the
 * Q4_0/Q5_0 tile computes, without unpacking the quants again for every group
 * of tokens: a prompt widens each slice of rows once. */
AI void widen32(int f, const void *vw, size_t ws, int nr, int64_t n, void *vo) {
    const int64_t nb = n / 32;
    const size_t os = (size_t)nb * sizeof(block_q8_0);
    for (int r = 0; r < nr; r++)
        for (int64_t g = 0; g < nb; g += 8) {
            const int k = nb - g < 8 ? (int)(nb - g) : 8;
            const uint8_t *src = (const uint8_t *)vw + (size_t)r * ws + (size_t)g * blk_bytes(f);
            uint8_t *dst = (uint8_t *)vo + (size_t)r * os + (size_t)g * sizeof(block_q8_0);
            memcpy(dst, src, 2 * (size_t)k);
            for (int j = 0; j < k; j++)
                _mm256_storeu_si256((__m256i *)(dst + 2 * (size_t)k + 32 * (size_t)j), wexp_packed(f, src, k, j));
        }
}

static void widen_q4_0(const void *w, size_t ws, int nr, int64_t n, void *out) { widen32(F_Q4_0, w, ws, nr, n, out); }
static void widen_q5_0(const void *w, size_t ws, int nr, int64_t n, void *out) { widen32(F_Q5_0, w, ws, nr, n, out); }

static void tile32_fill(tl_kernels *k) {
    k->gemm[TL_Q4_0] = gemm_q4_0;
    k->gemm[TL_Q4_1] = gemm_q4_1;
    k->gemm[TL_Q5_0] = gemm_q5_0;
    k->gemm[TL_Q5_1] = gemm_q5_1;
    k->gemm[TL_Q8_0] = gemm_q8_0;
    k->widen[TL_Q4_0] = widen_q4_0;
    k->widen[TL_Q5_0] = widen_q5_0;
}

#endif
