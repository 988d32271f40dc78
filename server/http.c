/* server/http: libmicrohttpd daemon (thread per connection, poll()), routing,
 * bearer auth in constant time, body limits, and the waits: a non-streamed
 * reply blocks its connection thread until the request finishes; a stream is
 * a blocking content reader that writes SSE frames as events arrive. Both
 * poll the request's eventfd together with the socket, so a client that
 * leaves cancels its request. Owns the MHD daemon and per-connection state. */
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "dialect.h"
#include "embed.h"
#include "rerank.h"
#include "ollama.h"
#include "base/util.h"
#include "http.h"
#include "loop.h"

/* The live page (server/page.html, made into page_html.c by the build). */
extern const char srv_page_html[];
extern const size_t srv_page_len;

/* One open connection, for the read deadline: from its opening, or the end of
 * its previous reply, a client has --read-timeout seconds to send a whole
 * request (headers and body). MHD's own timeout only counts silence, so a
 * client that sends a byte now and then, or an idle keep-alive connection,
 * would hold its thread for ever. */
typedef struct sock {
    struct sock *prev, *next;
    int fd;
    int replying;   /* the request is read: no deadline until its reply ends */
    int cut;        /* shut down by the reaper */
    struct srv_http *h;
    double since;   /* CLOCK_MONOTONIC seconds the wait for a request began */
} sock;

struct srv_http {
    struct MHD_Daemon *d;
    srv_app *app;
    pthread_mutex_t mu; /* guards socks and stop */
    pthread_cond_t cv;
    sock socks;         /* list head */
    int stop;
    pthread_t reaper;
};


enum route { R_NONE, R_CHAT, R_COMPL, R_MODELS, R_HEALTH, R_READY, R_METRICS, R_TOKENIZE, R_DETOK, R_PAGE, R_LOOP,
             R_RESP, R_RESP_GET, R_RESP_DEL, R_RESP_ITEMS, R_MSG, R_MSG_COUNT, R_PROPS, R_EMBED, R_OLL_EMBED,
             R_OLL_EMBEDS, R_RERANK, R_OLL_CHAT, R_OLL_GEN, R_OLL_VERSION, R_OLL_TAGS, R_OLL_PS, R_OLL_SHOW };

/* prefix: the path is a prefix and the rest an id (/v1/responses/{id}; 2:
 * the id then "/input_items");
 * vendor: errors in OpenAI's shape (0), Anthropic's (V_ANTHROPIC) or Ollama's
 * (V_OLLAMA: {"error": "..."}, and streams as NDJSON). */
enum { V_OPENAI = 0, V_ANTHROPIC = 1, V_OLLAMA = 2 };
static const struct {
    const char *path, *method;
    enum route r;
    int auth, post, prefix, vendor;
} ROUTES[] = {
    {"/v1/chat/completions", "POST", R_CHAT, 1, 1, 0, 0},
    {"/v1/completions", "POST", R_COMPL, 1, 1, 0, 0},
    {"/v1/responses", "POST", R_RESP, 1, 1, 0, 0},
    {"/v1/responses/", "GET", R_RESP_GET, 1, 0, 1, 0},
    {"/v1/responses/", "DELETE", R_RESP_DEL, 1, 0, 1, 0},
    {"/v1/responses/", "GET", R_RESP_ITEMS, 1, 0, 2, 0},
    {"/v1/messages", "POST", R_MSG, 1, 1, 0, V_ANTHROPIC},
    {"/v1/messages/count_tokens", "POST", R_MSG_COUNT, 1, 1, 0, V_ANTHROPIC},
    {"/v1/embeddings", "POST", R_EMBED, 1, 1, 0, 0},
    {"/api/embed", "POST", R_OLL_EMBED, 1, 1, 0, V_OLLAMA},
    {"/api/embeddings", "POST", R_OLL_EMBEDS, 1, 1, 0, V_OLLAMA},
    /* llama-server's four paths (tools/server/server.cpp) */
    {"/v1/rerank", "POST", R_RERANK, 1, 1, 0, 0},
    {"/rerank", "POST", R_RERANK, 1, 1, 0, 0},
    {"/v1/reranking", "POST", R_RERANK, 1, 1, 0, 0},
    {"/reranking", "POST", R_RERANK, 1, 1, 0, 0},
    {"/api/chat", "POST", R_OLL_CHAT, 1, 1, 0, V_OLLAMA},
    {"/api/generate", "POST", R_OLL_GEN, 1, 1, 0, V_OLLAMA},
    {"/api/show", "POST", R_OLL_SHOW, 1, 1, 0, V_OLLAMA},
    {"/api/version", "GET", R_OLL_VERSION, 1, 0, 0, V_OLLAMA},
    {"/api/tags", "GET", R_OLL_TAGS, 1, 0, 0, V_OLLAMA},
    {"/api/ps", "GET", R_OLL_PS, 1, 0, 0, V_OLLAMA},
    {"/props", "GET", R_PROPS, 0, 0, 0, 0},
    {"/v1/models", "GET", R_MODELS, 1, 0, 0, 0},
    {"/health", "GET", R_HEALTH, 0, 0, 0, 0},
    {"/ready", "GET", R_READY, 0, 0, 0, 0},
    {"/metrics", "GET", R_METRICS, 0, 0, 0, 0},
    {"/tokenize", "POST", R_TOKENIZE, 1, 1, 0, 0},
    {"/detokenize", "POST", R_DETOK, 1, 1, 0, 0},
    {"/", "GET", R_PAGE, 0, 0, 0, 0},
    {"/v1/loop", "GET", R_LOOP, 1, 0, 0, 0},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

/* Per-request state (MHD's con_cls). */
typedef struct conn {
    int ri;            /* index into ROUTES */
    char rid[96];      /* a prefix route's id */
    char *body;
    size_t n, cap, seen;
    int too_big;
    srv_req *req;      /* the HTTP side's reference */
    int counted;       /* in app->busy */
} conn;

/* A stream's reader state; holds its own reference on the request. */
typedef struct stream {
    srv_app *app;
    srv_req *r;
    int fd;
    api_stream st;
    api_buf out;
    size_t off;
} stream;

static const char *endpoint(int ri) { return ri >= 0 ? ROUTES[ri].path : "other"; }

/* ---- replies ---------------------------------------------------------------- */

/* body is malloc'ed and handed to MHD (NULL: a fixed out-of-memory error). */
static enum MHD_Result reply(srv_app *app, struct MHD_Connection *c, int ri, unsigned code,
                             const char *ctype, char *body, size_t n) {
    static const char OOM[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    struct MHD_Response *rsp =
        body ? MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof OOM - 1, (void *)OOM, MHD_RESPMEM_PERSISTENT);
    if (!rsp) {
        free(body);
        return MHD_NO;
    }
    if (!body) code = MHD_HTTP_INTERNAL_SERVER_ERROR, ctype = "application/json";
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (code == MHD_HTTP_SERVICE_UNAVAILABLE) MHD_add_response_header(rsp, "Retry-After", "1");
    if (code == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(rsp, "WWW-Authenticate", "Bearer");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED && ri >= 0)
        MHD_add_response_header(rsp, "Allow", ROUTES[ri].method);
    enum MHD_Result ret = MHD_queue_response(c, code, rsp);
    MHD_destroy_response(rsp);
    if (app->mx) srv_metrics_request(app->mx, endpoint(ri), (int)code);
    return ret;
}

static enum MHD_Result reply_json(srv_app *app, struct MHD_Connection *c, int ri, unsigned code,
                                  char *body, size_t n) {
    return reply(app, c, ri, code, "application/json", body, n);
}

static enum MHD_Result reply_err(srv_app *app, struct MHD_Connection *c, int ri, const api_err *e) {
    size_t n = 0;
    char *s = ri >= 0 && ROUTES[ri].vendor == V_ANTHROPIC ? msg_error_json(e, &n)
              : ri >= 0 && ROUTES[ri].vendor == V_OLLAMA ? oll_error_json(e, &n)
                                                     : api_error_json(e, &n);
    return reply_json(app, c, ri, (unsigned)e->http, s, n);
}

static enum MHD_Result fail(srv_app *app, struct MHD_Connection *c, int ri, int code,
                            const char *type, const char *msg) {
    api_err e;
    api_fail(&e, code, type, NULL, NULL, "%s", msg);
    return reply_err(app, c, ri, &e);
}

static enum MHD_Result reply_str(srv_app *app, struct MHD_Connection *c, int ri, unsigned code,
                                 const char *s) {
    return reply_json(app, c, ri, code, strdup(s), strlen(s));
}

/* ---- auth ---------------------------------------------------------------------- */

/* Constant time in the key's content: every byte of the longer string is
 * visited and the lengths are folded into the difference. */
static int key_eq(const char *g, const char *key) {
    size_t gl = strlen(g), kl = strlen(key), n = gl > kl ? gl : kl, d = gl ^ kl;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(i < gl ? g[i] : 0) ^ (unsigned char)(i < kl ? key[i] : 0);
    return d == 0;
}

/* 'Authorization: Bearer KEY', or Anthropic's 'x-api-key: KEY'. */
static int key_ok(struct MHD_Connection *c, const char *key) {
    const char *hdr = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (hdr && !strncasecmp(hdr, "Bearer ", 7) && key_eq(hdr + 7, key)) return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && key_eq(x, key);
}

/* ---- waiting on a request ------------------------------------------------------ */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* 1: the eventfd fired, 0: timeout, -1: the client left. */
static int wait_events(srv_req *r, int fd, int ms) {
    struct pollfd p[2] = {{r->efd, POLLIN, 0}, {fd, POLLRDHUP, 0}};
    int n = poll(p, fd >= 0 ? 2 : 1, ms);
    if (n > 0 && fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return -1;
    if (n > 0 && (p[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t k = read(r->efd, &v, sizeof v);
        (void)k;
        return 1;
    }
    return 0;
}

/* ---- streams -------------------------------------------------------------------- */

/* Formats the events not yet taken into s->out. Taken events leave the
 * request (srv_req_take), so a long stream does not keep them all. */
static int stream_take(stream *s) {
    srv_event evs[32];
    int n = srv_req_take(s->r, evs, 32), rc = n;
    for (int i = 0; i < n; i++) {
        if (rc >= 0 && api_stream_event(&s->app->api, s->r, &s->st, &evs[i], &s->out)) rc = -1;
        free(evs[i].text);
    }
    return rc;
}

/* Hands MHD what a stream has formatted and not yet sent (out from *off). */
static ssize_t drain(api_buf *out, size_t *off, char *buf, size_t max) {
    size_t k = out->n - *off < max ? out->n - *off : max;
    memcpy(buf, out->p + *off, k);
    *off += k;
    if (*off == out->n) *off = out->n = 0;
    return (ssize_t)k;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *s = cls;
    for (;;) {
        if (s->off < s->out.n) return drain(&s->out, &s->off, buf, max);
        if (s->st.ended) return MHD_CONTENT_READER_END_OF_STREAM;
        int got = stream_take(s);
        if (got < 0) break;
        if (got > 0) continue;
        int w = wait_events(s->r, s->fd, 1000);
        if (w < 0) break;
        /* openai's SSE decoder skips comment lines: keeps proxies and clients from timing out
         * (an NDJSON stream has no comments: it stays quiet) */
        if (w == 0 && s->r->dialect != SRV_DIALECT_OLLAMA && api_buf_add(&s->out, ": keep-alive\n\n", 14)) break;
    }
    atomic_store(&s->r->cancelled, 1);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) {
    stream *s = cls;
    if (!s->st.ended) atomic_store(&s->r->cancelled, 1);
    srv_req_release(s->r);
    api_buf_free(&s->out);
    api_stream_free(&s->st);
    free(s);
}

static enum MHD_Result start_stream(srv_app *app, struct MHD_Connection *c, conn *k) {
    stream *s = calloc(1, sizeof *s);
    if (!s) {
        atomic_store(&k->req->cancelled, 1);
        return reply_json(app, c, k->ri, 500, NULL, 0);
    }
    s->app = app;
    s->r = k->req;
    s->fd = conn_fd(c);
    atomic_fetch_add(&s->r->refs, 1);
    struct MHD_Response *rsp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!rsp) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            ROUTES[k->ri].vendor == V_OLLAMA ? "application/x-ndjson" : "text/event-stream");
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, rsp);
    MHD_destroy_response(rsp);
    if (app->mx) srv_metrics_request(app->mx, endpoint(k->ri), 200);
    return ret;
}

/* ---- the live loop ------------------------------------------------------------------ */

/* A /v1/loop reader: the records the scheduler publishes, as SSE. */
typedef struct loop_reader {
    srv_loop *l;
    uint64_t next;
    int fd;
    api_buf out;
    size_t off;
} loop_reader;

static ssize_t loop_read(void *cls, uint64_t pos, char *buf, size_t max) {
    loop_reader *s = cls;
    for (;;) {
        if (s->off < s->out.n) return drain(&s->out, &s->off, buf, max);
        if (srv_loop_closed(s->l)) return MHD_CONTENT_READER_END_OF_STREAM;
        int got = srv_loop_read(s->l, &s->next, &s->out, 1000);
        if (got < 0) break;
        if (got > 0) continue;
        struct pollfd p = {s->fd, POLLRDHUP, 0};
        if (s->fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) break;
        if (api_buf_add(&s->out, ": keep-alive\n\n", 14)) break;
    }
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void loop_free(void *cls) {
    loop_reader *s = cls;
    srv_loop_leave(s->l);
    api_buf_free(&s->out);
    free(s);
}

static enum MHD_Result start_loop(srv_app *app, struct MHD_Connection *c, int ri) {
    if (!app->loop) return fail(app, c, ri, 404, "not_found_error", "the live loop is off (--no-loop)");
    loop_reader *s = calloc(1, sizeof *s);
    if (!s) return reply_json(app, c, ri, 500, NULL, 0);
    s->l = app->loop;
    s->fd = conn_fd(c);
    s->next = srv_loop_join(s->l);
    /* a first comment, so the client sees the stream open at once */
    if (api_buf_add(&s->out, ": tokenloop trace v1\n\n", 22)) {
        loop_free(s);
        return reply_json(app, c, ri, 500, NULL, 0);
    }
    struct MHD_Response *rsp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, loop_read, s, loop_free);
    if (!rsp) {
        loop_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, rsp);
    MHD_destroy_response(rsp);
    if (app->mx) srv_metrics_request(app->mx, endpoint(ri), 200);
    return ret;
}

/* ---- completions ------------------------------------------------------------------ */

static enum MHD_Result wait_reply(srv_app *app, struct MHD_Connection *c, conn *k) {
    srv_req *r = k->req;
    int fd = conn_fd(c);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int fin = r->finished;
        pthread_mutex_unlock(&r->mu);
        if (fin) break;
        if (wait_events(r, fd, 1000) < 0) {
            atomic_store(&r->cancelled, 1);
            return MHD_NO;
        }
    }
    const srv_event *last = r->n_ev ? &r->ev[r->n_ev - 1] : NULL;
    if (!last || last->kind == SRV_EV_ERROR) {
        const char *m = last && last->text && last->text[0] ? last->text : "the request failed";
        /* one that can never run is not answered 503: a proxy would retry it */
        if (last && last->status >= 400 && last->status < 500)
            return fail(app, c, k->ri, last->status, "invalid_request_error", m);
        return fail(app, c, k->ri, 503, "unavailable_error", m);
    }
    size_t n = 0;
    char *s = r->kind == SRV_EMBED ? emb_reply_json(&app->api, r, &n) : api_reply_json(&app->api, r, &n);
    return reply_json(app, c, k->ri, 200, s, n);
}

/* An embedding or rerank request: queued for the scheduler's thread, which
 * runs it between decode steps, and answered whole. */
static enum MHD_Result embed_request(srv_app *app, struct MHD_Connection *c, conn *k) {
    api_err e;
    if (!(k->req = srv_req_new())) return reply_json(app, c, k->ri, 500, NULL, 0);
    enum route rt = ROUTES[k->ri].r;
    const int fmt = rt == R_OLL_EMBED ? EMB_OLLAMA : rt == R_OLL_EMBEDS ? EMB_OLLAMA_OLD : EMB_OPENAI;
    const char *body = k->body ? k->body : "";
    if (rt == R_RERANK ? rr_parse(&app->api, body, k->n, k->req, &e)
                       : emb_parse(&app->api, fmt, app->o->pooling, body, k->n, k->req, &e))
        return reply_err(app, c, k->ri, &e);
    char why[sizeof e.msg];
    switch (srv_sched_embed(app->sched, k->req, why, sizeof why)) {
    case SRV_OK:
        break;
    case SRV_QUEUE_FULL:
        return fail(app, c, k->ri, 503, "unavailable_error", "the server is busy: too many requests waiting");
    case SRV_DRAINING:
        return fail(app, c, k->ri, 503, "unavailable_error", "the server is shutting down");
    default:
        api_fail(&e, 400, "invalid_request_error",
                 rt == R_RERANK ? "documents" : fmt == EMB_OLLAMA_OLD ? "prompt" : "input",
                 "context_length_exceeded", "%s", why);
        return reply_err(app, c, k->ri, &e);
    }
    atomic_fetch_add(&app->busy, 1);
    k->counted = 1;
    return wait_reply(app, c, k);
}

static enum MHD_Result completion(srv_app *app, struct MHD_Connection *c, conn *k) {
    api_err e;
    if (!(k->req = srv_req_new())) return reply_json(app, c, k->ri, 500, NULL, 0);
    enum route rt = ROUTES[k->ri].r;
    srv_kind kind = rt == R_COMPL ? SRV_COMPLETION : SRV_CHAT;
    const char *b = k->body ? k->body : "";
    int empty = 0;
    int bad = rt == R_RESP  ? resp_parse(&app->api, b, k->n, k->req, &e)
              : rt == R_MSG ? msg_parse(&app->api, b, k->n, k->req, 0, &e)
              : rt == R_OLL_CHAT || rt == R_OLL_GEN
                  ? oll_parse(&app->api, rt == R_OLL_GEN, b, k->n, k->req, &empty, &e)
                  : api_parse_request(&app->api, kind, b, k->n, k->req, &e);
    if (bad) return reply_err(app, c, k->ri, &e);
    if (empty) { /* Ollama's "load the model": it is loaded */
        size_t n = 0;
        char *s = oll_load_json(&app->api, &n);
        return reply_json(app, c, k->ri, 200, s, n);
    }
    /* 503 (with Retry-After) only for what another try, or another replica,
     * may not meet: overload and draining. A request that can never run gets
     * 400 naming the limit, as OpenAI, vLLM and llama-server answer a context
     * overflow (413 stays the body size's): a proxy's retry-on 503 would
     * replay it on every replica. */
    char why[sizeof e.msg];
    switch (srv_sched_submit(app->sched, k->req, why, sizeof why)) {
    case SRV_OK:
        break;
    case SRV_QUEUE_FULL:
        return fail(app, c, k->ri, 503, "unavailable_error", "the server is busy: too many requests waiting");
    case SRV_DRAINING:
        return fail(app, c, k->ri, 503, "unavailable_error", "the server is shutting down");
    case SRV_TOO_LONG:
    case SRV_NO_KV:
        api_fail(&e, 400, "invalid_request_error",
                 rt == R_RESP ? "input" : rt == R_MSG || rt == R_OLL_CHAT || kind == SRV_CHAT ? "messages" : "prompt",
                 "context_length_exceeded", "%s", why);
        return reply_err(app, c, k->ri, &e);
    case SRV_INVALID:
        api_fail(&e, 400, "invalid_request_error", NULL, NULL, "%s", why);
        return reply_err(app, c, k->ri, &e);
    default:
        return fail(app, c, k->ri, 503, "unavailable_error", "the request could not be queued");
    }
    atomic_fetch_add(&app->busy, 1);
    k->counted = 1;
    return k->req->stream ? start_stream(app, c, k) : wait_reply(app, c, k);
}

/* ---- routing ------------------------------------------------------------------------ */

static enum MHD_Result simple_get(srv_app *app, struct MHD_Connection *c, conn *k) {
    int ri = k->ri, phase = atomic_load(&app->phase);
    api_err e;
    size_t n = 0;
    char *s = NULL;
    switch (ROUTES[ri].r) {
    case R_RESP_ITEMS: {
        memset(&e, 0, sizeof e);
        const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
        s = resp_input_items(&app->api, k->rid, order && !strcmp(order, "asc"), &n, &e);
        return s ? reply_json(app, c, ri, 200, s, n) : reply_err(app, c, ri, &e);
    }
    case R_RESP_GET:
    case R_RESP_DEL:
        memset(&e, 0, sizeof e);
        s = ROUTES[ri].r == R_RESP_GET ? resp_get(&app->api, k->rid, &n, &e) : resp_delete(&app->api, k->rid, &n, &e);
        return s ? reply_json(app, c, ri, 200, s, n) : reply_err(app, c, ri, &e);
    case R_PROPS:
        s = api_props_json(&app->api, &n);
        return reply_json(app, c, ri, 200, s, n);
    case R_OLL_VERSION:
        s = oll_version_json(&n);
        return reply_json(app, c, ri, 200, s, n);
    case R_OLL_TAGS:
    case R_OLL_PS:
        s = oll_tags_json(&app->api, ROUTES[ri].r == R_OLL_PS, &n);
        return reply_json(app, c, ri, 200, s, n);
    case R_HEALTH:
        /* llama-server's convention, which scripts and probes wait on: 503
         * until the model is loaded, then 200 for as long as the process
         * lives (draining too: a liveness probe must not kill a pod that is
         * finishing its requests) */
        if (phase == SRV_PHASE_LOADING)
            return reply_str(app, c, ri, 503,
                             "{\"error\":{\"code\":503,\"message\":\"Loading model\",\"type\":\"unavailable_error\"}}");
        return reply_str(app, c, ri, 200, "{\"status\":\"ok\"}");
    case R_READY:
        if (phase == SRV_PHASE_READY) return reply_str(app, c, ri, 200, "{\"status\":\"ready\"}");
        return reply_str(app, c, ri, 503, phase == SRV_PHASE_LOADING ? "{\"status\":\"loading\"}"
                                                                    : "{\"status\":\"draining\"}");
    case R_PAGE: { /* static: no other host is referenced */
        struct MHD_Response *rsp = MHD_create_response_from_buffer(srv_page_len, (void *)srv_page_html,
                                                                   MHD_RESPMEM_PERSISTENT);
        if (!rsp) return MHD_NO;
        MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
        MHD_add_response_header(rsp, "Content-Security-Policy",
                                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, rsp);
        MHD_destroy_response(rsp);
        if (app->mx) srv_metrics_request(app->mx, endpoint(ri), 200);
        return ret;
    }
    case R_LOOP:
        return start_loop(app, c, ri);
    case R_METRICS: {
        if (srv_metrics_render(app->mx, app->o->model_id, &s, &n)) return reply_json(app, c, ri, 500, NULL, 0);
        return reply(app, c, ri, 200, "text/plain; version=0.0.4; charset=utf-8", s, n);
    }
    default: /* R_MODELS */
        s = api_models_json(&app->api, &n);
        return reply_json(app, c, ri, 200, s, n);
    }
}

static enum MHD_Result body_done(srv_app *app, struct MHD_Connection *c, conn *k) {
    if (k->too_big) {
        char m[96];
        snprintf(m, sizeof m, "the request body is larger than %zu bytes", app->o->max_body);
        return fail(app, c, k->ri, 413, "invalid_request_error", m);
    }
    enum route r = ROUTES[k->ri].r;
    if (r == R_CHAT || r == R_COMPL || r == R_RESP || r == R_MSG || r == R_OLL_CHAT || r == R_OLL_GEN)
        return completion(app, c, k);
    if (r == R_EMBED || r == R_OLL_EMBED || r == R_OLL_EMBEDS || r == R_RERANK) return embed_request(app, c, k);
    api_err e;
    size_t n = 0;
    const char *b = k->body ? k->body : "";
    if (r == R_OLL_SHOW) {
        char *s = oll_show_json(&app->api, b, k->n, &n, &e);
        return s ? reply_json(app, c, k->ri, 200, s, n) : reply_err(app, c, k->ri, &e);
    }
    if (r == R_MSG_COUNT) {
        srv_req *q = srv_req_new();
        if (!q) return reply_json(app, c, k->ri, 500, NULL, 0);
        char *s = msg_parse(&app->api, b, k->n, q, 1, &e) ? NULL : msg_count_json(q, &n);
        srv_req_release(q);
        if (!s && !e.http) return reply_json(app, c, k->ri, 500, NULL, 0);
        return s ? reply_json(app, c, k->ri, 200, s, n) : reply_err(app, c, k->ri, &e);
    }
    char *s = r == R_TOKENIZE ? api_tokenize(&app->api, b, k->n, &n, &e)
                              : api_detokenize(&app->api, b, k->n, &n, &e);
    return s ? reply_json(app, c, k->ri, 200, s, n) : reply_err(app, c, k->ri, &e);
}

static int body_add(srv_app *app, conn *k, const char *data, size_t n) {
    k->seen += n;
    if (k->seen > app->o->max_body) {
        k->too_big = 1;
        return k->seen > 4 * app->o->max_body ? -1 : 0; /* past 4x: stop reading, close */
    }
    if (k->n + n + 1 > k->cap) {
        size_t nc = (k->n + n + 1) * 2;
        if (nc > app->o->max_body + 1) nc = app->o->max_body + 1;
        char *nb = realloc(k->body, nc);
        if (!nb) return -1;
        k->body = nb;
        k->cap = nc;
    }
    memcpy(k->body + k->n, data, n);
    k->n += n;
    k->body[k->n] = 0;
    return 0;
}

/* First call for a request: everything decided from the headers alone. */
static enum MHD_Result first_call(srv_app *app, struct MHD_Connection *c, const char *url,
                                  const char *method, void **con_cls) {
    /* the route with this path and method; else one with this path (405) */
    int ri = -1;
    for (size_t i = 0; i < N_ROUTES; i++) {
        size_t pl = strlen(ROUTES[i].path);
        const char *rest = url + pl, *slash = strchr(rest, '/');
        int match = !ROUTES[i].prefix ? !strcmp(url, ROUTES[i].path)
                                      : !strncmp(url, ROUTES[i].path, pl) && *rest && strlen(rest) < 96 &&
                                            (ROUTES[i].prefix == 1 ? !slash
                                                                   : slash && slash > rest && !strcmp(slash, "/input_items"));
        if (match && (ri < 0 || !strcmp(method, ROUTES[i].method))) ri = (int)i;
    }
    if (ri < 0) return fail(app, c, -1, 404, "not_found_error", "no such endpoint");
    if (strcmp(method, ROUTES[ri].method))
        return fail(app, c, ri, 405, "invalid_request_error", "method not allowed");
    if (ROUTES[ri].auth && app->o->api_key &&
        !key_ok(c, app->o->api_key))
        return fail(app, c, ri, 401, "authentication_error", "invalid or missing API key");
    int phase = atomic_load(&app->phase);
    enum route r = ROUTES[ri].r;
    if (phase == SRV_PHASE_LOADING && r != R_HEALTH && r != R_READY && r != R_METRICS)
        return fail(app, c, ri, 503, "unavailable_error", "the model is still loading");
    if (phase == SRV_PHASE_DRAINING &&
        (r == R_CHAT || r == R_COMPL || r == R_RESP || r == R_MSG || r == R_EMBED || r == R_RERANK || r == R_OLL_EMBED ||
         r == R_OLL_EMBEDS || r == R_OLL_CHAT || r == R_OLL_GEN))
        return fail(app, c, ri, 503, "unavailable_error", "the server is shutting down");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (ROUTES[ri].post && cl && strtoull(cl, NULL, 10) > app->o->max_body) {
        char m[96];
        snprintf(m, sizeof m, "the request body is larger than %zu bytes", app->o->max_body);
        return fail(app, c, ri, 413, "invalid_request_error", m);
    }
    /* A GET is answered at the next call too: MHD closes a connection whose
     * reply was queued at the first call, and keep-alive matters to a scraper
     * or a proxy's connection pool. */
    conn *k = calloc(1, sizeof *k);
    if (!k) return MHD_NO;
    k->ri = ri;
    if (ROUTES[ri].prefix) {
        const char *id = url + strlen(ROUTES[ri].path);
        size_t idl = strcspn(id, "/");
        snprintf(k->rid, sizeof k->rid, "%.*s", (int)idl, id);
    }
    *con_cls = k;
    return MHD_YES;
}

/* The connection's request is read (replying) or its reply is over (the wait
 * for the next request, and its deadline, start now). */
static void sock_mark(struct MHD_Connection *c, int replying) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sock *s = ci ? ci->socket_context : NULL;
    if (!s) return;
    pthread_mutex_lock(&s->h->mu);
    s->replying = replying;
    if (!replying) s->since = tl_now();
    pthread_mutex_unlock(&s->h->mu);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    srv_app *app = cls;
    conn *k = *con_cls;
    if (!k) {
        enum MHD_Result ret = first_call(app, c, url, method, con_cls);
        if (!*con_cls) sock_mark(c, 1); /* answered from the headers alone */
        return ret;
    }
    if (*upload_size) {
        int rc = body_add(app, k, upload, *upload_size);
        *upload_size = 0;
        return rc ? MHD_NO : MHD_YES;
    }
    sock_mark(c, 1);
    return ROUTES[k->ri].post ? body_done(app, c, k) : simple_get(app, c, k);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    srv_app *app = cls;
    conn *k = *con_cls;
    sock_mark(c, 0);
    if (!k) return;
    if (k->req) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) atomic_store(&k->req->cancelled, 1);
        srv_req_release(k->req);
    }
    if (k->counted) atomic_fetch_sub(&app->busy, 1);
    free(k->body);
    free(k);
    *con_cls = NULL;
}

/* ---- the read deadline -------------------------------------------------------------- */

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code) {
    srv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        sock *s = calloc(1, sizeof *s);
        if (!s) return; /* no deadline for this one; MHD's idle timeout still holds */
        s->h = h;
        s->fd = conn_fd(c);
        s->since = tl_now();
        pthread_mutex_lock(&h->mu);
        s->next = h->socks.next;
        s->prev = &h->socks;
        h->socks.next->prev = s;
        h->socks.next = s;
        pthread_mutex_unlock(&h->mu);
        *socket_context = s;
        srv_metrics_conns(h->app->mx, 1);
    } else if (*socket_context) {
        /* MHD tells of the close before it closes the socket: while the
         * record is listed, its fd is this connection's */
        sock *s = *socket_context;
        pthread_mutex_lock(&h->mu);
        s->prev->next = s->next;
        s->next->prev = s->prev;
        pthread_mutex_unlock(&h->mu);
        free(s);
        *socket_context = NULL;
        srv_metrics_conns(h->app->mx, -1);
    }
}

/* Shuts down each connection past its deadline; MHD's thread then reads the
 * end of the stream and closes it. */
static void *reaper(void *arg) {
    srv_http *h = arg;
    double limit = h->app->o->read_timeout_s > 0 ? h->app->o->read_timeout_s : 30;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 250000000;
        if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&h->cv, &h->mu, &t);
        double now = tl_now();
        for (sock *s = h->socks.next; s != &h->socks; s = s->next)
            if (!s->replying && !s->cut && s->fd >= 0 && now - s->since > limit) {
                shutdown(s->fd, SHUT_RDWR);
                s->cut = 1;
                if (h->app->mx) srv_metrics_timeout(h->app->mx);
            }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- the daemon ------------------------------------------------------------------ */

int srv_http_start(srv_app *app, srv_http **out, tl_error *err) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", app->o->port);
    int gai = getaddrinfo(app->o->host, port, &hints, &ai);
    if (gai || !ai) {
        snprintf(err->msg, sizeof err->msg, "cannot resolve host '%s': %s", app->o->host, gai_strerror(gai));
        err->status = TL_ERR_ARG;
        return TL_ERR_ARG;
    }
    srv_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        err->status = TL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return TL_ERR_NOMEM;
    }
    h->app = app;
    h->socks.next = h->socks.prev = &h->socks;
    if (pthread_mutex_init(&h->mu, NULL)) {
        free(h);
        freeaddrinfo(ai);
        err->status = TL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "cannot create a mutex");
        return TL_ERR_NOMEM;
    }
    pthread_cond_init(&h->cv, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, (uint16_t)app->o->port, NULL, NULL, handler, app,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed,
                            app, MHD_OPTION_NOTIFY_CONNECTION, notify_conn, h,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000,
                            /* one address cannot take every connection (a client that
                             * opens many and never finishes them): the others, and
                             * /health, /ready and /metrics, still get in */
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(app->o->max_conn_per_ip > 0 ? app->o->max_conn_per_ip : 512),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->d && pthread_create(&h->reaper, NULL, reaper, h)) {
        MHD_stop_daemon(h->d);
        h->d = NULL;
    }
    if (!h->d) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        err->status = TL_ERR_IO;
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s:%d (in use?)", app->o->host,
                 app->o->port);
        return TL_ERR_IO;
    }
    *out = h;
    return TL_OK;
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->reaper, NULL);
    MHD_stop_daemon(h->d);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
