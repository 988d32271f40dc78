/* forward: the transformer forward pass on the CPU and the context that owns
 * its state. Numerics follow llama.cpp's CPU backend where it matters for
 * agreement: activations quantized per row to the weight's partner format,
 * RMSNorm sums in double, K and V cached as f16, Q rounded to f16 for the
 * scores, softmax weights rounded to f16 before multiplying V. */
#include "forward.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/mathfn.h"
#include "kv.h"
#include "kvfmt.h"
#include "packed.h"
#include "util.h"

/* Call sizes tl_ctx_decode times (speculation's cost model), and how many of
 * each size's latest calls its cost is the lowest of: another process on the
 * cores only ever adds time, and one call slowed threefold must not keep a
 * size looking dear (an average took tens of steps to forget it, and the
 * policy stopped guessing meanwhile); four calls slower for good are. */
#define COST_N 64
#define COST_WIN 4

struct tl_ctx {
    const tl_model *m;
    tl_kernels kern;
    tl_pool *pool;
    int own_pool;       /* 0: borrowed from another context (tl_ctx_params.share_threads) */
    int n_ctx, n_batch, n_seq, n_logits_max;
    int q_dim, kv_dim;
    tl_kv *kv;          /* blocks, block tables, prefix cache */
    uint8_t *kc, *vc;   /* per layer [n_blocks][TL_KV_BLOCK] rows of kv_rb bytes (kvf); with
                         * fast_attn a K block is kept transposed: element i of slot s at i*16+s */
    const tl_kv_format *kvf; /* what a cache element is */
    size_t kv_rb, kv_hb; /* bytes of a K/V row (kv_dim elements) and of one head's part */
    size_t layer_stride;/* cache bytes per layer */
    int *tpos, *tseq;   /* [n_batch] position and sequence of each batch token */
    int *seq_cnt;       /* [n_seq] scratch: tokens per sequence in a batch */
    int *lrow;          /* [n_batch] tokens whose logits a call keeps */
    float *x, *xb;      /* [n_batch][d] residual, normed */
    float *q, *k, *v;   /* [n_batch][q_dim], [n_batch][kv_dim] x2 */
    uint16_t *q16;      /* [n_batch][q_dim] q rounded to f16 */
    float *att;         /* [n_batch][q_dim] attention output */
    float *hb, *hb2;    /* [n_batch][n_ff] */
    uint8_t *xa;        /* quantized activations: n_batch rows of xa_row bytes */
    size_t xa_row;
    float *scores;      /* [n_threads][n_ctx] */
    uint8_t *wide;      /* [n_threads][wide_size]: weight rows widened for prompts */
    size_t wide_size;
    float *vacc;        /* [n_threads][9][head_dim]: 8 partial sums + result */
    float *ascr;        /* [n_threads][ascr_n]: the fast attention's scratch */
    int *att_run;       /* [n_batch + 1]: starts of the fast attention's runs */
    float *apart;       /* apart_n floats: the segment states of runs split between
                         * threads (att_job.base) */
    size_t apart_n;
    atomic_int *aleft;  /* [SPLIT_RUNS][n_head_kv]: the segments still running */
    int n_att_runs;     /* runs in the current forward call */
    size_t ascr_n;
    int fast_attn;      /* the fast numerics' attention (tl_attn_online) */
    float *rope_cs;     /* [n_batch][n_rot/2][2] cos, sin */
    float *rope_cs_swa; /* the same for sliding-window layers' base (or NULL) */
    uint16_t *gelu;     /* [65536] GELU table (GeGLU models), else NULL */
    float *logits;      /* eval and decode output */
    size_t logits_cap;  /* floats */
    int logits_first, logits_n; /* rows held: tokens [first, first+n) of the last eval */
    int blogits_n;      /* rows held by the last tl_ctx_decode */
    int32_t *bseq0;     /* [n_batch] zeros: tl_ctx_eval's batches are all sequence 0 */
    double cost[COST_N + 1]; /* tl_ctx_decode's seconds per call of n tokens (the lowest of cost_win) */
    double cost_win[COST_N + 1][COST_WIN]; /* the latest calls' seconds */
    int cost_seen[COST_N + 1];   /* calls in cost_win (up to COST_WIN) */
    int cost_next[COST_N + 1];   /* the slot the next call takes */
    uint8_t *blg;       /* [n_batch] tl_ctx_eval's logits flags */
    const tl_packed *pk; /* the model's packed weights for this kernel table (shared) */
};

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

/* Rows [r0, r1) of matrix mi against tokens [t0, t1). */
static void mm_tile(const mm_job *j, int mi, int ith, int64_t r0, int64_t r1, int t0, int t1) {
    tl_w w = j->w[mi];
    const int64_t rows = w->ne[1], cols = w->ne[0];
    const size_t rb = j->packed[mi] ? tl_kern_row_bytes(j->k, (tl_type)w->type, cols) : tl_row_size((tl_type)w->type, cols);
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * rb;
    const uint8_t *xa = j->xa + (size_t)t0 * j->xa_row;
    float *y = j->y[mi] + (size_t)t0 * rows + r0;
    tl_gemm_fn gemm = j->packed[mi] ? j->k->gemm[w->type] : NULL;
    /* Enough tokens: widen a slice of Q4_0/Q5_0 rows to Q8_0 once rather than
     * unpack it for every group of four tokens (same bits). */
    tl_widen_fn widen = t1 - t0 >= 16 && j->wide && j->k->gemm[TL_Q8_0] ? j->k->widen[w->type] : NULL;
    if (gemm && widen) {
        uint8_t *wide = j->wide + (size_t)ith * j->wide_size;
        widen(wr, rb, (int)(r1 - r0), cols, wide);
        j->k->gemm[TL_Q8_0](cols, wide, tl_row_size(TL_Q8_0, cols), (int)(r1 - r0), xa, j->xa_row, t1 - t0, y,
                            (size_t)rows);
    } else if (gemm) {
        gemm(cols, wr, rb, (int)(r1 - r0), xa, j->xa_row, t1 - t0, y, (size_t)rows);
    } else {
        tl_vec_dot_fn dot = j->k->vec_dot[w->type];
        for (int t = 0; t < t1 - t0; t++)
            for (int64_t r = 0; r < r1 - r0; r++)
                y[(size_t)t * rows + r] = dot(cols, wr + (size_t)r * rb, xa + (size_t)t * j->xa_row);
    }
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
typedef void (*tok_fn)(tl_ctx *c, int t0, int t1, void *arg);

typedef struct tok_job {
    tl_ctx *c;
    tok_fn fn;
    void *arg;
    int n;
} tok_job;

static void tok_worker(void *arg, int ith, int nth) {
    const tok_job *j = arg;
    int64_t lo, hi;
    tl_split(j->n, ith, nth, &lo, &hi);
    if (lo < hi) j->fn(j->c, (int)lo, (int)hi, j->arg);
}

static void par_tokens(tl_ctx *c, int n, tok_fn fn, void *arg) {
    if (n < 4 || tl_pool_size(c->pool) == 1) {
        fn(c, 0, n, arg);
        return;
    }
    tok_job j = {c, fn, arg, n};
    tl_pool_run(c->pool, tok_worker, &j);
}

/* The packed twin of w, or NULL (then the matmul takes the plain dot path). */
static tl_w packed(const tl_ctx *c, tl_w w) { return tl_packed_find(c->pk, w); }

typedef struct quant_job {
    tl_type wt, vt;
    const float *x;
    int64_t cols;
    size_t row;
    int gemm; /* rows as the gemm kernels of wt take them, else plain vt rows */
} quant_job;

static void quant_tokens(tl_ctx *c, int t0, int t1, void *arg) {
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
static size_t act_row(const tl_ctx *c, tl_w w, int *gemm) {
    *gemm = c->kern.gemm[w->type] != NULL;
    return *gemm ? tl_kern_act_row_size(&c->kern, (tl_type)w->type, w->ne[0])
                 : tl_row_size(tl_type_info(w->type)->vec_dot_type, w->ne[0]);
}

/* Quantizes n_tok rows of x (width cols, stride cols) into the activation
 * format of w's type, then y_i = W_i x for each matrix. */
static void matmul(tl_ctx *c, int n_mat, tl_w *w, float **y, const float *x, int n_tok) {
    int64_t cols = w[0]->ne[0];
    tl_type vt = tl_type_info(w[0]->type)->vec_dot_type;
    int gemm, g;
    const size_t row = act_row(c, w[0], &gemm);
    for (int i = 1; i < n_mat; i++)
        if (act_row(c, w[i], &g) != row || g != gemm || tl_type_info(w[i]->type)->vec_dot_type != vt ||
            (gemm && tl_kern_row_align(&c->kern, (tl_type)w[i]->type) !=
                         tl_kern_row_align(&c->kern, (tl_type)w[0]->type))) {
            for (int k = 0; k < n_mat; k++) matmul(c, 1, &w[k], &y[k], x, n_tok);
            return;
        }
    tl_w pw[3];
    for (int i = 0; i < n_mat; i++)
        pw[i] = !gemm ? NULL : tl_kern_packs(&c->kern, (tl_type)w[i]->type) ? packed(c, w[i]) : w[i];
    quant_job qj = {(tl_type)w[0]->type, vt, x, cols, row, gemm};
    par_tokens(c, n_tok, quant_tokens, &qj);
    mm_job j = {.k = &c->kern, .n_mat = n_mat, .xa = c->xa, .xa_row = row, .n_tok = n_tok,
                .wide = c->wide, .wide_size = c->wide_size};
    for (int i = 0; i < n_mat; i++) {
        j.w[i] = pw[i] ? pw[i] : w[i];
        j.packed[i] = pw[i] != NULL;
        j.y[i] = y[i];
        j.tiles[i + 1] = j.tiles[i] + (int)((w[i]->ne[1] + MM_ROW_TILE - 1) / MM_ROW_TILE);
    }
    atomic_init(&j.next, 0);
    tl_pool_run(c->pool, mm_worker, &j);
}

/* -------------------------------------------------------- element-wise */

/* cos/sin per position and rotary pair, with theta built as ggml builds it:
 * theta_0 = pos, theta_{i+1} = theta_i * base^(-2/n_rot), in float. */
static void rope_cache_base(tl_ctx *c, float *out, float base, int n_tok) {
    const tl_hparams *hp = &c->m->hp;
    float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
    const float *ff = c->m->rope_freqs ? c->m->rope_freqs->data : NULL;
    for (int t = 0; t < n_tok; t++) {
        float theta = (float)c->tpos[t];
        float *cs = out + (size_t)t * hp->n_rot;
        for (int i = 0; i < hp->n_rot / 2; i++) {
            /* ggml divides a copy of theta by the frequency factor */
            float th = ff ? theta / ff[i] : theta;
            cs[2 * i] = cosf(th);
            cs[2 * i + 1] = sinf(th);
            theta *= theta_scale;
        }
    }
}

static void rope_cache(tl_ctx *c, int n_tok) {
    rope_cache_base(c, c->rope_cs, c->m->hp.rope_base, n_tok);
    if (c->rope_cs_swa) rope_cache_base(c, c->rope_cs_swa, c->m->hp.rope_base_swa, n_tok);
}

static void rope_apply(const tl_ctx *c, const float *cs_all, float *v, int n_heads, int t) {
    const tl_hparams *hp = &c->m->hp;
    c->kern.math.rope(v, n_heads, hp->head_dim, hp->n_rot, cs_all + (size_t)t * hp->n_rot, c->m->arch->rope_neox);
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
    tl_ctx *c;
    int layer, n_tok;
    int n_runs;      /* fast attention: runs in c->att_run */
    atomic_int next; /* fast attention: the next item to claim */
    int split;       /* items are chunks of chunk (run, KV head, segment)s */
    int chunk;
    int seg0[SPLIT_RUNS], nseg[SPLIT_RUNS], item0[SPLIT_RUNS + 1];
    size_t base[SPLIT_RUNS]; /* run r's states in c->apart: [KV head][segment][T][G] o, then m, l */
} att_job;

/* Byte offset of position j's row of a sequence, from a layer's K or V base. */
static inline size_t kv_row(const tl_ctx *c, const int32_t *blk, int j) {
    return ((size_t)blk[j / TL_KV_BLOCK] * TL_KV_BLOCK + (size_t)(j % TL_KV_BLOCK)) * c->kv_rb;
}

/* One (token, head): scores over all cached positions <= its own, softmax,
 * weighted sum of V. Keys are visited in position order whatever the batch,
 * the sequence's other tokens or where its blocks lie. */
static void attend(tl_ctx *c, int layer, int t, int h, float *s, float *acc) {
    const tl_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, pos = c->tpos[t];
    int kvh = h / (hp->n_head / hp->n_head_kv);
    const uint16_t *q = c->q16 + (size_t)t * c->q_dim + (size_t)h * hd;
    const int32_t *blk = tl_kv_seq_peek(c->kv, c->tseq[t])->blk;
    /* llama.cpp's f16 dots: the cache is F16 here (kvf->exact_attn) */
    const uint8_t *kb = c->kc + (size_t)layer * c->layer_stride + (size_t)kvh * c->kv_hb;
    const uint16_t *vb = (const uint16_t *)(const void *)(c->vc + (size_t)layer * c->layer_stride + (size_t)kvh * c->kv_hb);
    const size_t kvs = c->kv_rb / sizeof(uint16_t);
    int prescaled = c->m->arch->q_prescale;
    float scale = hp->attn_scale;
    /* A sliding-window layer sees keys j with pos - j < n_swa. The keys
     * before it are masked (weight exactly 0); starting at a multiple of 8
     * keeps each visible key in the lane ggml's sums put it in. */
    int lo = 0, j0 = 0;
    if (c->m->layers[layer].swa && pos - hp->n_swa + 1 > 0) {
        lo = pos - hp->n_swa + 1;
        j0 = lo & ~7;
    }
    float mx = -INFINITY;
    for (int j = j0; j < lo; j++) s[j] = -INFINITY;
    for (int j = lo; j <= pos;) {
        /* four keys at a time where they share a block (four independent
         * sums, each in the one-key order) */
        if (c->kern.dot_f16_x4 && j + 4 <= pos + 1 && j % TL_KV_BLOCK <= TL_KV_BLOCK - 4) {
            c->kern.dot_f16_x4(hd, (const uint16_t *)(const void *)(kb + kv_row(c, blk, j)), kvs, q, s + j);
            j += 4;
        } else {
            s[j] = c->kern.dot_f16(hd, (const uint16_t *)(const void *)(kb + kv_row(c, blk, j)), q);
            j++;
        }
    }
    for (int j = lo; j <= pos; j++) {
        if (!prescaled) s[j] *= scale;
        if (s[j] > mx) mx = s[j];
    }
    const int n = pos + 1 - j0;
    double sum = c->kern.math.softmax_exp(n, s + j0, mx);
    /* ggml scales by (float)(1/sum) and multiplies V by the weights rounded to f16 */
    c->kern.math.scale_round_f16(n, s + j0, (float)(1.0 / sum));
    c->kern.math.attn_pv_paged(n, hd, s + j0, vb, (int64_t)kvs, blk, TL_KV_BLOCK, j0, acc, acc + 8 * hd);
    memcpy(c->att + (size_t)t * c->q_dim + (size_t)h * hd, acc + 8 * hd, (size_t)hd * sizeof *acc);
}

/* The fast numerics: runs of up to ATT_TILE consecutive tokens of one
 * sequence against one KV head, the query heads that share it together
 * (tl_attn_online); a token's result does not depend on its run. */
#define ATT_TILE 64

/* Query heads h0..h0+nh-1 (sharing KV head h0 / G) of a run of nt tokens;
 * seg > 0: segment seg - 1's keys alone, the state into out and part. */
static void attend_fast(tl_ctx *c, int layer, int t, int nt, int h0, int nh, float *scratch, int seg, float *out,
                        float *part) {
    const tl_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, g = h0 / (hp->n_head / hp->n_head_kv);
    const size_t base = (size_t)layer * c->layer_stride + (size_t)g * c->kv_hb;
    const size_t kbase = (size_t)layer * c->layer_stride + (size_t)g * c->kv_hb * TL_KV_BLOCK; /* K transposed */
    tl_attn_rows a = {
        .hd = hd, .G = nh, .bs = TL_KV_BLOCK, .T = nt,
        .q = c->q + (size_t)t * c->q_dim + (size_t)h0 * hd, .q_stride = (size_t)hd, .q_tok = (size_t)c->q_dim,
        .scale = c->m->arch->q_prescale ? 1.0f : hp->attn_scale,
        /* f16 (kvf->fast_attn): V rows, K transposed per block */
        .k = (const uint16_t *)(const void *)(c->kc + kbase), .v = (const uint16_t *)(const void *)(c->vc + base),
        .kv_stride = c->kv_rb / sizeof(uint16_t), .k_tr = 1,
        .blk = tl_kv_seq_peek(c->kv, c->tseq[t])->blk, .pos0 = c->tpos[t],
        .n_swa = c->m->layers[layer].swa ? hp->n_swa : 0,
        .out = c->att + (size_t)t * c->q_dim + (size_t)h0 * hd, .out_stride = (size_t)hd,
        .out_tok = (size_t)c->q_dim, .scratch = scratch, .seg = seg, .part = part};
    if (seg > 0) a.out = out, a.out_tok = (size_t)nh * hd;
    c->kern.math.attn_online(&a);
}

/* Segment i of a split job: run r's KV head g, one segment; the last of the
 * run and head's segments to finish folds them into c->att. */
static void attend_split(att_job *j, int64_t i, float *scr) {
    tl_ctx *c = j->c;
    const tl_hparams *hp = &c->m->hp;
    const int nkv = hp->n_head_kv, G = hp->n_head / nkv, hd = hp->head_dim;
    int r = 0;
    while (i >= j->item0[r + 1]) r++;
    const int k = (int)(i - j->item0[r]), g = k / j->nseg[r], si = k % j->nseg[r];
    const int t = c->att_run[r], T = c->att_run[r + 1] - t;
    const size_t slot = (size_t)T * G * (hd + 2);
    float *base = c->apart + j->base[r] + (size_t)g * j->nseg[r] * slot;
    float *o = base + (size_t)si * slot;
    attend_fast(c, j->layer, t, T, g * G, G, scr, j->seg0[r] + si + 1, o, o + (size_t)T * G * hd);
    if (atomic_fetch_add_explicit(&c->aleft[r * nkv + g], -1, memory_order_acq_rel) != 1) return;
    for (int row = 0; row < T * G; row++) { /* row = token * G + head */
        float ma = -INFINITY, la = 0.0f, *oa = scr;
        for (int s = 0; s < j->nseg[r]; s++) {
            const float *os = base + (size_t)s * slot, *ml = os + (size_t)T * G * hd + 2 * row;
            if (ml[0] != -INFINITY) tl_attn_merge(hd, &ma, &la, oa, ml[0], ml[1], os + (size_t)row * hd);
        }
        tl_attn_divide(hd, oa, la, c->att + (size_t)(t + row / G) * c->q_dim + (size_t)(g * G + row % G) * hd);
    }
}

/* Whether the runs are split by segment (att_job.split), and the items. */
static void att_plan(tl_ctx *c, att_job *j, int nth) {
    const tl_hparams *hp = &c->m->hp;
    const int nkv = hp->n_head_kv;
    j->split = 0;
    if (!c->apart || nth < 2 || j->n_runs > SPLIT_RUNS || (int64_t)j->n_runs * nkv >= 4 * (int64_t)nth) return;
    j->item0[0] = 0;
    size_t need = 0;
    for (int r = 0; r < j->n_runs; r++) {
        const int t = c->att_run[r], T = c->att_run[r + 1] - t;
        if (T > SPLIT_T) return;
        const int pos = c->tpos[t], w = c->m->layers[j->layer].swa ? pos - hp->n_swa + 1 : 0, lo = w > 0 ? w : 0;
        j->seg0[r] = lo / TL_ATTN_SEG;
        j->nseg[r] = (pos + T - 1) / TL_ATTN_SEG - j->seg0[r] + 1;
        j->item0[r + 1] = j->item0[r] + nkv * j->nseg[r];
        j->base[r] = need;
        need += (size_t)j->nseg[r] * T * hp->n_head * (hp->head_dim + 2); /* every KV head's G query heads */
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
static int att_runs(tl_ctx *c, int n) {
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
    tl_ctx *c = j->c;
    if (c->fast_attn) {
        /* Items of (run, KV head) with all its query heads, which widen each
         * K/V block once; with too few of those to keep every thread busy
         * (decode), (run, query head). A head's result is the same either
         * way. Items are claimed from a counter, later runs (more keys) first. */
        const int nkv = c->m->hp.n_head_kv, G = c->m->hp.n_head / nkv;
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
            attend_fast(c, j->layer, c->att_run[r], c->att_run[r + 1] - c->att_run[r], (int)(i % nper) * per, per,
                        scr, 0, NULL, NULL);
        }
    }
    int nh = c->m->hp.n_head;
    float *s = c->scores + (size_t)ith * c->n_ctx;
    float *acc = c->vacc + (size_t)ith * 9 * c->m->hp.head_dim;
    /* Later tokens see more keys: deal (token, head) pairs out round-robin so
     * the threads get equal work. */
    for (int64_t i = ith; i < (int64_t)j->n_tok * nh; i += nth)
        attend(c, j->layer, (int)(i / nh), (int)(i % nh), s, acc);
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

static void norm_tokens(tl_ctx *c, int t0, int t1, void *arg) {
    const norm_job *j = arg;
    for (int t = t0; t < t1; t++)
        c->kern.math.rmsnorm(j->out + (size_t)t * j->d, j->in + (size_t)t * j->d, j->w, j->d, c->m->hp.norm_eps);
}

static void norm_all(tl_ctx *c, int n, float *out, const float *in, tl_w w) {
    norm_job j = {out, in, w->data, c->m->hp.n_embd};
    par_tokens(c, n, norm_tokens, &j);
}

/* x += xb, the residual connection */
static void add_tokens(tl_ctx *c, int t0, int t1, void *arg) {
    const size_t d = (size_t)c->m->hp.n_embd;
    for (size_t i = (size_t)t0 * d; i < (size_t)t1 * d; i++) c->x[i] += c->xb[i];
}

/* After the q/k/v projections: QK-norm, RoPE, q to f16, k and v into the cache. */
static void attn_prep_tokens(tl_ctx *c, int t0, int t1, void *arg) {
    const int il = *(const int *)arg;
    const tl_hparams *hp = &c->m->hp;
    const tl_layer *L = &c->m->layers[il];
    const tl_arch_info *a = c->m->arch;
    const float *cs = L->swa && c->rope_cs_swa ? c->rope_cs_swa : c->rope_cs;
    int hd = hp->head_dim;
    for (int t = t0; t < t1; t++) {
        float *q = c->q + (size_t)t * c->q_dim, *k = c->k + (size_t)t * c->kv_dim;
        float *v = c->v + (size_t)t * c->kv_dim;
        if (a->qk_norm) {
            for (int h = 0; h < hp->n_head; h++)
                c->kern.math.rmsnorm(q + h * hd, q + h * hd, L->attn_q_norm->data, hd, hp->norm_eps);
            for (int h = 0; h < hp->n_head_kv; h++)
                c->kern.math.rmsnorm(k + h * hd, k + h * hd, L->attn_k_norm->data, hd, hp->norm_eps);
        }
        rope_apply(c, cs, q, hp->n_head, t);
        rope_apply(c, cs, k, hp->n_head_kv, t);
        if (a->q_prescale)
            for (int i = 0; i < c->q_dim; i++) q[i] *= hp->attn_scale;
        if (!c->fast_attn) { /* the exact attention reads q rounded to f16 */
            c->kern.math.f16_row(q, c->q16 + (size_t)t * c->q_dim, c->q_dim);
        }
        const int32_t *blk = tl_kv_seq_peek(c->kv, c->tseq[t])->blk;
        const size_t at = (size_t)il * c->layer_stride + kv_row(c, blk, c->tpos[t]);
        if (c->fast_attn) /* K transposed per block (tl_attn_rows.k_tr) */
            c->kvf->store_tr(&c->kern.math, k,
                             c->kc + (size_t)il * c->layer_stride + (size_t)blk[c->tpos[t] / TL_KV_BLOCK] * TL_KV_BLOCK * c->kv_rb,
                             c->tpos[t] % TL_KV_BLOCK, TL_KV_BLOCK, c->kv_dim);
        else
            c->kvf->store(&c->kern.math, k, c->kc + at, c->kv_dim);
        c->kvf->store(&c->kern.math, v, c->vc + at, c->kv_dim);
    }
}

static void attention_block(tl_ctx *c, int il, int n) {
    const tl_layer *L = &c->m->layers[il];
    norm_all(c, n, c->xb, c->x, L->attn_norm);
    tl_w w[3] = {L->wq, L->wk, L->wv};
    float *y[3] = {c->q, c->k, c->v};
    matmul(c, 3, w, y, c->xb, n);
    add_bias(c->q, L->bq, n, c->q_dim);
    add_bias(c->k, L->bk, n, c->kv_dim);
    add_bias(c->v, L->bv, n, c->kv_dim);
    par_tokens(c, n, attn_prep_tokens, &il);
    att_job aj = {c, il, n, c->n_att_runs, 0, 0, 0, {0}, {0}, {0}, {0}};
    atomic_init(&aj.next, 0);
    if (c->fast_attn) att_plan(c, &aj, tl_pool_size(c->pool));
    tl_pool_run(c->pool, att_worker, &aj);
    tl_w wo = L->wo;
    float *o = c->xb; /* reuse: [n][d] */
    matmul(c, 1, &wo, &o, c->att, n);
    if (c->m->arch->sandwich) norm_all(c, n, o, o, L->attn_post_norm);
    par_tokens(c, n, add_tokens, NULL);
}

/* The gated activation of the feed-forward: hb = act(hb) * hb2. */
static void ffn_act_tokens(tl_ctx *c, int t0, int t1, void *arg) {
    const int n_ff = c->m->hp.n_ff;
    for (int t = t0; t < t1; t++) {
        size_t o = (size_t)t * n_ff;
        if (c->m->arch->act == TL_ACT_GELU)
            c->kern.math.geglu(n_ff, c->hb + o, c->hb + o, c->hb2 + o, c->gelu);
        else
            c->kern.math.swiglu(n_ff, c->hb + o, c->hb + o, c->hb2 + o);
    }
}

static void ffn_block(tl_ctx *c, int il, int n) {
    const tl_layer *L = &c->m->layers[il];
    norm_all(c, n, c->xb, c->x, L->ffn_norm);
    tl_w w[2] = {L->w_gate, L->w_up};
    float *y[2] = {c->hb, c->hb2};
    matmul(c, 2, w, y, c->xb, n);
    par_tokens(c, n, ffn_act_tokens, NULL);
    tl_w wd = L->w_down;
    float *o = c->xb;
    matmul(c, 1, &wd, &o, c->hb, n);
    if (c->m->arch->sandwich) norm_all(c, n, o, o, L->ffn_post_norm);
    par_tokens(c, n, add_tokens, NULL);
}

/* Runs n tokens whose positions and sequences are in c->tpos/c->tseq (the
 * blocks under them already allocated); the logits of tokens lrow[0..nl)
 * land in out, nl rows of n_vocab floats. */
static void forward(tl_ctx *c, const int32_t *tokens, int n, const int *lrow, int nl, float *out) {
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
    rope_cache(c, n);
    c->n_att_runs = c->fast_attn ? att_runs(c, n) : 0; /* the same for every layer */
    for (int il = 0; il < hp->n_layer; il++) {
        attention_block(c, il, n);
        ffn_block(c, il, n);
    }
    if (nl > 0) {
        for (int i = 0; i < nl; i++)
            c->kern.math.rmsnorm(c->xb + (size_t)i * d, c->x + (size_t)lrow[i] * d, m->output_norm->data, d,
                    hp->norm_eps);
        tl_w wo = m->output;
        matmul(c, 1, &wo, &out, c->xb, nl);
        float cap = hp->logit_softcap;
        if (cap > 0.0f)
            for (size_t i = 0; i < (size_t)nl * hp->n_vocab; i++)
                out[i] = tanhf(out[i] * (1.0f / cap)) * cap;
    }
}

static int check_tokens(const tl_ctx *c, const int32_t *tokens, int n, tl_error *err) {
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->m->hp.n_vocab)
            return tl_fail(err, TL_ERR_ARG, "token id %d out of range 0..%d", tokens[t],
                           c->m->hp.n_vocab - 1);
    return TL_OK;
}

/* --------------------------------------------------------------- context */

/* Zeroed buffers starting on a cache line: calloc's large blocks start 16
 * bytes past a page, so every 512-bit access to activations, attention
 * outputs and the KV cache crossed a line. calloc keeps their pages lazily
 * zeroed; the raw pointer sits just before the aligned one for xfree. */
static void *xcalloc(size_t n, size_t size, int *fail) {
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

static void xfree(void *p) {
    if (!p) return;
    void *raw;
    memcpy(&raw, (uint8_t *)p - sizeof(void *), sizeof raw);
    free(raw);
}

int tl_ctx_new(const tl_model *m, const tl_ctx_params *params, tl_ctx **out, tl_error *err) {
    *out = NULL;
    if (!m || !m->arch)
        return tl_fail(err, TL_ERR_ARG, "the model has no weights to run (vocabulary only)");
    tl_ctx_params p = params ? *params : (tl_ctx_params){0};
    const tl_hparams *hp = &m->hp;
    if (p.n_ctx < 0 || p.n_threads < 0 || p.n_batch < 0)
        return tl_fail(err, TL_ERR_ARG, "negative context, thread or batch size");
    if (p.n_ctx == 0) p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_ctx > (1 << 22)) return tl_fail(err, TL_ERR_ARG, "context %d too large", p.n_ctx);
    if (p.share_threads) p.n_threads = tl_pool_size(p.share_threads->pool);
    if (p.n_threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = nc > 0 ? (int)nc : 1;
    }
    if (p.n_batch == 0) p.n_batch = 512;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.n_seq_max < 0 || p.n_seq_max > 4096 || p.n_logits_max < 0)
        return tl_fail(err, TL_ERR_ARG, "bad sequence count %d or logits rows %d", p.n_seq_max,
                       p.n_logits_max);
    if (p.n_logits_max == 0) p.n_logits_max = 64;
    if (p.numerics == TL_NUMERICS_AUTO) {
        const char *env = getenv("TL_NUMERICS");
        p.numerics = env ? tl_numerics_parse(env) : TL_NUMERICS_FAST;
        if (p.numerics < 0)
            return tl_fail(err, TL_ERR_ARG, "TL_NUMERICS=%s: expected fast or exact", env);
        if (p.numerics == TL_NUMERICS_AUTO) p.numerics = TL_NUMERICS_FAST;
    }
    if (p.numerics != TL_NUMERICS_FAST && p.numerics != TL_NUMERICS_EXACT)
        return tl_fail(err, TL_ERR_ARG, "unknown numerics mode %d", p.numerics);
    if (p.n_logits_max > p.n_batch) p.n_logits_max = p.n_batch;
    const size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    const tl_kv_format *kvf = tl_kv_format_of(TL_F16);
    const int want_fast_attn = p.numerics == TL_NUMERICS_FAST && hp->head_dim % 8 == 0 && kvf->fast_attn;
    if (!want_fast_attn && !kvf->exact_attn)
        return tl_fail(err, TL_ERR_ARG, "a KV cache of %s needs the fast attention (fast numerics, head_dim %% 8 == 0)",
                       kvf->name);
    const size_t kv_rb = kvf->row_bytes((int64_t)kv_dim);
    const size_t blk_bytes = 2 * (size_t)hp->n_layer * TL_KV_BLOCK * kv_rb;
    const size_t per_seq = (size_t)(p.n_ctx + TL_KV_BLOCK - 1) / TL_KV_BLOCK;
    size_t n_blocks = p.kv_bytes ? p.kv_bytes / blk_bytes
                                 : per_seq * (size_t)(p.n_seq_max > 0 ? p.n_seq_max : 1);
    if (n_blocks == 0)
        return tl_fail(err, TL_ERR_ARG, "KV memory of %zu bytes holds no block (one takes %zu)",
                       p.kv_bytes, blk_bytes);
    if (n_blocks > (1u << 30) / TL_KV_BLOCK)
        return tl_fail(err, TL_ERR_ARG, "KV memory of %zu bytes is too large", p.kv_bytes);
    tl_ctx *c = calloc(1, sizeof *c);
    if (!c) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = p.n_ctx;
    c->n_batch = p.n_batch;
    c->n_seq = p.n_seq_max + 1;
    c->n_logits_max = p.n_logits_max;
    c->q_dim = hp->n_head * hp->head_dim;
    c->kv_dim = hp->n_head_kv * hp->head_dim;
    c->kvf = kvf;
    c->kv_rb = kv_rb;
    c->kv_hb = kvf->row_bytes(hp->head_dim);
    tl_kernels_init(&c->kern, tl_cpu_choose(), p.numerics == TL_NUMERICS_EXACT ? TL_NUM_EXACT : TL_NUM_FAST);
    int st = TL_OK;
    if (p.share_threads) {
        c->pool = p.share_threads->pool;
    } else if ((st = tl_pool_new(p.n_threads, &c->pool, err))) {
        free(c);
        return st;
    } else {
        c->own_pool = 1;
    }
    int fail = 0, nb = p.n_batch, nt = p.n_threads;
    if (tl_kv_new((int)n_blocks, c->n_seq, c->n_ctx, &c->kv)) fail = 1;
    c->layer_stride = n_blocks * TL_KV_BLOCK * kv_rb;
    size_t kvn = (size_t)hp->n_layer * c->layer_stride;
    c->tpos = xcalloc((size_t)nb, sizeof(int), &fail);
    c->tseq = xcalloc((size_t)nb, sizeof(int), &fail);
    c->lrow = xcalloc((size_t)nb, sizeof(int), &fail);
    c->seq_cnt = xcalloc((size_t)c->n_seq, sizeof(int), &fail);
    c->bseq0 = xcalloc((size_t)nb, sizeof(int32_t), &fail);
    c->blg = xcalloc((size_t)nb, 1, &fail);
    int widest = hp->n_ff > c->q_dim ? hp->n_ff : c->q_dim;
    if (hp->n_embd > widest) widest = hp->n_embd;
    size_t xa_row = tl_row_size(TL_F32, widest); /* f32 is the widest activation format */
    c->kc = tl_big_alloc(kvn);
    c->vc = tl_big_alloc(kvn);
    if (!c->kc || !c->vc) fail = 1;
    c->x = xcalloc((size_t)nb * hp->n_embd, sizeof(float), &fail);
    c->xb = xcalloc((size_t)nb * (widest > hp->n_embd ? widest : hp->n_embd), sizeof(float), &fail);
    c->q = xcalloc((size_t)nb * c->q_dim, sizeof(float), &fail);
    c->q16 = xcalloc((size_t)nb * c->q_dim, sizeof(uint16_t), &fail);
    c->att = xcalloc((size_t)nb * c->q_dim, sizeof(float), &fail);
    c->k = xcalloc((size_t)nb * c->kv_dim, sizeof(float), &fail);
    c->v = xcalloc((size_t)nb * c->kv_dim, sizeof(float), &fail);
    c->hb = xcalloc((size_t)nb * hp->n_ff, sizeof(float), &fail);
    c->hb2 = xcalloc((size_t)nb * hp->n_ff, sizeof(float), &fail);
    c->xa_row = xa_row;
    c->xa = xcalloc((size_t)nb, xa_row, &fail);
    c->scores = xcalloc((size_t)nt * c->n_ctx, sizeof(float), &fail);
    c->wide_size = MM_ROW_TILE * tl_row_size(TL_Q8_0, ((widest + 31) / 32) * 32);
    c->wide = xcalloc((size_t)nt, c->wide_size, &fail);
    c->vacc = xcalloc((size_t)nt * 9 * hp->head_dim, sizeof(float), &fail);
    c->fast_attn = want_fast_attn;
    /* whole cache lines per thread */
    c->ascr_n = (tl_attn_scratch(hp->head_dim, hp->n_head / hp->n_head_kv, TL_KV_BLOCK, ATT_TILE) + 15) & ~(size_t)15;
    if (c->fast_attn) {
        c->ascr = xcalloc((size_t)nt * c->ascr_n, sizeof(float), &fail);
        c->att_run = xcalloc((size_t)nb + 1, sizeof(int), &fail);
        if (nt > 1) {
            /* SPLIT_T rows' worth over a whole context (a sequence's positions
             * stay below n_ctx; att_plan checks what a call needs) */
            const size_t n_seg = (size_t)(c->n_ctx + TL_ATTN_SEG - 1) / TL_ATTN_SEG + 1;
            c->apart_n = n_seg * SPLIT_T * hp->n_head * (hp->head_dim + 2);
            if (c->apart_n > SPLIT_MAX_FLOATS) c->apart_n = SPLIT_MAX_FLOATS;
            c->apart = xcalloc(c->apart_n, sizeof(float), &fail);
            c->aleft = xcalloc((size_t)SPLIT_RUNS * hp->n_head_kv, sizeof *c->aleft, &fail);
        }
    }
    c->rope_cs = xcalloc((size_t)nb * hp->n_rot, sizeof(float), &fail);
    if (hp->n_swa > 0) c->rope_cs_swa = xcalloc((size_t)nb * hp->n_rot, sizeof(float), &fail);
    if (m->arch->act == TL_ACT_GELU) {
        c->gelu = xcalloc(65536, sizeof(uint16_t), &fail);
        if (c->gelu) tl_gelu_table(c->gelu);
    }
    if (fail) {
        tl_ctx_free(c);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory for a context of %d positions", p.n_ctx);
    }
    if ((st = tl_model_packed(m, &c->kern, &c->pk, err))) {
        tl_ctx_free(c);
        return st;
    }
    *out = c;
    return TL_OK;
}

void tl_ctx_free(tl_ctx *c) {
    if (!c) return;
    xfree(c->wide);
    if (c->own_pool) tl_pool_free(c->pool);
    tl_big_free(c->kc);
    tl_big_free(c->vc);
    tl_kv_free(c->kv);
    xfree(c->tpos);
    xfree(c->tseq);
    xfree(c->lrow);
    xfree(c->seq_cnt);
    xfree(c->bseq0);
    xfree(c->blg);
    xfree(c->x);
    xfree(c->xb);
    xfree(c->q);
    xfree(c->q16);
    xfree(c->att);
    xfree(c->k);
    xfree(c->v);
    xfree(c->hb);
    xfree(c->hb2);
    xfree(c->xa);
    xfree(c->scores);
    xfree(c->vacc);
    xfree(c->ascr);
    xfree(c->apart);
    xfree(c->aleft);
    xfree(c->att_run);
    xfree(c->rope_cs);
    xfree(c->rope_cs_swa);
    xfree(c->gelu);
    free(c->logits);
    free(c);
}

int tl_ctx_n_ctx(const tl_ctx *c) { return c->n_ctx; }
int tl_ctx_n_batch(const tl_ctx *c) { return c->n_batch; }
int tl_ctx_n_past(const tl_ctx *c) { return tl_kv_seq_peek(c->kv, 0)->len; }
const char *tl_ctx_backend(const tl_ctx *c) { return c->kern.name; }
const char *tl_ctx_numerics(const tl_ctx *c) { return c->kern.mode == TL_NUM_EXACT ? "exact" : "fast"; }

void tl_ctx_thread_stats(const tl_ctx *c, tl_thread_stats *out) {
    out->n_threads = tl_pool_size(c->pool);
    tl_pool_stats(c->pool, &out->jobs, &out->wall_s, &out->busy_s);
}

int tl_numerics_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "fast")) return TL_NUMERICS_FAST;
    if (!strcmp(name, "exact")) return TL_NUMERICS_EXACT;
    if (!strcmp(name, "auto")) return TL_NUMERICS_AUTO;
    return -1;
}
const tl_model *tl_ctx_model(const tl_ctx *c) { return c->m; }

int tl_ctx_truncate(tl_ctx *c, int n_past, tl_error *err) { return tl_seq_truncate(c, 0, n_past, err); }

int tl_seq_truncate(tl_ctx *c, int seq, int len, tl_error *err) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    if (!sq) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (len < 0 || len > sq->len)
        return tl_fail(err, TL_ERR_ARG, "cannot truncate sequence %d to %d (it holds %d)", seq, len, sq->len);
    int32_t from, to;
    if (tl_kv_seq_truncate(c->kv, seq, len, &from, &to))
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block to copy a shared one into");
    if (from >= 0) { /* the kept part of a shared block: every layer's K and V */
        const size_t bb = (size_t)TL_KV_BLOCK * c->kv_rb;
        for (int il = 0; il < c->m->hp.n_layer; il++) {
            uint8_t *k = c->kc + (size_t)il * c->layer_stride, *v = c->vc + (size_t)il * c->layer_stride;
            memcpy(k + (size_t)to * bb, k + (size_t)from * bb, bb);
            memcpy(v + (size_t)to * bb, v + (size_t)from * bb, bb);
        }
    }
    c->logits_n = c->blogits_n = 0;
    return TL_OK;
}

int tl_seq_commit(tl_ctx *c, int seq, int n, tl_error *err) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    if (!sq) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (n < 0 || n > sq->pend)
        return tl_fail(err, TL_ERR_ARG, "cannot commit %d positions of sequence %d (%d pending)", n, seq,
                       sq->pend);
    tl_kv_seq_commit(c->kv, seq, sq->len + n);
    return TL_OK;
}

const int32_t *tl_seq_tokens(const tl_ctx *c, int seq, int *n) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    *n = sq ? sq->len : 0;
    return sq ? sq->tok : NULL;
}

static int logits_room(tl_ctx *c, size_t rows, tl_error *err) {
    size_t need = rows * (size_t)c->m->hp.n_vocab;
    if (need <= c->logits_cap) return TL_OK;
    float *nl = realloc(c->logits, need * sizeof(float));
    if (!nl) return tl_fail(err, TL_ERR_NOMEM, "out of memory for logits");
    c->logits = nl;
    c->logits_cap = need;
    return TL_OK;
}

/* Runs a batch whose rows go to out (at most max_rows), then commits each
 * sequence's new positions or leaves them pending. */
static int decode_into(tl_ctx *c, const tl_batch *b, int max_rows, float *out, tl_error *err);

int tl_ctx_eval(tl_ctx *c, const int32_t *tokens, size_t n, int all_logits, tl_error *err) {
    int nv = c->m->hp.n_vocab, past = tl_ctx_n_past(c);
    c->logits_n = c->blogits_n = 0;
    if (n == 0) return TL_OK;
    if (n > (size_t)(c->n_ctx - past))
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "context full: %d + %zu tokens exceed %d", past,
                       n, c->n_ctx);
    int st = check_tokens(c, tokens, (int)n, err);
    if (st || (st = logits_room(c, all_logits ? n : 1, err))) return st;
    /* every block up front: a full pool fails before anything is written */
    if (tl_kv_seq_grow(c->kv, 0, past + (int)n))
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block");
    for (size_t done = 0; done < n;) {
        int nb = (int)((n - done) < (size_t)c->n_batch ? (n - done) : (size_t)c->n_batch);
        int last = done + (size_t)nb == n;
        for (int t = 0; t < nb; t++) c->blg[t] = (uint8_t)(all_logits || (last && t == nb - 1));
        tl_batch b = {.n = nb, .token = tokens + done, .seq = c->bseq0, .logits = c->blg};
        float *out = c->logits + (all_logits ? done * (size_t)nv : 0);
        if ((st = decode_into(c, &b, nb, out, err))) return st;
        done += (size_t)nb;
    }
    c->blogits_n = 0; /* the rows are tl_ctx_logits', not tl_ctx_batch_logits' */
    c->logits_first = all_logits ? 0 : (int)n - 1;
    c->logits_n = all_logits ? (int)n : 1;
    return TL_OK;
}

const float *tl_ctx_logits(const tl_ctx *c, int i) {
    if (c->logits_n == 0) return NULL;
    int total = c->logits_first + c->logits_n;
    if (i < 0) i = total - 1;
    if (i < c->logits_first || i >= total) return NULL;
    return c->logits + (size_t)(i - c->logits_first) * c->m->hp.n_vocab;
}

/* ---------------------------------------------------------- sequences */

int tl_seq_open(tl_ctx *c, int *seq, tl_error *err) {
    int id = tl_kv_seq_open(c->kv, 1);
    if (id < 0)
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "all %d sequences are open", c->n_seq - 1);
    *seq = id;
    return TL_OK;
}

int tl_seq_reuse_prefix(tl_ctx *c, int seq, const int32_t *tokens, size_t n, size_t max_reuse) {
    return seq > 0 ? tl_kv_seq_reuse(c->kv, seq, tokens, n, max_reuse) : 0;
}

int tl_seq_len(const tl_ctx *c, int seq) {
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    return s ? s->len : -1;
}

void tl_seq_close(tl_ctx *c, int seq) {
    if (seq > 0) tl_kv_seq_close(c->kv, seq);
}

void tl_ctx_kv_stats(const tl_ctx *c, tl_kv_stats *out) {
    tl_kv_get_stats(c->kv, out);
    out->block_bytes = 2 * (size_t)c->m->hp.n_layer * TL_KV_BLOCK * c->kv_rb;
}

/* Checks a batch and gives each token its position (from its sequence's
 * committed length: what was pending is written over); blocks are allocated. */
static int batch_prepare(tl_ctx *c, const tl_batch *b, int max_rows, tl_error *err) {
    if (!b || b->n <= 0 || b->n > c->n_batch || !b->token || !b->seq)
        return tl_fail(err, TL_ERR_ARG, "bad batch: %d tokens (1..%d)", b ? b->n : 0, c->n_batch);
    int st = check_tokens(c, b->token, b->n, err);
    if (st) return st;
    memset(c->seq_cnt, 0, (size_t)c->n_seq * sizeof *c->seq_cnt);
    int nl = 0;
    for (int t = 0; t < b->n; t++) {
        int id = b->seq[t];
        if (!tl_kv_seq_peek(c->kv, id))
            return tl_fail(err, TL_ERR_ARG, "token %d: sequence %d is not open", t, id);
        c->seq_cnt[id]++;
        nl += b->logits && b->logits[t];
    }
    if (nl > max_rows)
        return tl_fail(err, TL_ERR_ARG, "batch keeps %d logits rows (max %d)", nl, max_rows);
    nl = 0;
    for (int t = 0; t < b->n; t++)
        if (b->logits && b->logits[t]) c->lrow[nl++] = t;
    for (int id = 0; id < c->n_seq; id++) {
        if (!c->seq_cnt[id]) continue;
        int len = tl_kv_seq_peek(c->kv, id)->len;
        if (len + c->seq_cnt[id] > c->n_ctx)
            return tl_fail(err, TL_ERR_CONTEXT_FULL, "sequence %d: %d + %d tokens exceed %d", id,
                           len, c->seq_cnt[id], c->n_ctx);
        if (tl_kv_seq_grow(c->kv, id, len + c->seq_cnt[id]))
            return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block");
    }
    memset(c->seq_cnt, 0, (size_t)c->n_seq * sizeof *c->seq_cnt);
    for (int t = 0; t < b->n; t++) {
        tl_kv_seq *sq = tl_kv_seq_get(c->kv, b->seq[t]);
        c->tseq[t] = b->seq[t];
        c->tpos[t] = sq->len + c->seq_cnt[b->seq[t]]++;
        sq->tok[c->tpos[t]] = b->token[t];
    }
    c->blogits_n = nl;
    return TL_OK;
}

static int decode_into(tl_ctx *c, const tl_batch *b, int max_rows, float *out, tl_error *err) {
    int st = batch_prepare(c, b, max_rows, err);
    if (st) {
        c->blogits_n = 0;
        return st;
    }
    forward(c, b->token, b->n, c->lrow, c->blogits_n, out);
    for (int id = 0; id < c->n_seq; id++) {
        if (!c->seq_cnt[id]) continue;
        tl_kv_seq *sq = tl_kv_seq_get(c->kv, id);
        if (b->pending) sq->pend = c->seq_cnt[id];
        else tl_kv_seq_commit(c->kv, id, sq->len + c->seq_cnt[id]);
    }
    return TL_OK;
}

int tl_ctx_decode(tl_ctx *c, const tl_batch *b, tl_error *err) {
    c->logits_n = c->blogits_n = 0;
    int st = logits_room(c, (size_t)c->n_logits_max, err);
    if (st) return st;
    double t0 = tl_now();
    if ((st = decode_into(c, b, c->n_logits_max, c->logits, err))) return st;
    tl_ctx_cost_record(c, b->n, tl_now() - t0);
    return TL_OK;
}

void tl_ctx_cost_record(tl_ctx *c, int n, double s) {
    if (n < 1 || n > COST_N) return;
    double *w = c->cost_win[n];
    w[c->cost_next[n]] = s;
    c->cost_next[n] = (c->cost_next[n] + 1) % COST_WIN;
    if (c->cost_seen[n] < COST_WIN) c->cost_seen[n]++;
    double lo = w[0];
    for (int i = 1; i < c->cost_seen[n]; i++) lo = w[i] < lo ? w[i] : lo;
    c->cost[n] = lo;
}

double tl_ctx_decode_cost(const tl_ctx *c, int n) {
    /* Each size's own figure, not a line through all of them: a draft
     * model's context sees one-token calls beside its catch-up calls of tens
     * of tokens, and a line through both put a one-token call at a seventh
     * of its cost (and below zero before one was seen). */
    return tl_curve_at(c->cost, c->cost_seen, COST_N, n);
}

const float *tl_ctx_batch_logits(const tl_ctx *c, int i) {
    if (i < 0 || i >= c->blogits_n) return NULL;
    return c->logits + (size_t)i * c->m->hp.n_vocab;
}
