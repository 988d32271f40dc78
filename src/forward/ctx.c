/* ctx: a context's lifecycle and its forward calls: the parameters checked,
 * a backend (backend.h) beside the KV cache's bookkeeping (kv.h), batches
 * checked and placed (each token's position and block table), the logits
 * kept, and each call's cost measured for speculation (cost.h). The sequence
 * API is seq.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "forward/ctx.h"
#include "forward/pool.h"
#include "forward/kvfmt.h"
#include "base/sysmem.h"

static int check_tokens(const tl_ctx *c, const int32_t *tokens, int n, tl_error *err) {
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->m->hp.n_vocab)
            return tl_fail(err, TL_ERR_ARG, "token id %d out of range 0..%d", tokens[t],
                           c->m->hp.n_vocab - 1);
    return TL_OK;
}

static const char *const kv_type_names[] = {"f16", "q8_0", "q4_0"};
static const tl_type kv_types[] = {TL_F16, TL_Q8_0, TL_Q4_0};

static size_t kv_bytes_per_pos(const tl_model *m, int kv_type_k, int kv_type_v, int window);
/* Blocks of each sequence's ring for the sliding-window layers, or 0 when
 * they go in the pool (swa_full, none, an encoder, or a context too short
 * for a ring to save anything). */
static int ring_blocks(const tl_model *m, int n_ctx, int n_batch, int swa_full);

/* The defaults that depend on the machine: a context of the model's
 * training length when every sequence's KV at that length fits, else the
 * longest that does (never below min(training, 4096), the old default); a
 * pool for every sequence at full length, cut to what fits. "Fits" is 3/4
 * of the memory the process may still take (tl_sysmem_available: the least
 * of MemAvailable, the cgroup's room and ulimit -v's) after the model file
 * (a packed copy may not be made yet): the quarter is for activations, the
 * rest of the process and the machine. A pool smaller than a sequence's
 * full context is the caller's to refuse requests by (the server's 4xx).
 * 256 MiB more are kept aside before the 3/4: thread stacks (8 MiB of
 * address space each, which ulimit -v counts) and the server's buffers. */
static int size_defaults(const tl_model *m, tl_ctx_params *p, char *why, size_t cap, tl_error *err) {
    const tl_hparams *hp = &m->hp;
    const size_t bpp_full = kv_bytes_per_pos(m, p->kv_type_k, p->kv_type_v, 0),
                 bpp_win = kv_bytes_per_pos(m, p->kv_type_k, p->kv_type_v, 1);
    if (!bpp_full && !bpp_win)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "a KV cache of %s/%s needs a head size that is a multiple of 32 "
                       "(this model's is %d)", tl_kv_type_name(p->kv_type_k), tl_kv_type_name(p->kv_type_v), hp->head_dim);
    const uint64_t nseq = p->n_seq_max > 0 ? (uint64_t)p->n_seq_max : 1;
    const int nb = p->n_batch > 0 ? p->n_batch : 512;
    const char *src = "nothing";
    const uint64_t avail = tl_sysmem_available(&src), file = m->gguf ? m->gguf->file_size : 0;
    /* recurrent layers: each sequence's state (its boundary states and
     * recent inputs, about 4 snapshots' worth) and the snapshot store's
     * (up to 2 per sequence, within 1 GiB) come first */
    const uint64_t sb = tl_model_state_bytes(m, NULL), snaps = 2 * (nseq + 1) * sb;
    uint64_t states = sb ? 4 * (nseq + 1) * sb + (snaps < ((uint64_t)1 << 30) ? snaps : ((uint64_t)1 << 30)) : 0;
    /* sliding-window layers in rings (when the context comes out long
     * enough for one): each sequence's ring, and window snapshots as for
     * recurrent states, come first too; the pool holds the other layers */
    const int rblk = bpp_win ? ring_blocks(m, 1 << 22, nb, p->swa_full) : 0, ring = rblk > 0;
    const uint64_t rb = (uint64_t)bpp_win * (uint64_t)rblk * TL_KV_BLOCK,
                   wsnaps = 2 * (nseq + 1) * (ring ? (uint64_t)bpp_win * (uint64_t)hp->n_swa : 0);
    /* (embedding lanes' rings too: a long text fills one) */
    if (ring)
        states += (nseq + 1 + (uint64_t)p->n_seq_embd) * rb + (wsnaps < ((uint64_t)1 << 30) ? wsnaps : ((uint64_t)1 << 30));
    const size_t bpp = ring ? bpp_full : bpp_full + bpp_win;
    const uint64_t keep = file + ((uint64_t)256 << 20) + states;
    const uint64_t budget = avail > keep ? (avail - keep) / 4 * 3 : 0;
    const int train = hp->n_ctx_train > 0 ? hp->n_ctx_train : 4096, floor_ctx = train < 4096 ? train : 4096;
    const double gib = (double)(1u << 30);
    int n = 0;
    if (p->n_ctx > 0) {
        n = snprintf(why, cap, "context %d (asked)", p->n_ctx);
    } else if (!avail) {
        p->n_ctx = train;
        n = snprintf(why, cap, "context %d: the model's training length (free memory unknown)", train);
    } else if ((uint64_t)bpp * (uint64_t)train * nseq <= budget) {
        p->n_ctx = train;
        n = snprintf(why, cap, "context %d: the model's training length, whose KV for %d sequence%s fits", train,
                     (int)nseq, nseq > 1 ? "s" : "");
    } else {
        uint64_t fit = budget / ((uint64_t)bpp * nseq) / 256 * 256;
        p->n_ctx = fit > (uint64_t)floor_ctx ? (int)fit : floor_ctx;
        n = snprintf(why, cap, "context %d: the longest whose KV for %d sequence%s fits (training length %d)", p->n_ctx,
                     (int)nseq, nseq > 1 ? "s" : "", train);
    }
    if (n < 0 || (size_t)n >= cap) n = (int)cap - 1;
    /* the pool's layers as the context came out (a short one keeps windows whole) */
    const int ring_on = ring && ring_blocks(m, p->n_ctx, nb, p->swa_full) > 0;
    const size_t pbpp = ring_on ? bpp_full : bpp_full + bpp_win;
    const uint64_t want = (uint64_t)pbpp * (uint64_t)((p->n_ctx + TL_KV_BLOCK - 1) / TL_KV_BLOCK * TL_KV_BLOCK) * nseq;
    if (p->kv_bytes) {
        n += snprintf(why + n, cap - (size_t)n, "; KV pool %.2f GiB (asked)", (double)p->kv_bytes / gib);
    } else if (avail && want > budget) {
        const uint64_t blk = (uint64_t)(pbpp ? pbpp : 1) * TL_KV_BLOCK;
        p->kv_bytes = (size_t)(budget > blk ? budget / blk * blk : blk);
        n += snprintf(why + n, cap - (size_t)n, "; KV pool %.2f GiB, cut from the %.2f GiB full sequences need to 3/4 of "
                 "what the %.2f GiB %s leaves after the model and 256 MiB", (double)p->kv_bytes / gib, (double)want / gib,
                 (double)avail / gib, src);
    } else {
        n += snprintf(why + n, cap - (size_t)n, "; KV pool %.2f GiB: %d full sequence%s (%s: %.2f GiB available)",
                      (double)want / gib, (int)nseq, nseq > 1 ? "s" : "", src, (double)avail / gib);
    }
    if (n >= 0 && (size_t)n < cap && ring_on)
        n += snprintf(why + n, cap - (size_t)n, "; sliding-window layers: a ring of %d positions per sequence (its "
                      "window of %d and a batch of %d; %.1f MiB each; --swa-full keeps them all)", rblk * TL_KV_BLOCK,
                      hp->n_swa, nb, (double)rb / (1 << 20));
    if (sb && n >= 0 && (size_t)n < cap)
        snprintf(why + n, cap - (size_t)n, "; %.2f GiB kept for sequence states", (double)(states) / gib);
    return TL_OK;
}

int tl_ctx_new(const tl_model *m, const tl_ctx_params *params, tl_ctx **out, tl_error *err) {
    *out = NULL;
    if (!m || !m->arch)
        return tl_fail(err, TL_ERR_ARG, "the model has no weights to run (vocabulary only)");
    tl_ctx_params p = params ? *params : (tl_ctx_params){0};
    int st;
    if (p.n_ctx < 0 || p.n_threads < 0 || p.n_batch < 0)
        return tl_fail(err, TL_ERR_ARG, "negative context, thread or batch size");
    if (!tl_kv_type_name(p.kv_type_k) || !tl_kv_type_name(p.kv_type_v))
        return tl_fail(err, TL_ERR_ARG, "unknown KV cache type %d", tl_kv_type_name(p.kv_type_k) ? p.kv_type_v : p.kv_type_k);
    char sizing[512];
    if ((st = size_defaults(m, &p, sizing, sizeof sizing, err))) return st;
    if (p.n_ctx > (1 << 22)) return tl_fail(err, TL_ERR_ARG, "context %d too large", p.n_ctx);
    if (p.share_threads) p.n_threads = tl_pool_size(p.share_threads->be.pool);
    if (p.n_threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = nc > 0 ? (int)nc : 1;
    }
    if (p.n_batch == 0) p.n_batch = 512;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.n_seq_max < 0 || p.n_seq_max > 4096 || p.n_seq_embd < 0 || p.n_seq_embd > 4096 || p.n_logits_max < 0)
        return tl_fail(err, TL_ERR_ARG, "bad sequence count %d (+%d for embeddings) or logits rows %d", p.n_seq_max,
                       p.n_seq_embd, p.n_logits_max);
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
    /* sliding-window layers in rings: a ring for each sequence, embedding
     * lanes included (their memory is taken as they are written) */
    const int rblk = ring_blocks(m, p.n_ctx, p.n_batch, p.swa_full);
    tl_ctx *c = calloc(1, sizeof *c);
    if (!c) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    tl_backend_params bp = {.n_ctx = p.n_ctx, .n_batch = p.n_batch, .n_threads = p.n_threads,
                            .numerics = p.numerics, .n_seq_max = p.n_seq_max, .n_seq_embd = p.n_seq_embd,
                            .kv_bytes = p.kv_bytes,
                            .kv_type_k = p.kv_type_k, .kv_type_v = p.kv_type_v,
                            .ring_blocks = rblk,
                            .share_pool = p.share_threads ? p.share_threads->be.pool : NULL};
    st = tl_cpu_backend_new(m, &bp, &c->be, err);
    if (st) {
        free(c);
        return st;
    }
    c->m = m;
    memcpy(c->sizing, sizing, sizeof c->sizing);
    c->n_ctx = p.n_ctx;
    c->n_batch = p.n_batch;
    c->n_seq = p.n_seq_max + p.n_seq_embd + 1;
    c->n_logits_max = p.n_logits_max;
    const size_t nb = (size_t)p.n_batch;
    c->tpos = calloc(nb, sizeof *c->tpos);
    c->tseq = calloc(nb, sizeof *c->tseq);
    c->tblk = calloc(nb, sizeof *c->tblk);
    c->lrow = calloc(nb, sizeof *c->lrow);
    c->seq_cnt = calloc((size_t)c->n_seq, sizeof *c->seq_cnt);
    c->bseq0 = calloc(nb, sizeof *c->bseq0);
    c->blg = calloc(nb, 1);
    if (c->be.rs_bytes) {
        /* at least two per sequence, within 1 GiB unless one alone is larger */
        const size_t cap_mem = ((size_t)1 << 30) / c->be.rs_bytes;
        int cap = 2 * c->n_seq > 8 ? 2 * c->n_seq : 8;
        if ((size_t)cap > cap_mem) cap = cap_mem > 0 ? (int)cap_mem : 1;
        c->snaps = tl_rsnap_new(c->be.rs_bytes, cap);
        c->rseq = calloc(nb, sizeof *c->rseq);
        c->sfloat = calloc((size_t)c->n_seq, sizeof *c->sfloat);
        c->spin = calloc((size_t)c->n_seq, sizeof *c->spin);
        c->snap0 = malloc(c->be.rs_bytes);
    }
    if (tl_kv_new(c->be.n_blocks, c->n_seq, c->n_ctx, &c->kv) || !c->tpos || !c->tseq || !c->tblk || !c->lrow ||
        !c->seq_cnt || !c->bseq0 || !c->blg || (c->be.rs_bytes && (!c->snaps || !c->rseq || !c->sfloat || !c->spin || !c->snap0))) {
        tl_ctx_free(c);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory for a context of %d positions", p.n_ctx);
    }
    *out = c;
    return TL_OK;
}

void tl_ctx_free(tl_ctx *c) {
    if (!c) return;
    tl_kvdisk_close(c->disk); /* writes what is queued */
    tl_kvdisk_close(c->sdisk);
    free(c->sstage);
    free(c->stage);
    if (c->be.ops) c->be.ops->free(c->be.state);
    tl_kv_free(c->kv);
    free(c->tpos);
    free(c->tseq);
    free(c->tblk);
    free(c->lrow);
    free(c->seq_cnt);
    free(c->bseq0);
    free(c->blg);
    free(c->logits);
    tl_rsnap_free(c->snaps);
    free(c->rseq);
    free(c->sfloat);
    free(c->spin);
    free(c->snap0);
    free(c);
}

int tl_ctx_n_ctx(const tl_ctx *c) { return c->n_ctx; }
int tl_ctx_n_batch(const tl_ctx *c) { return c->n_batch; }
int tl_ctx_n_past(const tl_ctx *c) { return tl_kv_seq_peek(c->kv, 0)->len; }
const char *tl_ctx_backend(const tl_ctx *c) { return c->be.name; }
const char *tl_ctx_numerics(const tl_ctx *c) { return c->be.numerics; }
const char *tl_ctx_sizing(const tl_ctx *c) { return c->sizing; }

void tl_ctx_thread_stats(const tl_ctx *c, tl_thread_stats *out) {
    out->n_threads = tl_pool_size(c->be.pool);
    tl_pool_stats(c->be.pool, &out->jobs, &out->wall_s, &out->busy_s);
}

int tl_numerics_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "fast")) return TL_NUMERICS_FAST;
    if (!strcmp(name, "exact")) return TL_NUMERICS_EXACT;
    if (!strcmp(name, "auto")) return TL_NUMERICS_AUTO;
    return -1;
}

/* Bytes per position of the cache layers in or out of sliding windows
 * (window 0: the others, 1: the window layers), each at its own width
 * (Gemma 4's differ); 0 when the types do not fit the model's head sizes. */
static size_t kv_bytes_per_pos(const tl_model *m, int kv_type_k, int kv_type_v, int window) {
    if (!m || !m->arch || !tl_kv_type_name(kv_type_k) || !tl_kv_type_name(kv_type_v)) return 0;
    const tl_hparams *hp = &m->hp;
    const tl_kv_format *kf = tl_kv_format_of(kv_types[kv_type_k]), *vf = tl_kv_format_of(kv_types[kv_type_v]);
    if (hp->head_dim % kf->block || hp->head_dim % vf->block || hp->head_dim_swa % kf->block ||
        hp->head_dim_swa % vf->block)
        return 0;
    size_t n = 0;
    for (int l = 0; l < hp->n_kv_layer; l++)
        if (tl_model_kv_swa(m, l) == window) n += kf->row_bytes(m->kv_dim[l]) + vf->row_bytes(m->kv_dim[l]);
    return n;
}

size_t tl_model_kv_bytes_per_pos(const tl_model *m, int kv_type_k, int kv_type_v) {
    return kv_bytes_per_pos(m, kv_type_k, kv_type_v, 0);
}

size_t tl_model_kv_window_bytes(const tl_model *m, int kv_type_k, int kv_type_v, int *n_swa) {
    const size_t b = kv_bytes_per_pos(m, kv_type_k, kv_type_v, 1);
    if (n_swa) *n_swa = b ? m->hp.n_swa : 0;
    return b;
}

int tl_model_kv_ring_positions(const tl_model *m, int n_batch) {
    if (!m || !m->arch || !m->hp.causal || m->hp.n_swa <= 0 || n_batch <= 0) return 0;
    int any = 0;
    for (int l = 0; l < m->hp.n_kv_layer && !any; l++) any = tl_model_kv_swa(m, l);
    if (!any) return 0;
    /* a call's first row reaches n_swa - 1 back while its last (n_batch - 1
     * on) is written: position p is ring position p % (R * TL_KV_BLOCK), so
     * those n_swa - 1 + n_batch positions must not wrap onto each other; and
     * a block more, so that the window before the last block boundary is
     * still held when a call ended up to 15 positions past it (its snapshot,
     * tl_ctx_save) */
    const long r = ((long)n_batch + m->hp.n_swa - 1 + 2 * TL_KV_BLOCK - 1) / TL_KV_BLOCK;
    return r * TL_KV_BLOCK < (1L << 30) ? (int)(r * TL_KV_BLOCK) : 0;
}

static int ring_blocks(const tl_model *m, int n_ctx, int n_batch, int swa_full) {
    const int r = swa_full ? 0 : tl_model_kv_ring_positions(m, n_batch) / TL_KV_BLOCK;
    return r < (n_ctx + TL_KV_BLOCK - 1) / TL_KV_BLOCK ? r : 0;
}

size_t tl_model_state_bytes(const tl_model *m, int *n_layers) {
    if (n_layers) *n_layers = m && m->arch ? m->hp.n_rec_layer : 0;
    if (!m || !m->arch || !m->hp.n_rec_layer) return 0;
    const tl_hparams *hp = &m->hp;
    const size_t conv_dim = (size_t)(2 * hp->ssm_n_kh + hp->ssm_n_vh) * hp->ssm_d_state;
    return (size_t)hp->n_rec_layer *
           ((size_t)hp->ssm_n_vh * hp->ssm_d_state * hp->ssm_d_state + (size_t)(hp->ssm_d_conv - 1) * conv_dim) *
           sizeof(float);
}

int tl_kv_type_parse(const char *name) {
    for (int i = 0; name && i < (int)(sizeof kv_type_names / sizeof *kv_type_names); i++)
        if (!strcmp(name, kv_type_names[i])) return i;
    return -1;
}

const char *tl_kv_type_name(int type) {
    return type >= 0 && type < (int)(sizeof kv_type_names / sizeof *kv_type_names) ? kv_type_names[type] : NULL;
}

const tl_model *tl_ctx_model(const tl_ctx *c) { return c->m; }

static int logits_room(tl_ctx *c, size_t rows, tl_error *err) {
    size_t need = rows * (size_t)c->m->hp.n_vocab;
    if (need <= c->logits_cap) return TL_OK;
    float *nl = realloc(c->logits, need * sizeof(float));
    if (!nl) return tl_fail(err, TL_ERR_NOMEM, "out of memory for logits");
    c->logits = nl;
    c->logits_cap = need;
    return TL_OK;
}


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
        if ((st = tl_ctx_decode_into(c, &b, nb, out, err))) return st;
        done += (size_t)nb;
    }
    c->blogits_n = 0; /* the rows are tl_ctx_logits', not tl_ctx_batch_logits' */
    /* a prompt's end: where a later rewind deeper than the state holds resumes */
    const int b0 = (past + (int)n) / TL_KV_BLOCK * TL_KV_BLOCK;
    if (c->snap0 && n >= 2 && b0 > c->snap0_pos && c->be.ops->rs_save(c->be.state, 0, b0, c->snap0) == 0)
        c->snap0_pos = b0;
    c->logits_first = all_logits ? 0 : (int)n - 1;
    c->logits_n = all_logits ? (int)n : 1;
    return TL_OK;
}

/* common_embd_normalize's euclidean case: float squares summed in double,
 * then each element times (float)(1 / sqrt(sum)). */
static void l2_normalize(float *v, int d) {
    double sum = 0.0;
    for (int i = 0; i < d; i++) sum += v[i] * v[i];
    sum = sqrt(sum);
    const float norm = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int i = 0; i < d; i++) v[i] *= norm;
}

/* The pooling a call asks for, resolved (the model's), or a negative status. */
static int embed_pooling(const tl_ctx *c, int pooling, tl_error *err) {
    if (pooling == TL_POOL_MODEL) pooling = tl_model_pooling(c->m);
    if (pooling < TL_POOL_NONE || pooling > TL_POOL_RANK)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "pooling %d is not supported (none, mean, cls, last, rank)", pooling);
    if (pooling == TL_POOL_RANK && (!tl_model_n_cls_out(c->m) || !c->be.ops->head))
        return tl_fail(err, TL_ERR_UNSUPPORTED,
                       "rank pooling needs a classification head (cls.weight or cls.output.weight), "
                       "which this file does not have: it is not a reranker");
    return pooling;
}

static int embed_check_text(const tl_ctx *c, const int32_t *tokens, size_t n, tl_error *err) {
    if (n == 0) return tl_fail(err, TL_ERR_ARG, "nothing to embed: no tokens");
    if (n > (size_t)c->n_ctx)
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "an input of %zu tokens exceeds the context of %d", n, c->n_ctx);
    /* an encoder's attention sees the whole text at once: one call */
    if (tl_model_is_encoder(c->m) && n > (size_t)c->n_batch)
        return tl_fail(err, TL_ERR_ARG, "an input of %zu tokens exceeds the batch of %d (%s attends to the whole text "
                       "in one call: raise the batch size)", n, c->n_batch, c->m->arch->name);
    return check_tokens(c, tokens, (int)n, err);
}

/* Whether the row of position p (of a text of n tokens) is one pooling
 * reads. Rank pooling reads llama.cpp's inp_cls row: the last position when
 * attention is causal, the first (CLS) otherwise. */
static int embed_keeps(const tl_ctx *c, int pooling, size_t p, size_t n) {
    const int rank_last = pooling == TL_POOL_RANK && c->m->hp.causal;
    if (pooling == TL_POOL_NONE || pooling == TL_POOL_MEAN) return 1;
    if (pooling == TL_POOL_CLS || (pooling == TL_POOL_RANK && !rank_last)) return p == 0;
    return p == n - 1;
}

int tl_ctx_embed(tl_ctx *c, const int32_t *tokens, size_t n, int pooling, int normalize, float *out, tl_error *err) {
    if (!c || !tokens || !out) return tl_fail(err, TL_ERR_ARG, "tl_ctx_embed: NULL argument");
    if ((pooling = embed_pooling(c, pooling, err)) < 0) return pooling;
    const int d = c->m->hp.n_embd, nv = c->m->hp.n_vocab;
    int st = embed_check_text(c, tokens, n, err);
    if (st || (st = tl_ctx_truncate(c, 0, err))) return st;
    /* a chunk's rows of d floats in the logits buffer (rows of nv) */
    if ((st = logits_room(c, ((size_t)c->n_batch * d + nv - 1) / nv, err))) return st;
    if (tl_kv_seq_grow(c->kv, 0, (int)n)) return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block");
    /* the mean in llama.cpp's order (forward/pool.c), streamed across calls */
    tl_mean_pool mp = {0};
    if (pooling == TL_POOL_MEAN && tl_mean_pool_init(&mp, d, n)) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    c->embd_mode = 1;
    for (size_t done = 0; done < n && !st;) {
        const int nb = (int)((n - done) < (size_t)c->n_batch ? (n - done) : (size_t)c->n_batch);
        for (int t = 0; t < nb; t++) c->blg[t] = (uint8_t)embed_keeps(c, pooling, done + (size_t)t, n);
        tl_batch b = {.n = nb, .token = tokens + done, .seq = c->bseq0, .logits = c->blg};
        if ((st = tl_ctx_decode_into(c, &b, nb, c->logits, err))) break;
        const float *rows = c->logits;
        switch (pooling) {
        case TL_POOL_NONE: memcpy(out + done * (size_t)d, rows, (size_t)nb * d * sizeof *out); break;
        case TL_POOL_MEAN: tl_mean_pool_add(&mp, rows, nb); break;
        case TL_POOL_RANK: /* the head on the one row kept, if this chunk held it */
            if (c->blogits_n == 1) c->be.ops->head(c->be.state, rows, out);
            break;
        default: /* the one row kept, if this chunk held it */
            if (c->blogits_n == 1) memcpy(out, rows, (size_t)d * sizeof *out);
            break;
        }
        done += (size_t)nb;
    }
    c->embd_mode = 0;
    c->logits_n = c->blogits_n = 0;
    if (pooling == TL_POOL_MEAN && !st) tl_mean_pool_finish(&mp, out);
    tl_mean_pool_free(&mp);
    if (st) return st;
    const int nrow = pooling == TL_POOL_NONE ? (int)n : 1;
    /* scores are not vectors: llama-server's rerank reads them raw */
    for (int r = 0; normalize && pooling != TL_POOL_RANK && r < nrow; r++) l2_normalize(out + (size_t)r * d, d);
    return nrow;
}

/* A sequence of tl_ctx_embed_batch and the text it runs. */
typedef struct emb_lane {
    int seq;         /* 0 or tl_seq_open's */
    int text;        /* the text it runs; -1: none */
    size_t sent;     /* its tokens put in calls so far */
    tl_mean_pool mp; /* mean pooling's running sums for the text */
} emb_lane;

/* One tl_ctx_embed_batch call's scratch: its lanes and the batch it fills. */
typedef struct emb_run {
    tl_ctx *c;
    const int32_t *const *tokens;
    const size_t *n;
    float *const *out;
    int pooling, normalize, n_texts, next; /* next: the first text no lane has taken */
    emb_lane *lane;
    int n_lane;
    int32_t *tok, *seq; /* [n_batch] the call's tokens and their sequences */
    int *who;           /* [n_batch] each token's lane */
    size_t *pos;        /* [n_batch] each token's position in its text */
} emb_run;

static void emb_run_free(emb_run *r) {
    tl_error scratch = {0};
    for (int l = 0; r->lane && l < r->n_lane; l++) {
        tl_mean_pool_free(&r->lane[l].mp);
        if (r->lane[l].seq > 0) tl_seq_close(r->c, r->lane[l].seq);
    }
    (void)tl_ctx_truncate(r->c, 0, &scratch);
    free(r->lane);
    free(r->tok);
    free(r->seq);
    free(r->who);
    free(r->pos);
}

/* Sequence 0 and as many opened ones as there are texts, or as the context
 * has free: with fewer, lanes take the texts in turn. */
static int emb_run_init(emb_run *r, tl_error *err) {
    tl_ctx *c = r->c;
    const size_t nb = (size_t)c->n_batch;
    r->lane = calloc((size_t)r->n_texts, sizeof *r->lane);
    r->tok = malloc(nb * sizeof *r->tok);
    r->seq = malloc(nb * sizeof *r->seq);
    r->who = malloc(nb * sizeof *r->who);
    r->pos = malloc(nb * sizeof *r->pos);
    if (!r->lane || !r->tok || !r->seq || !r->who || !r->pos) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    int st = tl_ctx_truncate(c, 0, err);
    if (st) return st;
    r->lane[0] = (emb_lane){.seq = 0, .text = -1};
    r->n_lane = 1;
    tl_error scratch = {0};
    while (r->n_lane < r->n_texts && tl_seq_open(c, &r->lane[r->n_lane].seq, &scratch) == TL_OK)
        r->lane[r->n_lane++].text = -1;
    return TL_OK;
}

/* A free lane takes the next text: its blocks up front, so a full pool
 * fails before anything is written. */
static int emb_lane_take(emb_run *r, emb_lane *ln, tl_error *err) {
    const int i = r->next++;
    ln->text = i;
    ln->sent = 0;
    if (tl_kv_seq_grow(r->c->kv, ln->seq, (int)r->n[i]))
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block");
    if (r->pooling == TL_POOL_MEAN && tl_mean_pool_init(&ln->mp, r->c->m->hp.n_embd, r->n[i]))
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    return TL_OK;
}

/* The next call's tokens: each lane's next run in lane order, a text taken
 * by each free lane while there is room. An encoder's text goes whole or
 * waits for the next call. Returns the tokens placed or a negative status. */
static int emb_fill(emb_run *r, tl_error *err) {
    tl_ctx *c = r->c;
    const int enc = tl_model_is_encoder(c->m);
    int nb = 0, st;
    for (int l = 0; l < r->n_lane && nb < c->n_batch; l++) {
        emb_lane *ln = &r->lane[l];
        if (ln->text < 0 && r->next < r->n_texts && (st = emb_lane_take(r, ln, err))) return st;
        if (ln->text < 0) continue;
        const size_t n = r->n[ln->text], left = n - ln->sent, room = (size_t)(c->n_batch - nb);
        if (enc && left > room) continue;
        const size_t take = left < room ? left : room;
        for (size_t k = 0; k < take; k++, nb++) {
            const size_t p = ln->sent + k;
            r->tok[nb] = r->tokens[ln->text][p];
            r->seq[nb] = ln->seq;
            r->who[nb] = l;
            r->pos[nb] = p;
            c->blg[nb] = (uint8_t)embed_keeps(c, r->pooling, p, n);
        }
        ln->sent += take;
    }
    return nb;
}

/* The kept rows of the last call, each to its text's output or pooling;
 * then every text whose last token was in it is finished and its lane freed. */
static int emb_collect(emb_run *r, int nb, tl_error *err) {
    tl_ctx *c = r->c;
    const int d = c->m->hp.n_embd;
    int row = 0;
    for (int t = 0; t < nb; t++) {
        if (!c->blg[t]) continue;
        emb_lane *ln = &r->lane[r->who[t]];
        const float *h = c->logits + (size_t)row++ * d;
        float *o = r->out[ln->text];
        switch (r->pooling) {
        case TL_POOL_NONE: memcpy(o + r->pos[t] * (size_t)d, h, (size_t)d * sizeof *o); break;
        case TL_POOL_MEAN: tl_mean_pool_add(&ln->mp, h, 1); break;
        case TL_POOL_RANK: c->be.ops->head(c->be.state, h, o); break;
        default: memcpy(o, h, (size_t)d * sizeof *o); break;
        }
    }
    for (int l = 0; l < r->n_lane; l++) {
        emb_lane *ln = &r->lane[l];
        if (ln->text < 0 || ln->sent < r->n[ln->text]) continue;
        float *o = r->out[ln->text];
        if (r->pooling == TL_POOL_MEAN) tl_mean_pool_finish(&ln->mp, o);
        tl_mean_pool_free(&ln->mp);
        const size_t nrow = r->pooling == TL_POOL_NONE ? r->n[ln->text] : 1;
        for (size_t k = 0; r->normalize && r->pooling != TL_POOL_RANK && k < nrow; k++)
            l2_normalize(o + k * (size_t)d, d);
        ln->text = -1;
        const int st = tl_seq_truncate(c, ln->seq, 0, err); /* its blocks back for the next text */
        if (st) return st;
    }
    return TL_OK;
}

int tl_ctx_embed_batch(tl_ctx *c, const int32_t *const *tokens, const size_t *n, int n_texts, int pooling,
                       int normalize, float *const *out, tl_error *err) {
    if (!c || !tokens || !n || !out || n_texts < 0) return tl_fail(err, TL_ERR_ARG, "tl_ctx_embed_batch: bad argument");
    if ((pooling = embed_pooling(c, pooling, err)) < 0) return pooling;
    int st = TL_OK;
    for (int i = 0; i < n_texts && !st; i++)
        st = !tokens[i] || !out[i] ? tl_fail(err, TL_ERR_ARG, "tl_ctx_embed_batch: text %d: NULL argument", i)
                                   : embed_check_text(c, tokens[i], n[i], err);
    if (st || n_texts == 0) return st;
    const int d = c->m->hp.n_embd, nv = c->m->hp.n_vocab;
    /* a call's rows of d floats in the logits buffer (rows of nv) */
    if ((st = logits_room(c, ((size_t)c->n_batch * d + nv - 1) / nv, err))) return st;
    emb_run r = {.c = c, .tokens = tokens, .n = n, .out = out, .pooling = pooling, .normalize = normalize,
                 .n_texts = n_texts};
    st = emb_run_init(&r, err);
    c->embd_mode = 1;
    for (;;) {
        if (st) break;
        const int nb = emb_fill(&r, err);
        if (nb <= 0) {
            st = nb; /* 0: every text is done (the encoders' fit is checked above) */
            break;
        }
        tl_batch b = {.n = nb, .token = r.tok, .seq = r.seq, .logits = c->blg};
        if ((st = tl_ctx_decode_into(c, &b, nb, c->logits, err))) break;
        st = emb_collect(&r, nb, err);
    }
    c->embd_mode = 0;
    c->logits_n = c->blogits_n = 0;
    emb_run_free(&r);
    return st;
}

const float *tl_ctx_logits(const tl_ctx *c, int i) {
    if (c->logits_n == 0) return NULL;
    int total = c->logits_first + c->logits_n;
    if (i < 0) i = total - 1;
    if (i < c->logits_first || i >= total) return NULL;
    return c->logits + (size_t)(i - c->logits_first) * c->m->hp.n_vocab;
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
    /* after every sequence has grown: a block table may move as it grows */
    for (int t = 0; t < b->n; t++) c->tblk[t] = tl_kv_seq_peek(c->kv, b->seq[t])->blk;
    c->blogits_n = nl;
    return TL_OK;
}

int tl_ctx_decode_into(tl_ctx *c, const tl_batch *b, int max_rows, float *out, tl_error *err) {
    int st = TL_OK;
    if (tl_model_is_encoder(c->m) && !c->embd_mode)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "%s is an embedding model (an encoder without an output layer): it "
                       "cannot generate or give logits; use tokenloop embed, /v1/embeddings or tl_ctx_embed",
                       c->m->arch->name);
    /* a recurrent state continues from the committed length (what was pending is gone) */
    for (int t = 0; c->be.ops->rs_seek && b && b->seq && t < b->n && t < c->n_batch; t++) {
        const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, b->seq[t]);
        if (sq && (t == 0 || b->seq[t] != b->seq[t - 1]) && (st = tl_seq_rs_reach(c, b->seq[t], sq->len, err)))
            return st;
    }
    st = batch_prepare(c, b, max_rows, err);
    if (st) {
        c->blogits_n = 0;
        return st;
    }
    const tl_fwd_batch fb = {.n = b->n, .tokens = b->token, .pos = c->tpos, .seq = c->tseq,
                             .blk = c->tblk, .lrow = c->lrow, .nl = c->blogits_n, .embd = c->embd_mode};
    c->be.ops->forward(c->be.state, &fb, out);
    for (int id = 0; id < c->n_seq; id++) {
        if (!c->seq_cnt[id]) continue;
        tl_kv_seq *sq = tl_kv_seq_get(c->kv, id);
        const int reg = sq->n_reg;
        if (b->pending) sq->pend = c->seq_cnt[id];
        else tl_kv_seq_commit(c->kv, id, sq->len + c->seq_cnt[id]);
        if (!b->pending) tl_seq_snapshot_after(c, id, c->seq_cnt[id], reg);
    }
    if (c->disk) tl_seq_offer_disk(c);
    return TL_OK;
}

int tl_ctx_decode(tl_ctx *c, const tl_batch *b, tl_error *err) {
    c->logits_n = c->blogits_n = 0;
    int st = logits_room(c, (size_t)c->n_logits_max, err);
    if (st) return st;
    double t0 = tl_now();
    if ((st = tl_ctx_decode_into(c, b, c->n_logits_max, c->logits, err))) return st;
    tl_ctx_cost_record(c, b->n, tl_now() - t0);
    return TL_OK;
}

void tl_ctx_cost_record(tl_ctx *c, int n, double s) { tl_cost_record(&c->cost, n, s); }

double tl_ctx_decode_cost(const tl_ctx *c, int n) { return tl_cost_at(&c->cost, n); }

const float *tl_ctx_batch_logits(const tl_ctx *c, int i) {
    if (i < 0 || i >= c->blogits_n) return NULL;
    return c->logits + (size_t)i * c->m->hp.n_vocab;
}
