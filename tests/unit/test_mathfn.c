/* test_mathfn: the AVX2 paths of the element-wise functions (GeGLU, SwiGLU,
 * softmax exponentials, the attention-weighted sum of V, the fast numerics'
 * attention) against their scalar paths, bit for bit, on random inputs and the
 * edge values they branch on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/mathfn.h"
#include "tl_test.h"
#include "util.h"

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
 * window and a block table that is not in order. */
static void attn_case(int hd, int G, int T, int pos0, int n_swa) {
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
    tl_attn_rows a = {.hd = hd, .G = G, .bs = BS, .T = T, .q = q, .q_stride = (size_t)hd, .q_tok = (size_t)G * hd,
                      .scale = 0.125f, .k = kc + hd, .v = vc + hd, .kv_stride = (size_t)kvd, .blk = blk,
                      .pos0 = pos0, .n_swa = n_swa, .out = o1, .out_stride = (size_t)hd,
                      .out_tok = (size_t)G * hd, .scratch = scr};
    tl_attn_online(&a, 0);
    a.out = o2;
    tl_attn_online(&a, 1);
    CHECK(same(o1, o2, T * G * hd), "attn hd=%d G=%d T=%d pos0=%d swa=%d: AVX2 equals scalar", hd, G, T, pos0, n_swa);
    int alone_ok = 1;
    double worst = 0;
    for (int i = 0; i < T; i++) {
        tl_attn_rows b = a;
        b.T = 1, b.pos0 = pos0 + i, b.q = q + (size_t)i * G * hd, b.out = o3;
        tl_attn_online(&b, 1);
        alone_ok &= same(o3, o1 + (size_t)i * G * hd, G * hd);
        const int pos = pos0 + i, lo = n_swa > 0 && pos - n_swa + 1 > 0 ? pos - n_swa + 1 : 0;
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
            for (int p = lo; p <= pos; p++) sum += (w[p] = exp(w[p] - mx));
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
    CHECK(alone_ok, "attn hd=%d G=%d T=%d pos0=%d swa=%d: each token alone gives its bits in the run", hd, G, T,
          pos0, n_swa);
    CHECK(worst < 1e-5, "attn hd=%d G=%d T=%d pos0=%d swa=%d: max error %g vs double", hd, G, T, pos0, n_swa, worst);
    free(kc), free(vc), free(q), free(o1), free(o2), free(o3), free(scr);
}

static void check_attn(void) {
    attn_case(64, 3, 16, 0, 0);    /* SmolLM2's heads, a prompt's first run */
    attn_case(64, 3, 7, 250, 0);   /* a run across blocks, mid-context */
    attn_case(64, 1, 1, 1000, 0);  /* decode, one head per KV head */
    attn_case(256, 4, 5, 300, 0);  /* Gemma 3's 256-wide heads */
    attn_case(256, 4, 9, 600, 512); /* its sliding window */
    attn_case(128, 2, 3, 17, 8);   /* a window shorter than a block */
    attn_case(8, 5, 4, 45, 0);     /* the narrowest head */
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
    return tl_test_summary();
}
