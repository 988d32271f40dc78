/* server/req: the life of one srv_req, shared by an HTTP thread and the
 * scheduler. Owns allocation, the reference count and the event buffer the
 * scheduler appends to (with the eventfd and condvar that wake the reader).
 *
 * A stream's buffer holds only the events its reader has not taken yet
 * (srv_req_take): taken ones leave it, and it is compacted, so its memory
 * follows the reader's lag, not the reply's length (it once kept every event,
 * ~300 bytes a token, for the request's whole life). The lag is not capped by
 * back-pressure: the scheduler never waits on a reader, since one slow client
 * would stall every sequence in the shared forward call, and pausing just its
 * sequence would hold that sequence's KV blocks, tens of KB a token, to save
 * this buffer's few hundred bytes a token. A stalled client's lag is bounded
 * by its sequence's context (-c), like its KV, and a client that leaves
 * cancels the request. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server.h"

#define EV_FIRST 64     /* events a buffer starts with */
#define EV_SHRINK 1024  /* a buffer emptied above this size is freed, not kept at its peak */

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
    for (int i = r->n_taken; i < r->n_ev; i++) free(r->ev[i].text); /* the taken ones are the stream's */
    free(r->ev);
    free(r->prompt);
    free(r->bias);
    if (r->dx_free) r->dx_free(r->dx);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    tl_matcher_free(r->matcher);
    tl_sampler_free(r->smp);
    tl_grammar_free(r->grammar);
    json_decref(r->tool_strs);
    srv_embed_free(r->emb);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    close(r->efd);
    free(r);
}

void srv_embed_free(srv_embed *e) {
    if (!e) return;
    for (int i = 0; e->tok && i < e->n; i++) tl_free(e->tok[i]);
    free(e->tok);
    free(e->n_tok);
    free(e->out);
    free(e->off);
    for (int i = 0; e->text && i < e->n; i++) free(e->text[i]);
    free(e->text);
    free(e->text_len);
    free(e);
}

int srv_req_push(srv_req *r, const srv_event *ev) {
    pthread_mutex_lock(&r->mu);
    if (r->n_ev == r->cap_ev) {
        int nc = r->cap_ev ? r->cap_ev * 2 : EV_FIRST;
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

int srv_req_take(srv_req *r, srv_event *out, int max) {
    pthread_mutex_lock(&r->mu);
    int n = r->n_ev - r->n_taken;
    if (n > max) n = max;
    if (n > 0) memcpy(out, r->ev + r->n_taken, (size_t)n * sizeof *out);
    r->n_taken += n;
    if (r->n_taken == r->n_ev) {
        r->n_ev = r->n_taken = 0;
        if (r->cap_ev > EV_SHRINK) { /* a lag that is over: its peak need not stay */
            free(r->ev);
            r->ev = NULL;
            r->cap_ev = 0;
        }
    } else if (r->n_taken >= r->cap_ev / 2) {
        /* moved down once half the buffer is taken: each event moves O(1) times */
        memmove(r->ev, r->ev + r->n_taken, (size_t)(r->n_ev - r->n_taken) * sizeof *r->ev);
        r->n_ev -= r->n_taken;
        r->n_taken = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}
