/* quant: the weight formats. Block layouts (byte-identical to GGUF/ggml),
 * dequantization, quantization of rows, and the scalar reference dot product of
 * a weight row with an activation row in the format it pairs with. Knows
 * nothing of threads or SIMD: src/cpu/ builds fast kernels and tests them
 * against the reference here. */
#ifndef TL_QUANT_H
#define TL_QUANT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Type ids as stored in GGUF tensor infos (ggml_type). */
typedef enum tl_type {
    TL_F32 = 0,
    TL_F16 = 1,
    TL_Q4_0 = 2,
    TL_Q4_1 = 3,
    TL_Q5_0 = 6,
    TL_Q5_1 = 7,
    TL_Q8_0 = 8,
    TL_Q8_1 = 9,
    TL_Q2_K = 10,
    TL_Q3_K = 11,
    TL_Q4_K = 12,
    TL_Q5_K = 13,
    TL_Q6_K = 14,
    TL_Q8_K = 15,
    TL_BF16 = 30,
    TL_IQ4_NL = 20, /* 4-bit indices into a non-linear int8 table, one f16 scale per 32 */
    TL_IQ4_XS = 23, /* the same table, 256-element super-blocks with 6-bit sub-block scales */
    TL_MXFP4 = 39, /* OCP microscaling FP4: E2M1 values, one E8M0 scale per 32 (gpt-oss's experts) */
    TL_TYPE_COUNT = 40 /* table size; ids above are rejected */
} tl_type;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* Scales are IEEE half (uint16_t bits) unless said otherwise. */
typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;               /* x = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;            /* x = d*q + m */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0; /* x = d*(q-16) */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;                     /* x = d*q */
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } block_q8_1;                  /* s = d*sum(q) */
typedef struct {
    uint8_t scales[QK_K / 16]; /* 4-bit scale | 4-bit min per 16 */
    uint8_t qs[QK_K / 4];
    uint16_t d, dmin;
} block_q2_K;
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} block_q3_K;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* 8 x (6-bit scale, 6-bit min) */
    uint8_t qs[QK_K / 2];
} block_q4_K;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
} block_q6_K;
#define QK4_NL 32
typedef struct { uint16_t d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;  /* x = d*kvalues_iq4nl[q] */
typedef struct {
    uint16_t d;
    uint16_t scales_h;          /* the top 2 bits of each sub-block's 6-bit scale */
    uint8_t scales_l[QK_K / 64];/* the low 4 bits, two per byte */
    uint8_t qs[QK_K / 2];
} block_iq4_xs;                 /* x = d*(scale-32)*kvalues_iq4nl[q] */
#define QK_MXFP4 32
/* x = e8m0_half(e) * kvalues_mxfp4[q]: the table holds twice E2M1's values,
 * the scale half of 2^(e-127) (ggml's convention) */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
extern const int8_t tl_kvalues_iq4nl[16]; /* IQ4_NL's and IQ4_XS's values */
/* IQ4_XS sub-block ib's 6-bit scale, less 32 */
static inline int tl_iq4_xs_scale(const block_iq4_xs *x, int ib) {
    return (((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((x->scales_h >> 2 * ib) & 3) << 4)) - 32;
}
/* Q3_K's 16 signed 6-bit scales (biased by 32 in storage) */
static inline void tl_q3k_scales(const uint8_t *packed, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}
extern const int8_t tl_kvalues_mxfp4[16]; /* twice E2M1's values */
/* MXFP4's scale: ggml's e8m0_to_fp32_half, 2^(e-128), the two smallest as subnormals */
static inline float tl_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
typedef struct {
    float d;                 /* float, not half */
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sums of groups of 16 qs */
} block_q8_K;

/* The 6-bit scale and min of sub-block j in the 12 packed bytes of Q4_K/Q5_K. */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static_assert(sizeof(block_q4_0) == 18, "q4_0");
static_assert(sizeof(block_q4_1) == 20, "q4_1");
static_assert(sizeof(block_q5_0) == 22, "q5_0");
static_assert(sizeof(block_q5_1) == 24, "q5_1");
static_assert(sizeof(block_q8_0) == 34, "q8_0");
static_assert(sizeof(block_q8_1) == 36, "q8_1");
static_assert(sizeof(block_q2_K) == 84, "q2_K");
static_assert(sizeof(block_q3_K) == 110, "q3_K");
static_assert(sizeof(block_q4_K) == 144, "q4_K");
static_assert(sizeof(block_q5_K) == 176, "q5_K");
static_assert(sizeof(block_q6_K) == 210, "q6_K");
static_assert(sizeof(block_q8_K) == 292, "q8_K");
static_assert(sizeof(block_mxfp4) == 17, "mxfp4");
static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl");
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs");

typedef struct tl_type_traits {
    const char *name;   /* "Q4_1" */
    int64_t block_size; /* elements per block */
    size_t type_size;   /* bytes per block */
    int can_dequant;    /* dequantize_row implemented */
    int can_dot;        /* usable as a matmul weight: has vec_dot_type and a dot */
    tl_type vec_dot_type; /* the activation format a weight row is multiplied with,
                           * as in ggml: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1,
                           * Q8_K for K-quants, F16 for F16, BF16 for BF16, F32 for F32 */
} tl_type_traits;

/* NULL for an unknown id (type >= TL_TYPE_COUNT or a hole in the table). */
const tl_type_traits *tl_type_info(uint32_t type);

/* Bytes of a row of n elements; 0 if n is not a multiple of the block size
 * or on overflow. */
size_t tl_row_size(tl_type type, int64_t n);

/* Row conversions. n must be a multiple of the type's block size.
 * Return 0, or -1 if the type does not support the operation. */
int tl_dequantize_row(tl_type type, const void *src, float *dst, int64_t n);
int tl_quantize_row(tl_type type, const float *src, void *dst, int64_t n);
/* Activation rows (F32, F16, BF16, Q8_0, Q8_1, Q8_K) exactly as llama.cpp's
 * x86 CPU backend quantizes them for a matmul. Differs from tl_quantize_row
 * only for Q8_0, whose weight quantizer (ggml's reference, also gguf-py's)
 * rounds x/d half away from zero where the activation one rounds x*127/amax
 * half to even. Returns 0, or -1 for other types. */
int tl_quantize_row_act(tl_type type, const float *src, void *dst, int64_t n);

/* Reference (scalar, plain C) dot of weight row w (type) with activation row a
 * (in type's vec_dot_type), n elements. The oracle for every SIMD kernel. */
float tl_vec_dot_ref(tl_type type, int64_t n, const void *w, const void *a);
/* IQ4_NL as ggml_vec_dot_iq4_nl_q8_0 takes it (two chains of 8 lanes, even
 * and odd blocks): mul_mat_id's order, where tl_vec_dot_ref's is the one
 * chain tinyBLAS takes for a matrix. */
float tl_vec_dot_iq4_nl_ggml(int64_t n, const void *w, const void *a);

#endif
