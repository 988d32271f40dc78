/* cpu/: the CPU's arithmetic: a kernel table per CPU level and numerics
 * mode (kernels.h, this file; dispatch.c chooses), the scalar references
 * (kern_ref.c), the AVX2 and AVX-512 kernels (kern_avx2.c, kern_avx512.c,
 * the only files built with wider instruction sets), the fast mode's packed
 * layouts and tiles (r8.c, r8_tile.h, tile32.h), the element-wise math and
 * attention (mathfn.c, attn512.h). Models are not known here.
 *
 * cpu/kernels: the table of CPU kernels chosen once at start-up from the
 * features this CPU has (scalar, AVX2, AVX-512, AVX-512 VNNI, AVX-512 BF16) and the numerics
 * mode (fast, or exact: llama.cpp's float order). Entries a level lacks fall
 * back to the level below, down to the scalar references. */
#ifndef TL_CPU_KERNELS_H
#define TL_CPU_KERNELS_H

#include <stdint.h>

#include "cpu/mathfn.h"
#include "quant/quant.h"

typedef enum tl_cpu_level {
    TL_CPU_SCALAR = 0,
    TL_CPU_AVX2 = 1,       /* AVX2 + FMA + F16C */
    TL_CPU_AVX512 = 2,     /* + AVX-512 F/BW/VL/DQ */
    TL_CPU_AVX512VNNI = 3, /* + AVX-512 VNNI */
    TL_CPU_AVX512BF16 = 4, /* + AVX-512 BF16 (vdpbf16ps) */
    TL_CPU_AMX = 5         /* + AMX tiles with INT8, the OS letting this process use them */
} tl_cpu_level;

/* dot(weight row w of `type`, activation row a in its vec_dot_type), n elements. */
typedef float (*tl_vec_dot_fn)(int64_t n, const void *w, const void *a);
/* The dots of nr weight rows (w, w + w_stride, ...) with nt activation rows
 * (a, a + a_stride, ...): y[t * y_stride + r] is bitwise what vec_dot gives for
 * the pair, whatever nr and nt, so results never depend on how a matmul is cut
 * into calls (batch invariance). The kernel tiles internally so each weight
 * block is unpacked once per few tokens and decode runs several independent
 * accumulation chains. Weight rows are in the packed layout where the type has
 * one (tl_pack_supported: the 32-block formats), else as stored; activation
 * rows are vec_dot_type rows, for Q8_0/Q8_1 followed by their scales as floats
 * (tl_act_row_size, tl_act_add_scales). Optional (NULL: vec_dot pair by pair). */
typedef void (*tl_gemm_fn)(int64_t n, const void *w, size_t w_stride, int nr, const void *a,
                           size_t a_stride, int nt, float *y, size_t y_stride);
/* nr packed rows of a signed 32-block format (Q4_0, Q5_0) -> nr packed Q8_0
 * rows (row stride tl_row_size(TL_Q8_0, n)) on which gemm[TL_Q8_0] gives
 * bitwise what gemm[type] gives on the originals. */
typedef void (*tl_widen_fn)(const void *w, size_t w_stride, int nr, int64_t n, void *out);
/* f32 row -> activation format (Q8_0, Q8_1, Q8_K, F16, BF16), n elements. */
typedef void (*tl_quantize_fn)(const float *x, void *y, int64_t n);

/* Numerics modes (docs/NUMERICS.md). Exact: every dot in the float order of
 * llama.cpp's CPU kernels, bitwise. Fast: the 32-block formats through the r8
 * layout below (exact integer block sums, one fma per block), other types as
 * in exact. Either way a row's result depends on its own data alone. */
typedef enum tl_num_mode { TL_NUM_FAST = 0, TL_NUM_EXACT = 1 } tl_num_mode;

/* Bytes ahead of a weight stream that the tiles reading it from memory ask
 * for, into L2 (cpu/r8_tile.h's decode tiles on Intel, cpu/kern_amx.c's
 * gemm). On a Xeon with AMX (2026-12-07), the MoE files' decode from DRAM,
 * in turn: 1024 ahead +6-7%, 2048 +11-15%, 3072 +6-9%, 4096 +3-9%, 16384
 * +0-4% and 32768 -1% against 8192 (the earlier choice, taken on the AMD
 * EPYC, where 2048 ahead into L1 had decoded SmolLM2 Q4_0 at 0.6x); the AMX
 * gemm at 16 tokens (a 16-sequence step's dense matrices) 11.5 -> 12.4 GB/s. */
#define TL_WEIGHT_PREFETCH 2048

typedef struct tl_kernels {
    tl_cpu_level level;
    tl_num_mode mode;
    const char *name;                     /* "scalar", "avx2", "avx512", "avx512-vnni", "avx512-bf16", "amx" */
    int hw_stream;                        /* decode tiles leave streaming to the CPU's prefetchers (dispatch.c) */
    tl_vec_dot_fn vec_dot[TL_TYPE_COUNT]; /* indexed by weight type; NULL: unsupported */
    /* the exact mode's dot for experts (ggml's mul_mat_id) where it is not
     * vec_dot's order (F32: ggml_vec_dot_f32, not tinyBLAS); else NULL */
    tl_vec_dot_fn vec_dot_id[TL_TYPE_COUNT];
    /* the exact mode's dot for matrices llama.cpp repacks on AVX2 (IQ4_NL and
     * MXFP4 with rows a multiple of 8: iq4_nl_8x8, mxfp4_8x8, for prompts,
     * decode and experts alike): one chain, acc = fma(block's exact integer
     * sum, d_w*d_a, acc) block by block; else NULL */
    tl_vec_dot_fn vec_dot_x8[TL_TYPE_COUNT];
    tl_gemm_fn gemm[TL_TYPE_COUNT];       /* tiles of rows x tokens on packed rows; may be NULL */
    /* F32 rows (stride w_stride floats) x F32 activations (stride a_stride
     * floats) in vec_dot[TL_F32]'s order, y[t * y_stride + r]; may be NULL */
    void (*tile_f32)(int64_t n, const float *w, size_t w_stride, int nr, const float *a, size_t a_stride, int nt,
                     float *y, size_t y_stride);
    tl_widen_fn widen[TL_TYPE_COUNT];     /* packed rows -> packed Q8_0 rows; may be NULL */
    /* The fast mode's prompts: a row tile's packed rows unpacked once
     * (unpack, into tl_kern_unpacked_bytes) for a gemm that then reads them
     * for every token (wgemm, the same bits as gemm); NULL where gemm
     * unpacks as it goes */
    tl_widen_fn unpack[TL_TYPE_COUNT];
    tl_gemm_fn wgemm[TL_TYPE_COUNT];
    tl_quantize_fn quantize[TL_TYPE_COUNT]; /* indexed by activation type */
    /* tl_r8_act_make's row in one pass (the same bytes); NULL: tl_r8_act_make
     * over quantize[TL_Q8_1] */
    void (*r8_act)(const float *x, void *row, int64_t n);
    /* f16 x f16 dot with f32 accumulation (attention scores against an f16 K cache) */
    float (*dot_f16)(int64_t n, const uint16_t *x, const uint16_t *y);
    /* the same for four rows x, x + x_stride, ... against one y; may be NULL */
    void (*dot_f16_x4)(int64_t n, const uint16_t *x, size_t x_stride, const uint16_t *y, float out[4]);
    /* the element-wise math and attention of cpu/mathfn.h at this level */
    tl_mathfn math;
} tl_kernels;

/* The packed layout of the 32-block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): each
 * row in groups of 8 blocks (fewer in the last), stored field by field: the 8 d,
 * then the 8 m (Q4_1/Q5_1), the 8 qh (Q5), the 8 qs. One F16C conversion then
 * gives eight blocks' scales, where the GGUF layout needs one per block. Same
 * bytes per row. Returns 0, or -1 for a type without a packed layout. */
int tl_pack_rows32(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n);
int tl_pack_supported(tl_type type);
/* Activation rows as gemm takes them: the vec_dot_type row; for Q8_0 and Q8_1
 * then each block's d as a float, then (Q8_1) each block's s. Other types: the
 * row alone (add_scales does nothing). */
size_t tl_act_row_size(tl_type vt, int64_t n);
/* where the float scales start: after the blocks, aligned for floats */
static inline size_t tl_act_scales_off(tl_type vt, int64_t n) { return (tl_row_size(vt, n) + 3) & ~(size_t)3; }
void tl_act_add_scales(tl_type vt, void *row, int64_t n);

/* ---- fast numerics: the r8 layout of the 32-block formats (cpu/r8.c) ----
 * Rows in groups of 8 (the last padded with zero rows), each group block by
 * block: 8 d (f16), 8 m (Q4_1/Q5_1), 32 qh bytes (Q5: byte p, bit k = the
 * fifth bit of quant vector k's byte p), then the quants with
 * 4 bytes of each row in turn, so that 32-bit lane r of a vector is row r.
 * Same bytes per row as the GGUF layout; a group is 8 row strides. gemm on it
 * takes r8 activation rows: n int8 quants (Q8_1's), then per block d, s (as
 * Q8_1 rounds it) and the int32 sum. Its float order is in cpu/r8.c. */
int tl_r8_supported(tl_type type);
int64_t tl_r8_rows(int64_t nrows); /* rows in the packed copy: nrows rounded up to 8 */
/* The table formats' groups (cpu/r8.c): IQ4_NL as Q4_0; MXFP4 per block e[8]
 * then the quants (17 bytes per row and block, as GGUF); IQ4_XS per superblock
 * d[8] f16, then per sub-block sc[8] (int8) and the quants: 138 bytes per row
 * and superblock (GGUF: 136). */
#define R8_XS_BLK 136
#define R8_XS_SB 138
size_t tl_r8_row_bytes(tl_type type, int64_t n); /* bytes per packed row (a group is 8) */
float tl_r8_e8m0(uint8_t e); /* MXFP4's scale as the fast mode takes it: 2^(e-128), 0 for e < 2 */
int tl_r8_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n);
size_t tl_r8_act_row_size(int64_t n);
void tl_r8_act_make(tl_quantize_fn q8_1, const float *x, void *row, int64_t n);
void tl_kernels_fill_r8_ref(tl_kernels *k);
/* Q4_K and Q6_K in the r8 layout (r8k, cpu/r8.c): groups of 8 rows, per
 * superblock the rows' scales, then the quants 4 bytes of each row in turn;
 * 148 bytes per row and superblock for Q4_K (GGUF: 144), 210 for Q6_K (the
 * same). Their gemm takes Q8_K rows. */
size_t tl_r8k_row_bytes(tl_type type, int64_t n);
int tl_r8k_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n);
int tl_r8q6_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n);
/* Where a Q6_K superblock of 8 r8 rows keeps its quants (after d and the
 * scales, 144 bytes): 32 bytes (4 of each row) of ql chunk c (0..3) or qh
 * chunk h (0..1) at column k (0..7). For each h and k in turn: ql chunks 2h
 * and 2h + 1, then qh chunk h, the order the decode tile reads them, so a
 * group's bytes are read in address order (cpu/r8_tile.h). */
static inline size_t tl_r8q6_ql(int c, int k) { return 144 + 96 * (size_t)(8 * (c >> 1) + k) + 32 * (size_t)(c & 1); }
static inline size_t tl_r8q6_qh(int h, int k) { return 144 + 96 * (size_t)(8 * h + k) + 64; }
/* Q6_K's unpacked copy (kernels.h unpack/wgemm, AVX-512 VNNI): per pair of
 * 8-row groups and superblock, the 16 rows' d as f32 (64 bytes), 16
 * sub-blocks x 16 rows of int32 scales (1024), 8 x 16 int16 pairs of them
 * (sub-blocks 2j, 2j+1: 512), then element runs of 4 x 16 rows as unsigned
 * 6-bit bytes in element order (4096). */
#define TL_R8Q6W_SB 5696
static inline size_t tl_r8q6w_bytes(int64_t nrows, int64_t n) {
    return (size_t)((nrows + 15) / 16) * (size_t)(n / 256) * TL_R8Q6W_SB;
}
void tl_kernels_fill_r8k_ref(tl_kernels *k);
/* The AVX-512 VNNI tiles of Q4_K (q5 0) or Q5_K (1), and Q6_K, on r8k rows:
 * what the AMX gemm (cpu/kern_amx.c) leaves to them, a few tokens or an odd group. */
void tl_r8k_gemm_zmm(int q5, int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                     size_t ys);
void tl_r8q6_gemm_zmm(int64_t n, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y, size_t ys);
void tl_kernels_fill_amx(tl_kernels *k, tl_num_mode mode);
/* At the AMX level a K-quant's Q8_K activation row carries, after its blocks,
 * a copy of its quants on a cache line (offset tl_amx_act_off): the tile
 * loads read 64 aligned bytes per token, where a block's quants sit 4 bytes
 * past its start. Rows made by tl_kern_act_make, sized by tl_kern_act_row_size. */
static inline size_t tl_amx_act_off(int64_t n) { return ((size_t)(n / QK_K) * sizeof(block_q8_K) + 63) & ~(size_t)63; }
/* ... then, per superblock, its sub-blocks' sums as four int16 pairs
 * (bsums[4i] + bsums[4i+1], bsums[4i+2] + bsums[4i+3]) for the mins' term. */
static inline size_t tl_amx_act_sums(int64_t n) { return tl_amx_act_off(n) + (((size_t)n + 63) & ~(size_t)63); }
/* F16 and BF16 in the r8 layout (r8h, cpu/r8.c): groups of 8 rows. F16
 * element by element the 8 rows' values (same bytes per row as GGUF), its
 * gemm taking the f32 activation rows as they are. BF16 pair by pair, the 8
 * rows' two values (a row padded to an even length with a zero), its gemm
 * taking bf16 activation rows (vdpbf16ps's operands; tl_r8h_act_make). */
int tl_r8h_supported(tl_type type);
int tl_r8h_pack(tl_type type, const void *src, void *dst, int64_t nrows, int64_t n);
size_t tl_r8h_row_bytes(tl_type type, int64_t n);
size_t tl_r8h_act_row_size(tl_type type, int64_t n);
void tl_r8h_act_make(tl_type type, const float *x, void *row, int64_t n);
void tl_kernels_fill_r8h_ref(tl_kernels *k);

/* What a table's gemm for weight type t reads, whatever the mode: whether it
 * takes a packed copy, how many rows that copy has, how to make it, and the
 * activation rows it takes (bytes, and how to make one from floats). */
int tl_kern_packs(const tl_kernels *k, tl_type t);
/* The exact mode's dot for a matrix of type t and rows rows (per expert)
 * that llama.cpp repacks (vec_dot_x8), or NULL. Such a matrix is read as the
 * file holds it, row by row: never packed, never through gemm. */
tl_vec_dot_fn tl_kern_dot_x8(const tl_kernels *k, tl_type t, int64_t rows);
/* Whether a matrix of type t and rows rows (per expert) gets a packed copy:
 * its gemm takes one, and it is not such a matrix. */
int tl_kern_packs_matrix(const tl_kernels *k, tl_type t, int64_t rows);
int64_t tl_kern_packed_rows(const tl_kernels *k, tl_type t, int64_t nrows);
int tl_kern_pack(const tl_kernels *k, tl_type t, const void *src, void *dst, int64_t nrows, int64_t n);
size_t tl_kern_act_row_size(const tl_kernels *k, tl_type t, int64_t n);
void tl_kern_act_make(const tl_kernels *k, tl_type t, const float *x, void *row, int64_t n);
/* Rows a gemm call must start at a multiple of (8 for r8, else 1). */
int tl_kern_row_align(const tl_kernels *k, tl_type t);
/* Bytes of one row in the layout the gemm reads (a packed group is 8 rows). */
size_t tl_kern_row_bytes(const tl_kernels *k, tl_type t, int64_t n);

/* The best level this CPU supports (cpuid + OS support for the registers). */
tl_cpu_level tl_cpu_detect(void);
/* The level requested by the environment variable TL_CPU (scalar, avx2,
 * avx512, avx512-vnni, avx512-bf16, amx), capped at what the CPU supports; else the detected one. */
tl_cpu_level tl_cpu_choose(void);
/* Fills k for level (capped at the detected level) and mode. */
void tl_kernels_init(tl_kernels *k, tl_cpu_level level, tl_num_mode mode);
/* TL_NUMERICS (fast, exact) if set and valid, else fast. */
tl_num_mode tl_num_choose(void);

/* Per-ISA fillers, each defined in its own file compiled with its own flags.
 * They overwrite the entries they implement and leave the rest. */
void tl_kernels_fill_ref(tl_kernels *k);
void tl_kernels_fill_avx2(tl_kernels *k, tl_num_mode mode);
void tl_kernels_fill_avx512(tl_kernels *k, int vnni, tl_num_mode mode);
/* The BF16 gemm with vdpbf16ps (fast mode; the same bits as the emulation
 * the levels below run, see cpu/r8.c); with dp_attn also a quantized V's
 * sums in the fast attention (cpu/attn512.h), for cores where vdpbf16ps
 * issues as often as an fma. */
void tl_kernels_fill_avx512bf16(tl_kernels *k, tl_num_mode mode, int dp_attn);

#endif
