/* generate: the loop for one sequence. tl_gen owns the output side (the
 * streaming detokenizer, the stop-string hold-back buffer, the token count and
 * the stop rules); tl_generate drives the model with it: prefill the prompt in
 * one batched eval, then sample, stream, append and repeat. */
#include <stdlib.h>
#include <string.h>

#include "forward/forward.h"
#include "tokenloop.h"
#include "base/util.h"

/* Longest token piece passed on whole; longer ones are truncated (none of the
 * supported vocabularies comes near). +16 leaves room for held UTF-8 bytes. */
#define PIECE_CAP 1024
#define PIECE_ROOM (PIECE_CAP + 16)

struct tl_gen {
    const tl_model *model;
    int n_predict, ignore_eog;
    char **stop; /* private copies: the caller's strings need not outlive tl_gen_new */
    size_t *stop_len;
    int n_stop;
    tl_detok dt;
    /* Text decoded but not yet final (it could start a stop string). Sized at
     * creation so that push never allocates: what stays held is shorter than
     * the longest stop string, and one push adds at most PIECE_ROOM bytes. */
    char *buf;
    size_t len, cap;
    size_t consumed; /* bytes of buf handed out by the last call, dropped by the next */
    int count;
    int stop_reason;
    int stop_index;     /* the stop string that ended it (TL_STOP_STRING), else -1 */
};

void tl_gen_free(tl_gen *g) {
    if (!g) return;
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->stop_len);
    free(g->buf);
    free(g);
}

static int copy_stops(tl_gen *g, const tl_gen_params *gp, size_t *max_len) {
    *max_len = 0;
    if (gp->n_stop <= 0) return 0;
    g->stop = calloc((size_t)gp->n_stop, sizeof *g->stop);
    g->stop_len = calloc((size_t)gp->n_stop, sizeof *g->stop_len);
    if (!g->stop || !g->stop_len) return -1;
    for (int i = 0; i < gp->n_stop; i++) {
        const char *s = gp->stop[i] ? gp->stop[i] : "";
        size_t n = strlen(s);
        if (!(g->stop[i] = malloc(n + 1))) return -1;
        g->n_stop = i + 1;
        memcpy(g->stop[i], s, n + 1);
        g->stop_len[i] = n;
        if (n > *max_len) *max_len = n;
    }
    return 0;
}

int tl_gen_new(const tl_model *model, const tl_gen_params *gp, tl_gen **out, tl_error *err) {
    *out = NULL;
    if (!model || !gp) return tl_fail(err, TL_ERR_ARG, "tl_gen_new: missing model or params");
    if (gp->n_stop > 0 && !gp->stop) return tl_fail(err, TL_ERR_ARG, "tl_gen_new: n_stop without stop");
    tl_gen *g = calloc(1, sizeof *g);
    if (!g) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    g->model = model;
    g->n_predict = gp->n_predict;
    g->ignore_eog = gp->ignore_eog;
    size_t max_stop = 0;
    if (copy_stops(g, gp, &max_stop) == 0) {
        g->cap = max_stop + PIECE_ROOM + 16;
        g->buf = malloc(g->cap);
    }
    if (!g->buf) {
        tl_gen_free(g);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    g->buf[0] = 0;
    tl_detok_init(&g->dt, gp->special_text);
    *out = g;
    return 0;
}

int tl_gen_count(const tl_gen *g) { return g ? g->count : 0; }

/* Drops what the previous call handed out (its text was valid until now). */
static void drop_consumed(tl_gen *g) {
    memmove(g->buf, g->buf + g->consumed, g->len - g->consumed);
    g->len -= g->consumed;
    g->consumed = 0;
}

/* Length of the longest suffix of buf that is a proper prefix of a stop string. */
static size_t held_suffix(const tl_gen *g) {
    size_t best = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t sl = g->stop_len[i];
        for (size_t k = sl ? sl - 1 : 0; k > best; k--)
            if (k <= g->len && memcmp(g->buf + g->len - k, g->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Offset of the earliest stop string in buf, or -1; *which: its index. */
static long find_stop(const tl_gen *g, int *which) {
    long best = -1;
    for (int i = 0; i < g->n_stop; i++) {
        size_t sl = g->stop_len[i];
        if (!sl || sl > g->len) continue;
        for (size_t at = 0; at + sl <= g->len; at++)
            if (memcmp(g->buf + at, g->stop[i], sl) == 0) {
                if (best < 0 || (long)at < best) best = (long)at, *which = i;
                break;
            }
    }
    return best;
}

int tl_gen_push(tl_gen *g, int32_t token, const tl_token_prob *chosen, const tl_token_prob *top,
                int n_top, tl_gen_event *ev) {
    memset(ev, 0, sizeof *ev);
    ev->token = token;
    if (chosen) ev->chosen = *chosen;
    ev->top = top;
    ev->n_top = top ? n_top : 0;
    ev->text = "";
    drop_consumed(g);
    if (g->stop_reason) return g->stop_reason; /* already stopped: nothing more comes out */
    g->count++;
    if (!g->ignore_eog && tl_token_is_eog(g->model, token)) {
        g->stop_reason = TL_STOP_EOG; /* the token is reported, its text is not */
        return g->stop_reason;
    }
    g->len += tl_detok_push(&g->dt, g->model, token, g->buf + g->len, PIECE_ROOM);
    int which = -1;
    long at = find_stop(g, &which);
    if (at >= 0) {
        g->stop_index = which;
        ev->text = g->buf;
        ev->text_len = (size_t)at;
        g->consumed = g->len; /* the stop string and whatever follows it are dropped */
        g->stop_reason = TL_STOP_STRING;
        return g->stop_reason;
    }
    ev->text = g->buf;
    ev->text_len = g->len - held_suffix(g);
    g->consumed = ev->text_len;
    if (g->n_predict >= 0 && g->count >= g->n_predict) g->stop_reason = TL_STOP_LENGTH;
    return g->stop_reason;
}

int tl_gen_stop_index(const tl_gen *g) { return g->stop_reason == TL_STOP_STRING ? g->stop_index : -1; }

size_t tl_gen_flush(tl_gen *g, const char **text) {
    drop_consumed(g);
    *text = "";
    if (g->stop_reason == TL_STOP_STRING) return 0;
    g->len += tl_detok_flush(&g->dt, g->buf + g->len, g->cap - g->len);
    *text = g->buf;
    g->consumed = g->len;
    return g->len;
}

int tl_spec_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "off")) return TL_SPEC_OFF;
    if (!strcmp(name, "auto")) return TL_SPEC_AUTO;
    if (!strcmp(name, "ngram")) return TL_SPEC_NGRAM;
    if (!strcmp(name, "draft")) return TL_SPEC_DRAFT;
    return -1;
}

/* ---- the whole loop on sequence 0, for the CLI and the tests -------------------- */

/* With a trace: each token goes to the tracer, then to the caller. */
typedef struct traced {
    tl_tracer *tr;
    tl_gen_callback fn;
    void *user;
} traced;

static int traced_token(const tl_gen_event *ev, void *user) {
    traced *t = user;
    tl_tracer_token(t->tr, 0, ev);
    return t->fn ? t->fn(ev, t->user) : 0;
}

/* The prompt in forward calls of n_batch, each one traced. */
static int traced_prefill(tl_ctx *ctx, tl_tracer *tr, const int32_t *prompt, size_t n, int cached, tl_error *err) {
    const size_t nb = (size_t)tl_ctx_n_batch(ctx);
    for (size_t at = 0; at < n; at += nb) {
        const size_t k = n - at < nb ? n - at : nb;
        tl_tracer_call(tr);
        tl_tracer_seq(tr, 0, 0, TL_PHASE_PREFILL, (int)k, at ? 0 : cached, 0);
        int rc = tl_ctx_eval(ctx, prompt + at, k, 0, err);
        if (rc) return rc;
        tl_tracer_called(tr, (int)k);
        if (at + k < n) tl_tracer_emit(tr); /* the last chunk's record waits for the first token */
    }
    return TL_OK;
}

int tl_generate(tl_ctx *ctx, tl_sampler *smp, const int32_t *prompt, size_t n_prompt,
                const tl_gen_params *gp, tl_gen_stats *stats, tl_error *err) {
    tl_gen_stats st = {0};
    double t0 = tl_now();
    if (n_prompt == 0) return tl_fail(err, TL_ERR_ARG, "empty prompt");
    tl_tracer *tr = gp->tracer;
    tl_gen_params p = *gp;
    traced tw = {tr, gp->on_token, gp->user};
    if (tr) {
        p.on_token = traced_token;
        p.user = &tw;
    }
    tl_step *sp;
    int rc = tl_step_new(ctx, 0, smp, &p, &sp, err);
    if (rc) return rc;
    rc = tr ? traced_prefill(ctx, tr, prompt, n_prompt, gp->trace_cached, err) : tl_ctx_eval(ctx, prompt, n_prompt, 0, err);
    if (rc) {
        tl_step_free(sp);
        return rc;
    }
    st.n_prompt = (int)n_prompt;
    st.prefill_s = tl_now() - t0;
    for (size_t i = 0; i < n_prompt; i++) tl_sampler_accept(smp, prompt[i]);

    const float *rows[TL_STEP_MAX_FEED];
    int32_t tok[TL_STEP_MAX_FEED], seq[TL_STEP_MAX_FEED] = {0};
    uint8_t keep[TL_STEP_MAX_FEED];
    memset(keep, 1, sizeof keep);
    rows[0] = tl_ctx_logits(ctx, -1);
    int stop = tl_step_take(sp, rows, 1, err);
    double t_first = tl_now();
    st.ttft_s = t_first - t0;
    while (stop == TL_STOP_NONE) {
        if (tr) tl_tracer_emit(tr);
        int n = tl_step_feed(sp, 0, tok, TL_STEP_MAX_FEED);
        tl_batch b = {.n = n, .token = tok, .seq = seq, .logits = keep, .pending = 1};
        if (tr) {
            tl_tracer_call(tr);
            const int guesses = n - 1 - tl_step_fed_forced(sp);
            tl_tracer_seq(tr, 0, 0, guesses > 0 ? TL_PHASE_VERIFY : TL_PHASE_DECODE, n, 0, guesses);
        }
        if ((rc = tl_ctx_decode(ctx, &b, err))) break;
        if (tr) tl_tracer_called(tr, n);
        for (int i = 0; i < n; i++) rows[i] = tl_ctx_batch_logits(ctx, i);
        stop = tl_step_take(sp, rows, n, err);
    }
    if (stop < 0) rc = stop;
    const char *rest = NULL;
    size_t n_rest = rc ? 0 : tl_step_flush(sp, &rest); /* what was held back is final now */
    if (n_rest) {
        tl_gen_event ev = {.token = -1, .text = rest, .text_len = n_rest};
        if (tr) tl_tracer_token(tr, 0, &ev);
        if (gp->on_token) gp->on_token(&ev, gp->user);
    }
    if (tr && !rc) tl_tracer_emit(tr);
    st.n_gen = tl_step_count(sp);
    tl_step_spec_stats(sp, &st.n_drafted, &st.n_accepted);
    st.n_reasoning = tl_step_reasoning_count(sp);
    tl_step_mask_stats(sp, &st.n_masks, &st.mask_median_us, &st.mask_s);
    tl_step_free(sp);
    st.decode_s = st.n_gen ? tl_now() - t_first : 0;
    st.stop = stop > 0 ? stop : TL_STOP_NONE;
    if (stats) *stats = st;
    return rc;
}
