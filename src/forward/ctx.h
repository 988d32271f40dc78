/* ctx: the context's own state, shared by its files (ctx.c: lifecycle,
 * batches and logits; seq.c: the sequence API). A context is a backend
 * (backend.h: what computes) beside the sequences' state (the KV cache's
 * bookkeeping, each batch token's position and block table, the logits
 * kept, the measured call costs). */
#ifndef TL_CTX_H
#define TL_CTX_H

#include "forward/backend.h"
#include "forward/cost.h"
#include "forward/forward.h"
#include "forward/kv.h"
#include "forward/kvdisk.h"
#include "forward/rsnap.h"

struct tl_ctx {
    const tl_model *m;
    tl_backend be;
    int n_ctx, n_batch, n_seq, n_logits_max;
    tl_kv *kv;          /* blocks, block tables, prefix cache */
    int *tpos, *tseq;   /* [n_batch] position and sequence of each batch token */
    const int32_t **tblk; /* [n_batch] block table of each batch token's sequence */
    int *seq_cnt;       /* [n_seq] scratch: tokens per sequence in a batch */
    int *lrow;          /* [n_batch] tokens whose logits a call keeps */
    float *logits;      /* eval and decode output */
    size_t logits_cap;  /* floats */
    int logits_first, logits_n; /* rows held: tokens [first, first+n) of the last eval */
    int blogits_n;      /* rows held by the last tl_ctx_decode */
    int32_t *bseq0;     /* [n_batch] zeros: tl_ctx_eval's batches are all sequence 0 */
    uint8_t *blg;       /* [n_batch] tl_ctx_eval's logits flags */
    int embd_mode;      /* tl_ctx_embed is running: rows are hidden states (tl_fwd_batch.embd) */
    tl_cost cost;       /* tl_ctx_decode's seconds per call size */
    char sizing[512];   /* how the context and the KV pool were sized (tl_ctx_sizing) */
    tl_kvdisk *disk;    /* the prefix cache on disk (tl_ctx_disk_cache), or NULL */
    uint8_t *stage;     /* [block_bytes] a block on its way to or from the disk */
    uint8_t ident[16];  /* what computed its blocks (disk_identity), made once */
    int has_ident;
    tl_rsnap *snaps;    /* recurrent states of cached prefixes (models with recurrent layers), or NULL */
    tl_kvdisk *sdisk;   /* those states on disk (beside c->disk's blocks), or NULL */
    uint8_t *sstage;    /* [rs_bytes] a state on its way from the disk */
    int32_t *rseq;      /* [n_batch] a sequence's id repeated: its positions recomputed (rs_reach) */
    uint64_t *sfloat;   /* [n_seq] the chain of the snapshot a sequence's chunk made last, which its
                         * next one replaces (0: none) */
    int (*spin)[2];     /* [n_seq] boundaries whose state a sequence keeps (tl_seq_keep_state_at; 0: none) */
    void *snap0;        /* [rs_bytes] the implicit sequence's state at the end of its last prompt (it
                         * has no prefix cache: a rewind past what it holds resumes here) */
    int snap0_pos;      /* its boundary (0: none) */
};

/* Puts sequence seq's recurrent state at position len (<= its length): back
 * from where it stands when it can, else from the latest snapshot of its
 * cached prefix at or before len (or the start), the positions after it
 * computed again. TL_OK without recurrent layers. */
int tl_seq_rs_reach(tl_ctx *c, int seq, int len, tl_error *err);
/* Keeps the recurrent state at seq's last registered block boundary as a
 * snapshot of that prefix (once per prefix; nothing when it is not held),
 * in RAM and on disk: at close. */
void tl_seq_snapshot(tl_ctx *c, int seq);
/* After n positions of seq were committed, with reg blocks registered
 * before: the snapshot policy. At a boundary seq keeps (tl_seq_keep_state_at)
 * as tl_seq_snapshot does; else when a prompt's chunk, or guesses, ended
 * past a new block boundary (a decoded token alone never), in RAM only and
 * replacing the last such snapshot seq made: a long prompt would otherwise
 * leave one per chunk and push every other prompt's out. */
void tl_seq_snapshot_after(tl_ctx *c, int seq, int n, int reg);
/* Runs a batch whose rows go to out (at most max_rows), then commits each
 * sequence's new positions or leaves them pending (ctx.c). */
int tl_ctx_decode_into(tl_ctx *c, const tl_batch *b, int max_rows, float *out, tl_error *err);

/* Queues the blocks registered since the last call for the disk cache (seq.c). */
void tl_seq_offer_disk(tl_ctx *c);

#endif
