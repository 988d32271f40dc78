/* server/http: the HTTP side of `tokenloop serve` on libmicrohttpd (a thread
 * per connection): routing, auth, body limits, and turning a request's events
 * into a JSON reply or an SSE stream. */
#ifndef TL_SERVER_HTTP_H
#define TL_SERVER_HTTP_H

#include <stdatomic.h>

#include "api.h"
#include "server.h"

enum { SRV_PHASE_LOADING = 0, SRV_PHASE_READY = 1, SRV_PHASE_DRAINING = 2 };

/* What the HTTP threads share with cmd_serve. m, sched and api are written
 * before phase becomes READY and read only after seeing READY (or DRAINING). */
typedef struct srv_app {
    const srv_opts *o;
    srv_metrics *mx;
    const tl_model *m;
    srv_sched *sched;
    api_ctx api;
    atomic_int phase;
    atomic_int busy; /* completion requests whose connection is still open */
    struct srv_loop *loop; /* the live loop's hub (GET /v1/loop), or NULL */
} srv_app;

typedef struct srv_http srv_http;

/* Binds o->host:o->port and starts serving (before the model is loaded). */
int srv_http_start(srv_app *app, srv_http **out, tl_error *err);
/* Closes the listener and every connection, joins the threads, frees. */
void srv_http_stop(srv_http *h);

#endif
