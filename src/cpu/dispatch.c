/* cpu/dispatch: which instruction-set level this CPU and OS support, the
 * TL_CPU override, and assembling a tl_kernels table level by level. Reads
 * cpuid/xgetbv and the environment each call; keeps nothing. */
#include "cpu/kernels.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"scalar", "avx2", "avx512", "avx512-vnni"};

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* XCR0: which register states the OS saves on context switch. The CPU having
 * AVX is useless if the OS would lose the upper halves. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

tl_cpu_level tl_cpu_detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return TL_CPU_SCALAR;
    const int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx) return TL_CPU_SCALAR;
    const uint64_t xcr0 = read_xcr0();
    const int ymm_os = (xcr0 & 0x6) == 0x6;    /* SSE + AVX state */
    const int zmm_os = (xcr0 & 0xe6) == 0xe6;  /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return TL_CPU_SCALAR;
    const int avx2 = (b >> 5) & 1;
    const int f512 = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    if (!(ymm_os && avx2 && fma && f16c)) return TL_CPU_SCALAR;
    if (!(zmm_os && f512 && bw && vl && dq)) return TL_CPU_AVX2;
    return vnni ? TL_CPU_AVX512VNNI : TL_CPU_AVX512;
}
#else
tl_cpu_level tl_cpu_detect(void) { return TL_CPU_SCALAR; }
#endif

tl_cpu_level tl_cpu_choose(void) {
    const tl_cpu_level detected = tl_cpu_detect();
    const char *want = getenv("TL_CPU");
    if (!want) return detected;
    for (int l = TL_CPU_SCALAR; l <= TL_CPU_AVX512VNNI; l++)
        if (!strcmp(want, names[l])) return (tl_cpu_level)l < detected ? (tl_cpu_level)l : detected;
    return detected; /* unknown name: ignore rather than fail start-up */
}

void tl_kernels_init(tl_kernels *k, tl_cpu_level level) {
    const tl_cpu_level detected = tl_cpu_detect();
    if (level > detected) level = detected;
    if (level < TL_CPU_SCALAR) level = TL_CPU_SCALAR;
    memset(k, 0, sizeof *k);
    tl_kernels_fill_ref(k);
    if (level >= TL_CPU_AVX2) tl_kernels_fill_avx2(k);
    if (level >= TL_CPU_AVX512) tl_kernels_fill_avx512(k, level >= TL_CPU_AVX512VNNI);
    k->level = level;
    k->name = names[level];
}
