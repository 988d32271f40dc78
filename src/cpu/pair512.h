/* cpu/pair512: two 8-row groups of a packed layout side by side in one 512-bit
 * vector (group g in lanes 0..7, g+1 in 8..15): the loads and widenings the
 * AVX-512 tiles (r8_tile.h) and the AMX tiles' weight planes (kern_amx.c)
 * share. Needs AVX-512 F/BW/VL; included after cpu/simd256.h. */
#ifndef TL_CPU_PAIR512_H
#define TL_CPU_PAIR512_H

#include <immintrin.h>
#include <stdint.h>

/* 16 bytes from each group of a pair, group g's in the low half. */
AI __m256i rz_pair16(const void *g0, const void *g1) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)g0)),
                                   _mm_loadu_si128((const __m128i *)g1), 1);
}

/* The pair's 16 half floats at offset off of their blocks (d, or m). */
AI __m512 rz_halves(const uint8_t *b0, const uint8_t *b1, int off) {
    return _mm512_cvtph_ps(rz_pair16(b0 + off, b1 + off));
}

/* 32 bytes from each group of a pair, group g's in the low half. */
AI __m512i rz_load2(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)p0)),
                              _mm256_loadu_si256((const __m256i *)(const void *)p1), 1);
}

/* 8 bytes from each group of a pair, widened to 16 int32 (group g's low). */
AI __m512i rz_bytes8(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)p0),
                                                   _mm_loadl_epi64((const __m128i *)(const void *)p1)));
}

/* 16 bytes (8 rows of sub-block 2i, then of 2i+1) from each of two groups as
 * int16 pairs per row, for vpdpwssd against an activation pair. */
AI __m512i rz_pairs16(const uint8_t *p0, const uint8_t *p1) {
    const __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)p0), s1 = _mm_loadu_si128((const __m128i *)(const void *)p1);
    const __m128i i0 = _mm_unpacklo_epi8(s0, _mm_srli_si128(s0, 8)), i1 = _mm_unpacklo_epi8(s1, _mm_srli_si128(s1, 8));
    return _mm512_cvtepi8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(i0), i1, 1));
}

/* Q5_K's fifth bits (r8k layout, cpu/r8.c) into the unsigned quants of 32-byte
 * run k of chunk i: bit 2i of qh into the low nibbles' (ul), 2i+1 into the
 * high nibbles' (uh). qh: the pair's qh run k. */
AI void rz_q5k_bits(__m512i qh, int i, __m512i *ul, __m512i *uh) {
    const __m512i m16 = _mm512_set1_epi8(0x10), hs = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * i));
    *ul = _mm512_or_si512(*ul, _mm512_and_si512(_mm512_slli_epi16(hs, 4), m16));
    *uh = _mm512_or_si512(*uh, _mm512_and_si512(_mm512_slli_epi16(hs, 3), m16));
}

#endif
