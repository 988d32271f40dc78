/* server/agent: HAProxy's agent-check (--agent-port). Each connection gets
 * one line saying how much traffic this replica wants, then is closed. */
#ifndef TL_SERVER_AGENT_H
#define TL_SERVER_AGENT_H

#include "http.h"

typedef struct srv_agent srv_agent;

/* Listens on host:port; the replies come from app's phase and the load the
 * scheduler last published (app->mx). */
int srv_agent_start(srv_app *app, const char *host, int port, srv_agent **out, tl_error *err);
void srv_agent_stop(srv_agent *a);
/* The line itself, for tests: "down", "drain", or "up ready N%". */
void srv_agent_line(srv_app *app, char *buf, size_t cap);

#endif
