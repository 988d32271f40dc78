/* generate: tl_generate, the whole loop on sequence 0 for the CLI and the
 * tests: prefill the prompt in batched evals (traced when asked), then run a
 * tl_step (step.c) until it stops. The output rules are output.c's. */
#include <stdlib.h>
#include <string.h>

#include "forward/forward.h"
#include "tokenloop.h"
#include "base/util.h"

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
    /* a token and its guesses in one call: no more than the context's batch */
    const int cap = tl_ctx_n_batch(ctx) < TL_STEP_MAX_FEED ? tl_ctx_n_batch(ctx) : TL_STEP_MAX_FEED;
    while (stop == TL_STOP_NONE) {
        if (tr) tl_tracer_emit(tr);
        int n = tl_step_feed(sp, 0, tok, cap);
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
