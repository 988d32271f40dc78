/* A minimal unit-test harness: CHECK records a failure and carries on; each
 * test program ends with the line "N passed, N failed" that tests/run.sh sums. */
#ifndef TL_TEST_H
#define TL_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int tl_test_pass, tl_test_fail;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            tl_test_pass++;                                                \
        } else {                                                           \
            tl_test_fail++;                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol, what)                                                     \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol), "%s: %.9g vs %.9g (tol %g)", what, \
          (double)(a), (double)(b), (double)(tol))

static inline int tl_test_summary(void) {
    printf("%d passed, %d failed\n", tl_test_pass, tl_test_fail);
    return tl_test_fail ? 1 : 0;
}

#endif
