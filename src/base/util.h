/* util: the error record every library call fills, checked arithmetic, and
 * half/bfloat16 conversions. Owns nothing; pure helpers shared by all modules. */
#ifndef TL_UTIL_H
#define TL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenloop.h"

/* Fills err (may be NULL) with a printf-style message and returns status. */
int tl_fail(tl_error *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Overflow-checked arithmetic on sizes read from untrusted files: 0 on success. */
/* Little-endian integers from unaligned bytes (GGUF's byte order). */
static inline uint64_t tl_le_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t tl_le_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint16_t tl_le_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline int tl_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int tl_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* IEEE half <-> float, bit-exact with ggml's (round to nearest even). */
static inline float tl_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t tl_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* result is subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - ((127 - 15) << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float tl_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet: as ggml_compute_fp32_to_bf16. */
static inline uint16_t tl_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

/* Monotonic clock in seconds. */
double tl_now(void);

/* A cost curve through measured points: y[i] for the sizes i in [1, n_max]
 * with seen[i] != 0, read at size n. The points are first made
 * non-decreasing (a size measured in a fast moment must not look cheaper
 * than a smaller one); between two points the straight line, beyond the last
 * the mean slope from the first (with one point, each size past it adds a
 * quarter of it): the last two alone, say 2 and 3 rows in a noisy moment,
 * put 16 rows at 1.5x their cost, and long guesses of copied text were
 * never tried. Below the first point, or with none, 0: unknown (a
 * prompt's cost says nothing of a one-token call's). */
double tl_curve_at(const double *y, const int *seen, int n_max, int n);

/* Large zeroed buffers (the KV cache, packed weights) on 2 MiB pages where
 * the kernel grants them (madvise; THP is often "madvise" only): decode reads
 * the KV cache's 16-position blocks scattered through the pool and streams
 * the weights, and with 4 KiB pages every few KiB cost a TLB miss. Pages are
 * zeroed lazily, when first touched. NULL when out of memory. */
void *tl_big_alloc(size_t n);
void tl_big_free(void *p);
/* Drops this process's copies of the whole pages inside [p, p + n) of a
 * read-only file mapping: a later read faults them in from the file again.
 * For weights whose packed copy is all that is read (packed.c), so that a
 * model is not resident twice. The range is also kept off huge pages: the
 * kernel maps a file's 2 MiB folios whole when it can, so one embedding row
 * read from a released tied output would bring 2 MiB of it back. */
void tl_release_pages(const void *p, size_t n);
/* Asks for small pages on the first `first` bytes of [p, p + n) of a
 * tl_big_alloc buffer (rounded out to whole 2 MiB pages): memory there is
 * then resident as it is touched, 4 KiB at a time. */
void tl_small_pages(void *p, size_t n, size_t first);

#endif
