/* test_mathfn: the AVX2 paths of the element-wise functions (GeGLU, SwiGLU,
 * softmax exponentials, the attention-weighted sum of V, the fast numerics'
 * attention, RMSNorm in both orders, RoPE, f16 rows) against their scalar paths, bit for bit, on random inputs and the
 * edge values they branch on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/mathfn.h"
#include "tl_test.h"
#include "base/util.h"
#include "forward/kvfmt.h"
#include "quant/quant.h"

static uint64_t rs = 88172645463325252ull;
static float frand(void) { /* [-1, 1) */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)(rs >> 40) / 8388608.0f - 1.0f;
}

static int same(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

static void check_geglu(void) {
    uint16_t *table = malloc(65536 * sizeof *table);
    CHECK(table != NULL, "alloc");
    if (!table) return;
    tl_gelu_table(table);
    enum { N = 4099 };
    static float g[N], u[N], y1[N], y2[N];
    for (int i = 0; i < N; i++) {
        g[i] = 14.0f * frand();
        u[i] = frand();
    }
    g[0] = -10.0f, g[1] = 10.0f, g[2] = -9.999f, g[3] = 9.999f, g[4] = 0.0f, g[5] = -0.0f, g[6] = 1e-8f;
    tl_geglu(N, y1, g, u, table, 0);
    tl_geglu(N, y2, g, u, table, 1);
    CHECK(same(y1, y2, N), "geglu: AVX2 equals scalar");
    memcpy(y2, g, sizeof g); /* in place, as the forward pass calls it */
    tl_geglu(N, y2, y2, u, table, 1);
    CHECK(same(y1, y2, N), "geglu in place");
    free(table);
}

static void check_swiglu(void) {
    enum { N = 1037 };
    static float g[N], u[N], y1[N], y2[N];
    for (int i = 0; i < N; i++) g[i] = 20.0f * frand(), u[i] = frand();
    tl_swiglu(N, y1, g, u, 0);
    tl_swiglu(N, y2, g, u, 1);
    CHECK(same(y1, y2, N), "swiglu: AVX2 equals scalar");
}

/* Paged rows: a shuffled block table over v gives the same bits as the
 * same rows laid out contiguously, on both paths. */
static void check_pv(void) {
    enum { HD = 84, BS = 16, NB = 6, NK = BS * NB, VS = 3 * HD };
    static uint16_t v[NK * VS], flat[NK * VS];
    static float p[NK], acc[9 * HD], o1[HD], o2[HD], o3[HD];
    const int32_t blk[NB] = {4, 0, 5, 2, 1, 3};
    for (int i = 0; i < NK * VS; i++) v[i] = tl_fp32_to_fp16(frand());
    for (int j = 0; j < NK; j++) /* position j lives in block blk[j/BS], row j%BS */
        memcpy(flat + (size_t)j * VS, v + ((size_t)blk[j / BS] * BS + j % BS) * VS, VS * sizeof *v);
    for (int i = 0; i < NK; i++) p[i] = tl_fp16_to_fp32(tl_fp32_to_fp16(fabsf(frand())));
    for (int j0 = 0; j0 < NK; j0 += 24)
        for (int n = 1; j0 + n <= NK; n += 13) {
            tl_attn_pv_paged(n, HD, p, v, VS, blk, BS, j0, acc, o1, 0);
            tl_attn_pv_paged(n, HD, p, v, VS, blk, BS, j0, acc, o2, 1);
            tl_attn_pv(n, HD, p, flat + (size_t)j0 * VS, VS, acc, o3, 0);
            CHECK(same(o1, o2, HD), "attn_pv n=%d j0=%d: AVX2 equals scalar", n, j0);
            CHECK(same(o1, o3, HD), "attn_pv n=%d j0=%d: paged equals contiguous", n, j0);
        }
}

/* The fast attention (tl_attn_online): AVX2 equals scalar bitwise; a token's
 * output is the same alone as in a run of any length (batch invariance);
 * against softmax attention in double within float noise; with a sliding
 * window and a block table that is not in order. sinks: each head's softmax
 * also counts a sink logit (gpt-oss), some above every score and some below,
 * once per row however its keys are split into segments. */
static void attn_case_s(int hd, int G, int T, int pos0, int n_swa, int sinks) {
    if (G > 16) return; /* sk below */
    enum { BS = 16, NB = 64 };
    const int kvd = 2 * hd; /* two KV heads in a row; this case uses the second */
    uint16_t *kc = malloc((size_t)NB * BS * kvd * 2), *vc = malloc((size_t)NB * BS * kvd * 2);
    float *q = malloc((size_t)T * G * hd * 4), *o1 = malloc((size_t)T * G * hd * 4), *o2 = malloc((size_t)T * G * hd * 4);
    float *o3 = malloc((size_t)G * hd * 4), *scr = malloc(tl_attn_scratch(hd, G, BS, T) * 4);
    int32_t blk[NB];
    CHECK(kc && vc && q && o1 && o2 && o3 && scr, "alloc");
    if (!(kc && vc && q && o1 && o2 && o3 && scr)) return;
    for (int i = 0; i < NB; i++) blk[i] = (i * 37 + 5) % NB; /* scattered blocks */
    for (size_t i = 0; i < (size_t)NB * BS * kvd; i++) {
        kc[i] = tl_fp32_to_fp16(frand());
        vc[i] = tl_fp32_to_fp16(frand());
    }
    for (int i = 0; i < T * G * hd; i++) q[i] = 3.0f * frand();
    float sk[16];
    for (int h = 0; h < 16; h++) sk[h] = h % 3 == 0 ? 4.0f + 2.0f * frand() : 2.0f * frand() - (float)(h % 3);
    tl_attn_rows a = {.hd = hd, .G = G, .bs = BS, .T = T, .q = q, .q_stride = (size_t)hd, .q_tok = (size_t)G * hd,
                      .scale = 0.125f, .k = kc + hd, .v = vc + hd, .k_stride = (size_t)kvd * 2, .v_stride = (size_t)kvd * 2, .blk = blk,
                      .pos0 = pos0, .n_swa = n_swa, .out = o1, .out_stride = (size_t)hd,
                      .out_tok = (size_t)G * hd, .scratch = scr, .sinks = sinks ? sk : NULL};
    tl_attn_online(&a, 0);
    a.out = o2;
    tl_attn_online(&a, 1);
    CHECK(same(o1, o2, T * G * hd), "attn hd=%d G=%d T=%d pos0=%d swa=%d: AVX2 equals scalar", hd, G, T, pos0, n_swa);
    int alone_ok = 1, split_ok = 1;
    double worst = 0;
    for (int i = 0; i < T; i++) {
        tl_attn_rows b = a;
        b.T = 1, b.pos0 = pos0 + i, b.q = q + (size_t)i * G * hd, b.out = o3;
        tl_attn_online(&b, 1);
        alone_ok &= same(o3, o1 + (size_t)i * G * hd, G * hd);
        const int pos = pos0 + i, lo = n_swa > 0 && pos - n_swa + 1 > 0 ? pos - n_swa + 1 : 0;
        /* the token's keys segment by segment (as threads split a decode
         * step), folded in order: the same bits, scalar and AVX2 */
        for (int avx2 = 0; avx2 < 2; avx2++) {
            float *so = malloc((size_t)G * hd * 4), *oa = malloc((size_t)G * hd * 4), ma[64], la[64], ml[128];
            if (!so || !oa || G > 64) return;
            for (int h = 0; h < G; h++) ma[h] = -INFINITY, la[h] = 0.0f;
            for (int sg = lo / TL_ATTN_SEG; sg <= pos / TL_ATTN_SEG; sg++) {
                tl_attn_rows c = b;
                c.seg = sg + 1, c.out = so, c.part = ml;
                tl_attn_online(&c, avx2);
                for (int h = 0; h < G; h++)
                    if (ml[2 * h] != -INFINITY)
                        tl_attn_merge(hd, &ma[h], &la[h], oa + (size_t)h * hd, ml[2 * h], ml[2 * h + 1], so + (size_t)h * hd);
            }
            for (int h = 0; h < G; h++) {
                if (sinks) tl_attn_sink(hd, &ma[h], &la[h], oa + (size_t)h * hd, sk[h]);
                for (int d = 0; d < hd; d++) so[h * hd + d] = oa[h * hd + d] * (1.0f / la[h]);
            }
            split_ok &= same(so, o3, G * hd);
            free(so), free(oa);
        }
        for (int h = 0; h < G; h++) {
            const float *qh = q + ((size_t)i * G + h) * hd;
            double mx = -1e300, sum = 0, *w = malloc((size_t)(pos + 1) * sizeof *w);
            if (!w) return;
            for (int p = lo; p <= pos; p++) {
                const size_t row = ((size_t)blk[p / BS] * BS + (size_t)(p % BS)) * kvd + hd;
                double sc = 0;
                for (int d = 0; d < hd; d++) sc += (double)qh[d] * tl_fp16_to_fp32(kc[row + d]);
                w[p] = sc * 0.125;
                if (w[p] > mx) mx = w[p];
            }
            if (sinks && sk[h] > mx) mx = sk[h];
            for (int p = lo; p <= pos; p++) sum += (w[p] = exp(w[p] - mx));
            if (sinks) sum += exp(sk[h] - mx); /* in the denominator, weighing no value */
            for (int d = 0; d < hd; d++) {
                double r = 0;
                for (int p = lo; p <= pos; p++)
                    r += w[p] * tl_fp16_to_fp32(vc[((size_t)blk[p / BS] * BS + (size_t)(p % BS)) * kvd + hd + d]);
                const double e = fabs(r / sum - o1[((size_t)i * G + h) * hd + d]);
                if (e > worst) worst = e;
            }
            free(w);
        }
    }
    CHECK(alone_ok, "attn hd=%d G=%d T=%d pos0=%d swa=%d sinks=%d: each token alone gives its bits in the run", hd, G,
          T, pos0, n_swa, sinks);
    {   /* the whole run segment by segment (a verification step split between threads) */
        float *so = malloc((size_t)T * G * hd * 4), *oa = malloc((size_t)T * G * hd * 4);
        float *ma = malloc((size_t)T * G * 4), *la = malloc((size_t)T * G * 4), *ml = malloc((size_t)T * G * 8);
        if (!so || !oa || !ma || !la || !ml) return;
        for (int k = 0; k < T * G; k++) ma[k] = -INFINITY, la[k] = 0.0f;
        const int lo0 = n_swa > 0 && pos0 - n_swa + 1 > 0 ? pos0 - n_swa + 1 : 0;
        for (int sg = lo0 / TL_ATTN_SEG; sg <= (pos0 + T - 1) / TL_ATTN_SEG; sg++) {
            tl_attn_rows c = a;
            c.seg = sg + 1, c.out = so, c.part = ml;
            tl_attn_online(&c, 1);
            for (int k = 0; k < T * G; k++)
                if (ml[2 * k] != -INFINITY)
                    tl_attn_merge(hd, &ma[k], &la[k], oa + (size_t)k * hd, ml[2 * k], ml[2 * k + 1], so + (size_t)k * hd);
        }
        for (int k = 0; k < T * G; k++) {
            if (sinks) tl_attn_sink(hd, &ma[k], &la[k], oa + (size_t)k * hd, sk[k % G]);
            for (int d = 0; d < hd; d++) so[k * hd + d] = oa[k * hd + d] * (1.0f / la[k]);
        }
        split_ok &= same(so, o1, T * G * hd);
        free(so), free(oa), free(ma), free(la), free(ml);
    }
    CHECK(split_ok, "attn hd=%d G=%d T=%d pos0=%d swa=%d sinks=%d: the segments folded give the whole pass's bits", hd,
          G, T, pos0, n_swa, sinks);
    CHECK(worst < 1e-5, "attn hd=%d G=%d T=%d pos0=%d swa=%d sinks=%d: max error %g vs double", hd, G, T, pos0, n_swa,
          sinks, worst);
    free(kc), free(vc), free(q), free(o1), free(o2), free(o3), free(scr);
}

/* The fast attention over a quantized cache (Q8_0, Q4_0, f16 for the other
 * half): K as rows and K transposed per block give the same bits, AVX2
 * equals scalar, a token alone equals its row in the run, and the result
 * is within float noise of attention in double over the dequantized cache. */
static const char *fmt_name(int f) { return f == TL_ATTN_Q8_0 ? "q8_0" : f == TL_ATTN_Q4_0 ? "q4_0" : "f16"; }
static tl_type fmt_type(int f) { return f == TL_ATTN_Q8_0 ? TL_Q8_0 : f == TL_ATTN_Q4_0 ? TL_Q4_0 : TL_F16; }

static void attn_case_q(int hd, int G, int T, int pos0, int n_swa, int kf, int vf) {
    enum { BS = 16, NB = 48 };
    const int kvd = 2 * hd, np = NB * BS; /* two KV heads in a row; the second is used */
    const tl_kv_format *kfmt = tl_kv_format_of(fmt_type(kf)), *vfmt = tl_kv_format_of(fmt_type(vf));
    const size_t krb = kfmt->row_bytes(kvd), vrb = vfmt->row_bytes(kvd);
    uint8_t *kr = malloc((size_t)np * krb), *ktr = malloc((size_t)np * krb), *vr = malloc((size_t)np * vrb);
    float *x = malloc((size_t)kvd * 4), *kd = malloc((size_t)np * kvd * 4), *vd = malloc((size_t)np * kvd * 4);
    float *q = malloc((size_t)T * G * hd * 4), *o[4], *o5 = malloc((size_t)G * hd * 4);
    float *scr = malloc(tl_attn_scratch(hd, G, BS, T) * 4);
    for (int i = 0; i < 4; i++) o[i] = malloc((size_t)T * G * hd * 4);
    int32_t blk[NB];
    int ok = kr && ktr && vr && x && kd && vd && q && o5 && scr && o[0] && o[1] && o[2] && o[3];
    CHECK(ok, "alloc");
    if (!ok) return;
    tl_mathfn m;
    tl_mathfn_bind(&m, 0, 1);
    for (int i = 0; i < NB; i++) blk[i] = (i * 29 + 7) % NB;
    for (int p = 0; p < np; p++) { /* row p is slot p % BS of stored block p / BS */
        for (int i = 0; i < kvd; i++) x[i] = 2.0f * frand();
        kfmt->store(&m, x, kr + (size_t)p * krb, kvd);
        kfmt->store_tr(&m, x, ktr + (size_t)(p / BS) * BS * krb, p % BS, BS, kvd);
        tl_dequantize_row(kfmt->type, kr + (size_t)p * krb, kd + (size_t)p * kvd, kvd);
        for (int i = 0; i < kvd; i++) x[i] = frand();
        vfmt->store(&m, x, vr + (size_t)p * vrb, kvd);
        tl_dequantize_row(vfmt->type, vr + (size_t)p * vrb, vd + (size_t)p * kvd, kvd);
    }
    for (int i = 0; i < T * G * hd; i++) q[i] = 3.0f * frand();
    tl_attn_rows a = {.hd = hd, .G = G, .bs = BS, .T = T, .q = q, .q_stride = (size_t)hd, .q_tok = (size_t)G * hd,
                      .scale = 0.125f, .k = kr + kfmt->row_bytes(hd), .v = vr + vfmt->row_bytes(hd),
                      .k_stride = krb, .v_stride = vrb, .k_fmt = kf, .v_fmt = vf, .blk = blk, .pos0 = pos0,
                      .n_swa = n_swa, .out_stride = (size_t)hd, .out_tok = (size_t)G * hd, .scratch = scr};
    for (int i = 0; i < 4; i++) {
        tl_attn_rows b = a;
        if (i >= 2) b.k = ktr + kfmt->row_bytes(hd) * BS, b.k_tr = 1;
        b.out = o[i];
        tl_attn_online(&b, i % 2);
    }
    CHECK(same(o[0], o[1], T * G * hd) && same(o[0], o[2], T * G * hd) && same(o[0], o[3], T * G * hd),
          "attn %s/%s hd=%d G=%d T=%d pos0=%d swa=%d: rows and transposed K, scalar and AVX2 give the same bits",
          fmt_name(kf), fmt_name(vf), hd, G, T, pos0, n_swa);
    int alone_ok = 1;
    double worst = 0;
    for (int i = 0; i < T; i++) {
        tl_attn_rows b = a;
        b.k = ktr + kfmt->row_bytes(hd) * BS, b.k_tr = 1;
        b.T = 1, b.pos0 = pos0 + i, b.q = q + (size_t)i * G * hd, b.out = o5;
        tl_attn_online(&b, 1);
        alone_ok &= same(o5, o[0] + (size_t)i * G * hd, G * hd);
        const int pos = pos0 + i, lo = n_swa > 0 && pos - n_swa + 1 > 0 ? pos - n_swa + 1 : 0;
        for (int h = 0; h < G; h++) {
            const float *qf = q + ((size_t)i * G + h) * hd;
            double mx = -1e300, sum = 0, *w = malloc((size_t)(pos + 1) * sizeof *w), qh[256];
            if (!w) return;
            /* a quantized K scores q as it is rounded to 8 bits per 32 (mathfn.h) */
            for (int d = 0; d < hd; d++) qh[d] = qf[d];
            for (int g = 0; kf != TL_ATTN_F16 && g < hd; g += 32) {
                float amax = 0;
                for (int d = g; d < g + 32; d++) amax = fmaxf(amax, fabsf(qf[d]));
                const float dq = amax / 127.0f, id = dq != 0.0f ? 1.0f / dq : 0.0f;
                for (int d = g; d < g + 32; d++) qh[d] = (double)dq * nearbyintf(qf[d] * id);
            }
            for (int p = lo; p <= pos; p++) {
                const float *k = kd + ((size_t)blk[p / BS] * BS + (size_t)(p % BS)) * kvd + hd;
                double sc = 0;
                for (int d = 0; d < hd; d++) sc += (double)qh[d] * k[d];
                w[p] = sc * 0.125;
                if (w[p] > mx) mx = w[p];
            }
            for (int p = lo; p <= pos; p++) sum += (w[p] = exp(w[p] - mx));
            for (int d = 0; d < hd; d++) {
                double r = 0;
                for (int p = lo; p <= pos; p++) r += w[p] * vd[((size_t)blk[p / BS] * BS + (size_t)(p % BS)) * kvd + hd + d];
                const double e = fabs(r / sum - o[0][((size_t)i * G + h) * hd + d]);
                if (e > worst) worst = e;
            }
            free(w);
        }
    }
    CHECK(alone_ok, "attn %s/%s hd=%d G=%d T=%d pos0=%d: each token alone gives its bits in the run", fmt_name(kf),
          fmt_name(vf), hd, G, T, pos0);
    /* a quantized V's weights are rounded to bf16 (mathfn.h, 8 significant
     * bits): each within 2^-8 of itself, so the sum within 2^-8 of max |v| */
    double vmax = 0;
    for (size_t i = 0; i < (size_t)np * kvd; i++) vmax = fmax(vmax, fabs(vd[i]));
    const double tol = vf == TL_ATTN_F16 ? 1e-5 : 0x1p-8 * vmax + 1e-5;
    CHECK(worst < tol, "attn %s/%s hd=%d G=%d T=%d pos0=%d swa=%d: max error %g (bound %g) vs double over the "
          "dequantized cache", fmt_name(kf), fmt_name(vf), hd, G, T, pos0, n_swa, worst, tol);
    free(kr), free(ktr), free(vr), free(x), free(kd), free(vd), free(q), free(o5), free(scr);
    for (int i = 0; i < 4; i++) free(o[i]);
}

static void attn_case(int hd, int G, int T, int pos0, int n_swa) {
    attn_case_s(hd, G, T, pos0, n_swa, 0);
    attn_case_s(hd, G, T, pos0, n_swa, 1);
}

/* tl_attn_sink is tl_attn_merge of the state (s, 1, 0), bit for bit, on both
 * sides of the maximum and at a tie; a sink of -inf changes nothing. */
static void check_sink(void) {
    enum { HD = 24 };
    float o[HD], oa[HD], zero[HD] = {0};
    const float ss[] = {-3.0f, 0.5f, 2.0f, 2.0f + 1e-6f, 7.0f, -INFINITY};
    for (size_t i = 0; i < sizeof ss / sizeof *ss; i++) {
        for (int d = 0; d < HD; d++) o[d] = oa[d] = frand();
        float m = 2.0f, l = 3.7f, ma = 2.0f, la = 3.7f;
        tl_attn_sink(HD, &m, &l, o, ss[i]);
        if (ss[i] != -INFINITY) tl_attn_merge(HD, &ma, &la, oa, ss[i], 1.0f, zero);
        CHECK(m == ma && l == la && same(o, oa, HD), "sink %g: tl_attn_merge's bits (l %.9g vs %.9g)", (double)ss[i],
              (double)l, (double)la);
    }
}

static void check_attn(void) {
    check_sink();
    attn_case(64, 3, 16, 0, 0);    /* SmolLM2's heads, a prompt's first run */
    attn_case(64, 3, 7, 250, 0);   /* a run across blocks, mid-context */
    attn_case(64, 1, 1, 1000, 0);  /* decode, one head per KV head */
    attn_case(256, 4, 5, 300, 0);  /* Gemma 3's 256-wide heads */
    attn_case(256, 4, 9, 600, 512); /* its sliding window */
    attn_case(128, 2, 3, 17, 8);   /* a window shorter than a block */
    attn_case(8, 5, 4, 45, 0);     /* the narrowest head */
    attn_case(64, 3, 3, 510, 0);   /* a run across a segment boundary (512) */
    attn_case(64, 2, 1, 1020, 600); /* a window across segments */
    attn_case(64, 3, 40, 980, 0);  /* a run across 512 positions' worth of segments */
    /* quantized caches: each type for K and V, decode and runs, windows */
    attn_case_q(64, 3, 1, 700, 0, TL_ATTN_Q8_0, TL_ATTN_Q8_0);
    attn_case_q(64, 3, 9, 250, 0, TL_ATTN_Q4_0, TL_ATTN_Q4_0);
    attn_case_q(128, 2, 5, 530, 0, TL_ATTN_Q8_0, TL_ATTN_F16);
    attn_case_q(96, 4, 3, 33, 20, TL_ATTN_F16, TL_ATTN_Q8_0);
    attn_case_q(64, 1, 20, 480, 100, TL_ATTN_Q4_0, TL_ATTN_Q8_0);
    CHECK(tl_expf_fast(0.0f) == 1.0f, "exp(0) is exactly 1 (tl_attn_merge relies on it)");
}

/* The bound tables' RMSNorm, RoPE and f16 rows: AVX2 against scalar, and
 * the fast RMSNorm close to a double reference. */
/* The Walsh-Hadamard rotation of a quantized cache: AVX2 equals scalar bit
 * for bit, and it is its own inverse (orthonormal and symmetric) to float
 * noise. */
static void check_fwht(void) {
    tl_mathfn ref, vec;
    tl_mathfn_bind(&ref, 0, 1);
    tl_mathfn_bind(&vec, 1, 1);
    for (int n = 8; n <= 256; n *= 2) {
        float x[256], a[256], b[256];
        for (int i = 0; i < n; i++) x[i] = a[i] = b[i] = 4.0f * frand();
        ref.fwht(a, n);
        vec.fwht(b, n);
        CHECK(same(a, b, n), "fwht n=%d: AVX2 equals scalar", n);
        ref.fwht(a, n);
        double e = 0;
        for (int i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - x[i]));
        CHECK(e < 1e-5, "fwht n=%d applied twice gives the input back (max error %g)", n, e);
    }
}

/* The weighted sum of a token's experts: AVX2 equals scalar, and the
 * product is rounded before the add (ggml_mul then ggml_add), not fused. */
static void check_mul_add(void) {
    tl_mathfn ref, vec;
    tl_mathfn_bind(&ref, 0, 1);
    tl_mathfn_bind(&vec, 1, 1);
    enum { N = 2051 };
    static float y[N], a[N], b[N];
    for (int i = 0; i < N; i++) y[i] = 3.0f * frand();
    const int ns[] = {1, 7, 8, 9, 64, 2048, 2051};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const int n = ns[c];
        const float w = 0.3f + frand() * 0.1f;
        for (int first = 1; first >= 0; first--) {
            ref.mul_add(n, a, y, w, first);
            vec.mul_add(n, b, y, w, first);
            CHECK(same(a, b, n), "mul_add n=%d first=%d: AVX2 equals scalar", n, first);
        }
        int unfused = 1;
        for (int i = 0; i < n; i++) {
            const float v = y[i] * w;
            unfused = unfused && a[i] == v + v;
        }
        CHECK(unfused, "mul_add n=%d: o + y*w with the product rounded first", n);
    }
}

static void check_norm_rope(void) {
    tl_mathfn ref[2], vec[2];
    for (int fast = 0; fast < 2; fast++) {
        tl_mathfn_bind(&ref[fast], 0, fast);
        tl_mathfn_bind(&vec[fast], 1, fast);
    }
    enum { N = 2053 };
    static float x[N], w[N], y1[N], y2[N], cs[N];
    static uint16_t h1[N], h2[N];
    for (int i = 0; i < N; i++) x[i] = frand() * 3.0f, w[i] = 1.0f + frand(), cs[i] = frand();
    const int ns[] = {1, 7, 16, 31, 64, 256, 576, 640, 2048, 2053};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const int n = ns[c];
        for (int fast = 0; fast < 2; fast++) {
            ref[fast].rmsnorm(y1, x, w, n, 1e-6f);
            vec[fast].rmsnorm(y2, x, w, n, 1e-6f);
            CHECK(same(y1, y2, n), "rmsnorm %s n=%d: AVX2 equals scalar", fast ? "fast" : "exact", n);
        }
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double sc = 1.0 / sqrt(ss / n + 1e-6);
        double worst = 0.0;
        for (int i = 0; i < n; i++) {
            const double e = fabs(y1[i] - x[i] * sc * w[i]) / (fabs(x[i] * sc * w[i]) + 1e-30);
            if (e > worst) worst = e;
        }
        CHECK(worst < 1e-6, "rmsnorm fast n=%d: relative error %g vs double", n, worst);
        memcpy(y2, x, sizeof(float) * (size_t)n);
        vec[1].rmsnorm(y2, y2, w, n, 1e-6f);
        CHECK(same(y1, y2, n), "rmsnorm fast n=%d in place", n);
        ref[0].f16_row(x, h1, n);
        vec[0].f16_row(x, h2, n);
        CHECK(memcmp(h1, h2, sizeof(uint16_t) * (size_t)n) == 0, "f16 row n=%d: AVX2 equals scalar", n);
    }
    /* head widths with odd pair counts (the adjacent layout's lone last
     * pair), partial rotation, several heads */
    const int shapes[][3] = {{64, 64, 3}, {128, 128, 2}, {256, 256, 4}, {80, 64, 2}, {10, 10, 3}, {26, 18, 2}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int hd = shapes[c][0], nr = shapes[c][1], nh = shapes[c][2];
        for (int neox = 0; neox < 2; neox++) {
            memcpy(y1, x, sizeof(float) * (size_t)(hd * nh));
            memcpy(y2, x, sizeof(float) * (size_t)(hd * nh));
            ref[1].rope(y1, nh, hd, nr, cs, neox);
            vec[1].rope(y2, nh, hd, nr, cs, neox);
            CHECK(same(y1, y2, hd * nh), "rope hd=%d n_rot=%d heads=%d neox=%d: AVX2 equals scalar", hd, nr, nh, neox);
            CHECK(!same(y1, x, hd * nh), "rope hd=%d n_rot=%d neox=%d changes its input", hd, nr, neox);
        }
    }
}

int main(void) {
    if (tl_cpu_detect() < TL_CPU_AVX2) {
        printf("no AVX2 on this CPU: the scalar paths are the only ones\n");
        CHECK(1, "nothing to compare");
        return tl_test_summary();
    }
    check_geglu();
    check_swiglu();
    check_pv();
    check_attn();
    check_norm_rope();
    check_fwht();
    check_mul_add();
    return tl_test_summary();
}
