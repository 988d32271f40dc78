/* backend: the seam between the sequences and the arithmetic. A backend owns
 * what one context computes with (kernels, threads, activation buffers, the
 * bytes of the KV cache) and runs forward(batch, positions, block tables) ->
 * logits; which tokens run and where their keys and values live is the
 * context's (ctx.h, kv.h). The CPU is one implementation (cpu.c); another
 * device implements the same table and the rest of the engine does not change. */
#ifndef TL_BACKEND_H
#define TL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "load/model.h"
#include "forward/threadpool.h"

/* One forward call: n tokens of any sequences, each at its position, with
 * the blocks its sequence's keys and values live in already allocated. A
 * row's result depends on its token, position and cached keys only, never
 * on the rest of the batch. */
typedef struct tl_fwd_batch {
    int n;                        /* tokens in the call */
    const int32_t *tokens;        /* [n] token ids */
    const int *pos;               /* [n] each token's position in its sequence */
    const int *seq;               /* [n] each token's sequence; a run of one sequence at consecutive positions
                                   * may share work, as long as each row's bits stay its own */
    const int32_t *const *blk;    /* [n] the block table of each token's sequence: position p's keys and
                                   * values are slot p % TL_KV_BLOCK of block blk[t][p / TL_KV_BLOCK] */
    const int *lrow;              /* [nl] the tokens whose logits are wanted, ascending */
    int nl;
    int embd;                     /* 1: the rows are the output-normed hidden states (n_embd floats
                                   * each), not logits */
} tl_fwd_batch;

typedef struct tl_backend_params {
    int n_ctx;          /* positions per sequence */
    int n_batch;        /* tokens per call at most */
    int n_threads;
    int numerics;       /* TL_NUMERICS_FAST or TL_NUMERICS_EXACT */
    int n_seq_max;      /* sequences the cache is sized for when kv_bytes is 0 */
    int n_seq_embd;     /* more sequences (recurrent states only; no KV room) for batched embeddings */
    size_t kv_bytes;    /* the KV cache's size (0: n_ctx positions for each of n_seq_max) */
    int kv_type_k, kv_type_v; /* tl_kv_type of keys and values */
    int ring_blocks;    /* sliding-window layers: blocks of each sequence's ring, where
                         * position p is slot p % TL_KV_BLOCK of ring block (p / TL_KV_BLOCK)
                         * % ring_blocks (0: they are in the pool like the others) */
    tl_pool *share_pool;/* run on another context's threads (NULL: its own) */
} tl_backend_params;

typedef struct tl_backend_ops {
    /* logits: nl rows of n_vocab floats */
    void (*forward)(void *be, const tl_fwd_batch *b, float *logits);
    /* every layer's keys and values of block from into block to */
    void (*copy_block)(void *be, int32_t from, int32_t to);
    /* block b's keys and values, every layer, to or from block_bytes at p
     * (layer by layer, K then V: the disk cache's layout) */
    void (*read_block)(void *be, int32_t b, void *p);
    void (*write_block)(void *be, int32_t b, const void *p);
    void (*free)(void *be);
    /* Sequence states (models with Gated DeltaNet layers, or sliding-window
     * layers in rings; NULL otherwise). Each sequence's state stands at a
     * position, and a forward call must continue a sequence from there.
     * rs_seek puts it at pos: 0 starts over; a position it passed within the
     * last block boundary or two goes back (speculation's rejected guesses;
     * a ring: while the window before pos is still in it); -1 when that
     * state is gone. */
    int (*rs_seek)(void *be, int seq, int pos);
    /* The state at block boundary pos (a multiple of TL_KV_BLOCK that
     * rs_seek could reach) into rs_bytes at p; -1 when it is not held. */
    int (*rs_save)(void *be, int seq, int pos, void *p);
    /* Puts the sequence at boundary pos with the state rs_save wrote. */
    void (*rs_load)(void *be, int seq, int pos, const void *p);
    /* The classification head on one pooled row x [n_embd] (rank pooling):
     * y [tl_model_n_cls_out] floats. x must not be the backend's own buffer. */
    void (*head)(void *be, const float *x, float *y);
} tl_backend_ops;

typedef struct tl_backend {
    const tl_backend_ops *ops;
    void *state;
    const char *name;      /* the kernel level it runs ("avx512-vnni", ...) */
    const char *numerics;  /* "fast" or "exact" */
    int n_blocks;          /* KV blocks of TL_KV_BLOCK positions it holds */
    size_t block_bytes;    /* bytes of one block, every pool layer's keys and values */
    int kv_type_k, kv_type_v; /* tl_kv_type of the cache's keys and values */
    tl_pool *pool;         /* its threads (the fork-join figures; shared by a draft's context) */
    size_t rs_bytes;       /* one sequence's recurrent state at a block boundary (0: none) */
    size_t rs_seq_bytes;   /* what a sequence's recurrent state holds in memory (0: none) */
    size_t rs_read_bytes;  /* what a step of one sequence reads of it (its part of rs_bytes) */
    size_t window_bytes;   /* what a sequence's ring of sliding-window layers holds (0: none) */
} tl_backend;

/* The CPU backend for m (kernels chosen for this CPU and p->numerics). */
int tl_cpu_backend_new(const tl_model *m, const tl_backend_params *p, tl_backend *out, tl_error *err);

#endif
