/* server: the pieces of `tokenloop serve` and the contracts between them.
 * HTTP threads (http.c) parse and validate a request (validate.c) into an srv_req,
 * the scheduler thread (sched.c) runs every live request in shared forward
 * calls and appends events to each, and the HTTP thread turns those events
 * into a JSON reply or SSE chunks. metrics.c keeps the counters /metrics
 * shows. Only include/tokenloop.h is used from the engine. */
#ifndef TL_SERVER_H
#define TL_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "tokenloop.h"

#define SRV_MAX_TOP 20

/* ---- options (cli/cmd_serve.c fills them) ---------------------------------- */
typedef struct srv_opts {
    const char *model_path;
    const char *host;      /* "127.0.0.1" */
    int port;              /* 8080 */
    int n_parallel;        /* -np: sequences decoded together (4) */
    int n_ctx;             /* -c: positions per sequence (0 = min(train, 4096)) */
    int kv_mem_mib;        /* --kv-mem (0 = np x c positions, cut to the memory left) */
    const char *api_key;   /* NULL = no auth */
    int max_queue;         /* --max-queue: waiting requests before 503 (64) */
    int n_threads;         /* -t (0 = all cores) */
    int numerics;          /* --numerics (tl_numerics; 0 = $TL_NUMERICS, else fast) */
    int kv_type_k, kv_type_v; /* --kv-type, --kv-type-k/-v (tl_kv_type; 0 = f16) */
    int swa_full;          /* --swa-full (tl_ctx_params.swa_full) */
    const char *cache_dir; /* --cache-dir: the prefix cache on disk too (NULL: RAM only) */
    int cache_disk_mib;    /* --cache-disk-mem: its budget (0 = 8192) */
    int spec;              /* --spec (tl_spec_mode) */
    const char *draft_path;     /* --draft FILE */
    const tl_model *draft;      /* that model, loaded (and checked) by the caller; NULL: none */
    int n_batch;           /* tokens per forward call (512) */
    int prefill_chunk;     /* --prefill-chunk: prompt tokens per step (256) */
    int drain_timeout_s;   /* --drain-timeout (30) */
    size_t max_body;       /* bytes (8 MiB) */
    const char *model_id;  /* name in replies and /v1/models (file's base name) */
    int reasoning;         /* --reasoning: 0 off, 1 auto (the template speaks of <think>), 2 on */
    int no_loop;           /* --no-loop */
    int agent_port;        /* --agent-port: HAProxy's agent-check (0: none) */
    int max_conn_per_ip;   /* --max-conns-per-client: open connections one address may hold (512) */
    int responses_max;     /* --responses-store: stored Responses kept (1024; 0: none) */
    int responses_ttl_s;   /* --responses-ttl: seconds one is kept (3600) */
    int responses_mib;     /* --responses-mem: MiB of stored responses' JSON (256) */
    int read_timeout_s;    /* --read-timeout: seconds to send a whole request, from connecting or the last reply (30) */
    struct srv_loop *loop; /* where the scheduler publishes its trace while someone watches; NULL: nowhere */
    int pooling;           /* --pooling: embeddings' default (tl_pooling; TL_POOL_MODEL: the file's, else mean) */
} srv_opts;

/* ---- a request and its events ------------------------------------------------ */
typedef enum srv_kind { SRV_CHAT, SRV_COMPLETION, SRV_EMBED } srv_kind;

/* An embedding request's work (SRV_EMBED; server/embed.c parses and replies):
 * its inputs, embedded one at a time by the scheduler's thread between decode
 * steps, on the context's implicit sequence 0 (tl_ctx_embed). */
typedef struct srv_embed {
    int n;            /* inputs */
    int32_t **tok;    /* tok[i][0..n_tok[i]): input i's tokens (owned) */
    int *n_tok;
    int pooling;      /* tl_pooling, resolved (never TL_POOL_MODEL) */
    int normalize;    /* unit L2 length */
    int d;            /* floats per row: tl_model_n_embd */
    float *out;       /* the rows, input after input: one each, n_tok[i] each for TL_POOL_NONE */
    size_t *off;      /* off[i]: input i's first float in out */
    int done;         /* inputs embedded (scheduler thread only) */
    int fmt;          /* the reply's shape (embed.c's EMB_*) */
    int base64;       /* encoding_format base64 */
    /* rerank (EMB_RERANK, server/rerank.c): each input one (query, document)
     * pair, its row tl_model_n_cls_out scores (d), score 0 the relevance */
    int top_n;        /* results given back, the best first */
    char **text;      /* [n] each document's text for return_documents (owned), or NULL */
    size_t *text_len;
} srv_embed;
void srv_embed_free(srv_embed *e);

typedef enum srv_ev_kind {
    SRV_EV_PROMPT, /* echo: one prompt token with its logprob entry (first has none) */
    SRV_EV_TOKEN,  /* one generated token: its newly safe text (may be empty) + logprobs */
    SRV_EV_DONE,   /* finished: trailing text, finish reason, usage */
    SRV_EV_ERROR   /* failed after admission: message */
} srv_ev_kind;

typedef struct srv_event {
    srv_ev_kind kind;
    int32_t token;                   /* PROMPT/TOKEN */
    char *text;                      /* owned, NUL-terminated; may be "" */
    size_t text_len;
    int has_logprob;                 /* PROMPT: 0 for the first prompt token */
    tl_token_prob chosen;
    tl_token_prob top[SRV_MAX_TOP];
    int n_top;
    const char *finish_reason;       /* DONE: "stop" or "length" (static string) */
    int reasoning;                   /* TOKEN: the loop counts it as reasoning (tl_gen_event.reasoning,
                                      * markers included); the reply splits on it, never on the text */
    int status;                      /* ERROR: the HTTP status of a reply not yet begun: 400 when the
                                      * request itself can never run; 0: 503, another try may work */
} srv_event;

enum { SRV_DIALECT_CHAT, SRV_DIALECT_RESPONSES, SRV_DIALECT_MESSAGES, SRV_DIALECT_OLLAMA };

typedef struct srv_req {
    /* Filled by validate.c before srv_sched_submit, read-only afterwards. */
    srv_kind kind;
    int dialect;                     /* SRV_DIALECT_*: the wire format of the request and reply */
    const struct api_dialect *wire;  /* its reply and stream (api.h), set by the dialect's parser;
                                      * NULL: Chat Completions */
    void *dx;                        /* the dialect's request data, freed by dx_free */
    void (*dx_free)(void *);
    int stream, include_usage;
    int32_t *prompt;                 /* owned */
    int n_prompt;
    int n_shared;                    /* prompt tokens of its system prompt and tools, which other
                                      * conversations may share (api_chat_prompt; 0: none known):
                                      * a model with a state keeps it there */
    int max_tokens;                  /* >= 0; -1: until the sequence's context is full */
    tl_sampler_params sp;            /* sp.logit_bias points into bias */
    tl_logit_bias *bias;             /* owned */
    char **stop;                     /* owned strings */
    int n_stop;
    int logprobs;                    /* report logprobs of generated tokens */
    int top_logprobs;                /* alternatives per token, 0..SRV_MAX_TOP */
    int echo;                        /* completions: echo the prompt (with logprobs if logprobs) */
    tl_grammar *grammar;             /* owned: response_format / grammar / tool calls, or NULL */
    int grammar_lazy;                /* the grammar starts at the tool-call tag (tool_choice auto) */
    tl_sampler *smp;                 /* owned until admission takes them: made by srv_sched_submit, */
    tl_matcher *matcher;             /* which checks that they can be, so they are made once */
    int tool_mode;                   /* TOOLS_* (server/tools.h): the reply is split into tool calls */
    int tool_fmt;                    /* TOOLS_HERMES/LLAMA3/MISTRAL/...: their format */
    json_t *tool_strs;               /* owned, TOOLS_QWEN_XML: {function: [its string parameters]}
                                      * (their values are raw text; the others JSON), or NULL */
    int think;                       /* the reply may reason (tl_chat_think_markers) */
    const char *think_open, *think_close; /* its markers (static strings; NULL: <think>'s) */
    int think_started;               /* the prompt opened the reasoning */
    int think_budget;                /* reasoning tokens before the close is forced; -1: none */
    int harmony;                     /* the reply is harmony's channels (gpt-oss, tl_chat_harmony):
                                      * split by its parser, not by think or the tool formats */
    char id[64];                     /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;                 /* unix seconds */
    double t_arrival;                /* monotonic seconds, for time-to-first-token */
    double t_first;                  /* monotonic seconds of the first generated token (the scheduler's; 0: none yet) */

    /* Shared between the HTTP thread and the scheduler, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;               /* signalled on every new event */
    int efd;                         /* eventfd, also written on every new event (poll with the socket) */
    srv_event *ev;                   /* events appended by the scheduler: ev[n_taken..n_ev) are unread */
    int n_ev, cap_ev;
    int n_taken;                     /* events a stream has taken (srv_req_take), their texts now its own */
    int finished;                    /* a DONE or ERROR event was appended */
    atomic_int cancelled;            /* set by the HTTP side (client left); the scheduler frees the sequence at its next step */
    atomic_int refs;                 /* HTTP side + scheduler; srv_req_release frees at 0 */

    srv_embed *emb;                  /* SRV_EMBED: the inputs and their vectors (owned) */

    /* Written by the scheduler before DONE. */
    int prompt_tokens, completion_tokens, cached_tokens;
    int spec_drafted, spec_accepted; /* speculative guesses verified, kept */
    int reasoning_tokens;            /* of the completion, the reasoning's */
    int stop_index;                  /* the stop string that ended it, or -1 */
} srv_req;

/* Allocates a zeroed request with mu/cv/efd ready and refs = 1. */
srv_req *srv_req_new(void);
/* Drops one reference; the last one frees everything the request owns. */
void srv_req_release(srv_req *r);
/* Scheduler side: appends a copy of ev (taking ownership of ev->text), signals. */
int srv_req_push(srv_req *r, const srv_event *ev);
/* Stream side: moves up to max unread events into out (their texts become the
 * caller's to free) and drops them from r, so a stream keeps only what its
 * reader has not reached, however many tokens it runs. A non-streamed reply
 * never calls it and reads r->ev[0..n_ev) whole at the end. Returns how many. */
int srv_req_take(srv_req *r, srv_event *out, int max);

/* ---- the scheduler ------------------------------------------------------------- */
typedef struct srv_sched srv_sched;
typedef struct srv_metrics srv_metrics;

enum { SRV_OK = 0, SRV_QUEUE_FULL = 1, SRV_DRAINING = 2, SRV_TOO_LONG = 3, SRV_NO_KV = 4, SRV_INVALID = 5 };

/* Creates the context (n_seq_max = np, kv_bytes from --kv-mem) and starts the
 * scheduler thread. The model outlives the scheduler. */
int srv_sched_new(const tl_model *m, const srv_opts *o, srv_metrics *mx, srv_sched **out,
                  tl_error *err);
/* Queues r (takes a reference). Returns SRV_OK; SRV_QUEUE_FULL or
 * SRV_DRAINING (503: another try, or replica, may take it); or, for a request
 * that could never run here, whatever the load (4xx, never retried), with
 * why[0..why_cap) saying which limit it passes: SRV_TOO_LONG (prompt +
 * max_tokens beyond -c), SRV_NO_KV (more KV cache than the whole pool,
 * --kv-mem), SRV_INVALID (its sampling or grammar cannot be set up). These
 * are found here, on the caller's thread, so a stream is refused before its
 * 200. why may be NULL. */
int srv_sched_submit(srv_sched *s, srv_req *r, char *why, size_t why_cap);
/* Queues an embedding request (r->kind SRV_EMBED, r->emb filled; takes a
 * reference): its inputs run on the scheduler's thread between steps, and a
 * DONE event (or ERROR) says its vectors are in r->emb->out. Returns SRV_OK,
 * SRV_QUEUE_FULL, SRV_DRAINING, or SRV_TOO_LONG with why (an input longer
 * than the context or the KV pool). */
int srv_sched_embed(srv_sched *s, srv_req *r, char *why, size_t why_cap);
/* Stops admitting; running and waiting requests go on. */
void srv_sched_drain(srv_sched *s);
/* Requests waiting + running. */
int srv_sched_pending(srv_sched *s);
/* Per-sequence context (-c) the scheduler enforces. */
int srv_sched_n_ctx(const srv_sched *s);
/* The KV cache as the scheduler made it (pool, block bytes, types). */
void srv_sched_kv_stats(const srv_sched *s, tl_kv_stats *out);
/* tl_ctx_sizing of its context: how the context and the pool were sized. */
const char *srv_sched_sizing(const srv_sched *s);
/* tl_ctx_disk_stats of its context (thread-safe). */
void srv_sched_disk_stats(const srv_sched *s, tl_disk_stats *out);
/* Stops the thread (cancelling whatever still runs: those get an ERROR event) and frees. */
void srv_sched_free(srv_sched *s);

/* ---- metrics ------------------------------------------------------------------ */
/* Counters and histograms, thread-safe (their own mutex). */
srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics *mx);
void srv_metrics_request(srv_metrics *mx, const char *endpoint, int code);
void srv_metrics_tokens(srv_metrics *mx, int prompt, int generated, int cached);
void srv_metrics_spec(srv_metrics *mx, int drafted, int accepted);
/* A connection cut at its read deadline; connections opened (+1) or closed (-1). */
void srv_metrics_timeout(srv_metrics *mx);
void srv_metrics_conns(srv_metrics *mx, int delta);
void srv_metrics_ttft(srv_metrics *mx, double seconds);
void srv_metrics_itl(srv_metrics *mx, double seconds);
/* Gauges, set by the scheduler each step. */
void srv_metrics_state(srv_metrics *mx, int waiting, int running, const tl_kv_stats *kv);
/* The disk cache's figures (--cache-dir), shown from then on. */
void srv_metrics_disk(srv_metrics *mx, const tl_disk_stats *d);
/* The last state the scheduler published (any thread). */
void srv_metrics_load(srv_metrics *mx, int *waiting, int *running, tl_kv_stats *kv);
/* Prometheus text 0.0.4; *out malloc'ed. */
int srv_metrics_render(srv_metrics *mx, const char *model_id, char **out, size_t *len);

#endif
