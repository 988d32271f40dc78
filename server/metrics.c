/* metrics: the counters, histograms and gauges behind GET /metrics, guarded by
 * their own mutex (HTTP threads and the scheduler update them), rendered as
 * Prometheus text 0.0.4, with the few gauges routers read also under vLLM's
 * names. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"

/* Upper bounds in seconds, as vLLM's: single-token latencies on a CPU span
 * milliseconds to seconds. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                     0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025,
                                    0.03,  0.04,   0.05,  0.075, 0.1,  0.15, 0.2,
                                    0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0};
#define N_TTFT (sizeof ttft_bounds / sizeof ttft_bounds[0])
#define N_ITL (sizeof itl_bounds / sizeof itl_bounds[0])
#define MAX_ENDPOINT 48

typedef struct hist {
    const double *bounds;
    size_t n;
    uint64_t counts[32]; /* per bucket, not cumulative; [n] is +Inf */
    double sum;
    uint64_t count;
} hist;

typedef struct req_count {
    char endpoint[MAX_ENDPOINT];
    int code;
    uint64_t n;
} req_count;

struct srv_metrics {
    pthread_mutex_t mu;
    req_count *req;
    int n_req, cap_req;
    uint64_t prompt_tokens, gen_tokens, cached_tokens;
    uint64_t spec_drafted, spec_accepted;
    hist ttft, itl;
    int waiting, running;
    tl_kv_stats kv;
    tl_disk_stats disk;
    int has_disk;
    uint64_t timeouts;
    int conns;
};

srv_metrics *srv_metrics_new(void) {
    srv_metrics *mx = calloc(1, sizeof *mx);
    if (!mx) return NULL;
    if (pthread_mutex_init(&mx->mu, NULL) != 0) {
        free(mx);
        return NULL;
    }
    mx->ttft.bounds = ttft_bounds;
    mx->ttft.n = N_TTFT;
    mx->itl.bounds = itl_bounds;
    mx->itl.n = N_ITL;
    return mx;
}

void srv_metrics_free(srv_metrics *mx) {
    if (!mx) return;
    pthread_mutex_destroy(&mx->mu);
    free(mx->req);
    free(mx);
}

void srv_metrics_request(srv_metrics *mx, const char *endpoint, int code) {
    if (!mx) return;
    if (!endpoint) endpoint = "";
    pthread_mutex_lock(&mx->mu);
    for (int i = 0; i < mx->n_req; i++) {
        if (mx->req[i].code == code && strncmp(mx->req[i].endpoint, endpoint, MAX_ENDPOINT - 1) == 0) {
            mx->req[i].n++;
            pthread_mutex_unlock(&mx->mu);
            return;
        }
    }
    if (mx->n_req == mx->cap_req) {
        /* Endpoints are fixed routes and codes a handful, so this stays small. */
        int cap = mx->cap_req ? 2 * mx->cap_req : 16;
        req_count *p = realloc(mx->req, (size_t)cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&mx->mu);
            return;
        }
        mx->req = p;
        mx->cap_req = cap;
    }
    req_count *rc = &mx->req[mx->n_req++];
    snprintf(rc->endpoint, sizeof rc->endpoint, "%s", endpoint);
    rc->code = code;
    rc->n = 1;
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_timeout(srv_metrics *mx) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    mx->timeouts++;
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_conns(srv_metrics *mx, int delta) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    mx->conns += delta;
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_tokens(srv_metrics *mx, int prompt, int generated, int cached) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    mx->prompt_tokens += (uint64_t)(prompt > 0 ? prompt : 0);
    mx->gen_tokens += (uint64_t)(generated > 0 ? generated : 0);
    mx->cached_tokens += (uint64_t)(cached > 0 ? cached : 0);
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_spec(srv_metrics *mx, int drafted, int accepted) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    mx->spec_drafted += (uint64_t)(drafted > 0 ? drafted : 0);
    mx->spec_accepted += (uint64_t)(accepted > 0 ? accepted : 0);
    pthread_mutex_unlock(&mx->mu);
}

static void hist_add(hist *h, double v) {
    if (!(v >= 0)) v = 0; /* NaN or a clock step back */
    size_t i = 0;
    while (i < h->n && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void srv_metrics_ttft(srv_metrics *mx, double seconds) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    hist_add(&mx->ttft, seconds);
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_itl(srv_metrics *mx, double seconds) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    hist_add(&mx->itl, seconds);
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_state(srv_metrics *mx, int waiting, int running, const tl_kv_stats *kv) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    mx->waiting = waiting;
    mx->running = running;
    if (kv) mx->kv = *kv;
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_disk(srv_metrics *mx, const tl_disk_stats *d) {
    if (!mx) return;
    pthread_mutex_lock(&mx->mu);
    mx->disk = *d;
    mx->has_disk = 1;
    pthread_mutex_unlock(&mx->mu);
}

void srv_metrics_load(srv_metrics *mx, int *waiting, int *running, tl_kv_stats *kv) {
    pthread_mutex_lock(&mx->mu);
    *waiting = mx->waiting;
    *running = mx->running;
    *kv = mx->kv;
    pthread_mutex_unlock(&mx->mu);
}

/* ---- rendering ------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A label value with \, " and newline escaped as the text format asks. */
static void sb_label(sbuf *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\') sb_printf(b, "\\\\");
        else if (*v == '"') sb_printf(b, "\\\"");
        else if (*v == '\n') sb_printf(b, "\\n");
        else sb_printf(b, "%c", *v);
    }
}

static void sb_head(sbuf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sb_hist(sbuf *b, const char *name, const char *help, const hist *h) {
    sb_head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{le=\"%.9g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    sb_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

static void sb_simple(sbuf *b, const char *name, const char *type, const char *help, double v) {
    sb_head(b, name, type, help);
    sb_printf(b, "%s %.17g\n", name, v);
}

static void sb_vllm(sbuf *b, const char *name, const char *type, const char *help,
                    const char *model, double v) {
    sb_head(b, name, type, help);
    sb_printf(b, "%s{model_name=\"", name);
    sb_label(b, model);
    sb_printf(b, "\"} %.17g\n", v);
}

/* The process's resident memory in bytes (0: unknown), read outside the lock. */
static double resident_bytes(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return rss > 0 ? (double)rss * (double)sysconf(_SC_PAGESIZE) : 0.0;
}

static void render_ours(sbuf *b, const srv_metrics *mx, double rss) {
    sb_head(b, "tokenloop_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (int i = 0; i < mx->n_req; i++) {
        sb_printf(b, "tokenloop_requests_total{endpoint=\"");
        sb_label(b, mx->req[i].endpoint);
        sb_printf(b, "\",code=\"%d\"} %llu\n", mx->req[i].code, (unsigned long long)mx->req[i].n);
    }
    sb_simple(b, "tokenloop_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
              (double)mx->prompt_tokens);
    sb_simple(b, "tokenloop_generation_tokens_total", "counter", "Tokens generated by finished requests.",
              (double)mx->gen_tokens);
    sb_simple(b, "tokenloop_spec_draft_tokens_total", "counter",
              "Speculative guesses verified in forward calls.", (double)mx->spec_drafted);
    sb_simple(b, "tokenloop_spec_accepted_tokens_total", "counter",
              "Speculative guesses kept (the token sampled at their position equalled them).",
              (double)mx->spec_accepted);
    sb_hist(b, "tokenloop_time_to_first_token_seconds", "From arrival to the first generated token.",
            &mx->ttft);
    sb_hist(b, "tokenloop_inter_token_latency_seconds", "Between consecutive generated tokens of a request.",
            &mx->itl);
    sb_simple(b, "tokenloop_requests_waiting", "gauge", "Requests queued, not yet running.", mx->waiting);
    sb_simple(b, "tokenloop_sequences_active", "gauge", "Requests running in a sequence.", mx->running);
    sb_simple(b, "tokenloop_kv_blocks_used", "gauge", "KV blocks held by running sequences.", mx->kv.n_used);
    sb_simple(b, "tokenloop_kv_blocks_total", "gauge", "KV blocks in the pool.", mx->kv.n_blocks);
    sb_simple(b, "tokenloop_kv_blocks_cached", "gauge", "KV blocks nobody holds that keep a cached prefix.",
              mx->kv.n_cached);
    sb_simple(b, "tokenloop_kv_blocks_touched", "gauge",
              "KV blocks ever handed out: the pool's memory written so far.", mx->kv.n_touched);
    sb_simple(b, "tokenloop_kv_block_bytes", "gauge",
              "Memory of one KV block (the pool's layers: all but sliding-window ones kept in rings; K and V).",
              (double)mx->kv.block_bytes);
    sb_simple(b, "tokenloop_kv_bytes_per_position", "gauge",
              "KV cache memory one position takes in the pool (its layers, K and V, in the cache's types).",
              (double)mx->kv.block_bytes / (mx->kv.block_size > 0 ? mx->kv.block_size : 1));
    if (mx->kv.window_bytes)
        sb_simple(b, "tokenloop_kv_window_bytes_per_sequence", "gauge",
                  "Memory of one sequence's ring of sliding-window layers (its last window plus a batch).",
                  (double)mx->kv.window_bytes);
    if (mx->kv.state_bytes)
        sb_simple(b, "tokenloop_state_bytes_per_sequence", "gauge",
                  "Memory of one sequence's recurrent state (Gated DeltaNet layers).", (double)mx->kv.state_bytes);
    if (mx->kv.state_bytes || mx->kv.window_bytes) {
        sb_simple(b, "tokenloop_state_snapshots", "gauge",
                  "Sequence states (recurrent, sliding windows) kept at cached prefixes' block boundaries, where a "
                  "prompt may resume.",
                  (double)mx->kv.n_snapshots);
        sb_simple(b, "tokenloop_state_snapshot_bytes", "gauge", "Memory of those states.",
                  (double)mx->kv.snapshot_bytes);
    }
    if (mx->has_disk) {
        sb_simple(b, "tokenloop_disk_cache_blocks", "gauge", "Prefix-cache blocks on disk (--cache-dir).",
                  (double)mx->disk.files);
        sb_simple(b, "tokenloop_disk_cache_bytes", "gauge", "Bytes of those blocks' files.", (double)mx->disk.bytes);
        sb_simple(b, "tokenloop_disk_cache_budget_bytes", "gauge", "--cache-disk-mem.", (double)mx->disk.budget);
        sb_simple(b, "tokenloop_disk_cache_written_total", "counter", "Blocks written to disk.",
                  (double)mx->disk.written);
        sb_simple(b, "tokenloop_disk_cache_loaded_total", "counter", "Blocks read back into the prefix cache.",
                  (double)mx->disk.loaded);
        sb_simple(b, "tokenloop_disk_cache_rejected_total", "counter",
                  "Block files ignored: another model's, or damaged.", (double)mx->disk.rejected);
        sb_simple(b, "tokenloop_disk_cache_dropped_total", "counter",
                  "Blocks not written because the writer was behind.", (double)mx->disk.dropped);
        sb_simple(b, "tokenloop_disk_cache_evicted_total", "counter", "Block files deleted for the budget.",
                  (double)mx->disk.evicted);
    }
    sb_simple(b, "tokenloop_prefix_cache_hit_tokens_total", "counter",
              "Prompt positions reused from the prefix cache.", (double)mx->kv.hit_tokens);
    sb_simple(b, "tokenloop_prefix_cache_query_tokens_total", "counter",
              "Prompt tokens looked up in the prefix cache.", (double)mx->kv.query_tokens);
    sb_simple(b, "tokenloop_connections_open", "gauge", "HTTP connections open.", mx->conns);
    sb_simple(b, "tokenloop_connections_timed_out_total", "counter",
              "Connections closed for not sending a whole request within --read-timeout.",
              (double)mx->timeouts);
    /* the process's resident memory, as Prometheus's client libraries name it:
     * flat under steady load once the KV pool has been touched */
    if (rss > 0) sb_simple(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss);
}

static void render_vllm(sbuf *b, const srv_metrics *mx, const char *model) {
    double usage = mx->kv.n_blocks > 0 ? (double)mx->kv.n_used / mx->kv.n_blocks : 0.0;
    sb_vllm(b, "vllm:num_requests_running", "gauge", "Requests running (tokenloop_sequences_active).",
            model, mx->running);
    sb_vllm(b, "vllm:num_requests_waiting", "gauge", "Requests waiting (tokenloop_requests_waiting).",
            model, mx->waiting);
    sb_vllm(b, "vllm:kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use, 0..1.", model, usage);
    sb_vllm(b, "vllm:gpu_cache_usage_perc", "gauge", "The same fraction under its name before vLLM 0.9.",
            model, usage);
    sb_vllm(b, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
            model, (double)mx->kv.query_tokens);
    sb_vllm(b, "vllm:spec_decode_num_draft_tokens_total", "counter",
            "Speculative guesses verified (tokenloop_spec_draft_tokens_total).", model, (double)mx->spec_drafted);
    sb_vllm(b, "vllm:spec_decode_num_accepted_tokens_total", "counter",
            "Speculative guesses kept (tokenloop_spec_accepted_tokens_total).", model, (double)mx->spec_accepted);
    sb_vllm(b, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", model,
            (double)mx->kv.hit_tokens);
}

int srv_metrics_render(srv_metrics *mx, const char *model_id, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    if (!mx) return TL_ERR_ARG;
    sbuf b = {malloc(4096), 0, 4096, 0};
    if (!b.p) return TL_ERR_NOMEM;
    b.p[0] = 0;
    double rss = resident_bytes();
    pthread_mutex_lock(&mx->mu);
    render_ours(&b, mx, rss);
    render_vllm(&b, mx, model_id ? model_id : "");
    pthread_mutex_unlock(&mx->mu);
    if (b.oom) {
        free(b.p);
        return TL_ERR_NOMEM;
    }
    *out = b.p;
    if (len) *len = b.len;
    return 0;
}
