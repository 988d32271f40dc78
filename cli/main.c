/* cli/main: subcommand dispatch, top-level help and the shared helpers. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char USAGE[] =
    "tokenloop " TL_VERSION " - LLM inference in C\n"
    "\n"
    "usage: tokenloop COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run         generate a completion for a prompt, streamed to stdout\n"
    "  chat        interactive multi-turn chat (reuses the KV cache across turns)\n"
    "  tokenize    print the token ids of a text\n"
    "  info        describe a GGUF file (architecture, shapes, types, vocabulary)\n"
    "  perplexity  perplexity of a text, with llama.cpp's protocol\n"
    "  logits      write the logits of a token sequence (for testing against peers)\n"
    "  embed       embeddings of texts (pooled hidden states), as OpenAI's JSON\n"
    "  rerank      a reranker's relevance scores of documents for a query, as /v1/rerank's JSON\n"
    "  quantize    convert a GGUF model's weights to another type (Q4_0, Q8_0, Q4_K, F16, ...)\n"
    "  bench       prefill/decode speed (llama-bench's protocol) and memory bandwidth\n"
    "  serve       OpenAI-compatible HTTP server (chat, completions, streaming, metrics)\n"
    "\n"
    "Run 'tokenloop COMMAND --help' for the options of a command. A long option's value\n"
    "may follow it (--port 8080) or be joined to it with '=' (--port=8080).\n"
    "The CPU code path is chosen at start-up (TL_CPU=scalar|avx2|avx512|avx512-vnni|avx512-bf16|amx caps it).\n";

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tokenloop: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_tl_error(const tl_error *err) { cli_error("%s", err->msg[0] ? err->msg : "unknown error"); }

void cli_print_json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

cli_args cli_args_start(int argc, char **argv) {
    return (cli_args){.argc = argc, .argv = argv, .i = 0};
}

int cli_next(cli_args *p, const char **a) {
    if (p->inline_val && !p->inline_taken) {
        cli_error("option %s takes no value ('%s')", p->name, p->argv[p->i]);
        return -1;
    }
    p->inline_val = NULL;
    p->inline_taken = 0;
    if (++p->i >= p->argc) return 0;
    const char *s = p->argv[p->i];
    const char *eq = s[0] == '-' && s[1] == '-' && s[2] ? strchr(s + 2, '=') : NULL;
    if (eq && (size_t)(eq - s) < sizeof p->name) {
        memcpy(p->name, s, (size_t)(eq - s));
        p->name[eq - s] = 0;
        p->inline_val = eq + 1;
        *a = p->name;
    } else {
        *a = s; /* a name too long for the buffer is no option we know: reported as given */
    }
    return 1;
}

const char *cli_arg(cli_args *p) {
    if (p->inline_val) {
        p->inline_taken = 1;
        return p->inline_val;
    }
    if (p->i + 1 >= p->argc) {
        cli_error("option %s needs a value", p->argv[p->i]);
        return NULL;
    }
    return p->argv[++p->i];
}

int cli_int(const char *opt, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        cli_error("%s: '%s' is not an integer in %ld..%ld", opt, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cli_float(const char *opt, const char *v, float *out) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end || x != x) {
        cli_error("%s: '%s' is not a number", opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_numerics(const char *opt, const char *v, int *out) {
    const int m = tl_numerics_parse(v);
    if (m < 0) {
        cli_error("%s: '%s' is not a numerics mode (fast, exact)", opt, v);
        return -1;
    }
    *out = m;
    return 0;
}

int cli_kv_type_opt(cli_args *p, const char *a, int *k, int *v) {
    const int both = !strcmp(a, "--kv-type");
    const int is_k = both || !strcmp(a, "--kv-type-k") || !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k");
    const int is_v = both || !strcmp(a, "--kv-type-v") || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v");
    if (!is_k && !is_v) return 0;
    const char *val = cli_arg(p);
    if (!val) return -1;
    const int t = tl_kv_type_parse(val);
    if (t < 0) {
        cli_error("%s: '%s' is not a KV cache type (f16, q8_0, q4_0)", a, val);
        return -1;
    }
    if (is_k) *k = t;
    if (is_v) *v = t;
    return 1;
}

void cli_kv_type_warn(int k, int v) {
    if (k == TL_KV_Q4_0 || v == TL_KV_Q4_0)
        fprintf(stderr, "warning: a q4_0 KV cache loses accuracy (perplexity, and tool calls on long contexts); "
                        "q8_0 halves the memory with almost none\n");
}

int cli_spec(const char *opt, const char *v, int *out) {
    const int m = tl_spec_parse(v);
    if (m < 0) {
        cli_error("%s: '%s' is not a speculation mode (auto, ngram, draft, off)", opt, v);
        return -1;
    }
    *out = m;
    return 0;
}

int cli_u64(const char *opt, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    if (*v == '-') {
        cli_error("%s: '%s' must not be negative", opt, v);
        return -1;
    }
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end) {
        cli_error("%s: '%s' is not a non-negative integer", opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

static const char DEFAULT_MODEL[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

const char *cli_default_model(char *buf, size_t cap) {
    const char *env = getenv("TOKENLOOP_MODEL");
    if (env && *env) return env;
    if (access(DEFAULT_MODEL, R_OK) == 0) return DEFAULT_MODEL;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, cap, "%s/%s", exe, DEFAULT_MODEL);
            if (access(buf, R_OK) == 0) return buf;
            snprintf(buf, cap, "%s/../%s", exe, DEFAULT_MODEL);
            if (access(buf, R_OK) == 0) return buf;
        }
    }
    return DEFAULT_MODEL; /* the open fails with a clear message */
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        cli_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = cap > ((size_t)1 << 32) ? NULL : realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || bad) {
        free(buf);
        cli_error("cannot read %s", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        FILE *o = argc < 2 ? stderr : stdout;
        fputs(USAGE, o);
        fprintf(o, "\nSupported architectures: %s\nTokenizers: %s\nWeight types: %s\n",
                tl_supported_architectures(), tl_supported_tokenizers(), tl_supported_weight_types());
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tokenloop %s\n", TL_VERSION);
        return 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"run", cmd_run},   {"chat", cmd_chat},     {"tokenize", cmd_tokenize},
                {"info", cmd_info}, {"perplexity", cmd_perplexity}, {"logits", cmd_logits}, {"embed", cmd_embed},
                {"rerank", cmd_rerank},
                {"template", cmd_template}, {"bench", cmd_bench},
                {"quantize", cmd_quantize}, {"serve", cmd_serve}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    cli_error("unknown command '%s' (try 'tokenloop --help')", argv[1]);
    return EXIT_USAGE;
}
