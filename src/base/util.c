/* base/: what every stage uses and nothing in particular owns: the error
 * record, checked arithmetic, half/bfloat16 conversions, the clock, large
 * allocations on 2 MiB pages, the cost curve (util.h).
 *
 * util: error formatting, the clock and large allocations. */
#include "base/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

int tl_fail(tl_error *err, int status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

double tl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double tl_curve_at(const double *y, const int *seen, int n_max, int n) {
    if (n < 1 || n > n_max) return 0;
    int lo = 0, first = 0;
    double lo_y = 0, first_y = 0, env = 0;
    for (int i = 1; i <= n_max; i++) {
        if (!seen[i]) continue;
        env = y[i] > env ? y[i] : env;
        if (i > n) /* the first point past n: the line from lo */
            return lo ? lo_y + (env - lo_y) * (n - lo) / (i - lo) : 0;
        if (!first) first = i, first_y = env;
        lo = i, lo_y = env;
    }
    if (!lo) return 0;
    const double slope = lo > first ? (lo_y - first_y) / (lo - first) : 0.25 * lo_y;
    return lo_y + slope * (n - lo);
}

#define BIG_PAGE ((size_t)2 << 20)

/* The mapping's start and length sit in the 64 bytes before the buffer. */
void *tl_big_alloc(size_t n) {
    if (n > SIZE_MAX - 2 * BIG_PAGE) return NULL;
    const size_t len = n + 2 * BIG_PAGE;
    uint8_t *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + 64 + BIG_PAGE - 1) & ~(uintptr_t)(BIG_PAGE - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, (n + BIG_PAGE - 1) & ~(BIG_PAGE - 1), MADV_HUGEPAGE); /* a hint: refused is fine */
#endif
    memcpy(p - 64, &raw, sizeof raw);
    memcpy(p - 64 + sizeof raw, &len, sizeof len);
    return p;
}

void tl_release_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (page <= 1 || hi <= lo) return;
#ifdef MADV_NOHUGEPAGE
    (void)madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE); /* advice: refused is fine */
#endif
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void tl_small_pages(void *p, size_t n, size_t first) {
#ifdef MADV_NOHUGEPAGE
    const uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(BIG_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + (first < n ? first : n) + BIG_PAGE - 1) & ~(uintptr_t)(BIG_PAGE - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE); /* advice: refused is fine */
#else
    (void)p, (void)n, (void)first;
#endif
}

void tl_big_free(void *p) {
    if (!p) return;
    uint8_t *raw;
    size_t len;
    memcpy(&raw, (uint8_t *)p - 64, sizeof raw);
    memcpy(&len, (uint8_t *)p - 64 + sizeof raw, sizeof len);
    munmap(raw, len);
}
