/* util: error formatting and the clock. */
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
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
