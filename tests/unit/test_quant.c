/* test_quant: the weight formats and the CPU kernel table. Checks half/bf16
 * conversions, quantize/dequantize round trips, the reference dots against
 * float dots of dequantized rows, the activation quantizers' exact rules, and
 * then every kernel level this CPU supports against the scalar reference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "quant/quant.h"
#include "tl_test.h"
#include "base/util.h"

/* ---- helpers ------------------------------------------------------------------ */

typedef struct { uint64_t s; } rng;

static uint32_t rnd_u32(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 11);
}
static float rnd_unit(rng *r) { return (float)(rnd_u32(r) & 0xffffff) / 16777216.0f; } /* [0,1) */
static float rnd_normal(rng *r) {
    float u = rnd_unit(r) + 1e-7f, v = rnd_unit(r);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}
/* Rows with a varying scale and offset per 32 values, like real weights and
 * activations (outliers included). */
static void fill_rows(rng *r, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        float scale = 0.01f + 2.0f * rnd_unit(r), off = (rnd_unit(r) - 0.5f) * scale;
        for (int64_t j = i; j < i + 32 && j < n; j++) x[j] = off + scale * rnd_normal(r);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static const char *tname(tl_type t) {
    const tl_type_traits *tr = tl_type_info(t);
    return tr ? tr->name : "?";
}

static const tl_type k_weight_types[] = {TL_F32,  TL_F16,  TL_BF16, TL_Q4_0, TL_Q4_1, TL_Q5_0, TL_Q5_1,
                                         TL_Q8_0, TL_Q2_K, TL_Q3_K, TL_Q4_K, TL_Q5_K, TL_Q6_K};
#define N_WEIGHT_TYPES (sizeof k_weight_types / sizeof k_weight_types[0])
static const tl_type k_act_types[] = {TL_F32, TL_F16, TL_BF16, TL_Q8_0, TL_Q8_1, TL_Q8_K};
#define N_ACT_TYPES (sizeof k_act_types / sizeof k_act_types[0])

static uint16_t rnd_scale_h(rng *r) { return tl_fp32_to_fp16(0.001f + 0.05f * rnd_unit(r)); }

/* Random block bytes are valid blocks of every quantized type once the half
 * scale fields hold sane numbers; this reaches every quant value and every
 * scale code, including types we cannot quantize (Q2_K, Q3_K, Q5_K). */
static void random_weight_row(rng *r, tl_type t, void *row, int64_t n) {
    const tl_type_traits *tr = tl_type_info(t);
    size_t bytes = tl_row_size(t, n);
    uint8_t *p = row;
    if (t == TL_F32 || t == TL_F16 || t == TL_BF16) {
        float *x = xmalloc((size_t)n * sizeof *x);
        fill_rows(r, x, n);
        tl_quantize_row_act(t, x, row, n);
        free(x);
        return;
    }
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rnd_u32(r);
    for (int64_t b = 0; b < n / tr->block_size; b++) {
        uint8_t *blk = p + (size_t)b * tr->type_size;
        uint16_t d = rnd_scale_h(r), m = tl_fp32_to_fp16(-0.5f * rnd_unit(r));
        switch (t) {
        case TL_Q4_0: ((block_q4_0 *)blk)->d = d; break;
        case TL_Q5_0: ((block_q5_0 *)blk)->d = d; break;
        case TL_Q8_0: ((block_q8_0 *)blk)->d = d; break;
        case TL_Q4_1: ((block_q4_1 *)blk)->d = d, ((block_q4_1 *)blk)->m = m; break;
        case TL_Q5_1: ((block_q5_1 *)blk)->d = d, ((block_q5_1 *)blk)->m = m; break;
        case TL_Q2_K: ((block_q2_K *)blk)->d = d, ((block_q2_K *)blk)->dmin = rnd_scale_h(r); break;
        case TL_Q3_K: ((block_q3_K *)blk)->d = d; break;
        case TL_Q4_K: ((block_q4_K *)blk)->d = d, ((block_q4_K *)blk)->dmin = rnd_scale_h(r); break;
        case TL_Q5_K: ((block_q5_K *)blk)->d = d, ((block_q5_K *)blk)->dmin = rnd_scale_h(r); break;
        case TL_Q6_K: ((block_q6_K *)blk)->d = d; break;
        default: break;
        }
    }
}

/* ---- traits ----------------------------------------------------------------------- */

static void test_traits(void) {
    static const struct { tl_type t, vdt; int64_t bs; size_t ts; } want[] = {
        {TL_F32, TL_F32, 1, 4},       {TL_F16, TL_F16, 1, 2},        {TL_BF16, TL_BF16, 1, 2},
        {TL_Q4_0, TL_Q8_0, 32, 18},   {TL_Q4_1, TL_Q8_1, 32, 20},    {TL_Q5_0, TL_Q8_0, 32, 22},
        {TL_Q5_1, TL_Q8_1, 32, 24},   {TL_Q8_0, TL_Q8_0, 32, 34},    {TL_Q2_K, TL_Q8_K, 256, 84},
        {TL_Q3_K, TL_Q8_K, 256, 110}, {TL_Q4_K, TL_Q8_K, 256, 144},  {TL_Q5_K, TL_Q8_K, 256, 176},
        {TL_Q6_K, TL_Q8_K, 256, 210},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const tl_type_traits *t = tl_type_info(want[i].t);
        CHECK(t != NULL, "type %d has traits", want[i].t);
        if (!t) continue;
        CHECK(t->block_size == want[i].bs && t->type_size == want[i].ts, "%s sizes %lld/%zu", t->name,
              (long long)t->block_size, t->type_size);
        CHECK(t->can_dot && t->can_dequant && t->vec_dot_type == want[i].vdt, "%s dot pairing", t->name);
    }
    CHECK(tl_type_info(TL_Q8_1) && !tl_type_info(TL_Q8_1)->can_dot, "Q8_1 is activation-only");
    CHECK(tl_type_info(TL_Q8_K) && !tl_type_info(TL_Q8_K)->can_dot, "Q8_K is activation-only");
    CHECK(tl_type_info(4) == NULL && tl_type_info(5) == NULL, "removed Q4_2/Q4_3 ids are holes");
    CHECK(tl_type_info(TL_TYPE_COUNT) == NULL && tl_type_info(0xffffffffu) == NULL, "out of range ids");
    CHECK(tl_row_size(TL_Q4_0, 64) == 36, "row size Q4_0 x64");
    CHECK(tl_row_size(TL_Q6_K, 512) == 420, "row size Q6_K x512");
    CHECK(tl_row_size(TL_Q4_0, 33) == 0, "row size of a partial block is 0");
    CHECK(tl_row_size(TL_F32, INT64_MAX) == 0, "row size overflow is 0");
    CHECK(tl_row_size((tl_type)4, 32) == 0, "row size of unknown type is 0");
    float f[32];
    uint8_t buf[64];
    CHECK(tl_dequantize_row((tl_type)4, buf, f, 32) == -1, "dequantize unknown type fails");
    memset(f, 0, sizeof f);
    CHECK(tl_quantize_row((tl_type)4, f, buf, 32) == -1, "quantize to an unknown type fails");
    CHECK(tl_quantize_row(TL_Q4_0, f, buf, 31) == -1, "quantize partial block fails");
}

/* ---- half and bfloat16 ------------------------------------------------------------- */

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_fp16(void) {
    CHECK(tl_fp32_to_fp16(1.0f) == 0x3c00, "1.0");
    CHECK(tl_fp32_to_fp16(-2.0f) == 0xc000, "-2.0");
    CHECK(tl_fp32_to_fp16(65504.0f) == 0x7bff, "max half");
    CHECK(tl_fp32_to_fp16(65519.99f) == 0x7bff, "just below overflow");
    CHECK(tl_fp32_to_fp16(65520.0f) == 0x7c00, "65520 rounds to inf");
    CHECK(tl_fp32_to_fp16(INFINITY) == 0x7c00 && tl_fp32_to_fp16(-INFINITY) == 0xfc00, "inf");
    CHECK((tl_fp32_to_fp16(NAN) & 0x7fff) > 0x7c00, "nan stays nan");
    CHECK(tl_fp32_to_fp16(-0.0f) == 0x8000, "-0");
    CHECK(tl_fp32_to_fp16(ldexpf(1, -24)) == 0x0001, "smallest subnormal");
    CHECK(tl_fp32_to_fp16(ldexpf(1, -25)) == 0x0000, "half of it ties to even 0");
    CHECK(tl_fp32_to_fp16(ldexpf(3, -25)) == 0x0002, "1.5 ulp ties to even 2");
    CHECK(tl_fp32_to_fp16(ldexpf(1, -14)) == 0x0400, "smallest normal");
    CHECK(tl_fp32_to_fp16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie down to even");
    CHECK(tl_fp32_to_fp16(1.0f + ldexpf(3, -11)) == 0x3c02, "tie up to even");
    CHECK(tl_fp32_to_fp16(0.1f) == 0x2e66, "0.1");
    CHECK(tl_fp16_to_fp32(0x3555) == bits_f(0x3eaaa000), "1/3 as half");
    /* Every half: exact round trip; the exact midpoint to the next half ties
     * to the even one, and a hair either side rounds to the nearer. */
    int bad_rt = 0, bad_mid = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tl_fp16_to_fp32((uint16_t)h);
        if (isnan(f)) {
            bad_rt += (h & 0x7c00) != 0x7c00 || !(h & 0x3ff) || (tl_fp32_to_fp16(f) & 0x7fff) <= 0x7c00;
            continue;
        }
        bad_rt += tl_fp32_to_fp16(f) != h;
        uint32_t mag = h & 0x7fff;
        if (mag >= 0x7bff) continue; /* no finite next half */
        float g = tl_fp16_to_fp32((uint16_t)(h + 1));
        float mid = (f + g) / 2; /* exact in float */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        bad_mid += tl_fp32_to_fp16(mid) != even;
        bad_mid += tl_fp32_to_fp16(nextafterf(mid, f)) != h;
        bad_mid += tl_fp32_to_fp16(nextafterf(mid, g)) != h + 1;
    }
    CHECK(bad_rt == 0, "%d halfs fail the round trip", bad_rt);
    CHECK(bad_mid == 0, "%d half midpoints round wrongly", bad_mid);
}

static void test_bf16(void) {
    CHECK(tl_fp32_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
    CHECK(tl_fp32_to_bf16(bits_f(0x3f808000)) == 0x3f80, "bf16 tie to even (down)");
    CHECK(tl_fp32_to_bf16(bits_f(0x3f818000)) == 0x3f82, "bf16 tie to even (up)");
    CHECK(tl_fp32_to_bf16(bits_f(0x3f808001)) == 0x3f81, "bf16 above tie");
    CHECK(tl_fp32_to_bf16(bits_f(0x7f7fffff)) == 0x7f80, "bf16 max float rounds to inf");
    CHECK(tl_fp32_to_bf16(bits_f(0x7f800001)) == 0x7fc0, "bf16 signalling nan made quiet");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tl_bf16_to_fp32((uint16_t)h);
        if (isnan(f)) continue;
        bad += tl_fp32_to_bf16(f) != h;
    }
    CHECK(bad == 0, "%d bf16 values fail the round trip", bad);
}

/* ---- round trips -------------------------------------------------------------------- */

/* Per-block error bound of the legacy formats, from their rules: the grid step
 * (half of it for rounding, all of it where the extreme value is clamped) plus
 * the half-precision rounding of the stored scale and min. */
static float legacy_bound(tl_type t, const float *x, int n) {
    float mn = x[0], mx = x[0], amax = 0;
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]), amax = fmaxf(amax, fabsf(x[i]));
    }
    const float h = 1.0f / 1024; /* relative half rounding, generously */
    switch (t) {
    case TL_Q4_0: return amax / 8 * (1 + 8 * h);
    case TL_Q5_0: return amax / 16 * (1 + 16 * h);
    case TL_Q8_0: return amax / 127 * (0.5f + 127 * h);
    case TL_Q4_1: return (mx - mn) / 15 * (0.5f + 15 * h) + fabsf(mn) * h;
    case TL_Q5_1: return (mx - mn) / 31 * (0.5f + 31 * h) + fabsf(mn) * h;
    default: return INFINITY;
    }
}

static void test_roundtrip(void) {
    /* relative RMS error ceilings on N(0,1)-like blocks: a few times what the
     * formats achieve (Q4 ~0.1, Q5 ~0.05, Q6 ~0.025, Q8 ~0.005) */
    static const struct { tl_type t; float rms; } fmt[] = {
        {TL_Q4_0, 0.15f}, {TL_Q4_1, 0.12f}, {TL_Q5_0, 0.08f}, {TL_Q5_1, 0.06f}, {TL_Q8_0, 0.01f},
        {TL_Q4_K, 0.12f}, {TL_Q5_K, 0.06f}, {TL_Q6_K, 0.04f}, {TL_F16, 1e-3f}, {TL_BF16, 8e-3f},
        {TL_F32, 0.0f},
    };
    rng r = {0x1234567};
    const int64_t n = 256 * 6;
    float *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
    void *q = xmalloc(tl_row_size(TL_F32, n));
    fill_rows(&r, x, n);
    for (int i = 0; i < 40; i++) x[300 + i] = 0; /* a zero block in the middle */
    for (size_t k = 0; k < sizeof fmt / sizeof fmt[0]; k++) {
        tl_type t = fmt[k].t;
        CHECK(tl_quantize_row(t, x, q, n) == 0 && tl_dequantize_row(t, q, y, n) == 0, "%s round trip runs",
              tname(t));
        double se = 0, sx = 0;
        int bad_blocks = 0, bad_zero = 0;
        for (int64_t i = 0; i < n; i++) {
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            sx += (double)x[i] * x[i];
            bad_zero += x[i] == 0 && y[i] != 0 && t != TL_Q4_1 && t != TL_Q5_1 && t != TL_Q4_K && t != TL_Q5_K;
        }
        for (int64_t b = 0; b < n; b += 32) {
            float bound = legacy_bound(t, x + b, 32);
            for (int i = 0; i < 32; i++) bad_blocks += fabsf(y[b + i] - x[b + i]) > bound;
        }
        double rel = sqrt(se / sx);
        if (getenv("TL_TEST_VERBOSE")) printf("%s rel rms %.4g\n", tname(t), rel);
        CHECK(rel <= fmt[k].rms, "%s relative RMS error %.4g over %.4g", tname(t), rel, fmt[k].rms);
        CHECK(bad_blocks == 0, "%s: %d values beyond the per-block bound", tname(t), bad_blocks);
        CHECK(bad_zero == 0, "%s: %d zeros not kept", tname(t), bad_zero);
    }
    /* an all-zero row stays zero in every format, scales included */
    memset(x, 0, n * sizeof *x);
    for (size_t k = 0; k < sizeof fmt / sizeof fmt[0]; k++) {
        tl_quantize_row(fmt[k].t, x, q, n);
        tl_dequantize_row(fmt[k].t, q, y, n);
        int nz = 0;
        for (int64_t i = 0; i < n; i++) nz += y[i] != 0;
        CHECK(nz == 0, "%s: zero row gives %d nonzeros", tname(fmt[k].t), nz);
    }
    free(x), free(y), free(q);
}

/* ---- reference dot vs float dot of the dequantized rows ------------------------------- */

typedef struct {
    double exact;   /* dot of the dequantized rows, in double */
    double abs_sum; /* sum of |terms| */
    double s_slack; /* Q8_1's s field is a half: |m * s| * 2^-11 per block */
} dot_truth;

static dot_truth true_dot(tl_type t, int64_t n, const void *w, const void *a) {
    tl_type at = tl_type_info(t)->vec_dot_type;
    float *wf = xmalloc(n * sizeof *wf), *af = xmalloc(n * sizeof *af);
    tl_dequantize_row(t, w, wf, n);
    tl_dequantize_row(at, a, af, n);
    dot_truth d = {0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        d.exact += (double)wf[i] * af[i];
        d.abs_sum += fabs((double)wf[i] * af[i]);
    }
    if (at == TL_Q8_1) {
        const block_q8_1 *ab = a;
        for (int64_t b = 0; b < n / 32; b++) {
            uint16_t m = t == TL_Q4_1 ? ((const block_q4_1 *)w)[b].m : ((const block_q5_1 *)w)[b].m;
            d.s_slack += fabs((double)tl_fp16_to_fp32(m) * tl_fp16_to_fp32(ab[b].s)) / 1024;
        }
    }
    free(wf), free(af);
    return d;
}

static void test_ref_dots(void) {
    static const int nblocks[] = {1, 3, 7, 33};
    rng r = {0xfeedbeef};
    for (size_t k = 0; k < N_WEIGHT_TYPES; k++) {
        tl_type t = k_weight_types[k];
        const tl_type_traits *tr = tl_type_info(t);
        int64_t unit = tr->block_size == 1 ? 32 : tr->block_size;
        for (size_t s = 0; s < 4; s++) {
            int64_t n = unit * nblocks[s] + (tr->block_size == 1 ? 5 : 0); /* odd lengths for floats */
            void *w = xmalloc(tl_row_size(t, n)), *a = xmalloc(tl_row_size(TL_F32, n) + 64);
            float *x = xmalloc(n * sizeof *x);
            for (int pass = 0; pass < 2; pass++) {
                /* pass 0: random blocks; pass 1: quantized data where we can quantize */
                fill_rows(&r, x, n);
                if (pass == 0 || tl_quantize_row(t, x, w, n) != 0) random_weight_row(&r, t, w, n);
                fill_rows(&r, x, n);
                tl_quantize_row_act(tr->vec_dot_type, x, a, n);
                float got = tl_vec_dot_ref(t, n, w, a);
                dot_truth d = true_dot(t, n, w, a);
                double tol = 1e-5 * d.abs_sum + d.s_slack + 1e-30;
                CHECK(fabs(got - d.exact) <= tol, "ref dot %s n=%lld pass %d: %.9g vs exact %.9g (tol %.3g)",
                      tr->name, (long long)n, pass, got, d.exact, tol);
            }
            free(w), free(a), free(x);
        }
    }
}

/* ---- activation quantizers ----------------------------------------------------------- */

static void test_act_q8_0(void) {
    float x[64];
    block_q8_0 a[2], w[2];
    /* x*127/amax lands on .5 ties: the activation rounds them to even, the
     * weight quantizer (roundf) away from zero */
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) + 0.5f;
    x[31] = 127.0f;
    x[32] = -3.0f;
    for (int i = 33; i < 64; i++) x[i] = 0.0f;
    tl_quantize_row_act(TL_Q8_0, x, a, 64);
    tl_quantize_row(TL_Q8_0, x, w, 64);
    CHECK(a[0].d == 0x3c00 && w[0].d == 0x3c00, "d = amax/127 = 1: %04x %04x", a[0].d, w[0].d);
    int bad_a = 0, bad_w = 0;
    for (int i = 0; i < 31; i++) {
        float v = x[i];
        bad_a += a[0].qs[i] != (int)rintf(v);
        bad_w += w[0].qs[i] != (int)roundf(v);
    }
    CHECK(bad_a == 0, "activation Q8_0 rounds ties to even (%d wrong)", bad_a);
    CHECK(bad_w == 0, "weight Q8_0 rounds ties away from zero (%d wrong)", bad_w);
    CHECK(a[0].qs[31] == 127 && a[1].qs[0] == -127, "block max maps to +-127: %d %d", a[0].qs[31], a[1].qs[0]);
    int nz = 0;
    for (int i = 1; i < 32; i++) nz += a[1].qs[i] != 0;
    CHECK(nz == 0, "zeros stay zero");
    /* an all-zero block: d = 0, all quants 0 */
    memset(x, 0, sizeof x);
    memset(a, 0x55, sizeof a);
    tl_quantize_row_act(TL_Q8_0, x, a, 32);
    nz = a[0].d != 0;
    for (int i = 0; i < 32; i++) nz += a[0].qs[i] != 0;
    CHECK(nz == 0, "zero block");
}

static void test_act_q8_1_q8_K(void) {
    rng r = {99};
    float x[512], y[512];
    fill_rows(&r, x, 512);
    block_q8_1 a[16];
    tl_quantize_row_act(TL_Q8_1, x, a, 512);
    int bad_s = 0, bad_max = 0;
    for (int b = 0; b < 16; b++) {
        int sum = 0, amax = 0;
        for (int i = 0; i < 32; i++) sum += a[b].qs[i], amax = abs(a[b].qs[i]) > amax ? abs(a[b].qs[i]) : amax;
        bad_max += amax != 127;
        float am = 0;
        for (int i = 0; i < 32; i++) am = fmaxf(am, fabsf(x[32 * b + i]));
        /* d before its rounding to half, as the x86 code uses it */
        bad_s += a[b].s != tl_fp32_to_fp16(am / 127.f * (float)sum);
    }
    CHECK(bad_s == 0, "Q8_1 s = half(d*sum(q)) in %d blocks wrong", bad_s);
    CHECK(bad_max == 0, "Q8_1 block max maps to +-127 (%d wrong)", bad_max);

    block_q8_K k[2];
    tl_quantize_row_act(TL_Q8_K, x, k, 512);
    tl_dequantize_row(TL_Q8_K, k, y, 512);
    int bad_bsum = 0, bad_err = 0;
    for (int b = 0; b < 2; b++) {
        int imax = 0;
        for (int i = 0; i < 256; i++)
            if (fabsf(x[256 * b + i]) > fabsf(x[256 * b + imax])) imax = i;
        CHECK(k[b].qs[imax] == -127, "Q8_K: max element maps to -127 (d takes the sign): %d", k[b].qs[imax]);
        CHECK(fabsf(k[b].d * -127 - x[256 * b + imax]) <= 1e-6f * fabsf(x[256 * b + imax]), "Q8_K d");
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += k[b].qs[16 * g + i];
            bad_bsum += s != k[b].bsums[g];
        }
        for (int i = 0; i < 256; i++) bad_err += fabsf(y[256 * b + i] - x[256 * b + i]) > fabsf(k[b].d) * 0.5001f;
    }
    CHECK(bad_bsum == 0, "Q8_K bsums (%d wrong)", bad_bsum);
    CHECK(bad_err == 0, "Q8_K error within d/2 (%d wrong)", bad_err);
    memset(x, 0, 256 * sizeof *x);
    memset(k, 0x55, sizeof k);
    tl_quantize_row_act(TL_Q8_K, x, k, 256);
    int nz = k[0].d != 0;
    for (int i = 0; i < 256; i++) nz += k[0].qs[i] != 0;
    for (int g = 0; g < 16; g++) nz += k[0].bsums[g] != 0;
    CHECK(nz == 0, "Q8_K zero block: d, quants and bsums all zero");
}

/* ---- every kernel level against the reference ------------------------------------------ */

static const char *level_name(int l) {
    static const char *const n[] = {"scalar", "avx2", "avx512", "avx512-vnni", "avx512-bf16", "amx"};
    return l >= 0 && l <= 5 ? n[l] : "?";
}

/* Activation data with the awkward cases: exact .5 ties after scaling, zero
 * blocks, a lone outlier, tiny and huge magnitudes. */
static void fill_act_edge(rng *r, float *x, int64_t n) {
    fill_rows(r, x, n);
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        int kind = (int)((b / 32) % 5);
        if (kind == 1)
            for (int i = 0; i < 32; i++) x[b + i] = i == 7 ? 127.0f : (float)((int)(rnd_u32(r) % 100) - 50) + 0.5f;
        else if (kind == 2)
            for (int i = 0; i < 32; i++) x[b + i] = 0.0f;
        else if (kind == 3)
            x[b + rnd_u32(r) % 32] = 1000.0f;
        else if (kind == 4)
            for (int i = 0; i < 32; i++) x[b + i] *= 1e-6f;
    }
    /* a whole zero Q8_K super-block: d, quants and bsums must all be 0 */
    if (n >= 512)
        for (int i = 256; i < 512; i++) x[i] = 0.0f;
}

static void check_level_quantize(const tl_kernels *k, rng *r) {
    static const int64_t lens_blk[] = {1, 2, 3, 7, 9, 33};
    for (size_t q = 0; q < N_ACT_TYPES; q++) {
        tl_type t = k_act_types[q];
        const tl_type_traits *tr = tl_type_info(t);
        CHECK(k->quantize[t] != NULL, "%s: quantize[%s] is NULL", k->name, tr->name);
        if (!k->quantize[t]) continue;
        for (size_t s = 0; s < 6; s++) {
            for (int odd = 0; odd < (tr->block_size == 1 ? 2 : 1); odd++) {
                int64_t n = (tr->block_size == 1 ? 32 : tr->block_size) * lens_blk[s] + odd * (lens_blk[s] % 17);
                size_t bytes = tl_row_size(t, n);
                float *x = xmalloc(n * sizeof *x);
                uint8_t *want = xmalloc(bytes), *got = xmalloc(bytes);
                fill_act_edge(r, x, n);
                memset(want, 0xa5, bytes);
                memset(got, 0x5a, bytes);
                tl_quantize_row_act(t, x, want, n);
                k->quantize[t](x, got, n);
                size_t at = 0;
                while (at < bytes && want[at] == got[at]) at++;
                CHECK(at == bytes, "level %s quantize %s n=%lld: first differing byte %zu of %zu (block %zu)",
                      k->name, tr->name, (long long)n, at, bytes, at / tr->type_size);
                free(x), free(want), free(got);
            }
        }
    }
}

/* An activation quant of -128, which the quantizers never make but ggml's
 * sign trick mishandles (-(-128) wraps): every level must still agree. */
static void poke_minus128(tl_type at, void *a, int64_t n) {
    if (at == TL_Q8_0) ((block_q8_0 *)a)[0].qs[5] = -128;
    if (at == TL_Q8_1) ((block_q8_1 *)a)[0].qs[5] = -128;
    if (at == TL_Q8_K && n >= QK_K) ((block_q8_K *)a)[0].qs[5] = -128;
}

/* Every level's dots must give the scalar reference's bits exactly (the
 * reference follows llama.cpp's float order; see quant.c). */
static void check_level_dots(const tl_kernels *k, rng *r) {
    static const int64_t lens_blk[] = {1, 2, 3, 7, 8, 16, 33};
    for (size_t q = 0; q < N_WEIGHT_TYPES; q++) {
        tl_type t = k_weight_types[q];
        const tl_type_traits *tr = tl_type_info(t);
        CHECK(k->vec_dot[t] != NULL, "%s: vec_dot[%s] is NULL", k->name, tr->name);
        if (!k->vec_dot[t]) continue;
        for (size_t s = 0; s < 7; s++) {
            for (int odd = 0; odd < (tr->block_size == 1 ? 2 : 1); odd++) {
                int64_t n = (tr->block_size == 1 ? 32 : tr->block_size) * lens_blk[s] + odd * (lens_blk[s] % 17);
                void *w = xmalloc(tl_row_size(t, n)), *a = xmalloc(tl_row_size(TL_F32, n) + 64);
                float *x = xmalloc(n * sizeof *x);
                random_weight_row(r, t, w, n);
                fill_act_edge(r, x, n);
                tl_quantize_row_act(tr->vec_dot_type, x, a, n);
                if (s == 3) poke_minus128(tr->vec_dot_type, a, n);
                float want = tl_vec_dot_ref(t, n, w, a), got = k->vec_dot[t](n, w, a);
                CHECK(memcmp(&want, &got, sizeof got) == 0, "level %s vec_dot %s n=%lld: %.9g vs ref %.9g, not bit-identical",
                      k->name, tr->name, (long long)n, got, want);
                free(w), free(a), free(x);
            }
        }
    }
    /* the ggml-order dots (vec_dot_id) against the scalar level's, at every
     * length to 100 (each leftover shape past the steps of 32) */
    tl_kernels ref;
    tl_kernels_init(&ref, TL_CPU_SCALAR, TL_NUM_EXACT);
    for (int64_t n = 1; n <= 100 && k->vec_dot_id[TL_F32]; n++) {
        float *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
        fill_rows(r, x, n);
        fill_rows(r, y, n);
        float want = ref.vec_dot_id[TL_F32](n, x, y), got = k->vec_dot_id[TL_F32](n, x, y);
        CHECK(memcmp(&want, &got, sizeof got) == 0, "level %s vec_dot_id f32 n=%lld: %.9g vs ref %.9g", k->name,
              (long long)n, got, want);
        free(x), free(y);
    }
    /* IQ4_NL's: ggml_vec_dot's two chains for experts, tinyBLAS's one for a
     * matrix (vec_dot, above); odd block counts reach the pairs' leftover */
    for (int64_t nb = 1; nb <= 9 && k->vec_dot_id[TL_IQ4_NL]; nb++) {
        const int64_t n = 32 * nb;
        float *x = xmalloc(n * sizeof *x);
        uint8_t *w = xmalloc(tl_row_size(TL_IQ4_NL, n)), *a = xmalloc(tl_row_size(TL_Q8_0, n));
        fill_rows(r, x, n);
        tl_quantize_row(TL_IQ4_NL, x, w, n);
        fill_rows(r, x, n);
        tl_quantize_row_act(TL_Q8_0, x, a, n);
        float want = ref.vec_dot_id[TL_IQ4_NL](n, w, a), got = k->vec_dot_id[TL_IQ4_NL](n, w, a);
        float one = tl_vec_dot_ref(TL_IQ4_NL, n, w, a);
        CHECK(memcmp(&want, &got, sizeof got) == 0, "level %s vec_dot_id iq4_nl n=%lld: %.9g vs ref %.9g", k->name,
              (long long)n, got, want);
        CHECK(fabsf(one - want) <= 1e-4f * (fabsf(want) + 1.0f), "iq4_nl n=%lld: one chain %.9g vs two %.9g",
              (long long)n, one, want);
        free(x), free(w), free(a);
    }
    CHECK(k->dot_f16 != NULL, "%s: dot_f16 is NULL", k->name);
    if (!k->dot_f16) return;
    for (int64_t n = 1; n <= 300; n += (n < 40 ? 1 : 37)) {
        float *x = xmalloc(n * sizeof *x);
        uint16_t *h1 = xmalloc(n * 2), *h2 = xmalloc(n * 2);
        fill_rows(r, x, n);
        tl_quantize_row_act(TL_F16, x, h1, n);
        fill_rows(r, x, n);
        tl_quantize_row_act(TL_F16, x, h2, n);
        double abs_sum = 0, exact = 0;
        for (int64_t i = 0; i < n; i++) {
            const double p = (double)tl_fp16_to_fp32(h1[i]) * tl_fp16_to_fp32(h2[i]);
            abs_sum += fabs(p);
            exact += p;
        }
        float want = tl_vec_dot_ref(TL_F16, n, h1, h2), got = k->dot_f16(n, h1, h2);
        CHECK(memcmp(&want, &got, sizeof got) == 0, "level %s dot_f16 n=%lld: %.9g vs ref %.9g, not bit-identical",
              k->name, (long long)n, got, want);
        CHECK(fabs((double)want - exact) <= 1e-5 * abs_sum + 1e-30, "ref dot_f16 n=%lld: %.9g vs exact %.9g",
              (long long)n, want, exact);
        free(x), free(h1), free(h2);
    }
}

static void test_levels(void) {
    tl_cpu_level det = tl_cpu_detect();
    printf("detected CPU level: %s\n", level_name(det));
    for (int l = TL_CPU_SCALAR; l <= (int)det; l++) {
        tl_kernels k;
        tl_kernels_init(&k, (tl_cpu_level)l, TL_NUM_EXACT);
        CHECK(k.level == (tl_cpu_level)l && k.name && !strcmp(k.name, level_name(l)), "init level %s gives %s",
              level_name(l), k.name ? k.name : "(null)");
        rng r = {0xabcdef + (uint64_t)l};
        int before = tl_test_fail;
        check_level_quantize(&k, &r);
        check_level_dots(&k, &r);
        printf("level %s: %s\n", k.name, tl_test_fail == before ? "all kernels match the reference" : "FAILURES");
    }
    /* asking for more than the CPU has gives what it has */
    tl_kernels k;
    tl_kernels_init(&k, TL_CPU_AMX, TL_NUM_EXACT);
    CHECK(k.level == det, "init capped at detected level");
}

static void test_choose(void) {
    tl_cpu_level det = tl_cpu_detect();
    setenv("TL_CPU", "scalar", 1);
    CHECK(tl_cpu_choose() == TL_CPU_SCALAR, "TL_CPU=scalar");
    setenv("TL_CPU", "avx2", 1);
    CHECK(tl_cpu_choose() == (det < TL_CPU_AVX2 ? det : TL_CPU_AVX2), "TL_CPU=avx2");
    setenv("TL_CPU", "avx512-vnni", 1);
    CHECK(tl_cpu_choose() == (det < TL_CPU_AVX512VNNI ? det : TL_CPU_AVX512VNNI), "TL_CPU=avx512-vnni");
    setenv("TL_CPU", "avx512-bf16", 1);
    CHECK(tl_cpu_choose() == (det < TL_CPU_AVX512BF16 ? det : TL_CPU_AVX512BF16), "TL_CPU=avx512-bf16");
    setenv("TL_CPU", "amx", 1);
    CHECK(tl_cpu_choose() == det, "TL_CPU=amx capped at detected");
    setenv("TL_CPU", "bogus", 1);
    CHECK(tl_cpu_choose() == det, "unknown TL_CPU falls back to detected");
    unsetenv("TL_CPU");
    CHECK(tl_cpu_choose() == det, "no TL_CPU: detected");
}

int main(void) {
    test_traits();
    test_fp16();
    test_bf16();
    test_roundtrip();
    test_ref_dots();
    test_act_q8_0();
    test_act_q8_1_q8_K();
    test_choose();
    test_levels();
    return tl_test_summary();
}
