/* cpu/simd256: small 256-bit helpers shared by the AVX2 and AVX-512 kernel files
 * (each compiled with at least AVX2 + FMA + F16C): half-float scales, horizontal
 * sums, and unpacking of 4-bit and 1-bit quant fields. */
#ifndef TL_CPU_SIMD256_H
#define TL_CPU_SIMD256_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Forced inlining: kernels are written once with constant arguments (format,
 * tile shape, VNNI) that fold away in each instance. */
#define AI static inline __attribute__((always_inline))
/* Tile loops have constant trip counts; unrolled, their arrays live in registers. */
#define UNROLL _Pragma("GCC unroll 4")

/* Every float operation is spelled out: clang would otherwise fuse a*b + c. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline float hsum_f8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_i8x32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* a*b + c rounded once, as ggml's compiler contracts its scalar running sums;
 * with -mfma, fmaf is one instruction (no libm call, no register shuffles). */
static inline float fma1(float a, float b, float c) { return fmaf(a, b, c); }

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles first (elements 0..15 of a
 * 32-block), then high nibbles (elements 16..31), as the Q4/Q5 layouts store them. */
static inline __m256i nibbles32(const uint8_t *p) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set (bit j -> byte j). */
static inline __m256i bits32(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes in both 128-bit lanes (a vpshufb table). */
static inline __m256i bcast16(const void *p) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)); }

/* Half number k of a block (the m of Q4_1/Q5_1 is k = 1, the s of Q8_1 too). */
static inline float h2f_at(const void *block, int k) {
    uint16_t h;
    memcpy(&h, (const uint8_t *)block + 2 * k, 2);
    return h2f(h);
}

#endif
