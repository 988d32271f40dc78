/* server/agent: HAProxy's agent-check (see agent.h). The weight follows the
 * replica's own load, so the proxy sends less to a busy one: the share of
 * its sequences in use with the queue counted in, or of its KV cache,
 * whichever is fuller. Loading says down and draining says drain, as /ready
 * does with 503. */
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"

struct srv_agent {
    srv_app *app;
    int fd;
    pthread_t th;
    atomic_int stop;
};

void srv_agent_line(srv_app *app, char *buf, size_t cap) {
    const int phase = atomic_load(&app->phase);
    if (phase == SRV_PHASE_LOADING) {
        snprintf(buf, cap, "down\n");
        return;
    }
    if (phase == SRV_PHASE_DRAINING) {
        snprintf(buf, cap, "drain\n");
        return;
    }
    int waiting = 0, running = 0;
    tl_kv_stats kv = {0};
    if (app->mx) srv_metrics_load(app->mx, &waiting, &running, &kv);
    const int np = app->o->n_parallel > 0 ? app->o->n_parallel : 1;
    /* a full replica with as many again waiting is 100% busy */
    double busy = (double)(running + waiting) / (2.0 * np);
    const double kv_use = kv.n_blocks > 0 ? (double)kv.n_used / kv.n_blocks : 0;
    if (kv_use > busy) busy = kv_use;
    int w = (int)(100.0 * (1.0 - busy) + 0.5);
    if (w < 1) w = 1; /* still up: the proxy may need it when all are busy */
    if (w > 100) w = 100;
    snprintf(buf, cap, "up ready %d%%\n", w);
}

static void *agent_main(void *arg) {
    srv_agent *a = arg;
    while (!atomic_load(&a->stop)) {
        struct pollfd p = {a->fd, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) continue;
        int c = accept(a->fd, NULL, NULL);
        if (c < 0) continue;
        char line[64];
        srv_agent_line(a->app, line, sizeof line);
        ssize_t k = send(c, line, strlen(line), MSG_NOSIGNAL);
        (void)k;
        close(c);
    }
    return NULL;
}

int srv_agent_start(srv_app *app, const char *host, int port, srv_agent **out, tl_error *err) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai) || !ai) {
        snprintf(err->msg, sizeof err->msg, "--agent-port: cannot resolve '%s'", host);
        return err->status = TL_ERR_ARG;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64)) {
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        snprintf(err->msg, sizeof err->msg, "--agent-port: cannot listen on %s:%d (in use?)", host, port);
        return err->status = TL_ERR_IO;
    }
    freeaddrinfo(ai);
    srv_agent *a = calloc(1, sizeof *a);
    if (!a) {
        close(fd);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return err->status = TL_ERR_NOMEM;
    }
    a->app = app;
    a->fd = fd;
    if (pthread_create(&a->th, NULL, agent_main, a)) {
        close(fd);
        free(a);
        snprintf(err->msg, sizeof err->msg, "--agent-port: cannot start its thread");
        return err->status = TL_ERR_NOMEM;
    }
    *out = a;
    return TL_OK;
}

void srv_agent_stop(srv_agent *a) {
    if (!a) return;
    atomic_store(&a->stop, 1);
    pthread_join(a->th, NULL);
    close(a->fd);
    free(a);
}
