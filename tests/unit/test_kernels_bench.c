/* test_kernels_bench: the SIMD kernel levels this CPU can run (AVX2, AVX-512,
 * AVX-512 VNNI) against quant.c's scalar reference: activation quantizers and
 * dots bit for bit (the dots also within 1e-5 of sum|terms|), results
 * independent of alignment; then prints weight-byte throughput (information
 * only, no timing asserts) for a 4096-wide row in cache and a 4096x4096 matrix
 * out of cache. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/mathfn.h"
#include "quant/quant.h"
#include "tl_test.h"
#include "base/util.h"
#include "forward/kvfmt.h"

typedef struct rng {
    uint64_t s;
} rng;

static uint32_t rnd(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 16);
}

static float frand(rng *r) { return (float)rnd(r) / 2147483648.0f - 1.0f; } /* [-1, 1) */

static const tl_type wtypes[] = {TL_Q4_0, TL_Q4_1, TL_Q5_0, TL_Q5_1, TL_Q8_0,
                                 TL_Q4_K, TL_Q5_K, TL_Q6_K, TL_Q2_K, TL_Q3_K, TL_IQ4_NL, TL_MXFP4,
                                 TL_IQ4_XS, TL_F16};
/* the model widths asked for, plus odd block counts that reach every tail path */
static const int64_t sizes[] = {576, 1536, 2048, 4096, 640, 1024, 160, 224, 256, 768, 96, 288};

/* Where each block keeps its half-float scales (d, then m/dmin if any). */
static int scale_offsets(tl_type t, size_t off[2]) {
    switch (t) {
    case TL_Q4_0: case TL_Q5_0: case TL_Q8_0: case TL_IQ4_NL: case TL_IQ4_XS: off[0] = 0; return 1;
    case TL_Q4_1: case TL_Q5_1: case TL_Q4_K: case TL_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case TL_Q6_K: off[0] = offsetof(block_q6_K, d); return 1;
    case TL_Q2_K: off[0] = offsetof(block_q2_K, d); off[1] = offsetof(block_q2_K, dmin); return 2;
    case TL_Q3_K: off[0] = offsetof(block_q3_K, d); return 1;
    default: return 0;
    }
}

/* Random bytes everywhere (every quant bit pattern, Q8_0's -128 included) but
 * finite scales of a realistic size. */
static void make_weights(tl_type t, void *w, int64_t n, rng *r) {
    const tl_type_traits *tt = tl_type_info((uint32_t)t);
    const size_t bytes = tl_row_size(t, n);
    uint8_t *p = w;
    if (t == TL_F16) {
        for (int64_t i = 0; i < n; i++) ((uint16_t *)w)[i] = tl_fp32_to_fp16(frand(r));
        return;
    }
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rnd(r);
    size_t off[2];
    const int ns = scale_offsets(t, off);
    for (size_t b = 0; b < bytes / tt->type_size; b++)
        for (int s = 0; s < ns; s++) {
            const uint16_t h = tl_fp32_to_fp16(0.05f * frand(r));
            memcpy(p + b * tt->type_size + off[s], &h, 2);
        }
    if (t == TL_MXFP4) /* E8M0 scales of a realistic size: 2^-10 .. 2^0, and the two smallest */
        for (size_t b = 0; b < bytes / tt->type_size; b++) p[b * tt->type_size] = (uint8_t)(b % 13 == 5 ? b % 2 : 118 + rnd(r) % 12);
}

static void make_acts(float *x, int64_t n, rng *r) {
    for (int64_t i = 0; i < n; i++) x[i] = frand(r) * (i % 7 == 0 ? 4.0f : 1.0f);
}

/* sum |w_i a_i| over the dequantized rows: the scale of the rounding error. */
static double abs_terms(tl_type t, int64_t n, const void *w, const void *a) {
    const tl_type at = tl_type_info((uint32_t)t)->vec_dot_type;
    float *dw = malloc((size_t)n * sizeof(float)), *da = malloc((size_t)n * sizeof(float));
    double s = 0;
    if (dw && da && tl_dequantize_row(t, w, dw, n) == 0 && tl_dequantize_row(at, a, da, n) == 0)
        for (int64_t i = 0; i < n; i++) s += fabs((double)dw[i] * da[i]);
    else
        s = NAN;
    free(dw);
    free(da);
    return s;
}

static void check_quantizers(const tl_kernels *k, rng *r) {
    static const tl_type at[] = {TL_Q8_0, TL_Q8_1, TL_Q8_K, TL_F16};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        float *x = malloc((size_t)n * sizeof(float));
        uint8_t *want = malloc(tl_row_size(TL_F32, n)), *got = malloc(tl_row_size(TL_F32, n));
        CHECK(x && want && got, "alloc");
        if (!x || !want || !got) return;
        make_acts(x, n, r);
        for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;            /* an all-zero Q8_0 block */
        x[70] = 3.0f, x[71] = -3.0f; /* ties in |max|: the first one sets the sign */
        if (n > 256) x[260] = -5.0f, x[261] = 5.0f;
        for (size_t ti = 0; ti < sizeof at / sizeof *at; ti++) {
            const tl_type t = at[ti];
            if (n % tl_type_info((uint32_t)t)->block_size) continue;
            const size_t bytes = tl_row_size(t, n);
            memset(want, 0xAA, bytes);
            memset(got, 0x55, bytes);
            CHECK(tl_quantize_row_act(t, x, want, n) == 0, "ref quantize %s", tl_type_info(t)->name);
            CHECK(k->quantize[t] != NULL, "%s: no quantize[%s]", k->name, tl_type_info(t)->name);
            if (!k->quantize[t]) continue;
            k->quantize[t](x, got, n);
            CHECK(memcmp(want, got, bytes) == 0, "%s quantize %s n=%lld differs from reference", k->name,
                  tl_type_info(t)->name, (long long)n);
        }
        free(x);
        free(want);
        free(got);
    }
}

/* One (type, n) case: value against the reference, and the same value from
 * copies moved off vector alignment (by 2 and 4 bytes: the blocks' own
 * alignment, which rows in a GGUF file always keep). */
static void check_dot_case(const tl_kernels *k, tl_type t, int64_t n, rng *r) {
    const tl_type at = tl_type_info((uint32_t)t)->vec_dot_type;
    const size_t wb = tl_row_size(t, n), ab = tl_row_size(at, n);
    uint8_t *w = malloc(wb + 2), *a = malloc(ab + 4);
    float *x = malloc((size_t)n * sizeof(float));
    CHECK(w && a && x, "alloc");
    if (w && a && x) {
        make_weights(t, w, n, r);
        make_acts(x, n, r);
        CHECK(tl_quantize_row_act(at, x, a, n) == 0, "quantize act");
        const float ref = tl_vec_dot_ref(t, n, w, a);
        const float got = k->vec_dot[t](n, w, a);
        const double mag = abs_terms(t, n, w, a);
        CHECK(memcmp(&got, &ref, sizeof got) == 0, "%s %s n=%lld: %.9g vs ref %.9g, not bit-identical", k->name,
              tl_type_info(t)->name, (long long)n, got, ref);
        CHECK(fabs((double)got - ref) <= 1e-5 * mag, "%s %s n=%lld: %.9g vs ref %.9g (sum|terms| %g)", k->name,
              tl_type_info(t)->name, (long long)n, got, ref, mag);
        if (k->vec_dot_x8[t]) { /* llama.cpp's repacked order (exact mode): the scalar level's bits */
            tl_kernels sc;
            tl_kernels_init(&sc, TL_CPU_SCALAR, TL_NUM_EXACT);
            const float x8 = k->vec_dot_x8[t](n, w, a), x8_ref = sc.vec_dot_x8[t] ? sc.vec_dot_x8[t](n, w, a) : NAN;
            CHECK(memcmp(&x8, &x8_ref, sizeof x8) == 0, "%s %s n=%lld: vec_dot_x8 %.9g vs scalar %.9g", k->name,
                  tl_type_info(t)->name, (long long)n, x8, x8_ref);
            CHECK(fabs((double)x8 - ref) <= 1e-5 * mag, "%s %s n=%lld: vec_dot_x8 %.9g vs vec_dot %.9g", k->name,
                  tl_type_info(t)->name, (long long)n, x8, ref);
        }
        memmove(w + 2, w, wb);
        memmove(a + 4, a, ab);
        const float moved = k->vec_dot[t](n, w + 2, a + 4);
        CHECK(memcmp(&moved, &got, sizeof got) == 0, "%s %s n=%lld: %.9g at other addresses vs %.9g", k->name,
              tl_type_info(t)->name, (long long)n, moved, got);
    }
    free(w);
    free(a);
    free(x);
}

static void check_dots(const tl_kernels *k, rng *r) {
    for (size_t ti = 0; ti < sizeof wtypes / sizeof *wtypes; ti++) {
        const tl_type t = wtypes[ti];
        CHECK(k->vec_dot[t] != NULL, "%s: no vec_dot[%s]", k->name, tl_type_info(t)->name);
        if (!k->vec_dot[t]) continue;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            if (sizes[si] % tl_type_info((uint32_t)t)->block_size == 0) check_dot_case(k, t, sizes[si], r);
    }
}

/* gemm (tiles of weight rows x activation rows) must equal vec_dot pair by
 * pair, bitwise, for every tile shape and remainder. */
static void check_gemm_case(const tl_kernels *k, tl_type t, int64_t n, int nr, int nt, rng *r) {
    const tl_type at = tl_type_info((uint32_t)t)->vec_dot_type;
    const size_t wb = tl_row_size(t, n), ab = tl_row_size(at, n), gb = tl_act_row_size(at, n);
    uint8_t *w = malloc(wb * (size_t)nr), *wp = malloc(wb * (size_t)nr);
    uint8_t *a = malloc(ab * (size_t)nt), *ga = malloc(gb * (size_t)nt);
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc(sizeof(float) * (size_t)(nr + 3) * (size_t)nt);
    CHECK(w && wp && a && ga && x && y, "alloc");
    if (w && wp && a && ga && x && y) {
        for (int i = 0; i < nr; i++) make_weights(t, w + (size_t)i * wb, n, r);
        if (tl_pack_supported(t)) CHECK(tl_pack_rows32(t, w, wp, nr, n) == 0, "pack %s", tl_type_info(t)->name);
        else memcpy(wp, w, wb * (size_t)nr);
        for (int i = 0; i < nt; i++) {
            make_acts(x, n, r);
            tl_quantize_row_act(at, x, a + (size_t)i * ab, n);
            memcpy(ga + (size_t)i * gb, a + (size_t)i * ab, ab);
            tl_act_add_scales(at, ga + (size_t)i * gb, n);
        }
        const size_t ys = (size_t)nr + 3; /* a row stride wider than the tile */
        k->gemm[t](n, wp, wb, nr, ga, gb, nt, y, ys);
        int bad = 0;
        for (int ti = 0; ti < nt; ti++)
            for (int ri = 0; ri < nr; ri++) {
                const float one = k->vec_dot[t](n, w + (size_t)ri * wb, a + (size_t)ti * ab);
                if (memcmp(&one, &y[(size_t)ti * ys + ri], sizeof one) && !bad++)
                    CHECK(0, "%s %s n=%lld %dx%d (%d,%d): gemm %.9g vs dot %.9g", k->name,
                          tl_type_info(t)->name, (long long)n, nr, nt, ri, ti, y[(size_t)ti * ys + ri], one);
            }
        CHECK(!bad, "%s %s n=%lld tile %dx%d bitwise", k->name, tl_type_info(t)->name, (long long)n, nr, nt);
        /* the same rows widened to Q8_0 and run by the Q8_0 gemm */
        uint8_t *wq = k->widen[t] ? malloc(tl_row_size(TL_Q8_0, n) * (size_t)nr) : NULL;
        if (wq) {
            k->widen[t](wp, wb, nr, n, wq);
            k->gemm[TL_Q8_0](n, wq, tl_row_size(TL_Q8_0, n), nr, ga, gb, nt, y, ys);
            int wbad = 0;
            for (int ti = 0; ti < nt; ti++)
                for (int ri = 0; ri < nr; ri++) {
                    const float one = k->vec_dot[t](n, w + (size_t)ri * wb, a + (size_t)ti * ab);
                    wbad += memcmp(&one, &y[(size_t)ti * ys + ri], sizeof one) != 0;
                }
            CHECK(!wbad, "%s %s n=%lld tile %dx%d widened to Q8_0: %d differ", k->name, tl_type_info(t)->name,
                  (long long)n, nr, nt, wbad);
            free(wq);
        }
    }
    free(w);
    free(wp);
    free(a);
    free(ga);
    free(x);
    free(y);
}

static void check_gemm(const tl_kernels *k, rng *r) {
    static const int shapes[][2] = {{1, 1}, {4, 1}, {5, 1}, {16, 1}, {2, 2}, {3, 3}, {2, 4}, {7, 4},
                                    {16, 5}, {9, 7}, {1, 9}, {16, 12}};
    for (size_t ti = 0; ti < sizeof wtypes / sizeof *wtypes; ti++) {
        const tl_type t = wtypes[ti];
        if (!k->gemm[t]) continue;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            if (sizes[si] % tl_type_info((uint32_t)t)->block_size) continue;
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
                check_gemm_case(k, t, sizes[si], shapes[sh][0], shapes[sh][1], r);
        }
        /* rows wider than the biased formats' interleaved s buffer take the pair-by-pair path */
        if (tl_pack_supported(t)) check_gemm_case(k, t, 32 * 1032, 3, 2, r);
    }
}

/* The level's gemm and the reference's on the same packed rows and
 * activations: whether they give the same bits (rows past nr, and the stride's
 * slack, must stay as they were: both start from the same filler). */
static int same_as_ref(const tl_kernels *k, const tl_kernels *ref, tl_type t, int64_t n, const void *wp, size_t pb,
                       int nr, const void *a, size_t ab, int nt, float *y, float *yr, size_t ys) {
    for (size_t i = 0; i < ys * (size_t)nt; i++) y[i] = yr[i] = -7.0f;
    k->gemm[t](n, wp, pb, nr, a, ab, nt, y, ys);
    ref->gemm[t](n, wp, pb, nr, a, ab, nt, yr, ys);
    return memcmp(y, yr, sizeof(float) * ys * (size_t)nt) == 0;
}

/* ---- the fast numerics' r8 gemm ----
 * Each level's tiles must give bitwise the scalar reference's result (cpu/r8.c)
 * for every tile shape and padded last group. The reference itself is checked
 * against the math: a double-precision sum of the same integer block dots and
 * scales, within the error bound of its order (a chain of nb fmas, each block
 * scale d_w*d_a rounded once: (nb + 2) units of 2^-24 times sum|terms|); and
 * against the exact mode's vec_dot (llama.cpp's order). */
static const tl_type r8types[] = {TL_Q4_0, TL_Q4_1, TL_Q5_0, TL_Q5_1, TL_Q8_0};

static void check_r8_case(const tl_kernels *k, const tl_kernels *ref, tl_type t, int64_t n, int nr, int nt, rng *r) {
    const tl_type at = tl_type_info((uint32_t)t)->vec_dot_type;
    const size_t wb = tl_row_size(t, n), ab = tl_row_size(at, n), gb = tl_r8_act_row_size(n);
    const int64_t nb = n / 32, prow = tl_r8_rows(nr);
    uint8_t *w = malloc(wb * (size_t)nr), *wp = malloc(wb * (size_t)prow);
    uint8_t *a = malloc(ab * (size_t)nt), *ga = malloc(gb * (size_t)nt);
    float *x = malloc((size_t)n * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
    const size_t ys = (size_t)nr + 3;
    float *y = malloc(sizeof(float) * ys * (size_t)nt), *yr = malloc(sizeof(float) * ys * (size_t)nt);
    CHECK(w && wp && a && ga && x && wf && y && yr, "alloc");
    if (w && wp && a && ga && x && wf && y && yr) {
        for (int i = 0; i < nr; i++) make_weights(t, w + (size_t)i * wb, n, r);
        CHECK(tl_r8_pack(t, w, wp, nr, n) == 0, "r8 pack %s", tl_type_info(t)->name);
        for (int i = 0; i < nt; i++) {
            make_acts(x, n, r);
            tl_quantize_row_act(at, x, a + (size_t)i * ab, n);
            tl_r8_act_make(ref->quantize[TL_Q8_1], x, ga + (size_t)i * gb, n);
            uint8_t *own = k->r8_act ? malloc(gb) : NULL;
            if (own) { /* the level's one-pass row: the reference's bytes */
                k->r8_act(x, own, n);
                CHECK(memcmp(own, ga + (size_t)i * gb, gb) == 0, "%s r8 activation row n=%lld: not the reference's bytes",
                      k->name, (long long)n);
            }
            free(own);
        }
        CHECK(same_as_ref(k, ref, t, n, wp, wb, nr, ga, gb, nt, y, yr, ys), "%s r8 %s n=%lld %dx%d: not the reference's bits",
              k->name, tl_type_info(t)->name, (long long)n, nr, nt);
        int bad_math = 0, bad_exact = 0;
        const int biased = t == TL_Q4_1 || t == TL_Q5_1;
        for (int ti = 0; ti < nt; ti++) {
            const uint8_t *gr = ga + (size_t)ti * gb;
            const int8_t *q = (const int8_t *)gr;
            const float *ad = (const float *)(const void *)(gr + n), *as = ad + nb;
            for (int ri = 0; ri < nr; ri++) {
                /* dequantize = d*q (+ m): recover the integer quants and scales per block */
                const uint8_t *row = w + (size_t)ri * wb;
                tl_dequantize_row(t, row, wf, n);
                double exact = 0, mag = 0, amag = 0; /* amag: sum |w_i a_i|, llama.cpp's lanes' scale */
                for (int64_t b = 0; b < nb; b++) {
                    uint16_t hd, hm = 0;
                    memcpy(&hd, row + (size_t)b * tl_type_info((uint32_t)t)->type_size, 2);
                    if (biased) memcpy(&hm, row + (size_t)b * tl_type_info((uint32_t)t)->type_size + 2, 2);
                    const float dw = tl_fp16_to_fp32(hd), mw = tl_fp16_to_fp32(hm);
                    double isum = 0, iabs = 0;
                    for (int j = 0; j < 32; j++) {
                        /* the quant: (x - m) / d, exact for these small integers */
                        const double qw = dw != 0.0f ? ((double)wf[32 * b + j] - mw) / dw : 0.0;
                        isum += (double)llround(qw) * q[32 * b + j];
                        iabs += fabs((double)llround(qw) * q[32 * b + j]);
                    }
                    amag += iabs * fabs((double)(dw * ad[b])) + (biased ? fabs((double)mw * as[b]) : 0.0);
                    const double term = isum * (double)(dw * ad[b]);
                    exact += term + (biased ? (double)mw * as[b] : 0.0);
                    mag += fabs(term) + (biased ? fabs((double)mw * as[b]) : 0.0);
                }
                const double got = y[(size_t)ti * ys + ri];
                if (fabs(got - exact) > (double)(nb + 2) * 0x1p-24 * mag + 1e-30) bad_math++;
                const double ex = k->vec_dot[t](n, row, a + (size_t)ti * ab);
                if (fabs(got - ex) > (double)(nb + 2) * 0x1p-24 * mag + (double)(nb + 8) * 0x1p-24 * amag +
                                         1e-30)
                    bad_exact++;
            }
        }
        CHECK(!bad_math, "%s r8 %s n=%lld %dx%d: %d outputs outside the order's bound", k->name,
              tl_type_info(t)->name, (long long)n, nr, nt, bad_math);
        CHECK(!bad_exact, "%s r8 %s n=%lld %dx%d: %d outputs too far from the exact mode's dot", k->name,
              tl_type_info(t)->name, (long long)n, nr, nt, bad_exact);
    }
    free(w);
    free(wp);
    free(a);
    free(ga);
    free(x);
    free(wf);
    free(y);
    free(yr);
}

/* The table formats (IQ4_NL, MXFP4, IQ4_XS) in the r8 layout: the level's
 * tiles bitwise the scalar reference's, for every tile shape and padded last
 * group; the reference within its order's bound of a double sum of the
 * dequantized products (each weight rounded once, d_w * d_a once per block, a
 * chain of nb fmas), and close to the exact mode's dot (llama.cpp's order). */
static const tl_type r8luts[] = {TL_IQ4_NL, TL_MXFP4, TL_IQ4_XS};

static void check_r8lut_case(const tl_kernels *k, const tl_kernels *ref, tl_type t, int64_t n, int nr, int nt, rng *r) {
    const char *tn = tl_type_info(t)->name;
    const tl_type at = tl_type_info((uint32_t)t)->vec_dot_type; /* Q8_0; IQ4_XS: Q8_K */
    const size_t wb = tl_row_size(t, n), pb = tl_r8_row_bytes(t, n), ab = tl_row_size(at, n);
    const size_t gb = tl_r8_act_row_size(n);
    const int64_t nb = n / 32, prow = tl_r8_rows(nr);
    uint8_t *w = malloc(wb * (size_t)nr), *wp = malloc(pb * (size_t)prow);
    uint8_t *a = malloc(ab * (size_t)nt), *ga = malloc(gb * (size_t)nt);
    float *x = malloc((size_t)(n * nt) * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
    const size_t ys = (size_t)nr + 3;
    float *y = malloc(sizeof(float) * ys * (size_t)nt), *yr = malloc(sizeof(float) * ys * (size_t)nt);
    CHECK(w && wp && a && ga && x && wf && y && yr, "alloc");
    if (w && wp && a && ga && x && wf && y && yr) {
        for (int i = 0; i < nr; i++) make_weights(t, w + (size_t)i * wb, n, r);
        CHECK(tl_r8_pack(t, w, wp, nr, n) == 0, "r8 pack %s", tn);
        for (int i = 0; i < nt; i++) {
            make_acts(x + i * n, n, r);
            tl_quantize_row_act(at, x + i * n, a + (size_t)i * ab, n);
            tl_r8_act_make(ref->quantize[TL_Q8_1], x + i * n, ga + (size_t)i * gb, n);
        }
        CHECK(same_as_ref(k, ref, t, n, wp, pb, nr, ga, gb, nt, y, yr, ys), "%s r8 %s n=%lld %dx%d: not the reference's bits",
              k->name, tn, (long long)n, nr, nt);
        int bad = 0, bad_exact = 0;
        for (int ti = 0; ti < nt; ti++) {
            const uint8_t *gr = ga + (size_t)ti * gb;
            const int8_t *q = (const int8_t *)gr;
            const float *ad = (const float *)(const void *)(gr + n);
            for (int ri = 0; ri < nr; ri++) {
                const uint8_t *row = w + (size_t)ri * wb;
                tl_dequantize_row(t, row, wf, n);
                double want = 0, mag = 0, qerr = 0; /* qerr: Q8_K's per-256 activation rounding against Q8_1's */
                const float *xt = x + ti * n;
                for (int64_t e = 0; e < n; e++) {
                    const double p = (double)wf[e] * q[e] * ad[e / 32];
                    want += p;
                    mag += fabs(p);
                }
                if (at == TL_Q8_K)
                    for (int64_t e0 = 0; e0 < n; e0 += QK_K) {
                        float amax = 0;
                        for (int e = 0; e < QK_K; e++) amax = fmaxf(amax, fabsf(xt[e0 + e]));
                        for (int e = 0; e < QK_K; e++) qerr += fabs((double)wf[e0 + e]) * (amax / 127.0 + ad[(e0 + e) / 32]);
                    }
                const double got = y[(size_t)ti * ys + ri];
                if (fabs(got - want) > (double)(nb + 4) * 0x1p-23 * mag + 1e-30) bad++;
                const double ex = ref->vec_dot[t](n, row, a + (size_t)ti * ab);
                if (fabs(got - ex) > (double)(2 * nb + 16) * 0x1p-23 * mag + qerr + 1e-30) bad_exact++;
            }
        }
        CHECK(!bad, "%s r8 %s n=%lld %dx%d: %d outputs outside the order's bound", k->name, tn, (long long)n, nr, nt, bad);
        CHECK(!bad_exact, "%s r8 %s n=%lld %dx%d: %d outputs too far from the exact mode's dot", k->name, tn,
              (long long)n, nr, nt, bad_exact);
    }
    free(w), free(wp), free(a), free(ga), free(x), free(wf), free(y), free(yr);
}

/* Q4_K and Q5_K in the r8k layout: the level's tiles bitwise the scalar reference's;
 * the reference within its order's bound of a double sum of the same integer
 * dots and scales (one rounding of the integer sums to float, two fmas per
 * superblock) and close to the exact mode's dot. */
static void check_r8k_case(const tl_kernels *k, const tl_kernels *ref, tl_type t, int64_t n, int nr, int nt, rng *r) {
    const char *tn = tl_type_info(t)->name;
    const size_t wb = tl_row_size(t, n), ab = tl_row_size(TL_Q8_K, n), pb = tl_r8k_row_bytes(t, n);
    const size_t bb = tl_row_size(t, QK_K);
    const int64_t nb = n / QK_K, prow = tl_r8_rows(nr);
    uint8_t *w = malloc(wb * (size_t)nr), *wp = malloc(pb * (size_t)prow), *a = malloc(ab * (size_t)nt);
    float *x = malloc((size_t)n * sizeof(float));
    const size_t ys = (size_t)nr + 3;
    float *y = malloc(sizeof(float) * ys * (size_t)nt), *yr = malloc(sizeof(float) * ys * (size_t)nt);
    CHECK(w && wp && a && x && y && yr, "alloc");
    if (w && wp && a && x && y && yr) {
        for (int i = 0; i < nr; i++) make_weights(t, w + (size_t)i * wb, n, r);
        CHECK(tl_r8k_pack(t, w, wp, nr, n) == 0, "r8k pack");
        for (int i = 0; i < nt; i++) {
            make_acts(x, n, r);
            tl_quantize_row_act(TL_Q8_K, x, a + (size_t)i * ab, n);
        }
        CHECK(same_as_ref(k, ref, t, n, wp, pb, nr, a, ab, nt, y, yr, ys), "%s r8k %s n=%lld %dx%d: not the reference's bits",
              k->name, tn, (long long)n, nr, nt);
        int bad = 0, bad_exact = 0;
        for (int ti = 0; ti < nt; ti++) {
            const block_q8_K *q8 = (const block_q8_K *)(const void *)(a + (size_t)ti * ab);
            for (int ri = 0; ri < nr; ri++) {
                double want = 0, mag = 0, amag = 0;
                for (int64_t b = 0; b < nb; b++) {
                    /* both formats: d, dmin, scales[12]; Q5_K then qh[32]; then qs[128] */
                    const uint8_t *blk = w + (size_t)ri * wb + (size_t)b * bb, *sc12 = blk + 4;
                    const uint8_t *qh = t == TL_Q5_K ? blk + 16 : NULL, *qs = blk + (qh ? 48 : 16);
                    uint16_t hd, hm;
                    memcpy(&hd, blk, 2);
                    memcpy(&hm, blk + 2, 2);
                    double isum = 0, imin = 0, iabs = 0;
                    for (int j = 0; j < 8; j++) {
                        uint8_t sc, mn;
                        scale_min_k4(j, sc12, &sc, &mn);
                        double dot = 0, dabs = 0;
                        for (int l = 0; l < 32; l++) {
                            const uint8_t byte = qs[32 * (j / 2) + l];
                            const int u = (j & 1 ? byte >> 4 : byte & 15) | (qh ? ((qh[l] >> j) & 1) << 4 : 0);
                            dot += u * q8[b].qs[32 * j + l];
                            dabs += fabs((double)u * q8[b].qs[32 * j + l]);
                        }
                        isum += sc * dot;
                        iabs += sc * dabs;
                        imin += mn * (double)(q8[b].bsums[2 * j] + q8[b].bsums[2 * j + 1]);
                    }
                    const double d = tl_fp16_to_fp32(hd) * q8[b].d, dm = tl_fp16_to_fp32(hm) * q8[b].d;
                    want += isum * d - imin * dm;
                    mag += fabs(isum * d) + fabs(imin * dm);
                    amag += iabs * fabs(d) + fabs(imin * dm);
                }
                const double got = y[(size_t)ti * ys + ri];
                if (fabs(got - want) > (double)(2 * nb + 4) * 0x1p-24 * mag + 1e-30) bad++;
                const double ex = k->vec_dot[t](n, w + (size_t)ri * wb, a + (size_t)ti * ab);
                if (fabs(got - ex) > (double)(2 * nb + 4) * 0x1p-24 * mag + (double)(nb + 16) * 0x1p-24 * amag + 1e-30)
                    bad_exact++;
            }
        }
        CHECK(!bad, "%s r8k %s n=%lld %dx%d: %d outputs outside the order's bound", k->name, tn, (long long)n, nr, nt,
              bad);
        CHECK(!bad_exact, "%s r8k %s n=%lld %dx%d: %d outputs too far from the exact mode's dot", k->name, tn,
              (long long)n, nr, nt, bad_exact);
    }
    free(w), free(wp), free(a), free(x), free(y), free(yr);
}

/* Q6_K in the r8 layout: bitwise the scalar reference's; the reference within
 * its order's bound of a double sum of the dequantized products. */
static void check_r8q6_case(const tl_kernels *k, const tl_kernels *ref, int64_t n, int nr, int nt, rng *r) {
    const tl_type t = TL_Q6_K;
    const size_t wb = tl_row_size(t, n), ab = tl_row_size(TL_Q8_K, n), pb = tl_r8k_row_bytes(t, n);
    const int64_t prow = tl_r8_rows(nr);
    uint8_t *w = malloc(wb * (size_t)nr), *wp = malloc(pb * (size_t)prow), *a = malloc(ab * (size_t)nt);
    float *x = malloc((size_t)n * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
    const size_t ys = (size_t)nr + 3;
    float *y = malloc(sizeof(float) * ys * (size_t)nt), *yr = malloc(sizeof(float) * ys * (size_t)nt);
    CHECK(w && wp && a && x && wf && y && yr, "alloc");
    if (w && wp && a && x && wf && y && yr) {
        for (int i = 0; i < nr; i++) make_weights(t, w + (size_t)i * wb, n, r);
        CHECK(tl_r8q6_pack(t, w, wp, nr, n) == 0, "r8 pack Q6_K");
        for (int i = 0; i < nt; i++) {
            make_acts(x, n, r);
            tl_quantize_row_act(TL_Q8_K, x, a + (size_t)i * ab, n);
        }
        CHECK(same_as_ref(k, ref, t, n, wp, pb, nr, a, ab, nt, y, yr, ys), "%s r8 Q6_K n=%lld %dx%d: not the reference's bits",
              k->name, (long long)n, nr, nt);
        /* the prompts' path through the unpacked copy (kernels.h unpack, wgemm): the reference's bits too */
        uint8_t *u = k->unpack[t] ? malloc(tl_r8q6w_bytes(nr, n)) : NULL;
        if (u) {
            float *yu = malloc(sizeof(float) * ys * (size_t)nt);
            CHECK(yu != NULL, "alloc");
            if (yu) {
                for (size_t i = 0; i < ys * (size_t)nt; i++) yu[i] = -7.0f;
                k->unpack[t](wp, pb, nr, n, u);
                k->wgemm[t](n, u, 0, nr, a, ab, nt, yu, ys);
                CHECK(memcmp(yu, yr, sizeof(float) * ys * (size_t)nt) == 0,
                      "%s r8 Q6_K unpacked n=%lld %dx%d: not the reference's bits", k->name, (long long)n, nr, nt);
            }
            free(yu);
        }
        free(u);
        int bad = 0;
        for (int ti = 0; ti < nt; ti++) {
            const block_q8_K *q8 = (const block_q8_K *)(const void *)(a + (size_t)ti * ab);
            for (int ri = 0; ri < nr; ri++) {
                tl_dequantize_row(t, w + (size_t)ri * wb, wf, n);
                double want = 0, mag = 0;
                for (int64_t e = 0; e < n; e++) {
                    const double p = (double)wf[e] * q8[e / QK_K].qs[e % QK_K] * q8[e / QK_K].d;
                    want += p;
                    mag += fabs(p);
                }
                const double got = y[(size_t)ti * ys + ri];
                /* dequantized weights are d*sc*q rounded once; the order rounds the
                 * integer sum once and the fma chain once per superblock */
                if (fabs(got - want) > (double)(n / QK_K + 8) * 0x1p-23 * mag + 1e-30) bad++;
            }
        }
        CHECK(!bad, "%s r8 Q6_K n=%lld %dx%d: %d outputs outside the bound", k->name, (long long)n, nr, nt, bad);
    }
    free(w), free(wp), free(a), free(x), free(wf), free(y), free(yr);
}

/* F16 and BF16 in the r8h layout: the level's tiles bitwise the scalar
 * reference's; the reference (one fma chain per row) within n roundings of a
 * double sum of the same products (for BF16, of the bf16-rounded activations).
 * tiny: BF16 weights and activations scaled so that the partial sums fall
 * under FLT_MIN, where the chain flushes them (vdpbf16ps's FTZ). */
static void check_r8h_case(const tl_kernels *k, const tl_kernels *ref, tl_type t, int64_t n, int nr, int nt, int tiny,
                           rng *r) {
    const int64_t prow = tl_r8_rows(nr);
    const size_t wb = (size_t)n * 2, pb = tl_r8h_row_bytes(t, n), ab = tl_r8h_act_row_size(t, n), ys = (size_t)nr + 3;
    uint16_t *w = malloc(wb * (size_t)nr), *wp = malloc(pb * (size_t)prow);
    float *x = malloc(sizeof(float) * (size_t)n * (size_t)nt), *y = malloc(sizeof(float) * ys * (size_t)nt);
    uint8_t *a = malloc(ab * (size_t)nt);
    float *yr = malloc(sizeof(float) * ys * (size_t)nt);
    CHECK(w && wp && a && x && y && yr, "alloc");
    if (w && wp && a && x && y && yr) {
        const float ws = tiny ? 0x1p-66f : 2.0f, xs = tiny ? 0x1p-62f : 1.0f;
        for (size_t i = 0; i < (size_t)nr * (size_t)n; i++) {
            const float v = frand(r) * ws;
            w[i] = t == TL_F16 ? tl_fp32_to_fp16(v) : tl_fp32_to_bf16(v);
        }
        for (size_t i = 0; i < (size_t)nt * (size_t)n; i++) x[i] = frand(r) * xs;
        if (tiny && nt > 1) /* token 0: a few ordinary products among the tiny ones */
            for (int i = 0; i < 3; i++) x[rnd(r) % (uint64_t)n] = 0x1p60f;
        for (int ti = 0; ti < nt; ti++) tl_r8h_act_make(t, x + (size_t)ti * (size_t)n, a + (size_t)ti * ab, n);
        CHECK(tl_r8h_pack(t, w, wp, nr, n) == 0, "r8h pack");
        CHECK(same_as_ref(k, ref, t, n, wp, pb, nr, a, ab, nt, y, yr, ys), "%s r8h %s n=%lld %dx%d%s: not the reference's bits",
              k->name, tl_type_info(t)->name, (long long)n, nr, nt, tiny ? " tiny" : "");
        int bad = 0, flushed = 0;
        for (int ti = 0; ti < nt; ti++)
            for (int ri = 0; ri < nr; ri++) {
                double want = 0, mag = 0;
                for (int64_t j = 0; j < n; j++) {
                    const uint16_t h = w[(size_t)ri * (size_t)n + (size_t)j];
                    const float xv = x[(size_t)ti * (size_t)n + (size_t)j];
                    const double p = t == TL_F16 ? (double)tl_fp16_to_fp32(h) * xv
                                                 : (double)tl_bf16_to_fp32(h) * tl_bf16_to_fp32(tl_fp32_to_bf16(xv));
                    want += p;
                    mag += fabs(p);
                }
                const float got = yr[(size_t)ti * ys + ri];
                if (tiny) { /* every partial sum under FLT_MIN is flushed: only the big products remain */
                    flushed += got == 0.0f && want != 0.0;
                    if (got != 0.0f && fabs(got - want) > (double)n * 0x1p-24 * mag + 0x1p-120) bad++;
                } else if (fabs(got - want) > (double)n * 0x1p-24 * mag + 1e-30) {
                    bad++;
                }
            }
        CHECK(!bad, "%s r8h %s n=%lld %dx%d%s: %d outputs outside the chain's bound", k->name, tl_type_info(t)->name,
              (long long)n, nr, nt, tiny ? " tiny" : "", bad);
        if (tiny) CHECK(flushed > 0, "%s r8h BF16 tiny: no output flushed", k->name);
    }
    free(w), free(wp), free(a), free(x), free(y), free(yr);
}

/* BF16's flush to zero at its edges (cpu/r8.c): one token x = (0, 2^-63, 0,
 * 2^-75), so a row's products are w1 * 2^-63, then w3 * 2^-75 (each pair's even
 * product is 1 * 0, which turns a -0 into +0); the values
 * are what vdpbf16ps gives (measured on an AMD EPYC Zen 4), and every level
 * must give them bitwise. */
static void check_r8h_bf16_edges(const tl_kernels *k, const tl_kernels *ref) {
    static const float w13[8][2] = {
        {0x1p-63f, -0x1p-75f},  /* FLT_MIN - 2^-150: fmaf rounds up to FLT_MIN, still flushed */
        {0x1p-63f, -0x1p-76f},  /* FLT_MIN - 2^-151: rounds to FLT_MIN at 24 bits, kept */
        {-0x1p-63f, 0x1p-75f},  /* the negative of the first: -0, then + 1 * 0 gives +0 */
        {0x1p-64f, 0x1p-75f},   /* 2^-127 flushed, then 2^-150 alone: +0 */
        {0x1.8p-63f, -0x1p-75f}, /* 1.5 FLT_MIN - 2^-150: normal */
        {0x1p-63f, 0x1p-75f},   /* FLT_MIN + 2^-150: FLT_MIN */
        {1.0f, 1.0f},           /* ordinary */
        {0.0f, -0x1p-60f},      /* -2^-135 alone: -0, then +0 */
    };
    static const float want[8] = {0.0f, 0x1p-126f, 0.0f, 0.0f, 0, 0x1p-126f, 0, 0.0f};
    const int64_t n = 4;
    uint16_t w[8 * 4], wp[8 * 4], a[4];
    const float x[4] = {0.0f, 0x1p-63f, 0.0f, 0x1p-75f};
    for (int r = 0; r < 8; r++) {
        w[r * 4 + 0] = w[r * 4 + 2] = tl_fp32_to_bf16(1.0f);
        w[r * 4 + 1] = tl_fp32_to_bf16(w13[r][0]);
        w[r * 4 + 3] = tl_fp32_to_bf16(w13[r][1]);
    }
    CHECK(tl_r8h_pack(TL_BF16, w, wp, 8, n) == 0, "r8h pack");
    tl_r8h_act_make(TL_BF16, x, a, n);
    float y[8], yr[8];
    k->gemm[TL_BF16](n, wp, tl_r8h_row_bytes(TL_BF16, n), 8, a, sizeof a, 1, y, 8);
    ref->gemm[TL_BF16](n, wp, tl_r8h_row_bytes(TL_BF16, n), 8, a, sizeof a, 1, yr, 8);
    for (int r = 0; r < 8; r++) {
        CHECK(memcmp(&y[r], &yr[r], sizeof(float)) == 0, "%s BF16 edge row %d: %a, the reference %a", k->name, r,
              (double)y[r], (double)yr[r]);
        if (r != 4 && r != 6)
            CHECK(memcmp(&yr[r], &want[r], sizeof(float)) == 0, "BF16 edge row %d: reference %a, want %a", r,
                  (double)yr[r], (double)want[r]);
    }
    /* infinities and NaN go through the chain as through the instruction:
     * x = (1, inf, 1, -inf); weights (w0, w1, w2, w3) per row */
    static const float wi[8][4] = {{1, 0, 1, 1},  /* inf * 0: NaN */
                                   {1, 1, 1, 0},  /* inf, then -inf * 0: NaN */
                                   {1, 1, 1, 1},  /* inf - inf: NaN */
                                   {2, 1, 3, 0},  /* inf, NaN from -inf * 0 */
                                   {1, 0, 1, 0},  /* NaN */
                                   {0, 1, 0, -1}, /* inf + inf */
                                   {5, -1, 0, -1}, /* -inf, then + inf: NaN */
                                   {1, 1, 0, 1}}; /* inf, then -inf: NaN */
    const float xi[4] = {1.0f, INFINITY, 1.0f, -INFINITY};
    for (int r = 0; r < 8; r++)
        for (int j = 0; j < 4; j++) w[r * 4 + j] = tl_fp32_to_bf16(wi[r][j]);
    CHECK(tl_r8h_pack(TL_BF16, w, wp, 8, n) == 0, "r8h pack");
    tl_r8h_act_make(TL_BF16, xi, a, n);
    k->gemm[TL_BF16](n, wp, tl_r8h_row_bytes(TL_BF16, n), 8, a, sizeof a, 1, y, 8);
    ref->gemm[TL_BF16](n, wp, tl_r8h_row_bytes(TL_BF16, n), 8, a, sizeof a, 1, yr, 8);
    for (int r = 0; r < 8; r++) {
        double want_r = 0; /* the same chain in double: inf and NaN propagate alike */
        for (int p = 0; p < 2; p++) {
            want_r += (double)wi[r][2 * p + 1] * xi[2 * p + 1];
            want_r += (double)wi[r][2 * p] * xi[2 * p];
        }
        CHECK(isnan(y[r]) == isnan(yr[r]) && (isnan(y[r]) || memcmp(&y[r], &yr[r], sizeof(float)) == 0),
              "%s BF16 inf/NaN row %d: %a, the reference %a", k->name, r, (double)y[r], (double)yr[r]);
        CHECK(isnan(want_r) ? isnan(yr[r]) : (double)yr[r] == want_r, "BF16 inf/NaN row %d: reference %a, want %a",
              r, (double)yr[r], want_r);
    }
}

/* The AMX level (cpu/kern_amx.c): the Q4_K/Q5_K/Q6_K gemm on activation rows made
 * as the forward makes them (tl_kern_act_make: with the quants' aligned copy),
 * bitwise the scalar reference's for whole 16-token tiles, short tiles, tails
 * left to the AVX-512 tile, few tokens, odd and padded groups; on rows at a
 * cache line and 4 bytes past one. */
static void check_amx_case(const tl_kernels *k, const tl_kernels *ref, tl_type t, int64_t n, int nr, int nt, int skew,
                           rng *r) {
    const size_t wb = tl_row_size(t, n), pb = tl_kern_row_bytes(k, t, n), as = tl_kern_act_row_size(k, t, n) + (size_t)skew;
    const int64_t prow = tl_kern_packed_rows(k, t, nr);
    uint8_t *w = malloc(wb * (size_t)nr), *wp = malloc(pb * (size_t)prow), *ab = aligned_alloc(64, (as * (size_t)nt + 127) & ~(size_t)63);
    float *x = malloc((size_t)n * sizeof(float));
    const size_t ys = (size_t)nr + 3;
    float *y = malloc(sizeof(float) * ys * (size_t)nt), *yr = malloc(sizeof(float) * ys * (size_t)nt);
    CHECK(w && wp && ab && x && y && yr, "alloc");
    if (w && wp && ab && x && y && yr) {
        uint8_t *a = ab + skew;
        for (int i = 0; i < nr; i++) make_weights(t, w + (size_t)i * wb, n, r);
        CHECK(tl_kern_pack(k, t, w, wp, nr, n) == 0, "amx pack");
        for (int i = 0; i < nt; i++) {
            make_acts(x, n, r);
            tl_kern_act_make(k, t, x, a + (size_t)i * as, n);
        }
        CHECK(same_as_ref(k, ref, t, n, wp, pb, nr, a, as, nt, y, yr, ys), "amx %s n=%lld %dx%d skew %d: not the reference's bits",
              tl_type_info(t)->name, (long long)n, nr, nt, skew);
    }
    free(w);
    free(wp);
    free(ab);
    free(x);
    free(y);
    free(yr);
}

static void check_amx(rng *r) {
    tl_kernels k, ref;
    tl_kernels_init(&k, TL_CPU_AMX, TL_NUM_FAST);
    tl_kernels_init(&ref, TL_CPU_SCALAR, TL_NUM_FAST);
    CHECK(!strcmp(k.name, "amx"), "the AMX table is %s", k.name);
    static const int shapes[][2] = {{16, 16}, {32, 16}, {8, 16}, {24, 17}, {13, 32}, {29, 21}, {32, 47},
                                    {16, 10}, {32, 12}, {40, 64}, {32, 9}, {32, 200}, {16, 1}, {32, 3}};
    static const int64_t ns[] = {256, 1024, 2048};
    static const tl_type types[] = {TL_Q4_K, TL_Q5_K, TL_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < sizeof ns / sizeof *ns; si++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
                check_amx_case(&k, &ref, types[ti], ns[si], shapes[sh][0], shapes[sh][1], 4 * (int)(sh % 2), r);
}

static void check_r8(const tl_kernels *k, const tl_kernels *ref, rng *r) {
    check_r8h_bf16_edges(k, ref);
    static const int hshapes[][2] = {{8, 1}, {40, 1}, {13, 1}, {16, 4}, {24, 3}, {3, 5}, {72, 6}, {56, 2}};
    for (size_t sh = 0; sh < sizeof hshapes / sizeof *hshapes; sh++)
        for (int bf = 0; bf < 2; bf++) {
            check_r8h_case(k, ref, bf ? TL_BF16 : TL_F16, 64, hshapes[sh][0], hshapes[sh][1], 0, r);
            check_r8h_case(k, ref, bf ? TL_BF16 : TL_F16, 200, hshapes[sh][0], hshapes[sh][1], 0, r);
            check_r8h_case(k, ref, bf ? TL_BF16 : TL_F16, 75, hshapes[sh][0], hshapes[sh][1], 0, r); /* odd */
            if (bf) check_r8h_case(k, ref, TL_BF16, 96, hshapes[sh][0], hshapes[sh][1], 1, r);
        }
    static const int qshapes[][2] = {{8, 1}, {13, 1}, {8, 2}, {16, 4}, {3, 5}, {13, 3}, {24, 3}, {21, 6}, {32, 2}, {24, 1}, {40, 1},
                                     {32, 17}, {24, 18}, {8, 16}};
    for (size_t sh = 0; sh < sizeof qshapes / sizeof *qshapes; sh++) {
        check_r8q6_case(k, ref, 256, qshapes[sh][0], qshapes[sh][1], r);
        check_r8q6_case(k, ref, 2048, qshapes[sh][0], qshapes[sh][1], r);
    }
    static const int kshapes[][2] = {{8, 1}, {16, 1}, {13, 1}, {24, 1}, {8, 2}, {16, 4}, {3, 5}, {17, 7}};
    static const int64_t kns[] = {256, 1024, 2048};
    for (size_t si = 0; si < sizeof kns / sizeof *kns; si++)
        for (size_t sh = 0; sh < sizeof kshapes / sizeof *kshapes; sh++)
            for (int q5 = 0; q5 < 2; q5++)
                check_r8k_case(k, ref, q5 ? TL_Q5_K : TL_Q4_K, kns[si], kshapes[sh][0], kshapes[sh][1], r);
    static const int shapes[][2] = {{8, 1}, {16, 1}, {13, 1}, {40, 1}, {8, 2}, {16, 4}, {24, 3},
                                    {3, 5}, {17, 7}, {32, 9}, {16, 12}, {56, 2}, {72, 5}};
    static const int64_t ns[] = {32, 96, 576, 640, 2048};
    for (size_t ti = 0; ti < sizeof r8types / sizeof *r8types; ti++)
        for (size_t si = 0; si < sizeof ns / sizeof *ns; si++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
                check_r8_case(k, ref, r8types[ti], ns[si], shapes[sh][0], shapes[sh][1], r);
    static const int64_t lns[] = {256, 768, 2048};
    for (size_t ti = 0; ti < sizeof r8luts / sizeof *r8luts; ti++)
        for (size_t si = 0; si < sizeof lns / sizeof *lns; si++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
                check_r8lut_case(k, ref, r8luts[ti], r8luts[ti] == TL_IQ4_XS ? lns[si] : lns[si] - 64 * (int64_t)si,
                                 shapes[sh][0], shapes[sh][1], r);
}

/* dot_f16_x4 (four keys against one query) must equal dot_f16 key by key, bitwise. */
static void check_dot_f16_x4(const tl_kernels *k, rng *r) {
    if (!k->dot_f16_x4) return;
    static const int64_t ns[] = {1, 7, 8, 31, 64, 100, 128, 256};
    const size_t xs = 300; /* row stride wider than any n */
    uint16_t *x = malloc(4 * xs * 2), *y = malloc(xs * 2);
    CHECK(x && y, "alloc");
    for (size_t i = 0; x && y && i < sizeof ns / sizeof *ns; i++) {
        const int64_t n = ns[i];
        for (size_t j = 0; j < 4 * xs; j++) x[j] = tl_fp32_to_fp16(frand(r));
        for (size_t j = 0; j < xs; j++) y[j] = tl_fp32_to_fp16(frand(r));
        float o[4];
        k->dot_f16_x4(n, x, xs, y, o);
        for (int q = 0; q < 4; q++) {
            const float one = k->dot_f16(n, x + (size_t)q * xs, y);
            CHECK(memcmp(&one, &o[q], sizeof one) == 0, "%s dot_f16_x4 n=%lld row %d: %.9g vs %.9g", k->name,
                  (long long)n, q, o[q], one);
        }
    }
    free(x);
    free(y);
}

/* tile_f32 (F32 rows x F32 tokens, a router over a prompt) must equal
 * vec_dot[TL_F32] element by element, bitwise, for every tile edge. */
static void check_tile_f32(const tl_kernels *k, rng *r) {
    if (!k->tile_f32) return;
    static const int64_t ns[] = {8, 13, 64, 2048};
    static const int shapes[][2] = {{1, 1}, {2, 4}, {3, 5}, {7, 9}};
    const size_t ws = 2056, as = 2064; /* strides wider than any n */
    float *w = malloc(7 * ws * sizeof *w), *a = malloc(9 * as * sizeof *a), *y = malloc(9 * 7 * sizeof *y);
    CHECK(w && a && y, "alloc");
    for (size_t i = 0; w && a && y && i < sizeof ns / sizeof *ns; i++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
            const int nr = shapes[sh][0], nt = shapes[sh][1];
            for (size_t j = 0; j < 7 * ws; j++) w[j] = frand(r);
            for (size_t j = 0; j < 9 * as; j++) a[j] = frand(r);
            k->tile_f32(ns[i], w, ws, nr, a, as, nt, y, 7);
            int bad = 0;
            for (int t = 0; t < nt; t++)
                for (int q = 0; q < nr; q++) {
                    const float one = k->vec_dot[TL_F32](ns[i], w + (size_t)q * ws, a + (size_t)t * as);
                    bad += memcmp(&one, &y[(size_t)t * 7 + q], sizeof one) != 0;
                }
            CHECK(bad == 0, "%s tile_f32 n=%lld %dx%d: %d outputs differ from vec_dot", k->name, (long long)ns[i], nr,
                  nt, bad);
        }
    free(w);
    free(a);
    free(y);
}

static void check_dot_f16(const tl_kernels *k, rng *r) {
    static const int64_t ns[] = {1, 7, 8, 31, 64, 100, 128, 256, 4099};
    uint16_t *x = malloc(4099 * 2), *y = malloc(4099 * 2);
    CHECK(x && y && k->dot_f16, "%s: alloc / dot_f16", k->name);
    for (size_t i = 0; x && y && k->dot_f16 && i < sizeof ns / sizeof *ns; i++) {
        const int64_t n = ns[i];
        double want = 0, mag = 0;
        for (int64_t j = 0; j < n; j++) {
            x[j] = tl_fp32_to_fp16(frand(r));
            y[j] = tl_fp32_to_fp16(frand(r));
            const double p = (double)tl_fp16_to_fp32(x[j]) * tl_fp16_to_fp32(y[j]);
            want += p;
            mag += fabs(p);
        }
        const float got = k->dot_f16(n, x, y), ref = tl_vec_dot_ref(TL_F16, n, x, y);
        CHECK(memcmp(&got, &ref, sizeof got) == 0, "%s dot_f16 n=%lld: %.9g vs ref %.9g, not bit-identical", k->name,
              (long long)n, got, ref);
        CHECK(fabs(got - want) <= 1e-5 * mag + 1e-30, "%s dot_f16 n=%lld: %.9g vs %.9g", k->name, (long long)n, got,
              want);
    }
    free(x);
    free(y);
}

/* GB/s of weight bytes: one 4096 row over and over (in cache), and each row of
 * a 4096x4096 matrix once (out of cache for the larger formats). */
static void bench_type(const tl_kernels *k, const tl_kernels *ref, tl_type t, rng *r) {
    const int64_t n = 4096, rows = 4096;
    const tl_type at = tl_type_info((uint32_t)t)->vec_dot_type;
    const size_t wb = tl_row_size(t, n);
    uint8_t *w = malloc(wb * (size_t)rows), *a = malloc(tl_row_size(at, n));
    float *x = malloc((size_t)n * sizeof(float));
    if (!w || !a || !x) {
        CHECK(0, "bench alloc");
    } else {
        for (int64_t i = 0; i < rows; i++) make_weights(t, w + (size_t)i * wb, n, r);
        make_acts(x, n, r);
        tl_quantize_row_act(at, x, a, n);
        double gb[2][2];
        const tl_kernels *ks[2] = {k, ref};
        volatile float sink = 0;
        /* best of 3 for SIMD (the machine may be shared); the scalar reference is
         * compute-bound, so a shorter single run of it says enough */
        for (int v = 0; v < 2; v++)
            for (int rep = 0; rep < (v ? 1 : 3); rep++) {
                const int64_t reps = v ? 16 : 256, nrows = v ? 256 : rows;
                double t0 = tl_now();
                for (int64_t i = 0; i < reps; i++) sink += ks[v]->vec_dot[t](n, w, a);
                const double g0 = (double)wb * reps / (tl_now() - t0) / 1e9;
                t0 = tl_now();
                for (int64_t i = 0; i < nrows; i++) sink += ks[v]->vec_dot[t](n, w + (size_t)i * wb, a);
                const double g1 = (double)wb * nrows / (tl_now() - t0) / 1e9;
                gb[v][0] = rep == 0 || g0 > gb[v][0] ? g0 : gb[v][0];
                gb[v][1] = rep == 0 || g1 > gb[v][1] ? g1 : gb[v][1];
            }
        (void)sink;
        printf("  %-12s %-5s in-cache %7.2f GB/s (ref %6.2f, x%5.1f)  4096x4096 %7.2f GB/s (ref %6.2f)\n", k->name,
               tl_type_info(t)->name, gb[0][0], gb[1][0], gb[0][0] / gb[1][0], gb[0][1], gb[1][1]);
    }
    free(w);
    free(a);
    free(x);
}

/* The same over quantized caches (K transposed per block as the fast path
 * keeps it, V rows): a level's bits are the reference's. */
static void check_attn_q(const tl_kernels *k, rng *r) {
    if (!k->math.attn_online) return;
    static const int cases[][7] = {{64, 3, 1, 700, 0, TL_Q8_0, TL_Q8_0},  {64, 3, 2, 300, 0, TL_Q4_0, TL_Q4_0},
                                   {128, 4, 16, 90, 0, TL_Q8_0, TL_F16},   {96, 5, 1, 17, 0, TL_F16, TL_Q8_0},
                                   {64, 4, 64, 200, 0, TL_Q8_0, TL_Q8_0},  {256, 2, 3, 400, 100, TL_Q4_0, TL_Q8_0},
                                   /* runs of whole blocks with a Q8_0 K (the multi-block path): 1 to 8 rows, a window */
                                   {64, 3, 33, 401, 0, TL_Q8_0, TL_Q8_0},  {256, 2, 9, 333, 0, TL_Q8_0, TL_Q8_0},
                                   {96, 5, 7, 47, 20, TL_Q8_0, TL_F16},    {64, 1, 40, 500, 0, TL_Q8_0, TL_Q8_0},
                                   {128, 7, 5, 260, 0, TL_Q8_0, TL_Q4_0},
                                   /* the multi-block path with a Q4_0 K (blocks two at a time, and a last odd one) */
                                   {64, 3, 33, 401, 0, TL_Q4_0, TL_Q4_0},  {96, 2, 20, 250, 0, TL_Q4_0, TL_Q8_0}};
    enum { BS = 16, NB = 48 }; /* positions up to 767 */
    tl_mathfn m;
    tl_mathfn_bind(&m, 0, 1);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int hd = cases[ci][0], G = cases[ci][1], T = cases[ci][2], pos0 = cases[ci][3], swa = cases[ci][4];
        const tl_kv_format *kf = tl_kv_format_of((tl_type)cases[ci][5]), *vf = tl_kv_format_of((tl_type)cases[ci][6]);
        const int kvd = 2 * hd;
        const size_t krb = kf->row_bytes(kvd), vrb = vf->row_bytes(kvd);
        uint8_t *kc = malloc((size_t)NB * BS * krb), *vc = malloc((size_t)NB * BS * vrb);
        float *x = malloc((size_t)kvd * 4), *q = malloc((size_t)T * G * hd * 4);
        float *o1 = malloc((size_t)T * G * hd * 4), *o2 = malloc((size_t)T * G * hd * 4);
        float *scr = malloc(tl_attn_scratch(hd, G, BS, T) * 4);
        int32_t blk[NB];
        const int ok = kc && vc && x && q && o1 && o2 && scr;
        CHECK(ok, "alloc");
        if (ok) {
            for (int i = 0; i < NB; i++) blk[i] = (i * 17 + 3) % NB;
            for (int p = 0; p < NB * BS; p++) {
                for (int i = 0; i < kvd; i++) x[i] = 2.0f * frand(r);
                kf->store_tr(&m, x, kc + (size_t)(p / BS) * BS * krb, p % BS, BS, kvd);
                for (int i = 0; i < kvd; i++) x[i] = frand(r);
                vf->store(&m, x, vc + (size_t)p * vrb, kvd);
            }
            for (int i = 0; i < T * G * hd; i++) q[i] = 3.0f * frand(r);
            /* every other case with scores far apart: tiny weights, the
             * quantized V's thresholds (mathfn.h) */
            tl_attn_rows a = {.hd = hd, .G = G, .bs = BS, .T = T, .q = q, .q_stride = (size_t)hd,
                              .q_tok = (size_t)G * hd, .scale = ci % 2 ? 40.0f : 0.125f, .k = kc + kf->row_bytes(hd) * BS,
                              .v = vc + vf->row_bytes(hd), .k_stride = krb, .v_stride = vrb, .k_fmt = kf->attn_fmt,
                              .v_fmt = vf->attn_fmt, .k_tr = 1, .blk = blk, .pos0 = pos0, .n_swa = swa, .out = o1,
                              .out_stride = (size_t)hd, .out_tok = (size_t)G * hd, .scratch = scr};
            tl_attn_online(&a, 0);
            a.out = o2;
            k->math.attn_online(&a);
            CHECK(memcmp(o1, o2, (size_t)T * G * hd * 4) == 0, "%s attention, %s K / %s V hd=%d G=%d T=%d pos0=%d "
                  "swa=%d: not the reference's bits", k->name, kf->name, vf->name, hd, G, T, pos0, swa);
        }
        free(kc), free(vc), free(x), free(q), free(o1), free(o2), free(scr);
    }
}

/* A level's fast attention (k->math.attn_online, where the level has its
 * own) against the scalar reference, bitwise: head widths with 64-, 16- and
 * 8-wide remainders, 1 to 7 query heads per KV head, sliding windows, blocks
 * out of order. */
static void check_attn(const tl_kernels *k, rng *r) {
    if (!k->math.attn_online) return;
    static const int cases[][5] = {{64, 3, 16, 0, 0},  {64, 3, 5, 37, 0},   {128, 4, 16, 100, 0}, {80, 2, 7, 20, 0},
                                   {72, 1, 3, 5, 0},   {64, 4, 16, 50, 20}, {256, 7, 2, 300, 0},  {96, 5, 1, 17, 0},
                                   /* runs of whole blocks (the multi-block path): 1 to 4 at once, 1 to 8 rows,
                                    * an 8-wide remainder, a window */
                                   {64, 3, 64, 500, 0}, {128, 2, 33, 401, 0}, {72, 3, 9, 333, 0}, {64, 4, 20, 450, 100},
                                   {64, 1, 1, 600, 0},  {80, 7, 5, 47, 0},    {64, 5, 3, 96, 0},   {160, 3, 2, 250, 0},
                                   /* one token (AVX-512 reads the f16 blocks as they are) */
                                   {72, 3, 1, 333, 0},  {80, 4, 1, 47, 0},    {64, 3, 1, 450, 100}, {128, 9, 1, 200, 0},
                                   {64, 3, 1, 0, 0},    {96, 2, 1, 15, 0},    {160, 1, 1, 16, 7}};
    enum { BS = 16, NB = 40 };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int hd = cases[ci][0], G = cases[ci][1], T = cases[ci][2], pos0 = cases[ci][3], swa = cases[ci][4];
        const int kvd = 2 * hd;
        uint16_t *kc = malloc((size_t)NB * BS * kvd * 2), *vc = malloc((size_t)NB * BS * kvd * 2);
        float *q = malloc((size_t)T * G * hd * 4), *o1 = malloc((size_t)T * G * hd * 4);
        float *o2 = malloc((size_t)T * G * hd * 4), *scr = malloc(tl_attn_scratch(hd, G, BS, T) * 4);
        int32_t blk[NB];
        CHECK(kc && vc && q && o1 && o2 && scr, "alloc");
        if (kc && vc && q && o1 && o2 && scr) {
            for (int i = 0; i < NB; i++) blk[i] = (i * 17 + 3) % NB;
            for (size_t i = 0; i < (size_t)NB * BS * kvd; i++) {
                kc[i] = tl_fp32_to_fp16(frand(r));
                vc[i] = tl_fp32_to_fp16(frand(r));
            }
            for (int i = 0; i < T * G * hd; i++) q[i] = 3.0f * frand(r);
            /* every other case with scores far apart: exp's underflow branch */
            tl_attn_rows a = {.hd = hd, .G = G, .bs = BS, .T = T, .q = q, .q_stride = (size_t)hd,
                              .q_tok = (size_t)G * hd, .scale = ci % 2 ? 40.0f : 0.125f, .k = kc + hd, .v = vc + hd,
                              .k_stride = (size_t)kvd * 2, .v_stride = (size_t)kvd * 2, .blk = blk, .pos0 = pos0, .n_swa = swa, .out = o1,
                              .out_stride = (size_t)hd, .out_tok = (size_t)G * hd, .scratch = scr};
            tl_attn_online(&a, 0);
            a.out = o2;
            k->math.attn_online(&a);
            CHECK(memcmp(o1, o2, (size_t)T * G * hd * 4) == 0, "%s attention hd=%d G=%d T=%d pos0=%d swa=%d scale=%g: "
                  "not the reference's bits", k->name, hd, G, T, pos0, swa, (double)a.scale);
            /* per-head sinks (gpt-oss), above and below the scores */
            float sk[16];
            for (int h = 0; h < 16; h++) sk[h] = 6.0f * frand(r) + (h % 2 ? 3.0f : -3.0f);
            if (G <= 16) {
                float *o3 = malloc((size_t)T * G * hd * 4);
                CHECK(o3 != NULL, "alloc");
                if (o3) {
                    a.sinks = sk;
                    tl_attn_online(&a, 0);
                    a.out = o3;
                    k->math.attn_online(&a);
                    /* (with scale 40 the scores dwarf the sinks: they may change nothing) */
                    CHECK(memcmp(o2, o3, (size_t)T * G * hd * 4) == 0 &&
                              (ci % 2 || memcmp(o2, o1, (size_t)T * G * hd * 4) != 0),
                          "%s attention with sinks hd=%d G=%d T=%d pos0=%d swa=%d: not the reference's bits", k->name, hd,
                          G, T, pos0, swa);
                    a.sinks = NULL, a.out = o2;
                    free(o3);
                }
            }
            /* the same keys kept transposed per block (the fast path's cache layout) */
            uint16_t *ktr = malloc((size_t)NB * BS * kvd * 2);
            CHECK(ktr != NULL, "alloc");
            if (ktr) {
                for (int b = 0; b < NB; b++)
                    for (int sl = 0; sl < BS; sl++)
                        for (int i = 0; i < kvd; i++)
                            ktr[((size_t)b * BS * kvd) + (size_t)i * BS + sl] = kc[((size_t)b * BS + sl) * kvd + i];
                a.k = ktr + (size_t)hd * BS;
                a.k_tr = 1;
                for (int lvl = 0; lvl < 2; lvl++) {
                    memset(o2, 0, (size_t)T * G * hd * 4);
                    if (lvl) k->math.attn_online(&a);
                    else tl_attn_online(&a, 0);
                    CHECK(memcmp(o1, o2, (size_t)T * G * hd * 4) == 0, "%s attention, K transposed (%s) hd=%d G=%d T=%d "
                          "pos0=%d: not the row layout's bits", k->name, lvl ? "level" : "scalar", hd, G, T, pos0);
                }
                /* one segment at a time (a decode step's keys split between
                 * threads): the state left unnormalised, the reference's bits */
                float *p1 = malloc((size_t)T * G * 2 * 4), *p2 = malloc((size_t)T * G * 2 * 4);
                CHECK(p1 && p2, "alloc");
                for (int sg = 0; p1 && p2 && sg <= (pos0 + T - 1) / TL_ATTN_SEG; sg++) {
                    a.seg = sg + 1;
                    a.out = o1, a.part = p1;
                    tl_attn_online(&a, 0);
                    a.out = o2, a.part = p2;
                    k->math.attn_online(&a);
                    CHECK(memcmp(o1, o2, (size_t)T * G * hd * 4) == 0 && memcmp(p1, p2, (size_t)T * G * 2 * 4) == 0,
                          "%s attention, segment %d alone hd=%d G=%d T=%d pos0=%d swa=%d: not the reference's bits",
                          k->name, sg, hd, G, T, pos0, swa);
                }
                a.seg = 0;
                free(p1), free(p2);
                free(ktr);
            }
        }
        free(kc), free(vc), free(q), free(o1), free(o2), free(scr);
    }
}

int main(void) {
    const tl_cpu_level top = tl_cpu_detect();
    printf("detected CPU level %d\n", (int)top);
    tl_kernels ref, rfast;
    tl_kernels_init(&ref, TL_CPU_SCALAR, TL_NUM_EXACT);
    tl_kernels_init(&rfast, TL_CPU_SCALAR, TL_NUM_FAST);
    /* the scalar reference against the math and the exact mode */
    rng r0 = {0x243F6A8885A308D3ULL};
    check_r8(&rfast, &rfast, &r0);
    rng r = {0x9E3779B97F4A7C15ULL};
    for (int level = TL_CPU_AVX2; level <= (int)top; level++) {
        /* this level's own kernels only, without the table's fallbacks */
        tl_kernels k;
        memset(&k, 0, sizeof k);
        if (level == TL_CPU_AMX) { /* what it adds: the K-quants' prompt tiles */
            check_amx(&r);
            continue;
        }
        if (level == TL_CPU_AVX512BF16) { /* what it adds to VNNI's: the BF16 gemm on vdpbf16ps */
            tl_kernels_fill_avx2(&k, TL_NUM_EXACT);
            tl_kernels_fill_avx512(&k, 1, TL_NUM_FAST);
            tl_kernels_fill_avx512bf16(&k, TL_NUM_FAST, 1);
            k.name = "avx512-bf16";
            check_r8(&k, &rfast, &r);
            check_attn_q(&k, &r); /* a quantized V summed by vdpbf16ps */
            continue;
        }
        tl_kernels_fill_avx2(&k, TL_NUM_EXACT);
        if (level >= TL_CPU_AVX512) tl_kernels_fill_avx512(&k, level >= TL_CPU_AVX512VNNI, TL_NUM_EXACT);
        k.name = level == TL_CPU_AVX2 ? "avx2" : level == TL_CPU_AVX512 ? "avx512" : "avx512-vnni";
        check_quantizers(&k, &r);
        check_dots(&k, &r);
        check_gemm(&k, &r);
        check_dot_f16(&k, &r);
        check_dot_f16_x4(&k, &r);
        check_tile_f32(&k, &r);
        tl_kernels kf = k;
        if (level == TL_CPU_AVX2) tl_kernels_fill_avx2(&kf, TL_NUM_FAST);
        else tl_kernels_fill_avx512(&kf, level >= TL_CPU_AVX512VNNI, TL_NUM_FAST);
        if (level != TL_CPU_AVX512) check_r8(&kf, &rfast, &r); /* AVX-512 without VNNI keeps AVX2's */
        if (level != TL_CPU_AVX512) { /* the tiles without software prefetches (AMD's choice) */
            tl_kernels kh = k;
            kh.hw_stream = 1;
            if (level == TL_CPU_AVX2) tl_kernels_fill_avx2(&kh, TL_NUM_FAST);
            else tl_kernels_fill_avx512(&kh, 1, TL_NUM_FAST);
            kh.name = level == TL_CPU_AVX2 ? "avx2 hw-stream" : "avx512-vnni hw-stream";
            CHECK(kh.gemm[TL_Q4_K] != kf.gemm[TL_Q4_K] && kh.gemm[TL_Q6_K] != kf.gemm[TL_Q6_K] &&
                      kh.gemm[TL_Q8_0] != kf.gemm[TL_Q8_0] && kh.gemm[TL_MXFP4] != kf.gemm[TL_MXFP4],
                  "%s: gemms of its own", kh.name);
            check_r8(&kh, &rfast, &r);
        }
        check_attn(&kf, &r);
        check_attn_q(&kf, &r);
        if (!getenv("TL_ASAN"))
            for (size_t ti = 0; ti < sizeof wtypes / sizeof *wtypes; ti++) bench_type(&k, &ref, wtypes[ti], &r);
    }
    if (top >= TL_CPU_AVX2) { /* TL_SW_PREFETCH, as spelled in the docs, overrides the vendor's choice */
        const char *was = getenv("TL_SW_PREFETCH");
        tl_kernels sw, hw;
        setenv("TL_SW_PREFETCH", "1", 1);
        tl_kernels_init(&sw, TL_CPU_AVX2, TL_NUM_FAST);
        setenv("TL_SW_PREFETCH", "0", 1);
        tl_kernels_init(&hw, TL_CPU_AVX2, TL_NUM_FAST);
        CHECK(!sw.hw_stream && hw.hw_stream && sw.gemm[TL_Q8_0] != hw.gemm[TL_Q8_0], "TL_SW_PREFETCH=1/0: hw_stream %d/%d",
              sw.hw_stream, hw.hw_stream);
        if (was) setenv("TL_SW_PREFETCH", was, 1);
        else unsetenv("TL_SW_PREFETCH");
    }
    if (top < TL_CPU_AVX2) printf("no AVX2 on this CPU: nothing to test beyond the reference\n");
    return tl_test_summary();
}
