/* trace/: the loop's trace, one record per forward call: built here
 * (trace.c, this file) and written as JSON lines (trace_json.c,
 * docs/TRACE.md). The CLI's --trace and --show-loop and the server's live
 * page read it.
 *
 * trace: the per-forward-call records of the loop (tl_tracer, docs/TRACE.md).
 * Owns the record being built between a call's start and its emission: the
 * sequences in the call, the tokens they emitted (their text and
 * alternatives copied, since the events' buffers do not outlive the
 * callback) and the running totals. Buffers grow to the largest call seen
 * and are reused, so a steady loop allocates nothing. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forward/forward.h"
#include "tokenloop.h"
#include "base/util.h"

typedef struct tok_rec {
    tl_trace_token t;
    int seq_ix;        /* index into seqs */
    size_t text_off;   /* into text */
    size_t top_off;    /* into tops */
} tok_rec;

struct tl_tracer {
    const tl_ctx *ctx;
    tl_trace_fn fn;
    void *user;
    double t0, t_call, t_called, t_first;
    uint64_t step;
    uint64_t weight_bytes;
    size_t pos_bytes;
    size_t win_bytes;   /* a position of the sliding-window layers in rings (tl_kv_stats.window_pos_bytes) */
    int n_swa;          /* what those read at most */
    size_t state_bytes; /* a sequence's recurrent state read per step (tl_kv_stats.state_read_bytes) */
    int n_rows;
    tl_trace_seq *seqs;
    int *pos0; /* each sequence's positions before the call */
    int n_seqs, cap_seqs;
    tok_rec *toks;
    tl_trace_token *grouped;
    int n_toks, cap_toks;
    tl_token_prob *tops;
    size_t n_tops, cap_tops;
    char *text;
    size_t n_text, cap_text;
    int oom; /* a grow failed: this record drops what did not fit */
    uint64_t tokens_in, tokens_cached, tokens_out, out_at_first;
};

/* Grows *p (elements of size sz) to hold need; 0 or -1. */
static int grow(void **p, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * sz);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

int tl_tracer_new(const tl_ctx *ctx, tl_trace_fn fn, void *user, tl_tracer **out, tl_error *err) {
    *out = NULL;
    if (!ctx || !fn) return tl_fail(err, TL_ERR_ARG, "tl_tracer_new: no context or callback");
    tl_tracer *t = calloc(1, sizeof *t);
    if (!t) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    t->ctx = ctx;
    t->fn = fn;
    t->user = user;
    t->t0 = tl_now();
    t->t_first = -1;
    t->weight_bytes = tl_model_decode_bytes(tl_ctx_model(ctx));
    tl_kv_stats kv;
    tl_ctx_kv_stats(ctx, &kv);
    t->pos_bytes = kv.block_bytes / TL_KV_BLOCK;
    t->win_bytes = kv.window_pos_bytes;
    t->n_swa = kv.n_swa;
    t->state_bytes = kv.state_read_bytes;
    *out = t;
    return TL_OK;
}

void tl_tracer_free(tl_tracer *t) {
    if (!t) return;
    free(t->seqs);
    free(t->pos0);
    free(t->toks);
    free(t->grouped);
    free(t->tops);
    free(t->text);
    free(t);
}

void tl_tracer_call(tl_tracer *t) {
    t->n_seqs = 0;
    t->n_toks = 0;
    t->n_tops = 0;
    t->n_text = 0;
    t->n_rows = 0;
    t->oom = 0;
    t->t_call = t->t_called = tl_now();
}

int tl_tracer_seq(tl_tracer *t, int seq, int id, int phase, int n_fed, int n_cached, int n_drafted) {
    size_t cap = (size_t)t->cap_seqs, cap2 = (size_t)t->cap_seqs;
    if (grow((void **)&t->seqs, &cap, (size_t)t->n_seqs + 1, sizeof *t->seqs) ||
        grow((void **)&t->pos0, &cap2, (size_t)t->n_seqs + 1, sizeof *t->pos0)) {
        t->oom = 1;
        return TL_ERR_NOMEM;
    }
    t->cap_seqs = (int)(cap < cap2 ? cap : cap2);
    tl_trace_seq *s = &t->seqs[t->n_seqs];
    memset(s, 0, sizeof *s);
    s->seq = seq;
    s->id = id;
    s->phase = phase;
    s->n_fed = n_fed;
    s->n_cached = n_cached;
    s->n_drafted = n_drafted;
    if (phase != TL_PHASE_PREFILL && n_fed - 1 - n_drafted > 0) s->n_forced = n_fed - 1 - n_drafted;
    const int len = tl_seq_len(t->ctx, seq);
    t->pos0[t->n_seqs++] = len > 0 ? len : 0;
    if (phase == TL_PHASE_PREFILL) t->tokens_in += (uint64_t)n_fed;
    t->tokens_cached += (uint64_t)(n_cached > 0 ? n_cached : 0);
    return TL_OK;
}

void tl_tracer_called(tl_tracer *t, int n_rows) {
    t->t_called = tl_now();
    t->n_rows = n_rows;
}

int tl_tracer_token(tl_tracer *t, int seq, const tl_gen_event *ev) {
    int ix = -1;
    for (int i = t->n_seqs - 1; i >= 0; i--)
        if (t->seqs[i].seq == seq) {
            ix = i;
            break;
        }
    if (ix < 0) return TL_OK;
    size_t ct = (size_t)t->cap_toks, cg = (size_t)t->cap_toks;
    const size_t need_top = t->n_tops + (size_t)(ev->top ? ev->n_top : 0);
    if (grow((void **)&t->toks, &ct, (size_t)t->n_toks + 1, sizeof *t->toks) ||
        grow((void **)&t->grouped, &cg, (size_t)t->n_toks + 1, sizeof *t->grouped) ||
        grow((void **)&t->tops, &t->cap_tops, need_top, sizeof *t->tops) ||
        grow((void **)&t->text, &t->cap_text, t->n_text + ev->text_len + 1, 1)) {
        t->oom = 1;
        return TL_ERR_NOMEM;
    }
    t->cap_toks = (int)(ct < cg ? ct : cg);
    tok_rec *r = &t->toks[t->n_toks++];
    memset(r, 0, sizeof *r);
    r->seq_ix = ix;
    r->t.token = ev->token;
    r->t.chosen = ev->chosen;
    r->t.n_top = ev->top ? ev->n_top : 0;
    r->t.source = ev->source;
    r->t.reasoning = ev->reasoning;
    r->t.text_len = ev->text_len;
    r->text_off = t->n_text;
    r->top_off = t->n_tops;
    if (ev->text_len) memcpy(t->text + t->n_text, ev->text, ev->text_len);
    t->n_text += ev->text_len;
    t->text[t->n_text] = 0;
    if (r->t.n_top) memcpy(t->tops + t->n_tops, ev->top, (size_t)r->t.n_top * sizeof *t->tops);
    t->n_tops = need_top;
    if (ev->token >= 0) {
        if (t->t_first < 0) {
            t->t_first = tl_now() - t->t0;
            t->out_at_first = t->tokens_out;
        }
        t->tokens_out++;
        tl_trace_seq *s = &t->seqs[ix];
        if (s->phase == TL_PHASE_VERIFY && ev->source == TL_SOURCE_DRAFT) s->n_accepted++;
    }
    return TL_OK;
}

void tl_tracer_emit(tl_tracer *t) {
    const double now = tl_now();
    tl_trace_step st = {0};
    st.version = TL_TRACE_VERSION;
    st.step = t->step++;
    st.t_s = t->t_call - t->t0;
    st.wall_s = t->t_called - t->t_call;
    st.emit_s = now - t->t_called;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    st.unix_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    st.n_rows = t->n_rows;
    st.weight_bytes = t->n_rows > 0 ? t->weight_bytes : 0;
    /* tokens grouped by sequence, in the order they came; pointers fixed now
     * that the buffers no longer move */
    int k = 0;
    for (int i = 0; i < t->n_seqs; i++) {
        tl_trace_seq *s = &t->seqs[i];
        s->tokens = t->grouped + k;
        s->n_tokens = 0;
        for (int j = 0; j < t->n_toks; j++) {
            const tok_rec *r = &t->toks[j];
            if (r->seq_ix != i) continue;
            tl_trace_token *o = &t->grouped[k++];
            *o = r->t;
            o->text = t->text + r->text_off;
            o->top = o->n_top ? t->tops + r->top_off : NULL;
            s->n_tokens++;
        }
        const int len = tl_seq_len(t->ctx, s->seq);
        s->pos = len >= 0 ? len : t->pos0[i] + s->n_fed;
        const int seen = t->pos0[i] + s->n_fed;
        st.kv_bytes += (uint64_t)seen * t->pos_bytes + (uint64_t)(seen < t->n_swa ? seen : t->n_swa) * t->win_bytes;
        st.state_bytes += t->state_bytes;
    }
    st.seqs = t->seqs;
    st.n_seqs = t->n_seqs;
    st.gbps = st.wall_s > 0 ? (double)(st.weight_bytes + st.kv_bytes + st.state_bytes) / st.wall_s / 1e9 : 0;
    tl_kv_stats kv;
    tl_ctx_kv_stats(t->ctx, &kv);
    st.kv_used = kv.n_used;
    st.kv_cached = kv.n_cached;
    st.kv_blocks = kv.n_blocks;
    st.tokens_in = t->tokens_in;
    st.tokens_cached = t->tokens_cached;
    st.tokens_out = t->tokens_out;
    st.ttft_s = t->t_first;
    /* decode speed: the tokens after the first over the time since it */
    const double since = now - t->t0 - t->t_first;
    const uint64_t after = t->tokens_out - t->out_at_first - (t->t_first >= 0 ? 1 : 0);
    st.tok_s = t->t_first >= 0 && since > 0 && t->tokens_out > t->out_at_first + 1 ? (double)after / since : 0;
    t->fn(&st, t->user);
}
