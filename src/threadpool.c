/* threadpool: fork-join workers. A generation counter announces work; workers
 * spin on it for a short while (a decode step issues hundreds of small jobs
 * back to back), then block on a condition variable so idle pools cost no CPU. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util.h"

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
    atomic_int pending;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
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
        p->fn(p->arg, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
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
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
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

void tl_pool_run(tl_pool *p, tl_pool_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    /* Spin briefly, then yield: on a busy machine a preempted worker needs
     * this CPU to finish, and burning our time slice would only delay it. */
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < 100000) cpu_relax();
        else sched_yield();
    }
}
