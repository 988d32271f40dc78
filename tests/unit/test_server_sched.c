/* The scheduler driven directly (no HTTP): greedy output equals a plain
 * tl_ctx_eval loop, a request's tokens and logprobs do not change with the
 * others running beside it, echo logprobs equal tl_sampler_report over
 * tl_ctx_eval's rows, and every request ends with exactly one DONE or ERROR
 * (cancelled, queue full, too long, draining, shut down while running); a
 * request that can never run is refused at submit, naming its limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"
#include "tl_test.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const tl_model *g_model;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static srv_req *make_req(const char *text, int max_tokens, float temp, uint64_t seed) {
    srv_req *r = srv_req_new();
    if (!r) return NULL;
    size_t n = 0;
    int flags = TL_TOK_PARSE_SPECIAL | (tl_model_add_bos(g_model) ? TL_TOK_ADD_BOS : 0);
    int32_t *ids = NULL;
    if (tl_tokenize(g_model, text, strlen(text), flags, &ids, &n, NULL) != 0) {
        srv_req_release(r);
        return NULL;
    }
    r->prompt = malloc(n * sizeof *r->prompt);
    if (r->prompt) memcpy(r->prompt, ids, n * sizeof *ids);
    tl_free(ids);
    r->n_prompt = (int)n;
    r->kind = SRV_COMPLETION;
    r->max_tokens = max_tokens;
    r->sp = tl_sampler_default_params();
    r->sp.temp = temp;
    r->sp.seed = seed;
    r->logprobs = 1;
    r->top_logprobs = 5;
    r->t_arrival = now_s();
    return r;
}

/* Waits (bounded) for the request to finish; returns 1 if it did. */
static int wait_done(srv_req *r, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)timeout_s;
    pthread_mutex_lock(&r->mu);
    while (!r->finished) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
    }
    int ok = r->finished;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static int n_events(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->n_ev;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Exactly one final event, and it is the last one. */
static int one_final(const srv_req *r) {
    int k = 0;
    for (int i = 0; i < r->n_ev; i++)
        if (r->ev[i].kind == SRV_EV_DONE || r->ev[i].kind == SRV_EV_ERROR) k++;
    return k == 1 && r->n_ev > 0 &&
           (r->ev[r->n_ev - 1].kind == SRV_EV_DONE || r->ev[r->n_ev - 1].kind == SRV_EV_ERROR);
}

/* Token events must match bit for bit: ids, chosen and top logprobs. */
static int same_tokens(const srv_req *a, const srv_req *b) {
    int ia = 0, ib = 0;
    for (;;) {
        while (ia < a->n_ev && a->ev[ia].kind != SRV_EV_TOKEN) ia++;
        while (ib < b->n_ev && b->ev[ib].kind != SRV_EV_TOKEN) ib++;
        if (ia == a->n_ev || ib == b->n_ev) return ia == a->n_ev && ib == b->n_ev;
        const srv_event *x = &a->ev[ia++], *y = &b->ev[ib++];
        if (x->token != y->token || x->n_top != y->n_top) return 0;
        if (memcmp(&x->chosen, &y->chosen, sizeof x->chosen) != 0) return 0;
        if (memcmp(x->top, y->top, (size_t)x->n_top * sizeof x->top[0]) != 0) return 0;
    }
}

static int n_kind(const srv_req *r, srv_ev_kind k) {
    int n = 0;
    for (int i = 0; i < r->n_ev; i++) n += r->ev[i].kind == k;
    return n;
}

static srv_opts base_opts(int np) {
    srv_opts o;
    memset(&o, 0, sizeof o);
    o.n_parallel = np;
    o.n_ctx = 512;
    o.max_queue = 64;
    o.n_threads = 2;
    o.n_batch = 512;
    o.prefill_chunk = 256;
    return o;
}

static const char *prompts[] = {
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, the first humans",
    "A haiku about the sea:",
    "The quick brown fox",
    "Water boils at",
};
#define N_PROMPTS (int)(sizeof prompts / sizeof prompts[0])

/* Greedy via tl_ctx_eval, one token at a time: the CLI's path. */
static void greedy_reference(const char *text, int n, int32_t *out) {
    tl_ctx *ctx = NULL;
    tl_ctx_params cp = {.n_ctx = 512, .n_threads = 2, .n_batch = 512};
    if (tl_ctx_new(g_model, &cp, &ctx, NULL) != 0) return;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int flags = TL_TOK_PARSE_SPECIAL | (tl_model_add_bos(g_model) ? TL_TOK_ADD_BOS : 0);
    tl_tokenize(g_model, text, strlen(text), flags, &ids, &n_ids, NULL);
    tl_ctx_eval(ctx, ids, n_ids, 0, NULL);
    int nv = tl_model_n_vocab(g_model);
    for (int i = 0; i < n; i++) {
        const float *lg = tl_ctx_logits(ctx, -1);
        int32_t best = 0;
        for (int v = 1; v < nv; v++)
            if (lg[v] > lg[best]) best = v;
        out[i] = best;
        tl_ctx_eval(ctx, &best, 1, 0, NULL);
    }
    tl_free(ids);
    tl_ctx_free(ctx);
}

static void test_alone_vs_crowd(void) {
    srv_metrics *mx = srv_metrics_new();
    srv_sched *s = NULL;
    srv_opts o = base_opts(4);
    o.prefill_chunk = 24; /* prompts arrive in several chunks, interleaved with decodes */
    CHECK(srv_sched_new(g_model, &o, mx, &s, NULL) == 0, "sched new");
    if (!s) return;
    CHECK(srv_sched_n_ctx(s) == 512, "n_ctx %d", srv_sched_n_ctx(s));
    srv_req *alone[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        alone[i] = make_req(prompts[i], 12, 0.0f, 1);
        CHECK(srv_sched_submit(s, alone[i], NULL, 0) == SRV_OK, "submit alone");
        CHECK(wait_done(alone[i], 60), "alone %d finishes", i);
        CHECK(one_final(alone[i]), "alone %d one final", i);
    }
    /* The same greedy tokens as the single-sequence eval path. */
    int32_t ref[12];
    greedy_reference(prompts[0], 12, ref);
    int k = 0, same = 1;
    for (int i = 0; i < alone[0]->n_ev; i++)
        if (alone[0]->ev[i].kind == SRV_EV_TOKEN) same &= k < 12 && alone[0]->ev[i].token == ref[k++];
    CHECK(same && k > 0, "scheduler greedy == tl_ctx_eval greedy (%d tokens)", k);

    /* All at once (more than -np: some wait). */
    srv_req *crowd[N_PROMPTS + 4];
    for (int i = 0; i < N_PROMPTS + 4; i++) {
        crowd[i] = make_req(prompts[(i * 3) % N_PROMPTS], 12, 0.0f, 1);
        CHECK(srv_sched_submit(s, crowd[i], NULL, 0) == SRV_OK, "submit crowd");
    }
    for (int i = 0; i < N_PROMPTS + 4; i++) {
        CHECK(wait_done(crowd[i], 120), "crowd %d finishes", i);
        CHECK(one_final(crowd[i]), "crowd %d one final", i);
        CHECK(same_tokens(crowd[i], alone[(i * 3) % N_PROMPTS]), "crowd %d == alone", i);
        CHECK(crowd[i]->completion_tokens == n_kind(crowd[i], SRV_EV_TOKEN), "usage %d", i);
        srv_req_release(crowd[i]);
    }
    for (int i = 0; i < N_PROMPTS; i++) srv_req_release(alone[i]);

    /* Seeded sampling alone vs among others. */
    srv_req *a = make_req(prompts[1], 16, 0.8f, 42);
    srv_sched_submit(s, a, NULL, 0);
    wait_done(a, 60);
    srv_req *b[6];
    for (int i = 0; i < 6; i++) {
        b[i] = make_req(i == 3 ? prompts[1] : prompts[i + 2], 16, i == 3 ? 0.8f : 0.7f, i == 3 ? 42 : 7);
        srv_sched_submit(s, b[i], NULL, 0);
    }
    for (int i = 0; i < 6; i++) wait_done(b[i], 60);
    CHECK(same_tokens(a, b[3]), "seeded sampling alone == in a crowd");
    srv_req_release(a);
    for (int i = 0; i < 6; i++) srv_req_release(b[i]);

    /* Prefix reuse: a long shared prefix, second time cached, same tokens. */
    char *longp = malloc(8192);
    longp[0] = 0;
    for (int i = 0; i < 24; i++) strcat(longp, "The rain in Spain stays mainly in the plain. ");
    srv_req *c1 = make_req(longp, 8, 0.0f, 1), *c2 = make_req(longp, 8, 0.0f, 1);
    srv_sched_submit(s, c1, NULL, 0);
    wait_done(c1, 60);
    srv_sched_submit(s, c2, NULL, 0);
    wait_done(c2, 60);
    CHECK(c1->cached_tokens == 0, "cold cached_tokens %d", c1->cached_tokens);
    CHECK(c2->cached_tokens > 0 && c2->cached_tokens < c2->n_prompt, "warm cached_tokens %d of %d",
          c2->cached_tokens, c2->n_prompt);
    CHECK(same_tokens(c1, c2), "cached prefix == cold");
    srv_req_release(c1);
    srv_req_release(c2);
    free(longp);
    srv_sched_free(s);
    srv_metrics_free(mx);
}

static void test_echo(void) {
    srv_sched *s = NULL;
    srv_opts o = base_opts(2);
    o.prefill_chunk = 5;
    CHECK(srv_sched_new(g_model, &o, NULL, &s, NULL) == 0, "sched new");
    if (!s) return;
    srv_req *r = make_req("Paris is the capital and largest city of France.", 0, 0.0f, 1);
    r->echo = 1;
    srv_sched_submit(s, r, NULL, 0);
    CHECK(wait_done(r, 60), "echo finishes");
    CHECK(one_final(r) && r->ev[r->n_ev - 1].kind == SRV_EV_DONE, "echo DONE");
    CHECK(n_kind(r, SRV_EV_PROMPT) == r->n_prompt, "a PROMPT event per token: %d of %d",
          n_kind(r, SRV_EV_PROMPT), r->n_prompt);
    CHECK(n_kind(r, SRV_EV_TOKEN) == 0, "max_tokens 0: no tokens");
    CHECK(r->ev[0].has_logprob == 0, "first prompt token has no logprob");

    tl_ctx *ctx = NULL;
    tl_ctx_params cp = {.n_ctx = 512, .n_threads = 2, .n_batch = 512};
    tl_ctx_new(g_model, &cp, &ctx, NULL);
    tl_ctx_eval(ctx, r->prompt, (size_t)r->n_prompt, 1, NULL);
    tl_sampler *smp = NULL;
    tl_sampler_params sp = tl_sampler_default_params();
    tl_sampler_new(&sp, tl_model_n_vocab(g_model), &smp, NULL);
    int bad = 0;
    for (int j = 1; j < r->n_prompt && j < r->n_ev; j++) {
        tl_token_prob ch, top[5];
        int nt = tl_sampler_report(smp, tl_ctx_logits(ctx, j - 1), r->prompt[j], &ch, top, 5);
        const srv_event *e = &r->ev[j];
        if (e->token != r->prompt[j] || !e->has_logprob || e->chosen.logprob != ch.logprob ||
            e->n_top != nt || memcmp(e->top, top, (size_t)nt * sizeof top[0]) != 0)
            bad++;
    }
    CHECK(bad == 0, "echo logprobs == tl_ctx_eval rows (%d differ)", bad);
    tl_sampler_free(smp);
    tl_ctx_free(ctx);
    srv_req_release(r);
    srv_sched_free(s);
}

static void test_limits(void) {
    srv_sched *s = NULL;
    srv_opts o = base_opts(1);
    o.max_queue = 2;
    CHECK(srv_sched_new(g_model, &o, NULL, &s, NULL) == 0, "sched new");
    if (!s) return;
    srv_req *big = make_req("hello", 600, 0.0f, 1);
    CHECK(srv_sched_submit(s, big, NULL, 0) == SRV_TOO_LONG, "too long");
    srv_req_release(big);

    /* One running (long), two waiting, the rest refused. */
    srv_req *r[6];
    int full = 0, ok = 0, rcs[6];
    for (int i = 0; i < 6; i++) {
        r[i] = make_req(prompts[i], i == 0 ? 400 : 4, 0.0f, 1);
        int rc = rcs[i] = srv_sched_submit(s, r[i], NULL, 0);
        ok += rc == SRV_OK;
        full += rc == SRV_QUEUE_FULL;
        if (i == 0) { /* let it start so it is running, not waiting */
            for (int t = 0; t < 200 && n_events(r[0]) == 0; t++) nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
    }
    CHECK(ok == 3 && full == 3, "queue full: ok %d full %d (want 3, 3)", ok, full);
    /* Cancel the long one: it ends with an ERROR and the waiting ones run. */
    atomic_store(&r[0]->cancelled, 1);
    CHECK(wait_done(r[0], 30), "cancelled finishes");
    CHECK(one_final(r[0]) && r[0]->ev[r[0]->n_ev - 1].kind == SRV_EV_ERROR, "cancel -> ERROR");
    for (int i = 1; i < 6; i++) {
        if (rcs[i] != SRV_OK) continue;
        CHECK(wait_done(r[i], 30) && one_final(r[i]), "waiting %d finishes once", i);
    }
    for (int t = 0; t < 100 && srv_sched_pending(s); t++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    CHECK(srv_sched_pending(s) == 0, "nothing pending");
    srv_sched_drain(s);
    srv_req *late = make_req("late", 4, 0.0f, 1);
    CHECK(srv_sched_submit(s, late, NULL, 0) == SRV_DRAINING, "draining refuses");
    srv_req_release(late);
    for (int i = 0; i < 6; i++) srv_req_release(r[i]);
    srv_sched_free(s);

    /* --max-queue counts requests beyond -np: with 2 slots and a queue of 1,
     * three long requests submitted at once are taken (their slots are free
     * though not yet filled), a fourth is refused, however far the scheduler
     * got with them. */
    {
        srv_opts o2 = base_opts(2);
        o2.max_queue = 1;
        srv_sched *s2 = NULL;
        CHECK(srv_sched_new(g_model, &o2, NULL, &s2, NULL) == 0, "sched new (2 slots)");
        if (s2) {
            srv_req *q[4];
            int taken = 0, refused = 0;
            for (int i = 0; i < 4; i++) {
                q[i] = make_req(prompts[i], 400, 0.0f, 1);
                const int rc = srv_sched_submit(s2, q[i], NULL, 0);
                taken += rc == SRV_OK;
                refused += rc == SRV_QUEUE_FULL;
            }
            CHECK(taken == 3 && refused == 1, "2 slots + queue 1: %d taken, %d refused (want 3, 1)", taken, refused);
            for (int i = 0; i < 4; i++) atomic_store(&q[i]->cancelled, 1);
            for (int t = 0; t < 300 && srv_sched_pending(s2); t++) nanosleep(&(struct timespec){0, 10000000}, NULL);
            CHECK(srv_sched_pending(s2) == 0, "2 slots: nothing pending after cancelling");
            srv_sched_free(s2);
            for (int i = 0; i < 4; i++) srv_req_release(q[i]);
        }
    }

    /* Freed while requests run and wait: each gets exactly one final event. */
    o.max_queue = 8;
    CHECK(srv_sched_new(g_model, &o, NULL, &s, NULL) == 0, "sched new 2");
    if (!s) return;
    srv_req *q[3];
    for (int i = 0; i < 3; i++) {
        q[i] = make_req(prompts[i], 300, 0.0f, 1);
        CHECK(srv_sched_submit(s, q[i], NULL, 0) == SRV_OK, "submit %d", i);
    }
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    srv_sched_free(s);
    for (int i = 0; i < 3; i++) {
        CHECK(q[i]->finished && one_final(q[i]), "shutdown %d: one final event", i);
        CHECK(atomic_load(&q[i]->refs) == 1, "shutdown %d: scheduler dropped its ref", i);
        srv_req_release(q[i]);
    }
}

/* Without max_tokens a request runs until prompt + completion fill -c. */
static void test_context_full(void) {
    srv_sched *s = NULL;
    srv_opts o = base_opts(2);
    o.n_ctx = 48;
    CHECK(srv_sched_new(g_model, &o, NULL, &s, NULL) == 0, "sched new");
    if (!s) return;
    srv_req *r = make_req("The quick brown fox jumps over the lazy dog. The quick brown fox", -1, 0.0f, 1);
    CHECK(srv_sched_submit(s, r, NULL, 0) == SRV_OK, "submit");
    CHECK(wait_done(r, 60) && one_final(r), "finishes once");
    const srv_event *last = &r->ev[r->n_ev - 1];
    CHECK(last->kind == SRV_EV_DONE, "DONE");
    if (last->kind == SRV_EV_DONE && !strcmp(last->finish_reason, "length"))
        CHECK(r->n_prompt + r->completion_tokens == 48, "fills the context: %d + %d", r->n_prompt,
              r->completion_tokens);
    else
        CHECK(last->kind == SRV_EV_DONE && !strcmp(last->finish_reason, "stop"), "else stops on EOG");
    srv_req_release(r);
    srv_sched_free(s);
}

/* A request that can never run is refused at submit, naming the limit, so the
 * HTTP side answers it 400 before a stream's 200 (not 503 + Retry-After,
 * which a proxy would replay on every replica); one that merely waits for
 * room is still queued. */
static void test_refusals(void) {
    srv_sched *s = NULL;
    srv_opts o = base_opts(1);
    o.n_ctx = 256;
    o.kv_mem_mib = 2; /* a few blocks of SmolLM2's 360 KiB: fewer positions than -c */
    CHECK(srv_sched_new(g_model, &o, NULL, &s, NULL) == 0, "sched new");
    if (!s) return;
    char why[256];
    srv_req *r = make_req("hello", 200, 0.0f, 1);
    int rc = srv_sched_submit(s, r, why, sizeof why);
    CHECK(rc == SRV_NO_KV && strstr(why, "KV cache") && strstr(why, "--kv-mem"),
          "more KV than the pool: %d '%s'", rc, why);
    srv_req_release(r);
    r = make_req("hello", -1, 0.0f, 1); /* no max_tokens: the whole context */
    rc = srv_sched_submit(s, r, why, sizeof why);
    CHECK(rc == SRV_NO_KV && strstr(why, "max_tokens"), "no max_tokens, more KV than the pool: %d '%s'", rc, why);
    srv_req_release(r);
    r = make_req("hello", 300, 0.0f, 1);
    rc = srv_sched_submit(s, r, why, sizeof why);
    CHECK(rc == SRV_TOO_LONG && strstr(why, "256 per sequence"), "beyond -c: %d '%s'", rc, why);
    srv_req_release(r);
    /* a grammar whose empty derivations multiply: past the matcher's limit */
    r = make_req("hello", 4, 0.0f, 1);
    tl_error err = {0};
    const char *g = "root ::= a a a a a a a a a a a a a a a a a a a a a a a a \"x\"\na ::= \"\" | \"\"\n";
    CHECK(r && tl_grammar_parse(g, strlen(g), &r->grammar, &err) == 0, "grammar: %s", err.msg);
    rc = srv_sched_submit(s, r, why, sizeof why);
    CHECK(rc == SRV_INVALID && strstr(why, "grammar"), "a grammar that cannot be followed: %d '%s'", rc, why);
    srv_req_release(r);
    r = make_req("hello", 4, 0.0f, 1);
    r->sp.top_p = -1.0f; /* what the API refuses; here the sampler's own check */
    rc = srv_sched_submit(s, r, why, sizeof why);
    CHECK(rc == SRV_INVALID && strstr(why, "top_p"), "sampling parameters: %d '%s'", rc, why);
    srv_req_release(r);
    r = make_req("hello", 8, 0.0f, 1); /* fits: runs */
    rc = srv_sched_submit(s, r, why, sizeof why);
    CHECK(rc == SRV_OK && wait_done(r, 60) && one_final(r) && r->ev[r->n_ev - 1].kind == SRV_EV_DONE,
          "a request that fits runs: %d", rc);
    srv_req_release(r);
    srv_sched_free(s);
}

/* An embedding request of texts, as embed.c makes it (pooling mean, normalized). */
static srv_req *make_embed(const char *const *texts, int n) {
    srv_req *r = srv_req_new();
    srv_embed *em = calloc(1, sizeof *em);
    if (!r || !em) {
        free(em);
        srv_req_release(r);
        return NULL;
    }
    r->kind = SRV_EMBED;
    r->emb = em;
    em->n = n;
    em->d = tl_model_n_embd(g_model);
    em->pooling = TL_POOL_MEAN;
    em->normalize = 1;
    em->tok = calloc((size_t)n, sizeof *em->tok);
    em->n_tok = calloc((size_t)n, sizeof *em->n_tok);
    em->off = calloc((size_t)n, sizeof *em->off);
    em->out = calloc((size_t)n * (size_t)em->d, sizeof *em->out);
    if (!em->tok || !em->n_tok || !em->off || !em->out) {
        srv_req_release(r);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        if (tl_tokenize(g_model, texts[i], strlen(texts[i]), TL_TOK_PARSE_SPECIAL, &em->tok[i], &k, NULL)) {
            srv_req_release(r);
            return NULL;
        }
        em->n_tok[i] = (int)k;
        em->off[i] = (size_t)i * (size_t)em->d;
    }
    return r;
}

/* Embedding requests run on the scheduler's context between decode steps:
 * their vectors equal tl_ctx_embed's on a context of their own, bit for bit,
 * and the completions decoding beside them keep their tokens; one longer
 * than the context is refused at submit; a cancelled one ends with ERROR. */
static void test_embed(void) {
    srv_metrics *mx = srv_metrics_new();
    srv_sched *s = NULL;
    srv_opts o = base_opts(2);
    o.n_ctx = 256;
    CHECK(srv_sched_new(g_model, &o, mx, &s, NULL) == 0, "sched new");
    if (!s) {
        srv_metrics_free(mx);
        return;
    }
    const int d = tl_model_n_embd(g_model);
    srv_req *ref = make_embed(prompts, N_PROMPTS);
    tl_ctx *ctx = NULL;
    tl_ctx_params cp = {.n_ctx = 256, .n_threads = 1, .n_batch = 7}; /* chunked: the same bits */
    CHECK(ref && tl_ctx_new(g_model, &cp, &ctx, NULL) == 0, "reference context");
    for (int i = 0; ref && ctx && i < N_PROMPTS; i++)
        CHECK(tl_ctx_embed(ctx, ref->emb->tok[i], (size_t)ref->emb->n_tok[i], TL_POOL_MEAN, 1,
                           ref->emb->out + (size_t)i * d, NULL) == 1, "reference embed %d", i);
    tl_ctx_free(ctx);
    srv_req *gen_alone = make_req(prompts[0], 24, 0.0f, 1), *gen = make_req(prompts[0], 24, 0.0f, 1);
    CHECK(srv_sched_submit(s, gen_alone, NULL, 0) == SRV_OK && wait_done(gen_alone, 60), "generation alone");
    srv_req *em[4];
    CHECK(srv_sched_submit(s, gen, NULL, 0) == SRV_OK, "generation beside embeddings");
    for (int k = 0; k < 4; k++) {
        em[k] = make_embed(prompts, N_PROMPTS);
        CHECK(em[k] && srv_sched_embed(s, em[k], NULL, 0) == SRV_OK, "embed submit %d", k);
    }
    for (int k = 0; k < 4; k++) {
        if (!em[k]) continue;
        CHECK(wait_done(em[k], 60) && one_final(em[k]) && em[k]->ev[em[k]->n_ev - 1].kind == SRV_EV_DONE,
              "embed %d done", k);
        CHECK(ref && !memcmp(em[k]->emb->out, ref->emb->out, (size_t)N_PROMPTS * d * sizeof(float)),
              "embed %d: tl_ctx_embed's bits", k);
        srv_req_release(em[k]);
    }
    CHECK(wait_done(gen, 60) && same_tokens(gen, gen_alone), "the generation beside them keeps its tokens");
    /* longer than the context: refused at submit, with why */
    char buf[4000];
    memset(buf, 0, sizeof buf);
    for (int i = 0; i + 6 < (int)sizeof buf - 1; i += 6) memcpy(buf + i, "hello ", 6);
    const char *longp[] = {buf};
    srv_req *lr = make_embed(longp, 1);
    char why[256];
    CHECK(lr && srv_sched_embed(s, lr, why, sizeof why) == SRV_TOO_LONG && strstr(why, "context"),
          "too long: %s", why);
    srv_req_release(lr);
    /* cancelled before it runs: an ERROR, nothing else */
    srv_req *c = make_embed(prompts, N_PROMPTS);
    if (c) atomic_store(&c->cancelled, 1);
    CHECK(c && srv_sched_embed(s, c, NULL, 0) == SRV_OK && wait_done(c, 60) && one_final(c) &&
              c->ev[c->n_ev - 1].kind == SRV_EV_ERROR, "cancelled embed: ERROR");
    srv_req_release(c);
    srv_req_release(ref);
    srv_req_release(gen);
    srv_req_release(gen_alone);
    srv_sched_free(s);
    srv_metrics_free(mx);
}

int main(void) {
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load(MODEL, &m, &err) != 0) {
        CHECK(0, "load %s: %s", MODEL, err.msg);
        return tl_test_summary();
    }
    g_model = m;
    double t0 = now_s();
    test_alone_vs_crowd();
    double t1 = now_s();
    test_echo();
    double t2 = now_s();
    test_limits();
    test_context_full();
    test_refusals();
    test_embed();
    printf("crowd %.1f s, echo %.1f s, limits %.1f s\n", t1 - t0, t2 - t1, now_s() - t2);
    tl_model_free(m);
    return tl_test_summary();
}
