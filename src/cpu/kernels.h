/* cpu/kernels: the table of CPU kernels chosen once at start-up from the
 * features this CPU has (scalar, AVX2, AVX-512, AVX-512 VNNI). Entries a level
 * lacks fall back to the level below, down to quant's scalar reference. */
#ifndef TL_CPU_KERNELS_H
#define TL_CPU_KERNELS_H

#include <stdint.h>

#include "quant.h"

typedef enum tl_cpu_level {
    TL_CPU_SCALAR = 0,
    TL_CPU_AVX2 = 1,       /* AVX2 + FMA + F16C */
    TL_CPU_AVX512 = 2,     /* + AVX-512 F/BW/VL/DQ */
    TL_CPU_AVX512VNNI = 3  /* + AVX-512 VNNI */
} tl_cpu_level;

/* dot(weight row w of `type`, activation row a in its vec_dot_type), n elements. */
typedef float (*tl_vec_dot_fn)(int64_t n, const void *w, const void *a);
/* The same dot for four activation rows (a, a + a_stride, ...) against one
 * weight row, sharing the weight's unpacking: out[i] is bitwise what vec_dot
 * gives for row i. Optional (NULL: call vec_dot four times). */
typedef void (*tl_vec_dot4_fn)(int64_t n, const void *w, const void *a, size_t a_stride,
                               float out[4]);
/* f32 row -> activation format (Q8_0, Q8_1, Q8_K, F16, BF16), n elements. */
typedef void (*tl_quantize_fn)(const float *x, void *y, int64_t n);

typedef struct tl_kernels {
    tl_cpu_level level;
    const char *name;                     /* "scalar", "avx2", "avx512", "avx512-vnni" */
    tl_vec_dot_fn vec_dot[TL_TYPE_COUNT]; /* indexed by weight type; NULL: unsupported */
    tl_vec_dot4_fn vec_dot4[TL_TYPE_COUNT]; /* prefill: 4 tokens per weight row; may be NULL */
    tl_quantize_fn quantize[TL_TYPE_COUNT]; /* indexed by activation type */
    /* f16 x f16 dot with f32 accumulation (attention scores against an f16 K cache) */
    float (*dot_f16)(int64_t n, const uint16_t *x, const uint16_t *y);
} tl_kernels;

/* The best level this CPU supports (cpuid + OS support for the registers). */
tl_cpu_level tl_cpu_detect(void);
/* The level requested by the environment variable TL_CPU (scalar, avx2,
 * avx512, avx512-vnni), capped at what the CPU supports; else the detected one. */
tl_cpu_level tl_cpu_choose(void);
/* Fills k for level (capped at the detected level). */
void tl_kernels_init(tl_kernels *k, tl_cpu_level level);

/* Per-ISA fillers, each defined in its own file compiled with its own flags.
 * They overwrite the entries they implement and leave the rest. */
void tl_kernels_fill_ref(tl_kernels *k);
void tl_kernels_fill_avx2(tl_kernels *k);
void tl_kernels_fill_avx512(tl_kernels *k, int vnni);

#endif
