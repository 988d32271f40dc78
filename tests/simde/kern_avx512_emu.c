/* tests/simde/kern_avx512_emu: kern_avx512.c compiled for a CPU without AVX-512,
 * each AVX-512 intrinsic emulated by SIMDe, so the AVX-512 and VNNI kernels are
 * checked bit for bit against the scalar reference on any x86-64 with AVX2.
 * The few intrinsics SIMDe 0.7.4 lacks or aliases wrongly are spelled here. */
#include <immintrin.h>
#include <stdint.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#undef _mm512_madd_epi16 /* 0.7.4 aliases the masked form under this name */
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)

static inline simde__m512 emu_cvtepi32_ps(simde__m512i v) {
    const __m256 lo = _mm256_cvtepi32_ps(simde_mm512_castsi512_si256(v));
    const __m256 hi = _mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(v, 1));
    return simde_mm512_insertf32x8(simde_mm512_castps256_ps512(lo), hi, 1);
}
#define _mm512_cvtepi32_ps(v) emu_cvtepi32_ps(v)
#define _mm512_extractf32x8_ps(v, i) \
    _mm256_castpd_ps(simde_mm512_extractf64x4_pd(simde_mm512_castps_pd(v), i))

static inline simde__m512 emu_cvtph_ps(__m256i h) {
    const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    const __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    return simde_mm512_insertf32x8(simde_mm512_castps256_ps512(lo), hi, 1);
}
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps(h) emu_cvtph_ps(h)

static inline simde__m512i emu_cvtepu16_epi32(__m256i h) {
    const __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
    const __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32(h) emu_cvtepu16_epi32(h)

static inline simde__m512i emu_cvtepi8_epi32(__m128i v) {
    const __m256i lo = _mm256_cvtepi8_epi32(v);
    const __m256i hi = _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32(v) emu_cvtepi8_epi32(v)

/* Shifts by a count the unrolled native build sees as a constant but this
 * one (loops not unrolled) does not: SIMDe's immediate forms reject it under clang. */
#undef _mm512_slli_epi16
#define _mm512_slli_epi16(a, n) simde_mm512_sll_epi16(a, _mm_cvtsi32_si128(n))
#undef _mm512_srli_epi16
#define _mm512_srli_epi16(a, n) simde_mm512_srl_epi16(a, _mm_cvtsi32_si128(n))

/* 32-bit lane add and subtract wrap on the hardware; SIMDe 0.7.4 spells them
 * as signed int arithmetic, which UBSan (rightly) reports when the exp's
 * exponent tricks wrap. Two native 256-bit halves wrap as the hardware does. */
static inline simde__m512i emu_epi32_op(simde__m512i a, simde__m512i b, int sub) {
    const __m256i al = simde_mm512_castsi512_si256(a), ah = simde_mm512_extracti64x4_epi64(a, 1);
    const __m256i bl = simde_mm512_castsi512_si256(b), bh = simde_mm512_extracti64x4_epi64(b, 1);
    const __m256i lo = sub ? _mm256_sub_epi32(al, bl) : _mm256_add_epi32(al, bl);
    const __m256i hi = sub ? _mm256_sub_epi32(ah, bh) : _mm256_add_epi32(ah, bh);
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
#undef _mm512_add_epi32
#define _mm512_add_epi32(a, b) emu_epi32_op(a, b, 0)
#undef _mm512_sub_epi32
#define _mm512_sub_epi32(a, b) emu_epi32_op(a, b, 1)

static inline uint32_t emu_test_epi8_mask(__m256i a, __m256i b) {
    const __m256i z = _mm256_cmpeq_epi8(_mm256_and_si256(a, b), _mm256_setzero_si256());
    return ~(uint32_t)_mm256_movemask_epi8(z);
}
#define _mm256_test_epi8_mask(a, b) emu_test_epi8_mask(a, b)

/* b added to a in the bytes whose bit is set in m (bit j -> byte j). */
static inline __m256i emu_mask_add_epi8(__m256i src, uint32_t m, __m256i a, __m256i b) {
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                         2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), sel);
    const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_blendv_epi8(src, _mm256_add_epi8(a, b), on);
}
#define _mm256_mask_add_epi8(src, m, a, b) emu_mask_add_epi8(src, m, a, b)

/* The fast gemm's tiles at their smallest and not unrolled: the same template
 * and arithmetic, at a fraction of the compile time of emulated intrinsics. */
#define R8_PM 1
#define R8_DM 1
#define R8Z_PM 1
#define UNROLL8 _Pragma("GCC unroll 1")
#define R8_BF16 0 /* SIMDe's vdpbf16ps neither rounds nor flushes as the instruction does */
/* the quantized caches' decode through the widening path (cpu/attn512.h):
 * their direct instances would add half again to this file's compile time */
#define TL_ATTN512_QDIRECT 0
#include "cpu/kern_avx512.c"
