/* threadpool: a persistent pool of worker threads that run one parallel
 * function at a time (fork-join). Workers spin briefly, then sleep, so a
 * forward pass pays no thread creation and little synchronisation. */
#ifndef TL_THREADPOOL_H
#define TL_THREADPOOL_H

#include "tokenloop.h"

typedef struct tl_pool tl_pool;

/* fn(arg, ith, nth) is called once for each share ith = 0..nth-1 of a job,
 * each share on one thread (which thread is not fixed: per-share scratch is
 * indexed by ith, never by the thread). */
typedef void (*tl_pool_fn)(void *arg, int ith, int nth);

int tl_pool_new(int n_threads, tl_pool **out, tl_error *err);
void tl_pool_free(tl_pool *p);
int tl_pool_size(const tl_pool *p);
/* Runs the nth shares of fn on the pool (the caller takes part) and returns
 * when all are finished. */
void tl_pool_run(tl_pool *p, tl_pool_fn fn, void *arg);

/* Since the pool was made: jobs run, their wall time from dispatch to join,
 * and the time spent in shares summed over threads. busy / (wall * n) is how
 * much of the threads' time inside jobs did work; the rest is imbalance and
 * dispatch. */
void tl_pool_stats(const tl_pool *p, uint64_t *jobs, double *wall_s, double *busy_s);

/* The contiguous share [*lo, *hi) of n items for thread ith of nth. */
static inline void tl_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif
