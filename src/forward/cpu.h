/* cpu.h: the CPU backend's state and the helpers its files share (cpu.c:
 * the forward pass, attention, feed-forward and experts, the KV cache's
 * bytes; gdn.c: the Gated DeltaNet block and the sequences' recurrent
 * states). Private to src/forward/. */
#ifndef TL_CPU_H
#define TL_CPU_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/kernels.h"
#include "forward/backend.h"
#include "forward/kvfmt.h"
#include "load/packed.h"

typedef struct tl_gdn tl_gdn;

/* One of the cache's two halves (keys or values): layer l at off[l], its
 * [n_blocks][TL_KV_BLOCK] rows of rb[l] bytes in format f (layers differ in
 * width where their heads do: Gemma 4's). */
typedef struct kv_side {
    uint8_t *mem;
    const tl_kv_format *f;
    size_t *rb;         /* [n_kv_layer] bytes of a row of the layer's kv_dim elements */
    size_t *off;        /* [n_kv_layer] where the layer starts in mem */
} kv_side;

typedef struct tl_cpu {
    const tl_model *m;
    tl_kernels kern;
    tl_pool *pool;
    int own_pool;       /* 0: borrowed from another context (tl_ctx_params.share_threads) */
    int n_ctx, n_batch;
    int q_dim, kv_dim;  /* the widest layer's (tl_hparams.q_dim_max, kv_dim_max) */
    kv_side K, V;       /* the cache; with fast_attn a K block is kept transposed (tl_attn_rows.k_tr) */
    int fa;             /* exact numerics with a quantized cache: llama.cpp's flash attention */
    int rot_on;         /* a quantized cache's rotation may apply (rot_sizes in cpu.c) */
    uint8_t *qq;        /* [n_batch][qq_row] q in K's vec_dot_type (Q8_0) for the flash attention */
    size_t qq_row;
    const int *tpos, *tseq;      /* the call's (tl_fwd_batch) position and sequence of each token */
    const int32_t *const *tblk;  /* and its sequence's block table */
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
    const tl_packed *pk; /* the model's packed weights for this kernel table (shared) */
    /* Experts (TL_BLOCK_MOE), sized for n_batch tokens of k choices each: a
     * (token, choice) pair's rows sit grouped by expert, tokens in order. */
    float *rlog;        /* [n_batch][n_expert] router logits, then probabilities */
    int *sel;           /* [n_batch][k] the chosen experts, best first */
    float *selw;        /* [n_batch][k] their weights */
    int *ecnt, *eoff;   /* [n_expert + 1] pairs per expert, first pair of each */
    int *eact;          /* [n_expert] the experts with pairs, ascending */
    int *ptok;          /* [n_batch * k] the token of each pair */
    int *pair;          /* [n_batch][k] the pair of each (token, choice) */
    uint8_t *xg;        /* [n_batch * k] activation rows of xg_row bytes, gathered by pair */
    size_t xg_row;
    float *eg, *eu;     /* [n_batch * k][n_ff_exp] gate and up of each pair */
    float *ey;          /* [n_batch * k][d] each pair's expert output */
    float *shg;         /* [n_batch] the shared expert's gate logit */
    float *qg;          /* [n_batch][2 * q_dim] q with its gate (tl_attn_block.q_gate), or NULL */
    float *qgate;       /* [n_batch][q_dim] the gates */
    float *ones;        /* [head_dim_max] 1.0f: the weight of an RMSNorm without one */
    float *ple;         /* [n_batch][n_layer * n_embd_pl] Gemma 4's per-layer inputs, or NULL */
    float *plg;         /* [n_batch][n_embd_pl] a layer's gated per-layer input */
    float *plt;         /* [n_threads][n_layer * n_embd_pl] a token's per_layer_token_embd row */
    float *xr;          /* [n_batch][d] a router's own input (Gemma 4), or NULL */
    tl_gdn *gdn;        /* the Gated DeltaNet blocks' buffers and states (gdn.c), or NULL */
    /* Sliding-window layers in rings (swa.c; ring_R 0: in the pool). Such a
     * layer's K and V at off[l] hold ring_nseq rings of ring_R blocks. */
    int ring_R, ring_Wb;  /* blocks of a ring; of a snapshot (what the window before a boundary spans) */
    int ring_nseq, ring_maxblk;
    uint8_t *ring_l;      /* [n_kv_layer] 1: the layer is in rings */
    int32_t *ring_tbl;    /* [ring_nseq][ring_maxblk]: a sequence's block i -> its ring's block */
    const int32_t **tring;/* [n_batch] the ring table of each token's sequence in the call */
    int *ring_hi, *ring_lo; /* [ring_nseq] positions written below; held from (a snapshot's start) */
    float *vt;          /* [kv_dim][n_batch] an encoder's V transposed (its attention's
                         * values as ggml_cont(transpose(v)) holds them), or NULL */
} tl_cpu;

typedef void (*tok_fn)(tl_cpu *c, int t0, int t1, void *arg);

/* fn over tokens [0, n) split across the threads (alone for few tokens). */
void tl_cpu_par_tokens(tl_cpu *c, int n, tok_fn fn, void *arg);
/* The same, fn also told its thread's index (for per-thread scratch). */
typedef void (*tok_ith_fn)(tl_cpu *c, int t0, int t1, int ith, void *arg);
void tl_cpu_par_tokens_ith(tl_cpu *c, int n, tok_ith_fn fn, void *arg);
/* y_i = W_i x for up to three matrices sharing the input x (n_tok rows). */
void tl_cpu_matmul(tl_cpu *c, int n_mat, tl_w *w, float **y, const float *x, int n_tok);
/* out = RMSNorm(in) * w for n rows of the model's width. */
void tl_cpu_norm_all(tl_cpu *c, int n, float *out, const float *in, tl_w w);
/* x += xb over tokens [t0, t1): the residual connection. */
void tl_cpu_add_tokens(tl_cpu *c, int t0, int t1, void *arg);
/* Zeroed, cache-line aligned; *fail set when out of memory. */
void *tl_cpu_calloc(size_t n, size_t size, int *fail);
void tl_cpu_free_buf(void *p);

/* gdn.c */
int tl_gdn_new(tl_cpu *c, int n_seq, tl_error *err);
void tl_gdn_free(tl_gdn *g);
void tl_gdn_run(tl_cpu *c, const tl_gdn_block *G, int n);
int tl_gdn_seek(tl_cpu *c, int seq, int pos);
size_t tl_gdn_snap_bytes(const tl_cpu *c);
size_t tl_gdn_seq_bytes(const tl_cpu *c);
int tl_gdn_snap_save(tl_cpu *c, int seq, int pos, void *p);
void tl_gdn_snap_load(tl_cpu *c, int seq, int pos, const void *p);
int tl_gdn_pos(const tl_cpu *c, int seq);

/* swa.c: the sliding-window layers' rings */
/* The tables of n_seq rings of R blocks and which cache layers are in them
 * (before the K/V offsets are laid out, which read ring_l). */
int tl_ring_new(tl_cpu *c, int n_seq, int R, tl_error *err);
void tl_ring_free(tl_cpu *c);
/* A forward call's tokens: each one's ring table, and how far each sequence is written. */
void tl_ring_begin(tl_cpu *c, int n);
/* The block table layer l reads token t's sequence through. */
static inline const int32_t *tl_cpu_blk(const tl_cpu *c, int l, int t) {
    return c->ring_R && c->ring_l[l] ? c->tring[t] : c->tblk[t];
}
int tl_ring_seek(tl_cpu *c, int seq, int pos);
size_t tl_ring_snap_bytes(const tl_cpu *c);
size_t tl_ring_seq_bytes(const tl_cpu *c);
int tl_ring_snap_save(tl_cpu *c, int seq, int pos, void *p);
void tl_ring_snap_load(tl_cpu *c, int seq, int pos, const void *p);

#endif
