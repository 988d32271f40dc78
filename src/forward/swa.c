/* swa: the sliding-window layers' rings. A sliding-window layer never reads
 * a key older than its window, so (tl_backend_params.ring_blocks) it keeps
 * each sequence's last R blocks only, in a ring outside the pool: position p
 * lives in the ring's block (p / TL_KV_BLOCK) % R. The pool then holds the
 * other layers alone (Gemma 3 270M: 3 of 18 layers; ~6x less memory per
 * position at long contexts, as llama.cpp's iSWA cache).
 *
 * What a ring holds is a sequence state, as a recurrent layer's is: it can
 * go back while the window before the position is still in it (speculation's
 * rejected guesses, R's slack of a batch), and the prefix cache resumes a
 * prompt only at a block boundary whose window was saved (a snapshot: the
 * Wb blocks before the boundary, every ring layer's K then V). The rows are
 * the same bytes the pool would hold, read in the same order: the logits do
 * not change, bit for bit, only where the bytes live. */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "forward/cpu.h"

#define B TL_KV_BLOCK

int tl_ring_new(tl_cpu *c, int n_seq, int R, tl_error *err) {
    const tl_hparams *hp = &c->m->hp;
    c->ring_R = R;
    c->ring_nseq = n_seq;
    c->ring_maxblk = (c->n_ctx + B - 1) / B;
    c->ring_Wb = (hp->n_swa - 1 + B - 1) / B; /* the window before a boundary: n_swa - 1 positions */
    if (c->ring_Wb < 1) c->ring_Wb = 1;
    c->ring_l = calloc((size_t)(hp->n_kv_layer > 0 ? hp->n_kv_layer : 1), 1);
    c->ring_tbl = malloc((size_t)n_seq * (size_t)c->ring_maxblk * sizeof *c->ring_tbl);
    c->tring = calloc((size_t)c->n_batch, sizeof *c->tring);
    c->ring_hi = calloc((size_t)n_seq, sizeof *c->ring_hi);
    c->ring_lo = calloc((size_t)n_seq, sizeof *c->ring_lo);
    if (!c->ring_l || !c->ring_tbl || !c->tring || !c->ring_hi || !c->ring_lo)
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    for (int l = 0; l < hp->n_kv_layer; l++) c->ring_l[l] = (uint8_t)tl_model_kv_swa(c->m, l);
    for (int s = 0; s < n_seq; s++)
        for (int i = 0; i < c->ring_maxblk; i++)
            c->ring_tbl[(size_t)s * c->ring_maxblk + i] = (int32_t)((int64_t)s * R + i % R);
    return TL_OK;
}

void tl_ring_free(tl_cpu *c) {
    free(c->ring_l);
    free(c->ring_tbl);
    free(c->tring);
    free(c->ring_hi);
    free(c->ring_lo);
}

void tl_ring_begin(tl_cpu *c, int n) {
    for (int t = 0; t < n; t++) {
        const int s = c->tseq[t];
        c->tring[t] = c->ring_tbl + (size_t)s * c->ring_maxblk;
        if (c->tpos[t] + 1 > c->ring_hi[s]) c->ring_hi[s] = c->tpos[t] + 1;
    }
}

/* The first position sequence s's ring still holds: the last R * B below
 * the highest written (positions above the length, a rejected guess's, are
 * written before they are read again, and nothing past the highest wrapped
 * onto those below), from a snapshot's start on when it was loaded. */
static int held_from(const tl_cpu *c, int s) {
    int lo = c->ring_hi[s] - c->ring_R * B;
    if (lo < c->ring_lo[s]) lo = c->ring_lo[s];
    return lo > 0 ? lo : 0;
}

/* Whether the keys the position after pos - 1 reads (its window) are held. */
static int reaches(const tl_cpu *c, int s, int pos) {
    const int need = pos - c->m->hp.n_swa + 1;
    return pos <= c->ring_hi[s] && (need <= 0 ? 0 : need) >= held_from(c, s);
}

int tl_ring_seek(tl_cpu *c, int seq, int pos) {
    if (seq < 0 || seq >= c->ring_nseq || pos < 0) return -1;
    if (pos == 0) {
        c->ring_hi[seq] = c->ring_lo[seq] = 0;
        return 0;
    }
    return reaches(c, seq, pos) ? 0 : -1;
}

static size_t layer_bytes(const tl_cpu *c, int l) { return (size_t)B * (c->K.rb[l] + c->V.rb[l]); }

size_t tl_ring_snap_bytes(const tl_cpu *c) {
    size_t n = 0;
    for (int l = 0; l < c->m->hp.n_kv_layer; l++)
        if (c->ring_l[l]) n += (size_t)c->ring_Wb * layer_bytes(c, l);
    return n;
}

size_t tl_ring_seq_bytes(const tl_cpu *c) {
    size_t n = 0;
    for (int l = 0; l < c->m->hp.n_kv_layer; l++)
        if (c->ring_l[l]) n += (size_t)c->ring_R * layer_bytes(c, l);
    return n;
}

/* Ring block blk of sequence s in layer l of one side (NULL before position 0). */
static uint8_t *ring_block(const tl_cpu *c, const kv_side *sd, int l, int s, int blk) {
    const size_t kb = (size_t)B * sd->rb[l];
    return blk < 0 ? NULL : sd->mem + sd->off[l] + ((size_t)s * (size_t)c->ring_R + (size_t)(blk % c->ring_R)) * kb;
}

/* A snapshot is the Wb blocks before boundary pos, ring layer by layer, K
 * then V; blocks before position 0 are zeros in it and left alone in a ring. */
int tl_ring_snap_save(tl_cpu *c, int seq, int pos, void *p) {
    if (seq < 0 || seq >= c->ring_nseq || pos % B || !reaches(c, seq, pos)) return -1;
    uint8_t *o = p;
    for (int l = 0; l < c->m->hp.n_kv_layer; l++)
        for (int h = 0; c->ring_l[l] && h < 2; h++) {
            const kv_side *sd = h ? &c->V : &c->K;
            const size_t kb = (size_t)B * sd->rb[l];
            for (int i = 0; i < c->ring_Wb; i++, o += kb) {
                const uint8_t *r = ring_block(c, sd, l, seq, pos / B - c->ring_Wb + i);
                if (r) memcpy(o, r, kb);
                else memset(o, 0, kb);
            }
        }
    return 0;
}

void tl_ring_snap_load(tl_cpu *c, int seq, int pos, const void *p) {
    const uint8_t *in = p;
    for (int l = 0; l < c->m->hp.n_kv_layer; l++)
        for (int h = 0; c->ring_l[l] && h < 2; h++) {
            const kv_side *sd = h ? &c->V : &c->K;
            const size_t kb = (size_t)B * sd->rb[l];
            for (int i = 0; i < c->ring_Wb; i++, in += kb) {
                uint8_t *r = ring_block(c, sd, l, seq, pos / B - c->ring_Wb + i);
                if (r) memcpy(r, in, kb);
            }
        }
    /* only the window before pos was checked when it was saved: the
     * snapshot's first rows may be a later position's */
    c->ring_hi[seq] = pos;
    c->ring_lo[seq] = pos - c->m->hp.n_swa + 1 > 0 ? pos - c->m->hp.n_swa + 1 : 0;
}
