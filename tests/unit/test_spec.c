/* Speculative decoding (src/gen/spec.c, step.c) on the real SmolLM2 model:
 * with guesses verified in the forward call, the tokens, their log
 * probabilities and the text are bitwise those of plain decoding, greedy and
 * sampled (with penalties), for every draft length, with a stop string, a
 * length cap and the context limit falling inside drafts. On a prefix-cache
 * sequence, many rejected guesses leave no block behind and no wrong block
 * registered. Also the prompt-lookup drafter on fixed histories. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward/forward.h"
#include "gen/spec.h"
#include "base/util.h"
#include "tl_test.h"
#include "tokenloop.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAXT 400

typedef struct trace {
    int32_t ids[MAXT];
    float lp[MAXT];
    int n;
    char text[16384];
    size_t len;
} trace;

static int record(const tl_gen_event *ev, void *user) {
    trace *t = user;
    if (ev->token >= 0 && t->n < MAXT) {
        t->ids[t->n] = ev->token;
        t->lp[t->n++] = ev->chosen.logprob;
    }
    if (ev->text_len && t->len + ev->text_len < sizeof t->text) {
        memcpy(t->text + t->len, ev->text, ev->text_len);
        t->len += ev->text_len;
    }
    return 0;
}

typedef struct run_cfg {
    int n_ctx, spec, spec_max, n_predict;
    int d_ctx; /* the draft context's size (0: n_ctx) */
    float temp;
    const char *stop;
    const tl_model *draft; /* a draft model (on the context's threads) */
} run_cfg;

static int gen(tl_model *m, const int32_t *ids, int n, const run_cfg *c, trace *t, tl_gen_stats *st, int *n_past) {
    memset(t, 0, sizeof *t);
    tl_error err = {0};
    tl_ctx_params cp = {.n_ctx = c->n_ctx, .n_threads = 2};
    tl_ctx *ctx = NULL, *dctx = NULL;
    tl_sampler *s = NULL;
    tl_sampler_params sp = tl_sampler_default_params();
    sp.temp = c->temp;
    sp.seed = 1234;
    sp.repeat_penalty = 1.05f;
    int rc = tl_ctx_new(m, &cp, &ctx, &err);
    if (!rc) rc = tl_sampler_new(&sp, tl_model_n_vocab(m), &s, &err);
    if (!rc && c->draft) {
        tl_ctx_params dp = {.n_ctx = c->d_ctx ? c->d_ctx : c->n_ctx, .n_batch = 64, .share_threads = ctx};
        rc = tl_ctx_new(c->draft, &dp, &dctx, &err);
    }
    const char *stops[1] = {c->stop};
    tl_gen_params gp = {.n_predict = c->n_predict, .stop = stops, .n_stop = c->stop ? 1 : 0,
                        .on_token = record, .user = t, .spec = c->spec, .spec_max = c->spec_max,
                        .draft_ctx = dctx};
    if (!rc) rc = tl_generate(ctx, s, ids, (size_t)n, &gp, st, &err);
    CHECK(rc == 0, "generate: %s", err.msg);
    *n_past = ctx ? tl_ctx_n_past(ctx) : -1;
    tl_sampler_free(s);
    tl_ctx_free(dctx);
    tl_ctx_free(ctx);
    return rc;
}

static int same(const trace *a, const trace *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids) &&
           !memcmp(a->lp, b->lp, (size_t)a->n * sizeof *a->lp) && a->len == b->len &&
           !memcmp(a->text, b->text, a->len);
}

static void check_ngram(void) {
    const int32_t h1[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2};
    tl_hist h = {h1, 13, 3};
    int32_t out[8];
    int match;
    int n = tl_spec_ngram(&h, 8, out, &match);
    /* suffix 1 2 3: the latest earlier occurrence is at 6, followed by 7 8 1 2 3 */
    CHECK(match == 3 && n == 5 && out[0] == 7 && out[1] == 8 && out[4] == 3, "latest longest match: n %d match %d", n, match);
    n = tl_spec_ngram(&h, 2, out, &match);
    CHECK(n == 2 && out[0] == 7 && out[1] == 8, "capped at 2");
    tl_hist h2 = {h1, 5, 42};
    CHECK(tl_spec_ngram(&h2, 8, out, &match) == 0 && match == 0, "no match");
    const int32_t h3[] = {5, 6, 5, 6, 5};
    tl_hist h4 = {h3, 5, 6};
    n = tl_spec_ngram(&h4, 8, out, &match);
    CHECK(match == 4 && n == 2 && out[0] == 5 && out[1] == 6, "overlapping match: n %d match %d", n, match);
}

/* The server's path: a prefix-cache sequence stepped with guesses. */
static void check_cache(tl_model *m, const int32_t *ids, int n) {
    tl_error err = {0};
    tl_ctx_params cp = {.n_ctx = 512, .n_threads = 2, .n_seq_max = 2};
    tl_ctx *ctx = NULL;
    tl_sampler *s = NULL;
    tl_sampler_params sp = tl_sampler_default_params();
    sp.temp = 0;
    if (tl_ctx_new(m, &cp, &ctx, &err) || tl_sampler_new(&sp, tl_model_n_vocab(m), &s, &err)) {
        CHECK(0, "%s", err.msg);
        tl_ctx_free(ctx);
        return;
    }
    int a = 0;
    CHECK(tl_seq_open(ctx, &a, &err) == 0, "%s", err.msg);
    int32_t seq[TL_STEP_MAX_FEED];
    uint8_t keep[TL_STEP_MAX_FEED];
    static uint8_t lg[512];
    static int32_t sq[512];
    for (int i = 0; i < n; i++) sq[i] = a, lg[i] = i == n - 1;
    tl_batch pb = {.n = n, .token = ids, .seq = sq, .logits = lg};
    CHECK(tl_ctx_decode(ctx, &pb, &err) == 0, "prompt: %s", err.msg);
    tl_step *st = NULL;
    trace *t = calloc(1, sizeof *t);
    tl_gen_params gp = {.n_predict = 160, .on_token = record, .user = t, .spec = TL_SPEC_NGRAM, .spec_max = 6};
    CHECK(t && tl_step_new(ctx, a, s, &gp, &st, &err) == 0, "step: %s", err.msg);
    const float *rows[TL_STEP_MAX_FEED] = {tl_ctx_batch_logits(ctx, 0)};
    int stop = st ? tl_step_take(st, rows, 1, &err) : -1;
    int32_t tok[TL_STEP_MAX_FEED];
    for (int i = 0; i < TL_STEP_MAX_FEED; i++) seq[i] = a, keep[i] = 1;
    while (stop == TL_STOP_NONE) {
        int k = tl_step_feed(st, 0, tok, TL_STEP_MAX_FEED);
        tl_batch b = {.n = k, .token = tok, .seq = seq, .logits = keep, .pending = 1};
        if (tl_ctx_decode(ctx, &b, &err)) break;
        for (int i = 0; i < k; i++) rows[i] = tl_ctx_batch_logits(ctx, i);
        stop = tl_step_take(st, rows, k, &err);
    }
    CHECK(stop > 0, "stepped to the end: %d %s", stop, err.msg);
    int drafted = 0, accepted = 0;
    if (st) tl_step_spec_stats(st, &drafted, &accepted);
    CHECK(drafted > accepted && accepted > 0, "guesses both kept and rejected (%d drafted, %d kept)", drafted, accepted);
    int n_all = 0;
    const int32_t *all = tl_seq_tokens(ctx, a, &n_all);
    CHECK(n_all == n + (t ? t->n : 0) - 1, "the sequence holds the prompt and the fed tokens (%d)", n_all);
    int32_t *copy = malloc((size_t)(n_all + 1) * sizeof *copy);
    if (copy && all) memcpy(copy, all, (size_t)n_all * sizeof *copy);
    tl_step_free(st);
    tl_seq_close(ctx, a);
    tl_kv_stats kv;
    tl_ctx_kv_stats(ctx, &kv);
    CHECK(kv.n_used == 0 && kv.n_free == kv.n_blocks, "no block leaked (used %d)", kv.n_used);
    /* a second sequence with the same tokens maps the cached blocks; its
     * last row equals plain evaluation of those tokens on sequence 0 */
    int b = 0;
    CHECK(tl_seq_open(ctx, &b, &err) == 0, "%s", err.msg);
    int reused = copy ? tl_seq_reuse_prefix(ctx, b, copy, (size_t)n_all, (size_t)n_all - 1) : 0;
    CHECK(reused >= (n_all - 1) / TL_KV_BLOCK * TL_KV_BLOCK - TL_KV_BLOCK && reused > n,
          "the generated blocks are cached (%d of %d)", reused, n_all);
    int rest = n_all - reused;
    for (int i = 0; i < rest; i++) sq[i] = b, lg[i] = i == rest - 1;
    tl_batch rb = {.n = rest, .token = copy + reused, .seq = sq, .logits = lg};
    CHECK(rest > 0 && tl_ctx_decode(ctx, &rb, &err) == 0, "rest: %s", err.msg);
    const float *cached = tl_ctx_batch_logits(ctx, 0);
    int nv = tl_model_n_vocab(m);
    float *row = cached ? malloc((size_t)nv * sizeof *row) : NULL;
    if (row) memcpy(row, cached, (size_t)nv * sizeof *row);
    CHECK(copy && tl_ctx_eval(ctx, copy, (size_t)n_all, 0, &err) == 0, "eval: %s", err.msg);
    const float *plain = tl_ctx_logits(ctx, -1);
    CHECK(row && plain && !memcmp(row, plain, (size_t)nv * sizeof *row),
          "logits over the cached blocks differ from plain evaluation");
    free(row);
    free(copy);
    free(t);
    tl_seq_close(ctx, b);
    tl_sampler_free(s);
    tl_ctx_free(ctx);
}

/* The sampled distribution with guesses against the exact one: n runs of
 * three tokens (seeds 0..n-1, temperature 1, top-k 3) after a prompt whose
 * continuation prompt lookup guesses, so later tokens come from verification
 * rows; chi-square of the counts of each outcome against p(t1) p(t2|t1)
 * p(t3|t1,t2) from tl_sampler_dist on rows computed without guesses. Cells
 * expected under 5 are pooled. False-alarm rate 0.1% (the critical value by
 * Wilson-Hilferty). */
typedef struct cell {
    int32_t t[3];
    int len;
    double p;
    int seen;
} cell;

static void check_chi2(tl_model *m, int n_runs) {
    tl_error err = {0};
    const char *text = "one two three four one two three four one two three four one two three four one two";
    int32_t *ids = NULL;
    size_t n = 0;
    tl_ctx *ctx = NULL;
    tl_ctx_params cp = {.n_ctx = 128, .n_threads = 2};
    if (tl_tokenize(m, text, strlen(text), 0, &ids, &n, &err) || tl_ctx_new(m, &cp, &ctx, &err)) {
        CHECK(0, "chi2 setup: %s", err.msg);
        tl_free(ids);
        return;
    }
    const int nv = tl_model_n_vocab(m), L = (int)n;
    float *row0 = malloc((size_t)nv * sizeof *row0);
    tl_sampler_params sp = tl_sampler_default_params();
    sp.temp = 1.0f, sp.top_k = 3, sp.top_p = 1.0f, sp.min_p = 0.0f, sp.seed = 1;
    tl_sampler *s = NULL;
    cell cells[64];
    int nc = 0;
    int ok = row0 && tl_sampler_new(&sp, nv, &s, &err) == 0 && tl_ctx_eval(ctx, ids, n, 0, &err) == 0;
    if (ok) memcpy(row0, tl_ctx_logits(ctx, -1), (size_t)nv * sizeof *row0);
    /* exact: every path of up to three tokens (an end token ends a path) */
    tl_token_prob d1[4], d2[4], d3[4];
    int n1 = ok ? tl_sampler_dist(s, row0, d1, 4) : 0;
    for (int a = 0; a < n1; a++) {
        if (tl_token_is_eog(m, d1[a].token)) {
            cells[nc++] = (cell){{d1[a].token}, 1, d1[a].prob, 0};
            continue;
        }
        int32_t pa[2] = {d1[a].token};
        ok &= tl_ctx_truncate(ctx, L, &err) == 0 && tl_ctx_eval(ctx, pa, 1, 0, &err) == 0;
        int n2 = ok ? tl_sampler_dist(s, tl_ctx_logits(ctx, -1), d2, 4) : 0;
        for (int b = 0; b < n2; b++) {
            double pab = (double)d1[a].prob * d2[b].prob;
            if (tl_token_is_eog(m, d2[b].token)) {
                cells[nc++] = (cell){{d1[a].token, d2[b].token}, 2, pab, 0};
                continue;
            }
            pa[1] = d2[b].token;
            ok &= tl_ctx_truncate(ctx, L, &err) == 0 && tl_ctx_eval(ctx, pa, 2, 0, &err) == 0;
            int n3 = ok ? tl_sampler_dist(s, tl_ctx_logits(ctx, -1), d3, 4) : 0;
            for (int c = 0; c < n3 && nc < 64; c++)
                cells[nc++] = (cell){{d1[a].token, d2[b].token, d3[c].token}, 3, pab * d3[c].prob, 0};
        }
    }
    tl_sampler_free(s);
    s = NULL;
    CHECK(ok && nc >= 9, "exact distribution: %d outcomes (%s)", nc, err.msg);
    int outside = 0, drafted = 0, kept = 0;
    int32_t tok[TL_STEP_MAX_FEED], sq[TL_STEP_MAX_FEED] = {0};
    uint8_t lg[TL_STEP_MAX_FEED];
    memset(lg, 1, sizeof lg);
    for (int r = 0; ok && r < n_runs; r++) {
        sp.seed = (uint64_t)r;
        trace t = {0};
        tl_step *st = NULL;
        tl_gen_params gp = {.n_predict = 3, .on_token = record, .user = &t, .spec = TL_SPEC_NGRAM, .spec_max = 4};
        if (tl_ctx_truncate(ctx, L, &err) || tl_sampler_new(&sp, nv, &s, &err) ||
            tl_step_new(ctx, 0, s, &gp, &st, &err)) {
            CHECK(0, "run %d: %s", r, err.msg);
            tl_sampler_free(s);
            break;
        }
        for (size_t i = 0; i < n; i++) tl_sampler_accept(s, ids[i]);
        const float *rows[TL_STEP_MAX_FEED] = {row0};
        int stop = tl_step_take(st, rows, 1, &err);
        while (stop == TL_STOP_NONE) {
            int k = tl_step_feed(st, 0, tok, TL_STEP_MAX_FEED);
            tl_batch b = {.n = k, .token = tok, .seq = sq, .logits = lg, .pending = 1};
            if (tl_ctx_decode(ctx, &b, &err)) break;
            for (int i = 0; i < k; i++) rows[i] = tl_ctx_batch_logits(ctx, i);
            stop = tl_step_take(st, rows, k, &err);
        }
        int dr, ac;
        tl_step_spec_stats(st, &dr, &ac);
        drafted += dr, kept += ac;
        tl_step_free(st);
        tl_sampler_free(s);
        s = NULL;
        int found = 0;
        for (int i = 0; i < nc && !found; i++)
            if (cells[i].len == t.n && !memcmp(cells[i].t, t.ids, (size_t)t.n * sizeof *t.ids)) cells[i].seen++, found = 1;
        outside += !found;
    }
    CHECK(outside == 0, "%d runs produced an outcome the exact distribution gives no mass", outside);
    CHECK(drafted > 0 && kept > 0 && kept < drafted, "guesses verified (%d drafted, %d kept)", drafted, kept);
    /* pool the small cells, then chi-square */
    double x2 = 0, pool_e = 0;
    int pool_o = 0, bins = 0;
    for (int i = 0; i < nc; i++) {
        double e = cells[i].p * n_runs;
        if (e < 5) {
            pool_e += e, pool_o += cells[i].seen;
            continue;
        }
        x2 += (cells[i].seen - e) * (cells[i].seen - e) / e;
        bins++;
    }
    if (pool_e > 0) x2 += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9), bins++;
    const int df = bins - 1;
    const double z = 3.0902, h = 2.0 / (9.0 * df); /* the 99.9% normal quantile */
    const double crit = df * pow(1 - h + z * sqrt(h), 3);
    printf("chi-square %.2f over %d bins (critical %.2f at 0.1%%), %d runs, %d guesses, %d kept\n", x2, bins, crit,
           n_runs, drafted, kept);
    CHECK(df >= 2 && x2 < crit, "chi-square %.2f over %d bins (critical %.2f at 0.1%%)", x2, bins, crit);
    free(row0);
    tl_free(ids);
    tl_ctx_free(ctx);
}

/* The cost curve speculation reads (tl_ctx_decode_cost): a draft context's
 * catch-up calls of tens of tokens must not make a one-token call look cheap
 * (a line through both put it at a seventh of its cost, and below zero while
 * only the prompt's call was seen); a size measured in a fast moment never
 * looks cheaper than a smaller one. */
static void check_curve(void) {
    double y[65] = {0};
    int seen[65] = {0};
    CHECK(tl_curve_at(y, seen, 64, 1) == 0, "no point: unknown");
    y[46] = 80.0, seen[46] = 1; /* the prompt's call only */
    CHECK(tl_curve_at(y, seen, 64, 1) == 0 && tl_curve_at(y, seen, 64, 45) == 0,
          "below the only point: unknown, not %g", tl_curve_at(y, seen, 64, 1));
    CHECK_NEAR(tl_curve_at(y, seen, 64, 46), 80.0, 0, "at the point");
    CHECK_NEAR(tl_curve_at(y, seen, 64, 48), 80.0 * 1.5, 1e-12, "one point: a quarter of it per size past it");
    y[1] = 3.5, seen[1] = 1;
    y[3] = 3.0, seen[3] = 1; /* a fast moment */
    CHECK_NEAR(tl_curve_at(y, seen, 64, 1), 3.5, 0, "a one-token call at its own average");
    CHECK_NEAR(tl_curve_at(y, seen, 64, 2), 3.5, 1e-12, "between 1 and a cheaper 3: not below 1's");
    CHECK_NEAR(tl_curve_at(y, seen, 64, 3), 3.5, 0, "3 lifted to 1's");
    CHECK_NEAR(tl_curve_at(y, seen, 64, 24), 3.5 + (80.0 - 3.5) * 21 / 43, 1e-9, "between 3 and 46: the line");
    CHECK_NEAR(tl_curve_at(y, seen, 64, 50), 80.0 + 4 * (80.0 - 3.5) / 45, 1e-9, "past 46: the mean slope from 1");
    CHECK(tl_curve_at(y, seen, 64, 65) == 0 && tl_curve_at(y, seen, 64, 0) == 0, "out of range: 0");
}

/* auto's estimates by matched n-gram length: one-word matches rejected in
 * free text must not stop guesses on four-word matches (copied text). */
static void check_policy(tl_model *m) {
    tl_error err = {0};
    tl_ctx_params cp = {.n_ctx = 64, .n_threads = 1};
    tl_ctx *ctx = NULL;
    if (tl_ctx_new(m, &cp, &ctx, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    /* Fixed costs, not measured ones: timed calls on a busy machine once
     * made a two-row call look twice a one-row call's cost, and then no
     * guess paid (0 guesses on a four-word match). A call of 2 rows costs
     * 10% more than one of 1 row, as decode does on a memory-bound CPU. */
    CHECK(tl_ctx_decode_cost(ctx, 1) == 0, "a fresh context has no cost yet");
    for (int i = 0; i < 4; i++) {
        tl_ctx_cost_record(ctx, 1, 0.010);
        tl_ctx_cost_record(ctx, 2, 0.011);
    }
    tl_ctx_cost_record(ctx, 2, 0.050); /* one call slowed by another process */
    CHECK_NEAR(tl_ctx_decode_cost(ctx, 1), 0.010, 0, "one row: its recorded cost");
    CHECK_NEAR(tl_ctx_decode_cost(ctx, 2), 0.011, 0, "two rows: the fastest of the last four, not the slow one");
    tl_spec_policy p;
    tl_spec_policy_init(&p, TL_SPEC_AUTO, 8);
    p.bin = 1;
    for (int i = 0; i < 40; i++) tl_spec_update(&p, 0, 1);
    p.bin = 4;
    for (int i = 0; i < 40; i++) tl_spec_update(&p, 3, 0);
    p.bin = 1;
    const int k1 = tl_spec_choose(&p, ctx, 8, 0, 0.0, NULL);
    p.bin = 4;
    const int k4 = tl_spec_choose(&p, ctx, 8, 0, 0.0, NULL);
    CHECK(k1 == 0 && k4 > 0, "policy: %d guesses on a one-word match (always rejected), %d on a four-word one "
          "(always kept)", k1, k4);
    /* a drafter whose guess costs as much as a plain step can never pay, even
     * with every guess kept; an unmeasured cost leaves the question open */
    const double t1 = tl_ctx_decode_cost(ctx, 1);
    CHECK(t1 > 0 && !tl_spec_could_pay(ctx, 8, 0, t1), "a guess as dear as a step could pay");
    CHECK(tl_spec_could_pay(ctx, 8, 0, 0.0), "an unmeasured guess cost ruled out");
    tl_ctx_free(ctx);
}

int main(void) {
    check_ngram();
    check_curve();
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load(MODEL, &m, &err)) {
        CHECK(0, "%s: %s (run make models)", MODEL, err.msg);
        return tl_test_summary();
    }
    check_policy(m);
    /* a copy-heavy prompt: the answer repeats much of it */
    const char *doc =
        "static int blocks_for(int positions) {\n    return (positions + TL_KV_BLOCK - 1) / TL_KV_BLOCK;\n}\n"
        "static void slot_clear(srv_sched *s, slot *sl) {\n    if (sl->seq > 0) tl_seq_close(s->ctx, sl->seq);\n"
        "    tl_sampler_free(sl->smp);\n    memset(sl, 0, sizeof *sl);\n}\n";
    char text[2048];
    snprintf(text, sizeof text,
             "<|im_start|>user\nRewrite this C code with the variable sl renamed to slot:\n%s<|im_end|>\n"
             "<|im_start|>assistant\n",
             doc);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(tl_tokenize(m, text, strlen(text), TL_TOK_PARSE_SPECIAL, &ids, &n, &err) == 0, "%s", err.msg);
    trace *ref = calloc(1, sizeof *ref), *got = calloc(1, sizeof *got);
    tl_gen_stats st, st2;
    int past_ref, past;
    const float temps[2] = {0.0f, 0.8f};
    /* under the sanitizers (10x slower) a subset: greedy, three lengths,
     * 100 tokens a run */
    const int asan = getenv("TL_ASAN") != NULL;
    for (int ti = 0; ti < (asan ? 1 : 2) && ref && got; ti++) {
        run_cfg c = {.n_ctx = 1024, .n_predict = asan ? 100 : 160, .temp = temps[ti]};
        gen(m, ids, (int)n, &c, ref, &st, &past_ref);
        CHECK(ref->n > 20, "reference generated %d tokens", ref->n);
        const int lens[] = {1, 2, 3, 5, 8, 16};
        for (int li = 0; li < 6; li++) {
            if ((ti == 1 || asan) && (li % 2)) continue;
            c.spec = TL_SPEC_NGRAM;
            c.spec_max = lens[li];
            gen(m, ids, (int)n, &c, got, &st2, &past);
            CHECK(same(ref, got) && past == past_ref, "temp %.1f, up to %d guesses: output differs (%d vs %d tokens)",
                  temps[ti], lens[li], got->n, ref->n);
            CHECK(st2.n_drafted > 0 && st2.n_accepted > 0 && st2.stop == st.stop,
                  "temp %.1f, up to %d guesses: %d drafted, %d kept", temps[ti], lens[li], st2.n_drafted,
                  st2.n_accepted);
        }
        c.spec = TL_SPEC_AUTO;
        c.spec_max = 0;
        gen(m, ids, (int)n, &c, got, &st2, &past);
        CHECK(same(ref, got), "temp %.1f, auto: output differs", temps[ti]);
        /* a draft model (the model itself: greedy guesses all kept at
         * temperature 0, many rejected when sampling), fixed and auto */
        run_cfg cd = c;
        cd.draft = m;
        cd.spec = TL_SPEC_DRAFT;
        cd.spec_max = 5;
        gen(m, ids, (int)n, &cd, got, &st2, &past);
        /* --spec draft guesses every step (the first guess is not weighed);
         * how far beyond it follows the measured costs, and a model drafting
         * for itself costs a whole step per guess: when sampling, a busy or
         * fast machine may make it stop after one rejected guess. */
        CHECK(same(ref, got) && past == past_ref, "temp %.1f, draft model: output differs", temps[ti]);
        CHECK(st2.n_drafted > 0 && (ti > 0 || st2.n_accepted > 0), "temp %.1f, draft model: %d drafted, %d kept",
              temps[ti], st2.n_drafted, st2.n_accepted);
        CHECK(ti == 0 ? st2.n_accepted == st2.n_drafted || st2.stop != TL_STOP_LENGTH : st2.n_accepted < st2.n_drafted,
              "temp %.1f: %d of %d draft guesses kept", temps[ti], st2.n_accepted, st2.n_drafted);
        /* a draft context too small for the sequence: the draft starts over
         * on the window of the last tokens, more than once */
        cd.d_ctx = 128;
        gen(m, ids, (int)n, &cd, got, &st2, &past);
        CHECK(same(ref, got) && past == past_ref, "temp %.1f, draft model in a small window: output differs",
              temps[ti]);
        /* only that it drafted: from a window of the last 64 tokens the
         * model is not the target any more, and after a rejected first guess
         * the measured costs may stop the rest */
        CHECK(st2.n_drafted > 0, "temp %.1f, draft model in a small window: %d drafted, %d kept", temps[ti],
              st2.n_drafted, st2.n_accepted);
        cd.d_ctx = 0;
        cd.spec = TL_SPEC_AUTO;
        cd.spec_max = 0;
        gen(m, ids, (int)n, &cd, got, &st2, &past);
        CHECK(same(ref, got), "temp %.1f, auto with a draft model: output differs", temps[ti]);
        /* a stop string, a length cap and the context limit inside drafts */
        if (ref->len > 120) {
            static char stop[8];
            memcpy(stop, ref->text + 100, 5);
            stop[5] = 0;
            run_cfg cs = c;
            cs.stop = stop;
            for (int k = 0; k < 2; k++) {
                cs.spec = k ? TL_SPEC_NGRAM : TL_SPEC_OFF;
                gen(m, ids, (int)n, &cs, k ? got : ref, k ? &st2 : &st, k ? &past : &past_ref);
            }
            CHECK(same(ref, got) && st.stop == TL_STOP_STRING && st2.stop == TL_STOP_STRING,
                  "stop string '%s': outputs differ (stops %d %d)", stop, st.stop, st2.stop);
        }
        for (int cap = 37; cap <= (asan ? 37 : 41); cap += 2) {
            run_cfg cl = c;
            cl.n_predict = cap;
            for (int k = 0; k < 2; k++) {
                cl.spec = k ? TL_SPEC_NGRAM : TL_SPEC_OFF;
                gen(m, ids, (int)n, &cl, k ? got : ref, k ? &st2 : &st, k ? &past : &past_ref);
            }
            CHECK(same(ref, got) && past == past_ref && got->n <= cap, "n_predict %d: outputs differ", cap);
        }
        for (int extra = 30; extra <= (asan ? 30 : 33); extra++) {
            run_cfg cc = c;
            cc.n_ctx = (int)n + extra;
            cc.n_predict = -1;
            for (int k = 0; k < 2; k++) {
                cc.spec = k ? TL_SPEC_NGRAM : TL_SPEC_OFF;
                gen(m, ids, (int)n, &cc, k ? got : ref, k ? &st2 : &st, k ? &past : &past_ref);
            }
            CHECK(same(ref, got) && past == past_ref, "n_ctx %d: outputs differ", cc.n_ctx);
            CHECK(st.stop != TL_STOP_CONTEXT || (int)n + ref->n == cc.n_ctx,
                  "prompt + completion fill the context exactly (%zu + %d vs %d)", n, ref->n, cc.n_ctx);
        }
    }
    check_cache(m, ids, (int)n);
    check_chi2(m, asan ? 400 : 2000);
    tl_model *g = NULL;
    if (tl_model_load_vocab("models/gemma-3-270m-q4_k_m.gguf", &g, &err) == 0) {
        CHECK(tl_spec_check_draft(m, g, &err) == TL_ERR_ARG && strstr(err.msg, "vocabulary"),
              "a draft with another vocabulary is refused: %s", err.msg);
        tl_model_free(g);
    } else {
        CHECK(0, "gemma vocabulary: %s", err.msg);
    }
    free(ref);
    free(got);
    tl_free(ids);
    tl_model_free(m);
    return tl_test_summary();
}
