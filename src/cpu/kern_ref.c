/* cpu/kern_ref: the scalar kernel level, the floor every other level falls
 * back to. Thin wrappers that bind quant.c's reference dots and activation
 * quantizers to the per-type slots of tl_kernels. */
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

void tl_kernels_fill_ref(tl_kernels *k) {
    k->vec_dot[TL_F32] = ref_dot_F32;
    k->vec_dot[TL_F16] = ref_dot_F16;
    k->vec_dot[TL_BF16] = ref_dot_BF16;
    k->vec_dot[TL_Q4_0] = ref_dot_Q4_0;
    k->vec_dot[TL_Q4_1] = ref_dot_Q4_1;
    k->vec_dot[TL_Q5_0] = ref_dot_Q5_0;
    k->vec_dot[TL_Q5_1] = ref_dot_Q5_1;
    k->vec_dot[TL_Q8_0] = ref_dot_Q8_0;
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
