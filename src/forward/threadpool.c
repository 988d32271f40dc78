/* threadpool: fork-join workers. A generation counter announces work; workers
 * spin on it for a short while (a decode step issues hundreds of small jobs
 * back to back), then block on a condition variable so idle pools cost no CPU.
 * A job's nth shares are claimed from a counter by whichever thread is
 * running, so when another process holds a core and a worker is not
 * scheduled, the caller does that worker's share instead of waiting a time
 * slice for it (a decode step has ~150 jobs). */
#include "forward/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/util.h"

#define SPIN_ITERS 20000

typedef struct worker {
    struct tl_pool *pool;
    int ith;
    pthread_t th;
} worker;

struct tl_pool {
    int n;
    worker *w;
    int n_started;
    tl_pool_fn fn;
    void *arg;
    atomic_uint gen;
    atomic_int next;    /* next share to claim */
    atomic_int done;    /* shares finished */
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* tl_pool_stats: kept by the caller's thread (jobs, wall) and by each
     * share (busy, summed atomically in ns) */
    uint64_t jobs, wall_ns;
    atomic_ullong busy_ns;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims and runs shares of the current job until none is left. fn and arg
 * are read after a successful claim: the claim synchronizes with the reset
 * of `next` that publishes them, so a late worker never runs a stale job. */
static void run_shares(tl_pool *p) {
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_acq_rel);
        if (i >= p->n) return;
        const uint64_t t0 = now_ns();
        p->fn(p->arg, i, p->n);
        atomic_fetch_add_explicit(&p->busy_ns, now_ns() - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    tl_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = g;
        run_shares(p);
    }
}

int tl_pool_new(int n_threads, tl_pool **out, tl_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return tl_fail(err, TL_ERR_ARG, "thread count %d out of range 1..1024", n_threads);
    tl_pool *p = calloc(1, sizeof *p);
    if (!p) return tl_fail(err, TL_ERR_NOMEM, "out of memory (thread pool)");
    p->n = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->next, n_threads); /* nothing to claim */
    atomic_init(&p->done, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->busy_ns, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->w = calloc((size_t)n_threads, sizeof *p->w);
        if (!p->w) {
            tl_pool_free(p);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory (thread pool)");
        }
        for (int i = 1; i < n_threads; i++) {
            p->w[i].pool = p;
            p->w[i].ith = i;
            if (pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]) != 0) {
                tl_pool_free(p);
                return tl_fail(err, TL_ERR_NOMEM, "could not create thread %d", i);
            }
            p->n_started = i;
        }
    }
    *out = p;
    return TL_OK;
}

void tl_pool_free(tl_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->w[i].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->w);
    free(p);
}

int tl_pool_size(const tl_pool *p) { return p->n; }

void tl_pool_stats(const tl_pool *p, uint64_t *jobs, double *wall_s, double *busy_s) {
    *jobs = p->jobs;
    *wall_s = (double)p->wall_ns * 1e-9;
    *busy_s = (double)atomic_load(&p->busy_ns) * 1e-9;
}

void tl_pool_run(tl_pool *p, tl_pool_fn fn, void *arg) {
    p->jobs++;
    if (p->n == 1) {
        const uint64_t t0 = now_ns();
        fn(arg, 0, 1);
        const uint64_t dt = now_ns() - t0;
        p->wall_ns += dt;
        atomic_fetch_add_explicit(&p->busy_ns, dt, memory_order_relaxed);
        return;
    }
    const uint64_t t0 = now_ns();
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->next, 0, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_shares(p);
    /* Shares still running on workers: spin briefly, then yield, since on a
     * busy machine a preempted worker needs this CPU to finish. */
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < p->n; spins++) {
        if (spins < 100000) cpu_relax();
        else sched_yield();
    }
    p->wall_ns += now_ns() - t0;
}
