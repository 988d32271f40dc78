/* seq: the sequence API over a context's KV cache (kv.h): open, reuse a
 * cached prefix (from RAM, then from the disk cache), truncate (copying the
 * kept part of a shared block through the backend), commit pending
 * positions, close; and the disk cache's place in it (kvdisk.h): the
 * identity its files carry, newly registered blocks handed to its writer. */
#include <errno.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "forward/ctx.h"
#include "load/gguf.h"
#include "load/model.h"

int tl_ctx_truncate(tl_ctx *c, int n_past, tl_error *err) { return tl_seq_truncate(c, 0, n_past, err); }

int tl_seq_truncate(tl_ctx *c, int seq, int len, tl_error *err) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    if (!sq) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (len < 0 || len > sq->len)
        return tl_fail(err, TL_ERR_ARG, "cannot truncate sequence %d to %d (it holds %d)", seq, len, sq->len);
    if (seq == 0 && len < c->snap0_pos) c->snap0_pos = 0; /* its tokens may change */
    int32_t from, to;
    if (tl_kv_seq_truncate(c->kv, seq, len, &from, &to))
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block to copy a shared one into");
    if (from >= 0) /* the kept part of a shared block: every layer's K and V */
        c->be.ops->copy_block(c->be.state, from, to);
    c->logits_n = c->blogits_n = 0;
    return tl_seq_rs_reach(c, seq, len, err);
}

/* Positions [from, to) of seq computed again (its length and state at from;
 * the tokens stay in its token array past its length). */
static int replay(tl_ctx *c, int seq, int from, int to, tl_error *err) {
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    for (int at = from; at < to;) {
        const int k = to - at < c->n_batch ? to - at : c->n_batch;
        for (int i = 0; i < k; i++) c->rseq[i] = seq;
        const tl_batch rb = {.n = k, .token = s->tok + at, .seq = c->rseq};
        const int st = tl_ctx_decode_into(c, &rb, 0, NULL, err);
        if (st) return st;
        at += k;
    }
    c->logits_n = c->blogits_n = 0;
    return TL_OK;
}

/* The content key of the prefix before seq's i-th registered block (zeros
 * before the first): the parent a disk entry of that block names. */
static const uint8_t *parent_key(const tl_kv_seq *s, int i) {
    static const uint8_t none[TL_KVKEY];
    return i > 1 ? s->keys[i - 2] : none;
}

/* The recurrent state at the end of seq's i-th registered block: from the
 * RAM store, or from disk (then kept in RAM too); NULL when neither has it. */
static const void *snapshot_at(tl_ctx *c, const tl_kv_seq *s, int i) {
    const void *snap = tl_rsnap_get(c->snaps, s->chains[i - 1]);
    if (snap || !c->sdisk) return snap;
    if (tl_kvdisk_get(c->sdisk, s->keys[i - 1], parent_key(s, i), s->tok + (size_t)(i - 1) * TL_KV_BLOCK, c->sstage))
        return NULL;
    void *p = tl_rsnap_put(c->snaps, s->chains[i - 1]);
    if (p) memcpy(p, c->sstage, c->be.rs_bytes);
    return p ? p : c->sstage;
}

/* Cuts seq back to the latest boundary at or before pos whose state is
 * held (in RAM or on disk for its registered blocks; for the implicit
 * sequence, which registers none, the end of its last prompt) and puts its
 * state there, or at the start when none is; returns that boundary. */
static int resume_at_snapshot(tl_ctx *c, int seq, int pos) {
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    const void *snap = NULL;
    int b = 0;
    for (int i = s->n_reg < pos / TL_KV_BLOCK ? s->n_reg : pos / TL_KV_BLOCK; i > 0 && !snap; i--)
        if ((snap = snapshot_at(c, s, i))) b = i * TL_KV_BLOCK;
    if (!snap && seq == 0 && c->snap0_pos > 0 && c->snap0_pos <= pos) snap = c->snap0, b = c->snap0_pos;
    int32_t from, to;
    if (b < s->len) tl_kv_seq_truncate(c->kv, seq, b, &from, &to); /* a boundary: never a copy */
    if (snap) c->be.ops->rs_load(c->be.state, seq, b, snap);
    else c->be.ops->rs_seek(c->be.state, seq, 0);
    return b;
}

int tl_seq_rs_reach(tl_ctx *c, int seq, int len, tl_error *err) {
    if (!c->be.ops->rs_seek || c->be.ops->rs_seek(c->be.state, seq, len) == 0) return TL_OK;
    tl_kv_seq *s = tl_kv_seq_get(c->kv, seq);
    if (!s || len > s->len) return tl_fail(err, TL_ERR_ARG, "sequence %d cannot reach position %d", seq, len);
    return replay(c, seq, resume_at_snapshot(c, seq, len), len, err);
}

/* Takes the snapshot at seq's last registered boundary; to_disk: on disk
 * too. Returns its chain if it was made now (0: not held, already kept, or
 * out of memory). */
static uint64_t snapshot_take(tl_ctx *c, int seq, int to_disk) {
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    if (!c->snaps || !s || !s->cache || s->n_reg == 0) return 0;
    const uint64_t chain = s->chains[s->n_reg - 1];
    const int i = s->n_reg;
    const void *have = tl_rsnap_get(c->snaps, chain);
    if (have) {
        /* another sequence's chunk made it (the same prefix): kept now, so
         * that sequence's next chunk must not replace it */
        for (int q = 0; to_disk && q < c->n_seq; q++)
            if (c->sfloat[q] == chain) c->sfloat[q] = 0;
        if (to_disk && c->sdisk)
            tl_kvdisk_put(c->sdisk, s->keys[i - 1], parent_key(s, i), s->tok + (size_t)(i - 1) * TL_KV_BLOCK, have);
        return 0;
    }
    void *p = tl_rsnap_put(c->snaps, chain);
    if (p && c->be.ops->rs_save(c->be.state, seq, s->n_reg * TL_KV_BLOCK, p)) {
        tl_rsnap_drop(c->snaps, chain);
        return 0;
    }
    if (p && to_disk && c->sdisk) { /* keyed by the content key of the block it ends */
        tl_kvdisk_put(c->sdisk, s->keys[i - 1], parent_key(s, i), s->tok + (size_t)(i - 1) * TL_KV_BLOCK, p);
    }
    return p ? chain : 0;
}

/* Where a later prompt can resume: the end of each prompt (its chunks
 * commit many positions at once), the boundaries a sequence was asked to
 * keep, and the end of each conversation (tl_seq_close). Decoded tokens, one
 * per commit, would fill the store with states no prompt asks for; a long
 * prompt's chunks would too, so each replaces the one before. */
void tl_seq_snapshot_after(tl_ctx *c, int seq, int n, int reg) {
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    if (!c->snaps || !s || s->n_reg <= reg || seq <= 0 || c->embd_mode) return; /* an embedding is not resumed */
    const int b = s->n_reg * TL_KV_BLOCK;
    if (c->spin[seq][0] == b || c->spin[seq][1] == b) {
        snapshot_take(c, seq, 1);
        return;
    }
    if (n < 2) return;
    const uint64_t made = snapshot_take(c, seq, 0);
    if (!made) return;
    if (c->sfloat[seq]) tl_rsnap_drop(c->snaps, c->sfloat[seq]);
    c->sfloat[seq] = made;
}

void tl_seq_snapshot(tl_ctx *c, int seq) { snapshot_take(c, seq, 1); }

int tl_seq_keep_state_at(tl_ctx *c, int seq, int pos) {
    const tl_kv_seq *s = c && c->snaps && seq > 0 && seq < c->n_seq ? tl_kv_seq_peek(c->kv, seq) : NULL;
    if (!s) return 0;
    const int b = pos / TL_KV_BLOCK * TL_KV_BLOCK;
    if (b <= 0) return 0;
    /* already there (a cached prefix reached it, maybe another sequence's
     * chunk snapshot): kept from now on, not replaced by that one's next */
    if (b / TL_KV_BLOCK <= s->n_reg && tl_rsnap_get(c->snaps, s->chains[b / TL_KV_BLOCK - 1]))
        for (int q = 0; q < c->n_seq; q++)
            if (c->sfloat[q] == s->chains[b / TL_KV_BLOCK - 1]) c->sfloat[q] = 0;
    int *pin = c->spin[seq];
    if (pin[0] != b && pin[1] != b) {
        if (pin[0] && pin[1]) pin[0] = pin[1], pin[1] = 0; /* the older one gives way */
        pin[pin[0] ? 1 : 0] = b;
    }
    return b;
}

int tl_seq_commit(tl_ctx *c, int seq, int n, tl_error *err) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    if (!sq) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (n < 0 || n > sq->pend)
        return tl_fail(err, TL_ERR_ARG, "cannot commit %d positions of sequence %d (%d pending)", n, seq,
                       sq->pend);
    const int reg = sq->n_reg;
    tl_kv_seq_commit(c->kv, seq, sq->len + n);
    if (c->disk) tl_seq_offer_disk(c);
    const int st = tl_seq_rs_reach(c, seq, sq->len, err); /* the rejected guesses leave the state too */
    if (!st) tl_seq_snapshot_after(c, seq, n, reg);
    return st;
}

const int32_t *tl_seq_tokens(const tl_ctx *c, int seq, int *n) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    *n = sq ? sq->len : 0;
    return sq ? sq->tok : NULL;
}

int tl_seq_open(tl_ctx *c, int *seq, tl_error *err) {
    int id = tl_kv_seq_open(c->kv, 1);
    if (id < 0)
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "all %d sequences are open", c->n_seq - 1);
    *seq = id;
    if (c->be.ops->rs_seek) c->be.ops->rs_seek(c->be.state, id, 0);
    if (c->snaps) {
        c->sfloat[id] = 0;
        c->spin[id][0] = c->spin[id][1] = 0;
    }
    return TL_OK;
}

int tl_seq_reuse_prefix(tl_ctx *c, int seq, const int32_t *tokens, size_t n, size_t max_reuse) {
    if (seq <= 0) return 0;
    int got = tl_kv_seq_reuse(c->kv, seq, tokens, n, max_reuse);
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    if (c->disk && got % TL_KV_BLOCK == 0) {
        /* the RAM match ended: the next blocks from disk, while they are there */
        size_t lim = max_reuse < n ? max_reuse : n;
        if (lim > (size_t)c->n_ctx) lim = (size_t)c->n_ctx;
        for (size_t at = (size_t)got; at + TL_KV_BLOCK <= lim; at += TL_KV_BLOCK) {
            uint8_t key[TL_KVKEY];
            tl_kvdisk_key_next(s->key, tokens + at, key);
            if (tl_kvdisk_get(c->disk, key, s->key, tokens + at, c->stage)) break;
            const int32_t b = tl_kv_seq_adopt(c->kv, seq, tokens + at, key);
            if (b < 0) break;
            c->be.ops->write_block(c->be.state, b, c->stage);
            got += TL_KV_BLOCK;
        }
    }
    /* recurrent layers: only as far as a snapshot of the state reaches */
    return c->snaps ? resume_at_snapshot(c, seq, got) : got;
}

void tl_seq_offer_disk(tl_ctx *c) {
    int32_t b[64];
    for (int n; (n = tl_kv_take_fresh(c->kv, b, 64)) > 0;)
        for (int i = 0; i < n; i++) {
            const uint8_t *key, *parent;
            const int32_t *tok;
            tl_kv_block_key(c->kv, b[i], &key, &parent, &tok);
            c->be.ops->read_block(c->be.state, b[i], c->stage);
            tl_kvdisk_put(c->disk, key, parent, tok, c->stage);
        }
}

/* What a block's bytes depend on besides its tokens: the model (its file's
 * size, first MiB and 64 pages spread over it: another file differs there
 * in practice), the numerics mode, the cache's types and layout (blocks 2:
 * the transposed quantized K in 4-byte runs). */
static void disk_identity(tl_ctx *c, uint8_t out[TL_KVKEY]) {
    if (c->has_ident) { /* the file samples are read once per context */
        memcpy(out, c->ident, TL_KVKEY);
        return;
    }
    struct sha256_ctx s;
    uint8_t d[SHA256_DIGEST_SIZE];
    char head[256];
    const tl_gguf *g = c->m->gguf;
    /* Phi-3's LongRoPE rotates keys by its long or its short factors as the
     * context exceeds the original one or not: keys of one are not keys of
     * the other */
    const tl_w fw = tl_model_rope_factors(c->m, c->n_ctx);
    const char *rope = !fw ? "-" : fw == c->m->rope_long ? "long" : "short";
    const int n = snprintf(head, sizeof head, "tokenloop kv blocks 2|%s|k %s|v %s|block %zu|layers %d|file %llu|rope %s",
                           c->be.numerics, tl_kv_type_name(c->be.kv_type_k), tl_kv_type_name(c->be.kv_type_v),
                           c->be.block_bytes, c->m->hp.n_layer, (unsigned long long)(g ? g->file_size : 0), rope);
    sha256_init(&s);
    sha256_update(&s, (size_t)n, (const uint8_t *)head);
    if (g && g->base && g->file_size) {
        const uint64_t first = g->file_size < (1u << 20) ? g->file_size : (1u << 20), pg = 4096;
        sha256_update(&s, first, g->base);
        for (int i = 0; g->file_size > pg && i < 64; i++)
            sha256_update(&s, pg, g->base + (g->file_size - pg) / 63 * (uint64_t)i);
    }
    sha256_digest(&s, sizeof d, d);
    memcpy(c->ident, d, TL_KVKEY);
    c->has_ident = 1;
    memcpy(out, d, TL_KVKEY);
}

int tl_ctx_disk_cache(tl_ctx *c, const char *dir, uint64_t budget_bytes, tl_log_fn log, void *log_arg,
                      tl_error *err) {
    if (!c) return tl_fail(err, TL_ERR_ARG, "no context");
    if (c->disk) return tl_fail(err, TL_ERR_ARG, "the context has a disk cache already");
    for (int id = 1; id < c->n_seq; id++)
        if (tl_kv_seq_peek(c->kv, id)) return tl_fail(err, TL_ERR_ARG, "a disk cache is set before any sequence opens");
    if (!(c->stage = malloc(c->be.block_bytes)) || tl_kv_key_on(c->kv)) {
        free(c->stage);
        c->stage = NULL;
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    uint8_t id[TL_KVKEY];
    disk_identity(c, id);
    int st = tl_kvdisk_open(dir, id, c->be.block_bytes, budget_bytes, log, log_arg, &c->disk, err);
    if (!st && c->snaps) {
        /* recurrent layers: their states at cached boundaries in dir/states,
         * under an identity of their own (a state file is never a block) */
        char sdir[4096];
        struct sha256_ctx h;
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_init(&h);
        sha256_update(&h, TL_KVKEY, id);
        sha256_update(&h, 16, (const uint8_t *)"recurrent states");
        sha256_digest(&h, sizeof d, d);
        if (snprintf(sdir, sizeof sdir, "%s/states", dir) >= (int)sizeof sdir)
            st = tl_fail(err, TL_ERR_ARG, "cache directory path too long");
        else if (!(c->sstage = malloc(c->be.rs_bytes)))
            st = tl_fail(err, TL_ERR_NOMEM, "out of memory");
        else
            st = tl_kvdisk_open(sdir, d, c->be.rs_bytes, budget_bytes, log, log_arg, &c->sdisk, err);
        if (st) {
            tl_kvdisk_close(c->disk);
            c->disk = NULL;
        }
    }
    if (st) {
        free(c->stage);
        c->stage = NULL;
        free(c->sstage);
        c->sstage = NULL;
    }
    return st;
}

/* ---- a sequence to a file and back ---------------------------------------- */

#define SEQ_MAGIC "TLKVSEQ1"

typedef struct {
    char magic[8];
    uint8_t ident[TL_KVKEY];
    uint64_t block_bytes, n_tok, sum;
} seq_head;

/* Running checksum over what follows the header (FNV-1a on 64-bit words). */
static uint64_t sum_add(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

int tl_ctx_save(tl_ctx *c, int seq, const char *path, tl_error *err) {
    const tl_kv_seq *s = c ? tl_kv_seq_peek(c->kv, seq) : NULL;
    if (!s) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (!c->stage && !(c->stage = malloc(c->be.block_bytes))) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    /* recurrent layers: their state at the last block boundary follows the
     * blocks (the positions after it are computed again on load) */
    void *rs = NULL;
    if (c->snaps) {
        int st = tl_seq_rs_reach(c, seq, s->len, err);
        if (st) return st;
        if (!(rs = malloc(c->be.rs_bytes))) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
        if (c->be.ops->rs_save(c->be.state, seq, s->len / TL_KV_BLOCK * TL_KV_BLOCK, rs)) {
            free(rs);
            return tl_fail(err, TL_ERR_ARG, "sequence %d: its recurrent state is not held", seq);
        }
    }
    seq_head h = {.block_bytes = c->be.block_bytes, .n_tok = (uint64_t)s->len};
    memcpy(h.magic, SEQ_MAGIC, 8);
    disk_identity(c, h.ident);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(rs);
        return tl_fail(err, TL_ERR_ARG, "path too long");
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        const int e = errno;
        free(rs);
        return tl_fail(err, TL_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
    }
    int ok = fwrite(&h, sizeof h, 1, f) == 1;
    uint64_t sum = sum_add(0xCBF29CE484222325ull, s->tok, (size_t)s->len * sizeof *s->tok);
    ok = ok && fwrite(s->tok, sizeof *s->tok, (size_t)s->len, f) == (size_t)s->len;
    for (int b = 0; ok && b < (s->len + TL_KV_BLOCK - 1) / TL_KV_BLOCK; b++) {
        c->be.ops->read_block(c->be.state, s->blk[b], c->stage);
        sum = sum_add(sum, c->stage, c->be.block_bytes);
        ok = fwrite(c->stage, 1, c->be.block_bytes, f) == c->be.block_bytes;
    }
    if (rs) {
        sum = sum_add(sum, rs, c->be.rs_bytes);
        ok = ok && fwrite(rs, 1, c->be.rs_bytes, f) == c->be.rs_bytes;
        free(rs);
    }
    h.sum = sum; /* the header again, with the checksum */
    ok = ok && !fseek(f, 0, SEEK_SET) && fwrite(&h, sizeof h, 1, f) == 1;
    ok = !fclose(f) && ok;
    if (!ok || rename(tmp, path)) {
        const int e = errno;
        unlink(tmp);
        return tl_fail(err, TL_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return TL_OK;
}

int tl_ctx_load(tl_ctx *c, int seq, const char *path, int *n_restored, tl_error *err) {
    if (n_restored) *n_restored = 0;
    tl_kv_seq *s = c ? tl_kv_seq_get(c->kv, seq) : NULL;
    if (!s) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (seq == 0) {
        tl_kv_seq_close(c->kv, 0);
        c->snap0_pos = 0;
    }
    if (s->len || s->n_blk) return tl_fail(err, TL_ERR_ARG, "sequence %d is not empty", seq);
    if (!c->stage && !(c->stage = malloc(c->be.block_bytes))) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    void *rs = c->snaps ? malloc(c->be.rs_bytes) : NULL;
    if (c->snaps && !rs) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    FILE *f = fopen(path, "rb");
    if (!f) {
        free(rs);
        return tl_fail(err, TL_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    seq_head h;
    uint8_t id[TL_KVKEY];
    disk_identity(c, id);
    int st = TL_OK;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, SEQ_MAGIC, 8))
        st = tl_fail(err, TL_ERR_FORMAT, "%s is not a saved sequence", path);
    else if (memcmp(h.ident, id, TL_KVKEY) || h.block_bytes != c->be.block_bytes)
        st = tl_fail(err, TL_ERR_FORMAT, "%s was computed by another model, numerics mode or KV type (or LongRoPE "
                     "factors, or sliding-window layers kept otherwise: --swa-full, or a -c/-b that gives no ring)", path);
    else if (h.n_tok > (uint64_t)c->n_ctx)
        st = tl_fail(err, TL_ERR_CONTEXT_FULL, "%s holds %llu positions; the context has %d", path,
                     (unsigned long long)h.n_tok, c->n_ctx);
    const int n = st ? 0 : (int)h.n_tok;
    if (!st && fread(s->tok, sizeof *s->tok, (size_t)n, f) != (size_t)n)
        st = tl_fail(err, TL_ERR_FORMAT, "%s is short", path);
    if (!st && tl_kv_seq_grow(c->kv, seq, n))
        st = tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no room for the %d positions of %s", n, path);
    uint64_t sum = sum_add(0xCBF29CE484222325ull, s->tok, (size_t)n * sizeof *s->tok);
    for (int b = 0; !st && b < (n + TL_KV_BLOCK - 1) / TL_KV_BLOCK; b++) {
        if (fread(c->stage, 1, c->be.block_bytes, f) != c->be.block_bytes) {
            st = tl_fail(err, TL_ERR_FORMAT, "%s is short", path);
            break;
        }
        sum = sum_add(sum, c->stage, c->be.block_bytes);
        c->be.ops->write_block(c->be.state, s->blk[b], c->stage);
    }
    if (!st && rs) {
        if (fread(rs, 1, c->be.rs_bytes, f) != c->be.rs_bytes) st = tl_fail(err, TL_ERR_FORMAT, "%s is short", path);
        else sum = sum_add(sum, rs, c->be.rs_bytes);
    }
    fclose(f);
    if (!st && sum != h.sum) st = tl_fail(err, TL_ERR_FORMAT, "%s fails its checksum (damaged)", path);
    int32_t a, b;
    if (st) {
        tl_kv_seq_truncate(c->kv, seq, 0, &a, &b); /* its blocks back to the pool */
        free(rs);
        return st;
    }
    tl_kv_seq_commit(c->kv, seq, n);
    if (rs) { /* the state at the last boundary, then the positions after it */
        const int bnd = n / TL_KV_BLOCK * TL_KV_BLOCK;
        tl_kv_seq_truncate(c->kv, seq, bnd, &a, &b);
        c->be.ops->rs_load(c->be.state, seq, bnd, rs);
        free(rs);
        if ((st = replay(c, seq, bnd, n, err))) {
            tl_kv_seq_truncate(c->kv, seq, 0, &a, &b);
            return st;
        }
    }
    if (c->disk) tl_seq_offer_disk(c);
    if (n_restored) *n_restored = n;
    return TL_OK;
}

void tl_ctx_disk_stats(const tl_ctx *c, tl_disk_stats *out) {
    memset(out, 0, sizeof *out);
    if (c && c->disk) tl_kvdisk_stats(c->disk, out);
}

void tl_ctx_disk_flush(tl_ctx *c) {
    if (c && c->disk) tl_kvdisk_flush(c->disk);
}

int tl_seq_len(const tl_ctx *c, int seq) {
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    return s ? s->len : -1;
}

void tl_seq_close(tl_ctx *c, int seq) {
    if (seq <= 0) return;
    /* a conversation's next turn extends this one: keep its last boundary's state */
    const tl_kv_seq *s = tl_kv_seq_peek(c->kv, seq);
    if (c->snaps && s && c->be.ops->rs_seek(c->be.state, seq, s->len) == 0) tl_seq_snapshot(c, seq);
    if (c->snaps && s) { /* its last chunk's snapshot stays, as any other now */
        c->sfloat[seq] = 0;
        c->spin[seq][0] = c->spin[seq][1] = 0;
    }
    tl_kv_seq_close(c->kv, seq);
}

void tl_ctx_kv_stats(const tl_ctx *c, tl_kv_stats *out) {
    tl_kv_get_stats(c->kv, out);
    out->block_bytes = c->be.block_bytes;
    out->kv_type_k = c->be.kv_type_k;
    out->kv_type_v = c->be.kv_type_v;
    out->state_bytes = c->be.rs_seq_bytes;
    out->state_read_bytes = c->be.rs_read_bytes;
    out->n_snapshots = tl_rsnap_count(c->snaps, &out->snapshot_bytes);
    out->window_bytes = c->be.window_bytes;
    out->window_pos_bytes = tl_model_kv_window_bytes(c->m, c->be.kv_type_k, c->be.kv_type_v, &out->n_swa);
    if (!c->be.window_bytes) out->window_pos_bytes = 0, out->n_swa = 0; /* in the pool (block_bytes) */
}

