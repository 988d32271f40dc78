/* cpu/r8: the fast numerics' layout of the 32-block formats (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0) and its scalar reference. Weight rows are interleaved eight at a
 * time so that one 32-bit vector lane holds one row: an integer dot instruction
 * then gives eight rows' exact block sums at once, and each (row, token, block)
 * costs one float multiply-add. The float order is fixed by the row alone:
 *
 *     acc = 0
 *     for each block b:  acc = fma((float)isum_b, d_w * d_a, acc)
 *                        [Q4_1, Q5_1: acc = fma(m_w, s_a, acc)]
 *
 * where isum_b is the exact integer dot of the block's quants (Q4_0 and Q5_0
 * with their -8/-16 offsets) and s_a is Q8_1's s: d_a * sum(q_a) from the
 * unrounded d_a, rounded to f16 (the activation llama.cpp gives these two
 * formats, so that their min terms match the exact mode's). The SIMD levels
 * compute exactly this, so every level gives the bits of the reference here.
 *
 * The table formats (IQ4_NL, MXFP4, IQ4_XS) take the same layout and order
 * with their 4-bit indices looked up in a signed int8 table (no offset): d_w
 * is IQ4_NL's f16 d, MXFP4's E8M0 scale halved (its table holds twice E2M1's
 * values), IQ4_XS's superblock d times the sub-block's scale (exact in f32). */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "base/util.h"

/* Per block of one row: the fields' bytes in the GGUF layout. */
typedef struct r8_fields {
    size_t block, m, qh, qs;
} r8_fields;

static int fields(tl_type t, r8_fields *f) {
    switch (t) {
    case TL_Q4_0: *f = (r8_fields){sizeof(block_q4_0), 0, 0, 16}; return 0;
    case TL_Q4_1: *f = (r8_fields){sizeof(block_q4_1), 2, 0, 16}; return 0;
    case TL_Q5_0: *f = (r8_fields){sizeof(block_q5_0), 0, 4, 16}; return 0;
    case TL_Q5_1: *f = (r8_fields){sizeof(block_q5_1), 2, 4, 16}; return 0;
    case TL_Q8_0: *f = (r8_fields){sizeof(block_q8_0), 0, 0, 32}; return 0;
    case TL_IQ4_NL: *f = (r8_fields){sizeof(block_iq4_nl), 0, 0, 16}; return 0;
    default: return -1;
    }
}

static int lut_type(tl_type t) { return t == TL_IQ4_NL || t == TL_MXFP4 || t == TL_IQ4_XS; }

int tl_r8_supported(tl_type type) {
    r8_fields f;
    return fields(type, &f) == 0 || lut_type(type);
}

size_t tl_r8_row_bytes(tl_type type, int64_t n) {
    return type == TL_IQ4_XS ? (size_t)(n / QK_K) * R8_XS_SB : tl_row_size(type, n);
}

/* The MXFP4 and IQ4_XS groups: MXFP4 per block e[8], then the quants as
 * IQ4_NL's; IQ4_XS per superblock d[8] f16, then per sub-block sc[8] (int8,
 * the 6-bit scale less 32) and the quants. */
static int pack_lut(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n) {
    const int xs = type == TL_IQ4_XS;
    if (n % (xs ? QK_K : 32) || nrows < 0) return -1;
    const int64_t nb = n / 32, ng = tl_r8_rows(nrows) / 8;
    const size_t rowb = tl_r8_row_bytes(type, n);
    const uint8_t *s = src;
    uint8_t *d = dst;
    memset(d, 0, (size_t)ng * 8 * rowb);
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < 8 && g * 8 + r < nrows; r++) {
            const uint8_t *row = s + (size_t)(g * 8 + r) * tl_row_size(type, n);
            uint8_t *grp = d + (size_t)g * 8 * rowb;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *qs;
                uint8_t *o;
                if (xs) {
                    const block_iq4_xs *x = (const block_iq4_xs *)(const void *)row + b / 8;
                    const int ib = (int)(b % 8);
                    uint8_t *sb = grp + (size_t)(b / 8) * 8 * R8_XS_SB;
                    memcpy(sb + 2 * r, &x->d, 2);
                    o = sb + 16 + (size_t)ib * R8_XS_BLK;
                    o[r] = (uint8_t)(int8_t)tl_iq4_xs_scale(x, ib);
                    qs = x->qs + 16 * ib;
                } else {
                    const block_mxfp4 *x = (const block_mxfp4 *)(const void *)row + b;
                    o = grp + (size_t)b * 8 * sizeof(block_mxfp4);
                    o[r] = x->e;
                    qs = x->qs;
                }
                for (int k = 0; k < 4; k++) memcpy(o + 8 + 32 * k + 4 * r, qs + 4 * k, 4);
            }
        }
    return 0;
}

float tl_r8_e8m0(uint8_t e) {
    const uint32_t bits = (uint32_t)(e > 1 ? e - 1 : 0) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int64_t tl_r8_rows(int64_t nrows) { return (nrows + 7) & ~(int64_t)7; }

/* One group of 8 rows, block b, laid out as (see kernels.h):
 *   d[8] f16 | m[8] f16 (Q4_1, Q5_1) | qh: 32 bytes (Q5) | qs: 4 (8 for Q8_0) x 32 bytes
 * qs vector k: bytes 4r..4r+3 = row r's qs[4k..4k+3]. For the nibble formats the
 * low nibbles are elements 4k.., the high ones 16+4k.. (vector 4+k). qh byte
 * 4r+i holds in bit k the fifth bit of the element at that byte of vector k, so
 * one shift of the 32 bytes and a mask give any vector's fifth bits in place. */
int tl_r8_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n) {
    r8_fields f;
    if (type == TL_MXFP4 || type == TL_IQ4_XS) return pack_lut(type, src, dst, nrows, n);
    if (fields(type, &f) || n % 32 || nrows < 0) return -1;
    const int64_t nb = n / 32, ng = tl_r8_rows(nrows) / 8;
    const size_t gblk = 8 * f.block; /* one block of a group */
    const uint8_t *s = src;
    uint8_t *d = dst;
    memset(d, 0, (size_t)(ng * 8 * nb) * f.block);
    for (int64_t g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = d + (size_t)(g * nb + b) * gblk;
            uint8_t *od = o, *om = o + 16, *oh = o + 16 + 8 * f.m, *oq = oh + 8 * f.qh;
            uint8_t qh[32] = {0};
            for (int r = 0; r < 8; r++) {
                const int64_t row = g * 8 + r;
                if (row >= nrows) break;
                const uint8_t *blk = s + (size_t)(row * nb + b) * f.block;
                memcpy(od + 2 * r, blk, 2);
                if (f.m) memcpy(om + 2 * r, blk + 2, 2);
                if (f.qh) {
                    uint32_t h;
                    memcpy(&h, blk + 2 + f.m, 4);
                    for (int k = 0; k < 4; k++)
                        for (int i = 0; i < 4; i++) {
                            qh[4 * r + i] |= (uint8_t)(((h >> (4 * k + i)) & 1u) << k);
                            qh[4 * r + i] |= (uint8_t)(((h >> (16 + 4 * k + i)) & 1u) << (4 + k));
                        }
                }
                const uint8_t *qs = blk + 2 + f.m + f.qh;
                for (size_t k = 0; k < f.qs / 4; k++) memcpy(oq + 32 * k + 4 * (size_t)r, qs + 4 * k, 4);
            }
            if (f.qh) memcpy(oh, qh, sizeof qh);
        }
    return 0;
}

/* ---- activations: Q8_1's quants in a row, then per block d, s and sum(q) ---- */

size_t tl_r8_act_row_size(int64_t n) { return (size_t)n + 12 * (size_t)(n / 32); }

void tl_r8_act_make(tl_quantize_fn q8_1, const float *x, void *row, int64_t n) {
    const int64_t nb = n / 32;
    uint8_t *q = row;
    float *d = (float *)(void *)(q + n), *s = d + nb;
    int32_t *sum = (int32_t *)(s + nb);
    for (int64_t b = 0; b < nb; b++) {
        block_q8_1 blk;
        q8_1(x + 32 * b, &blk, 32);
        memcpy(q + 32 * b, blk.qs, 32);
        int32_t t = 0;
        for (int i = 0; i < 32; i++) t += blk.qs[i];
        d[b] = tl_fp16_to_fp32(blk.d);
        s[b] = tl_fp16_to_fp32(blk.s);
        sum[b] = t;
    }
}

/* ---- the scalar reference gemm ---- */

static float h2f_at(const uint8_t *p, int i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return tl_fp16_to_fp32(h);
}

/* Row r (0..7) of a packed group, block at blk: element j's stored quant as
 * the integer the block sum uses (before the Q4_0/Q5_0 offset). */
static int quant_at(tl_type type, const uint8_t *blk, int r, int j) {
    r8_fields f = {0, 0, 0, 0};
    fields(type, &f);
    if (lut_type(type)) {
        const uint8_t byte = blk[(type == TL_IQ4_NL ? 16 : 8) + 32 * (j % 16 / 4) + 4 * r + j % 4];
        const int u = j >= 16 ? byte >> 4 : byte & 15;
        return type == TL_MXFP4 ? tl_kvalues_mxfp4[u] : tl_kvalues_iq4nl[u];
    }
    const uint8_t *qh = blk + 16 + 8 * f.m, *qs = qh + 8 * f.qh;
    if (type == TL_Q8_0) return (int8_t)qs[32 * (j / 4) + 4 * r + j % 4];
    const int hi = j >= 16, jj = j % 16;
    const uint8_t byte = qs[32 * (jj / 4) + 4 * r + jj % 4];
    int u = hi ? byte >> 4 : byte & 15;
    if (f.qh) u |= ((qh[4 * r + jj % 4] >> (4 * hi + jj / 4)) & 1) << 4;
    return u;
}

static void gemm_ref(tl_type type, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as,
                     int nt, float *y, size_t ys) {
    r8_fields f = {0, 0, 0, 0};
    fields(type, &f);
    const int64_t nb = n / 32;
    const int off = type == TL_Q4_0 ? 8 : type == TL_Q5_0 ? 16 : 0;
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *grp = (const uint8_t *)vw + (size_t)r0 * ws;
        for (int t = 0; t < nt; t++) {
            const uint8_t *a = (const uint8_t *)va + (size_t)t * as;
            const float *ad = (const float *)(const void *)(a + n), *asf = ad + nb;
            const int32_t *asum = (const int32_t *)(asf + nb);
            for (int r = 0; r < 8 && r0 + r < nr; r++) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *blk = grp + (size_t)b * 8 * f.block;
                    float dw;
                    if (type == TL_MXFP4) {
                        blk = grp + (size_t)b * 8 * sizeof(block_mxfp4);
                        dw = tl_r8_e8m0(blk[r]);
                    } else if (type == TL_IQ4_XS) {
                        const uint8_t *sb = grp + (size_t)(b / 8) * 8 * R8_XS_SB;
                        blk = sb + 16 + (size_t)(b % 8) * R8_XS_BLK;
                        dw = h2f_at(sb, r) * (float)(int8_t)blk[r];
                    } else {
                        dw = h2f_at(blk, r);
                    }
                    int32_t isum = 0;
                    for (int j = 0; j < 32; j++) isum += quant_at(type, blk, r, j) * (int8_t)a[32 * b + j];
                    isum -= off * asum[b];
                    acc = fmaf((float)isum, dw * ad[b], acc);
                    if (f.m) acc = fmaf(h2f_at(blk + 16, r), asf[b], acc);
                }
                y[(size_t)t * ys + r0 + r] = acc;
            }
        }
    }
}

#define REF_GEMM(T)                                                                                 \
    static void r8_ref_##T(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, \
                           int nt, float *y, size_t ys) {                                           \
        gemm_ref(TL_##T, n, w, ws, nr, a, as, nt, y, ys);                                           \
    }
REF_GEMM(Q4_0)
REF_GEMM(Q4_1)
REF_GEMM(Q5_0)
REF_GEMM(Q5_1)
REF_GEMM(Q8_0)
REF_GEMM(IQ4_NL)
REF_GEMM(MXFP4)
REF_GEMM(IQ4_XS)

void tl_kernels_fill_r8_ref(tl_kernels *k) {
    k->gemm[TL_IQ4_NL] = r8_ref_IQ4_NL;
    k->gemm[TL_MXFP4] = r8_ref_MXFP4;
    k->gemm[TL_IQ4_XS] = r8_ref_IQ4_XS;
    k->gemm[TL_Q4_0] = r8_ref_Q4_0;
    k->gemm[TL_Q4_1] = r8_ref_Q4_1;
    k->gemm[TL_Q5_0] = r8_ref_Q5_0;
    k->gemm[TL_Q5_1] = r8_ref_Q5_1;
    k->gemm[TL_Q8_0] = r8_ref_Q8_0;
    k->widen[TL_Q4_0] = k->widen[TL_Q5_0] = NULL;
}

/* ---- Q4_K in the r8 layout (r8k) ----
 * Per group of 8 rows and superblock of 256: d[8], dmin[8] (f16), the 8
 * sub-blocks' 6-bit scales and mins unpacked to bytes (sc[j][r], mn[j][r]),
 * then the quants: for each 64-element chunk i and 4-byte group k, 32 bytes
 * with row r's qs[32i+4k..+3] at 4r (low nibbles: sub-block 2i, high: 2i+1).
 * 148 bytes per row and superblock (the GGUF layout has 144). Per row:
 *
 *     acc = 0
 *     for each superblock b:  isum = sum_j sc_j * dot_j,  imin = sum_j mn_j * asum_j  (exact integers)
 *                             acc = fma((float)isum, d * d_a, acc)
 *                             acc = fma((float)imin, -(dmin * d_a), acc)
 *
 * on Q8_K activations as they are (asum_j: the two bsums of sub-block j).
 * Q5_K is the same with its fifth bits after the quants: 8 groups of 32 bytes,
 * row r's qh[4k..4k+3] at 4r (bit j of qh[l]: element l of sub-block j); 180
 * bytes per row and superblock (GGUF: 176). */
#define R8K_SB 148
#define R8K5_SB 180

size_t tl_r8k_row_bytes(tl_type type, int64_t n) {
    return (size_t)(n / QK_K) * (type == TL_Q6_K ? 210 : type == TL_Q5_K ? R8K5_SB : R8K_SB);
}

/* Q4_K and Q5_K share d, dmin, scales and the low nibbles' layout. */
static void pack_k_row(uint8_t *o, int r, const uint8_t *dm, const uint8_t *scales, const uint8_t *qs,
                       const uint8_t *qh) {
    memcpy(o + 2 * r, dm, 2);
    memcpy(o + 16 + 2 * r, dm + 2, 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        scale_min_k4(j, scales, &sc, &mn);
        o[32 + 8 * j + r] = sc;
        o[96 + 8 * j + r] = mn;
    }
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 8; k++) memcpy(o + 160 + 32 * (8 * i + k) + 4 * r, qs + 32 * i + 4 * k, 4);
    if (qh)
        for (int k = 0; k < 8; k++) memcpy(o + 8 * R8K_SB + 32 * k + 4 * r, qh + 4 * k, 4);
}

int tl_r8k_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n) {
    if ((type != TL_Q4_K && type != TL_Q5_K) || n % QK_K || nrows < 0) return -1;
    const int q5 = type == TL_Q5_K;
    const size_t sb = q5 ? R8K5_SB : R8K_SB, ib = tl_row_size(type, QK_K);
    const int64_t nb = n / QK_K, ng = tl_r8_rows(nrows) / 8;
    const uint8_t *s = src;
    uint8_t *d = dst;
    memset(d, 0, (size_t)(ng * nb) * 8 * sb);
    for (int64_t g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = d + (size_t)(g * nb + b) * 8 * sb;
            for (int r = 0; r < 8 && g * 8 + r < nrows; r++) {
                const uint8_t *x = s + (size_t)((g * 8 + r) * nb + b) * ib;
                if (q5) {
                    const block_q5_K *x5 = (const block_q5_K *)(const void *)x;
                    pack_k_row(o, r, x, x5->scales, x5->qs, x5->qh);
                } else {
                    const block_q4_K *x4 = (const block_q4_K *)(const void *)x;
                    pack_k_row(o, r, x, x4->scales, x4->qs, NULL);
                }
            }
        }
    return 0;
}

static void r8k_ref(tl_type type, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt,
                    float *y, size_t ys) {
    const int64_t nb = n / QK_K;
    const int q5 = type == TL_Q5_K;
    const size_t sb = q5 ? R8K5_SB : R8K_SB;
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *grp = (const uint8_t *)vw + (size_t)r0 * ws;
        for (int t = 0; t < nt; t++) {
            const block_q8_K *a = (const block_q8_K *)(const void *)((const uint8_t *)va + (size_t)t * as);
            for (int r = 0; r < 8 && r0 + r < nr; r++) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *o = grp + (size_t)b * 8 * sb;
                    int32_t isum = 0, imin = 0;
                    for (int j = 0; j < 8; j++) {
                        int32_t dot = 0;
                        for (int l = 0; l < 32; l++) {
                            const uint8_t byte = o[160 + 32 * (8 * (j / 2) + l / 4) + 4 * r + l % 4];
                            int u = j & 1 ? byte >> 4 : byte & 15;
                            if (q5) u |= ((o[8 * R8K_SB + 32 * (l / 4) + 4 * r + l % 4] >> j) & 1) << 4;
                            dot += u * a[b].qs[32 * j + l];
                        }
                        isum += o[32 + 8 * j + r] * dot;
                        imin += o[96 + 8 * j + r] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
                    }
                    acc = fmaf((float)isum, h2f_at(o, r) * a[b].d, acc);
                    acc = fmaf((float)imin, -(h2f_at(o + 16, r) * a[b].d), acc);
                }
                y[(size_t)t * ys + r0 + r] = acc;
            }
        }
    }
}

static void r8k_ref_q4_K(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                         size_t ys) {
    r8k_ref(TL_Q4_K, n, w, ws, nr, a, as, nt, y, ys);
}

static void r8k_ref_q5_K(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                         size_t ys) {
    r8k_ref(TL_Q5_K, n, w, ws, nr, a, as, nt, y, ys);
}

/* ---- Q6_K in the r8 layout ----
 * Per group and superblock: d[8] (f16), the 16 int8 scales as sc[s][r], then
 * ql's 4 chunks and qh's 2 in 32-byte pieces (row r's ql[32c+4k..+3] at 4r of
 * piece (c, k), where tl_r8q6_ql puts it; qh likewise). 210 bytes per row and
 * superblock, as in GGUF.
 * Element 128h + 32x + l (l < 32) is ql chunk 2h + (x & 1), low nibble for
 * x < 2, high for x >= 2, with qh chunk h's bits 2x..2x+1 as bits 4-5. Per row:
 *
 *     isum = sum_s sc_s * dot_s(q + 32, a) - 32 * sum_s sc_s * bsum_s   (exact)
 *     acc = fma((float)isum, d * d_a, acc)                              per superblock */
#define R8Q6_SB 210

static int q6_u(const uint8_t *o, int r, int e) {
    const int h = e / 128, x = (e % 128) / 32, l = e % 32;
    const uint8_t ql = o[tl_r8q6_ql(2 * h + (x & 1), l / 4) + 4 * r + l % 4];
    const uint8_t qh = o[tl_r8q6_qh(h, l / 4) + 4 * r + l % 4];
    return (x < 2 ? ql & 15 : ql >> 4) | (((qh >> (2 * x)) & 3) << 4);
}

int tl_r8q6_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n) {
    if (type != TL_Q6_K || n % QK_K || nrows < 0) return -1;
    const int64_t nb = n / QK_K, ng = tl_r8_rows(nrows) / 8;
    const block_q6_K *s = src;
    uint8_t *d = dst;
    memset(d, 0, (size_t)(ng * nb) * 8 * R8Q6_SB);
    for (int64_t g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = d + (size_t)(g * nb + b) * 8 * R8Q6_SB;
            for (int r = 0; r < 8 && g * 8 + r < nrows; r++) {
                const block_q6_K *x = &s[(g * 8 + r) * nb + b];
                memcpy(o + 2 * r, &x->d, 2);
                for (int j = 0; j < 16; j++) o[16 + 8 * j + r] = (uint8_t)x->scales[j];
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 8; k++) memcpy(o + tl_r8q6_ql(c, k) + 4 * r, x->ql + 32 * c + 4 * k, 4);
                for (int c = 0; c < 2; c++)
                    for (int k = 0; k < 8; k++)
                        memcpy(o + tl_r8q6_qh(c, k) + 4 * r, x->qh + 32 * c + 4 * k, 4);
            }
        }
    return 0;
}

static void r8q6_ref(int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt, float *y,
                     size_t ys) {
    const int64_t nb = n / QK_K;
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *grp = (const uint8_t *)vw + (size_t)r0 * ws;
        for (int t = 0; t < nt; t++) {
            const block_q8_K *a = (const block_q8_K *)(const void *)((const uint8_t *)va + (size_t)t * as);
            for (int r = 0; r < 8 && r0 + r < nr; r++) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *o = grp + (size_t)b * 8 * R8Q6_SB;
                    int32_t isum = 0, ibias = 0;
                    for (int sb = 0; sb < 16; sb++) {
                        int32_t dot = 0;
                        for (int l = 0; l < 16; l++) dot += q6_u(o, r, 16 * sb + l) * a[b].qs[16 * sb + l];
                        const int sc = (int8_t)o[16 + 8 * sb + r];
                        isum += sc * dot;
                        ibias += sc * a[b].bsums[sb];
                    }
                    isum -= 32 * ibias;
                    acc = fmaf((float)isum, h2f_at(o, r) * a[b].d, acc);
                }
                y[(size_t)t * ys + r0 + r] = acc;
            }
        }
    }
}

void tl_kernels_fill_r8k_ref(tl_kernels *k) {
    k->gemm[TL_Q4_K] = r8k_ref_q4_K;
    k->gemm[TL_Q5_K] = r8k_ref_q5_K;
    k->gemm[TL_Q6_K] = r8q6_ref;
}

/* ---- F16 and BF16 in the r8 layout (r8h) ----
 * F16: per group of 8 rows, element by element: the 8 rows' 16-bit values of
 * element j at 16j (2 bytes per row and element, as in GGUF). Activations are
 * the f32 row itself. Per row, one fma chain over the elements:
 *
 *     acc = 0;  for each j:  acc = fma(w_j, x_j, acc)       (w_j widened exactly)
 *
 * BF16: what vdpbf16ps computes (AVX-512 BF16), so that the instruction is
 * the fast path and the levels without it emulate it. Per group, pair by pair:
 * the 8 rows' elements 2p and 2p+1 at 32p (a row with an odd length gets a
 * zero element). Activations are rounded to bf16 (to nearest even, as
 * llama.cpp rounds them for its BF16 dot), padded the same way. bf16 inputs
 * with a zero exponent are zeros (the instruction's DAZ: done once, when the
 * weights are packed and the activations made). Per row:
 *
 *     acc = 0
 *     for each pair p:  acc = ftz(fma(w_2p+1, x_2p+1, acc))   (odd element first,
 *                       acc = ftz(fma(w_2p,   x_2p,   acc))    as the instruction)
 *
 * where ftz is the instruction's flush to zero: a result whose value, rounded
 * to 24 bits with an unbounded exponent, is under FLT_MIN in magnitude becomes
 * a zero of its sign (x86 detects tininess after rounding: an exact sum in
 * [FLT_MIN - 2^-150, FLT_MIN - 2^-151) is flushed though fmaf rounds it up to
 * FLT_MIN). The products are exact (8-bit significands). The SIMD levels
 * without the instruction run the same fmas with MXCSR's FTZ bit set, which
 * flushes by the same rule (48M cases near FLT_MIN equal to vdpbf16ps's
 * results on an AMD EPYC Zen 4, as the unit test's edge cases are). */

int tl_r8h_supported(tl_type type) { return type == TL_F16 || type == TL_BF16; }

static int64_t bf16_even(int64_t n) { return n + (n & 1); }

size_t tl_r8h_row_bytes(tl_type type, int64_t n) {
    return (size_t)(type == TL_BF16 ? bf16_even(n) : n) * sizeof(uint16_t);
}

size_t tl_r8h_act_row_size(tl_type type, int64_t n) {
    return type == TL_BF16 ? (size_t)bf16_even(n) * sizeof(uint16_t) : (size_t)n * sizeof(float);
}

/* vdpbf16ps reads a bf16 with a zero exponent as a zero of its sign */
static uint16_t bf16_daz(uint16_t h) { return (h & 0x7f80) ? h : (uint16_t)(h & 0x8000); }

void tl_r8h_act_make(tl_type type, const float *x, void *row, int64_t n) {
    if (type != TL_BF16) {
        memcpy(row, x, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = row;
    for (int64_t j = 0; j < n; j++) h[j] = bf16_daz(tl_fp32_to_bf16(x[j]));
    if (n & 1) h[n] = 0;
}

int tl_r8h_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n) {
    if (!tl_r8h_supported(type) || nrows < 0 || n < 0) return -1;
    const int64_t ng = tl_r8_rows(nrows) / 8, ne = type == TL_BF16 ? bf16_even(n) : n;
    const uint16_t *s = src;
    uint16_t *d = dst;
    memset(d, 0, (size_t)(ng * 8 * ne) * sizeof(uint16_t));
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < 8 && g * 8 + r < nrows; r++) {
            const uint16_t *row = s + (size_t)(g * 8 + r) * (size_t)n;
            uint16_t *o = d + (size_t)g * 8 * (size_t)ne;
            if (type == TL_BF16)
                for (int64_t j = 0; j < n; j++) o[16 * (j / 2) + 2 * r + (j & 1)] = bf16_daz(row[j]);
            else
                for (int64_t j = 0; j < n; j++) o[8 * j + r] = row[j];
        }
    return 0;
}

/* fma(w, x, acc) flushed as vdpbf16ps flushes (see above). w*x is exact in
 * double, and so is acc + w*x whenever the result lies near FLT_MIN. */
static float bf16_fma_ftz(float w, float x, float acc) {
    const float r = fmaf(w, x, acc);
    if (isnan(r) || fabsf(r) > 0x1p-126f) return r;
    if (fabsf(r) == 0x1p-126f && fabs((double)acc + (double)w * (double)x) >= 0x1p-126 - 0x1p-151) return r;
    return copysignf(0.0f, r);
}

static void r8h_ref(tl_type type, int64_t n, const void *vw, size_t ws, int nr, const void *va, size_t as, int nt,
                    float *y, size_t ys) {
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint16_t *grp = (const uint16_t *)(const void *)((const uint8_t *)vw + (size_t)r0 * ws);
        for (int t = 0; t < nt; t++) {
            const void *xt = (const uint8_t *)va + (size_t)t * as;
            for (int r = 0; r < 8 && r0 + r < nr; r++) {
                float acc = 0.0f;
                if (type == TL_BF16) {
                    const uint16_t *x = xt;
                    for (int64_t p = 0; p < bf16_even(n) / 2; p++) {
                        const uint16_t *w = grp + 16 * p + 2 * r;
                        acc = bf16_fma_ftz(tl_bf16_to_fp32(w[1]), tl_bf16_to_fp32(x[2 * p + 1]), acc);
                        acc = bf16_fma_ftz(tl_bf16_to_fp32(w[0]), tl_bf16_to_fp32(x[2 * p]), acc);
                    }
                } else {
                    const float *x = xt;
                    for (int64_t j = 0; j < n; j++) acc = fmaf(tl_fp16_to_fp32(grp[8 * j + r]), x[j], acc);
                }
                y[(size_t)t * ys + r0 + r] = acc;
            }
        }
    }
}

static void r8h_ref_f16(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                        size_t ys) {
    r8h_ref(TL_F16, n, w, ws, nr, a, as, nt, y, ys);
}

static void r8h_ref_bf16(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                         size_t ys) {
    r8h_ref(TL_BF16, n, w, ws, nr, a, as, nt, y, ys);
}

void tl_kernels_fill_r8h_ref(tl_kernels *k) {
    k->gemm[TL_F16] = r8h_ref_f16;
    k->gemm[TL_BF16] = r8h_ref_bf16;
}
