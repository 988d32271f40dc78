/* cpu/kern_ref: the scalar kernel level, the floor every other level falls
 * back to. Thin wrappers that bind quant.c's reference dots and activation
 * quantizers to the per-type slots of tl_kernels. */
#include <math.h>
#include <string.h>
#include "cpu/kernels.h"

#include "base/util.h"

/* One named wrapper per type, because the table holds plain function pointers
 * and the reference takes the type as an argument. */
#define REF_DOT(T) \
    static float ref_dot_##T(int64_t n, const void *w, const void *a) { return tl_vec_dot_ref(TL_##T, n, w, a); }
REF_DOT(F32)
REF_DOT(F16)
REF_DOT(BF16)
REF_DOT(Q4_0)
REF_DOT(Q4_1)
REF_DOT(Q5_0)
REF_DOT(Q5_1)
REF_DOT(Q8_0)
REF_DOT(MXFP4)
REF_DOT(IQ4_NL)
REF_DOT(IQ4_XS)
REF_DOT(Q2_K)
REF_DOT(Q3_K)
REF_DOT(Q4_K)
REF_DOT(Q5_K)
REF_DOT(Q6_K)
#undef REF_DOT

#define REF_QUANT(T) \
    static void ref_quant_##T(const float *x, void *y, int64_t n) { (void)tl_quantize_row_act(TL_##T, x, y, n); }
REF_QUANT(F32)
REF_QUANT(F16)
REF_QUANT(BF16)
REF_QUANT(Q8_0)
REF_QUANT(Q8_1)
REF_QUANT(Q8_K)
#undef REF_QUANT

/* quant.c's F16 dot is llamafile's tinyBLAS order, the one wanted for the
 * attention scores too. */
static float ref_dot_f16(int64_t n, const uint16_t *x, const uint16_t *y) { return tl_vec_dot_ref(TL_F16, n, x, y); }

/* ggml_vec_dot_f32 as its x86 AVX2 build runs it (mul_mat_id's dot for F32
 * weights, where mul_mat takes tinyBLAS's order): four 8-lane fma chains
 * over steps of 32, folded 0+2, 1+3, then 0+1, the lanes as hi128 + lo128
 * then two horizontal adds; the tail as GCC compiled vec.cpp's leftover loop:
 * blocks of 8 and then 4 multiplied and added in order, the last 0-3 fused
 * (forward/pool.c's mean takes the same order). */
static float ref_dot_f32_ggml(int64_t n, const void *w, const void *a) {
    const float *x = w, *y = a;
    float acc[4][8] = {{0}};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++) acc[j][l] = fmaf(x[i + j * 8 + l], y[i + j * 8 + l], acc[j][l]);
    float v[8], h[4];
    for (int l = 0; l < 8; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    for (int l = 0; l < 4; l++) h[l] = v[l] + v[l + 4];
    float s = (h[0] + h[1]) + (h[2] + h[3]);
    const int64_t rem = n - np, fused = np + (rem & ~(int64_t)7) + ((rem & 7) >= 4 ? 4 : 0);
    int64_t i = np;
    for (; i < fused; i++) s += x[i] * y[i];
    for (; i < n; i++) s = fmaf(x[i], y[i], s);
    return s;
}

/* ggml_vec_dot_f16 (F16 weights, F16 activations) on AVX2: the same four
 * chains and folds on the widened values, the tail added in double. */
static float ref_dot_f16_ggml(int64_t n, const void *w, const void *a) {
    const uint16_t *x = w, *y = a;
    float acc[4][8] = {{0}};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++)
                acc[j][l] = fmaf(tl_fp16_to_fp32(x[i + j * 8 + l]), tl_fp16_to_fp32(y[i + j * 8 + l]), acc[j][l]);
    float v[8], h[4];
    for (int l = 0; l < 8; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    for (int l = 0; l < 4; l++) h[l] = v[l] + v[l + 4];
    double s = (double)((h[0] + h[1]) + (h[2] + h[3]));
    for (int64_t i = np; i < n; i++) s += (double)(tl_fp16_to_fp32(x[i]) * tl_fp16_to_fp32(y[i]));
    return (float)s;
}

/* IQ4_NL, MXFP4 and Q4_0 (a table of nibble - 8) in llama.cpp's repacked
 * order (kernels.h vec_dot_x8). */
static const int8_t q4_0_values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
static float ref_dot_lut32_x8(int mx, int64_t n, const void *vw, const void *va) {
    const uint8_t *x = vw;
    const block_q8_0 *y = va;
    const size_t bs = mx == 1 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const int8_t *tv = mx == 1 ? tl_kvalues_mxfp4 : mx == 2 ? q4_0_values : tl_kvalues_iq4nl;
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        const uint8_t *b = x + (size_t)ib * bs, *qs = b + (mx == 1 ? 1 : 2);
        uint16_t dh;
        memcpy(&dh, b, sizeof dh);
        const float dw = mx == 1 ? tl_e8m0_half(b[0]) : tl_fp16_to_fp32(dh);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += y[ib].qs[j] * tv[qs[j] & 0x0F] + y[ib].qs[j + 16] * tv[qs[j] >> 4];
        acc = fmaf((float)isum, dw * tl_fp16_to_fp32(y[ib].d), acc);
    }
    return acc;
}
static float ref_dot_iq4_nl_x8(int64_t n, const void *w, const void *a) { return ref_dot_lut32_x8(0, n, w, a); }
static float ref_dot_mxfp4_x8(int64_t n, const void *w, const void *a) { return ref_dot_lut32_x8(1, n, w, a); }
static float ref_dot_q4_0_x8(int64_t n, const void *w, const void *a) { return ref_dot_lut32_x8(2, n, w, a); }

void tl_kernels_fill_ref(tl_kernels *k) {
    k->vec_dot_x8[TL_IQ4_NL] = ref_dot_iq4_nl_x8;
    k->vec_dot_x8[TL_MXFP4] = ref_dot_mxfp4_x8;
    k->vec_dot_x8[TL_Q4_0] = ref_dot_q4_0_x8;
    k->vec_dot_id[TL_F32] = ref_dot_f32_ggml;
    k->vec_dot_id[TL_F16] = ref_dot_f16_ggml;
    k->vec_dot_id[TL_IQ4_NL] = tl_vec_dot_iq4_nl_ggml;
    k->vec_dot[TL_F32] = ref_dot_F32;
    k->vec_dot[TL_F16] = ref_dot_F16;
    k->vec_dot[TL_BF16] = ref_dot_BF16;
    k->vec_dot[TL_Q4_0] = ref_dot_Q4_0;
    k->vec_dot[TL_Q4_1] = ref_dot_Q4_1;
    k->vec_dot[TL_Q5_0] = ref_dot_Q5_0;
    k->vec_dot[TL_Q5_1] = ref_dot_Q5_1;
    k->vec_dot[TL_Q8_0] = ref_dot_Q8_0;
    k->vec_dot[TL_MXFP4] = ref_dot_MXFP4;
    k->vec_dot[TL_IQ4_NL] = ref_dot_IQ4_NL;
    k->vec_dot[TL_IQ4_XS] = ref_dot_IQ4_XS;
    k->vec_dot[TL_Q2_K] = ref_dot_Q2_K;
    k->vec_dot[TL_Q3_K] = ref_dot_Q3_K;
    k->vec_dot[TL_Q4_K] = ref_dot_Q4_K;
    k->vec_dot[TL_Q5_K] = ref_dot_Q5_K;
    k->vec_dot[TL_Q6_K] = ref_dot_Q6_K;
    k->quantize[TL_F32] = ref_quant_F32;
    k->quantize[TL_F16] = ref_quant_F16;
    k->quantize[TL_BF16] = ref_quant_BF16;
    k->quantize[TL_Q8_0] = ref_quant_Q8_0;
    k->quantize[TL_Q8_1] = ref_quant_Q8_1;
    k->quantize[TL_Q8_K] = ref_quant_Q8_K;
    k->dot_f16 = ref_dot_f16;
}
