/* Metrics rendering: updates from many threads, then the Prometheus text is
 * parsed back line by line and every value checked against what was fed in
 * (counts, cumulative buckets, sums, gauges, vLLM names, label escaping). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "tl_test.h"

/* The value of the sample line that starts with `series` followed by a space,
 * or NAN if none. */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
        p = eol ? eol + 1 : NULL;
    }
    return NAN;
}

static int count_lines(const char *text, const char *prefix) {
    int k = 0;
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, prefix, n) == 0) k++;
        const char *eol = strchr(p, '\n');
        p = eol ? eol + 1 : NULL;
    }
    return k;
}

/* Every non-comment line is `name{labels} value` with a parseable value, and
 * every family has HELP and TYPE lines before its samples. */
static int well_formed(const char *text) {
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        if (!eol) return 0; /* the format ends every line with \n */
        if (*p != '#') {
            const char *sp = eol;
            while (sp > p && sp[-1] != ' ') sp--;
            char *end;
            strtod(sp, &end);
            if (end != eol || sp == p) return 0;
        }
        p = eol + 1;
    }
    return 1;
}

#define N_THREADS 4
#define PER_THREAD 1000

static void *hammer(void *arg) {
    srv_metrics *mx = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        srv_metrics_request(mx, "/v1/chat/completions", i % 10 == 0 ? 503 : 200);
        srv_metrics_tokens(mx, 3, 2, 1);
        srv_metrics_ttft(mx, 0.003);
        srv_metrics_itl(mx, 0.5 + 1.0); /* 1.5 s: between the 1 and 2.5 buckets */
    }
    return NULL;
}

int main(void) {
    srv_metrics *mx = srv_metrics_new();
    CHECK(mx != NULL, "srv_metrics_new");
    if (!mx) return tl_test_summary();

    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, hammer, mx);
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    srv_metrics_request(mx, "/v1/completions", 400);
    srv_metrics_ttft(mx, 100.0); /* beyond every bound: only +Inf */
    tl_kv_stats kv = {.block_size = TL_KV_BLOCK, .n_blocks = 200, .n_used = 50, .n_cached = 30,
                      .n_free = 150, .query_tokens = 1000, .hit_tokens = 640};
    srv_metrics_state(mx, 7, 3, &kv);

    char *txt = NULL;
    size_t len = 0;
    CHECK(srv_metrics_render(mx, "my \"model\"\\x", &txt, &len) == 0, "render");
    if (!txt) return tl_test_summary();
    CHECK(len == strlen(txt), "length %zu vs %zu", len, strlen(txt));
    CHECK(well_formed(txt), "every sample line parses");

    const int total = N_THREADS * PER_THREAD;
    CHECK(sample(txt, "tokenloop_requests_total{endpoint=\"/v1/chat/completions\",code=\"200\"}") ==
              total * 9 / 10, "200s");
    CHECK(sample(txt, "tokenloop_requests_total{endpoint=\"/v1/chat/completions\",code=\"503\"}") ==
              total / 10, "503s");
    CHECK(sample(txt, "tokenloop_requests_total{endpoint=\"/v1/completions\",code=\"400\"}") == 1, "400");
    CHECK(sample(txt, "tokenloop_prompt_tokens_total") == 3.0 * total, "prompt tokens");
    CHECK(sample(txt, "tokenloop_generation_tokens_total") == 2.0 * total, "generated tokens");

    /* TTFT: total observations of 3 ms, in every bucket from le=0.005 up, and one of 100 s. */
    CHECK(sample(txt, "tokenloop_time_to_first_token_seconds_bucket{le=\"0.001\"}") == 0, "ttft le 1ms");
    CHECK(sample(txt, "tokenloop_time_to_first_token_seconds_bucket{le=\"0.005\"}") == total, "ttft le 5ms");
    CHECK(sample(txt, "tokenloop_time_to_first_token_seconds_bucket{le=\"80\"}") == total, "ttft le 80");
    CHECK(sample(txt, "tokenloop_time_to_first_token_seconds_bucket{le=\"+Inf\"}") == total + 1, "ttft +Inf");
    CHECK(sample(txt, "tokenloop_time_to_first_token_seconds_count") == total + 1, "ttft count");
    CHECK_NEAR(sample(txt, "tokenloop_time_to_first_token_seconds_sum"), 0.003 * total + 100.0, 1e-6,
               "ttft sum");
    CHECK(sample(txt, "tokenloop_inter_token_latency_seconds_bucket{le=\"1\"}") == 0, "itl le 1");
    CHECK(sample(txt, "tokenloop_inter_token_latency_seconds_bucket{le=\"2.5\"}") == total, "itl le 2.5");
    CHECK(count_lines(txt, "tokenloop_inter_token_latency_seconds_bucket") >= 10, "itl buckets");

    CHECK(sample(txt, "tokenloop_requests_waiting") == 7, "waiting");
    CHECK(sample(txt, "tokenloop_sequences_active") == 3, "active");
    CHECK(sample(txt, "tokenloop_kv_blocks_used") == 50, "blocks used");
    CHECK(sample(txt, "tokenloop_kv_blocks_total") == 200, "blocks total");
    CHECK(sample(txt, "tokenloop_prefix_cache_hit_tokens_total") == 640, "hit tokens");
    CHECK(sample(txt, "tokenloop_prefix_cache_query_tokens_total") == 1000, "query tokens");

    const char *lab = "{model_name=\"my \\\"model\\\"\\\\x\"}";
    char series[160];
    snprintf(series, sizeof series, "vllm:num_requests_running%s", lab);
    CHECK(sample(txt, series) == 3, "vllm running");
    snprintf(series, sizeof series, "vllm:num_requests_waiting%s", lab);
    CHECK(sample(txt, series) == 7, "vllm waiting");
    snprintf(series, sizeof series, "vllm:kv_cache_usage_perc%s", lab);
    CHECK_NEAR(sample(txt, series), 50.0 / 200.0, 1e-12, "vllm kv usage");
    snprintf(series, sizeof series, "vllm:gpu_cache_usage_perc%s", lab);
    CHECK_NEAR(sample(txt, series), 50.0 / 200.0, 1e-12, "vllm gpu usage");
    snprintf(series, sizeof series, "vllm:prefix_cache_queries_total%s", lab);
    CHECK(sample(txt, series) == 1000, "vllm queries");
    snprintf(series, sizeof series, "vllm:prefix_cache_hits_total%s", lab);
    CHECK(sample(txt, series) == 640, "vllm hits");

    /* HELP and TYPE for every family. */
    const char *fam[] = {"tokenloop_requests_total", "tokenloop_time_to_first_token_seconds",
                         "tokenloop_inter_token_latency_seconds", "tokenloop_sequences_active",
                         "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char h[128], t[128];
        snprintf(h, sizeof h, "# HELP %s ", fam[i]);
        snprintf(t, sizeof t, "# TYPE %s ", fam[i]);
        CHECK(count_lines(txt, h) == 1 && count_lines(txt, t) == 1, "HELP/TYPE of %s", fam[i]);
    }
    CHECK(count_lines(txt, "# TYPE tokenloop_time_to_first_token_seconds histogram") == 1, "histogram type");
    free(txt);

    /* A fresh registry renders zeros, not garbage. */
    srv_metrics *m2 = srv_metrics_new();
    CHECK(srv_metrics_render(m2, "m", &txt, &len) == 0 && txt, "render empty");
    if (txt) {
        CHECK(well_formed(txt), "empty well formed");
        CHECK(sample(txt, "vllm:kv_cache_usage_perc{model_name=\"m\"}") == 0, "empty usage");
        CHECK(sample(txt, "tokenloop_time_to_first_token_seconds_count") == 0, "empty count");
    }
    free(txt);
    srv_metrics_free(m2);
    srv_metrics_free(mx);
    return tl_test_summary();
}
