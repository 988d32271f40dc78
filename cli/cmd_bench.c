/* cli/bench: `tokenloop bench`, prefill and decode speed with llama-bench's
 * protocol and field names (so the two tools' tables and JSON line up), and
 * `bench --memory`, the machine's read bandwidth that bounds decode speed. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

#include "cli.h"

#define MAX_LIST 32

typedef struct bench_opts {
    const char *model;
    int p[MAX_LIST], n_p;
    int n[MAX_LIST], n_n;
    int d[MAX_LIST], n_d;
    int reps, n_threads, json, no_warmup, memory, numerics, kv_k, kv_v, swa_full;
    int parallel; /* decode tests' sequences side by side (1: llama-bench's test_gen) */
    int mem_cache_mib, mem_dram_mib;
} bench_opts;

static const char BENCH_HELP[] =
    "usage: tokenloop bench [-m FILE] [-p 512] [-n 128] [-d 0] [-r 5] [-t N] [-o md|json] [--no-warmup]\n"
    "       tokenloop bench --memory [-t N] [-o md|json]\n"
    "\n"
    "Measures prompt processing (prefill) and generation (decode) speed with\n"
    "llama-bench's protocol: a cleared context, BOS then random tokens; prefill\n"
    "evaluates -p tokens in one call, decode evaluates -n tokens one at a time.\n"
    "One warmup run per test, then -r timed repetitions; t/s is the mean of the\n"
    "repetitions' tokens/s, ± their sample standard deviation.\n"
    "\n"
    "  -m, --model FILE          GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
    "                            or $TOKENLOOP_MODEL)\n"
    "  -p, --n-prompt N[,N...]   prefill test sizes (default 512; 0 = none)\n"
    "  -n, --n-gen N[,N...]      decode test sizes (default 128; 0 = none)\n"
    "  -d, --n-depth N[,N...]    tokens already in the context when each test starts\n"
    "                            (default 0; evaluated untimed before every run, as\n"
    "                            llama-bench's -d: 'tg128 @ d4096' is decode at 4k context)\n"
    "  -r, --repetitions N       timed runs per test (default 5)\n"
    "  -t, --threads N           threads (default: all online CPUs)\n"
    "      --parallel N          decode tests run N sequences side by side, one token\n"
    "                            of each per call, every row's logits kept (the server's\n"
    "                            step with N streams; llama-batched-bench's S_TG): t/s\n"
    "                            counts all N sequences' tokens (default 1)\n"
    "  -o, --output md|json      a markdown table (default) or a JSON array\n"
    "      --no-warmup           skip the warmup run before each test\n"
    "      --numerics MODE       fast (default) or exact (docs/NUMERICS.md)\n"
    "      --kv-type TYPE        KV cache type: f16 (default), q8_0, q4_0; --kv-type-k,\n"
    "                            --kv-type-v (or llama-bench's -ctk, -ctv) set one\n"
    "      --swa-full            sliding-window layers keep every position (as run's)\n"
    "      --memory              measure memory read bandwidth instead of a model:\n"
    "                            a cache-sized and a DRAM-sized buffer, best of 5\n"
    "      --mem-cache MIB       the cache-sized buffer (default 16)\n"
    "      --mem-dram MIB        the DRAM-sized buffer (default 1024)\n"
    "\n"
    "Decode rows also give GB/s: the bytes of weights one token reads (every layer,\n"
    "the output matrix, one embedding row) times tokens/s; compare it with\n"
    "--memory's DRAM figure to see how close decode is to the memory bound. With\n"
    "--parallel N it is a step's bytes times steps/s: the dense weights once, an\n"
    "expert as often as one of the N tokens chose it (routing taken as uniform),\n"
    "and for a mixture of experts stderr says what those bytes allow N streams to\n"
    "gain over one at the same GB/s.\n"
    "Results go to stdout, progress to stderr.\n";

/* ---- options ---- */

/* A comma list of token counts, as llama-bench's -p 0,512. */
static int parse_list(const char *opt, const char *v, int *out, int *n_out) {
    char buf[512];
    if (strlen(v) >= sizeof buf) {
        cli_error("%s: list too long", opt);
        return -1;
    }
    strcpy(buf, v);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_LIST) {
            cli_error("%s: at most %d values", opt, MAX_LIST);
            return -1;
        }
        if (cli_int(opt, tok, 0, 1 << 20, &out[n])) return -1;
        n++;
    }
    if (n == 0 || v[strlen(v) - 1] == ',' || v[0] == ',' || strstr(v, ",,")) {
        cli_error("%s: '%s' is not a comma-separated list of integers", opt, v);
        return -1;
    }
    *n_out = n;
    return 0;
}

/* Returns 0 on success, 1 if help was printed, -1 on a usage error. */
static int parse_bench(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->p[0] = 512, o->n_p = 1;
    o->n[0] = 128, o->n_n = 1;
    o->d[0] = 0, o->n_d = 1;
    o->reps = 5;
    o->parallel = 1;
    o->mem_cache_mib = 16, o->mem_dram_mib = 1024;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        const char *v;
        int kt;
#define VAL() if (!(v = cli_arg(&p))) return -1
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(BENCH_HELP, stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL(); o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            VAL(); if (parse_list(a, v, o->p, &o->n_p)) return -1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            VAL(); if (parse_list(a, v, o->n, &o->n_n)) return -1;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) {
            VAL(); if (parse_list(a, v, o->d, &o->n_d)) return -1;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            VAL(); if (cli_int(a, v, 1, 100000, &o->reps)) return -1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL(); if (cli_int(a, v, 1, 1024, &o->n_threads)) return -1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            VAL();
            if (strcmp(v, "md") && strcmp(v, "json")) {
                cli_error("%s: '%s' is not md or json", a, v);
                return -1;
            }
            o->json = !strcmp(v, "json");
        } else if (!strcmp(a, "--numerics")) {
            VAL(); if (cli_numerics(a, v, &o->numerics)) return -1;
        } else if ((kt = cli_kv_type_opt(&p, a, &o->kv_k, &o->kv_v)) != 0) {
            if (kt < 0) return -1;
        } else if (!strcmp(a, "--swa-full")) {
            o->swa_full = 1;
        } else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            VAL(); if (cli_int(a, v, 1, 256, &o->parallel)) return -1;
        } else if (!strcmp(a, "--no-warmup")) {
            o->no_warmup = 1;
        } else if (!strcmp(a, "--memory")) {
            o->memory = 1;
        } else if (!strcmp(a, "--mem-cache")) {
            VAL(); if (cli_int(a, v, 1, 1 << 16, &o->mem_cache_mib)) return -1;
        } else if (!strcmp(a, "--mem-dram")) {
            VAL(); if (cli_int(a, v, 1, 1 << 20, &o->mem_dram_mib)) return -1;
        } else {
            cli_error("unknown option '%s' (try 'tokenloop bench --help')", a);
            return -1;
        }
#undef VAL
    }
    if (more < 0) return -1;
    if (!o->n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->n_threads = n > 0 ? (n > 1024 ? 1024 : (int)n) : 1;
    }
    return 0;
}

/* ---- statistics: llama-bench's avg and stdev ---- */

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0;
}

/* The sample standard deviation in llama-bench's form (sum of squares minus
 * n * mean^2), so the figures match its output digit for digit. */
static double stdev_of(const double *v, int n) {
    if (n <= 1) return 0;
    double m = mean_of(v, n), sq = 0;
    for (int i = 0; i < n; i++) sq += v[i] * v[i];
    double x = sq / (n - 1) - m * m * n / (n - 1);
    return sqrt(x > 0 ? x : 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the model: what the table and JSON say about it ---- */

typedef struct model_meta {
    char type[192];      /* llama-bench's model_type: "llama 135M Q4_1" */
    uint64_t size;       /* bytes of tensor data */
    uint64_t n_params;
    size_t decode_bytes;
    size_t step_bytes;   /* a decode step of --parallel sequences, routing uniform (tl_model_step_bytes) */
} model_meta;

/* llama.cpp's names of general.file_type (llama_ftype). */
static const char *ftype_name(long ft) {
    static const struct { long id; const char *name; } t[] = {
        {0, "all F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"},
        {9, "Q5_1"}, {10, "Q2_K - Medium"}, {11, "Q3_K - Small"}, {12, "Q3_K - Medium"},
        {13, "Q3_K - Large"}, {14, "Q4_K - Small"}, {15, "Q4_K - Medium"}, {16, "Q5_K - Small"},
        {17, "Q5_K - Medium"}, {18, "Q6_K"}, {25, "IQ4_NL - 4.5 bpw"}, {30, "IQ4_XS - 4.25 bpw"},
        {32, "BF16"}, {38, "MXFP4 MoE"}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].id == ft) return t[i].name;
    return "?";
}

/* The public API has no getters for these, but `info` prints them all, so
 * they are read back from its text; anything missing keeps a neutral value. */
static void read_meta(const char *path, model_meta *mm) {
    char *text = NULL, line[1024], arch[64] = "?", label[64] = "?";
    size_t len = 0;
    long ft = -1;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        tl_error err = {0};
        int bad = tl_gguf_describe(path, f, &err);
        fclose(f);
        f = bad || !text ? NULL : fmemopen(text, len, "r");
    }
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long a;
        if (sscanf(line, "architecture: %63s", arch) == 1) continue;
        if (sscanf(line, " general.size_label = \"%63[^\"]\"", label) == 1) continue;
        if (sscanf(line, " general.file_type = %ld", &ft) == 1) continue;
        if (sscanf(line, "tensors: %*u (%llu bytes of data", &a) == 1) mm->size = a;
        else if (sscanf(line, "parameters: %llu", &a) == 1) mm->n_params = a;
    }
    if (f) fclose(f);
    free(text);
    if (!strcmp(label, "?") && mm->n_params) /* no size label (random-weight files): from the count */
        snprintf(label, sizeof label, mm->n_params >= 1000000000ull ? "%.1fB" : "%.0fM",
                 (double)mm->n_params / (mm->n_params >= 1000000000ull ? 1e9 : 1e6));
    snprintf(mm->type, sizeof mm->type, "%s %s %s", arch, label, ftype_name(ft));
}

/* ---- the two tests ---- */

typedef struct bench_run {
    tl_ctx *ctx;
    int n_vocab, batch; /* batch: tokens per call, the room in toks */
    int par;            /* --parallel: sequences, ids in seqs; 1 runs on the implicit one */
    int32_t *seqs, *bseq;
    uint8_t *keep;
    int32_t bos;   /* the first token, or -1 to draw it at random */
    uint64_t rng;  /* xorshift64: llama-bench's std::rand() role, seeded */
    int32_t *toks; /* room for the largest prompt */
} bench_run;

static int32_t rand_token(bench_run *b) {
    b->rng ^= b->rng << 13;
    b->rng ^= b->rng >> 7;
    b->rng ^= b->rng << 17;
    return (int32_t)(b->rng % (uint64_t)b->n_vocab);
}

/* llama-bench's test_prompt: BOS (if the model adds one), then random tokens. */
static int test_prompt(bench_run *b, int n, tl_error *err) {
    b->toks[0] = b->bos >= 0 ? b->bos : rand_token(b);
    for (int i = 1; i < n; i++) b->toks[i] = rand_token(b);
    return tl_ctx_eval(b->ctx, b->toks, (size_t)n, 0, err);
}

/* The context filled with n tokens (BOS, then random) before a test, in
 * calls of at most batch tokens; untimed. */
static int fill_depth(bench_run *b, int n, tl_error *err) {
    for (int done = 0; done < n;) {
        const int k = n - done < b->batch ? n - done : b->batch;
        for (int i = 0; i < k; i++) b->toks[i] = done + i == 0 && b->bos >= 0 ? b->bos : rand_token(b);
        int st = tl_ctx_eval(b->ctx, b->toks, (size_t)k, 0, err);
        if (st) return st;
        done += k;
    }
    return 0;
}

/* llama-bench's test_gen: one token per call, from BOS on. */
static int test_gen(bench_run *b, int n, tl_error *err) {
    int32_t tok = b->bos >= 0 ? b->bos : rand_token(b);
    for (int i = 0; i < n; i++) {
        int st = tl_ctx_eval(b->ctx, &tok, 1, 0, err);
        if (st) return st;
        tok = rand_token(b);
    }
    return 0;
}

/* --parallel: each of the b->par sequences cleared and filled with n
 * tokens (BOS, then random), in calls of at most batch tokens; untimed. */
static int fill_par(bench_run *b, int n, tl_error *err) {
    /* the prefill tests' sequence holds blocks the pool sized for par sequences needs */
    int st = tl_ctx_truncate(b->ctx, 0, err);
    for (int s = 0; !st && s < b->par; s++) {
        st = tl_seq_truncate(b->ctx, b->seqs[s], 0, err);
        for (int done = 0; !st && done < n;) {
            const int k = n - done < b->batch ? n - done : b->batch;
            for (int i = 0; i < k; i++) {
                b->toks[i] = done + i == 0 && b->bos >= 0 ? b->bos : rand_token(b);
                b->bseq[i] = b->seqs[s];
            }
            const tl_batch bt = {.n = k, .token = b->toks, .seq = b->bseq};
            st = tl_ctx_decode(b->ctx, &bt, err);
            done += k;
        }
    }
    return st;
}

/* --parallel: n calls of one token for each sequence, every row kept, as
 * the server's decode step is; the first token of each is BOS when the
 * context is empty (test_gen's start). */
static int test_gen_par(bench_run *b, int n, int from_bos, tl_error *err) {
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < b->par; s++) {
            b->toks[s] = i == 0 && from_bos && b->bos >= 0 ? b->bos : rand_token(b);
            b->bseq[s] = b->seqs[s];
        }
        const tl_batch bt = {.n = b->par, .token = b->toks, .seq = b->bseq, .logits = b->keep};
        int st = tl_ctx_decode(b->ctx, &bt, err);
        if (st) return st;
    }
    return 0;
}

typedef struct bench_result {
    int n_prompt, n_gen, n_depth, n;
    int par; /* sequences side by side (--parallel; 1 for prefill tests) */
    char test_time[32];
    uint64_t *ns;
    double *ts;
} bench_result;

/* Weight bytes read per second by a decode run of avg tokens/s: one token's
 * per token, or with several sequences a step's per step (avg / par steps). */
static double row_gbps(const model_meta *mm, const bench_result *r, double avg) {
    if (r->par > 1) return (double)mm->step_bytes * avg / r->par / 1e9;
    return (double)mm->decode_bytes * avg / 1e9;
}

/* One test: a warmup, then reps timed runs, each on a cleared context. */
static int run_test(bench_run *b, const bench_opts *o, int idx, int total, bench_result *r) {
    tl_error err = {0};
    const char *kind = r->n_prompt ? "prompt" : "generation";
    int size = r->n_prompt ? r->n_prompt : r->n_gen;
    time_t t = time(NULL);
    struct tm tm;
    strftime(r->test_time, sizeof r->test_time, "%FT%TZ", gmtime_r(&t, &tm));
    const int par = r->par > 1; /* this test runs the sequences side by side */
    int st = par ? fill_par(b, 0, &err) : tl_ctx_truncate(b->ctx, 0, &err);
    if (!st && !o->no_warmup) {
        fprintf(stderr, "tokenloop bench: test %d/%d: warmup %s run\n", idx, total, kind);
        st = r->n_prompt ? test_prompt(b, size, &err) : par ? test_gen_par(b, 1, 1, &err) : test_gen(b, 1, &err);
    }
    /* the pool's counters over the timed runs only (not the depth fills) */
    uint64_t jobs = 0;
    double wall = 0, busy = 0;
    int n_threads = 1;
    for (int i = 0; !st && i < o->reps; i++) {
        if (par) {
            if ((st = fill_par(b, r->n_depth, &err))) break;
        } else {
            if ((st = tl_ctx_truncate(b->ctx, 0, &err))) break;
            if (r->n_depth && (st = fill_depth(b, r->n_depth, &err))) break;
        }
        fprintf(stderr, "tokenloop bench: test %d/%d: %s run %d/%d\n", idx, total, kind, i + 1,
                o->reps);
        tl_thread_stats t0s, t1s;
        tl_ctx_thread_stats(b->ctx, &t0s);
        uint64_t t0 = now_ns();
        st = r->n_prompt ? test_prompt(b, size, &err)
             : par       ? test_gen_par(b, size, r->n_depth == 0, &err)
                         : test_gen(b, size, &err);
        uint64_t dt = now_ns() - t0;
        tl_ctx_thread_stats(b->ctx, &t1s);
        jobs += t1s.jobs - t0s.jobs;
        wall += t1s.wall_s - t0s.wall_s;
        busy += t1s.busy_s - t0s.busy_s;
        n_threads = t1s.n_threads;
        r->ns[i] = dt ? dt : 1;
        r->ts[i] = 1e9 * size * (par ? r->par : 1) / (double)r->ns[i];
        r->n = i + 1;
    }
    if (st) {
        cli_tl_error(&err);
        return st;
    }
    /* How the threads spent the timed runs: fork-joins per token, and how much
     * of the threads' time inside those jobs did work (the rest: imbalance
     * and dispatch). */
    double total_s = 0;
    for (int i = 0; i < r->n; i++) total_s += (double)r->ns[i] * 1e-9;
    if (r->n && wall > 0)
        fprintf(stderr,
                "tokenloop bench: %s%d: %.1f fork-joins per token, %.0f%% of the time in them; threads busy "
                "%.0f%% of their time in jobs\n",
                r->n_prompt ? "pp" : "tg", size, (double)jobs / ((double)size * (par ? r->par : 1) * r->n),
                100.0 * wall / total_s, 100.0 * busy / (wall * n_threads));
    return 0;
}

/* ---- output ---- */

static void md_header(void) {
    printf("| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s | %8s |\n", "model", "size", "params",
           "backend", "threads", "test", "t/s", "GB/s");
    printf("| %.30s | %.9s: | %.9s: | %.10s | %.6s: | %.14s: | %.19s: | %.7s: |\n",
           "------------------------------", "----------", "----------", "----------", "-------",
           "---------------", "--------------------", "--------");
}

static void md_row(const model_meta *mm, const char *backend, int threads, const bench_result *r) {
    char size[32], params[32], test[32], ts[64], gbps[32] = "";
    double mib = (double)mm->size / 1024.0 / 1024.0;
    if (mib < 1024) snprintf(size, sizeof size, "%.2f MiB", mib);
    else snprintf(size, sizeof size, "%.2f GiB", mib / 1024.0);
    if (mm->n_params < 1000000000u) snprintf(params, sizeof params, "%.2f M", mm->n_params / 1e6);
    else snprintf(params, sizeof params, "%.2f B", mm->n_params / 1e9);
    if (r->n_prompt) snprintf(test, sizeof test, "pp%d", r->n_prompt);
    else if (r->par > 1) snprintf(test, sizeof test, "tg%d x%d", r->n_gen, r->par);
    else snprintf(test, sizeof test, "tg%d", r->n_gen);
    if (r->n_depth) snprintf(test + strlen(test), sizeof test - strlen(test), " @ d%d", r->n_depth);
    double avg = mean_of(r->ts, r->n);
    snprintf(ts, sizeof ts, "%.2f ± %.2f", avg, stdev_of(r->ts, r->n));
    /* several sequences: a step's bytes (expected, as routing is uniform) per step */
    if (r->n_gen) snprintf(gbps, sizeof gbps, "%.2f", row_gbps(mm, r, avg));
    /* the width is in bytes and ± takes two */
    printf("| %-30s | %10s | %10s | %-10s | %7d | %15s | %21s | %8s |\n", mm->type, size, params,
           backend, threads, test, ts, gbps);
}

/* The standard deviation of the times, truncated to whole ns as llama-bench's
 * integer version ends up. */
static double stdev_ns(const bench_result *r) {
    double m = 0, sq = 0;
    if (r->n <= 1) return 0;
    for (int i = 0; i < r->n; i++) m += (double)r->ns[i];
    m /= r->n;
    for (int i = 0; i < r->n; i++) sq += (double)r->ns[i] * (double)r->ns[i];
    double x = sq / (r->n - 1) - m * m * r->n / (r->n - 1);
    return sqrt(x > 0 ? x : 0);
}

static void json_row(const char *path, const model_meta *mm, const char *backend, const char *numerics, int threads,
                     int batch, const bench_result *r, int first) {
    double avg = mean_of(r->ts, r->n);
    uint64_t sum = 0;
    for (int i = 0; i < r->n; i++) sum += r->ns[i];
    printf("%s  {\n    \"model_filename\": ", first ? "" : ",\n");
    cli_print_json_str(path);
    printf(",\n    \"model_type\": ");
    cli_print_json_str(mm->type);
    printf(",\n    \"model_size\": %" PRIu64 ",\n    \"model_n_params\": %" PRIu64 ",\n",
           mm->size, mm->n_params);
    printf("    \"backend\": ");
    cli_print_json_str(backend);
    printf(",\n    \"numerics\": ");
    cli_print_json_str(numerics);
    printf(",\n    \"n_batch\": %d,\n    \"n_threads\": %d,\n", batch, threads);
    printf("    \"n_prompt\": %d,\n    \"n_gen\": %d,\n    \"n_depth\": %d,\n    \"n_parallel\": %d,\n",
           r->n_prompt, r->n_gen, r->n_depth, r->par);
    printf("    \"test_time\": \"%s\",\n", r->test_time);
    printf("    \"avg_ns\": %" PRIu64 ",\n", r->n ? sum / (uint64_t)r->n : 0);
    printf("    \"stddev_ns\": %.0f,\n", floor(stdev_ns(r)));
    printf("    \"avg_ts\": %f,\n    \"stddev_ts\": %f,\n", avg, stdev_of(r->ts, r->n));
    printf("    \"decode_bytes\": %zu,\n", mm->decode_bytes);
    if (r->par > 1) printf("    \"step_bytes\": %zu,\n", mm->step_bytes);
    if (r->n_gen) printf("    \"gbps\": %f,\n", row_gbps(mm, r, avg));
    printf("    \"samples_ns\": [ ");
    for (int i = 0; i < r->n; i++) printf("%s%" PRIu64, i ? ", " : "", r->ns[i]);
    printf(" ],\n    \"samples_ts\": [ ");
    for (int i = 0; i < r->n; i++) printf("%s%f", i ? ", " : "", r->ts[i]);
    printf(" ]\n  }");
}

/* ---- the model benchmark ---- */

static int max_of(const int *v, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* Runs every test in llama-bench's order (prefill sizes, then decode sizes),
 * printing each result as it completes. */
static int run_tests(bench_run *b, const bench_opts *o, const char *path, const model_meta *mm,
                     int batch) {
    int total = 0, idx = 0, printed = 0, rc = 0;
    for (int i = 0; i < o->n_p; i++) total += o->p[i] > 0;
    for (int i = 0; i < o->n_n; i++) total += o->n[i] > 0;
    total *= o->n_d;
    bench_result r = {0};
    r.ns = malloc((size_t)o->reps * sizeof *r.ns);
    r.ts = malloc((size_t)o->reps * sizeof *r.ts);
    if (!r.ns || !r.ts) {
        cli_error("out of memory");
        rc = 1;
    }
    const char *backend = tl_ctx_backend(b->ctx);
    if (!rc) fputs(o->json ? "[\n" : "", stdout);
    if (!rc && !o->json) md_header();
    for (int k = 0; !rc && k < (o->n_p + o->n_n) * o->n_d; k++) {
        const int kk = k / o->n_d, is_pp = kk < o->n_p, size = is_pp ? o->p[kk] : o->n[kk - o->n_p];
        if (size == 0) continue;
        r.n_prompt = is_pp ? size : 0;
        r.n_gen = is_pp ? 0 : size;
        r.n_depth = o->d[k % o->n_d];
        r.par = is_pp ? 1 : o->parallel;
        r.n = 0;
        if (run_test(b, o, ++idx, total, &r)) {
            rc = 1;
            break;
        }
        if (o->json) json_row(path, mm, backend, tl_ctx_numerics(b->ctx), o->n_threads, batch, &r, !printed++);
        else md_row(mm, backend, o->n_threads, &r);
        fflush(stdout);
    }
    /* the JSON stays well-formed even when a test failed */
    if (o->json && (r.ns && r.ts)) fputs(printed ? "\n]\n" : "]\n", stdout);
    else if (!rc)
        printf("\nbuild: tokenloop %s, numerics %s, KV cache %s/%s\n", TL_VERSION, tl_ctx_numerics(b->ctx),
               tl_kv_type_name(o->kv_k), tl_kv_type_name(o->kv_v));
    free(r.ns);
    free(r.ts);
    return rc;
}

static int bench_model(const bench_opts *o) {
    char buf[4096];
    tl_error err = {0};
    const char *path = o->model ? o->model : cli_default_model(buf, sizeof buf);
    int max_p = max_of(o->p, o->n_p), max_n = max_of(o->n, o->n_n), max_d = max_of(o->d, o->n_d);
    if (max_p == 0 && max_n == 0) {
        cli_error("nothing to run: -p and -n are all 0");
        return EXIT_USAGE;
    }
    tl_model *m = NULL;
    if (tl_model_load(path, &m, &err)) {
        cli_error("%s: %s", path, err.msg);
        if (!o->model) fputs("tokenloop: hint: run 'make models' to fetch the default model\n", stderr);
        return 1;
    }
    /* one context sized for the largest test after the deepest fill; each run clears it */
    int batch = max_p > 0 ? max_p : max_d > 0 ? (max_d < 512 ? max_d : 512) : 1;
    const int par = max_n > 0 ? o->parallel : 1;
    model_meta mm = {.decode_bytes = tl_model_decode_bytes(m), .step_bytes = tl_model_step_bytes(m, par)};
    read_meta(path, &mm);
    if (par > 1 && tl_model_n_expert(m, NULL) > 0)
        fprintf(stderr,
                "tokenloop bench: %d sequences: a step reads %.0f MB of weights if routing is uniform, one "
                "sequence's token %.0f MB: at most %.2fx one sequence's tokens/s at the same GB/s\n",
                par, (double)mm.step_bytes / 1e6, (double)mm.decode_bytes / 1e6,
                (double)par * (double)mm.decode_bytes / (double)mm.step_bytes);
    if (batch < par) batch = par;
    int n_ctx = max_d + (max_p > max_n ? max_p : max_n);
    if (n_ctx < batch) n_ctx = batch; /* a step of par sequences at -n 1: par tokens in one batch */
    tl_ctx_params cp = {.n_ctx = n_ctx, .n_threads = o->n_threads, .n_batch = batch, .numerics = o->numerics,
                        .kv_type_k = o->kv_k, .kv_type_v = o->kv_v, .n_seq_max = par > 1 ? par : 0,
                        .n_logits_max = par, .swa_full = o->swa_full};
    bench_run b = {.n_vocab = tl_model_n_vocab(m), .batch = batch, .bos = -1, .rng = 1, .par = par};
    if (tl_model_add_bos(m)) b.bos = tl_token_bos(m);
    int rc = 0;
    if (tl_ctx_new(m, &cp, &b.ctx, &err)) {
        cli_tl_error(&err);
        rc = 1;
    } else if (!(b.toks = malloc((size_t)batch * sizeof *b.toks)) || !(b.bseq = malloc((size_t)batch * sizeof *b.bseq)) ||
               !(b.seqs = malloc((size_t)par * sizeof *b.seqs)) || !(b.keep = malloc((size_t)par))) {
        cli_error("out of memory");
        rc = 1;
    } else if (par > 1) {
        memset(b.keep, 1, (size_t)par);
        for (int s = 0; !rc && s < par; s++)
            if (tl_seq_open(b.ctx, &b.seqs[s], &err)) {
                cli_tl_error(&err);
                rc = 1;
            }
    }
    if (!rc) rc = run_tests(&b, o, path, &mm, batch);
    free(b.toks);
    free(b.bseq);
    free(b.seqs);
    free(b.keep);
    tl_ctx_free(b.ctx);
    tl_model_free(m);
    return rc;
}

/* ---- the memory benchmark ---- */

/* Sums 64-bit words with eight independent accumulators so the adds never
 * wait on each other and only the loads limit the speed. */
static uint64_t read_plain(const uint64_t *p, size_t n) {
    uint64_t a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += p[i + k];
    for (; i < n; i++) a[0] += p[i];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

#ifdef BENCH_X86
/* 256-bit loads, 8 per iteration into 4 accumulators: a core's full load
 * bandwidth, which one plain loop does not reach. */
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i *v = (const __m256i *)(p + i);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 0));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 3));
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 4));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 5));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 6));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 7));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, s);
    return out[0] + out[1] + out[2] + out[3] + read_plain(p + i, n - i);
}
#endif

typedef struct mem_job {
    uint64_t *buf;
    size_t words;  /* in the whole buffer */
    int nth, passes, reps, avx2;
    pthread_barrier_t start, done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go;        /* 0: wait, 1: run, -1: a thread failed to start, return */
    double *secs;  /* [reps], measured by thread 0 */
} mem_job;

typedef struct mem_worker {
    mem_job *job;
    int ith;
    uint64_t sink; /* keeps the sums alive so the reads are not optimised away */
} mem_worker;

/* Each thread first touches its share (so the pages are real and local to
 * it), then reads it passes times per repetition between two barriers. */
static void *mem_thread(void *arg) {
    mem_worker *w = arg;
    mem_job *j = w->job;
    pthread_mutex_lock(&j->mu);
    while (!j->go) pthread_cond_wait(&j->cv, &j->mu);
    int go = j->go;
    pthread_mutex_unlock(&j->mu);
    if (go < 0) return NULL;
    size_t per = j->words / (size_t)j->nth / 32 * 32, lo = per * (size_t)w->ith;
    size_t n = w->ith == j->nth - 1 ? j->words - lo : per;
    for (size_t i = 0; i < n; i++) j->buf[lo + i] = (lo + i) * 0x9e3779b97f4a7c15u;
    for (int r = -1; r < j->reps; r++) {
        pthread_barrier_wait(&j->start);
        double t0 = now_s();
        for (int p = 0; r >= 0 && p < j->passes; p++)
#ifdef BENCH_X86
            w->sink += j->avx2 ? read_avx2(j->buf + lo, n) : read_plain(j->buf + lo, n);
#else
            w->sink += read_plain(j->buf + lo, n);
#endif
        pthread_barrier_wait(&j->done);
        if (w->ith == 0 && r >= 0) j->secs[r] = now_s() - t0;
    }
    return NULL;
}

/* Starts threads 1..nth-1; they wait at the gate until all exist, so a failed
 * pthread_create never leaves the others stuck at a barrier. */
static int mem_start(mem_job *j, mem_worker *w, pthread_t *th) {
    int started = 1;
    for (; started < j->nth; started++)
        if (pthread_create(&th[started], NULL, mem_thread, &w[started])) break;
    pthread_mutex_lock(&j->mu);
    j->go = started == j->nth ? 1 : -1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (j->go == 1) mem_thread(&w[0]);
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    if (j->go == 1) return 0;
    cli_error("cannot start %d threads", j->nth);
    return -1;
}

/* Reads a buffer of mib MiB with nth threads; returns the best GB/s of reps
 * repetitions (the best is the machine's capability; noise only slows). */
static int mem_measure(int nth, size_t mib, int reps, double *gbps) {
    size_t bytes = mib << 20;
    /* at least 256 MiB read per repetition, so the timing is well above the
     * barrier cost even for the small buffer */
    int passes = (int)((256 + mib - 1) / mib);
    mem_job j = {.words = bytes / 8, .nth = nth, .passes = passes, .reps = reps};
#ifdef BENCH_X86
    j.avx2 = __builtin_cpu_supports("avx2");
#endif
    j.buf = aligned_alloc(64, bytes);
    j.secs = calloc((size_t)reps, sizeof *j.secs);
    mem_worker *w = calloc((size_t)nth, sizeof *w);
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    int rc = -1;
    if (!j.buf || !j.secs || !w || !th) {
        cli_error("out of memory for a %zu MiB buffer", mib);
    } else {
        pthread_mutex_init(&j.mu, NULL);
        pthread_cond_init(&j.cv, NULL);
        pthread_barrier_init(&j.start, NULL, (unsigned)nth);
        pthread_barrier_init(&j.done, NULL, (unsigned)nth);
        for (int i = 0; i < nth; i++) w[i] = (mem_worker){.job = &j, .ith = i};
        rc = mem_start(&j, w, th);
        pthread_barrier_destroy(&j.start);
        pthread_barrier_destroy(&j.done);
        pthread_cond_destroy(&j.cv);
        pthread_mutex_destroy(&j.mu);
    }
    /* the shares tile the buffer, so each pass reads all of it */
    double best = 0, read = (double)bytes * passes;
    for (int r = 0; !rc && r < reps; r++)
        if (j.secs[r] > 0 && read / j.secs[r] / 1e9 > best) best = read / j.secs[r] / 1e9;
    *gbps = best;
    free(j.buf), free(j.secs), free(w), free(th);
    return rc;
}

static int bench_memory(const bench_opts *o) {
    const struct { const char *test; int mib; } t[2] = {
        {"mem_read_cache", o->mem_cache_mib}, {"mem_read_dram", o->mem_dram_mib}};
    const int reps = 5;
    if (o->json) fputs("[\n", stdout);
    else printf("| %-16s | %10s | %7s | %10s |\n| %.16s | %.9s: | %.6s: | %.9s: |\n", "test",
                "buffer", "threads", "GB/s", "----------------", "----------", "-------",
                "----------");
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        double gbps = 0;
        fprintf(stderr, "tokenloop bench: %s: %d MiB, %d threads, best of %d\n", t[i].test,
                t[i].mib, o->n_threads, reps);
        if (mem_measure(o->n_threads, (size_t)t[i].mib, reps, &gbps)) {
            rc = 1;
            break;
        }
        size_t bytes = (size_t)t[i].mib << 20;
        if (o->json)
            printf("%s  {\n    \"test\": \"%s\",\n    \"buffer_bytes\": %zu,\n    \"n_threads\": %d,\n"
                   "    \"repetitions\": %d,\n    \"gbps\": %f\n  }",
                   i ? ",\n" : "", t[i].test, bytes, o->n_threads, reps, gbps);
        else
            printf("| %-16s | %6d MiB | %7d | %10.2f |\n", t[i].test, t[i].mib, o->n_threads, gbps);
        fflush(stdout);
    }
    if (o->json) fputs("\n]\n", stdout);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    int pr = parse_bench(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : EXIT_USAGE;
    return o.memory ? bench_memory(&o) : bench_model(&o);
}
