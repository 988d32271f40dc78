/* cli/run and cli/chat: the generation loop as a user drives it. Standard
 * output carries exactly the generated text, streamed; everything else
 * (stats, probabilities, warnings) goes to standard error. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "../server/wire.h"
#include "cli.h"
#include "trace_out.h"

#define MAX_STOPS 16

typedef struct run_opts {
    const char *model, *prompt, *prompt_file, *system, *draft, *grammar, *json_schema;
    const char *stop[MAX_STOPS];
    int n_stop;
    int n_predict, n_ctx, n_threads, n_batch, numerics, spec, kv_k, kv_v, swa_full;
    int chat, show_probs, print_ids, ignore_eos;
    int hide_thinking, think_budget; /* think_budget -1: none */
    const char *trace;   /* --trace FILE.jsonl */
    const char *session; /* chat --session FILE */
    int show_loop;
    tl_sampler_params sp;
} run_opts;

static const char RUN_HELP[] =
    "usage: tokenloop run [-m FILE] (-p PROMPT | -f FILE) [options]\n"
    "       tokenloop chat [-m FILE] [options]\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
    "                          or $TOKENLOOP_MODEL)\n"
    "  -p, --prompt TEXT       the prompt (special-token text like <|im_start|> is parsed)\n"
    "  -f, --file FILE         read the prompt from FILE ('-' for stdin)\n"
    "  -n, --n-predict N       max tokens to generate (default -1: until end or context full)\n"
    "  -c, --ctx-size N        context size in tokens (default: the training context when its\n"
    "                          KV fits 3/4 of the memory left, else the longest that does)\n"
    "  -t, --threads N         threads (default: all CPUs)\n"
    "  -b, --batch-size N      max tokens per forward call (default 512)\n"
    CLI_NUMERICS_HELP
    CLI_KV_TYPE_HELP
    CLI_SPEC_HELP
    "      --temp T            temperature (default 0.8; 0 = greedy argmax)\n"
    "      --top-k K           top-k (default 40; 0 = off)\n"
    "      --top-p P           top-p (default 0.95; 1 = off)\n"
    "      --min-p P           min-p (default 0.05; 0 = off)\n"
    "      --repeat-penalty R  repetition penalty (default 1.0 = off)\n"
    "      --repeat-last-n N   tokens the penalties look back on (default 64; -1 = all)\n"
    "      --frequency-penalty F, --presence-penalty P   (default 0 = off)\n"
    "      --seed S            RNG seed (default: random)\n"
    "      --stop STR          stop at STR (not printed); may be repeated\n"
    "      --grammar FILE      the output follows this GBNF grammar (llama.cpp's notation,\n"
    "                          start rule 'root'; docs/GRAMMAR.md): tokens it forbids are\n"
    "                          never drawn\n"
    "      --json-schema FILE  the output is JSON valid for this JSON Schema (the keywords\n"
    "                          docs/GRAMMAR.md lists; others are refused by name)\n"
    "      --chat              wrap the prompt in the model's chat template (run)\n"
    "      --system TEXT       system message for --chat and chat\n"
    "      --session FILE      chat: resume the conversation in FILE if it exists, and keep\n"
    "                          it there after every turn (its messages in FILE, the KV cache\n"
    "                          of them in FILE.kv, so resuming computes nothing again)\n"
    "      --ignore-eos        do not stop at end-of-generation tokens (for benchmarks)\n"
    "      --hide-thinking     do not print the model's reasoning (<think>...</think>, for\n"
    "                          models whose chat template uses it, and gpt-oss's analysis\n"
    "                          channel; shown dimmed otherwise)\n"
    "      --thinking-budget N the most reasoning tokens; then </think> is written for the model\n"
    "                          (not for gpt-oss, whose reasoning is a channel)\n"
    "      --show-probs        show each token's probability and the top 5 alternatives\n"
    "                          on stderr\n"
    "      --ids               print the generated token ids as a JSON array instead of text\n"
    "      --trace FILE        write one JSON line per forward call: the phase, each token with\n"
    "                          its probability, alternatives and source, time, bytes read,\n"
    "                          KV blocks, running totals (docs/TRACE.md; '-' for stdout)\n"
    "      --show-loop         print the same per call as a live table on stderr\n"
    "\n"
    "Generation stops at an end-of-generation token, a stop string, -n tokens or a\n"
    "full context. A stats line goes to stderr.\n";

/* Returns 0 on success, 1 if help was printed, -1 on a usage error. */
static int parse_run(int argc, char **argv, run_opts *o, int is_chat) {
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->think_budget = -1;
    o->spec = TL_SPEC_AUTO;
    o->sp = tl_sampler_default_params();
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        const char *v;
        int kt;
#define VAL() if (!(v = cli_arg(&p))) return -1
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(RUN_HELP, stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL(); o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            VAL(); o->prompt = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            VAL(); o->prompt_file = v;
        } else if (!strcmp(a, "--session") && is_chat) {
            VAL(); o->session = v;
        } else if (!strcmp(a, "--system")) {
            VAL(); o->system = v;
        } else if (!strcmp(a, "--draft")) {
            VAL(); o->draft = v;
        } else if (!strcmp(a, "--grammar")) {
            VAL(); o->grammar = v;
        } else if (!strcmp(a, "--json-schema")) {
            VAL(); o->json_schema = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VAL(); if (cli_int(a, v, -1, 1 << 30, &o->n_predict)) return -1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            VAL(); if (cli_int(a, v, 0, 1 << 22, &o->n_ctx)) return -1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL(); if (cli_int(a, v, 1, 1024, &o->n_threads)) return -1;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            VAL(); if (cli_int(a, v, 1, 1 << 20, &o->n_batch)) return -1;
        } else if (!strcmp(a, "--numerics")) {
            VAL(); if (cli_numerics(a, v, &o->numerics)) return -1;
        } else if ((kt = cli_kv_type_opt(&p, a, &o->kv_k, &o->kv_v)) != 0) {
            if (kt < 0) return -1;
        } else if (!strcmp(a, "--swa-full")) {
            o->swa_full = 1;
        } else if (!strcmp(a, "--spec")) {
            VAL(); if (cli_spec(a, v, &o->spec)) return -1;
        } else if (!strcmp(a, "--temp")) {
            VAL(); if (cli_float(a, v, &o->sp.temp)) return -1;
        } else if (!strcmp(a, "--top-k")) {
            VAL(); if (cli_int(a, v, -1, 1 << 30, &o->sp.top_k)) return -1;
        } else if (!strcmp(a, "--top-p")) {
            VAL(); if (cli_float(a, v, &o->sp.top_p)) return -1;
        } else if (!strcmp(a, "--min-p")) {
            VAL(); if (cli_float(a, v, &o->sp.min_p)) return -1;
        } else if (!strcmp(a, "--repeat-penalty")) {
            VAL(); if (cli_float(a, v, &o->sp.repeat_penalty)) return -1;
        } else if (!strcmp(a, "--repeat-last-n")) {
            VAL(); if (cli_int(a, v, -1, 1 << 30, &o->sp.penalty_last_n)) return -1;
        } else if (!strcmp(a, "--frequency-penalty")) {
            VAL(); if (cli_float(a, v, &o->sp.freq_penalty)) return -1;
        } else if (!strcmp(a, "--presence-penalty")) {
            VAL(); if (cli_float(a, v, &o->sp.presence_penalty)) return -1;
        } else if (!strcmp(a, "--seed")) {
            VAL(); if (cli_u64(a, v, &o->sp.seed)) return -1;
        } else if (!strcmp(a, "--stop")) {
            VAL();
            if (o->n_stop == MAX_STOPS) {
                cli_error("at most %d --stop strings", MAX_STOPS);
                return -1;
            }
            if (!*v) {
                cli_error("--stop: empty string");
                return -1;
            }
            o->stop[o->n_stop++] = v;
        } else if (!strcmp(a, "--chat") && !is_chat) {
            o->chat = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
        } else if (!strcmp(a, "--hide-thinking")) {
            o->hide_thinking = 1;
        } else if (!strcmp(a, "--thinking-budget")) {
            VAL(); if (cli_int(a, v, 0, 1 << 30, &o->think_budget)) return -1;
        } else if (!strcmp(a, "--trace")) {
            VAL(); o->trace = v;
        } else if (!strcmp(a, "--show-loop")) {
            o->show_loop = 1;
        } else if (!strcmp(a, "--show-probs")) {
            o->show_probs = 1;
        } else if (!strcmp(a, "--ids") && !is_chat) {
            o->print_ids = 1;
        } else {
            cli_error("unknown option '%s' (try 'tokenloop %s --help')", a, argv[0]);
            return -1;
        }
#undef VAL
    }
    if (more < 0) return -1;
    return 0;
}

/* ---- chat formatting: the model's own template (src/chat/ renders it). */

typedef struct text {
    char *s;
    size_t n, cap;
} text;

static int text_add(text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        size_t nc = (t->n + n + 1) * 2;
        char *ns = realloc(t->s, nc);
        if (!ns) return -1;
        t->s = ns;
        t->cap = nc;
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = 0;
    return 0;
}

static int chat_check_template(const tl_model *m) {
    if (!tl_model_chat_template(m)) {
        cli_error("this model has no chat template (a base model?); use plain 'run' without --chat");
        return -1;
    }
    return 0;
}

/* ---- streaming output ---- */

typedef struct out_state {
    const tl_model *m;
    const run_opts *o;
    int n_ids;
    text *answer;   /* chat: the generated text, to put back into the conversation */
    int32_t *gen;   /* chat: the generated tokens, to know what the cache holds */
    size_t n_gen, cap_gen;
    int oom;
    int tty;            /* stdout is a terminal (reasoning shown dimmed) */
    int think, think_started; /* the model reasons in <think>...</think>; the prompt opened it */
    int harmony;        /* gpt-oss: the reply's channels go through the harmony parser */
    tl_harmony *hm;
} out_state;

/* Reasoning markers for a model whose template speaks of <think>; whether
 * the prompt text already opened the reasoning. */
static void think_setup(out_state *os, const char *prompt, size_t len) {
    const char *tmpl = tl_model_chat_template(os->m);
    os->tty = isatty(1);
    const char *open, *close;
    os->harmony = tl_chat_harmony(tmpl);
    os->think = !os->harmony && tl_chat_think_markers(tmpl, &open, &close);
    os->think_started = os->think && tl_chat_think_started(prompt, len);
}

/* Text shown as it comes: reasoning dimmed on a terminal (or hidden), the
 * answer as is. */
static void show_text(const out_state *os, const char *t, size_t n, int reasoning) {
    if (!n || (reasoning && os->o->hide_thinking)) return;
    const int dim = reasoning && os->tty;
    if (dim) fputs("\033[2m", stdout);
    fwrite(t, 1, n, stdout);
    if (dim) fputs("\033[0m", stdout);
    fflush(stdout);
}

/* A harmony reply's pieces: analysis as reasoning, final as the answer (all
 * chat keeps of the turn), a tool call as a line naming it. */
static int harmony_piece(void *user, int kind, const char *name, const char *piece, size_t n) {
    out_state *os = user;
    if (kind == TL_HARMONY_REASONING) {
        show_text(os, piece, n, 1);
    } else if (kind == TL_HARMONY_CONTENT) {
        show_text(os, piece, n, 0);
        if (os->answer && text_add(os->answer, piece, n)) os->oom = 1;
    } else {
        printf("\n[tool call %s: %.*s]\n", name ? name : "?", (int)n, piece);
        fflush(stdout);
    }
    return 0;
}

static void show_probs(const out_state *os, const tl_gen_event *ev) {
    char piece[256];
    size_t n = tl_token_piece(os->m, ev->token, 1, piece, sizeof piece - 1);
    piece[n < sizeof piece - 1 ? n : sizeof piece - 1] = 0;
    for (char *c = piece; *c; c++)
        if (*c == '\n') *c = ' ';
    fprintf(stderr, "\n[%6d %-14s p=%.4f | top:", ev->token, piece, ev->chosen.prob);
    for (int i = 0; i < ev->n_top && i < 5; i++) {
        char alt[64];
        size_t an = tl_token_piece(os->m, ev->top[i].token, 1, alt, sizeof alt - 1);
        alt[an < sizeof alt - 1 ? an : sizeof alt - 1] = 0;
        for (char *c = alt; *c; c++)
            if (*c == '\n') *c = ' ';
        fprintf(stderr, " '%s' %.3f", alt, ev->top[i].prob);
    }
    fputs("]\n", stderr);
}

static int on_token(const tl_gen_event *ev, void *user) {
    out_state *os = user;
    if (os->o->print_ids) {
        /* an end token that ends the answer is not part of it; under
         * --ignore-eos it is a token like any other, fed back and printed */
        if (ev->token >= 0 && (os->o->ignore_eos || !tl_token_is_eog(os->m, ev->token)))
            printf("%s%d", os->n_ids++ ? "," : "[", ev->token);
        return 0;
    }
    if (os->o->show_probs && ev->token >= 0) show_probs(os, ev);
    if (os->answer && !os->harmony && ev->text_len && text_add(os->answer, ev->text, ev->text_len)) os->oom = 1;
    if (os->answer && ev->token >= 0) {
        if (os->n_gen == os->cap_gen) {
            size_t nc = os->cap_gen ? os->cap_gen * 2 : 256;
            int32_t *ng = realloc(os->gen, nc * sizeof *ng);
            if (!ng) {
                os->oom = 1;
                return 1;
            }
            os->gen = ng;
            os->cap_gen = nc;
        }
        os->gen[os->n_gen++] = ev->token;
    }
    if (os->harmony) {
        if (!os->hm) {
            tl_error err = {0};
            if (tl_harmony_new(&os->hm, &err)) {
                os->oom = 1;
                return 1;
            }
        }
        return ev->text_len ? tl_harmony_feed(os->hm, ev->text, ev->text_len, 0, harmony_piece, os) : 0;
    }
    show_text(os, ev->text, ev->text_len, ev->reasoning);
    return 0;
}

static void print_stats(const tl_gen_stats *st, const tl_ctx *ctx) {
    static const char *reasons[] = {"none", "end of generation", "stop string", "length limit",
                                    "context full", "callback"};
    fprintf(stderr,
            "\n[prompt %d tokens, prefill %.1f ms (%.1f tok/s), first token %.1f ms | "
            "generated %d tokens, %.1f tok/s | speculative: %d drafted, %d accepted | stop: %s | %s, %s numerics]\n",
            st->n_prompt, st->prefill_s * 1e3, st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0,
            st->ttft_s * 1e3, st->n_gen,
            st->decode_s > 0 && st->n_gen > 1 ? (st->n_gen - 1) / st->decode_s : 0, st->n_drafted,
            st->n_accepted, reasons[st->stop], tl_ctx_backend(ctx), tl_ctx_numerics(ctx));
    if (st->n_masks)
        fprintf(stderr, "[grammar: %d masks, median %.1f us, total %.1f ms]\n", st->n_masks, st->mask_median_us,
                st->mask_s * 1e3);
    if (st->n_reasoning) fprintf(stderr, "[reasoning: %d tokens]\n", st->n_reasoning);
    if (st->stop == TL_STOP_CONTEXT)
        fprintf(stderr, "tokenloop: warning: the context is full (%d tokens); raise -c to go on\n",
                tl_ctx_n_ctx(ctx));
}

typedef struct session {
    tl_model *m, *dm;
    tl_ctx *ctx, *dctx; /* dctx: the draft model's, on ctx's threads */
    tl_sampler *smp;
    tl_grammar *grammar; /* --grammar, and its matcher over the model's vocabulary */
    tl_vocab_trie *trie;
    tl_matcher *matcher;
    tl_chat_template *tmpl; /* the model's, compiled at the first chat turn */
    cli_trace trace;        /* --trace, --show-loop */
    tl_tracer *tracer;      /* one for the session: chat turns number on */
} session;

static void session_free(session *s) {
    tl_tracer_free(s->tracer);
    if (s->trace.file && s->trace.file != stdout) fclose(s->trace.file);
    free(s->trace.buf);
    tl_chat_template_free(s->tmpl);
    tl_matcher_free(s->matcher);
    tl_vocab_trie_free(s->trie);
    tl_grammar_free(s->grammar);
    tl_sampler_free(s->smp);
    tl_ctx_free(s->dctx); /* before ctx: it runs on ctx's thread pool */
    tl_model_free(s->dm);
    tl_ctx_free(s->ctx);
    tl_model_free(s->m);
}

/* Renders the conversation with the model's template, generation prompt on. */
static char *chat_render(session *s, const tl_chat_msg *msgs, size_t n, size_t *len) {
    tl_error err = {0};
    char *out = NULL;
    if ((!s->tmpl && tl_chat_template_new(s->m, NULL, &s->tmpl, &err)) ||
        tl_chat_template_render_msgs(s->tmpl, msgs, n, 1, &out, len, &err)) {
        cli_tl_error(&err);
        return NULL;
    }
    return out;
}

static int session_open(session *s, const run_opts *o) {
    char buf[4096];
    tl_error err = {0};
    memset(s, 0, sizeof *s);
    const char *path = o->model ? o->model : cli_default_model(buf, sizeof buf);
    if (tl_model_load(path, &s->m, &err)) {
        cli_error("%s: %s", path, err.msg);
        if (!o->model) fputs("tokenloop: hint: run 'make models' to fetch the default model\n", stderr);
        return -1;
    }
    tl_ctx_params cp = {.n_ctx = o->n_ctx, .n_threads = o->n_threads, .n_batch = o->n_batch, .numerics = o->numerics,
                        .kv_type_k = o->kv_k, .kv_type_v = o->kv_v, .swa_full = o->swa_full};
    cli_kv_type_warn(o->kv_k, o->kv_v);
    if (tl_ctx_new(s->m, &cp, &s->ctx, &err) ||
        tl_sampler_new(&o->sp, tl_model_n_vocab(s->m), &s->smp, &err)) {
        cli_tl_error(&err);
        session_free(s);
        return -1;
    }
    if (o->spec == TL_SPEC_DRAFT && !o->draft) {
        cli_error("--spec draft needs --draft FILE");
        session_free(s);
        return -1;
    }
    s->trace.model = s->m;
    s->trace.show = o->show_loop;
    if (o->trace && !(s->trace.file = strcmp(o->trace, "-") ? fopen(o->trace, "w") : stdout)) {
        cli_error("--trace %s: cannot write: %s", o->trace, strerror(errno));
        session_free(s);
        return -1;
    }
    if ((s->trace.file || s->trace.show) && tl_tracer_new(s->ctx, cli_trace_record, &s->trace, &s->tracer, &err)) {
        cli_tl_error(&err);
        session_free(s);
        return -1;
    }
    if (o->grammar && o->json_schema) {
        cli_error("give --grammar or --json-schema, not both");
        session_free(s);
        return -1;
    }
    if (o->grammar || o->json_schema) {
        const char *file = o->grammar ? o->grammar : o->json_schema;
        size_t len;
        char *g = cli_read_file(file, &len);
        if (!g) {
            session_free(s);
            return -1;
        }
        int rc = (o->grammar ? tl_grammar_parse(g, len, &s->grammar, &err)
                             : tl_grammar_from_json_schema(g, len, &s->grammar, &err)) ||
                 tl_vocab_trie_new(s->m, &s->trie, &err) || tl_matcher_new(s->grammar, s->trie, &s->matcher, &err);
        free(g);
        if (rc) {
            cli_error("%s %s: %s", o->grammar ? "--grammar" : "--json-schema", file, err.msg);
            session_free(s);
            return -1;
        }
    }
    if (o->draft && o->spec != TL_SPEC_OFF && o->spec != TL_SPEC_NGRAM) {
        tl_ctx_params dp = {.n_ctx = tl_ctx_n_ctx(s->ctx), .n_batch = o->n_batch, .numerics = o->numerics,
                            .share_threads = s->ctx, .swa_full = o->swa_full};
        if (tl_model_load(o->draft, &s->dm, &err) || tl_spec_check_draft(s->m, s->dm, &err) ||
            tl_ctx_new(s->dm, &dp, &s->dctx, &err)) {
            cli_error("--draft %s: %s", o->draft, err.msg);
            session_free(s);
            return -1;
        }
    }
    return 0;
}

/* Runs the generation loop on prompt tokens; os collects what chat needs. */
static int generate_ids(session *s, const run_opts *o, const int32_t *ids, size_t n, int cached, out_state *os,
                        tl_gen_stats *st) {
    tl_error err = {0};
    const int traced = s->tracer != NULL;
    tl_gen_params gp = {.n_predict = o->n_predict, .stop = o->stop, .n_stop = o->n_stop,
                        .n_top = o->show_probs || traced ? 5 : 0, .ignore_eog = o->ignore_eos,
                        .on_token = on_token, .user = os, .spec = o->spec, .draft_ctx = s->dctx,
                        .grammar = s->matcher, .think_budget = o->think_budget,
                        .tracer = s->tracer, .trace_cached = cached};
    if (os->think) {
        tl_chat_think_markers(tl_model_chat_template(s->m), &gp.think_open, &gp.think_close);
        gp.think_started = os->think_started;
    } else if (os->harmony) { /* the analysis message, counted as reasoning; no budget */
        gp.think_open = TL_HARMONY_THINK_OPEN;
        gp.think_close = TL_HARMONY_THINK_CLOSE;
        gp.think_budget = -1;
    }
    int rc = s->matcher ? tl_matcher_reset(s->matcher, &err) : 0; /* each reply starts the grammar over */
    if (!rc) rc = tl_generate(s->ctx, s->smp, ids, n, &gp, st, &err);
    if (os->hm) { /* what the parser held goes out (a call cut short by <|call|>) */
        if (!rc && !os->oom) tl_harmony_feed(os->hm, "", 0, 1, harmony_piece, os);
        tl_harmony_free(os->hm);
        os->hm = NULL;
    }
    if (o->print_ids) printf("%s]\n", os->n_ids ? "" : "[");
    if (os->oom) {
        fflush(stdout);
        cli_error("out of memory");
        return -1;
    }
    if (rc) {
        fflush(stdout);
        cli_tl_error(&err);
        return -1;
    }
    return 0;
}

static int generate_text(session *s, const run_opts *o, const char *prompt, size_t len, int add_bos,
                         tl_gen_stats *st) {
    tl_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int flags = TL_TOK_PARSE_SPECIAL | (add_bos ? TL_TOK_ADD_BOS : 0);
    if (tl_tokenize(s->m, prompt, len, flags, &ids, &n, &err)) {
        cli_tl_error(&err);
        return -1;
    }
    if (n == 0) {
        tl_free(ids);
        cli_error("the prompt is empty");
        return -1;
    }
    out_state os = {.m = s->m, .o = o};
    think_setup(&os, prompt, len);
    int rc = generate_ids(s, o, ids, n, 0, &os, st);
    tl_free(ids);
    return rc;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int pr = parse_run(argc, argv, &o, 0);
    if (pr) return pr > 0 ? 0 : EXIT_USAGE;
    if (!o.prompt == !o.prompt_file) {
        cli_error("give exactly one of -p PROMPT or -f FILE (try 'tokenloop run --help')");
        return EXIT_USAGE;
    }
    char *owned = NULL;
    size_t plen;
    const char *prompt = o.prompt;
    if (o.prompt_file) {
        if (!(owned = cli_read_file(o.prompt_file, &plen))) return 1;
        prompt = owned;
    } else {
        plen = strlen(prompt);
    }
    session s;
    if (session_open(&s, &o)) {
        free(owned);
        return 1;
    }
    int rc = 0, add_bos = tl_model_add_bos(s.m);
    char *rendered = NULL;
    if (o.chat) {
        tl_chat_msg msgs[2] = {{"system", o.system}, {"user", prompt}};
        if (chat_check_template(s.m) ||
            !(rendered = chat_render(&s, o.system ? msgs : msgs + 1, o.system ? 2 : 1, &plen)))
            rc = 1;
        else {
            prompt = rendered;
            add_bos = tl_chat_add_bos(s.m, rendered);
        }
    }
    tl_gen_stats st = {0};
    if (!rc) rc = generate_text(&s, &o, prompt, plen, add_bos, &st) ? 1 : 0;
    if (!rc) {
        if (!o.print_ids) putchar('\n');
        fflush(stdout);
        print_stats(&st, s.ctx);
    }
    tl_free(rendered);
    free(owned);
    session_free(&s);
    return rc;
}

/* The conversation so far and the tokens the KV cache holds for it. */
typedef struct convo {
    tl_chat_msg *msgs;
    char **owned; /* message texts we allocated */
    size_t n, cap;
    int32_t *cached;
    size_t n_cached;
} convo;

static int convo_add(convo *c, const char *role, char *content) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 16;
        tl_chat_msg *nm = realloc(c->msgs, nc * sizeof *nm);
        if (!nm) return -1;
        c->msgs = nm;
        char **no = realloc(c->owned, nc * sizeof *no);
        if (!no) return -1;
        c->owned = no;
        c->cap = nc;
    }
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = content;
    c->owned[c->n++] = content;
    return 0;
}

static void convo_free(convo *c) {
    for (size_t i = 0; i < c->n; i++) free(c->owned[i]);
    free(c->msgs);
    free(c->owned);
    tl_free(c->cached);
}

/* One turn: renders the whole conversation, keeps the cached tokens the new
 * rendering shares (truncating the cache at the first difference) and
 * evaluates only the rest. */
static int chat_turn(session *s, const run_opts *o, convo *c, text *answer, tl_gen_stats *st) {
    size_t len = 0, n = 0;
    char *rendered = chat_render(s, c->msgs, c->n, &len);
    if (!rendered) return -1;
    tl_error err = {0};
    int32_t *ids = NULL;
    int flags = TL_TOK_PARSE_SPECIAL | (tl_chat_add_bos(s->m, rendered) ? TL_TOK_ADD_BOS : 0);
    int rc = tl_tokenize(s->m, rendered, len, flags, &ids, &n, &err);
    out_state probe = {.m = s->m};
    think_setup(&probe, rendered, len); /* whether this turn's prompt opened the reasoning */
    tl_free(rendered);
    if (rc) {
        cli_tl_error(&err);
        return -1;
    }
    size_t keep = 0;
    while (keep < c->n_cached && keep < n && c->cached[keep] == ids[keep]) keep++;
    if (keep == n && n) keep--; /* the last token must be evaluated again for its logits */
    if (n == 0 || tl_ctx_truncate(s->ctx, (int)keep, &err)) {
        if (n == 0) cli_error("the prompt is empty");
        else cli_tl_error(&err);
        tl_free(ids);
        return -1;
    }
    out_state os = {.m = s->m, .o = o, .answer = answer, .tty = probe.tty, .think = probe.think,
                    .think_started = probe.think_started, .harmony = probe.harmony};
    rc = generate_ids(s, o, ids + keep, n - keep, (int)keep, &os, st);
    /* What the cache holds now: the prompt, then the generated tokens it evaluated. */
    size_t past = (size_t)tl_ctx_n_past(s->ctx), total = n + os.n_gen;
    int32_t *all = rc ? NULL : malloc((total ? total : 1) * sizeof *all);
    if (all) {
        memcpy(all, ids, n * sizeof *all);
        if (os.n_gen) memcpy(all + n, os.gen, os.n_gen * sizeof *all);
    }
    tl_free(ids);
    free(os.gen);
    tl_free(c->cached);
    c->cached = all;
    c->n_cached = all ? (past < total ? past : total) : 0;
    if (!rc && !all) {
        cli_error("out of memory");
        return -1;
    }
    return rc;
}

/* ---- chat --session: the conversation in FILE (JSON), its KV in FILE.kv ---- */

static const char *role_lit(const char *r) {
    static const char *const roles[] = {"system", "user", "assistant"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(r, roles[i])) return roles[i];
    return NULL;
}

/* Reads FILE's messages into c and FILE.kv into the context; a missing FILE
 * is a new session. The KV is optional: without it (or from another model
 * or setting) the next turn computes the conversation again. */
static int session_resume(session *s, const char *path, convo *c) {
    if (access(path, F_OK)) return 0;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *msgs = root ? json_object_get(root, "messages") : NULL;
    if (!json_is_array(msgs)) {
        cli_error("--session %s: not a tokenloop chat session (%s)", path, root ? "no messages" : je.text);
        json_decref(root);
        return -1;
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *r = json_string_value(json_object_get(m, "role"));
        const char *role = r ? role_lit(r) : NULL;
        const char *content = json_string_value(json_object_get(m, "content"));
        char *dup = role && content ? strdup(content) : NULL;
        if (!dup || convo_add(c, role, dup)) {
            free(dup);
            cli_error("--session %s: message %zu is not a system, user or assistant message with content", path, i);
            json_decref(root);
            return -1;
        }
    }
    json_decref(root);
    char kvp[4096];
    snprintf(kvp, sizeof kvp, "%s.kv", path);
    tl_error err = {0};
    int n = 0, nt = 0;
    if (tl_ctx_load(s->ctx, 0, kvp, &n, &err)) {
        fprintf(stderr, "tokenloop chat: %s: %s; the conversation is computed again\n", kvp, err.msg);
    } else {
        const int32_t *tok = tl_seq_tokens(s->ctx, 0, &nt);
        c->cached = malloc((size_t)(nt ? nt : 1) * sizeof *c->cached);
        if (!c->cached) {
            cli_error("out of memory");
            return -1;
        }
        memcpy(c->cached, tok, (size_t)nt * sizeof *tok);
        c->n_cached = (size_t)nt;
    }
    fprintf(stderr, "tokenloop chat: resumed %s: %zu messages, %d positions of KV cache from %s\n", path, c->n, n,
            kvp);
    return 0;
}

/* FILE and FILE.kv after a turn, each written whole and renamed. */
static int session_store(session *s, const char *path, const convo *c) {
    json_t *root = json_object(), *msgs = json_array();
    for (size_t i = 0; root && msgs && i < c->n; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string(c->msgs[i].role));
        /* a reply cut inside a character (the length limit), or a model's
         * stray bytes, is not JSON's UTF-8: each bad byte is kept as U+FFFD
         * (the next turn renders that, and its KV from there is recomputed) */
        char *fixed = api_utf8_fix(c->msgs[i].content, strlen(c->msgs[i].content), NULL);
        json_object_set_new(m, "content", fixed ? json_string(fixed) : NULL);
        free(fixed);
        json_array_append_new(msgs, m);
    }
    json_object_set_new(root, "messages", msgs);
    char tmp[4096], kvp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(kvp, sizeof kvp, "%s.kv", path);
    int ok = root && msgs && !json_dump_file(root, tmp, JSON_INDENT(1)) && !rename(tmp, path);
    json_decref(root);
    if (!ok) {
        cli_error("--session %s: cannot write it: %s", path, strerror(errno));
        return -1;
    }
    tl_error err = {0};
    if (tl_ctx_save(s->ctx, 0, kvp, &err)) {
        cli_error("--session %s: %s", path, err.msg);
        return -1;
    }
    return 0;
}

int cmd_chat(int argc, char **argv) {
    run_opts o;
    int pr = parse_run(argc, argv, &o, 1);
    if (pr) return pr > 0 ? 0 : EXIT_USAGE;
    session s;
    if (session_open(&s, &o)) return 1;
    if (chat_check_template(s.m)) {
        session_free(&s);
        return 1;
    }
    convo c = {0};
    int rc = 0;
    if (o.session && session_resume(&s, o.session, &c)) rc = 1;
    if (!rc && o.system && c.n == 0) { /* a resumed conversation keeps its own */
        char *sys = strdup(o.system);
        if (!sys || convo_add(&c, "system", sys)) {
            free(sys);
            cli_error("out of memory");
            rc = 1;
        }
    }
    if (!rc) fprintf(stderr, "tokenloop chat: type a message and press Enter; Ctrl-D ends.\n");
    char line[16384];
    while (!rc) {
        fputs("> ", stderr);
        if (!fgets(line, sizeof line, stdin)) break;
        size_t ln = strlen(line);
        while (ln && (line[ln - 1] == '\n' || line[ln - 1] == '\r')) line[--ln] = 0;
        if (!ln) continue;
        char *user = strdup(line);
        if (!user || convo_add(&c, "user", user)) {
            free(user);
            cli_error("out of memory");
            rc = 1;
            break;
        }
        text answer = {0};
        tl_gen_stats st = {0};
        if (chat_turn(&s, &o, &c, &answer, &st)) {
            free(answer.s);
            rc = 1;
            break;
        }
        char *reply = answer.s ? answer.s : strdup("");
        if (!reply || convo_add(&c, "assistant", reply)) {
            free(reply);
            cli_error("out of memory");
            rc = 1;
            break;
        }
        putchar('\n');
        fflush(stdout);
        print_stats(&st, s.ctx);
        if (o.session && session_store(&s, o.session, &c)) {
            rc = 1;
            break;
        }
        if (st.stop == TL_STOP_CONTEXT) break;
    }
    convo_free(&c);
    session_free(&s);
    return rc;
}
