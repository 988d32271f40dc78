/* cli/run and cli/chat: the generation loop as a user drives it. Standard
 * output carries exactly the generated text, streamed; everything else
 * (stats, probabilities, warnings) goes to standard error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_STOPS 16

typedef struct run_opts {
    const char *model, *prompt, *prompt_file, *system;
    const char *stop[MAX_STOPS];
    int n_stop;
    int n_predict, n_ctx, n_threads, n_batch;
    int chat, show_probs, print_ids, ignore_eos;
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
    "  -c, --ctx-size N        context size in tokens (default: min(training context, 4096))\n"
    "  -t, --threads N         threads (default: all CPUs)\n"
    "  -b, --batch-size N      max tokens per forward call (default 512)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy argmax)\n"
    "      --top-k K           top-k (default 40; 0 = off)\n"
    "      --top-p P           top-p (default 0.95; 1 = off)\n"
    "      --min-p P           min-p (default 0.05; 0 = off)\n"
    "      --repeat-penalty R  repetition penalty (default 1.0 = off)\n"
    "      --repeat-last-n N   tokens the penalties look back on (default 64; -1 = all)\n"
    "      --frequency-penalty F, --presence-penalty P   (default 0 = off)\n"
    "      --seed S            RNG seed (default: random)\n"
    "      --stop STR          stop at STR (not printed); may be repeated\n"
    "      --chat              wrap the prompt in the model's chat template (run)\n"
    "      --system TEXT       system message for --chat and chat\n"
    "      --ignore-eos        do not stop at end-of-generation tokens (for benchmarks)\n"
    "      --show-probs        show each token's probability and the top 5 alternatives\n"
    "                          on stderr\n"
    "      --ids               print the generated token ids as a JSON array instead of text\n"
    "\n"
    "Generation stops at an end-of-generation token, a stop string, -n tokens or a\n"
    "full context. A stats line goes to stderr.\n";

/* Returns 0 on success, 1 if help was printed, -1 on a usage error. */
static int parse_run(int argc, char **argv, run_opts *o, int is_chat) {
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->sp = tl_sampler_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() if (!(v = cli_value(argc, argv, &i))) return -1
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(RUN_HELP, stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL(); o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            VAL(); o->prompt = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            VAL(); o->prompt_file = v;
        } else if (!strcmp(a, "--system")) {
            VAL(); o->system = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VAL(); if (cli_int(a, v, -1, 1 << 30, &o->n_predict)) return -1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            VAL(); if (cli_int(a, v, 0, 1 << 22, &o->n_ctx)) return -1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL(); if (cli_int(a, v, 1, 1024, &o->n_threads)) return -1;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            VAL(); if (cli_int(a, v, 1, 1 << 20, &o->n_batch)) return -1;
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
    return 0;
}

/* ---- chat formatting: ChatML, the format of SmolLM2's template. A general
 * Jinja renderer replaces this (next issue); until then other templates are
 * refused rather than rendered wrongly. */

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
static int text_puts(text *t, const char *s) { return text_add(t, s, strlen(s)); }

/* The template's built-in system message, used when the caller gives none. */
static int chatml_default_system(const char *tpl, text *out) {
    const char *open = "<|im_start|>system\n";
    const char *p = strstr(tpl, open);
    if (!p) return 0;
    p += strlen(open);
    const char *e = strstr(p, "<|im_end|>");
    if (!e || memchr(p, '{', (size_t)(e - p))) return 0; /* not a literal */
    return text_add(out, p, (size_t)(e - p)) ? -1 : 1;
}

static int chat_check_template(const tl_model *m) {
    const char *tpl = tl_model_chat_template(m);
    if (!tpl) {
        cli_error("this model has no chat template (a base model?); use plain 'run' without --chat");
        return -1;
    }
    if (!strstr(tpl, "<|im_start|>")) {
        cli_error("this model's chat template is not ChatML; only ChatML templates are supported so far");
        return -1;
    }
    return 0;
}

/* Appends the ChatML of one user turn (preceded by the system turn on the
 * first one) and the assistant header. */
static int chatml_turn(const tl_model *m, const char *system, const char *user, int first, text *t) {
    if (first) {
        text sys = {0};
        int have = system ? (text_puts(&sys, system) ? -1 : 1)
                          : chatml_default_system(tl_model_chat_template(m), &sys);
        if (have < 0) return -1;
        if (have && (text_puts(t, "<|im_start|>system\n") || text_add(t, sys.s, sys.n) ||
                     text_puts(t, "<|im_end|>\n"))) {
            free(sys.s);
            return -1;
        }
        free(sys.s);
    }
    if (text_puts(t, "<|im_start|>user\n") || text_puts(t, user) ||
        text_puts(t, "<|im_end|>\n<|im_start|>assistant\n"))
        return -1;
    return 0;
}

/* ---- streaming output ---- */

typedef struct out_state {
    const tl_model *m;
    const run_opts *o;
    int n_ids;
} out_state;

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
        if (ev->token >= 0 && !tl_token_is_eog(os->m, ev->token))
            printf("%s%d", os->n_ids++ ? "," : "[", ev->token);
        return 0;
    }
    if (os->o->show_probs && ev->token >= 0) show_probs(os, ev);
    if (ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
    }
    return 0;
}

static void print_stats(const tl_gen_stats *st, const tl_ctx *ctx) {
    static const char *reasons[] = {"none", "end of generation", "stop string", "length limit",
                                    "context full", "callback"};
    fprintf(stderr,
            "\n[prompt %d tokens, prefill %.1f ms (%.1f tok/s), first token %.1f ms | "
            "generated %d tokens, %.1f tok/s | stop: %s | %s]\n",
            st->n_prompt, st->prefill_s * 1e3, st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0,
            st->ttft_s * 1e3, st->n_gen,
            st->decode_s > 0 && st->n_gen > 1 ? (st->n_gen - 1) / st->decode_s : 0,
            reasons[st->stop], tl_ctx_backend(ctx));
    if (st->stop == TL_STOP_CONTEXT)
        fprintf(stderr, "tokenloop: warning: the context is full (%d tokens); raise -c to go on\n",
                tl_ctx_n_ctx(ctx));
}

typedef struct session {
    tl_model *m;
    tl_ctx *ctx;
    tl_sampler *smp;
} session;

static void session_free(session *s) {
    tl_sampler_free(s->smp);
    tl_ctx_free(s->ctx);
    tl_model_free(s->m);
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
    tl_ctx_params cp = {.n_ctx = o->n_ctx, .n_threads = o->n_threads, .n_batch = o->n_batch};
    if (tl_ctx_new(s->m, &cp, &s->ctx, &err) ||
        tl_sampler_new(&o->sp, tl_model_n_vocab(s->m), &s->smp, &err)) {
        cli_tl_error(&err);
        session_free(s);
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
    out_state os = {s->m, o, 0};
    tl_gen_params gp = {.n_predict = o->n_predict, .stop = o->stop, .n_stop = o->n_stop,
                        .n_top = o->show_probs ? 5 : 0, .ignore_eog = o->ignore_eos,
                        .on_token = on_token, .user = &os};
    int rc = tl_generate(s->ctx, s->smp, ids, n, &gp, st, &err);
    tl_free(ids);
    if (o->print_ids) printf("%s]\n", os.n_ids ? "" : "[");
    if (rc) {
        fflush(stdout);
        cli_tl_error(&err);
        return -1;
    }
    return 0;
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
    int rc = 0;
    text t = {0};
    if (o.chat) {
        if (chat_check_template(s.m) || chatml_turn(s.m, o.system, prompt, 1, &t)) rc = 1;
        prompt = t.s;
        plen = t.n;
    }
    tl_gen_stats st = {0};
    if (!rc) rc = generate_text(&s, &o, prompt, plen, tl_model_add_bos(s.m), &st) ? 1 : 0;
    if (!rc) {
        if (!o.print_ids) putchar('\n');
        fflush(stdout);
        print_stats(&st, s.ctx);
    }
    free(t.s);
    free(owned);
    session_free(&s);
    return rc;
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
    fprintf(stderr, "tokenloop chat: type a message and press Enter; Ctrl-D ends.\n");
    char line[16384];
    int first = 1, rc = 0;
    for (;;) {
        fputs("> ", stderr);
        if (!fgets(line, sizeof line, stdin)) break;
        size_t ln = strlen(line);
        while (ln && (line[ln - 1] == '\n' || line[ln - 1] == '\r')) line[--ln] = 0;
        if (!ln) continue;
        text t = {0};
        /* The previous answer's end token was sampled, not evaluated: close it. */
        if (!first && text_puts(&t, "<|im_end|>\n")) rc = 1;
        if (rc || chatml_turn(s.m, o.system, line, first, &t)) {
            free(t.s);
            rc = 1;
            break;
        }
        tl_gen_stats st = {0};
        int g = generate_text(&s, &o, t.s, t.n, first && tl_model_add_bos(s.m), &st);
        free(t.s);
        if (g) {
            rc = 1;
            break;
        }
        putchar('\n');
        fflush(stdout);
        print_stats(&st, s.ctx);
        first = 0;
        if (st.stop == TL_STOP_CONTEXT) break;
    }
    session_free(&s);
    return rc;
}
