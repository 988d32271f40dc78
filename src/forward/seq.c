/* seq: the sequence API over a context's KV cache (kv.h): open, reuse a
 * cached prefix, truncate (copying the kept part of a shared block through
 * the backend), commit pending positions, close. */
#include "base/util.h"
#include "forward/ctx.h"

int tl_ctx_truncate(tl_ctx *c, int n_past, tl_error *err) { return tl_seq_truncate(c, 0, n_past, err); }

int tl_seq_truncate(tl_ctx *c, int seq, int len, tl_error *err) {
    const tl_kv_seq *sq = tl_kv_seq_peek(c->kv, seq);
    if (!sq) return tl_fail(err, TL_ERR_ARG, "sequence %d is not open", seq);
    if (len < 0 || len > sq->len)
        return tl_fail(err, TL_ERR_ARG, "cannot truncate sequence %d to %d (it holds %d)", seq, len, sq->len);
    int32_t from, to;
    if (tl_kv_seq_truncate(c->kv, seq, len, &from, &to))
        return tl_fail(err, TL_ERR_CONTEXT_FULL, "the KV cache has no free block to copy a shared one into");
    if (from >= 0) /* the kept part of a shared block: every layer's K and V */
        c->be.ops->copy_block(c->be.state, from, to);
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
    out->block_bytes = c->be.block_bytes;
    out->kv_type_k = c->be.kv_type_k;
    out->kv_type_v = c->be.kv_type_v;
}

