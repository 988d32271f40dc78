/* cli/serve: `tokenloop serve`, the OpenAI-compatible HTTP server. Parses the
 * flags, starts listening before the model loads (so /health and /ready
 * answer 503 while it loads), then runs until SIGTERM/SIGINT: the first
 * drains, a second exits at once. The server itself lives in server/. */
#include <pthread.h>
#include <sys/resource.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../server/dialect.h"
#include "../server/http.h"
#include "../server/agent.h"
#include "../server/loop.h"
#include "cli.h"

static const char SERVE_HELP[] =
    "usage: tokenloop serve [-m FILE] [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions\n"
    "(streaming with \"stream\": true), POST /v1/embeddings, POST /v1/rerank (a reranker's\n"
    "file), GET /v1/models, POST /tokenize,\n"
    "POST /detokenize, GET /health, GET /ready, GET /metrics (Prometheus), GET /props.\n"
    "Ollama's API too (/api/*: docs/SERVER.md). Agents' other\n"
    "dialects too: OpenAI's Responses API (POST /v1/responses; GET and DELETE\n"
    "/v1/responses/{id}) and Anthropic's Messages API (POST /v1/messages,\n"
    "/v1/messages/count_tokens); docs/AGENTS.md. Every live request shares each\n"
    "forward call; prompt prefixes are cached and reused across requests.\n"
    "GET / is a live page of the loop: every sequence's tokens as they are chosen, with\n"
    "their probabilities and alternatives, the forward calls, speed and cache use, and a\n"
    "prompt box. GET /v1/loop streams the same records (server-sent events, one trace\n"
    "record per forward call, docs/TRACE.md) while someone follows it.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
    "                          or $TOKENLOOP_MODEL)\n"
    "      --host ADDR         address to bind (default 127.0.0.1: this machine only)\n"
    "      --port N            TCP port (default 8080)\n"
    "  -np, --parallel N       sequences decoded together (default 4)\n"
    "  -c, --ctx-size N        context per sequence in tokens (default: the model's training\n"
    "                          length when np sequences of it fit the memory left, else the\n"
    "                          longest that does; the ready line says which and why)\n"
    "      --kv-mem MiB        KV cache memory, shared by the sequences and the prefix\n"
    "                          cache (default: np x ctx positions, cut to 3/4 of the memory\n"
    "                          left after the model: MemAvailable, the cgroup limit,\n"
    "                          ulimit -v; a request that needs more is refused with a 4xx)\n"
    "      --cache-dir DIR     keep the prefix cache on disk too, so a restart keeps it: every\n"
    "                          cached block is written there in the background, and a prompt\n"
    "                          whose prefix is there is read back instead of computed; files of\n"
    "                          another model, numerics mode or KV type, and damaged ones, are\n"
    "                          ignored (and logged)\n"
    "      --cache-disk-mem MiB  the directory's budget (default 8192); the least recently\n"
    "                          used blocks are deleted first\n"
    "      --api-key KEY       require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on\n"
    "                          /v1/* (the live loop's stream too), /tokenize and\n"
    "                          /detokenize (401 otherwise)\n"
    "      --max-queue N       requests waiting beyond -np before 503 + Retry-After (default 64)\n"
    "  -t, --threads N         threads (default: all CPUs)\n"
    CLI_NUMERICS_HELP
    CLI_KV_TYPE_HELP
    CLI_SPEC_HELP
    "      --reasoning MODE    thinking between <think> and </think>, returned apart as\n"
    "                          reasoning_content: auto (default: if the chat template speaks of\n"
    "                          <think>), on (also opens <think> after the generation prompt\n"
    "                          when the template does not), off (all of it is content)\n"
    "      --pooling P         embeddings (POST /v1/embeddings, /api/embed): mean, cls, last or\n"
    "                          none (a vector per token); default: the file's pooling_type, else\n"
    "                          mean; a request's \"pooling\" overrides it. rank: a reranker's scores\n"
    "                          (POST /v1/rerank, which ranks whatever this says)\n"
    "      --rerank            llama-server's flag (also --reranking): --pooling rank, and refuse\n"
    "                          to start when the file has no classification head to rank with\n"
    "      --prefill-chunk N   prompt tokens per forward call and request (default 256)\n"
    "      --drain-timeout S   on SIGTERM, seconds to let running requests finish (default 30)\n"
    "      --max-conns-per-client N  open connections one client address may hold\n"
    "                          (default 512 of the server's 1000; more are closed at once,\n"
    "                          so one client cannot lock the others out; a proxy in front\n"
    "                          should queue beyond it, as deploy/haproxy/haproxy.cfg does)\n"
    "      --responses-store N  finished /v1/responses kept for previous_response_id and\n"
    "                          GET /v1/responses/{id} (default 1024; 0: none; the oldest go)\n"
    "      --responses-ttl S   seconds one is kept (default 3600)\n"
    "      --responses-mem MiB  their JSON's size at most (default 256; the oldest go)\n"
    "      --read-timeout S    seconds a client has to send a whole request (headers and\n"
    "                          body), counted from connecting or from the end of its previous\n"
    "                          reply, so idle keep-alive connections close too (default 30)\n"
    "      --agent-port N      answer HAProxy's agent-check on port N (same host): 'up ready W%'\n"
    "                          with W from this replica's load (sequences and queue, KV\n"
    "                          cache), 'drain' while draining, 'down' while loading\n"
    "                          (deploy/haproxy/)\n"
    "      --no-loop           no live page or /v1/loop\n"
    "\n"
    "SIGTERM or SIGINT drains: new completions and /ready get 503, running requests\n"
    "finish (up to --drain-timeout), then the server exits 0. A second signal exits 1 at\n"
    "once. Request bodies are limited to 8 MiB.\n";

static int parse_serve(int argc, char **argv, srv_opts *o) {
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        const char *v;
        int kt;
#define VAL() if (!(v = cli_arg(&p))) return -1
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(SERVE_HELP, stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL(); o->model_path = v;
        } else if (!strcmp(a, "--host")) {
            VAL(); o->host = v;
        } else if (!strcmp(a, "--max-conns-per-client")) {
            VAL(); if (cli_int(a, v, 1, 1000, &o->max_conn_per_ip)) return -1;
        } else if (!strcmp(a, "--responses-store")) {
            VAL(); if (cli_int(a, v, 0, 1 << 20, &o->responses_max)) return -1;
        } else if (!strcmp(a, "--responses-mem")) {
            VAL(); if (cli_int(a, v, 1, 1 << 20, &o->responses_mib)) return -1;
        } else if (!strcmp(a, "--responses-ttl")) {
            VAL(); if (cli_int(a, v, 1, 30 * 86400, &o->responses_ttl_s)) return -1;
        } else if (!strcmp(a, "--read-timeout")) {
            VAL(); if (cli_int(a, v, 1, 86400, &o->read_timeout_s)) return -1;
        } else if (!strcmp(a, "--agent-port")) {
            VAL(); if (cli_int(a, v, 1, 65535, &o->agent_port)) return -1;
        } else if (!strcmp(a, "--no-loop")) {
            o->no_loop = 1;
        } else if (!strcmp(a, "--port")) {
            VAL(); if (cli_int(a, v, 1, 65535, &o->port)) return -1;
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            VAL(); if (cli_int(a, v, 1, 1024, &o->n_parallel)) return -1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            VAL(); if (cli_int(a, v, 0, 1 << 22, &o->n_ctx)) return -1;
        } else if (!strcmp(a, "--kv-mem")) {
            VAL(); if (cli_int(a, v, 0, 1 << 24, &o->kv_mem_mib)) return -1;
        } else if (!strcmp(a, "--api-key")) {
            VAL();
            if (!*v) {
                cli_error("--api-key: empty key");
                return -1;
            }
            o->api_key = v;
        } else if (!strcmp(a, "--max-queue")) {
            VAL(); if (cli_int(a, v, 0, 1 << 20, &o->max_queue)) return -1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL(); if (cli_int(a, v, 1, 1024, &o->n_threads)) return -1;
        } else if (!strcmp(a, "--numerics")) {
            VAL(); if (cli_numerics(a, v, &o->numerics)) return -1;
        } else if (!strcmp(a, "--cache-dir")) {
            VAL(); o->cache_dir = v;
        } else if (!strcmp(a, "--cache-disk-mem")) {
            VAL(); if (cli_int(a, v, 1, 1 << 30, &o->cache_disk_mib)) return -1;
        } else if ((kt = cli_kv_type_opt(&p, a, &o->kv_type_k, &o->kv_type_v)) != 0) {
            if (kt < 0) return -1;
        } else if (!strcmp(a, "--swa-full")) {
            o->swa_full = 1;
        } else if (!strcmp(a, "--spec")) {
            VAL(); if (cli_spec(a, v, &o->spec)) return -1;
        } else if (!strcmp(a, "--reasoning")) {
            VAL();
            if (!strcmp(v, "off")) o->reasoning = 0;
            else if (!strcmp(v, "auto")) o->reasoning = 1;
            else if (!strcmp(v, "on")) o->reasoning = 2;
            else {
                cli_error("--reasoning: 'auto', 'on' or 'off', not '%s'", v);
                return -1;
            }
        } else if (!strcmp(a, "--draft")) {
            VAL(); o->draft_path = v;
        } else if (!strcmp(a, "--prefill-chunk")) {
            VAL(); if (cli_int(a, v, 1, 1 << 20, &o->prefill_chunk)) return -1;
        } else if (!strcmp(a, "--pooling")) {
            VAL();
            if ((o->pooling = tl_pooling_parse(v)) < 0) {
                cli_error("--pooling '%s': expected none, mean, cls, last or rank", v);
                return -1;
            }
        } else if (!strcmp(a, "--rerank") || !strcmp(a, "--reranking")) {
            o->pooling = TL_POOL_RANK;
        } else if (!strcmp(a, "--drain-timeout")) {
            VAL(); if (cli_int(a, v, 0, 86400, &o->drain_timeout_s)) return -1;
        } else {
            cli_error("unknown option '%s' (try 'tokenloop serve --help')", a);
            return -1;
        }
#undef VAL
    }
    if (more < 0) return -1;
    return 0;
}

/* Signals arrive here, on a thread of their own (sigwait), not in a handler. */
typedef struct sigs {
    sigset_t set;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count;
    int done; /* serve has returned: the next signal (ours, from sig_stop) ends the thread */
} sigs;

static void *sig_thread(void *arg) {
    sigs *s = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&s->set, &sig)) continue;
        pthread_mutex_lock(&s->mu);
        if (s->done) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        int n = ++s->count;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (n >= 2) {
            fprintf(stderr, "tokenloop serve: second signal, exiting now\n");
            _exit(1);
        }
        fprintf(stderr, "tokenloop serve: draining (signal again to exit now)\n");
    }
    return NULL;
}

/* Ends sig_thread and joins it, so that exit leaves no thread behind. It waits
 * in sigwait: a signal it waits for, sent to it alone, wakes it to see done. */
static void sig_stop(sigs *s, pthread_t th) {
    pthread_mutex_lock(&s->mu);
    s->done = 1;
    pthread_mutex_unlock(&s->mu);
    if (pthread_kill(th, SIGTERM) == 0) pthread_join(th, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void wait_signal(sigs *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->count) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Lets running requests finish, up to the drain timeout, then the last replies go out. */
static void drain(srv_app *app) {
    atomic_store(&app->phase, SRV_PHASE_DRAINING);
    srv_sched_drain(app->sched);
    double end = now_s() + app->o->drain_timeout_s;
    while (srv_sched_pending(app->sched) > 0 && now_s() < end) usleep(20000);
    end = now_s() + 2;
    while (atomic_load(&app->busy) > 0 && now_s() < end) usleep(10000);
}

/* Test hook, for tests only: with TL_TEST_LOAD_GATE=PATH the model load
 * waits until PATH exists, so a test sees the loading phase for as long as it
 * needs instead of racing a real load (tests/py/test_server_health.py). A
 * signal meanwhile ends the wait: -1, nothing to load. */
static int test_load_gate(sigs *sg) {
    const char *gate = getenv("TL_TEST_LOAD_GATE");
    if (!gate || !*gate) return 0;
    fprintf(stderr, "tokenloop serve: TL_TEST_LOAD_GATE: the load waits for %s\n", gate);
    for (;;) {
        if (access(gate, F_OK) == 0) return 0;
        pthread_mutex_lock(&sg->mu);
        int n = sg->count;
        pthread_mutex_unlock(&sg->mu);
        if (n) return -1;
        usleep(20000);
    }
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int serve(srv_opts *o, sigs *sg) {
    tl_error err = {0};
    srv_app app;
    memset(&app, 0, sizeof app);
    app.o = o;
    atomic_init(&app.phase, SRV_PHASE_LOADING);
    atomic_init(&app.busy, 0);
    if (!(app.mx = srv_metrics_new())) {
        cli_error("out of memory");
        return 1;
    }
    if (!o->no_loop && srv_loop_new(256, &app.loop)) {
        cli_error("out of memory");
        srv_metrics_free(app.mx);
        return 1;
    }
    o->loop = app.loop;
    srv_http *h = NULL;
    if (srv_http_start(&app, &h, &err)) {
        cli_tl_error(&err);
        srv_loop_free(app.loop);
        srv_metrics_free(app.mx);
        return 1;
    }
    srv_agent *agent = NULL;
    if (o->agent_port && srv_agent_start(&app, o->host, o->agent_port, &agent, &err)) {
        cli_tl_error(&err);
        srv_loop_close(app.loop);
        srv_http_stop(h);
        srv_loop_free(app.loop);
        srv_metrics_free(app.mx);
        return 1;
    }
    fprintf(stderr, "tokenloop serve: listening on http://%s:%d, loading %s\n", o->host, o->port,
            o->model_path);
    tl_model *m = NULL, *dm = NULL;
    tl_chat_template *ctmpl = NULL;
    resp_store *store = NULL;
    int rc = 1;
    if (test_load_gate(sg)) {
        rc = 0;
    } else if (tl_model_load(o->model_path, &m, &err)) {
        cli_error("%s: %s", o->model_path, err.msg);
    } else if (o->pooling == TL_POOL_RANK && tl_model_n_cls_out(m) <= 0) {
        cli_error("%s: --rerank (--pooling rank) needs a classification head (cls.weight or cls.output.weight), "
                  "which this file does not have: it is not a reranker", o->model_path);
    } else if (o->spec == TL_SPEC_DRAFT && !o->draft_path) {
        cli_error("--spec draft needs --draft FILE");
    } else if (o->draft_path && (tl_model_load(o->draft_path, &dm, &err) || tl_spec_check_draft(m, dm, &err))) {
        cli_error("--draft %s: %s", o->draft_path, err.msg);
    } else if ((o->draft = dm, srv_sched_new(m, o, app.mx, &app.sched, &err))) {
        cli_tl_error(&err);
    } else if (o->responses_max && !(store = resp_store_new(o->responses_max, o->responses_ttl_s,
                                                                   (size_t)o->responses_mib << 20))) {
        cli_error("out of memory");
    } else {
        app.m = m;
        const char *tmpl = tl_model_chat_template(m);
        /* compiled once here; one that fails is compiled (and refused, with
         * its error) per chat request, and completions still work */
        if (tmpl && tl_chat_template_new(m, NULL, &ctmpl, &err))
            fprintf(stderr, "tokenloop serve: warning: %s; chat requests will fail\n", err.msg);
        const char *think_open, *think_close;
        const int thinks = tl_chat_think_markers(tmpl, &think_open, &think_close);
        app.api = (api_ctx){m, o->model_id, srv_sched_n_ctx(app.sched), 1024,
                            o->reasoning == 2 ? 2 : o->reasoning == 1 && thinks ? 1 : 0,
                            ctmpl, store, o->model_path, o->n_parallel};
        atomic_store(&app.phase, SRV_PHASE_READY);
        tl_kv_stats kv;
        srv_sched_kv_stats(app.sched, &kv);
        fprintf(stderr,
                "tokenloop serve: ready (model %s, -np %d, context %d per sequence; KV cache %s/%s, %zu bytes per "
                "position, %d blocks of %d positions = %.1f MiB; %s)\n",
                o->model_id, o->n_parallel, app.api.n_ctx, tl_kv_type_name(kv.kv_type_k), tl_kv_type_name(kv.kv_type_v),
                kv.block_bytes / (size_t)kv.block_size, kv.n_blocks, kv.block_size,
                (double)kv.block_bytes * kv.n_blocks / (1 << 20), srv_sched_sizing(app.sched));
        if (o->cache_dir) {
            tl_disk_stats d;
            srv_sched_disk_stats(app.sched, &d);
            fprintf(stderr, "tokenloop serve: disk cache %s: %llu blocks (%.1f MiB) of this model and settings, "
                    "budget %.0f MiB\n", o->cache_dir, (unsigned long long)d.files, (double)d.bytes / (1 << 20),
                    (double)d.budget / (1 << 20));
        }
        wait_signal(sg);
        drain(&app);
        rc = 0;
    }
    /* Whatever still runs gets an error event, so no reader waits forever. */
    if (app.sched) srv_sched_free(app.sched);
    double end = now_s() + 1;
    while (atomic_load(&app.busy) > 0 && now_s() < end) usleep(10000);
    srv_agent_stop(agent);
    srv_loop_close(app.loop); /* its readers end their streams */
    srv_http_stop(h);
    srv_loop_free(app.loop);
    srv_metrics_free(app.mx);
    tl_chat_template_free(ctmpl);
    resp_store_free(store);
    tl_model_free(dm);
    tl_model_free(m);
    return rc;
}

int cmd_serve(int argc, char **argv) {
    char buf[4096];
    srv_opts o = {.host = "127.0.0.1", .port = 8080, .n_parallel = 4, .spec = TL_SPEC_AUTO, .max_queue = 64,
                  .n_batch = 512, .prefill_chunk = 256, .drain_timeout_s = 30, .read_timeout_s = 30, .reasoning = 1,
                  .responses_max = 1024, .responses_ttl_s = 3600, .responses_mib = 256,
                  .max_body = (size_t)8 << 20, .pooling = TL_POOL_MODEL};
    int pr = parse_serve(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : EXIT_USAGE;
    cli_kv_type_warn(o.kv_type_k, o.kv_type_v);
#ifdef __GLIBC__
    /* Under ulimit -v, glibc's per-thread malloc arenas (64 MiB of address
     * space each, one per thread up to 8 x cores: HTTP threads come and go)
     * took the room the KV pool was sized to leave, and requests failed for
     * want of address space; two arenas are plenty for the server's
     * allocations, which are few and off the hot path. */
    struct rlimit as;
    if (!getrlimit(RLIMIT_AS, &as) && as.rlim_cur != RLIM_INFINITY) mallopt(M_ARENA_MAX, 2);
#endif
    if (!o.model_path) o.model_path = cli_default_model(buf, sizeof buf);
    o.model_id = base_name(o.model_path);
    sigs sg = {.count = 0};
    sigemptyset(&sg.set);
    sigaddset(&sg.set, SIGTERM);
    sigaddset(&sg.set, SIGINT);
    /* Blocked before any thread starts, so only sig_thread ever sees them. */
    pthread_sigmask(SIG_BLOCK, &sg.set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&sg.mu, NULL);
    pthread_cond_init(&sg.cv, NULL);
    pthread_t st;
    if (pthread_create(&st, NULL, sig_thread, &sg)) {
        cli_error("cannot start the signal thread");
        return 1;
    }
    int rc = serve(&o, &sg);
    sig_stop(&sg, st);
    pthread_cond_destroy(&sg.cv);
    pthread_mutex_destroy(&sg.mu);
    return rc;
}
