/* test_trace: the loop's trace (src/trace/trace.c, docs/TRACE.md) of a
 * reasoning budget's close on SmolLM2. The loop feeds the close marker's
 * tokens after the last sampled one, as it would feed guesses, but they are
 * the loop's own: the records count them as forced, not as drafted, and a
 * run without speculation has no guesses in its trace at all (the live page
 * drew "xN rejected" for them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_test.h"
#include "tokenloop.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct seen {
    const tl_model *m;
    int records, verify, decode_multi, drafted, accepted, forced, forced_tokens, forced_in_json, bad_fed;
} seen;

static void on_record(const tl_trace_step *st, void *user) {
    seen *s = user;
    s->records++;
    for (int i = 0; i < st->n_seqs; i++) {
        const tl_trace_seq *q = &st->seqs[i];
        s->verify += q->phase == TL_PHASE_VERIFY;
        s->decode_multi += q->phase == TL_PHASE_DECODE && q->n_fed > 1;
        s->drafted += q->n_drafted;
        s->accepted += q->n_accepted;
        s->forced += q->n_forced;
        if (q->phase != TL_PHASE_PREFILL && q->n_fed != 1 + q->n_drafted + q->n_forced) s->bad_fed++;
        for (int j = 0; j < q->n_tokens; j++) s->forced_tokens += q->tokens[j].source == TL_SOURCE_FORCED;
    }
    char buf[16384];
    size_t n = tl_trace_json(st, s->m, buf, sizeof buf);
    const char *f = n < sizeof buf ? strstr(buf, "\"forced\":") : NULL;
    if (f && atoi(f + 9) > 0) s->forced_in_json++;
}

/* A token's text that is not UTF-8 in the JSON: one U+FFFD per maximal
 * subpart (as Python's decoder, browsers and the server's replies), valid
 * characters kept, escapes for quotes and control bytes. */
static void check_json_text(void) {
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"a\xe2\x82z", "a\\ufffdz"},              /* a character cut short: one */
        {"\xe2\x82\xac", "\xe2\x82\xac"},          /* the euro sign as it is */
        {"\xc0\xaf", "\\ufffd\\ufffd"},             /* an overlong slash: two */
        {"\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd"}, /* a surrogate: three */
        {"\xf0\x9f\x98", "\\ufffd"},                /* an emoji's first three bytes */
        {"\"\x01\xff", "\\\"\\u0001\\ufffd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tl_trace_token tok = {.token = -1, .text = cases[i].in, .text_len = strlen(cases[i].in)};
        tl_trace_seq q = {.tokens = &tok, .n_tokens = 1};
        tl_trace_step st = {.version = TL_TRACE_VERSION, .seqs = &q, .n_seqs = 1, .ttft_s = -1};
        char buf[2048], want[64];
        snprintf(want, sizeof want, "\"text\":\"%s\"}", cases[i].want);
        tl_trace_json(&st, NULL, buf, sizeof buf);
        CHECK(strstr(buf, want) != NULL, "trace JSON of case %zu: want %s in %s", i, want, buf);
    }
}

int main(void) {
    tl_model *m = NULL;
    tl_error err = {0};
    check_json_text();
    if (tl_model_load(MODEL, &m, &err)) {
        CHECK(0, "%s: %s (run make models)", MODEL, err.msg);
        return tl_test_summary();
    }
    const char *text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    int32_t *ids = NULL;
    size_t n = 0;
    tl_ctx *ctx = NULL;
    tl_sampler *smp = NULL;
    tl_tracer *tr = NULL;
    tl_sampler_params sp = tl_sampler_default_params();
    sp.temp = 0;
    tl_ctx_params cp = {.n_ctx = 256, .n_threads = 2};
    seen s = {.m = m};
    int rc = tl_tokenize(m, text, strlen(text), TL_TOK_PARSE_SPECIAL, &ids, &n, &err);
    if (!rc) rc = tl_ctx_new(m, &cp, &ctx, &err);
    if (!rc) rc = tl_sampler_new(&sp, tl_model_n_vocab(m), &smp, &err);
    if (!rc) rc = tl_tracer_new(ctx, on_record, &s, &tr, &err);
    /* the prompt opened the reasoning; after 3 tokens of it the loop closes it */
    tl_gen_params gp = {.n_predict = 24, .n_top = 5, .think_open = "<think>", .think_close = "</think>",
                        .think_started = 1, .think_budget = 3, .tracer = tr};
    tl_gen_stats st = {0};
    if (!rc) rc = tl_generate(ctx, smp, ids, n, &gp, &st, &err);
    CHECK(rc == 0, "generate: %s", err.msg);
    CHECK(st.n_reasoning >= 3 && st.n_gen > st.n_reasoning, "3 tokens of reasoning, then the close and the answer "
          "(%d of %d reasoning)", st.n_reasoning, st.n_gen);
    CHECK(s.forced_tokens >= 2, "the close was forced: %d forced tokens", s.forced_tokens);
    /* the close marker's tokens and the blank line after it are fed; once
     * the marker is whole, the loop draws the next token itself */
    CHECK(s.forced >= s.forced_tokens && s.decode_multi == 1 && s.forced_in_json == 1,
          "one decode step fed the close after the last token: %d forced fed (%d written), %d decode steps of "
          "several tokens, %d records with \"forced\" in their JSON", s.forced, s.forced_tokens, s.decode_multi,
          s.forced_in_json);
    CHECK(s.verify == 0 && s.drafted == 0 && s.accepted == 0 && st.n_drafted == 0,
          "no speculation, no guesses: %d verify records, %d drafted, %d kept", s.verify, s.drafted, s.accepted);
    CHECK(s.bad_fed == 0, "fed = 1 + drafted + forced outside prefill (%d records not)", s.bad_fed);
    tl_tracer_free(tr);
    tl_sampler_free(smp);
    tl_ctx_free(ctx);
    tl_free(ids);
    tl_model_free(m);
    return tl_test_summary();
}
