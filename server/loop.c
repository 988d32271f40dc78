/* server/loop: the live loop's hub (see loop.h). A ring of the newest
 * records under one mutex; the scheduler's publish copies a line into a slot
 * whose buffer is reused, and signals the readers. A record that could not
 * be kept still takes its slot, marked lost, so that every reader counts it
 * in a gap where it would have been. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop.h"

typedef struct line {
    char *s;
    size_t n, cap;
    int lost; /* the record was dropped (no memory for it) */
} line;

struct srv_loop {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    line *ring;
    int cap;
    uint64_t head; /* records published so far; record k sits at ring[k % cap] */
    atomic_int readers;
    atomic_int closed;
};

int srv_loop_new(int cap, srv_loop **out) {
    *out = NULL;
    srv_loop *l = calloc(1, sizeof *l);
    if (!l || !(l->ring = calloc((size_t)cap, sizeof *l->ring))) {
        free(l);
        return -1;
    }
    l->cap = cap;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    *out = l;
    return 0;
}

void srv_loop_free(srv_loop *l) {
    if (!l) return;
    for (int i = 0; i < l->cap; i++) free(l->ring[i].s);
    free(l->ring);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

int srv_loop_watched(srv_loop *l) { return l && atomic_load(&l->readers) > 0; }

void srv_loop_publish(srv_loop *l, const char *s, size_t n) {
    pthread_mutex_lock(&l->mu);
    line *ln = &l->ring[l->head % (uint64_t)l->cap];
    ln->lost = !s;
    if (s && n + 1 > ln->cap) {
        char *p = realloc(ln->s, n + 1);
        if (p) {
            ln->s = p;
            ln->cap = n + 1;
        } else {
            ln->lost = 1;
        }
    }
    if (!ln->lost) {
        memcpy(ln->s, s, n);
        ln->s[n] = 0;
        ln->n = n;
    }
    l->head++;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

uint64_t srv_loop_join(srv_loop *l) {
    atomic_fetch_add(&l->readers, 1);
    pthread_mutex_lock(&l->mu);
    uint64_t h = l->head;
    pthread_mutex_unlock(&l->mu);
    return h;
}

void srv_loop_leave(srv_loop *l) { atomic_fetch_sub(&l->readers, 1); }

static int gap(api_buf *out, uint64_t missed) {
    char g[64];
    int k = snprintf(g, sizeof g, "event: gap\ndata: %llu\n\n", (unsigned long long)missed);
    return api_buf_add(out, g, (size_t)k);
}

int srv_loop_read(srv_loop *l, uint64_t *next, api_buf *out, int timeout_ms) {
    pthread_mutex_lock(&l->mu);
    if (*next >= l->head && !atomic_load(&l->closed)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    }
    int n = 0, rc = 0;
    uint64_t missed = 0; /* records this reader will never get, since the last one it got */
    if (l->head - *next > (uint64_t)l->cap) { /* overwritten before this reader got them */
        missed = l->head - *next - (uint64_t)l->cap;
        *next = l->head - (uint64_t)l->cap;
    }
    for (; !rc && *next < l->head && n < 64; (*next)++) {
        const line *ln = &l->ring[*next % (uint64_t)l->cap];
        if (ln->lost) {
            missed++;
            continue;
        }
        if (missed) {
            rc = gap(out, missed);
            missed = 0;
            n++;
        }
        rc = rc || api_buf_add(out, "data: ", 6) || api_buf_add(out, ln->s, ln->n) || api_buf_add(out, "\n\n", 2);
        n++;
    }
    if (!rc && missed) {
        rc = gap(out, missed);
        n++;
    }
    pthread_mutex_unlock(&l->mu);
    return rc ? -1 : n;
}

void srv_loop_close(srv_loop *l) {
    if (!l) return;
    atomic_store(&l->closed, 1);
    pthread_mutex_lock(&l->mu);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

int srv_loop_closed(srv_loop *l) { return atomic_load(&l->closed); }
