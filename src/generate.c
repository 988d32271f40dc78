/* generate: the loop for one sequence. Prefill the prompt in one batched
 * eval, then sample, stream, append and repeat until an end-of-generation
 * token, a stop string, the length cap or a full context. Owns the stop-string
 * hold-back buffer and the timing statistics of one call. */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "tokenloop.h"
#include "util.h"

#define MAX_TOP 20
#define PIECE_CAP 1024

typedef struct stream {
    char *buf; /* text decoded but not yet emitted (could start a stop string) */
    size_t len, cap;
} stream;

static int stream_add(stream *s, const char *p, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t nc = (s->len + n + 1) * 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) return -1;
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = 0;
    return 0;
}

/* Length of the longest suffix of text that is a proper prefix of a stop string. */
static size_t held_suffix(const char *text, size_t len, const tl_gen_params *gp) {
    size_t best = 0;
    for (int i = 0; i < gp->n_stop; i++) {
        size_t sl = strlen(gp->stop[i]);
        for (size_t k = sl ? sl - 1 : 0; k > best; k--)
            if (k <= len && memcmp(text + len - k, gp->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Finds the earliest stop string in text; returns its offset or -1. */
static long find_stop(const char *text, size_t len, const tl_gen_params *gp) {
    long best = -1;
    for (int i = 0; i < gp->n_stop; i++) {
        size_t sl = strlen(gp->stop[i]);
        if (!sl || sl > len) continue;
        for (size_t at = 0; at + sl <= len; at++)
            if (memcmp(text + at, gp->stop[i], sl) == 0) {
                if (best < 0 || (long)at < best) best = (long)at;
                break;
            }
    }
    return best;
}

static int emit(const tl_gen_params *gp, tl_gen_event *ev, const char *text, size_t n) {
    ev->text = text;
    ev->text_len = n;
    return gp->on_token ? gp->on_token(ev, gp->user) : 0;
}

int tl_generate(tl_ctx *ctx, tl_sampler *smp, const int32_t *prompt, size_t n_prompt,
                const tl_gen_params *gp, tl_gen_stats *stats, tl_error *err) {
    const tl_model *m = tl_ctx_model(ctx);
    tl_gen_stats st = {0};
    double t0 = tl_now();
    if (n_prompt == 0) return tl_fail(err, TL_ERR_ARG, "empty prompt");
    int rc = tl_ctx_eval(ctx, prompt, n_prompt, 0, err);
    if (rc) return rc;
    st.n_prompt = (int)n_prompt;
    st.prefill_s = tl_now() - t0;
    for (size_t i = 0; i < n_prompt; i++) tl_sampler_accept(smp, prompt[i]);

    tl_token_prob top[MAX_TOP];
    int n_top = gp->n_top < 0 ? 0 : (gp->n_top > MAX_TOP ? MAX_TOP : gp->n_top);
    tl_detok dt;
    tl_detok_init(&dt, 0);
    stream pend = {0};
    char piece[PIECE_CAP + 16];
    double t_first = 0;
    int stop = TL_STOP_NONE;
    while (!stop) {
        tl_gen_event ev = {0};
        const float *logits = tl_ctx_logits(ctx, -1);
        int32_t tok = tl_sampler_sample(smp, logits, &ev.chosen, n_top ? top : NULL, n_top);
        if (st.n_gen == 0) {
            t_first = tl_now();
            st.ttft_s = t_first - t0;
        }
        st.n_gen++;
        tl_sampler_accept(smp, tok);
        ev.token = tok;
        ev.top = top;
        ev.n_top = n_top;
        if (!gp->ignore_eog && tl_token_is_eog(m, tok)) {
            stop = TL_STOP_EOG;
            emit(gp, &ev, "", 0); /* the token is reported, its text is not */
            break;
        }
        size_t pl = tl_detok_push(&dt, m, tok, piece, sizeof piece);
        if (stream_add(&pend, piece, pl)) {
            rc = tl_fail(err, TL_ERR_NOMEM, "out of memory");
            break;
        }
        long at = find_stop(pend.buf, pend.len, gp);
        size_t ready;
        if (at >= 0) {
            ready = (size_t)at;
            stop = TL_STOP_STRING;
        } else {
            ready = pend.len - held_suffix(pend.buf, pend.len, gp);
        }
        if (emit(gp, &ev, pend.buf, ready) && !stop) stop = TL_STOP_CALLBACK;
        memmove(pend.buf, pend.buf + ready, pend.len - ready);
        pend.len -= ready;
        if (stop == TL_STOP_STRING) pend.len = 0;
        if (stop) break;
        if (gp->n_predict >= 0 && st.n_gen >= gp->n_predict) {
            stop = TL_STOP_LENGTH;
            break;
        }
        if (tl_ctx_n_past(ctx) >= tl_ctx_n_ctx(ctx)) {
            stop = TL_STOP_CONTEXT;
            break;
        }
        if ((rc = tl_ctx_eval(ctx, &tok, 1, 0, err))) break;
    }
    if (!rc && stop != TL_STOP_STRING) { /* what was held back is final now */
        size_t fl = tl_detok_flush(&dt, piece, sizeof piece);
        if (pend.len || fl) {
            tl_gen_event ev = {.token = -1};
            if (!stream_add(&pend, piece, fl)) emit(gp, &ev, pend.buf, pend.len);
        }
    }
    free(pend.buf);
    st.decode_s = st.n_gen ? tl_now() - t_first : 0;
    st.stop = stop;
    if (stats) *stats = st;
    return rc;
}
