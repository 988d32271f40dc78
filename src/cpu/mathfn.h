/* cpu/mathfn: the element-wise functions of the forward pass (SwiGLU, softmax,
 * the attention-weighted sum of V) computed in exactly the float operation
 * order of llama.cpp's x86 AVX2 CPU backend, so that our activations round the
 * same way its do. Each has an AVX2+FMA path and a scalar path (fmaf) that
 * give bitwise the same results. */
#ifndef TL_CPU_MATHFN_H
#define TL_CPU_MATHFN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* exp(x) by the polynomial ggml uses on x86 (ARM optimized-routines' expf:
 * max error ~1.5 ulp), bitwise equal to its 8-lane AVX2 version. */
float tl_expf_fast(float x);

/* y[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)). */
void tl_swiglu(int n, float *y, const float *g, const float *u, int avx2);

/* s[j] = exp(s[j] - max) for j < n; returns their sum, added per group of 8
 * (pairwise within the group, the group sums in double) as ggml does. */
double tl_softmax_exp(int n, float *s, float max, int avx2);

/* s[j] = f16_round(s[j] * scale) for j < n. */
void tl_scale_round_f16(int n, float *s, float scale, int avx2);

/* out[d] = sum_j p[j] * v_j[d] over j < n, v_j = f16 row j (stride
 * v_stride elements) of width hd: 8 partial sums by j mod 8, each a chain of
 * fused multiply-adds in j order, then added pairwise (tinyBLAS's order).
 * acc is scratch of 8 * hd floats. */
void tl_attn_pv(int n, int hd, const float *p, const uint16_t *v, int64_t v_stride, float *acc,
                float *out, int avx2);

/* tl_attn_pv over a paged cache: p[j] weighs position j0 + j, whose row is
 * row (blk[(j0+j)/bs]*bs + (j0+j)%bs) of v (blk NULL: row j0 + j). The
 * partial sums still go by j mod 8. */
void tl_attn_pv_paged(int n, int hd, const float *p, const uint16_t *v, int64_t v_stride,
                      const int32_t *blk, int bs, int j0, float *acc, float *out, int avx2);

/* ggml's GELU table: for every f16 bit pattern h, f16(gelu_tanh(h)). */
void tl_gelu_table(uint16_t *table);

/* y[i] = gelu(g[i]) * u[i] as ggml's GeGLU with its table: 0 for g <= -10,
 * g*u for g >= 10, else table[f16(g)] * u. */
void tl_geglu(int n, float *y, const float *g, const float *u, const uint16_t *table, int avx2);

/* The fast numerics' attention of T consecutive query tokens of one sequence
 * against one KV head: the G query heads that share it in one pass over the
 * keys, each block of K and V widened to f32 once for all of them, an online
 * softmax over blocks of bs positions (by absolute position). Token i sits at
 * pos0 + i and sees keys lo_i..pos0+i (lo_i = pos_i - n_swa + 1 with a sliding
 * window). Per (token, head) and block: scores as one 8-lane fma chain each
 * (f32 q, widened keys) times scale, m' = max(m, block max), alpha =
 * exp(m - m'), p = exp(s - m'), l = l*alpha + (the block's p as two 8-lane
 * vectors, keys j and j+8 added lane by lane, then the x86 horizontal-sum
 * tree ((0+4)+(2+6))+((1+5)+(3+7))), o = o*alpha then
 * o = fma(p_j, v_j, o) in key order; finally o * (1/l). A row's steps depend on
 * its position alone, never on T or its neighbours. hd is a multiple of 8 and
 * bs at most 16; the AVX2 and scalar paths give the same bits.
 * A quantized V is summed as bf16 pairs would sum it (tl_attn_vw): per key
 * j and 32-dimension group g a weight w = p_j x d_jg rounded to bf16 (to
 * nearest even; 0 below 2^-100 in magnitude), the quants as they are (exact
 * in bf16), o = fma(w, q_j, o) in key order; a block starts from o x alpha
 * (0 below 2^-100; o itself when alpha is 1). Each product is exact and
 * every partial sum 0 or a multiple of 2^-123, never subnormal, so
 * vdpbf16ps, which flushes subnormals, gives these bits two keys at a time
 * (the earlier key in the pair's odd slot, which it adds first).
 * A quantized K is scored in integers, as llama.cpp's CPU attention scores
 * it (its q rounded to K's dot type): each query row is rounded per 32
 * dimensions g (dq_g = max|q|/127, q8 = q*(1/dq_g) to nearest even; 0 for a
 * zero group), and a key's score chain is, over g in order from 0,
 * acc = fma((float)(the exact sum of q8 * k8 over g), dq_g * dk_g, acc),
 * k8 and dk_g the cache's quants (Q4_0: nibble - 8) and the block's d. With
 * VNNI one instruction takes 64 of those products against 16 f32 fmas.
 *
 * The keys go in segments of TL_ATTN_SEG absolute positions: each segment's
 * blocks start from a fresh state (m = -inf, l = 0, o = 0), and the segments'
 * states are folded in position order (tl_attn_merge) before the division by
 * l. A context within one segment never folds. The segments let one token's
 * keys be split between threads (seg below) with the same bits. */
#define TL_ATTN_SEG 512
/* What a KV cache element is, as the fast attention reads it. */
enum { TL_ATTN_F16 = 0, TL_ATTN_Q8_0 = 1, TL_ATTN_Q4_0 = 2 };
/* Bytes of n elements (n a multiple of 32 when quantized). */
static inline size_t tl_attn_fmt_bytes(int fmt, int n) {
    return fmt == TL_ATTN_Q8_0 ? (size_t)n / 32 * 34 : fmt == TL_ATTN_Q4_0 ? (size_t)n / 32 * 18 : (size_t)n * 2;
}
/* Bytes of a K block as the integer scores read it: 16 slots, per group g
 * (at g*16*34 or g*16*18) the slots' d (f16), then the quants as 4-byte runs
 * [run i/4][slot][i%4] (Q4_0: byte i holds elements i and i + 16), so that a
 * 64-byte load gives four consecutive quants of every slot. The transposed
 * cache (k_tr, bs 16) holds its blocks so. */
static inline size_t tl_attn_kint_bytes(int fmt, int hd) { return tl_attn_fmt_bytes(fmt, hd) * 16; }
/* Offset of quant byte i of slot s within a group's quants, bs slots (the
 * transposed cache's layout; 16 in tl_attn_kint_bytes'). */
static inline size_t tl_attn_kq_at(int bs, int s, int i) { return (size_t)(i / 4) * 4 * bs + 4 * (size_t)s + i % 4; }
/* Floats of a query row rounded for them: dq[hd/32], the groups' sums of q8
 * (int32) [hd/32], the q8 (int8) [hd]. */
static inline size_t tl_attn_qrec_floats(int hd) { return (size_t)hd / 32 * 2 + (size_t)(hd + 3) / 4; }
typedef struct tl_attn_rows {
    int hd, G, bs, T;
    const float *q;          /* token i, head h: q + i*q_tok + h*q_stride (hd floats) */
    size_t q_stride, q_tok;
    float scale;
    const void *k, *v;       /* position p's row at byte (blk[p/bs]*bs + p%bs) * k_stride
                              * (v_stride) from k (v), the head's first byte */
    size_t k_stride, v_stride;
    int k_fmt, v_fmt;        /* TL_ATTN_F16 (0), TL_ATTN_Q8_0, TL_ATTN_Q4_0: ggml's blocks of
                              * 32 (d as f16, then the quants; hd a multiple of 32) */
    int k_tr;                /* K kept transposed per block (k at the head's first byte of
                              * the block at blk[p/bs]*bs*k_stride, head h's at h*bs*(its
                              * row bytes)). f16: element d of slot s at d*bs + s. Quantized:
                              * per 32-element group g (at g*bs*block bytes), the bs slots'
                              * d (f16), then quant byte i of slot s (Q8_0: element i;
                              * Q4_0, i < 16: elements i (low nibble) and i + 16 (high),
                              * as a Q4_0 block holds them) at (i/4)*4*bs + 4*s + i%4 */
    const int32_t *blk;
    int pos0, n_swa;         /* n_swa 0: no window */
    float *out;              /* like q: out + i*out_tok + h*out_stride */
    size_t out_stride, out_tok;
    float *scratch;          /* tl_attn_scratch(hd, G, bs, T) floats */
    int seg;                 /* 0: every key. s + 1: segment s's keys alone, its state
                              * left as it is: o (not divided by l) in out, and m, l of
                              * token i, head h in part[2*(i*G + h)], part[2*(i*G + h) + 1] */
    float *part;
    const float *sinks;      /* [G]: head h's sink logit (tl_attn_sink) before the division,
                              * or NULL; left out of a segment's state (seg > 0) */
} tl_attn_rows;
/* Whole blocks a level's multi-block function takes at once (tl_attn_drive). */
#define TL_ATTN_NB 4
/* The scratch: the widened blocks' K and V (TL_ATTN_NB x 16 x hd floats
 * each), the rows' state, their rounded q, then for a quantized V the
 * blocks' d as floats ([block][group][slot]) and the bf16 pairs a level may
 * widen V into (8 x hd floats a block: tl_attn_vb). */
static inline size_t tl_attn_scratch_tail(int hd, int G, int T) {
    return 2 * (size_t)TL_ATTN_NB * 16 * hd + 4 * (size_t)G * T + (size_t)G * T * hd +
           (size_t)G * T * tl_attn_qrec_floats(hd);
}
static inline size_t tl_attn_scratch(int hd, int G, int bs, int T) {
    (void)bs; /* blocks are widened to 16 slots whatever bs (at most 16) */
    return tl_attn_scratch_tail(hd, G, T) + (size_t)TL_ATTN_NB * 16 * (size_t)(hd / 32) +
           (size_t)TL_ATTN_NB * 8 * hd + 16;
}
/* A quantized V's weight: x (= p x d) rounded to bf16, to nearest even, or
 * 0 below 2^-100 in magnitude (mathfn.h's attention; |x| < 2^16). */
static inline float tl_attn_vw(float x) {
    if (!(x >= 0x1p-100f || x <= -0x1p-100f)) return 0.0f;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* A quantized V's sum at a block's start: o x alpha, 0 below 2^-100. */
static inline float tl_attn_vo(float o, float alpha) {
    if (alpha == 1.0f) return o;
    const float x = o * alpha;
    return x >= 0x1p-100f || x <= -0x1p-100f ? x : 0.0f;
}
void tl_attn_online(const tl_attn_rows *a, int avx2);

/* Token i's keys: lo..hi (within a->seg's segment when it is set); empty
 * when lo > hi. */
void tl_attn_keys(const tl_attn_rows *a, int i, int *lo, int *hi);
/* Folds one segment's state (m, l, o) into an accumulated one (ma, la, oa):
 * an empty accumulator (ma = -inf) takes it as it is, else with m' = max,
 * l = la*exp(ma - m') + l*exp(m - m'), o_d = oa_d*exp(ma - m') + o_d*exp(m - m').
 * Empty segment states (m = -inf) are the caller's to skip. */
void tl_attn_merge(int hd, float *ma, float *la, float *oa, float m, float l, const float *o);
/* A sink (gpt-oss): a logit s in the softmax that weighs no value, folded
 * into a finished row's state (m, l, o) as tl_attn_merge folds a state of
 * m = s, l = 1, o = 0: the larger side's factor is exactly 1, so with
 * m' = max(m, s), l = l*exp(m - m') + exp(s - m') and o_d = o_d*exp(m - m').
 * Once per row, after all its segments, before the division. */
void tl_attn_sink(int hd, float *m, float *l, float *o, float s);
/* out = o * (1/l): a row's last step, whether its segments were folded here
 * or by the thread that finished its last one. */
void tl_attn_divide(int hd, const float *o, float l, float *out);
/* Whether K is scored in integers (a quantized K), and the query row a
 * level's block function takes for token i, head h: its f32 q, or with a
 * quantized K its rounded record (tl_attn_qrec_floats), made by begin. */
static inline int tl_attn_kint(const tl_attn_rows *a) { return a->k_fmt != TL_ATTN_F16; }
/* (i, h)'s record in a->scratch, after the widened blocks and the state
 * (mathfn.c's attn_state): [T][G] of them. */
static inline float *tl_attn_qrec(const tl_attn_rows *a, int i, int h) {
    const size_t n = (size_t)a->G * a->T;
    return a->scratch + 2 * (size_t)TL_ATTN_NB * 16 * a->hd + 4 * n + n * (size_t)a->hd +
           (size_t)(i * a->G + h) * tl_attn_qrec_floats(a->hd);
}
/* For a quantized V, the d's ([group][slot]) and the bf16 pairs of the
 * block whose widened V is at vf (tl_attn_drive's vf + k x 16 x hd). */
static inline size_t tl_attn_vblock(const tl_attn_rows *a, const float *vf) {
    return (size_t)(vf - (a->scratch + (size_t)TL_ATTN_NB * 16 * a->hd)) / (16 * (size_t)a->hd);
}
static inline float *tl_attn_vd(const tl_attn_rows *a, const float *vf) {
    return a->scratch + tl_attn_scratch_tail(a->hd, a->G, a->T) + tl_attn_vblock(a, vf) * 16 * (size_t)(a->hd / 32);
}
static inline float *tl_attn_vb(const tl_attn_rows *a, const float *vf) {
    return a->scratch + tl_attn_scratch_tail(a->hd, a->G, a->T) + (size_t)TL_ATTN_NB * 16 * (size_t)(a->hd / 32) +
           tl_attn_vblock(a, vf) * 8 * (size_t)a->hd;
}
static inline const float *tl_attn_qrow(const tl_attn_rows *a, int i, int h) {
    if (!tl_attn_kint(a)) return a->q + (size_t)i * a->q_tok + (size_t)h * a->q_stride;
    return tl_attn_qrec(a, i, h);
}
/* A level's pass keeps its state in a->scratch: begin clears it and the
 * outputs (and rounds the query rows for a quantized K) and returns m
 * ([T][G]; l follows it); fold, at a segment
 * boundary, folds every row's state into the accumulated one and starts the
 * next segment; finish divides by l (or, with a->seg, leaves the state in
 * out and part). folded: whether fold was called. */
float *tl_attn_begin(const tl_attn_rows *a);
void tl_attn_fold(const tl_attn_rows *a, float *m);
void tl_attn_finish(const tl_attn_rows *a, float *m, int folded);

/* tl_attn_online's loop with a level's parts: widen makes the block at b0
 * (positions ws..we live) into kt (K transposed, kt[d*16 + slot]) and vf (V
 * rows, vf[slot*hd + d]); rows takes R (<= rmax <= 8) query rows with the
 * same live slots st..en of the block, each row's float operations those of
 * the scalar reference in mathfn.c. */
/* kt: the K block widened to f32, kt[d*16 + slot]; or with a quantized K
 * the block in tl_attn_kint_bytes' layout (slots outside ws..we zero). */
typedef void (*tl_attn_widen_fn)(const tl_attn_rows *a, int b0, int ws, int we, float *kt, float *vf);
typedef void (*tl_attn_block_fn)(const tl_attn_rows *a, int R, const float *const *q, float *const *o,
                                 float *const *m, float *const *l, int st, int en, const float *kt, const float *vf);
/* multi (NULL where a level has none) takes nb (<= TL_ATTN_NB) consecutive
 * blocks whose every slot is live for all R rows, block k's keys at
 * kt + k*16*hd and V at vf + k*16*hd: bitwise nb calls of rows, without
 * the trips of o, m and l through memory between them. */
typedef void (*tl_attn_multi_fn)(const tl_attn_rows *a, int R, const float *const *q, float *const *o,
                                 float *const *m, float *const *l, int nb, const float *kt, const float *vf);
void tl_attn_drive(const tl_attn_rows *a, int rmax, tl_attn_widen_fn widen, tl_attn_block_fn rows,
                   tl_attn_multi_fn multi);
/* A quantized K block in tl_attn_kint_bytes' layout, from either cache
 * layout: the transposed one at bs 16 as it is. */
void tl_attn_kint_block(const tl_attn_rows *a, int b0, int ws, int we, uint8_t *kt);
#if defined(__x86_64__) || defined(__i386__)
/* The AVX2 widening (for levels above AVX2 too). */
void tl_attn_widen_avx2(const tl_attn_rows *a, int b0, int ws, int we, float *kt, float *vf);
/* Asks for the K/V of the block some blocks after b0 (the widening's, and
 * the levels that read the cache's blocks as they are). */
void tl_attn_prefetch(const tl_attn_rows *a, int b0);
#endif

/* RMSNorm of one row: out[i] = (x[i] * scale) * w[i], scale = 1/sqrt(mean of
 * squares + eps). Exact: ggml's sum, (float)(x*x) in one double chain. Fast:
 * the same float squares in 16 double lanes by i mod 16, the lanes added i+8,
 * i+4, i+2, i+1 (no latency chain; the float mean almost never differs from
 * ggml's). out may be x. */
void tl_rmsnorm_exact(float *out, const float *x, const float *w, int n, float eps);
void tl_rmsnorm_fast(float *out, const float *x, const float *w, int n, float eps);
/* RoPE on n_heads heads of head_dim (stride) floats, their first n_rot
 * rotated by cs (cos, sin per pair): pairs (2i, 2i+1), or (i, i + n_rot/2)
 * with neox, in llama.cpp's fused float steps. */
void tl_rope(float *v, int n_heads, int head_dim, int n_rot, const float *cs, int neox);
/* f32 -> f16, round to nearest even (the KV cache's store). */
void tl_f16_row(const float *x, uint16_t *y, int64_t n);
/* x (n a power of two, at least 8) times the orthonormal Walsh-Hadamard
 * matrix, in ggml's order (ggml_compute_forward_fwht): x * (1/sqrt(n)), then
 * the butterflies (u + w, u - w) for strides 1, 2, ... n/2. Each stage is
 * elementwise, so every vector width gives these bits. */
void tl_fwht(float *x, int n);

/* o[i] = y[i] * w (first) or o[i] + y[i] * w, the product rounded before the
 * add (ggml_mul, then ggml_add: a mixture's weighted sum of its experts). */
void tl_mul_add(int n, float *o, const float *y, float w, int first);

/* The functions above bound to one level (scalar or AVX2) and numerics mode
 * (fast selects rmsnorm's order), as the kernel table holds them. The AVX2
 * paths give the scalar ones' bits. */
typedef struct tl_mathfn {
    void (*swiglu)(int n, float *y, const float *g, const float *u);
    void (*geglu)(int n, float *y, const float *g, const float *u, const uint16_t *table);
    double (*softmax_exp)(int n, float *s, float max);
    void (*scale_round_f16)(int n, float *s, float scale);
    void (*attn_pv_paged)(int n, int hd, const float *p, const uint16_t *v, int64_t v_stride, const int32_t *blk,
                          int bs, int j0, float *acc, float *out);
    void (*attn_online)(const tl_attn_rows *a);
    void (*rmsnorm)(float *out, const float *x, const float *w, int n, float eps);
    void (*f16_row)(const float *x, uint16_t *y, int64_t n);
    void (*rope)(float *v, int n_heads, int head_dim, int n_rot, const float *cs, int neox);
    void (*fwht)(float *x, int n);
    void (*mul_add)(int n, float *o, const float *y, float w, int first);
} tl_mathfn;
void tl_mathfn_bind(tl_mathfn *m, int avx2, int fast);

#endif
