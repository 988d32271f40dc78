/* cli: the tokenloop command line. Shared helpers for the subcommands: option
 * parsing, error printing, default model lookup. Uses only the public header. */
#ifndef TL_CLI_H
#define TL_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "tokenloop.h"

/* Exit codes: 0 success, 1 runtime error, 2 usage error. */
#define EXIT_USAGE 2

void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_tl_error(const tl_error *err);
/* s as a JSON string on stdout: quotes and backslashes escaped, controls as \uXXXX. */
void cli_print_json_str(const char *s);

/* Walks a command's arguments. "--name=value" reads as "--name" followed by
 * its value, as getopt_long users expect (the Kubernetes manifests write
 * flags that way); an option that takes no value but was given one is an
 * error at the next cli_next. Short options are never split: "-p=x" stays
 * one (unknown) argument, and a value is always the next argument verbatim,
 * so `-p --a=b` passes the prompt "--a=b" unchanged.
 *
 *     cli_args p = cli_args_start(argc, argv);
 *     const char *a;
 *     int more;
 *     while ((more = cli_next(&p, &a)) > 0)
 *         if (!strcmp(a, "--port")) { if (!(v = cli_arg(&p))) return -1; ... }
 *     if (more < 0) return -1;
 */
typedef struct cli_args {
    int argc, i;
    char **argv;
    const char *inline_val; /* the current option's "=value", NULL when none */
    int inline_taken;       /* cli_arg took it */
    char name[64];          /* the current option with its "=value" cut off */
} cli_args;

cli_args cli_args_start(int argc, char **argv);
/* Steps to the next argument and sets *a to it. 1: one more; 0: no more;
 * -1: the option before was given "=value" and takes none (error printed). */
int cli_next(cli_args *p, const char **a);
/* The current option's value: its "=value", else the next argument (consumed).
 * NULL + message if there is none. */
const char *cli_arg(cli_args *p);
int cli_int(const char *opt, const char *v, long lo, long hi, int *out);
int cli_float(const char *opt, const char *v, float *out);
int cli_u64(const char *opt, const char *v, uint64_t *out);
/* --numerics fast|exact -> TL_NUMERICS_*; prints the error and returns -1 otherwise. */
int cli_numerics(const char *opt, const char *v, int *out);
/* The help line every command that runs the model shows for it. */
#define CLI_NUMERICS_HELP \
    "      --numerics MODE     fast (default) or exact: bitwise llama.cpp's CPU kernels\n" \
    "                          (docs/NUMERICS.md); $TL_NUMERICS sets the default\n"

/* The KV cache's types: --kv-type T (both), --kv-type-k/--kv-type-v (one),
 * and llama.cpp's -ctk/-ctv/--cache-type-k/--cache-type-v. If a is one of
 * them, reads its value into *k and/or *v and returns 1 (-1 with the error
 * printed); 0 when a is another option. */
int cli_kv_type_opt(cli_args *p, const char *a, int *k, int *v);
/* Prints q4_0's quality warning (stderr) when either type is q4_0. */
void cli_kv_type_warn(int k, int v);
#define CLI_KV_TYPE_HELP \
    "      --kv-type TYPE      KV cache type for keys and values: f16 (default), q8_0 (half\n" \
    "                          the memory, perplexity within 0.5%), q4_0 (a quarter; hurts\n" \
    "                          quality on long contexts); --kv-type-k/--kv-type-v set one\n" \
    "                          (llama.cpp's -ctk/-ctv also accepted)\n" \
    "      --swa-full          sliding-window layers (Gemma 3/4, gpt-oss) keep every position,\n" \
    "                          as llama.cpp's --swa-full: more memory, and a cached prompt\n" \
    "                          prefix is reusable at any block; by default each sequence keeps\n" \
    "                          their last window plus a batch, and a cached prefix resumes where\n" \
    "                          a prompt or a turn ended (the same logits either way)\n"

/* --spec off|auto|ngram -> TL_SPEC_*; prints the error and returns -1 otherwise. */
int cli_spec(const char *opt, const char *v, int *out);
#define CLI_SPEC_HELP \
    "      --spec MODE         speculative decoding: auto (default: guesses from the text so\n" \
    "                          far, or from --draft's model, verified in the same forward\n" \
    "                          call and used only while the measured cost says they pay),\n" \
    "                          ngram (prompt lookup whenever it finds a match), draft (the\n" \
    "                          draft model every step: one guess, more while its measured\n" \
    "                          agreement says they pay), off. The output is the same in every\n" \
    "                          mode.\n" \
    "      --draft FILE        a small GGUF model with the same vocabulary that guesses\n" \
    "                          tokens for the model (e.g. a Q4_0 of it: tokenloop quantize)\n"

/* The default model: $TOKENLOOP_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf
 * relative to the current directory or to the binary's directory. */
const char *cli_default_model(char *buf, size_t cap);

/* Reads a whole file (or stdin for "-") into a malloc'ed buffer. */
char *cli_read_file(const char *path, size_t *len);

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_rerank(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
