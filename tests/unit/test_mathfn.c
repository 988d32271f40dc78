/* test_mathfn: the AVX2 paths of the element-wise functions (GeGLU, SwiGLU,
 * softmax exponentials, the attention-weighted sum of V) against their scalar
 * paths, bit for bit, on random inputs and the edge values they branch on. */
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

int main(void) {
    if (tl_cpu_detect() < TL_CPU_AVX2) {
        printf("no AVX2 on this CPU: the scalar paths are the only ones\n");
        CHECK(1, "nothing to compare");
        return tl_test_summary();
    }
    check_geglu();
    check_swiglu();
    check_pv();
    return tl_test_summary();
}
