/* cpu/kern_amx: the fast mode's Q4_K, Q5_K and Q6_K prompt gemm on AMX tiles
 * (Intel Sapphire Rapids and later), the only file built with -mamx-*. The
 * integer sums are exact, so every row and token gets the bits of the r8k and
 * r8q6 references (cpu/r8.c) and of the AVX-512 tiles, whichever runs it:
 * tiles of 16 tokens here, the rest (a few tokens, an odd last group of 8
 * rows) there.
 *
 * A superblock's row sum is sum_j sc_j * dot_j (a scale per sub-block). One
 * tile product cannot apply a scale that changes along its reduction, so the
 * weights are scaled before it and split into two byte planes: Q4_K/Q5_K
 * sc * q (at most 63 * 31) as hi = p >> 5, lo = p & 31, and
 *
 *     isum = 32 * (a . hi) + (a . lo)
 *
 * exactly, each product a full 64-deep tdpbsud over a chunk of the
 * superblock; Q6_K likewise with 64 (below). The Q4_K/Q5_K mins' term is
 * vpdpwssd on sub-block sums the activation row carries. The planes of 16
 * rows are made once per superblock and serve every 16-token tile of a pass.
 * The activations are Q8_K rows with a copy of their quants on a cache line
 * (tl_amx_act_off, made by tl_kern_act_make). */
#include "cpu/kernels.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "cpu/simd256.h"
#include "cpu/pair512.h"

#define R8K_SB 148  /* cpu/r8.c: bytes per row and superblock, Q4_K */
#define R8K5_SB 180 /* Q5_K: the fifth bits after the quants */
#define R8Q6_SB 210 /* Q6_K */

enum { K_Q4, K_Q5, K_Q6 };

/* ldtilecfg's 64-byte operand: palette 1, every tile 16 rows of 64 bytes. */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Tiles (the intrinsics take literal numbers): 0 and 7 the activations' even
 * and odd chunks of 64, 1-2 and 5-6 the weights' hi and lo planes for them,
 * 3 and 4 the two sums. */

/* 64 unsigned quants (lane r: row r's 4 consecutive elements) times the
 * row's scale, as the two byte planes: hi = (sc*q) >> 5, lo = (sc*q) & 31.
 * ev holds sc in the even bytes of every word, od in the odd ones. */
AI void scale_split(__m512i u, __m512i ev, __m512i od, uint8_t *hi, uint8_t *lo) {
    const __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
    const __m512i pe = _mm512_maddubs_epi16(u, ev), po = _mm512_maddubs_epi16(u, od); /* words: sc*q of even, odd bytes */
    _mm512_store_si512((void *)hi, _mm512_mask_blend_epi8(odd, _mm512_srli_epi16(pe, 5), _mm512_slli_epi16(po, 3)));
    _mm512_store_si512((void *)lo, _mm512_and_si512(_mm512_mask_blend_epi8(odd, pe, _mm512_slli_epi16(po, 8)),
                                                    _mm512_set1_epi8(31)));
}

/* The B tiles of one superblock of a group pair (o0, o1): for chunk c of 64
 * elements, tile row kk < 8 holds elements 4kk..4kk+3 of sub-block 2c for the
 * 16 rows, rows 8..15 those of sub-block 2c+1 (the r8k layout's low and high
 * nibbles of one 32-byte run). */
AI void make_b(int q5, const uint8_t *o0, const uint8_t *o1, uint8_t (*bh)[16][64], uint8_t (*bl)[16][64]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m512i s0 = rz_bytes8(o0 + 32 + 8 * (2 * c), o1 + 32 + 8 * (2 * c));
        const __m512i s1 = rz_bytes8(o0 + 32 + 8 * (2 * c + 1), o1 + 32 + 8 * (2 * c + 1));
        const __m512i e0 = _mm512_or_si512(s0, _mm512_slli_epi32(s0, 16)), e1 = _mm512_or_si512(s1, _mm512_slli_epi32(s1, 16));
        const __m512i d0 = _mm512_slli_epi32(e0, 8), d1 = _mm512_slli_epi32(e1, 8);
        for (int k = 0; k < 8; k++) {
            const size_t at = 160 + 32 * (8 * (size_t)c + (size_t)k);
            const __m512i v = rz_load2(o0 + at, o1 + at);
            __m512i ul = _mm512_and_si512(v, m4), uh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (q5) {
                const size_t hat = 8 * R8K_SB + 32 * (size_t)k;
                rz_q5k_bits(rz_load2(o0 + hat, o1 + hat), c, &ul, &uh);
            }
            scale_split(ul, e0, d0, bh[c][k], bl[c][k]);
            scale_split(uh, e1, d1, bh[c][8 + k], bl[c][8 + k]);
        }
    }
}

/* Q6_K (the r8q6 layout, cpu/r8.c): sc * (u - 32) with signed 8-bit scales
 * lies in [-4064, 4096], split as 64 * hi + lo, hi = p >> 6 in [-64, 64] and
 * lo = p & 63: isum = 64 * (a . hi) + (a . lo) exactly, the reference's
 * sum_s sc_s dot_s(u) - 32 sum_s sc_s bsum_s. Chunk c of 64 elements is x-blocks
 * 2(c & 1) and 2(c & 1) + 1 of half c / 2: tile rows 0..7 the first, 8..15 the
 * second; a 32-element x-block holds sub-blocks of 16 (runs 0..3, 4..7). */
AI void scale_split6(__m512i u, __m512i ev, __m512i od, __m512i s32, uint8_t *hi, uint8_t *lo) {
    const __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
    const __m512i pe = _mm512_sub_epi16(_mm512_maddubs_epi16(u, ev), s32);
    const __m512i po = _mm512_sub_epi16(_mm512_maddubs_epi16(u, od), s32);
    _mm512_store_si512((void *)hi, _mm512_mask_blend_epi8(odd, _mm512_srai_epi16(pe, 6), _mm512_slli_epi16(po, 2)));
    _mm512_store_si512((void *)lo, _mm512_and_si512(_mm512_mask_blend_epi8(odd, pe, _mm512_slli_epi16(po, 8)),
                                                    _mm512_set1_epi8(63)));
}

/* A sub-block's 16 signed scales (8 per group at o + 16 + 8s) as maddubs
 * operands (sc in the even, or the odd, bytes of each word) and 32 * sc per word. */
AI void scales6(const uint8_t *o0, const uint8_t *o1, int sb, __m512i *ev, __m512i *od, __m512i *s32) {
    const __m512i s = rz_bytes8(o0 + 16 + 8 * sb, o1 + 16 + 8 * sb);
    const __m512i b = _mm512_and_si512(s, _mm512_set1_epi32(0xFF)), w = _mm512_and_si512(_mm512_slli_epi32(s, 5), _mm512_set1_epi32(0xFFFF));
    *ev = _mm512_or_si512(b, _mm512_slli_epi32(b, 16));
    *od = _mm512_slli_epi32(*ev, 8);
    *s32 = _mm512_or_si512(w, _mm512_slli_epi32(w, 16));
}

AI void make_b6(const uint8_t *o0, const uint8_t *o1, uint8_t (*bh)[16][64], uint8_t (*bl)[16][64]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    for (int c = 0; c < 4; c++) {
        const int h = c >> 1;
        for (int xi = 0; xi < 2; xi++) {
            const int x = 2 * (c & 1) + xi;
            __m512i ev[2], od[2], s32[2];
            scales6(o0, o1, 8 * h + 2 * x, &ev[0], &od[0], &s32[0]);
            scales6(o0, o1, 8 * h + 2 * x + 1, &ev[1], &od[1], &s32[1]);
            for (int k = 0; k < 8; k++) {
                const size_t lat = tl_r8q6_ql(2 * h + xi, k), hat = tl_r8q6_qh(h, k);
                __m512i v = rz_load2(o0 + lat, o1 + lat);
                if (x >= 2) v = _mm512_srli_epi16(v, 4);
                const __m512i qh = _mm512_and_si512(_mm512_srl_epi16(rz_load2(o0 + hat, o1 + hat), _mm_cvtsi32_si128(2 * x)), m3);
                const __m512i u = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_slli_epi16(qh, 4));
                scale_split6(u, ev[k >> 2], od[k >> 2], s32[k >> 2], bh[c][8 * xi + k], bl[c][8 * xi + k]);
            }
        }
    }
}

/* One tile's sums (m tokens) (hi, lo, mins: C[t][r] per row of the pair) into
 * its running sums acc[t][r]: acc = fma((float)isum, d * d_a, acc), then
 * (Q4_K, Q5_K) the mins' term, as the references; imin = sum_j mn_j * bsum_j
 * by vpdpwssd on the row's sub-block sums (tl_amx_act_sums). */
AI void finish(int q6, const int32_t (*cs)[16][16], int m, const uint8_t *at, const uint8_t *sums, size_t as,
               __m512 dw, __m512 dm, const __m512i *mnp, int first, float (*acc)[16]) {
    for (int t = 0; t < m; t++) {
        const float da = ((const block_q8_K *)(const void *)(at + (size_t)t * as))->d;
        const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)cs[0][t]), q6 ? 6 : 5),
                                              _mm512_load_si512((const void *)cs[1][t]));
        __m512 v = first ? _mm512_setzero_ps() : _mm512_load_ps(acc[t]);
        v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(da)), v);
        if (!q6) {
            const int32_t *sp = (const int32_t *)(const void *)(sums + (size_t)t * as);
            __m512i imin = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) imin = _mm512_dpwssd_epi32(imin, mnp[i], _mm512_set1_epi32(sp[i]));
            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dm, _mm512_set1_ps(-da)), v);
        }
        _mm512_store_ps(acc[t], v);
    }
}

/* Token tiles per pass: their running sums stay in L1 beside the weights'
 * tiles (y's rows are a matrix width apart: 16 of them share a cache set). */
#define TC 16

/* Rows of one group pair (nrow of its 16 valid) x nt tokens, in tiles of 16
 * (the last may be short: its rows are copied to a zeroed 16-row block). A
 * tile's sums are stored, and folded in after the next tile's products are
 * issued, so the vector work overlaps the tile unit's. */
AI void rows16(int kind, int64_t n, const uint8_t *w0, size_t gs, int nrow, const uint8_t *a, size_t as, int nt,
               float *y, size_t ys) {
    const int64_t nb = n / QK_K;
    const int q6 = kind == K_Q6;
    const size_t sb = kind == K_Q6 ? R8Q6_SB : kind == K_Q5 ? R8K5_SB : R8K_SB, qoff = tl_amx_act_off(n),
                 soff = tl_amx_act_sums(n);
    const __mmask16 keep = nrow >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nrow) - 1);
    const int ntt = (nt + 15) / 16;
    _Alignas(64) uint8_t bh[4][16][64], bl[4][16][64];
    _Alignas(64) int32_t cs[2][2][16][16];
    _Alignas(64) float acc[TC][16][16];
    _Alignas(64) uint8_t tail[16][QK_K];
    if (nt % 16) memset(tail, 0, sizeof tail);
    for (int tc = 0; tc < ntt; tc += TC) {
        const int nc = ntt - tc < TC ? ntt - tc : TC;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *o0 = w0 + (size_t)b * 8 * sb, *o1 = o0 + gs;
            for (size_t p = 0; p < 8 * sb; p += 64) { /* a 16-sequence step reads its weights from memory */
                _mm_prefetch((const char *)(o0 + TL_WEIGHT_PREFETCH + p), _MM_HINT_T1);
                _mm_prefetch((const char *)(o1 + TL_WEIGHT_PREFETCH + p), _MM_HINT_T1);
            }
            __m512i mnp[4];
            if (q6) {
                make_b6(o0, o1, bh, bl);
                for (int i = 0; i < 4; i++) mnp[i] = _mm512_setzero_si512();
            } else {
                make_b(kind == K_Q5, o0, o1, bh, bl);
                for (int i = 0; i < 4; i++) mnp[i] = rz_pairs16(o0 + 96 + 16 * i, o1 + 96 + 16 * i);
            }
            const __m512 dw = rz_halves(o0, o1, 0), dm = rz_halves(o0, o1, 16);
            const size_t boff = (size_t)b * sizeof(block_q8_K);
            int mprev = 0;
            for (int tt = 0; tt <= nc; tt++) {
                const int t0 = 16 * (tc + tt), m = nt - t0 < 16 ? nt - t0 : 16;
                if (tt < nc) {
                    const uint8_t *at = a + (size_t)t0 * as + qoff + (size_t)b * QK_K;
                    long stride = (long)as;
                    if (m < 16) {
                        for (int t = 0; t < m; t++) memcpy(tail[t], at + (size_t)t * as, QK_K);
                        at = tail[0];
                        stride = QK_K;
                    }
                    _tile_zero(3);
                    _tile_zero(4);
                    /* a load waits for the products reading its tile (tiles
                     * are not renamed), so even and odd chunks alternate */
#define AMX_CHUNKS(DP)                                 \
    for (int c = 0; c < 4; c += 2) {                   \
        _tile_loadd(0, at + 64 * c, stride);           \
        _tile_loadd(1, bh[c], 64);                     \
        DP(3, 0, 1);                                   \
        _tile_loadd(2, bl[c], 64);                     \
        DP(4, 0, 2);                                   \
        _tile_loadd(7, at + 64 * (c + 1), stride);     \
        _tile_loadd(5, bh[c + 1], 64);                 \
        DP(3, 7, 5);                                   \
        _tile_loadd(6, bl[c + 1], 64);                 \
        DP(4, 7, 6);                                   \
    }
                    if (q6) AMX_CHUNKS(_tile_dpbssd) /* signed planes */
                    else AMX_CHUNKS(_tile_dpbsud)
#undef AMX_CHUNKS
                    _tile_stored(3, cs[tt & 1][0], 64);
                    _tile_stored(4, cs[tt & 1][1], 64);
                }
                if (tt > 0)
                    finish(q6, cs[(tt - 1) & 1], mprev, a + (size_t)(t0 - 16) * as + boff,
                           a + (size_t)(t0 - 16) * as + soff + 16 * (size_t)b, as, dw, dm, mnp, b == 0, acc[tt - 1]);
                mprev = m;
            }
        }
        for (int tt = 0; tt < nc; tt++) {
            const int t0 = 16 * (tc + tt);
            for (int t = 0; t < 16 && t0 + t < nt; t++)
                _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * ys, keep, _mm512_load_ps(acc[tt][t]));
        }
    }
}

/* The fewest tokens of a short tile the AMX path takes: it costs a whole
 * tile on the tile unit, and alone (no full tile beside it) the weights'
 * scaled bytes are made for it only. Measured on the Xeon (1024 x 2048,
 * interleaved runs): 8 tokens alone 0.83x the AVX-512 tile, 12 1.1x; a tail
 * of 4 beside a full tile level, of 8 1.2x better than leaving it. */
#define AMX_MIN_ALONE 10
#define AMX_MIN_TAIL 5

/* The AVX-512 tile of kind for what AMX leaves. */
static void zmm_gemm(int kind, int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                     size_t ys) {
    if (kind == K_Q6) tl_r8q6_gemm_zmm(n, w, ws, nr, a, as, nt, y, ys);
    else tl_r8k_gemm_zmm(kind == K_Q5, n, w, ws, nr, a, as, nt, y, ys);
}

AI void amx_gemm(int kind, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                 size_t ys) {
    const uint8_t *w = vw, *a = va;
    const size_t gs = 8 * ws;
    const int ng = (nr + 7) / 8, np = ng / 2, tail = nt % 16;
    const int na = nt < 16 ? (nt >= AMX_MIN_ALONE ? nt : 0) : tail >= AMX_MIN_TAIL ? nt : nt - tail;
    if (!na || !np) {
        zmm_gemm(kind, n, vw, ws, nr, va, as, nt, y, ys);
        return;
    }
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
    for (int p = 0; p < np; p++)
        rows16(kind, n, w + (size_t)(2 * p) * gs, gs, nr - 16 * p < 16 ? nr - 16 * p : 16, a, as, na, y + 16 * p, ys);
    _tile_release();
    const int rows = 16 * np < nr ? 16 * np : nr;
    if (ng % 2) zmm_gemm(kind, n, w + (size_t)(2 * np) * gs, ws, nr - 16 * np, va, as, nt, y + 16 * np, ys);
    if (na < nt) zmm_gemm(kind, n, vw, ws, rows, a + (size_t)na * as, as, nt - na, y + (size_t)na * ys, ys);
}

static void amx_gemm_q4_K(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                          size_t ys) {
    amx_gemm(K_Q4, n, w, ws, nr, a, as, nt, y, ys);
}

static void amx_gemm_q5_K(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                          size_t ys) {
    amx_gemm(K_Q5, n, w, ws, nr, a, as, nt, y, ys);
}

static void amx_gemm_q6_K(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                          size_t ys) {
    amx_gemm(K_Q6, n, w, ws, nr, a, as, nt, y, ys);
}

void tl_kernels_fill_amx(tl_kernels *k, tl_num_mode mode) {
    if (mode != TL_NUM_FAST) return;
    k->gemm[TL_Q4_K] = amx_gemm_q4_K;
    k->gemm[TL_Q5_K] = amx_gemm_q5_K;
    k->gemm[TL_Q6_K] = amx_gemm_q6_K;
    k->unpack[TL_Q6_K] = NULL; /* the AMX gemm makes its own planes */
    k->wgemm[TL_Q6_K] = NULL;
}
