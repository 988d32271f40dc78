/* gen/: what happens between forward calls: the token loop (step.c, this
 * file), the sampling chain (sampler.c), speculation's guessers and policy
 * (spec.c), the output rules (output.c) and tl_generate (generate.c). The
 * files form a line: output <- step <- generate.
 *
 * step: one sequence's token loop, the one both tl_generate and the server
 * run. It owns what happens between two forward calls: which tokens the
 * sequence feeds next (its last sampled token, later drafts), sampling from
 * the rows that come back, recording tokens for the penalties, the output
 * rules (tl_gen: text, stop strings, end tokens, the length cap), the context
 * limit, and committing to the KV cache only the positions that stay.
 *
 * Speculation (spec.c) adds guesses after the last sampled token. The rows
 * come back in order; the token sampled from row j is emitted, and row j + 1
 * is used only if that token equals guess j + 1: the rows after a wrong guess
 * saw a context that is not the sequence's, and their positions are not
 * committed. Each row is sampled exactly as without guesses (same rows, by
 * batch invariance; same sampler state, one draw per token), so the tokens
 * and their probabilities are those of plain decoding, at any temperature.
 *
 * The rules, stated once: a sampled token is emitted, then generation stops
 * if it ends it (end token, stop string, n_predict, the callback) or if the
 * prompt and the completion fill the context (the token just sampled would
 * take the last position). A stopped sequence's last token is never fed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward/forward.h"
#include "gen/spec.h"
#include "tokenloop.h"
#include "base/util.h"

#define MAX_TOP 20
#define TAIL_CAP 1024
#define MAX_FORCE 16
#define MASK_BINS 160
/* tokens within which a reply may open its reasoning */
#define OPEN_WITHIN 4
#define DRAFT_BINS 4
#define DRAFT_ALPHA 0.1
#define DRAFT_WINDOW 256
/* steps and guesses of the draft model's trial under auto */
#define DRAFT_TRIAL 8
#define DRAFT_TRIAL_K 3

struct tl_step {
    tl_ctx *ctx;
    int seq, n_ctx, n_vocab;
    tl_sampler *smp; /* the caller's */
    tl_matcher *grammar; /* the caller's, or NULL */
    /* a lazy grammar: off until the output holds the trigger; tail keeps the
     * output's last bytes (enough to hold the trigger and one token) */
    const char *trigger;
    int active;
    char tail[TAIL_CAP];
    int n_tail;
    int tail_seen; /* tail bytes already searched for the markers */
    int tail_dropped; /* the tail no longer starts at the output's start */
    /* reasoning: 0 not (yet) in it, 1 inside, 2 over; the close marker's
     * tokens, queued when the budget is spent */
    int trigger_start; /* the trigger counts only at the output's start */
    const char *think_open, *think_close;
    int think, think_budget, n_think;
    int32_t close_ids[MAX_FORCE];
    /* the grammar masks' times: a histogram of 4 bins per octave of ns */
    uint32_t mask_hist[MASK_BINS];
    int n_masks;
    double mask_s;
    int n_close, force_at; /* force_at < n_close: forcing close_ids[force_at..] */
    int fed_forced;        /* the last feed's guesses were the forced close, not guesses */
    tl_gen *gen;
    tl_gen_callback on_token;
    void *user;
    int n_predict, n_top;
    int32_t feed[TL_STEP_MAX_FEED]; /* what the last tl_step_feed handed out */
    int n_feed;
    int32_t last;    /* the last sampled token (-1 before the first) */
    int stop;
    tl_spec_policy spec;   /* the draft model's, or prompt lookup's without one */
    tl_spec_policy lookup; /* prompt lookup's beside a draft model (auto) */
    int used_draft;        /* the last step's guesses came from the draft model */
    int drafted, accepted;
    /* the draft model: its context and sequence, a batch's worth of that
     * sequence id, and its logits flags (the last row of a catch-up) */
    tl_ctx *dctx;
    int dseq, dbatch;
    int doff;              /* the target position of the draft sequence's first token */
    int dtrial;            /* steps left of the draft model's trial (auto) */
    int32_t *dseqv, *dtok; /* dtok: a catch-up chunk's tokens */
    uint8_t *dlg;
    /* how often the draft's guesses are kept, by its probability for them
     * (DRAFT_BINS bins, each an average over its last guesses), and each fed
     * guess's bin: a draft that is unsure between two tokens may still pick
     * the one the model picks, so its probability alone says little */
    double dkept[DRAFT_BINS];
    uint8_t dbin[TL_STEP_MAX_FEED];
    tl_token_prob top[MAX_TOP];
};

int tl_step_new(tl_ctx *ctx, int seq, tl_sampler *smp, const tl_gen_params *gp, tl_step **out,
                tl_error *err) {
    *out = NULL;
    if (!ctx || !smp || !gp) return tl_fail(err, TL_ERR_ARG, "tl_step_new: missing context, sampler or params");
    if (tl_seq_len(ctx, seq) < 0) return tl_fail(err, TL_ERR_ARG, "tl_step_new: sequence %d is not open", seq);
    tl_step *st = calloc(1, sizeof *st);
    if (!st) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    int rc = tl_gen_new(tl_ctx_model(ctx), gp, &st->gen, err);
    if (rc) {
        free(st);
        return rc;
    }
    st->ctx = ctx;
    st->seq = seq;
    st->n_ctx = tl_ctx_n_ctx(ctx);
    st->n_vocab = tl_model_n_vocab(tl_ctx_model(ctx));
    st->smp = smp;
    st->grammar = gp->grammar;
    st->trigger = gp->grammar && gp->grammar_trigger && *gp->grammar_trigger ? gp->grammar_trigger : NULL;
    st->trigger_start = gp->grammar_trigger_start;
    st->think_open = gp->think_open && *gp->think_open ? gp->think_open : NULL;
    st->think_close = gp->think_close && *gp->think_close ? gp->think_close : NULL;
    st->think = st->think_close && gp->think_started ? 1 : 0;
    st->think_budget = gp->think_budget;
    st->force_at = MAX_FORCE;
    if (st->think_close) {
        /* the close marker and a blank line, as a model would write them */
        char text[128];
        int32_t *ids = NULL;
        size_t n = 0;
        snprintf(text, sizeof text, "%s\n\n", st->think_close);
        rc = strlen(st->think_close) > 64 ? TL_ERR_ARG
                                          : tl_tokenize(tl_ctx_model(ctx), text, strlen(text), TL_TOK_PARSE_SPECIAL, &ids, &n, err);
        if (rc || n > MAX_FORCE) {
            tl_free(ids);
            tl_gen_free(st->gen);
            free(st);
            return rc && rc != TL_ERR_ARG ? rc : tl_fail(err, TL_ERR_ARG, "tl_step_new: the reasoning close marker is too long");
        }
        memcpy(st->close_ids, ids, n * sizeof *ids);
        st->n_close = (int)n;
        tl_free(ids);
    }
    st->active = st->grammar && !st->trigger && st->think != 1;
    if (st->think == 1 && st->think_budget == 0) st->force_at = 0; /* no reasoning at all: close at once */
    if (st->trigger && strlen(st->trigger) > TAIL_CAP / 4) {
        tl_gen_free(st->gen);
        free(st);
        return tl_fail(err, TL_ERR_ARG, "tl_step_new: the grammar trigger is longer than %d bytes", TAIL_CAP / 4);
    }
    st->on_token = gp->on_token;
    st->user = gp->user;
    st->n_predict = gp->n_predict;
    st->n_top = gp->n_top < 0 ? 0 : (gp->n_top > MAX_TOP ? MAX_TOP : gp->n_top);
    if (st->n_top > st->n_vocab) st->n_top = st->n_vocab;
    st->last = -1;
    tl_spec_policy_init(&st->spec, gp->spec, gp->spec_max);
    tl_spec_policy_init(&st->lookup, gp->spec, gp->spec_max);
    if (gp->draft_ctx && gp->spec != TL_SPEC_OFF && gp->spec != TL_SPEC_NGRAM) {
        st->dctx = gp->draft_ctx;
        st->dseq = gp->draft_seq;
        st->dbatch = tl_ctx_n_batch(st->dctx);
        st->dseqv = malloc((size_t)st->dbatch * sizeof *st->dseqv);
        st->dtok = malloc((size_t)st->dbatch * sizeof *st->dtok);
        st->dlg = calloc((size_t)st->dbatch, 1);
        if (!st->dseqv || !st->dtok || !st->dlg) {
            tl_step_free(st);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < st->dbatch; i++) st->dseqv[i] = st->dseq;
        for (int i = 0; i < DRAFT_BINS; i++) st->dkept[i] = 0.5;
        st->dtrial = gp->spec == TL_SPEC_AUTO ? DRAFT_TRIAL : 0;
        /* once the draft model stops paying, auto leaves it for prompt lookup */
        st->spec.no_probe = 1;
    }
    *out = st;
    return TL_OK;
}

void tl_step_free(tl_step *st) {
    if (!st) return;
    tl_gen_free(st->gen);
    free(st->dseqv);
    free(st->dtok);
    free(st->dlg);
    free(st);
}

int tl_step_count(const tl_step *st) { return tl_gen_count(st->gen); }
int tl_step_stop_index(const tl_step *st) { return tl_gen_stop_index(st->gen); }

void tl_step_set_top(tl_step *st, int n_top) {
    st->n_top = n_top < 0 ? 0 : (n_top > MAX_TOP ? MAX_TOP : n_top);
    if (st->n_top > st->n_vocab) st->n_top = st->n_vocab;
}

int tl_step_reasoning_count(const tl_step *st) { return st->n_think; }

static void mask_record(tl_step *st, double s) {
    const double ns = s * 1e9 < 1 ? 1 : s * 1e9;
    int b = (int)(4.0 * log2(ns));
    if (b >= MASK_BINS) b = MASK_BINS - 1;
    st->mask_hist[b]++;
    st->n_masks++;
    st->mask_s += s;
}

void tl_step_mask_stats(const tl_step *st, int *n, double *median_us, double *total_s) {
    *n = st->n_masks;
    *total_s = st->mask_s;
    *median_us = 0;
    uint32_t seen = 0;
    for (int b = 0; b < MASK_BINS && st->n_masks; b++)
        if ((seen += st->mask_hist[b]) * 2 >= (uint32_t)st->n_masks) {
            *median_us = exp2((b + 0.5) / 4.0) / 1e3; /* the bin's geometric middle */
            break;
        }
}

void tl_step_spec_stats(const tl_step *st, int *drafted, int *accepted) {
    *drafted = st->drafted;
    *accepted = st->accepted;
}

/* The draft model's argmax and its probability. Logits more than 16 below
 * the top add under 1.2e-7 each to the normaliser and are skipped: the
 * probability only steers how far to guess. */
static int32_t draft_argmax(const float *lg, int n, float *p) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[best]) best = i;
    const float top = lg[best], floor = top - 16.0f;
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (lg[i] > floor) sum += expf(lg[i] - top);
    *p = (float)(1.0 / sum);
    return best;
}

/* What the draft model's guessing weighs, in seconds: a plain step's time
 * per token of the batch, a verification row's, and a draft call's. */
typedef struct draft_costs {
    double tok, row, call;
} draft_costs;

/* Seconds a one-token draft call takes: measured, or before the draft model
 * ran, a plain step's time scaled by the bytes each model reads per token
 * (decode streams the weights). */
static double draft_call_s(const tl_step *st) {
    const double d = tl_ctx_decode_cost(st->dctx, 1);
    if (d > 0) return d;
    const size_t bm = tl_model_decode_bytes(tl_ctx_model(st->ctx)), bd = tl_model_decode_bytes(tl_ctx_model(st->dctx));
    return bm ? tl_ctx_decode_cost(st->ctx, 1) * (double)bd / (double)bm : 0;
}

static draft_costs costs_of(const tl_step *st, int n_other) {
    const int b0 = n_other + 1;
    const double t0 = tl_ctx_decode_cost(st->ctx, b0), t1 = tl_ctx_decode_cost(st->ctx, b0 + 1);
    draft_costs c = {t0 / b0, t1 - t0, draft_call_s(st)};
    return c;
}

/* Up to k guesses from the draft model into feed[1..]. Its sequence is first
 * brought to the target's tokens and the last sampled one: what it shares
 * with them stays, the rest (last step's rejected guesses) goes.
 *
 * How far to guess: the chance that guesses 1..i are all kept (cum) is the
 * product of the rates at which guesses of their draft probability were kept
 * so far. Guess i is worth its verification row while cum * tok > row;
 * another draft call is worth making while the guess it makes is expected to
 * pay for it, cum * acc * tok > call + row (acc: the share of all guesses
 * kept; the call's cost from draft_call_s). Before the model's steps were
 * measured, a guess needs p >= 0.5. Any failure only ends the guessing: the
 * draft never stops the generation. */
static int draft_bin(float p) { return p < 0.2f ? 0 : p < 0.5f ? 1 : p < 0.8f ? 2 : 3; }

static int draft_model(tl_step *st, const tl_hist *h, int k, int n_other) {
    tl_error err;
    int nd = 0;
    const int32_t *dt = tl_seq_tokens(st->dctx, st->dseq, &nd);
    /* The draft reads a window: it starts DRAFT_WINDOW tokens before the end
     * (a long prompt would otherwise cost its whole prefill again) and starts
     * over when its context would overflow. */
    const int dn_ctx = tl_ctx_n_ctx(st->dctx);
    if (nd == 0 || st->doff > h->n_tok || h->n_tok + 1 - st->doff + k > dn_ctx) {
        const int w = DRAFT_WINDOW < dn_ctx / 2 ? DRAFT_WINDOW : dn_ctx / 2;
        if (nd && tl_seq_truncate(st->dctx, st->dseq, 0, &err)) return 0;
        nd = 0;
        st->doff = h->n_tok + 1 > w ? h->n_tok + 1 - w : 0;
        if (h->n_tok + 1 - st->doff + k > dn_ctx) return 0;
    }
    int c = 0;
    while (c < nd && st->doff + c < h->n_tok && dt[c] == h->tok[st->doff + c]) c++;
    if (c < nd && tl_seq_truncate(st->dctx, st->dseq, c, &err)) return 0;
    /* the catch-up: tokens [doff + c, n_tok) and the last, in chunks; the
     * last chunk (which ends with the last token) keeps its final row */
    for (int done = st->doff + c; done <= h->n_tok;) {
        int n = h->n_tok + 1 - done < st->dbatch ? h->n_tok + 1 - done : st->dbatch;
        const int end = done + n > h->n_tok;
        for (int i = 0; i < n; i++) st->dtok[i] = done + i < h->n_tok ? h->tok[done + i] : h->last;
        st->dlg[n - 1] = (uint8_t)end;
        tl_batch b = {.n = n, .token = st->dtok, .seq = st->dseqv, .logits = st->dlg};
        int rc = tl_ctx_decode(st->dctx, &b, &err);
        st->dlg[n - 1] = 0;
        if (rc) return 0;
        done += n;
    }
    const draft_costs dc = costs_of(st, n_other);
    const int measured = dc.tok > 0 && dc.call > 0;
    const int nv = st->n_vocab;
    int got = 0;
    double cum = 1.0;
    for (;;) {
        const float *lg = tl_ctx_batch_logits(st->dctx, 0);
        if (!lg) break;
        float p;
        const int32_t t = draft_argmax(lg, nv, &p);
        const int bin = draft_bin(p);
        cum *= st->dkept[bin];
        /* --spec draft guesses every step: its first guess is not weighed,
         * so the mode does what it says whatever the measured costs */
        const int forced = got == 0 && st->spec.mode == TL_SPEC_DRAFT;
        if (!forced && (measured ? cum * dc.tok <= dc.row : p < 0.5f)) break;
        st->dbin[1 + got] = (uint8_t)bin;
        st->feed[1 + got++] = t;
        if (got >= k) break;
        if (measured ? cum * st->spec.acc * dc.tok <= dc.call + dc.row : p < 0.5f) break;
        const uint8_t one = 1;
        tl_batch b = {.n = 1, .token = &st->feed[got], .seq = st->dseqv, .logits = &one};
        if (tl_ctx_decode(st->dctx, &b, &err)) break;
    }
    return got;
}

/* Guesses worth verifying after the last sampled token, into feed[1..]. */
static int draft(tl_step *st, int n_other, int cap) {
    if (st->spec.mode == TL_SPEC_OFF) return 0;
    tl_hist h;
    h.tok = tl_seq_tokens(st->ctx, st->seq, &h.n_tok);
    h.last = st->last;
    /* guesses that could never be emitted are not worth a row: the context
     * limit stops at len + 1 + k >= n_ctx, the length cap after n_predict */
    int max = st->n_ctx - h.n_tok - 2;
    if (st->n_predict >= 0 && st->n_predict - tl_gen_count(st->gen) - 1 < max)
        max = st->n_predict - tl_gen_count(st->gen) - 1;
    if (cap - 1 < max) max = cap - 1;
    if (TL_STEP_MAX_FEED - 1 < max) max = TL_STEP_MAX_FEED - 1;
    if (!h.tok || max <= 0) return 0;
    st->used_draft = 0;
    /* Under auto, prompt lookup and the draft model each offer their best
     * length and its expected speed, and the faster one guesses. Lookup's
     * guesses cost nothing to make, so when the text is being copied the
     * draft call is saved (the draft model catches up on its next call); in
     * free text lookup's short matches are seldom kept where the draft
     * model's guesses are, and taking lookup whenever its own policy would
     * left the draft model idle there. */
    int kl = 0;
    double rl = 0, rd = 0;
    if (st->spec.mode == TL_SPEC_AUTO || !st->dctx) {
        tl_spec_policy *p = st->dctx ? &st->lookup : &st->spec;
        int match;
        int n = tl_spec_ngram(&h, max, st->feed + 1, &match);
        p->bin = match;
        kl = tl_spec_choose(p, st->ctx, n, n_other, 0.0, &rl);
        if (!st->dctx) return kl;
    }
    const double call_s = draft_call_s(st);
    if (st->spec.mode == TL_SPEC_AUTO) {
        /* a plain step first: it measures what a draft must beat */
        if (!(tl_ctx_decode_cost(st->ctx, n_other + 1) > 0)) return kl;
        /* a draft model that could not pay with every guess kept (one about
         * as large as the model: a Q4_0 drafting for a Q4_1 of the same
         * 135M) gets no trial: its first call packs its weights, and that
         * and the trial cost 15-25% of a 200-token reply */
        if (!tl_spec_could_pay(st->ctx, max, n_other, call_s)) {
            st->dtrial = 0;
            return kl;
        }
    }
    /* the cost decides the length before the guesses are made */
    st->spec.bin = 0;
    int k = st->spec.mode == TL_SPEC_AUTO ? tl_spec_choose(&st->spec, st->ctx, max, n_other, call_s, &rd)
                                          : (max < st->spec.max_draft ? max : st->spec.max_draft);
    if (kl > 0 && (k <= 0 || rl >= rd)) return kl;
    /* under auto the draft model gets a trial of a few steps before its
     * estimate (from a prior of one guess in two kept) may drop it for good */
    if (k <= 0 && st->dtrial > 0) k = max < DRAFT_TRIAL_K ? max : DRAFT_TRIAL_K;
    if (st->dtrial > 0) st->dtrial--;
    if (k <= 0) return kl;
    int got = draft_model(st, &h, k, n_other);
    /* a draft call that found nothing worth a row cost as much as a rejected
     * guess and yielded as little: the estimate learns it */
    if (got == 0) tl_spec_update(&st->spec, 0, 1);
    st->used_draft = got > 0;
    return got;
}

int tl_step_feed(tl_step *st, int n_other, int32_t *tok, int cap) {
    st->n_feed = 0;
    if (st->stop || st->last < 0 || cap < 1) return 0;
    st->feed[0] = st->last;
    st->fed_forced = st->force_at < st->n_close;
    if (st->fed_forced) { /* the forced close: known tokens, fed as guesses that are kept */
        st->used_draft = 0;
        int k = 0;
        for (int i = st->force_at; i < st->n_close && 1 + k < cap && 1 + k < TL_STEP_MAX_FEED; i++)
            st->feed[1 + k++] = st->close_ids[i];
        st->n_feed = 1 + k;
    } else {
        st->n_feed = 1 + draft(st, n_other, cap);
    }
    if (!st->fed_forced) st->drafted += st->n_feed - 1;
    memcpy(tok, st->feed, (size_t)st->n_feed * sizeof *tok);
    return st->n_feed;
}

int tl_step_fed_forced(const tl_step *st) { return st->fed_forced && st->n_feed > 1 ? st->n_feed - 1 : 0; }

/* The output's last bytes: the token joins the tail. */
static void tail_add(tl_step *st, int32_t tok) {
    char piece[512];
    /* special text too: a marker may be one control token */
    size_t n = tl_token_piece(tl_ctx_model(st->ctx), tok, 1, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    if (st->n_tail + (int)n > TAIL_CAP) { /* keep the last quarter: no marker is longer */
        st->tail_dropped = 1;
        const int keep = TAIL_CAP / 4;
        memmove(st->tail, st->tail + st->n_tail - keep, (size_t)keep);
        st->tail_seen -= st->n_tail - keep;
        if (st->tail_seen < 0) st->tail_seen = 0;
        st->n_tail = keep;
    }
    memcpy(st->tail + st->n_tail, piece, n);
    st->n_tail += (int)n;
}

/* Whether the tail holds `m` ending after byte tail_seen (a new occurrence). */
static int tail_has(const tl_step *st, const char *m) {
    const int n = (int)strlen(m);
    for (int i = st->tail_seen - n + 1 < 0 ? 0 : st->tail_seen - n + 1; i + n <= st->n_tail; i++)
        if (!memcmp(st->tail + i, m, (size_t)n)) return 1;
    return 0;
}

/* Reasoning after token tok (already in the tail): opened, closed, or its
 * budget spent (then the close marker is queued). Returns whether tok was
 * part of the reasoning. */
static int watch_think(tl_step *st, int forced) {
    if (!st->think_close || st->think == 2) return 0;
    if (st->think == 0) {
        /* the reply opens its reasoning at its start, or never (a marker
         * later is text; under a grammar it is the grammar's) */
        if (!st->think_open || st->active || tl_gen_count(st->gen) > OPEN_WITHIN || !tail_has(st, st->think_open)) {
            if (tl_gen_count(st->gen) > OPEN_WITHIN) st->think = 2;
            return 0;
        }
        st->think = 1;
        if (st->think_budget == 0) st->force_at = 0;
    }
    st->n_think++;
    if (tail_has(st, st->think_close)) {
        st->think = 2;
        st->force_at = st->n_close;
        if (st->grammar && !st->trigger) st->active = 1; /* the answer follows the grammar */
        return 1;
    }
    if (!forced && st->think_budget >= 0 && st->n_think >= st->think_budget && st->force_at >= st->n_close)
        st->force_at = 0;
    return 1;
}

/* Whether the output before tail byte i may lead a call that must open the
 * reply (blanks, after Llama 3's tag; the tail still holds the whole output
 * then). */
static int only_blanks_before(const tl_step *st, int i) {
    return !st->tail_dropped && tl_chat_call_lead(st->tail, (size_t)i, NULL) == (size_t)i;
}

/* A lazy grammar's watch: once the tail holds the trigger, the grammar starts
 * there and follows the bytes since (if they do not fit it, the output stays
 * free). */
static int watch_trigger(tl_step *st, tl_error *err) {
    const size_t tl = strlen(st->trigger);
    for (int i = st->tail_seen - (int)tl + 1 < 0 ? 0 : st->tail_seen - (int)tl + 1; i + (int)tl <= st->n_tail; i++)
        if (!memcmp(st->tail + i, st->trigger, tl)) {
            if (st->trigger_start && !only_blanks_before(st, i)) { /* not at the start: free text to the end */
                st->trigger = NULL;
                return TL_OK;
            }
            int rc = tl_matcher_reset(st->grammar, err);
            if (rc) return rc;
            if (tl_matcher_accept_bytes(st->grammar, st->tail + i, (size_t)(st->n_tail - i), err) == 0)
                st->active = 1;
            else
                st->trigger = NULL; /* not the grammar's way in: free text to the end */
            return TL_OK;
        }
    return TL_OK;
}

/* Whether a mask allows exactly one token. */
static int single_bit(const uint32_t *bits, int n) {
    int seen = 0;
    for (int w = 0; w < (n + 31) / 32; w++)
        if (bits[w]) {
            if (seen || (bits[w] & (bits[w] - 1))) return 0;
            seen = 1;
        }
    return seen;
}

/* Emits one sampled token; returns why generation stops after it. */
static int emit(tl_step *st, int32_t tok, const tl_token_prob *chosen, int n_top, int reasoning, int forced,
                int source) {
    tl_gen_event ev;
    int why = tl_gen_push(st->gen, tok, chosen, n_top ? st->top : NULL, n_top, &ev);
    ev.reasoning = reasoning;
    ev.forced = forced;
    ev.source = source;
    int cb = st->on_token ? st->on_token(&ev, st->user) : 0;
    if (why == TL_STOP_EOG || why == TL_STOP_STRING) return why;
    return cb ? TL_STOP_CALLBACK : why; /* a callback stop outranks the length cap */
}

int tl_step_take(tl_step *st, const float *const *rows, int n_rows, tl_error *err) {
    if (st->stop) return st->stop;
    const int fed = st->n_feed;
    if (fed ? n_rows != fed : n_rows != 1)
        return tl_fail(err, TL_ERR_ARG, "tl_step_take: %d rows for %d fed tokens", n_rows, fed);
    st->n_feed = 0;
    if (st->n_predict == 0) return st->stop = TL_STOP_LENGTH;
    const int len0 = tl_seq_len(st->ctx, st->seq);
    int keep = 0, stop = TL_STOP_NONE, rejected = 0;
    for (int j = 0; j < n_rows; j++) {
        if (!rows[j]) return tl_fail(err, TL_ERR_ARG, "tl_step_take: logits row %d missing", j);
        tl_token_prob chosen;
        int32_t tok;
        const int forced = st->force_at < st->n_close;
        int only = 0; /* the grammar allowed this token alone */
        if (forced) { /* the reasoning budget's close: written, not drawn */
            tok = st->close_ids[st->force_at++];
            tl_sampler_report(st->smp, rows[j], tok, &chosen, st->n_top ? st->top : NULL, st->n_top);
        } else {
            if (st->active) { /* the grammar masks the draw and follows what is drawn */
                const double t0 = tl_now();
                const uint32_t *bits = tl_matcher_allowed(st->grammar, err);
                mask_record(st, tl_now() - t0);
                if (!bits) return TL_ERR_NOMEM; /* its only failure (err, if given, says which) */
                only = single_bit(bits, st->n_vocab);
                tl_sampler_set_allowed(st->smp, bits);
            }
            tok = tl_sampler_sample(st->smp, rows[j], &chosen, st->n_top ? st->top : NULL, st->n_top);
            tl_sampler_set_allowed(st->smp, NULL);
            if (tok < 0 || tok >= st->n_vocab)
                return tl_fail(err, TL_ERR_ARG, st->active ? "sampling failed: no token the grammar allows" : "sampling failed");
        }
        const int was_active = st->active;
        if (was_active) {
            int rc = tl_matcher_accept(st->grammar, tok, err);
            if (rc) return rc;
        }
        int reasoning = 0;
        if (st->trigger || st->think_close) {
            tail_add(st, tok);
            reasoning = watch_think(st, forced);
            if (!was_active && !st->active && st->trigger && st->think != 1) {
                int rc = watch_trigger(st, err);
                if (rc) return rc;
            }
            st->tail_seen = st->n_tail;
        }
        tl_sampler_accept(st->smp, tok);
        if (fed) keep = j + 1; /* row j came after fed tokens 0..j, all of them right */
        st->last = tok;
        const int source = forced ? TL_SOURCE_FORCED
                           : fed && !st->fed_forced && j + 1 < fed && st->feed[j + 1] == tok ? TL_SOURCE_DRAFT
                           : only ? TL_SOURCE_GRAMMAR : TL_SOURCE_SAMPLED;
        stop = emit(st, tok, &chosen, st->n_top, reasoning, forced, source);
        if (!stop && len0 + keep + 1 >= st->n_ctx)
            stop = TL_STOP_CONTEXT;
        if (stop || j + 1 >= n_rows) break;
        if (st->feed[j + 1] != tok) {
            rejected = 1;
            break;
        }
    }
    if (fed > 1 && !st->fed_forced) {
        st->accepted += keep - 1;
        if (st->used_draft) /* guesses 1..keep-1 kept, guess keep rejected if `rejected` */
            for (int j = 1; j < keep + rejected && j < fed; j++) {
                double *r = &st->dkept[st->dbin[j]];
                *r += DRAFT_ALPHA * ((j < keep ? 1.0 : 0.0) - *r);
            }
        tl_spec_update(st->dctx && !st->used_draft ? &st->lookup : &st->spec, keep - 1, rejected);
    }
    if (fed) {
        int rc = tl_seq_commit(st->ctx, st->seq, keep, err);
        if (rc) return rc;
    }
    return st->stop = stop;
}

size_t tl_step_flush(tl_step *st, const char **text) { return tl_gen_flush(st->gen, text); }
