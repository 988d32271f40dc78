/* cpu/dispatch: which instruction-set level this CPU and OS support, the
 * TL_CPU override, and assembling a tl_kernels table level by level. Reads
 * cpuid/xgetbv and the environment each call, and asks Linux for the AMX
 * tile state where the CPU has it; keeps nothing. */
#include "cpu/kernels.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static const char *const names[] = {"scalar", "avx2", "avx512", "avx512-vnni", "avx512-bf16", "amx"};

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

/* XCR0: which register states the OS saves on context switch. The CPU having
 * AVX is useless if the OS would lose the upper halves. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux hands a process the 8 KiB of tile state only on request
 * (ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18); asking again is harmless,
 * and a refusal (an old kernel, a seccomp filter) just means no AMX. */
static int amx_permitted(uint64_t xcr0) {
    if ((xcr0 & 0x60000) != 0x60000) return 0; /* XTILECFG, XTILEDATA */
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#else
    return 0;
#endif
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
    if (!vnni) return TL_CPU_AVX512;
    const int amx = (d >> 24) & 1 && (d >> 25) & 1; /* AMX-TILE, AMX-INT8 */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return TL_CPU_AVX512VNNI;
    if (!((a >> 5) & 1)) return TL_CPU_AVX512VNNI;
    return amx && amx_permitted(xcr0) ? TL_CPU_AMX : TL_CPU_AVX512BF16;
}

/* Whether the fast mode's decode tiles stream without software prefetches
 * (cpu/r8_tile.h: measured on AMD Zen 4; Intel keeps them). The prefetches
 * change no result, only speed; TL_SW_PREFETCH=1 or 0 overrides. */
static int hw_stream(void) {
    const char *want = getenv("TL_SW_PREFETCH");
    if (want && (!strcmp(want, "0") || !strcmp(want, "1"))) return want[0] == '0';
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163; /* "AuthenticAMD" */
}
#else
tl_cpu_level tl_cpu_detect(void) { return TL_CPU_SCALAR; }
static int hw_stream(void) { return 0; }
#endif

tl_cpu_level tl_cpu_choose(void) {
    const tl_cpu_level detected = tl_cpu_detect();
    const char *want = getenv("TL_CPU");
    if (!want) return detected;
    for (int l = TL_CPU_SCALAR; l <= TL_CPU_AMX; l++)
        if (!strcmp(want, names[l])) return (tl_cpu_level)l < detected ? (tl_cpu_level)l : detected;
    return detected; /* unknown name: ignore rather than fail start-up */
}

tl_num_mode tl_num_choose(void) {
    const char *want = getenv("TL_NUMERICS");
    return want && !strcmp(want, "exact") ? TL_NUM_EXACT : TL_NUM_FAST;
}

void tl_kernels_init(tl_kernels *k, tl_cpu_level level, tl_num_mode mode) {
    const tl_cpu_level detected = tl_cpu_detect();
    if (level > detected) level = detected;
    if (level < TL_CPU_SCALAR) level = TL_CPU_SCALAR;
    memset(k, 0, sizeof *k);
    k->hw_stream = level >= TL_CPU_AVX2 && hw_stream(); /* read by the levels' fills */
    tl_mathfn_bind(&k->math, level >= TL_CPU_AVX2, mode == TL_NUM_FAST); /* first: a level's fill may replace entries */
    tl_kernels_fill_ref(k);
    if (mode == TL_NUM_FAST) {
        tl_kernels_fill_r8_ref(k);
        tl_kernels_fill_r8k_ref(k);
        tl_kernels_fill_r8h_ref(k);
    }
    if (level >= TL_CPU_AVX2) tl_kernels_fill_avx2(k, mode);
    if (level >= TL_CPU_AVX512) tl_kernels_fill_avx512(k, level >= TL_CPU_AVX512VNNI, mode);
    /* vdpbf16ps at the fma's rate: AMD's Zen 4 (measured); the Xeons with
     * AMX measured here issue it at half that rate */
    if (level >= TL_CPU_AVX512BF16) tl_kernels_fill_avx512bf16(k, mode, level < TL_CPU_AMX);
    if (level >= TL_CPU_AMX) tl_kernels_fill_amx(k, mode);
    k->level = level;
    k->mode = mode;
    k->name = names[level];
}

/* ---- what each mode's gemm reads (see kernels.h) ---- */

static int r8(const tl_kernels *k, tl_type t) { return k->mode == TL_NUM_FAST && tl_r8_supported(t); }
static int r8h(const tl_kernels *k, tl_type t) { return k->mode == TL_NUM_FAST && tl_r8h_supported(t); }
static int r8k(const tl_kernels *k, tl_type t) { return k->mode == TL_NUM_FAST && (t == TL_Q4_K || t == TL_Q5_K || t == TL_Q6_K); }
/* Whether t's gemm takes rows in groups of 8 (any of the fast layouts). */
static int grouped(const tl_kernels *k, tl_type t) { return r8(k, t) || r8k(k, t) || r8h(k, t); }

tl_vec_dot_fn tl_kern_dot_x8(const tl_kernels *k, tl_type t, int64_t rows) {
    return k->mode == TL_NUM_EXACT && rows % 8 == 0 ? k->vec_dot_x8[t] : NULL;
}

int tl_kern_packs(const tl_kernels *k, tl_type t) {
    return k->gemm[t] && (grouped(k, t) || tl_pack_supported(t));
}

int tl_kern_packs_matrix(const tl_kernels *k, tl_type t, int64_t rows) {
    return tl_kern_packs(k, t) && !tl_kern_dot_x8(k, t, rows);
}

int64_t tl_kern_packed_rows(const tl_kernels *k, tl_type t, int64_t nrows) {
    return grouped(k, t) ? tl_r8_rows(nrows) : nrows;
}

int tl_kern_pack(const tl_kernels *k, tl_type t, const void *src, void *dst, int64_t nrows, int64_t n) {
    if (r8k(k, t)) return t == TL_Q6_K ? tl_r8q6_pack(t, src, dst, nrows, n) : tl_r8k_pack(t, src, dst, nrows, n);
    if (r8h(k, t)) return tl_r8h_pack(t, src, dst, nrows, n);
    return r8(k, t) ? tl_r8_pack(t, src, dst, nrows, n) : tl_pack_rows32(t, src, dst, nrows, n);
}

int tl_kern_row_align(const tl_kernels *k, tl_type t) { return grouped(k, t) ? 8 : 1; }

size_t tl_kern_row_bytes(const tl_kernels *k, tl_type t, int64_t n) {
    if (r8h(k, t)) return tl_r8h_row_bytes(t, n);
    if (r8(k, t)) return tl_r8_row_bytes(t, n);
    return r8k(k, t) ? tl_r8k_row_bytes(t, n) : tl_row_size(t, n);
}

/* Whether t's activation rows carry the AMX copy of their quants. */
static int amx_act(const tl_kernels *k, tl_type t) { return k->level >= TL_CPU_AMX && r8k(k, t); }

size_t tl_kern_act_row_size(const tl_kernels *k, tl_type t, int64_t n) {
    const tl_type vt = tl_type_info(t)->vec_dot_type;
    if (amx_act(k, t)) return tl_amx_act_sums(n) + (((size_t)(n / QK_K) * 16 + 63) & ~(size_t)63);
    if (r8h(k, t)) return tl_r8h_act_row_size(t, n);
    return r8(k, t) ? tl_r8_act_row_size(n) : tl_act_row_size(vt, n);
}

void tl_kern_act_make(const tl_kernels *k, tl_type t, const float *x, void *row, int64_t n) {
    const tl_type vt = tl_type_info(t)->vec_dot_type;
    if (r8(k, t)) {
        if (k->r8_act) k->r8_act(x, row, n);
        else tl_r8_act_make(k->quantize[TL_Q8_1], x, row, n);
        return;
    }
    if (r8h(k, t)) {
        tl_r8h_act_make(t, x, row, n);
        return;
    }
    k->quantize[vt](x, row, n);
    tl_act_add_scales(vt, row, n);
    if (amx_act(k, t)) {
        const block_q8_K *b = row;
        uint8_t *q = (uint8_t *)row + tl_amx_act_off(n);
        uint16_t *sums = (uint16_t *)(void *)((uint8_t *)row + tl_amx_act_sums(n));
        for (int64_t i = 0; i < n / QK_K; i++) {
            memcpy(q + (size_t)i * QK_K, b[i].qs, QK_K);
            for (int j = 0; j < 8; j++) sums[8 * i + j] = (uint16_t)(b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
    }
}

/* ---- packed weight rows and gemm activation rows (see kernels.h) ---- */

typedef struct pack_fields {
    size_t block, m, qh, qs; /* bytes per block: whole, m, qh, qs (d is 2) */
} pack_fields;

static int fields32(tl_type t, pack_fields *f) {
    switch (t) {
    case TL_Q4_0: *f = (pack_fields){sizeof(block_q4_0), 0, 0, 16}; return 0;
    case TL_Q4_1: *f = (pack_fields){sizeof(block_q4_1), 2, 0, 16}; return 0;
    case TL_Q5_0: *f = (pack_fields){sizeof(block_q5_0), 0, 4, 16}; return 0;
    case TL_Q5_1: *f = (pack_fields){sizeof(block_q5_1), 2, 4, 16}; return 0;
    case TL_Q8_0: *f = (pack_fields){sizeof(block_q8_0), 0, 0, 32}; return 0;
    default: return -1;
    }
}

int tl_pack_rows32(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n) {
    pack_fields f;
    if (fields32(type, &f) || n % 32) return -1;
    const int64_t nb = n / 32;
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t g = 0; g < nb; g += 8) {
            const int64_t k = nb - g < 8 ? nb - g : 8;
            const uint8_t *b = s + (size_t)(r * nb + g) * f.block;
            uint8_t *o = d + (size_t)(r * nb + g) * f.block;
            for (int64_t j = 0; j < k; j++) {
                const uint8_t *bj = b + (size_t)j * f.block;
                memcpy(o + 2 * j, bj, 2);
                if (f.m) memcpy(o + 2 * k + 2 * j, bj + 2, 2);
                if (f.qh) memcpy(o + (2 + f.m) * k + 4 * j, bj + 2 + f.m, 4);
                memcpy(o + (2 + f.m + f.qh) * k + f.qs * j, bj + 2 + f.m + f.qh, f.qs);
            }
        }
    return 0;
}

int tl_pack_supported(tl_type type) {
    pack_fields f;
    return fields32(type, &f) == 0;
}

size_t tl_act_row_size(tl_type vt, int64_t n) {
    if (vt != TL_Q8_0 && vt != TL_Q8_1) return tl_row_size(vt, n);
    const size_t nb = (size_t)(n / 32);
    return tl_act_scales_off(vt, n) + nb * sizeof(float) * (vt == TL_Q8_1 ? 2 : 1);
}

void tl_act_add_scales(tl_type vt, void *row, int64_t n) {
    if (vt != TL_Q8_0 && vt != TL_Q8_1) return;
    const int64_t nb = n / 32;
    const size_t bs = vt == TL_Q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    uint8_t *p = row;
    float *ds = (float *)(void *)(p + tl_act_scales_off(vt, n)), *ss = ds + nb;
    for (int64_t i = 0; i < nb; i++) {
        uint16_t h;
        memcpy(&h, p + (size_t)i * bs, 2);
        ds[i] = tl_fp16_to_fp32(h);
        if (vt == TL_Q8_1) {
            memcpy(&h, p + (size_t)i * bs + 2, 2);
            ss[i] = tl_fp16_to_fp32(h);
        }
    }
}
