/* server/req: the life of one srv_req, shared by an HTTP thread and the
 * scheduler. Owns allocation, the reference count and the event buffer the
 * scheduler appends to (with the eventfd and condvar that wake the reader). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server.h"

srv_req *srv_req_new(void) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->efd < 0) {
        free(r);
        return NULL;
    }
    if (pthread_mutex_init(&r->mu, NULL)) {
        close(r->efd);
        free(r);
        return NULL;
    }
    if (pthread_cond_init(&r->cv, NULL)) {
        pthread_mutex_destroy(&r->mu);
        close(r->efd);
        free(r);
        return NULL;
    }
    atomic_init(&r->cancelled, 0);
    atomic_init(&r->refs, 1);
    r->max_tokens = -1;
    return r;
}

void srv_req_release(srv_req *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    for (int i = 0; i < r->n_ev; i++) free(r->ev[i].text);
    free(r->ev);
    free(r->prompt);
    free(r->bias);
    if (r->dx_free) r->dx_free(r->dx);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    tl_grammar_free(r->grammar);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    close(r->efd);
    free(r);
}

int srv_req_push(srv_req *r, const srv_event *ev) {
    pthread_mutex_lock(&r->mu);
    if (r->n_ev == r->cap_ev) {
        int nc = r->cap_ev ? r->cap_ev * 2 : 64;
        srv_event *ne = realloc(r->ev, (size_t)nc * sizeof *ne);
        if (!ne) {
            /* The reader must still learn that the request ended. */
            if (ev->kind == SRV_EV_DONE || ev->kind == SRV_EV_ERROR) r->finished = 1;
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            free(ev->text);
            uint64_t one = 1;
            ssize_t w = write(r->efd, &one, sizeof one);
            (void)w;
            return TL_ERR_NOMEM;
        }
        r->ev = ne;
        r->cap_ev = nc;
    }
    r->ev[r->n_ev++] = *ev;
    if (ev->kind == SRV_EV_DONE || ev->kind == SRV_EV_ERROR) r->finished = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    /* A full counter (never in practice) still leaves the fd readable. */
    ssize_t w = write(r->efd, &one, sizeof one);
    (void)w;
    return TL_OK;
}
