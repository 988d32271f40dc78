/* The header promises that every tl_error * is optional. Each public function
 * that takes one is called with NULL there, on an input that makes it fail
 * (so the error is written) and on one that succeeds. Each call runs in a
 * child process, so that a crash is reported as that call's failure and the
 * other calls are still checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tl_test.h"
#include "tokenloop.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define OTHER "models/gemma-3-270m-q4_k_m.gguf"

static tl_model *M, *M_OTHER;

/* Runs fn in a child; 1 if the child's checks held (it exits 0 for
 * "returned what was wanted"), 0 if it crashed or returned something else. */
#define CALL(what, expr)                                                                                     \
    do {                                                                                                     \
        fflush(NULL);                                                                                        \
        pid_t pid_ = fork();                                                                                 \
        if (pid_ == 0) _exit((expr) ? 0 : 1);                                                                \
        int ws_ = 0;                                                                                         \
        CHECK(pid_ > 0 && waitpid(pid_, &ws_, 0) == pid_ && WIFEXITED(ws_) && WEXITSTATUS(ws_) == 0,         \
              "%s with a NULL tl_error: %s", what,                                                           \
              pid_ <= 0 ? "fork failed" : WIFSIGNALED(ws_) ? strsignal(WTERMSIG(ws_)) : "wrong result");    \
    } while (0)

static int ctx_of(int n_seq_max, tl_ctx **ctx) {
    tl_ctx_params cp = {.n_ctx = 128, .n_threads = 1, .n_seq_max = n_seq_max};
    return tl_ctx_new(M, &cp, ctx, NULL);
}

static int model_calls(int ok) {
    tl_model *m = NULL;
    int rc = tl_model_load(ok ? MODEL : "models/no-such-file.gguf", &m, NULL);
    tl_model_free(m);
    return ok ? rc == TL_OK : rc == TL_ERR_IO;
}

static int vocab_calls(int ok) {
    tl_model *m = NULL;
    int rc = tl_model_load_vocab(ok ? MODEL : "models/no-such-file.gguf", &m, NULL);
    tl_model_free(m);
    return ok ? rc == TL_OK : rc == TL_ERR_IO;
}

static int describe_calls(int ok) {
    FILE *f = fopen("/dev/null", "w");
    int rc = tl_gguf_describe(ok ? MODEL : "models/no-such-file.gguf", f, NULL);
    if (f) fclose(f);
    return ok ? rc == TL_OK : rc != TL_OK;
}

static int tokenize_calls(int ok) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tl_tokenize(M, ok ? "Hello" : NULL, 5, 0, &ids, &n, NULL);
    tl_free(ids);
    return ok ? rc == TL_OK && n > 0 : rc == TL_ERR_ARG;
}

/* SmolLM2 has no rerank template: the pair as [BOS] query document; and no
 * classification head, so rank pooling fails (the error written nowhere). */
static int rerank_calls(int ok) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tl_rerank_tokens(M, ok ? "query" : NULL, 5, "doc", 3, &ids, &n, NULL);
    if (ok && (rc != TL_OK || n == 0)) {
        tl_free(ids);
        return 0;
    }
    tl_ctx *ctx = NULL;
    float score[4];
    int erc = ok ? ctx_of(1, &ctx) : TL_OK;
    if (ok && !erc) erc = tl_ctx_embed(ctx, ids, n, TL_POOL_RANK, 0, score, NULL);
    tl_ctx_free(ctx);
    tl_free(ids);
    return ok ? erc == TL_ERR_UNSUPPORTED && tl_model_n_cls_out(M) == 0 : rc == TL_ERR_ARG;
}

static int ctx_calls(int ok) {
    tl_ctx *ctx = NULL;
    tl_ctx_params cp = {.n_ctx = ok ? 64 : -5, .n_threads = 1};
    int rc = tl_ctx_new(M, &cp, &ctx, NULL);
    tl_ctx_free(ctx);
    return ok ? rc == TL_OK : rc != TL_OK;
}

static int eval_calls(int ok) {
    tl_ctx *ctx = NULL;
    if (ctx_of(0, &ctx)) return 0;
    const int32_t good[2] = {1, 2}, bad[2] = {1, 1 << 30};
    int rc = tl_ctx_eval(ctx, ok ? good : bad, 2, 0, NULL);
    int rc2 = tl_ctx_truncate(ctx, ok ? 1 : 99, NULL);
    tl_ctx_free(ctx);
    return ok ? rc == TL_OK && rc2 == TL_OK : rc == TL_ERR_ARG && rc2 == TL_ERR_ARG;
}

static int seq_calls(int ok) {
    tl_ctx *ctx = NULL;
    if (ctx_of(ok ? 1 : 0, &ctx)) return 0;
    int seq = 0, good = 1;
    int rc = tl_seq_open(ctx, &seq, NULL);
    if (!ok) {
        good = rc == TL_ERR_CONTEXT_FULL && tl_seq_truncate(ctx, 7, 0, NULL) == TL_ERR_ARG &&
               tl_seq_commit(ctx, 7, 1, NULL) == TL_ERR_ARG;
        const int32_t tok = 1, sq = 7;
        tl_batch b = {.n = 1, .token = &tok, .seq = &sq};
        good = good && tl_ctx_decode(ctx, &b, NULL) == TL_ERR_ARG;
    } else {
        const int32_t tok[2] = {1, 2}, sq[2] = {seq, seq};
        const uint8_t lg[2] = {0, 1};
        tl_batch b = {.n = 2, .token = tok, .seq = sq, .logits = lg, .pending = 1};
        good = rc == TL_OK && tl_ctx_decode(ctx, &b, NULL) == TL_OK && tl_seq_commit(ctx, seq, 2, NULL) == TL_OK &&
               tl_seq_truncate(ctx, seq, 1, NULL) == TL_OK;
    }
    tl_ctx_free(ctx);
    return good;
}

/* A sequence to a file and back, and the disk cache: an unwritable place
 * fails, a temporary one works. */
static int persist_calls(int ok) {
    tl_ctx *ctx = NULL;
    if (ctx_of(1, &ctx)) return 0;
    char dir[] = "/tmp/tl-api-null-XXXXXX", path[64];
    int good;
    if (!ok) {
        int n = 0;
        good = tl_ctx_save(ctx, 0, "/nonexistent/dir/s.kv", NULL) == TL_ERR_IO &&
               tl_ctx_load(ctx, 0, "/nonexistent/dir/s.kv", &n, NULL) == TL_ERR_IO &&
               tl_ctx_disk_cache(ctx, "/proc/tokenloop-cannot-be-here", 1 << 20, NULL, NULL, NULL) != TL_OK;
    } else {
        const int32_t tok[3] = {1, 2, 3};
        int n = 0;
        good = mkdtemp(dir) != NULL && snprintf(path, sizeof path, "%s/s.kv", dir) > 0 &&
               tl_ctx_eval(ctx, tok, 3, 0, NULL) == TL_OK && tl_ctx_save(ctx, 0, path, NULL) == TL_OK &&
               tl_ctx_load(ctx, 0, path, &n, NULL) == TL_OK && n == 3;
        unlink(path);
        good = good && tl_ctx_disk_cache(ctx, dir, 1 << 20, NULL, NULL, NULL) == TL_OK;
    }
    tl_ctx_free(ctx);
    if (ok) rmdir(dir);
    return good;
}

static int sampler_calls(int ok) {
    tl_sampler *s = NULL;
    tl_sampler_params sp = tl_sampler_default_params();
    if (!ok) sp.top_p = -1;
    int rc = tl_sampler_new(&sp, tl_model_n_vocab(M), &s, NULL);
    tl_sampler_free(s);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

static int grammar_calls(int ok) {
    const char *g = ok ? "root ::= \"yes\" | \"no\"" : "root ::= (";
    tl_grammar *gr = NULL;
    int rc = tl_grammar_parse(g, strlen(g), &gr, NULL);
    tl_grammar_free(gr);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

static int schema_calls(int ok) {
    const char *s = ok ? "{\"type\":\"integer\"}" : "{\"type\":\"string\",\"contentSchema\":{},\"pattern\":\"(?=a)\"}";
    char *gbnf = NULL;
    int rc = tl_json_schema_to_gbnf(s, strlen(s), &gbnf, NULL);
    tl_free(gbnf);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

static int schema_grammar_calls(int ok) {
    const char *s = ok ? "{\"type\":\"integer\"}" : "{\"type\":\"string\",\"pattern\":\"(?=a)\"}";
    tl_grammar *g = NULL;
    int rc = tl_grammar_from_json_schema(s, strlen(s), &g, NULL);
    tl_grammar_free(g);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

/* The trie and matcher fail only without memory: their success path, and
 * the matcher's refusals of tokens and text. */
static int matcher_calls(int ok) {
    const char *gs = "root ::= \"yes\"";
    tl_grammar *g = NULL;
    tl_vocab_trie *t = NULL;
    tl_matcher *m = NULL;
    int good = tl_grammar_parse(gs, strlen(gs), &g, NULL) == TL_OK && tl_vocab_trie_new(M, &t, NULL) == TL_OK &&
               tl_matcher_new(g, t, &m, NULL) == TL_OK && tl_matcher_allowed(m, NULL) != NULL &&
               tl_matcher_reset(m, NULL) == TL_OK;
    if (good && ok) good = tl_matcher_accept_bytes(m, "ye", 2, NULL) == TL_OK;
    if (good && !ok)
        good = tl_matcher_accept_bytes(m, "no", 2, NULL) == TL_ERR_ARG &&
               tl_matcher_accept(m, 1 << 30, NULL) == TL_ERR_ARG && tl_matcher_accept(m, tl_token_eos(M), NULL) == TL_ERR_ARG;
    tl_matcher_free(m);
    tl_vocab_trie_free(t);
    tl_grammar_free(g);
    return good;
}

static void on_record(const tl_trace_step *st, void *user) { (void)st, (void)user; }

static int tracer_calls(int ok) {
    tl_ctx *ctx = NULL;
    if (ctx_of(0, &ctx)) return 0;
    tl_tracer *tr = NULL;
    int rc = tl_tracer_new(ctx, ok ? on_record : NULL, NULL, &tr, NULL);
    tl_tracer_free(tr);
    tl_ctx_free(ctx);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

static int draft_calls(int ok) {
    int rc = tl_spec_check_draft(M, ok ? M : M_OTHER, NULL);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

static int gen_calls(int ok) {
    tl_gen *g = NULL;
    tl_gen_params gp = {.n_predict = 4, .n_stop = ok ? 0 : 1};
    int rc = tl_gen_new(M, &gp, &g, NULL);
    tl_gen_free(g);
    return ok ? rc == TL_OK : rc == TL_ERR_ARG;
}

/* The step: a sequence that is not open, a reasoning close marker too long
 * to force, rows that do not match what was fed; then a whole tl_generate. */
static int step_calls(int ok) {
    tl_ctx *ctx = NULL;
    tl_sampler *s = NULL;
    tl_sampler_params sp = tl_sampler_default_params();
    sp.temp = 0;
    if (ctx_of(0, &ctx) || tl_sampler_new(&sp, tl_model_n_vocab(M), &s, NULL)) return 0;
    tl_step *st = NULL;
    tl_gen_params gp = {.n_predict = 2};
    int good;
    const int32_t prompt[3] = {1, 2, 3};
    if (!ok) {
        static char long_close[200];
        memset(long_close, 'x', sizeof long_close - 1);
        tl_gen_params gt = gp;
        gt.think_open = "<think>";
        gt.think_close = long_close;
        good = tl_step_new(ctx, 5, s, &gp, &st, NULL) == TL_ERR_ARG && tl_step_new(ctx, 0, s, &gt, &st, NULL) == TL_ERR_ARG &&
               tl_generate(ctx, s, prompt, 0, &gp, NULL, NULL) == TL_ERR_ARG;
        if (good && tl_step_new(ctx, 0, s, &gp, &st, NULL) == TL_OK && tl_ctx_eval(ctx, prompt, 3, 0, NULL) == TL_OK) {
            const float *rows[2] = {tl_ctx_logits(ctx, -1), tl_ctx_logits(ctx, -1)};
            good = tl_step_take(st, rows, 2, NULL) == TL_ERR_ARG;
        } else {
            good = 0;
        }
    } else {
        tl_gen_stats stats;
        good = tl_step_new(ctx, 0, s, &gp, &st, NULL) == TL_OK && tl_generate(ctx, s, prompt, 3, &gp, &stats, NULL) == TL_OK &&
               stats.n_gen == 2;
    }
    tl_step_free(st);
    tl_sampler_free(s);
    tl_ctx_free(ctx);
    return good;
}

static int chat_calls(int ok) {
    const char *tmpl = ok ? "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                          : "{% for m in messages %}{{ raise_exception('no') }}{% endfor %}";
    const char *msgs = "[{\"role\":\"user\",\"content\":\"Hi\"}]";
    const tl_chat_msg cm[1] = {{"user", "Hi"}};
    char *out = NULL;
    size_t n = 0;
#define WANT(rc) (ok ? (rc) == TL_OK : (rc) < 0)
    int good = WANT(tl_chat_apply(M, tmpl, msgs, strlen(msgs), 1, &out, &n, NULL));
    tl_free(out);
    out = NULL;
    good = good && WANT(tl_chat_apply_msgs(M, tmpl, cm, 1, 1, &out, &n, NULL));
    tl_free(out);
    out = NULL;
    tl_chat_template *t = NULL;
    good = good && WANT(tl_chat_template_new(M, ok ? tmpl : "{% if %}", &t, NULL));
    tl_chat_template_free(t);
    t = NULL;
    if (good && tl_chat_template_new(M, tmpl, &t, NULL) == TL_OK) {
        good = WANT(tl_chat_template_render(t, ok ? msgs : "[{", ok ? strlen(msgs) : 2, 1, &out, &n, NULL));
        tl_free(out);
        out = NULL;
        good = good && WANT(tl_chat_template_render_msgs(t, cm, 1, 1, &out, &n, NULL));
        tl_free(out);
    } else {
        good = 0;
    }
    tl_chat_template_free(t);
    return good;
#undef WANT
}

int main(void) {
    tl_error err = {0};
    if (tl_model_load(MODEL, &M, &err) || tl_model_load_vocab(OTHER, &M_OTHER, &err)) {
        CHECK(0, "%s (run make models)", err.msg);
        return tl_test_summary();
    }
    static const struct {
        const char *name;
        int (*fn)(int ok);
    } calls[] = {
        {"tl_model_load", model_calls},
        {"tl_model_load_vocab", vocab_calls},
        {"tl_gguf_describe", describe_calls},
        {"tl_tokenize", tokenize_calls},
        {"tl_rerank_tokens, tl_ctx_embed (rank, no head)", rerank_calls},
        {"tl_ctx_new", ctx_calls},
        {"tl_ctx_eval, tl_ctx_truncate", eval_calls},
        {"tl_seq_open, tl_seq_truncate, tl_seq_commit, tl_ctx_decode", seq_calls},
        {"tl_ctx_save, tl_ctx_load, tl_ctx_disk_cache", persist_calls},
        {"tl_sampler_new", sampler_calls},
        {"tl_grammar_parse", grammar_calls},
        {"tl_json_schema_to_gbnf", schema_calls},
        {"tl_grammar_from_json_schema", schema_grammar_calls},
        {"tl_vocab_trie_new, tl_matcher_*", matcher_calls},
        {"tl_tracer_new", tracer_calls},
        {"tl_spec_check_draft", draft_calls},
        {"tl_gen_new", gen_calls},
        {"tl_step_new, tl_step_take, tl_generate", step_calls},
        {"tl_chat_*", chat_calls},
    };
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s, failing", calls[i].name);
        CALL(what, calls[i].fn(0));
        snprintf(what, sizeof what, "%s, succeeding", calls[i].name);
        CALL(what, calls[i].fn(1));
    }
    tl_model_free(M_OTHER);
    tl_model_free(M);
    return tl_test_summary();
}
