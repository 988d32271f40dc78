/* cpu: the CPU backend (backend.h): the transformer forward pass over a
 * batch of tokens of any sequences, the layer loop over its typed blocks, and
 * the buffers, kernel table, thread pool and KV cache bytes it runs on.
 * Numerics follow llama.cpp's CPU backend where it matters for agreement:
 * activations quantized per row to the weight's partner format, RMSNorm sums
 * in double, K and V cached as f16, Q rounded to f16 for the scores, softmax
 * weights rounded to f16 before multiplying V. The per-row arithmetic never
 * depends on the batch size or the thread count (rows are split across
 * threads, never a row's reduction), so a prompt gives the same logits
 * however it is chunked or threaded. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "cpu/kernels.h"
#include "cpu/mathfn.h"
#include "forward/backend.h"
#include "forward/kv.h"
#include "forward/kvfmt.h"
#include "load/packed.h"
#include "forward/cpu.h"

/* ---------------------------------------------------------------- matmul */

/* Up to three matrices sharing one quantized input (q/k/v, gate/up). */
typedef struct mm_job {
    const tl_kernels *k;
    int n_mat;
    tl_w w[3];
    float *y[3];        /* [n_tok][w->ne[1]] */
    uint8_t *wide;      /* per thread: MM_ROW_TILE rows widened to Q8_0 (wide_size bytes) */
    size_t wide_size;
    int packed[3];      /* run w[i]'s gemm kernel (on its packed twin, if its type packs) */
    const uint8_t *xa;  /* n_tok rows of xa_row bytes */
    size_t xa_row;
    int n_tok;
    int tiles[4];       /* tiles[mi]: the tiles of matrices before mi; tiles[n_mat]: all */
    atomic_int next;    /* the next tile to claim */
} mm_job;

#define MM_ROW_TILE 32
/* Tokens from which a row tile's rows are unpacked once (kernels.h
 * unpack) rather than by the gemm for every 4 tokens */
#define UNPACK_MIN_TOKENS 16

/* nr rows of a weight matrix of type tt from wr (row stride rb: the
 * packed layout's with use_gemm, else the file's) against nt activation rows
 * from xa: y[t * y_stride + r]. wide: this thread's widening buffer, or NULL. */
static void tile_dots(const tl_kernels *k, tl_type tt, int use_gemm, const uint8_t *wr, size_t rb, int nr, int64_t cols,
                      const uint8_t *xa, size_t xa_row, int nt, float *y, size_t y_stride, uint8_t *wide,
                      tl_vec_dot_fn dot_as) {
    tl_gemm_fn gemm = use_gemm ? k->gemm[tt] : NULL;
    /* Enough tokens: widen a slice of Q4_0/Q5_0 rows to Q8_0 once rather than
     * unpack it for every group of four tokens (same bits). */
    tl_widen_fn widen = nt >= 16 && wide && k->gemm[TL_Q8_0] ? k->widen[tt] : NULL;
    if (gemm && widen) {
        widen(wr, rb, nr, cols, wide);
        k->gemm[TL_Q8_0](cols, wide, tl_row_size(TL_Q8_0, cols), nr, xa, xa_row, nt, y, y_stride);
    } else if (gemm && wide && nt >= UNPACK_MIN_TOKENS && k->unpack[tt]) {
        k->unpack[tt](wr, rb, nr, cols, wide);
        k->wgemm[tt](cols, wide, 0, nr, xa, xa_row, nt, y, y_stride);
    } else if (gemm) {
        gemm(cols, wr, rb, nr, xa, xa_row, nt, y, y_stride);
    } else if (tt == TL_F32 && !dot_as && k->tile_f32 && rb % sizeof(float) == 0 && xa_row % sizeof(float) == 0) {
        k->tile_f32(cols, (const float *)(const void *)wr, rb / sizeof(float), nr, (const float *)(const void *)xa,
                    xa_row / sizeof(float), nt, y, y_stride);
    } else {
        tl_vec_dot_fn dot = dot_as ? dot_as : k->vec_dot[tt];
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < nr; r++) y[(size_t)t * y_stride + r] = dot(cols, wr + (size_t)r * rb, xa + (size_t)t * xa_row);
    }
}

/* Rows [r0, r1) of matrix mi against tokens [t0, t1). */
static void mm_tile(const mm_job *j, int mi, int ith, int64_t r0, int64_t r1, int t0, int t1) {
    tl_w w = j->w[mi];
    const int64_t rows = w->ne[1], cols = w->ne[0];
    const size_t rb = j->packed[mi] ? tl_kern_row_bytes(j->k, (tl_type)w->type, cols) : tl_row_size((tl_type)w->type, cols);
    tile_dots(j->k, (tl_type)w->type, j->packed[mi], (const uint8_t *)w->data + (size_t)r0 * rb, rb, (int)(r1 - r0), cols,
              j->xa + (size_t)t0 * j->xa_row, j->xa_row, t1 - t0, j->y[mi] + (size_t)t0 * rows + r0, (size_t)rows,
              j->wide ? j->wide + (size_t)ith * j->wide_size : NULL,
              j->packed[mi] ? NULL : tl_kern_dot_x8(j->k, (tl_type)w->type, rows));
}

/* Tiles of MM_ROW_TILE rows (a multiple of every layout's row group); a tile
 * stays in cache while every token passes it. For a prompt, threads claim
 * tiles from a counter, so one slowed by a busy core takes fewer; a decode
 * step's tiles are too short for that (a claim costs a shared cache line), so
 * each thread takes an equal contiguous share. */
static void mm_worker(void *arg, int ith, int nth) {
    mm_job *j = arg;
    if (j->n_tok < 4) {
        for (int mi = 0; mi < j->n_mat; mi++) {
            const int64_t rows = j->w[mi]->ne[1];
            int64_t lo, hi;
            tl_split(j->tiles[mi + 1] - j->tiles[mi], ith, nth, &lo, &hi);
            for (int64_t r0 = lo * MM_ROW_TILE; r0 < hi * MM_ROW_TILE && r0 < rows; r0 += MM_ROW_TILE)
                mm_tile(j, mi, ith, r0, r0 + MM_ROW_TILE < rows ? r0 + MM_ROW_TILE : rows, 0, j->n_tok);
        }
        return;
    }
    for (;;) {
        const int i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->tiles[j->n_mat]) return;
        int mi = 0;
        while (i >= j->tiles[mi + 1]) mi++;
        const int64_t rows = j->w[mi]->ne[1], r0 = (int64_t)(i - j->tiles[mi]) * MM_ROW_TILE;
        mm_tile(j, mi, ith, r0, r0 + MM_ROW_TILE < rows ? r0 + MM_ROW_TILE : rows, 0, j->n_tok);
    }
}

/* ------------------------------------------------- per-token work, split */

/* Element-wise work on tokens [t0, t1) (norms, RoPE, activations, quantizing
 * a matmul's input): each token's arithmetic is the same however the tokens
 * are split, so prompts spread it over the pool; a decode step does it inline. */

typedef struct tok_job {
    tl_cpu *c;
    tok_ith_fn fn;
    void *arg;
    int n;
} tok_job;

static void tok_worker(void *arg, int ith, int nth) {
    const tok_job *j = arg;
    int64_t lo, hi;
    tl_split(j->n, ith, nth, &lo, &hi);
    if (lo < hi) j->fn(j->c, (int)lo, (int)hi, ith, j->arg);
}

void tl_cpu_par_tokens_ith(tl_cpu *c, int n, tok_ith_fn fn, void *arg) {
    tok_job j = {c, fn, arg, n};
    if (n < 4 || tl_pool_size(c->pool) == 1) tok_worker(&j, 0, 1);
    else tl_pool_run(c->pool, tok_worker, &j);
}

typedef struct tok_plain {
    tok_fn fn;
    void *arg;
} tok_plain;

static void tok_plain_fn(tl_cpu *c, int t0, int t1, int ith, void *arg) {
    (void)ith;
    const tok_plain *p = arg;
    p->fn(c, t0, t1, p->arg);
}

void tl_cpu_par_tokens(tl_cpu *c, int n, tok_fn fn, void *arg) {
    tok_plain p = {fn, arg};
    tl_cpu_par_tokens_ith(c, n, tok_plain_fn, &p);
}

/* The packed twin of w, or NULL (then the matmul takes the plain dot path). */
static tl_w packed(const tl_cpu *c, tl_w w) { return tl_packed_find(c->pk, w); }

typedef struct quant_job {
    tl_type wt, vt;
    const float *x;
    int64_t cols;
    size_t row;
    int gemm; /* rows as the gemm kernels of wt take them, else plain vt rows */
} quant_job;

static void quant_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const quant_job *q = arg;
    for (int t = t0; t < t1; t++) {
        const float *x = q->x + (size_t)t * q->cols;
        uint8_t *row = c->xa + (size_t)t * q->row;
        if (q->gemm) tl_kern_act_make(&c->kern, q->wt, x, row, q->cols);
        else c->kern.quantize[q->vt](x, row, q->cols);
    }
}

/* The activation rows w's matmul takes: its gemm's (packed or as stored) or
 * vec_dot's. Matrices that share one input must agree on it. */
static size_t act_row(const tl_cpu *c, tl_w w, int *gemm) {
    *gemm = c->kern.gemm[w->type] != NULL && !tl_kern_dot_x8(&c->kern, (tl_type)w->type, w->ne[1]);
    return *gemm ? tl_kern_act_row_size(&c->kern, (tl_type)w->type, w->ne[0])
                 : tl_row_size(tl_type_info(w->type)->vec_dot_type, w->ne[0]);
}

/* Quantizes n_tok rows of x (width cols, stride cols) into the activation
 * format of w's type, then y_i = W_i x for each matrix. */
/* llama.cpp multiplies float weights by tinyBLAS only when their rows are a
 * multiple of 4 (llamafile_sgemm), else by ggml's vec_dot (a 1-row shared
 * expert gate, a router of 6 experts): exact mode follows, row by row. */
typedef struct ggml_dot_job {
    tl_w w;
    float *y;
    const float *x;
    tl_vec_dot_fn dot;
} ggml_dot_job;

static void ggml_dot_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const ggml_dot_job *j = arg;
    const int64_t cols = j->w->ne[0], rows = j->w->ne[1];
    const tl_type vt = tl_type_info(j->w->type)->vec_dot_type;
    const size_t rb = tl_row_size((tl_type)j->w->type, cols), ab = tl_row_size(vt, cols);
    for (int t = t0; t < t1; t++) {
        uint8_t *a = c->xa + (size_t)t * ab;
        c->kern.quantize[vt](j->x + (size_t)t * cols, a, cols);
        for (int64_t r = 0; r < rows; r++)
            j->y[(size_t)t * rows + r] = j->dot(cols, (const uint8_t *)j->w->data + (size_t)r * rb, a);
    }
}

void tl_cpu_matmul(tl_cpu *c, int n_mat, tl_w *w, float **y, const float *x, int n_tok) {
    if (c->kern.mode == TL_NUM_EXACT && (w[0]->type == TL_F32 || w[0]->type == TL_F16) && w[0]->ne[1] % 4 &&
        c->kern.vec_dot_id[w[0]->type]) {
        for (int i = 1; i < n_mat; i++) tl_cpu_matmul(c, 1, &w[i], &y[i], x, n_tok);
        ggml_dot_job j = {w[0], y[0], x, c->kern.vec_dot_id[w[0]->type]};
        tl_cpu_par_tokens(c, n_tok, ggml_dot_tokens, &j);
        return;
    }
    int64_t cols = w[0]->ne[0];
    tl_type vt = tl_type_info(w[0]->type)->vec_dot_type;
    int gemm, g;
    const size_t row = act_row(c, w[0], &gemm);
    for (int i = 1; i < n_mat; i++)
        if (act_row(c, w[i], &g) != row || g != gemm || tl_type_info(w[i]->type)->vec_dot_type != vt ||
            (gemm && tl_kern_row_align(&c->kern, (tl_type)w[i]->type) !=
                         tl_kern_row_align(&c->kern, (tl_type)w[0]->type))) {
            for (int k = 0; k < n_mat; k++) tl_cpu_matmul(c, 1, &w[k], &y[k], x, n_tok);
            return;
        }
    tl_w pw[3];
    for (int i = 0; i < n_mat; i++)
        pw[i] = !gemm ? NULL : tl_kern_packs(&c->kern, (tl_type)w[i]->type) ? packed(c, w[i]) : w[i];
    quant_job qj = {(tl_type)w[0]->type, vt, x, cols, row, gemm};
    tl_cpu_par_tokens(c, n_tok, quant_tokens, &qj);
    mm_job j = {.k = &c->kern, .n_mat = n_mat, .xa = c->xa, .xa_row = row, .n_tok = n_tok,
                .wide = c->wide, .wide_size = c->wide_size};
    for (int i = 0; i < n_mat; i++) {
        j.w[i] = pw[i] ? pw[i] : w[i];
        j.packed[i] = pw[i] != NULL;
        j.y[i] = y[i];
        j.tiles[i + 1] = j.tiles[i] + (int)((w[i]->ne[1] + MM_ROW_TILE - 1) / MM_ROW_TILE);
    }
    atomic_init(&j.next, 0);
    /* a few rows for a token or two (a shared expert's gate, a router of
     * decode): waking the threads costs more than the work; a tile's bits do
     * not depend on the thread that computes it */
    int64_t macs = 0;
    for (int i = 0; i < n_mat; i++) macs += w[i]->ne[1] * cols * n_tok;
    if (macs <= ((int64_t)1 << 17)) mm_worker(&j, 0, 1);
    else tl_pool_run(c->pool, mm_worker, &j);
}

/* -------------------------------------------------------- element-wise */

/* YaRN's correction dimensions (ggml_rope_yarn_corr_dims): the dimensions
 * whose wavelength spans beta_fast and beta_slow rotations over the original
 * context, floored and ceiled, clamped to [0, n_rot - 1]. */
static void rope_corr_dims(const tl_hparams *hp, float base, int n_rot, float dims[2]) {
    const float beta[2] = {hp->yarn_beta_fast, hp->yarn_beta_slow};
    for (int k = 0; k < 2; k++) {
        const float v = (float)n_rot * logf((float)hp->rope_n_ctx_orig / (beta[k] * 2.0f * (float)M_PI)) /
                        (2.0f * logf(base));
        dims[k] = k == 0 ? floorf(v) : ceilf(v);
    }
    dims[0] = 0.0f > dims[0] ? 0.0f : dims[0];
    dims[1] = (float)(n_rot - 1) < dims[1] ? (float)(n_rot - 1) : dims[1];
}

/* cos/sin per position and rotary pair, with theta built as ggml builds it:
 * theta_0 = pos, theta_{i+1} = theta_i * base^(-2/n_rot), in float; then
 * ggml's rope_yarn: theta scaled by freq_scale, with YaRN mixed back toward
 * the unscaled theta by the corr dims' ramp, and cos and sin times mscale.
 * ggml's CPU build fuses two of those steps (the fmaf calls). Without
 * scaling every extra step is exact (x*1, x*0 + y), so plain RoPE keeps its
 * bits. */
static void rope_cache_base(tl_cpu *c, float *out, float base, float freq_scale, int n_rot, tl_w fw, int n_tok) {
    const tl_hparams *hp = &c->m->hp;
    float theta_scale = powf(base, -2.0f / (float)n_rot);
    const float *ff = fw ? fw->data : NULL;
    const float ext = hp->yarn_ext_factor;
    float corr[2] = {0.0f, 0.0f}, mscale = hp->yarn_attn_factor;
    if (ext != 0.0f) {
        rope_corr_dims(hp, base, n_rot, corr);
        mscale *= fmaf(0.1f, logf(1.0f / freq_scale), 1.0f);
    }
    const float span = 0.001f > corr[1] - corr[0] ? 0.001f : corr[1] - corr[0];
    for (int t = 0; t < n_tok; t++) {
        float theta = (float)c->tpos[t];
        float *cs = out + (size_t)t * n_rot;
        for (int i = 0; i < n_rot / 2; i++) {
            /* ggml divides a copy of theta by the frequency factor */
            const float th = ff ? theta / ff[i] : theta;
            float tv = freq_scale * th;
            if (ext != 0.0f) {
                const float y = ((float)i - corr[0]) / span;
                const float mix = (1.0f - (1.0f < (0.0f > y ? 0.0f : y) ? 1.0f : (0.0f > y ? 0.0f : y))) * ext;
                tv = fmaf(tv, 1.0f - mix, th * mix);
            }
            cs[2 * i] = cosf(tv) * mscale;
            cs[2 * i + 1] = sinf(tv) * mscale;
            theta *= theta_scale;
        }
    }
}

/* The global layers' table and the sliding-window layers' (their own base,
 * and with Gemma 4 their own rotary width and no frequency divisors: its
 * divisors make the global layers' RoPE proportional). */
static void rope_cache(tl_cpu *c, int n_tok) {
    const tl_model *m = c->m;
    const tl_hparams *hp = &m->hp;
    tl_w fw = m->rope_freqs;
    if (!fw) fw = tl_model_rope_factors(m, c->n_ctx);
    rope_cache_base(c, c->rope_cs, hp->rope_base, hp->rope_freq_scale, hp->n_rot, fw, n_tok);
    if (c->rope_cs_swa)
        rope_cache_base(c, c->rope_cs_swa, hp->rope_base_swa, hp->rope_freq_scale_swa, hp->n_rot_swa,
                        m->arch->arch == TL_ARCH_GEMMA4 ? NULL : fw, n_tok);
}

static void rope_apply(const tl_cpu *c, const tl_attn_block *A, const float *cs_all, float *v, int n_heads, int t) {
    c->kern.math.rope(v, n_heads, A->hd, A->n_rot, cs_all + (size_t)t * A->n_rot, c->m->arch->rope_neox);
}

/* ------------------------------------------------------------- attention */

/* Runs of a few tokens (a sequence decoding, or verifying guesses) whose
 * (run, KV head) items are too few to keep the threads busy split each
 * item's keys by segment (TL_ATTN_SEG); the thread that finishes a run and
 * head's last segment folds them in order, so the bits are those of the
 * whole pass. */
#define SPLIT_RUNS 4
#define SPLIT_T 16
#define SPLIT_MAX_FLOATS ((size_t)8 << 20) /* the segment states' buffer: 32 MiB at most */

typedef struct att_job {
    tl_cpu *c;
    const tl_attn_block *A; /* its shape: head size, heads, KV heads */
    int layer, n_tok; /* layer: the KV cache's layer the block reads */
    int swa;         /* the block attends to a sliding window */
    const float *sinks; /* [n_head] logits every softmax also counts (tl_attn_block.sinks), or NULL */
    int n_runs;      /* fast attention: runs in c->att_run */
    atomic_int next; /* fast attention: the next item to claim */
    int split;       /* items are chunks of chunk (run, KV head, segment)s */
    int chunk;
    int seg0[SPLIT_RUNS], nseg[SPLIT_RUNS], item0[SPLIT_RUNS + 1];
    size_t base[SPLIT_RUNS]; /* run r's states in c->apart: [KV head][segment][T][G] o, then m, l */
} att_job;

/* Byte offset of position j's row of a sequence, from a layer's K or V
 * base (rows of rb bytes). */
static inline size_t kv_row(size_t rb, const int32_t *blk, int j) {
    return ((size_t)blk[j / TL_KV_BLOCK] * TL_KV_BLOCK + (size_t)(j % TL_KV_BLOCK)) * rb;
}

/* One (token, head): scores over all cached positions <= its own, softmax,
 * weighted sum of V. Keys are visited in position order whatever the batch,
 * the sequence's other tokens or where its blocks lie. A sink (sinks[h])
 * joins the softmax as ggml's soft_max with sinks does: in the max, and
 * expf(sink - max) added to the double sum; it weighs no value. */
static void attend(tl_cpu *c, const tl_attn_block *A, int layer, int swa, const float *sinks, int t, int h, float *s,
                   float *acc) {
    const tl_hparams *hp = &c->m->hp;
    const int hd = A->hd, pos = c->tpos[t], qd = A->n_head * hd;
    const int kvh = h / (A->n_head / A->n_head_kv);
    const uint16_t *q = c->q16 + (size_t)t * qd + (size_t)h * hd;
    const int32_t *blk = tl_cpu_blk(c, layer, t);
    /* llama.cpp's f16 dots: the cache is F16 here (a quantized one takes attend_fa) */
    const size_t krb = c->K.rb[layer], vrb = c->V.rb[layer];
    const uint8_t *kb = c->K.mem + c->K.off[layer] + (size_t)kvh * c->K.f->row_bytes(hd);
    const uint16_t *vb = (const uint16_t *)(const void *)(c->V.mem + c->V.off[layer] + (size_t)kvh * c->V.f->row_bytes(hd));
    const size_t kvs = vrb / sizeof(uint16_t), kks = krb / sizeof(uint16_t);
    int prescaled = c->m->arch->q_prescale;
    float scale = hp->attn_scale;
    /* A sliding-window layer sees keys j with pos - j < n_swa. The keys
     * before it are masked (weight exactly 0); starting at a multiple of 8
     * keeps each visible key in the lane ggml's sums put it in. */
    int lo = 0, j0 = 0;
    if (swa && pos - hp->n_swa + 1 > 0) {
        lo = pos - hp->n_swa + 1;
        j0 = lo & ~7;
    }
    float mx = -INFINITY;
    for (int j = j0; j < lo; j++) s[j] = -INFINITY;
    for (int j = lo; j <= pos;) {
        /* four keys at a time where they share a block (four independent
         * sums, each in the one-key order) */
        if (c->kern.dot_f16_x4 && j + 4 <= pos + 1 && j % TL_KV_BLOCK <= TL_KV_BLOCK - 4) {
            c->kern.dot_f16_x4(hd, (const uint16_t *)(const void *)(kb + kv_row(krb, blk, j)), kks, q, s + j);
            j += 4;
        } else {
            s[j] = c->kern.dot_f16(hd, (const uint16_t *)(const void *)(kb + kv_row(krb, blk, j)), q);
            j++;
        }
    }
    for (int j = lo; j <= pos; j++) {
        if (!prescaled) s[j] *= scale;
        if (s[j] > mx) mx = s[j];
    }
    if (sinks) mx = mx > sinks[h] ? mx : sinks[h];
    const int n = pos + 1 - j0;
    double sum = c->kern.math.softmax_exp(n, s + j0, mx);
    if (sinks) sum += (double)expf(sinks[h] - mx);
    /* ggml scales by (float)(1/sum) and multiplies V by the weights rounded to f16 */
    c->kern.math.scale_round_f16(n, s + j0, (float)(1.0 / sum));
    c->kern.math.attn_pv_paged(n, hd, s + j0, vb, (int64_t)kvs, blk, TL_KV_BLOCK, j0, acc, acc + 8 * hd);
    memcpy(c->att + (size_t)t * qd + (size_t)h * hd, acc + 8 * hd, (size_t)hd * sizeof *acc);
}

/* The exact numerics with a quantized cache, as llama.cpp runs it: its CPU
 * flash attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk; a
 * quantized V needs flash attention there, and a quantized K never takes
 * its tiled or split paths). Keys in position order, each
 * s = dot(k, q in K's vec_dot_type) * scale; a new maximum scales the
 * accumulator by expf(M_old - M), any other key weighs expf(s - M); V is
 * accumulated by fma, in f32 after dequantizing a quantized row, in f16
 * (rounded at every step) for an f16 V. */
static void attend_fa(tl_cpu *c, const tl_attn_block *A, int layer, int swa, const float *sinks, int t, int h,
                      float *acc) {
    const tl_hparams *hp = &c->m->hp;
    const int hd = A->hd, pos = c->tpos[t], qd = A->n_head * hd;
    const int kvh = h / (A->n_head / A->n_head_kv);
    const int32_t *blk = tl_cpu_blk(c, layer, t);
    const uint8_t *kb = c->K.mem + c->K.off[layer] + (size_t)kvh * c->K.f->row_bytes(hd);
    const uint8_t *vb = c->V.mem + c->V.off[layer] + (size_t)kvh * c->V.f->row_bytes(hd);
    const int kq = c->K.f->type != TL_F16, v16 = c->V.f->type == TL_F16;
    const void *qv = kq ? (const void *)(c->qq + (size_t)t * c->qq_row + (size_t)h * tl_row_size(TL_Q8_0, hd))
                        : (const void *)(c->q16 + (size_t)t * qd + (size_t)h * hd);
    /* an f16 K: ggml_vec_dot_f16 itself (its four chains; the matmul of the
     * attention without flash attention is tinyBLAS's, kern.dot_f16) */
    const tl_vec_dot_fn kdot = kq ? c->kern.vec_dot[c->K.f->type] : c->kern.vec_dot_id[TL_F16];
    const float scale = c->m->arch->q_prescale ? 1.0f : hp->attn_scale;
    float *vkq = acc, *v32 = acc + hd;
    uint16_t *vkq16 = (uint16_t *)(void *)(acc + 2 * hd);
    if (v16) memset(vkq16, 0, (size_t)hd * sizeof *vkq16);
    else memset(vkq, 0, (size_t)hd * sizeof *vkq);
    float S = 0.0f, M = -INFINITY;
    const int lo = swa && pos - hp->n_swa + 1 > 0 ? pos - hp->n_swa + 1 : 0;
    for (int j = lo; j <= pos; j++) {
        const uint8_t *kr = kb + kv_row(c->K.rb[layer], blk, j), *vr = vb + kv_row(c->V.rb[layer], blk, j);
        float s = kdot(hd, kr, qv);
        s = s * scale;
        s += 0.0f; /* the mask of a visible key */
        const float Mold = M;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            M = s;
            ms = expf(Mold - M);
            if (v16)
                for (int d = 0; d < hd; d++) vkq16[d] = tl_fp32_to_fp16(tl_fp16_to_fp32(vkq16[d]) * ms);
            else
                for (int d = 0; d < hd; d++) vkq[d] *= ms;
        } else {
            vs = expf(s - M);
        }
        if (v16) {
            const uint16_t *vh = (const uint16_t *)(const void *)vr;
            for (int d = 0; d < hd; d++)
                vkq16[d] = tl_fp32_to_fp16(fmaf(tl_fp16_to_fp32(vh[d]), vs, tl_fp16_to_fp32(vkq16[d])));
        } else {
            tl_dequantize_row(c->V.f->type, vr, v32, hd);
            for (int d = 0; d < hd; d++) vkq[d] = fmaf(v32[d], vs, vkq[d]);
        }
        S = fmaf(S, ms, vs); /* ggml's S*ms + vs, contracted by its compiler */
    }
    if (v16)
        for (int d = 0; d < hd; d++) vkq[d] = tl_fp16_to_fp32(vkq16[d]);
    if (sinks) {
        const float sk = sinks[h];
        float ms = 1.0f, vs = 1.0f;
        if (sk > M) {
            ms = expf(M - sk);
            M = sk;
            for (int d = 0; d < hd; d++) vkq[d] *= ms;
        } else {
            vs = expf(sk - M);
        }
        S = S * ms + vs; /* here ggml's compiler rounded the product first (a sink near a row's maximum shows it) */
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    float *out = c->att + (size_t)t * qd + (size_t)h * hd;
    for (int d = 0; d < hd; d++) out[d] = vkq[d] * inv;
}

/* The fast numerics: runs of up to ATT_TILE consecutive tokens of one
 * sequence against one KV head, the query heads that share it together
 * (tl_attn_online); a token's result does not depend on its run. */
#define ATT_TILE 64

/* Query heads h0..h0+nh-1 (sharing KV head h0 / G) of a run of nt tokens;
 * seg > 0: segment seg - 1's keys alone, the state into out and part. */
static void attend_fast(tl_cpu *c, const tl_attn_block *A, int layer, int swa, const float *sinks, int t, int nt, int h0,
                        int nh, float *scratch, int seg, float *out, float *part) {
    const tl_hparams *hp = &c->m->hp;
    const int hd = A->hd, g = h0 / (A->n_head / A->n_head_kv), qd = A->n_head * hd;
    const size_t vbase = c->V.off[layer] + (size_t)g * c->V.f->row_bytes(hd);
    const size_t kbase = c->K.off[layer] + (size_t)g * c->K.f->row_bytes(hd) * TL_KV_BLOCK; /* K transposed */
    tl_attn_rows a = {
        .hd = hd, .G = nh, .bs = TL_KV_BLOCK, .T = nt,
        .q = c->q + (size_t)t * qd + (size_t)h0 * hd, .q_stride = (size_t)hd, .q_tok = (size_t)qd,
        .scale = c->m->arch->q_prescale ? 1.0f : hp->attn_scale,
        /* V rows, K transposed per block */
        .k = c->K.mem + kbase, .v = c->V.mem + vbase, .k_stride = c->K.rb[layer], .v_stride = c->V.rb[layer],
        .k_fmt = c->K.f->attn_fmt, .v_fmt = c->V.f->attn_fmt, .k_tr = 1,
        .blk = tl_cpu_blk(c, layer, t), .pos0 = c->tpos[t],
        .n_swa = swa ? hp->n_swa : 0,
        .out = c->att + (size_t)t * qd + (size_t)h0 * hd, .out_stride = (size_t)hd,
        .out_tok = (size_t)qd, .scratch = scratch, .seg = seg, .part = part,
        .sinks = sinks ? sinks + h0 : NULL};
    if (seg > 0) a.out = out, a.out_tok = (size_t)nh * hd;
    c->kern.math.attn_online(&a);
}

/* Segment i of a split job: run r's KV head g, one segment; the last of the
 * run and head's segments to finish folds them into c->att. */
static void attend_split(att_job *j, int64_t i, float *scr) {
    tl_cpu *c = j->c;
    const int nkv = j->A->n_head_kv, G = j->A->n_head / nkv, hd = j->A->hd, qd = j->A->n_head * hd;
    int r = 0;
    while (i >= j->item0[r + 1]) r++;
    const int k = (int)(i - j->item0[r]), g = k / j->nseg[r], si = k % j->nseg[r];
    const int t = c->att_run[r], T = c->att_run[r + 1] - t;
    const size_t slot = (size_t)T * G * (hd + 2);
    float *base = c->apart + j->base[r] + (size_t)g * j->nseg[r] * slot;
    float *o = base + (size_t)si * slot;
    attend_fast(c, j->A, j->layer, j->swa, NULL, t, T, g * G, G, scr, j->seg0[r] + si + 1, o, o + (size_t)T * G * hd);
    if (atomic_fetch_add_explicit(&c->aleft[r * nkv + g], -1, memory_order_acq_rel) != 1) return;
    for (int row = 0; row < T * G; row++) { /* row = token * G + head */
        float ma = -INFINITY, la = 0.0f, *oa = scr;
        for (int s = 0; s < j->nseg[r]; s++) {
            const float *os = base + (size_t)s * slot, *ml = os + (size_t)T * G * hd + 2 * row;
            if (ml[0] != -INFINITY) tl_attn_merge(hd, &ma, &la, oa, ml[0], ml[1], os + (size_t)row * hd);
        }
        if (j->sinks) tl_attn_sink(hd, &ma, &la, oa, j->sinks[g * G + row % G]); /* once, after every segment */
        tl_attn_divide(hd, oa, la, c->att + (size_t)(t + row / G) * qd + (size_t)(g * G + row % G) * hd);
    }
}

/* Whether the runs are split by segment (att_job.split), and the items. */
static void att_plan(tl_cpu *c, att_job *j, int nth) {
    const tl_hparams *hp = &c->m->hp;
    const int nkv = j->A->n_head_kv;
    j->split = 0;
    if (!c->apart || nth < 2 || j->n_runs > SPLIT_RUNS || (int64_t)j->n_runs * nkv >= 4 * (int64_t)nth) return;
    j->item0[0] = 0;
    size_t need = 0;
    for (int r = 0; r < j->n_runs; r++) {
        const int t = c->att_run[r], T = c->att_run[r + 1] - t;
        if (T > SPLIT_T) return;
        const int pos = c->tpos[t], w = j->swa ? pos - hp->n_swa + 1 : 0, lo = w > 0 ? w : 0;
        j->seg0[r] = lo / TL_ATTN_SEG;
        j->nseg[r] = (pos + T - 1) / TL_ATTN_SEG - j->seg0[r] + 1;
        j->item0[r + 1] = j->item0[r] + nkv * j->nseg[r];
        j->base[r] = need;
        need += (size_t)j->nseg[r] * T * j->A->n_head * (j->A->hd + 2); /* every KV head's G query heads */
    }
    const int n = j->item0[j->n_runs];
    if (n < nth || need > c->apart_n) return; /* one segment each: the heads' split below */
    j->chunk = (n + 2 * nth - 1) / (2 * nth);
    for (int r = 0; r < j->n_runs; r++)
        for (int g = 0; g < nkv; g++) atomic_store_explicit(&c->aleft[r * nkv + g], j->nseg[r], memory_order_relaxed);
    j->split = 1;
}

/* Splits the batch into runs for attend_fast: consecutive tokens of one
 * sequence at consecutive positions, at most ATT_TILE long. */
static int att_runs(tl_cpu *c, int n) {
    int nr = 0;
    for (int t = 0; t < n;) {
        int e = t + 1;
        while (e < n && e - t < ATT_TILE && c->tseq[e] == c->tseq[t] && c->tpos[e] == c->tpos[e - 1] + 1) e++;
        c->att_run[nr++] = t;
        t = e;
    }
    c->att_run[nr] = n;
    return nr;
}

static void att_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    tl_cpu *c = j->c;
    if (c->fast_attn) {
        /* Items of (run, KV head) with all its query heads, which widen each
         * K/V block once; with too few of those to keep every thread busy
         * (decode), (run, query head). A head's result is the same either
         * way. Items are claimed from a counter, later runs (more keys) first. */
        const int nkv = j->A->n_head_kv, G = j->A->n_head / nkv;
        const int per = (int64_t)j->n_runs * nkv >= (int64_t)nth ? G : 1, nper = nkv * G / per;
        float *scr = c->ascr + (size_t)ith * c->ascr_n;
        if (j->split) {
            /* a thread takes consecutive segments, so that its prefetching
             * runs on from one into the next */
            const int64_t n = j->item0[j->n_runs];
            for (;;) {
                const int64_t i = (int64_t)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * j->chunk;
                if (i >= n) return;
                for (int64_t e = i + j->chunk < n ? i + j->chunk : n, k = i; k < e; k++) attend_split(j, k, scr);
            }
        }
        for (;;) {
            const int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
            if (i >= (int64_t)j->n_runs * nper) return;
            const int r = j->n_runs - 1 - (int)(i / nper);
            attend_fast(c, j->A, j->layer, j->swa, j->sinks, c->att_run[r], c->att_run[r + 1] - c->att_run[r],
                        (int)(i % nper) * per, per, scr, 0, NULL, NULL);
        }
    }
    const int nh = j->A->n_head;
    float *s = c->scores + (size_t)ith * c->n_ctx;
    float *acc = c->vacc + (size_t)ith * 9 * c->m->hp.head_dim_max;
    /* Later tokens see more keys: deal (token, head) pairs out round-robin so
     * the threads get equal work. */
    for (int64_t i = ith; i < (int64_t)j->n_tok * nh; i += nth) {
        if (c->fa) attend_fa(c, j->A, j->layer, j->swa, j->sinks, (int)(i / nh), (int)(i % nh), acc);
        else attend(c, j->A, j->layer, j->swa, j->sinks, (int)(i / nh), (int)(i % nh), s, acc);
    }
}

/* ---------------------------------------------------------------- layers */

/* y[t] += b for n_tok rows of width cols (ggml_add: one rounding each). */
static void add_bias(float *y, tl_w b, int n_tok, int cols) {
    if (!b) return;
    const float *bv = b->data;
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < cols; i++) y[(size_t)t * cols + i] += bv[i];
}

typedef struct norm_job {
    float *out;
    const float *in;
    const float *w;
    int d;
} norm_job;

static void norm_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const norm_job *j = arg;
    for (int t = t0; t < t1; t++)
        c->kern.math.rmsnorm(j->out + (size_t)t * j->d, j->in + (size_t)t * j->d, j->w, j->d, c->m->hp.norm_eps);
}

void tl_cpu_norm_all(tl_cpu *c, int n, float *out, const float *in, tl_w w) {
    norm_job j = {out, in, w->data, c->m->hp.n_embd};
    tl_cpu_par_tokens(c, n, norm_tokens, &j);
}

/* x += xb, the residual connection */
void tl_cpu_add_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const size_t d = (size_t)c->m->hp.n_embd;
    for (size_t i = (size_t)t0 * d; i < (size_t)t1 * d; i++) c->x[i] += c->xb[i];
}

/* llama.cpp's attention rotation for a quantized cache (its "attn_rot"):
 * with K (V) quantized and heads a multiple of 64, q and k (v) are rotated
 * by an orthonormal Walsh-Hadamard matrix in chunks of rot_k (rot_v)
 * elements before k and v are rounded into the cache, which spreads a
 * head's outliers over its block (q4_0's perplexity on SmolLM2: +17% without,
 * +4% with); scores are unchanged in exact arithmetic, and the attention's
 * output is rotated back (the matrix is its own inverse): tl_fwht, in
 * ggml's order. */
static void rot_sizes(const tl_cpu *c, int hd, int *rk, int *rv) {
    /* as llama.cpp chooses (llama_kv_cache: attn_rot_k/v), per cache and so
     * per head size: K's chunk the largest power of two from 64 dividing
     * the head, V's 64; on at all only when layer 0's head is a multiple
     * of 64 (its test reads n_embd_head_k() of layer 0, for both of Gemma
     * 4's caches) */
    *rk = *rv = 0;
    if (!c->rot_on) return;
    if (c->K.f->type != TL_F16 && hd % 64 == 0)
        for (*rk = 64; hd % (2 * *rk) == 0;) *rk *= 2;
    if (c->V.f->type != TL_F16 && hd % 64 == 0) *rv = 64;
}

static void unrotate_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_attn_block *A = arg;
    const int qd = A->n_head * A->hd;
    int rk, rv;
    rot_sizes(c, A->hd, &rk, &rv);
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < qd; i += rv) c->kern.math.fwht(c->att + (size_t)t * qd + i, rv);
}

/* After the q/k/v projections: QK-norm, RoPE, q to f16, k and v into the cache. */
static void attn_prep_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_attn_block *A = arg;
    const int il = A->kv_layer;
    const tl_hparams *hp = &c->m->hp;
    const tl_arch_info *a = c->m->arch;
    const float *cs = A->swa && c->rope_cs_swa ? c->rope_cs_swa : c->rope_cs;
    const int hd = A->hd, qd = A->n_head * hd, kvd = A->n_head_kv * hd;
    int rot_k, rot_v;
    rot_sizes(c, hd, &rot_k, &rot_v);
    for (int t = t0; t < t1; t++) {
        float *q = c->q + (size_t)t * qd, *k = c->k + (size_t)t * kvd;
        float *v = c->v + (size_t)t * kvd;
        if (A->v_norm && !A->kv_shared && !A->wv) memcpy(v, k, (size_t)kvd * sizeof *v); /* before k's norm */
        if (A->q_norm)
            for (int h = 0; h < A->n_head; h++)
                c->kern.math.rmsnorm(q + h * hd, q + h * hd, A->q_norm->data, hd, hp->norm_eps);
        if (A->k_norm)
            for (int h = 0; h < A->n_head_kv; h++)
                c->kern.math.rmsnorm(k + h * hd, k + h * hd, A->k_norm->data, hd, hp->norm_eps);
        if (A->v_norm && !A->kv_shared) /* ggml_rms_norm alone: times ones is exact */
            for (int h = 0; h < A->n_head_kv; h++) c->kern.math.rmsnorm(v + h * hd, v + h * hd, c->ones, hd, hp->norm_eps);
        rope_apply(c, A, cs, q, A->n_head, t);
        if (!A->kv_shared) rope_apply(c, A, cs, k, A->n_head_kv, t);
        if (a->q_prescale)
            for (int i = 0; i < qd; i++) q[i] *= hp->attn_scale;
        if (rot_k) { /* a quantized cache: rotated before it is rounded (fwht) */
            for (int i = 0; i < qd; i += rot_k) c->kern.math.fwht(q + i, rot_k);
            for (int i = 0; i < kvd && !A->kv_shared; i += rot_k) c->kern.math.fwht(k + i, rot_k);
        }
        if (rot_v && !A->kv_shared)
            for (int i = 0; i < kvd; i += rot_v) c->kern.math.fwht(v + i, rot_v);
        if (!c->fast_attn) { /* the exact attention reads q as K's dot takes it */
            if (c->K.f->type == TL_F16)
                c->kern.math.f16_row(q, c->q16 + (size_t)t * qd, qd);
            else
                for (int h = 0; h < A->n_head; h++)
                    c->kern.quantize[TL_Q8_0](q + (size_t)h * hd, c->qq + (size_t)t * c->qq_row + (size_t)h * tl_row_size(TL_Q8_0, hd), hd);
        }
        if (A->kv_shared) continue; /* its keys and values are an earlier layer's */
        const int32_t *blk = tl_cpu_blk(c, il, t);
        const int p = c->tpos[t];
        if (c->fast_attn) /* K transposed per block (tl_attn_rows.k_tr) */
            c->K.f->store_tr(&c->kern.math, k,
                             c->K.mem + c->K.off[il] + (size_t)blk[p / TL_KV_BLOCK] * TL_KV_BLOCK * c->K.rb[il],
                             p % TL_KV_BLOCK, TL_KV_BLOCK, kvd);
        else
            c->K.f->store(&c->kern.math, k, c->K.mem + c->K.off[il] + kv_row(c->K.rb[il], blk, p), kvd);
        c->V.f->store(&c->kern.math, v, c->V.mem + c->V.off[il] + kv_row(c->V.rb[il], blk, p), kvd);
    }
}

/* Qwen3.5's q projection holds per head q then its gate: split apart. */
static void q_split_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_attn_block *A = arg;
    const int hd = A->hd, qd = A->n_head * hd;
    for (int t = t0; t < t1; t++)
        for (int h = 0; h < A->n_head; h++) {
            const float *src = c->qg + (size_t)t * 2 * qd + (size_t)h * 2 * hd;
            memcpy(c->q + (size_t)t * qd + (size_t)h * hd, src, (size_t)hd * sizeof(float));
            memcpy(c->qgate + (size_t)t * qd + (size_t)h * hd, src + hd, (size_t)hd * sizeof(float));
        }
}

/* att *= sigmoid(gate), as ggml_sigmoid computes it (libm's expf) */
static void q_gate_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_attn_block *A = arg;
    const size_t qd = (size_t)A->n_head * A->hd;
    for (size_t i = (size_t)t0 * qd; i < (size_t)t1 * qd; i++)
        c->att[i] *= 1.0f / (1.0f + expf(-c->qgate[i]));
}

static void attention_block(tl_cpu *c, const tl_attn_block *A, int n) {
    tl_cpu_norm_all(c, n, c->xb, c->x, A->norm);
    /* no wv: v is k's projection (copied in attn_prep_tokens); a shared
     * layer projects q alone */
    tl_w w[3] = {A->wq, A->wk, A->wv};
    float *y[3] = {A->q_gate ? c->qg : c->q, c->k, c->v};
    tl_cpu_matmul(c, A->kv_shared ? 1 : A->wv ? 3 : 2, w, y, c->xb, n);
    if (A->q_gate) tl_cpu_par_tokens(c, n, q_split_tokens, (void *)A);
    const int qd = A->n_head * A->hd, kvd = A->n_head_kv * A->hd;
    add_bias(c->q, A->bq, n, qd);
    add_bias(c->k, A->bk, n, kvd);
    add_bias(c->v, A->bv, n, kvd);
    tl_cpu_par_tokens(c, n, attn_prep_tokens, (void *)A);
    att_job aj = {c, A, A->kv_layer, n, A->swa, A->sinks ? A->sinks->data : NULL, c->n_att_runs, 0, 0, 0, {0}, {0}, {0},
                  {0}};
    atomic_init(&aj.next, 0);
    if (c->fast_attn) att_plan(c, &aj, tl_pool_size(c->pool));
    tl_pool_run(c->pool, att_worker, &aj);
    int rot_k, rot_v;
    rot_sizes(c, A->hd, &rot_k, &rot_v);
    if (rot_v) tl_cpu_par_tokens(c, n, unrotate_tokens, (void *)A);
    if (A->q_gate) tl_cpu_par_tokens(c, n, q_gate_tokens, (void *)A);
    tl_w wo = A->wo;
    float *o = c->xb; /* reuse: [n][d] */
    tl_cpu_matmul(c, 1, &wo, &o, c->att, n);
    add_bias(o, A->bo, n, c->m->hp.n_embd);
    if (A->post_norm) tl_cpu_norm_all(c, n, o, o, A->post_norm);
    tl_cpu_par_tokens(c, n, tl_cpu_add_tokens, NULL);
}

/* The gated activation of the feed-forward: hb = act(hb) * hb2. */
static void ffn_act_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_ffn_block *F = arg;
    const int n_ff = (int)F->gate->ne[1]; /* Gemma 4's widths differ by layer */
    for (int t = t0; t < t1; t++) {
        size_t o = (size_t)t * n_ff;
        if (F->act == TL_ACT_GELU)
            c->kern.math.geglu(n_ff, c->hb + o, c->hb + o, c->hb2 + o, c->gelu);
        else
            c->kern.math.swiglu(n_ff, c->hb + o, c->hb + o, c->hb2 + o);
    }
}

static void ffn_block(tl_cpu *c, const tl_ffn_block *F, int n) {
    tl_cpu_norm_all(c, n, c->xb, c->x, F->norm);
    tl_w w[2] = {F->gate, F->up};
    float *y[2] = {c->hb, c->hb2};
    tl_cpu_matmul(c, 2, w, y, c->xb, n);
    tl_cpu_par_tokens(c, n, ffn_act_tokens, (void *)F);
    tl_w wd = F->down;
    float *o = c->xb;
    tl_cpu_matmul(c, 1, &wd, &o, c->hb, n);
    if (F->post_norm) tl_cpu_norm_all(c, n, o, o, F->post_norm);
    tl_cpu_par_tokens(c, n, tl_cpu_add_tokens, NULL);
}

/* ------------------------------------------------------------- experts */

/* A mixture of experts runs as llama.cpp's build_moe_ffn computes it: router
 * logits, probabilities, the top k, their weights; then for each expert one
 * grouped matmul over the tokens that chose it (its weights read once per
 * call, however many tokens chose it), the gated activation, the expert's
 * down projection, and per token the weighted outputs added in choice order.
 * Each (token, choice) pair's dots are the gemm contract's (kernels.h): the
 * same bits whichever and however many other tokens share its expert. */

/* ggml's soft_max of one row: exp(x - max) by 8-lane groups, the tail by
 * libm's expf, each added to a double sum; then times (float)(1/sum). */
static void softmax_row(const tl_cpu *c, int n, float *s) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    const int n8 = n & ~7;
    double sum = n8 ? c->kern.math.softmax_exp(n8, s, mx) : 0.0;
    for (int i = n8; i < n; i++) {
        s[i] = expf(s[i] - mx);
        sum += (double)s[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) s[i] *= inv;
}

/* Per token: probabilities, the k best (ties to the lower expert, as a
 * stable descending sort gives), and their weights. */
static void route_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_moe_block *E = arg;
    const int ne = E->n_expert, k = E->n_used;
    for (int t = t0; t < t1; t++) {
        float *p = c->rlog + (size_t)t * ne;
        if (E->router_b)
            for (int e = 0; e < ne; e++) p[e] += ((const float *)E->router_b->data)[e];
        if (E->gating == TL_GATE_SOFTMAX) softmax_row(c, ne, p);
        int *sel = c->sel + (size_t)t * k;
        float *w = c->selw + (size_t)t * k;
        for (int i = 0; i < k; i++) {
            int best = -1;
            for (int e = 0; e < ne; e++) {
                int taken = 0;
                for (int j = 0; j < i && !taken; j++) taken = sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[i] = best;
            w[i] = p[best];
        }
        if (E->gating == TL_GATE_SOFTMAX_CHOSEN) softmax_row(c, k, w);
        if (E->norm_w) {
            double sum = 0.0; /* ggml_sum_rows: a double sum, rounded once */
            for (int i = 0; i < k; i++) sum += (double)w[i];
            float fs = (float)sum;
            if (fs < 6.103515625e-5f) fs = 6.103515625e-5f;
            for (int i = 0; i < k; i++) w[i] = w[i] / fs;
        }
    }
}

/* How an expert matrix is multiplied: its gemm (on the packed copy where its
 * type packs) or vec_dot pair by pair, and the activation rows that takes. */
typedef struct exp_mat {
    tl_w w;            /* the 3-D tensor, or its packed twin */
    int use_gemm;
    size_t rb;         /* bytes per row as read */
    int64_t rows, cols;/* one expert's slice */
    size_t act_row;
    tl_vec_dot_fn dot;  /* the exact mode's mul_mat_id dot, or NULL */
} exp_mat;

static exp_mat exp_mat_of(const tl_cpu *c, tl_w w) {
    exp_mat m = {w, 0, 0, w->ne[1], w->ne[0], 0, NULL};
    m.act_row = act_row(c, w, &m.use_gemm);
    /* repacked experts (rows per expert a multiple of 8) before mul_mat_id's own dot */
    tl_vec_dot_fn x8 = tl_kern_dot_x8(&c->kern, (tl_type)w->type, w->ne[1]);
    if (c->kern.mode == TL_NUM_EXACT && (x8 || c->kern.vec_dot_id[w->type])) {
        m.use_gemm = 0;
        m.dot = x8 ? x8 : c->kern.vec_dot_id[w->type];
        m.act_row = tl_row_size(tl_type_info(w->type)->vec_dot_type, w->ne[0]);
    }
    if (m.use_gemm && tl_kern_packs(&c->kern, (tl_type)w->type)) m.w = packed(c, w);
    m.rb = m.use_gemm ? tl_kern_row_bytes(&c->kern, (tl_type)w->type, m.cols) : tl_row_size((tl_type)w->type, m.cols);
    return m;
}

/* The activation rows of x (width cols) in m's format. */
static void exp_act(const tl_cpu *c, const exp_mat *m, const float *x, uint8_t *row) {
    if (m->use_gemm) tl_kern_act_make(&c->kern, (tl_type)m->w->type, x, row, m->cols);
    else c->kern.quantize[tl_type_info(m->w->type)->vec_dot_type](x, row, m->cols);
}

typedef struct moe_job {
    tl_cpu *c;
    int n_mat;         /* 2: gate and up over the same rows (one pass over the activations); 1: down */
    exp_mat m[2];
    float *y[2];       /* [pair][m.rows] */
    int tiles;         /* row tiles per expert */
    int n_items;
    int contiguous;    /* few tokens: split each expert's rows evenly, no claims */
    atomic_int next;
} moe_job;

/* Rows [r0, r1) of expert e's matrices against its pairs. */
static void moe_rows(const moe_job *j, int e, int64_t r0, int64_t r1, uint8_t *wide) {
    tl_cpu *c = j->c;
    const int p0 = c->eoff[e], np = c->ecnt[e];
    for (int mi = 0; mi < j->n_mat; mi++) {
        const exp_mat *m = &j->m[mi];
        const uint8_t *wr = (const uint8_t *)m->w->data + ((size_t)e * (size_t)m->rows + (size_t)r0) * m->rb;
        tile_dots(&c->kern, (tl_type)m->w->type, m->use_gemm, wr, m->rb, (int)(r1 - r0), m->cols,
                  c->xg + (size_t)p0 * c->xg_row, c->xg_row, np, j->y[mi] + (size_t)p0 * m->rows + r0, (size_t)m->rows,
                  wide, m->dot);
    }
}

static void moe_worker(void *arg, int ith, int nth) {
    moe_job *j = arg;
    tl_cpu *c = j->c;
    uint8_t *wide = c->wide ? c->wide + (size_t)ith * c->wide_size : NULL;
    const int64_t rows = j->m[0].rows;
    if (j->contiguous) {
        /* each thread one contiguous share of every chosen expert's rows: a
         * long stream for the prefetchers and no shared counter (as
         * mm_worker's decode) */
        for (int a = 0; a < j->n_items / j->tiles; a++) {
            int64_t lo, hi;
            tl_split(j->tiles, ith, nth, &lo, &hi);
            if (lo < hi)
                moe_rows(j, c->eact[a], lo * MM_ROW_TILE, hi * MM_ROW_TILE < rows ? hi * MM_ROW_TILE : rows, wide);
        }
        return;
    }
    for (;;) {
        const int i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n_items) return;
        /* experts with the most pairs first, so that no thread starts a long
         * item last; the order of the items never changes a result */
        const int64_t r0 = (int64_t)(i % j->tiles) * MM_ROW_TILE;
        moe_rows(j, c->eact[i / j->tiles], r0, r0 + MM_ROW_TILE < rows ? r0 + MM_ROW_TILE : rows, wide);
    }
}

static void moe_run(tl_cpu *c, moe_job *j, int n_act, int n_pairs) {
    j->c = c;
    /* few tokens per expert (decode, a few streams): the weights stream from
     * memory and a contiguous share per thread keeps each stream long; many
     * (prompts): claimed tiles, which a thread slowed by a busy core takes
     * fewer of */
    j->contiguous = n_pairs < 4 * n_act;
    j->tiles = (int)((j->m[0].rows + MM_ROW_TILE - 1) / MM_ROW_TILE);
    j->n_items = n_act * j->tiles;
    atomic_init(&j->next, 0);
    tl_pool_run(c->pool, moe_worker, j);
}

typedef struct gather_arg {
    const exp_mat *m;
    int k;
} gather_arg;

/* Token t's input row, in m's activation format, into the gathered rows of
 * each of its pairs. */
static void gather_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const gather_arg *g = arg;
    for (int t = t0; t < t1; t++) {
        uint8_t *first = c->xg + (size_t)c->pair[(size_t)t * g->k] * c->xg_row;
        exp_act(c, g->m, c->xb + (size_t)t * c->m->hp.n_embd, first);
        for (int i = 1; i < g->k; i++)
            memcpy(c->xg + (size_t)c->pair[(size_t)t * g->k + i] * c->xg_row, first, g->m->act_row);
    }
}

/* Per pair: the biases, the gated activation, then the down projection's
 * activation row. */
static void act_pairs(tl_cpu *c, int p0, int p1, void *arg) {
    const tl_moe_block *E = arg;
    const int ff = E->gate_up ? (int)E->gate_up->ne[1] / 2 : (int)E->gate->ne[1];
    const exp_mat dm = exp_mat_of(c, E->down);
    for (int p = p0; p < p1; p++) {
        /* fused: a pair's row holds gate then up */
        float *g = c->eg + (size_t)p * (E->gate_up ? 2 * ff : ff), *u = E->gate_up ? g + ff : c->eu + (size_t)p * ff;
        const int t = c->ptok[p];
        int e = -1;
        for (int i = 0; i < E->n_used && e < 0; i++)
            if (c->pair[(size_t)t * E->n_used + i] == p) e = c->sel[(size_t)t * E->n_used + i];
        if (E->up_b)
            for (int i = 0; i < ff; i++) u[i] += ((const float *)E->up_b->data)[(size_t)e * ff + i];
        if (E->gate_b)
            for (int i = 0; i < ff; i++) g[i] += ((const float *)E->gate_b->data)[(size_t)e * ff + i];
        if (E->act == TL_ACT_SWIGLU_OAI) {
            /* ggml_swiglu_oai with gpt-oss's alpha 1.702 and limit 7 */
            for (int i = 0; i < ff; i++) {
                const float x = g[i] < 7.0f ? g[i] : 7.0f;
                const float y = u[i] < -7.0f ? -7.0f : u[i] > 7.0f ? 7.0f : u[i];
                const float glu = x / (1.0f + expf(1.702f * (-x)));
                g[i] = glu * (y + 1.0f);
            }
        } else if (E->act == TL_ACT_GELU) {
            c->kern.math.geglu(ff, g, g, u, c->gelu);
        } else {
            c->kern.math.swiglu(ff, g, g, u);
        }
        exp_act(c, &dm, g, c->xg + (size_t)p * c->xg_row);
    }
}

typedef struct pair_job {
    tl_cpu *c;
    const tl_moe_block *E;
    int n;
} pair_job;

static void pair_worker(void *arg, int ith, int nth) {
    const pair_job *j = arg;
    int64_t lo, hi;
    tl_split(j->n, ith, nth, &lo, &hi);
    if (lo < hi) act_pairs(j->c, (int)lo, (int)hi, (void *)j->E);
}

/* Per token: out = sum over its choices, in order, of weight * expert output
 * (ggml_mul, then ggml_add left to right: each step rounded), into xb. */
static void combine_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_moe_block *E = arg;
    const int d = c->m->hp.n_embd, k = E->n_used;
    for (int t = t0; t < t1; t++) {
        float *o = c->xb + (size_t)t * d;
        for (int i = 0; i < k; i++) {
            const int p = c->pair[(size_t)t * k + i];
            const int e = c->sel[(size_t)t * k + i];
            const float w = c->selw[(size_t)t * k + i];
            float *y = c->ey + (size_t)p * d;
            if (E->down_s) { /* ggml_mul by the expert's scale, then the bias and the weight */
                const float sc = ((const float *)E->down_s->data)[e];
                for (int r = 0; r < d; r++) y[r] *= sc;
            }
            if (E->down_b)
                for (int r = 0; r < d; r++) y[r] += ((const float *)E->down_b->data)[(size_t)e * d + r];
            c->kern.math.mul_add(d, o, y, w, i == 0);
        }
    }
}

/* The shared expert: its SwiGLU output times sigmoid(gate logit), the
 * sigmoid as llama.cpp writes it for the family (libm's expf), added. */
typedef struct shared_arg {
    const float *so; /* [n][d] the shared expert's output */
    int sigmoid;     /* tl_moe_block.sh_sigmoid */
} shared_arg;

static void shared_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const int d = c->m->hp.n_embd;
    const shared_arg *sa = arg;
    const float *so = sa->so;
    for (int t = t0; t < t1; t++) {
        const float l = c->shg[t];
        const float gate = sa->sigmoid ? 1.0f / (1.0f + expf(-l)) : (l / (1.0f + expf(-l))) / l;
        float *o = c->xb + (size_t)t * d;
        const float *y = so + (size_t)t * d;
        for (int r = 0; r < d; r++) o[r] = o[r] + y[r] * gate;
    }
}

static void swiglu_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const int ff = *(const int *)arg;
    for (int t = t0; t < t1; t++)
        c->kern.math.swiglu(ff, c->hb + (size_t)t * ff, c->hb + (size_t)t * ff, c->hb2 + (size_t)t * ff);
}

static void geglu_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const int ff = *(const int *)arg;
    for (int t = t0; t < t1; t++)
        c->kern.math.geglu(ff, c->hb + (size_t)t * ff, c->hb + (size_t)t * ff, c->hb2 + (size_t)t * ff, c->gelu);
}

/* Gemma 4's router input: RMSNorm(x) without a weight, times 1/sqrt(d),
 * times ffn_gate_inp.scale (three ggml ops, each rounded). */
static void router_in_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_moe_block *E = arg;
    const int d = c->m->hp.n_embd;
    const float inv = 1.0f / sqrtf((float)d), *s = E->router_s->data;
    for (int t = t0; t < t1; t++) {
        float *r = c->xr + (size_t)t * d;
        c->kern.math.rmsnorm(r, c->x + (size_t)t * d, c->ones, d, c->m->hp.norm_eps);
        for (int i = 0; i < d; i++) r[i] = (r[i] * inv) * s[i];
    }
}

/* xb = so + xb: Gemma 4's dense FFN and experts added */
static void sum_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const float *so = arg;
    const size_t d = (size_t)c->m->hp.n_embd;
    for (size_t i = (size_t)t0 * d; i < (size_t)t1 * d; i++) c->xb[i] = so[i] + c->xb[i];
}

static void moe_block(tl_cpu *c, const tl_moe_block *E, int n) {
    const int ne = E->n_expert, k = E->n_used, d = c->m->hp.n_embd;
    /* the shared expert's output goes past the pairs' rows in ey */
    float *so = c->ey + (size_t)n * k * d;
    if (E->sh_norm) { /* Gemma 4: the dense FFN first, from its own norm, normed after */
        int ff = (int)E->sh_gate->ne[1];
        tl_cpu_norm_all(c, n, c->xr, c->x, E->sh_norm);
        tl_w w[2] = {E->sh_gate, E->sh_up};
        float *y[2] = {c->hb, c->hb2};
        tl_cpu_matmul(c, 2, w, y, c->xr, n);
        tl_cpu_par_tokens(c, n, geglu_tokens, &ff);
        tl_w sd = E->sh_down;
        tl_cpu_matmul(c, 1, &sd, &so, c->hb, n);
        tl_cpu_norm_all(c, n, so, so, E->sh_post_norm);
    }
    tl_cpu_norm_all(c, n, c->xb, c->x, E->norm);
    tl_w rw = E->router;
    if (E->router_s) tl_cpu_par_tokens(c, n, router_in_tokens, (void *)E);
    tl_cpu_matmul(c, 1, &rw, &c->rlog, E->router_s ? c->xr : c->xb, n);
    tl_cpu_par_tokens(c, n, route_tokens, (void *)E);
    /* pairs grouped by expert, tokens ascending within each */
    memset(c->ecnt, 0, (size_t)ne * sizeof *c->ecnt);
    for (int i = 0; i < n * k; i++) c->ecnt[c->sel[i]]++;
    int n_act = 0;
    c->eoff[0] = 0;
    for (int e = 0; e < ne; e++) c->eoff[e + 1] = c->eoff[e] + c->ecnt[e];
    for (int e = 0; e < ne; e++)
        if (c->ecnt[e]) c->eact[n_act++] = e;
    /* most pairs first (stable: equal counts keep the expert order) */
    for (int a = 1; a < n_act; a++) {
        const int e = c->eact[a];
        int b = a;
        for (; b > 0 && c->ecnt[c->eact[b - 1]] < c->ecnt[e]; b--) c->eact[b] = c->eact[b - 1];
        c->eact[b] = e;
    }
    for (int e = 0; e < ne; e++) c->ecnt[e] = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < k; i++) {
            const int e = c->sel[(size_t)t * k + i], p = c->eoff[e] + c->ecnt[e]++;
            c->pair[(size_t)t * k + i] = p;
            c->ptok[p] = t;
        }
    if (E->gate_up) { /* fused: one matrix of gate then up rows per expert */
        const exp_mat mgu = exp_mat_of(c, E->gate_up);
        gather_arg ga = {&mgu, k};
        tl_cpu_par_tokens(c, n, gather_tokens, &ga);
        moe_job gj = {.n_mat = 1, .m = {mgu}, .y = {c->eg}};
        moe_run(c, &gj, n_act, n * k);
    } else if (E->gate->type == E->up->type) { /* one gathered input, one pass for both */
        const exp_mat mg = exp_mat_of(c, E->gate), mu = exp_mat_of(c, E->up);
        gather_arg ga = {&mg, k};
        tl_cpu_par_tokens(c, n, gather_tokens, &ga);
        moe_job gj = {.n_mat = 2, .m = {mg, mu}, .y = {c->eg, c->eu}};
        moe_run(c, &gj, n_act, n * k);
    } else {
        const exp_mat mg = exp_mat_of(c, E->gate), mu = exp_mat_of(c, E->up);
        for (int mi = 0; mi < 2; mi++) {
            gather_arg ga = {mi ? &mu : &mg, k};
            tl_cpu_par_tokens(c, n, gather_tokens, &ga);
            moe_job gj = {.n_mat = 1, .m = {*ga.m}, .y = {mi ? c->eu : c->eg}};
            moe_run(c, &gj, n_act, n * k);
        }
    }
    pair_job pj = {c, E, n * k};
    if (n * k < 4 || (int64_t)n * k * c->m->hp.n_ff_exp <= 8192 || tl_pool_size(c->pool) == 1)
        act_pairs(c, 0, n * k, (void *)E);
    else tl_pool_run(c->pool, pair_worker, &pj);
    moe_job dj = {.n_mat = 1, .m = {exp_mat_of(c, E->down)}, .y = {c->ey}};
    moe_run(c, &dj, n_act, n * k);
    /* the shared expert reads xb before the sum overwrites it */
    if (E->sh_gate && !E->sh_norm) {
        int ff = (int)E->sh_gate->ne[1];
        tl_w w[2] = {E->sh_gate, E->sh_up};
        float *y[2] = {c->hb, c->hb2};
        tl_cpu_matmul(c, 2, w, y, c->xb, n);
        tl_w sr = E->sh_router;
        tl_cpu_matmul(c, 1, &sr, &c->shg, c->xb, n);
        tl_cpu_par_tokens(c, n, swiglu_tokens, &ff);
        tl_w sd = E->sh_down;
        tl_cpu_matmul(c, 1, &sd, &so, c->hb, n);
    }
    tl_cpu_par_tokens(c, n, combine_tokens, (void *)E);
    shared_arg sa = {so, E->sh_sigmoid};
    if (E->sh_gate && !E->sh_norm) tl_cpu_par_tokens(c, n, shared_tokens, &sa);
    if (E->post_norm) tl_cpu_norm_all(c, n, c->xb, c->xb, E->post_norm);
    if (E->sh_norm) tl_cpu_par_tokens(c, n, sum_tokens, so);
    if (E->out_norm) tl_cpu_norm_all(c, n, c->xb, c->xb, E->out_norm);
    tl_cpu_par_tokens(c, n, tl_cpu_add_tokens, NULL);
}

/* ------------------------------------------------------------- encoders */

/* BERT's LayerNorm as ggml_norm computes it on the AVX2 build (every level
 * here, both modes): the mean from a double sum rounded to float, the
 * centred squares added in groups of 8 (((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7))
 * in float, each group into a double), scale 1/sqrtf(var + eps); then
 * ggml_mul by w and ggml_add of b, each one rounding. out may be in. */
static void layernorm_row(float *out, const float *in, const float *w, const float *b, int d, float eps) {
    double s = 0.0;
    for (int i = 0; i < d; i++) s += (double)in[i];
    const float mean = (float)s / (float)d;
    double sum = 0.0;
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        float v[8];
        for (int l = 0; l < 8; l++) {
            out[i + l] = in[i + l] - mean;
            v[l] = out[i + l] * out[i + l];
        }
        sum += (double)(((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])));
    }
    for (; i < d; i++) {
        out[i] = in[i] - mean;
        sum += (double)(out[i] * out[i]);
    }
    const float var = (float)(sum / d);
    const float scale = 1.0f / sqrtf(var + eps);
    for (i = 0; i < d; i++) out[i] = (out[i] * scale) * w[i] + b[i];
}

typedef struct ln_job {
    tl_w w, b;
} ln_job;

/* x = LayerNorm(x + xb) * w + b: a post-norm block's residual sum (ggml_add
 * of the block's output and its input) normed */
static void add_ln_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const ln_job *j = arg;
    const int d = c->m->hp.n_embd;
    for (int t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * d;
        const float *o = c->xb + (size_t)t * d;
        for (int i = 0; i < d; i++) x[i] = o[i] + x[i];
        layernorm_row(x, x, j->w->data, j->b->data, d, c->m->hp.norm_eps);
    }
}

/* The input: token row + token_types row 0 (+ position_embd row pos), then
 * the embeddings' LayerNorm, in llm_build_bert's order. */
static void enc_embd_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    (void)arg;
    const tl_model *m = c->m;
    const int d = m->hp.n_embd;
    for (int t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * d, *r = c->xb + (size_t)t * d;
        if (m->type_embd) {
            tl_dequantize_row((tl_type)m->type_embd->type, m->type_embd->data, r, d);
            for (int i = 0; i < d; i++) x[i] += r[i];
        }
        if (m->pos_embd) {
            const size_t rb = tl_row_size((tl_type)m->pos_embd->type, d);
            tl_dequantize_row((tl_type)m->pos_embd->type, (const uint8_t *)m->pos_embd->data + (size_t)c->tpos[t] * rb,
                              r, d);
            for (int i = 0; i < d; i++) x[i] = r[i] + x[i];
        }
        layernorm_row(x, x, m->embd_norm->data, m->embd_norm_b->data, d, m->hp.norm_eps);
    }
}

/* The tokens of t's sequence in this call: the run around t (an encoder's
 * text is one run: tl_ctx_embed sends it whole). */
static void enc_run(const tl_cpu *c, int n, int t, int *r0, int *r1) {
    int a = t, b = t + 1;
    while (a > 0 && c->tseq[a - 1] == c->tseq[t]) a--;
    while (b < n && c->tseq[b] == c->tseq[t]) b++;
    *r0 = a, *r1 = b;
}

typedef struct enc_job {
    tl_cpu *c;
    const tl_attn_block *A;
    int n;
} enc_job;

/* RoPE (nomic-bert) and V transposed, per token. */
static void enc_prep_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const enc_job *j = arg;
    const tl_attn_block *A = j->A;
    const int qd = A->n_head * A->hd, kvd = A->n_head_kv * A->hd;
    for (int t = t0; t < t1; t++) {
        if (c->m->arch->arch == TL_ARCH_NOMIC_BERT) {
            rope_apply(c, A, c->rope_cs, c->q + (size_t)t * qd, A->n_head, t);
            rope_apply(c, A, c->rope_cs, c->k + (size_t)t * kvd, A->n_head_kv, t);
        }
        for (int i = 0; i < kvd; i++) c->vt[(size_t)i * j->n + t] = c->v[(size_t)t * kvd + i];
    }
}

/* llama.cpp's attention without a cache or flash attention, per (token,
 * head): kq_j = ggml_vec_dot_f32(k_j, q) (q is a permuted view, so no
 * tinyBLAS), times the scale; ggml's soft_max (exp sums in double, times
 * (float)(1/sum)); then kqv = v^T p, whose rows tinyBLAS takes where the
 * keys are a multiple of 8 (and the head of 4, for two tokens or more),
 * ggml_vec_dot_f32 otherwise. Every key of the sequence is seen. */
static void enc_att_worker(void *arg, int ith, int nth) {
    const enc_job *j = arg;
    tl_cpu *c = j->c;
    const tl_attn_block *A = j->A;
    const int hd = A->hd, nh = A->n_head, qd = nh * hd, kvd = A->n_head_kv * hd;
    const tl_vec_dot_fn ggml_dot = c->kern.vec_dot_id[TL_F32] ? c->kern.vec_dot_id[TL_F32] : c->kern.vec_dot[TL_F32];
    float *s = c->scores + (size_t)ith * c->n_ctx;
    for (int64_t i = ith; i < (int64_t)j->n * nh; i += nth) {
        const int t = (int)(i / nh), h = (int)(i % nh), kvh = h / (nh / A->n_head_kv);
        int r0, r1;
        enc_run(c, j->n, t, &r0, &r1);
        const int nk = r1 - r0;
        const float *q = c->q + (size_t)t * qd + (size_t)h * hd;
        float mx = -INFINITY;
        for (int k = 0; k < nk; k++) {
            s[k] = ggml_dot(hd, c->k + (size_t)(r0 + k) * kvd + (size_t)kvh * hd, q) * c->m->hp.attn_scale;
            if (s[k] > mx) mx = s[k];
        }
        const double sum = c->kern.math.softmax_exp(nk, s, mx);
        const float inv = (float)(1.0 / sum);
        for (int k = 0; k < nk; k++) s[k] *= inv;
        const tl_vec_dot_fn pv = nk % 8 == 0 && hd % 4 == 0 && j->n >= 2 ? c->kern.vec_dot[TL_F32] : ggml_dot;
        float *o = c->att + (size_t)t * qd + (size_t)h * hd;
        for (int dd = 0; dd < hd; dd++) o[dd] = pv(nk, c->vt + (size_t)(kvh * hd + dd) * j->n + r0, s);
    }
}

static void encoder_attention(tl_cpu *c, const tl_attn_block *A, int n) {
    tl_w w[3] = {A->wq, A->wk, A->wv};
    float *y[3] = {c->q, c->k, c->v};
    tl_cpu_matmul(c, 3, w, y, c->x, n);
    const int qd = A->n_head * A->hd, kvd = A->n_head_kv * A->hd;
    add_bias(c->q, A->bq, n, qd);
    add_bias(c->k, A->bk, n, kvd);
    add_bias(c->v, A->bv, n, kvd);
    enc_job j = {c, A, n};
    tl_cpu_par_tokens(c, n, enc_prep_tokens, &j);
    tl_pool_run(c->pool, enc_att_worker, &j);
    tl_w wo = A->wo;
    float *o = c->xb;
    tl_cpu_matmul(c, 1, &wo, &o, c->att, n);
    add_bias(o, A->bo, n, c->m->hp.n_embd);
    ln_job lj = {A->ln, A->ln_b};
    tl_cpu_par_tokens(c, n, add_ln_tokens, &lj);
}

/* gelu(hb) as ggml_vec_gelu_f32 with its f16 table: 0 at or below -10, x at
 * or above 10 */
static void gelu_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const int n_ff = *(const int *)arg;
    for (size_t i = (size_t)t0 * n_ff; i < (size_t)t1 * n_ff; i++) {
        const float x = c->hb[i];
        c->hb[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x : tl_fp16_to_fp32(c->gelu[tl_fp32_to_fp16(x)]);
    }
}

static void encoder_ffn(tl_cpu *c, const tl_ffn_block *F, int n) {
    const int n_ff = (int)F->up->ne[1];
    if (F->gate) {
        tl_w w[2] = {F->gate, F->up};
        float *y[2] = {c->hb, c->hb2};
        tl_cpu_matmul(c, 2, w, y, c->x, n);
        tl_cpu_par_tokens(c, n, ffn_act_tokens, (void *)F);
    } else {
        tl_w wu = F->up;
        tl_cpu_matmul(c, 1, &wu, &c->hb, c->x, n);
        add_bias(c->hb, F->up_b, n, n_ff);
        tl_cpu_par_tokens(c, n, gelu_tokens, (void *)&n_ff);
    }
    tl_w wd = F->down;
    float *o = c->xb;
    tl_cpu_matmul(c, 1, &wd, &o, c->hb, n);
    add_bias(o, F->down_b, n, c->m->hp.n_embd);
    ln_job lj = {F->ln, F->ln_b};
    tl_cpu_par_tokens(c, n, add_ln_tokens, &lj);
}

/* ------------------------------------------------- per-layer inputs */

/* Gemma 4's per-layer inputs of every layer, once per call (llama.cpp's
 * project_per_layer_inputs): the projection of the scaled embedding times
 * 1/sqrt(d), RMSNorm'd by slices of n_embd_pl, plus the token's row of
 * per_layer_token_embd times sqrt(n_embd_pl), all times 1/sqrt(2). */
typedef struct ple_arg {
    const int32_t *tokens;
} ple_arg;

static void ple_tokens(tl_cpu *c, int t0, int t1, int ith, void *arg) {
    const ple_arg *a = arg;
    const tl_model *m = c->m;
    const int npl = m->hp.n_embd_pl, w = m->hp.n_layer * npl;
    const float sp = 1.0f / sqrtf((float)m->hp.n_embd), se = sqrtf((float)npl), s2 = 1.0f / sqrtf(2.0f);
    float *row = c->plt + (size_t)ith * w;
    const size_t rb = tl_row_size((tl_type)m->pl_tok_embd->type, w);
    for (int t = t0; t < t1; t++) {
        float *p = c->ple + (size_t)t * w;
        for (int i = 0; i < w; i++) p[i] *= sp;
        for (int l = 0; l < m->hp.n_layer; l++)
            c->kern.math.rmsnorm(p + (size_t)l * npl, p + (size_t)l * npl, m->pl_proj_norm->data, npl, m->hp.norm_eps);
        tl_dequantize_row((tl_type)m->pl_tok_embd->type, (const uint8_t *)m->pl_tok_embd->data + (size_t)a->tokens[t] * rb,
                          row, w);
        for (int i = 0; i < w; i++) p[i] = (p[i] + row[i] * se) * s2;
    }
}

/* x += RMSNorm(proj (gelu(gate x) * the layer's per-layer input)) * post_norm */
static void ple_gate_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const tl_ple_block *P = arg;
    const int npl = c->m->hp.n_embd_pl;
    const size_t w = (size_t)c->m->hp.n_layer * npl;
    for (int t = t0; t < t1; t++) {
        float *g = c->plg + (size_t)t * npl;
        c->kern.math.geglu(npl, g, g, c->ple + (size_t)t * w + (size_t)P->layer * npl, c->gelu);
    }
}

static void ple_block(tl_cpu *c, const tl_ple_block *P, int n) {
    tl_w gw = P->gate, pw = P->proj;
    float *o = c->xb;
    tl_cpu_matmul(c, 1, &gw, &c->plg, c->x, n);
    tl_cpu_par_tokens(c, n, ple_gate_tokens, (void *)P);
    tl_cpu_matmul(c, 1, &pw, &o, c->plg, n);
    tl_cpu_norm_all(c, n, o, o, P->post_norm);
    tl_cpu_par_tokens(c, n, tl_cpu_add_tokens, NULL);
}

static void out_scale_tokens(tl_cpu *c, int t0, int t1, void *arg) {
    const float s = *(const float *)arg;
    const size_t d = (size_t)c->m->hp.n_embd;
    for (size_t i = (size_t)t0 * d; i < (size_t)t1 * d; i++) c->x[i] *= s;
}

/* The backend's forward (backend.h): the logits of tokens b->lrow land in
 * out, b->nl rows of n_vocab floats. */
static void cpu_forward(void *be, const tl_fwd_batch *b, float *out) {
    tl_cpu *c = be;
    const int32_t *tokens = b->tokens;
    const int n = b->n, nl = b->nl, *lrow = b->lrow;
    c->tpos = b->pos;
    c->tseq = b->seq;
    c->tblk = b->blk;
    if (c->ring_R) tl_ring_begin(c, n);
    const tl_model *m = c->m;
    const tl_hparams *hp = &m->hp;
    int d = hp->n_embd;
    size_t erow = tl_row_size((tl_type)m->tok_embd->type, d);
    for (int t = 0; t < n; t++) {
        tl_dequantize_row((tl_type)m->tok_embd->type,
                          (const uint8_t *)m->tok_embd->data + (size_t)tokens[t] * erow,
                          c->x + (size_t)t * d, d);
        if (m->arch->embd_scale) /* ggml_scale by sqrtf(d) in float */
            for (int i = 0; i < d; i++) c->x[(size_t)t * d + i] *= sqrtf((float)d);
    }
    if (m->embd_norm) tl_cpu_par_tokens(c, n, enc_embd_tokens, NULL);
    if (m->pl_tok_embd) {
        tl_w pw = m->pl_model_proj;
        tl_cpu_matmul(c, 1, &pw, &c->ple, c->x, n);
        ple_arg pa = {tokens};
        tl_cpu_par_tokens_ith(c, n, ple_tokens, &pa);
    }
    rope_cache(c, n);
    c->n_att_runs = c->fast_attn ? att_runs(c, n) : 0; /* the same for every layer */
    for (int il = 0; il < hp->n_layer; il++) {
        const tl_layer *L = &m->layers[il];
        for (int k = 0; k < L->n_block; k++) {
            const tl_block *B = &L->block[k];
            switch (B->kind) {
            case TL_BLOCK_ATTN:
                if (B->u.attn.ln) encoder_attention(c, &B->u.attn, n);
                else attention_block(c, &B->u.attn, n);
                break;
            case TL_BLOCK_FFN:
                if (B->u.ffn.ln) encoder_ffn(c, &B->u.ffn, n);
                else ffn_block(c, &B->u.ffn, n);
                break;
            case TL_BLOCK_MOE: moe_block(c, &B->u.moe, n); break;
            case TL_BLOCK_GDN: tl_gdn_run(c, &B->u.gdn, n); break;
            case TL_BLOCK_PLE: ple_block(c, &B->u.ple, n); break;
            }
        }
        if (L->out_scale) tl_cpu_par_tokens(c, n, out_scale_tokens, (void *)L->out_scale->data);
    }
    if (nl > 0 && b->embd && !m->output_norm) { /* an encoder's t_embd: the last layer's output */
        for (int i = 0; i < nl; i++) memcpy(out + (size_t)i * d, c->x + (size_t)lrow[i] * d, (size_t)d * sizeof *out);
    } else if (nl > 0 && b->embd) { /* embeddings: llama.cpp's t_embd, after the output norm */
        for (int i = 0; i < nl; i++)
            c->kern.math.rmsnorm(out + (size_t)i * d, c->x + (size_t)lrow[i] * d, m->output_norm->data, d,
                                 hp->norm_eps);
    } else if (nl > 0 && m->output) {
        for (int i = 0; i < nl; i++)
            c->kern.math.rmsnorm(c->xb + (size_t)i * d, c->x + (size_t)lrow[i] * d, m->output_norm->data, d,
                    hp->norm_eps);
        tl_w wo = m->output;
        tl_cpu_matmul(c, 1, &wo, &out, c->xb, nl);
        float cap = hp->logit_softcap;
        if (cap > 0.0f)
            for (size_t i = 0; i < (size_t)nl * hp->n_vocab; i++)
                out[i] = tanhf(out[i] * (1.0f / cap)) * cap;
    }
}

/* ------------------------------------------------------------ lifecycle */

/* Zeroed buffers starting on a cache line: calloc's large blocks start 16
 * bytes past a page, so every 512-bit access to activations, attention
 * outputs and the KV cache crossed a line. calloc keeps their pages lazily
 * zeroed; the raw pointer sits just before the aligned one for xfree. */
void *tl_cpu_calloc(size_t n, size_t size, int *fail) {
    if (!n) n = 1;
    if (size && n > ((size_t)PTRDIFF_MAX - 128) / size) {
        *fail = 1;
        return NULL;
    }
    uint8_t *raw = calloc(n * size + 64 + sizeof(void *), 1);
    if (!raw) {
        *fail = 1;
        return NULL;
    }
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63);
    memcpy(p - sizeof(void *), &raw, sizeof raw);
    return p;
}

void tl_cpu_free_buf(void *p) {
    if (!p) return;
    void *raw;
    memcpy(&raw, (uint8_t *)p - sizeof(void *), sizeof raw);
    free(raw);
}

static void cpu_free(void *be) {
    tl_cpu *c = be;
    if (!c) return;
    tl_cpu_free_buf(c->wide);
    if (c->own_pool) tl_pool_free(c->pool);
    tl_big_free(c->K.mem);
    tl_big_free(c->V.mem);
    tl_ring_free(c);
    free(c->K.rb);
    free(c->K.off);
    free(c->V.rb);
    free(c->V.off);
    tl_cpu_free_buf(c->qq);
    tl_cpu_free_buf(c->x);
    tl_cpu_free_buf(c->xb);
    tl_cpu_free_buf(c->q);
    tl_cpu_free_buf(c->q16);
    tl_cpu_free_buf(c->att);
    tl_cpu_free_buf(c->k);
    tl_cpu_free_buf(c->v);
    tl_cpu_free_buf(c->hb);
    tl_cpu_free_buf(c->hb2);
    tl_cpu_free_buf(c->xa);
    tl_cpu_free_buf(c->scores);
    tl_cpu_free_buf(c->vacc);
    tl_cpu_free_buf(c->ascr);
    tl_cpu_free_buf(c->apart);
    tl_cpu_free_buf(c->aleft);
    tl_cpu_free_buf(c->att_run);
    tl_cpu_free_buf(c->rope_cs);
    tl_cpu_free_buf(c->rope_cs_swa);
    tl_cpu_free_buf(c->ones);
    tl_cpu_free_buf(c->ple);
    tl_cpu_free_buf(c->plg);
    tl_cpu_free_buf(c->plt);
    tl_cpu_free_buf(c->xr);
    tl_cpu_free_buf(c->gelu);
    tl_cpu_free_buf(c->rlog);
    tl_cpu_free_buf(c->sel);
    tl_cpu_free_buf(c->selw);
    tl_cpu_free_buf(c->ecnt);
    tl_cpu_free_buf(c->eoff);
    tl_cpu_free_buf(c->eact);
    tl_cpu_free_buf(c->ptok);
    tl_cpu_free_buf(c->pair);
    tl_cpu_free_buf(c->xg);
    tl_cpu_free_buf(c->eg);
    tl_cpu_free_buf(c->eu);
    tl_cpu_free_buf(c->ey);
    tl_cpu_free_buf(c->shg);
    tl_cpu_free_buf(c->qg);
    tl_cpu_free_buf(c->qgate);
    tl_cpu_free_buf(c->vt);
    tl_gdn_free(c->gdn);
    free(c);
}

static void cpu_copy_block(void *be, int32_t from, int32_t to) {
    tl_cpu *c = be;
    for (int il = 0; il < c->m->hp.n_kv_layer; il++) {
        if (c->ring_R && c->ring_l[il]) continue; /* in rings, not blocks */
        const size_t kb = (size_t)TL_KV_BLOCK * c->K.rb[il], vb = (size_t)TL_KV_BLOCK * c->V.rb[il];
        uint8_t *k = c->K.mem + c->K.off[il], *v = c->V.mem + c->V.off[il];
        memcpy(k + (size_t)to * kb, k + (size_t)from * kb, kb);
        memcpy(v + (size_t)to * vb, v + (size_t)from * vb, vb);
    }
}

static void cpu_read_block(void *be, int32_t b, void *p) {
    tl_cpu *c = be;
    uint8_t *o = p;
    for (int il = 0; il < c->m->hp.n_kv_layer; il++) {
        if (c->ring_R && c->ring_l[il]) continue; /* in rings, not blocks */
        const size_t kb = (size_t)TL_KV_BLOCK * c->K.rb[il], vb = (size_t)TL_KV_BLOCK * c->V.rb[il];
        memcpy(o, c->K.mem + c->K.off[il] + (size_t)b * kb, kb);
        memcpy(o + kb, c->V.mem + c->V.off[il] + (size_t)b * vb, vb);
        o += kb + vb;
    }
}

static void cpu_write_block(void *be, int32_t b, const void *p) {
    tl_cpu *c = be;
    const uint8_t *i = p;
    for (int il = 0; il < c->m->hp.n_kv_layer; il++) {
        if (c->ring_R && c->ring_l[il]) continue; /* in rings, not blocks */
        const size_t kb = (size_t)TL_KV_BLOCK * c->K.rb[il], vb = (size_t)TL_KV_BLOCK * c->V.rb[il];
        memcpy(c->K.mem + c->K.off[il] + (size_t)b * kb, i, kb);
        memcpy(c->V.mem + c->V.off[il] + (size_t)b * vb, i + kb, vb);
        i += kb + vb;
    }
}

/* A sequence's state: its Gated DeltaNet layers', then its rings' (a
 * snapshot holds both, in that order). */
static int cpu_rs_seek(void *be, int seq, int pos) {
    tl_cpu *c = be;
    const int g = c->gdn ? tl_gdn_seek(c, seq, pos) : 0, r = c->ring_R ? tl_ring_seek(c, seq, pos) : 0;
    return g || r ? -1 : 0;
}

static int cpu_rs_save(void *be, int seq, int pos, void *p) {
    tl_cpu *c = be;
    if (c->gdn && tl_gdn_snap_save(c, seq, pos, p)) return -1;
    const size_t g = c->gdn ? tl_gdn_snap_bytes(c) : 0;
    return c->ring_R && tl_ring_snap_save(c, seq, pos, (uint8_t *)p + g) ? -1 : 0;
}

static void cpu_rs_load(void *be, int seq, int pos, const void *p) {
    tl_cpu *c = be;
    if (c->gdn) tl_gdn_snap_load(c, seq, pos, p);
    if (c->ring_R) tl_ring_snap_load(c, seq, pos, (const uint8_t *)p + (c->gdn ? tl_gdn_snap_bytes(c) : 0));
}

/* llama.cpp's build_pooling, LLAMA_POOLING_TYPE_RANK, op by op on the CPU:
 * cls (a matmul, + bias, each ggml_add one rounding) then tanhf
 * (ggml_vec_tanh_f32); cls.output (+ bias); for qwen3 ggml_soft_max over
 * the outputs. The matmuls take tl_cpu_matmul's path, so exact mode orders
 * them as ggml does (tinyBLAS, or vec_dot for row counts not a multiple of
 * 4, as Qwen3-Reranker's 2). Not yet: ModernBERT's GELU and head norm, and
 * its mean-pooled variant, which come with that backbone. */
static void cpu_head(void *be, const float *x, float *y) {
    tl_cpu *c = be;
    const tl_model *m = c->m;
    const float *in = x;
    if (m->cls) {
        const int n = (int)m->cls->ne[1];
        tl_w w = m->cls;
        float *h = c->xb;
        tl_cpu_matmul(c, 1, &w, &h, x, 1);
        add_bias(h, m->cls_b, 1, n);
        for (int i = 0; i < n; i++) h[i] = tanhf(h[i]);
        in = h;
    }
    const int n_out = tl_model_n_cls_out(m);
    if (m->cls_out) {
        tl_w w = m->cls_out;
        tl_cpu_matmul(c, 1, &w, &y, in, 1);
        add_bias(y, m->cls_out_b, 1, n_out);
    } else {
        memmove(y, in, (size_t)n_out * sizeof *y);
    }
    if (m->arch->arch == TL_ARCH_QWEN3) softmax_row(c, n_out, y);
}

static const tl_backend_ops cpu_ops = {cpu_forward, cpu_copy_block, cpu_read_block, cpu_write_block, cpu_free,
                                       NULL, NULL, NULL, cpu_head};
static const tl_backend_ops cpu_ops_rs = {cpu_forward, cpu_copy_block, cpu_read_block, cpu_write_block, cpu_free,
                                          cpu_rs_seek, cpu_rs_save, cpu_rs_load, cpu_head};

int tl_cpu_backend_new(const tl_model *m, const tl_backend_params *p, tl_backend *out, tl_error *err) {
    memset(out, 0, sizeof *out);
    const tl_hparams *hp = &m->hp;
    static const tl_type kv_types[] = {TL_F16, TL_Q8_0, TL_Q4_0}; /* by tl_kv_type */
    if (p->kv_type_k < 0 || p->kv_type_k > 2 || p->kv_type_v < 0 || p->kv_type_v > 2)
        return tl_fail(err, TL_ERR_ARG, "unknown KV cache type");
    const tl_kv_format *kf = tl_kv_format_of(kv_types[p->kv_type_k]), *vf = tl_kv_format_of(kv_types[p->kv_type_v]);
    for (int k = 0; k < 2; k++) {
        const int hd = k ? hp->head_dim_swa : hp->head_dim;
        if (hd % kf->block || hd % vf->block)
            return tl_fail(err, TL_ERR_UNSUPPORTED,
                           "a KV cache of %s needs a head size that is a multiple of %d (this model's is %d)",
                           hd % kf->block ? kf->name : vf->name, 32, hd);
    }
    const int want_fast_attn = p->numerics == TL_NUMERICS_FAST && hp->head_dim % 8 == 0 && hp->head_dim_swa % 8 == 0;
    /* each pool layer's rows at its own width (Gemma 4's differ); the
     * sliding-window ones too unless they are in rings */
    size_t blk_bytes = (size_t)TL_KV_BLOCK * (tl_model_kv_bytes_per_pos(m, p->kv_type_k, p->kv_type_v) +
                                              (p->ring_blocks ? 0 : tl_model_kv_window_bytes(m, p->kv_type_k,
                                                                                            p->kv_type_v, NULL)));
    if (!blk_bytes) /* no cached layer: a block's bookkeeping still sizes the pool */
        blk_bytes = (size_t)TL_KV_BLOCK * (kf->row_bytes((int64_t)hp->n_head_kv * hp->head_dim) +
                                           vf->row_bytes((int64_t)hp->n_head_kv * hp->head_dim));
    const size_t per_seq = (size_t)(p->n_ctx + TL_KV_BLOCK - 1) / TL_KV_BLOCK;
    size_t n_blocks = p->kv_bytes ? p->kv_bytes / blk_bytes
                                  : per_seq * (size_t)(p->n_seq_max > 0 ? p->n_seq_max : 1);
    if (n_blocks == 0)
        return tl_fail(err, TL_ERR_ARG, "KV memory of %zu bytes holds no block (one takes %zu)",
                       p->kv_bytes, blk_bytes);
    if (n_blocks > (1u << 30) / TL_KV_BLOCK)
        return tl_fail(err, TL_ERR_ARG, "KV memory of %zu bytes is too large", p->kv_bytes);
    /* position_embd has a row per trained position and no more */
    if (m->pos_embd && p->n_ctx > hp->n_ctx_train)
        return tl_fail(err, TL_ERR_ARG, "a context of %d exceeds %s's %d positions (position_embd)", p->n_ctx,
                       m->arch->name, hp->n_ctx_train);
    tl_cpu *c = calloc(1, sizeof *c);
    if (!c) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = p->n_ctx;
    c->n_batch = p->n_batch;
    c->q_dim = hp->q_dim_max;
    c->kv_dim = hp->kv_dim_max;
    c->K.f = kf;
    c->V.f = vf;
    c->fa = !want_fast_attn && (kf->type != TL_F16 || vf->type != TL_F16);
    int hd0 = hp->head_dim; /* layer 0's head size (rot_sizes) */
    for (int b = 0; b < m->layers[0].n_block; b++)
        if (m->layers[0].block[b].kind == TL_BLOCK_ATTN) hd0 = m->layers[0].block[b].u.attn.hd;
    c->rot_on = hd0 % 64 == 0;
    int gmax = 1, kvh_max = 1; /* query heads per KV head, KV heads: the most of any layer */
    for (int il = 0; il < hp->n_layer; il++)
        for (int b = 0; b < m->layers[il].n_block; b++)
            if (m->layers[il].block[b].kind == TL_BLOCK_ATTN) {
                const tl_attn_block *A = &m->layers[il].block[b].u.attn;
                if (A->n_head / A->n_head_kv > gmax) gmax = A->n_head / A->n_head_kv;
                if (A->n_head_kv > kvh_max) kvh_max = A->n_head_kv;
            }
    tl_kernels_init(&c->kern, tl_cpu_choose(), p->numerics == TL_NUMERICS_EXACT ? TL_NUM_EXACT : TL_NUM_FAST);
    int st = TL_OK;
    if (p->share_pool) {
        c->pool = p->share_pool;
    } else if ((st = tl_pool_new(p->n_threads, &c->pool, err))) {
        free(c);
        return st;
    } else {
        c->own_pool = 1;
    }
    int fail = 0, nb = p->n_batch, nt = tl_pool_size(c->pool);
    const int nkl = hp->n_kv_layer > 0 ? hp->n_kv_layer : 1;
    c->K.rb = calloc((size_t)nkl, sizeof(size_t));
    c->K.off = calloc((size_t)nkl, sizeof(size_t));
    c->V.rb = calloc((size_t)nkl, sizeof(size_t));
    c->V.off = calloc((size_t)nkl, sizeof(size_t));
    if (!c->K.rb || !c->K.off || !c->V.rb || !c->V.off) fail = 1;
    const int n_seq_all = p->n_seq_max + p->n_seq_embd + 1;
    if (!fail && p->ring_blocks && tl_ring_new(c, n_seq_all, p->ring_blocks, err)) {
        cpu_free(c);
        return TL_ERR_NOMEM;
    }
    size_t kn = 0, vn = 0;
    for (int l = 0; !fail && l < hp->n_kv_layer; l++) {
        /* a ring layer: n_seq_all rings of ring_R blocks */
        const size_t nb_l = c->ring_R && c->ring_l[l] ? (size_t)n_seq_all * (size_t)c->ring_R : n_blocks;
        c->K.rb[l] = kf->row_bytes(m->kv_dim[l]);
        c->V.rb[l] = vf->row_bytes(m->kv_dim[l]);
        c->K.off[l] = kn;
        c->V.off[l] = vn;
        kn += nb_l * TL_KV_BLOCK * c->K.rb[l];
        vn += nb_l * TL_KV_BLOCK * c->V.rb[l];
    }
    const int n_ff = hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp; /* dense or shared expert */
    int widest = n_ff > c->q_dim ? n_ff : c->q_dim;
    if (hp->n_embd > widest) widest = hp->n_embd;
    if (hp->n_ff_exp > widest) widest = hp->n_ff_exp;
    if (hp->n_rec_layer > 0 && hp->ssm_n_vh * hp->ssm_d_state > widest) widest = hp->ssm_n_vh * hp->ssm_d_state; /* ssm_out */
    size_t xa_row = tl_row_size(TL_F32, widest); /* f32 is the widest activation format */
    if (!fail) {
        c->K.mem = tl_big_alloc(kn ? kn : 1);
        c->V.mem = tl_big_alloc(vn ? vn : 1);
    }
    if (!c->K.mem || !c->V.mem) fail = 1;
    /* The cache is laid out layer by layer, so a short request touches the
     * start of every layer's K and V: on 2 MiB pages that alone made 4 MiB a
     * layer resident (120 MiB for SmolLM2's 30), and a stream's growth went
     * 2 MiB at a time per layer. Small pages keep it resident as written; a
     * block-major layout would let it have large pages again. */
    if (!fail) {
        tl_small_pages(c->K.mem, kn, kn);
        tl_small_pages(c->V.mem, vn, vn);
    }
    c->x = tl_cpu_calloc((size_t)nb * hp->n_embd, sizeof(float), &fail);
    c->xb = tl_cpu_calloc((size_t)nb * (widest > hp->n_embd ? widest : hp->n_embd), sizeof(float), &fail);
    c->q = tl_cpu_calloc((size_t)nb * c->q_dim, sizeof(float), &fail);
    c->q16 = tl_cpu_calloc((size_t)nb * c->q_dim, sizeof(uint16_t), &fail);
    if (c->fa && kf->type != TL_F16) {
        c->qq_row = (size_t)hp->n_head * tl_row_size(TL_Q8_0, hp->head_dim_max);
        c->qq = tl_cpu_calloc((size_t)nb, c->qq_row, &fail);
    }
    c->att = tl_cpu_calloc((size_t)nb * c->q_dim, sizeof(float), &fail);
    if (m->arch->hybrid) {
        c->qg = tl_cpu_calloc((size_t)nb * 2 * c->q_dim, sizeof(float), &fail);
        c->qgate = tl_cpu_calloc((size_t)nb * c->q_dim, sizeof(float), &fail);
    }
    c->k = tl_cpu_calloc((size_t)nb * c->kv_dim, sizeof(float), &fail);
    c->v = tl_cpu_calloc((size_t)nb * c->kv_dim, sizeof(float), &fail);
    c->hb = tl_cpu_calloc((size_t)nb * n_ff, sizeof(float), &fail);
    c->hb2 = tl_cpu_calloc((size_t)nb * n_ff, sizeof(float), &fail);
    if (hp->n_expert > 0) {
        const size_t np = (size_t)nb * hp->n_expert_used;
        c->rlog = tl_cpu_calloc((size_t)nb * hp->n_expert, sizeof(float), &fail);
        c->sel = tl_cpu_calloc(np, sizeof(int), &fail);
        c->selw = tl_cpu_calloc(np, sizeof(float), &fail);
        c->ecnt = tl_cpu_calloc((size_t)hp->n_expert + 1, sizeof(int), &fail);
        c->eoff = tl_cpu_calloc((size_t)hp->n_expert + 1, sizeof(int), &fail);
        c->eact = tl_cpu_calloc((size_t)hp->n_expert, sizeof(int), &fail);
        c->ptok = tl_cpu_calloc(np, sizeof(int), &fail);
        c->pair = tl_cpu_calloc(np, sizeof(int), &fail);
        c->xg_row = xa_row;
        c->xg = tl_cpu_calloc(np, xa_row, &fail);
        c->eg = tl_cpu_calloc(np * hp->n_ff_exp * 2, sizeof(float), &fail); /* fused: gate and up */
        c->eu = tl_cpu_calloc(np * hp->n_ff_exp, sizeof(float), &fail);
        c->ey = tl_cpu_calloc((np + (size_t)nb) * hp->n_embd, sizeof(float), &fail);
        c->shg = tl_cpu_calloc((size_t)nb, sizeof(float), &fail);
    }
    c->xa_row = xa_row;
    c->xa = tl_cpu_calloc((size_t)nb, xa_row, &fail);
    c->scores = tl_cpu_calloc((size_t)nt * c->n_ctx, sizeof(float), &fail);
    c->wide_size = MM_ROW_TILE * tl_row_size(TL_Q8_0, ((widest + 31) / 32) * 32);
    const size_t unpacked = tl_r8q6w_bytes(MM_ROW_TILE, ((widest + QK_K - 1) / QK_K) * QK_K);
    if (c->wide_size < unpacked) c->wide_size = unpacked;
    c->wide = tl_cpu_calloc((size_t)nt, c->wide_size, &fail);
    c->vacc = tl_cpu_calloc((size_t)nt * 9 * hp->head_dim_max, sizeof(float), &fail);
    const int n_ones = hp->head_dim_max > hp->n_embd ? hp->head_dim_max : hp->n_embd;
    c->ones = tl_cpu_calloc((size_t)n_ones, sizeof(float), &fail);
    for (int i = 0; c->ones && i < n_ones; i++) c->ones[i] = 1.0f;
    c->fast_attn = want_fast_attn;
    /* whole cache lines per thread */
    c->ascr_n = (tl_attn_scratch(hp->head_dim_max, gmax, TL_KV_BLOCK, ATT_TILE) + 15) & ~(size_t)15;
    if (c->fast_attn) {
        c->ascr = tl_cpu_calloc((size_t)nt * c->ascr_n, sizeof(float), &fail);
        c->att_run = tl_cpu_calloc((size_t)nb + 1, sizeof(int), &fail);
        if (nt > 1) {
            /* SPLIT_T rows' worth over a whole context (a sequence's positions
             * stay below n_ctx; att_plan checks what a call needs) */
            const size_t n_seg = (size_t)(c->n_ctx + TL_ATTN_SEG - 1) / TL_ATTN_SEG + 1;
            c->apart_n = n_seg * SPLIT_T * hp->n_head * (hp->head_dim_max + 2);
            if (c->apart_n > SPLIT_MAX_FLOATS) c->apart_n = SPLIT_MAX_FLOATS;
            c->apart = tl_cpu_calloc(c->apart_n, sizeof(float), &fail);
            c->aleft = tl_cpu_calloc((size_t)SPLIT_RUNS * kvh_max, sizeof *c->aleft, &fail);
        }
    }
    c->rope_cs = tl_cpu_calloc((size_t)nb * hp->n_rot, sizeof(float), &fail);
    if (hp->n_swa > 0) c->rope_cs_swa = tl_cpu_calloc((size_t)nb * hp->n_rot_swa, sizeof(float), &fail);
    if (m->pl_tok_embd) {
        c->ple = tl_cpu_calloc((size_t)nb * hp->n_layer * hp->n_embd_pl, sizeof(float), &fail);
        c->plg = tl_cpu_calloc((size_t)nb * hp->n_embd_pl, sizeof(float), &fail);
        c->plt = tl_cpu_calloc((size_t)nt * hp->n_layer * hp->n_embd_pl, sizeof(float), &fail);
    }
    if (hp->n_expert > 0) c->xr = tl_cpu_calloc((size_t)nb * hp->n_embd, sizeof(float), &fail);
    if (!hp->causal) c->vt = tl_cpu_calloc((size_t)nb * c->kv_dim, sizeof(float), &fail);
    if (m->arch->act == TL_ACT_GELU || m->arch->act == TL_ACT_GELU_SEQ) {
        c->gelu = tl_cpu_calloc(65536, sizeof(uint16_t), &fail);
        if (c->gelu) tl_gelu_table(c->gelu);
    }
    if (fail) {
        cpu_free(c);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory for a context of %d positions", p->n_ctx);
    }
    if ((st = tl_model_packed(m, &c->kern, &c->pk, err)) ||
        (hp->n_rec_layer > 0 && (st = tl_gdn_new(c, n_seq_all, err)))) {
        cpu_free(c);
        return st;
    }
    /* an expert's slice must start a packed group of rows */
    for (int il = 0; il < hp->n_layer; il++)
        for (int b = 0; b < m->layers[il].n_block; b++) {
            const tl_block *B = &m->layers[il].block[b];
            if (B->kind != TL_BLOCK_MOE) continue;
            const tl_w ew[3] = {B->u.moe.gate_up ? B->u.moe.gate_up : B->u.moe.gate, B->u.moe.up, B->u.moe.down};
            for (int i = 0; i < 3; i++)
                if (ew[i] && tl_kern_packs_matrix(&c->kern, (tl_type)ew[i]->type, ew[i]->ne[1]) &&
                    (ew[i]->ne[1] % tl_kern_row_align(&c->kern, (tl_type)ew[i]->type) || !packed(c, ew[i]))) {
                    cpu_free(c);
                    return tl_fail(err, TL_ERR_UNSUPPORTED, "layer %d: experts of %lld rows cannot be packed (%s)", il,
                                   (long long)ew[i]->ne[1], tl_type_info(ew[i]->type)->name);
                }
        }
    out->ops = c->gdn || c->ring_R ? &cpu_ops_rs : &cpu_ops;
    out->state = c;
    if (c->gdn) {
        out->rs_bytes = out->rs_read_bytes = tl_gdn_snap_bytes(c);
        out->rs_seq_bytes = tl_gdn_seq_bytes(c);
    }
    if (c->ring_R) {
        out->rs_bytes += tl_ring_snap_bytes(c);
        out->window_bytes = tl_ring_seq_bytes(c);
    }
    out->name = c->kern.name;
    out->numerics = c->kern.mode == TL_NUM_EXACT ? "exact" : "fast";
    out->n_blocks = (int)n_blocks;
    out->block_bytes = blk_bytes;
    out->kv_type_k = p->kv_type_k;
    out->kv_type_v = p->kv_type_v;
    out->pool = c->pool;
    return TL_OK;
}
