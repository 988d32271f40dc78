/* test_server_loop: the live loop's hub (server/loop.c) without a server: a
 * reader that falls behind a small ring, and records the publisher lost,
 * each reach the reader as an "event: gap" with how many it missed, in the
 * place they would have been. */
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "loop.h"
#include "tl_test.h"

static void publish(srv_loop *l, int k) {
    char s[32];
    int n = snprintf(s, sizeof s, "{\"step\":%d}", k);
    srv_loop_publish(l, s, (size_t)n);
}

/* What one read returns, as text. */
static int read_all(srv_loop *l, uint64_t *next, char *out, size_t cap) {
    api_buf b = {0};
    int n = srv_loop_read(l, next, &b, 10);
    size_t k = b.n < cap - 1 ? b.n : cap - 1;
    memcpy(out, b.p ? b.p : "", k);
    out[k] = 0;
    api_buf_free(&b);
    return n;
}

int main(void) {
    srv_loop *l = NULL;
    CHECK(srv_loop_new(4, &l) == 0, "a ring of 4");
    if (!l) return tl_test_summary();
    char got[1024];
    /* a slow reader: 10 records into a ring of 4 before it reads */
    uint64_t next = srv_loop_join(l);
    for (int k = 0; k < 10; k++) publish(l, k);
    int n = read_all(l, &next, got, sizeof got);
    CHECK(n == 5 && !strcmp(got, "event: gap\ndata: 6\n\ndata: {\"step\":6}\n\ndata: {\"step\":7}\n\n"
                                 "data: {\"step\":8}\n\ndata: {\"step\":9}\n\n"),
          "a reader 6 behind: a gap of 6, then the 4 kept (%d events): %s", n, got);
    /* records the publisher could not keep (NULL: lost) */
    publish(l, 10);
    srv_loop_publish(l, NULL, 0);
    srv_loop_publish(l, NULL, 0);
    publish(l, 13);
    n = read_all(l, &next, got, sizeof got);
    CHECK(n == 3 && !strcmp(got, "data: {\"step\":10}\n\nevent: gap\ndata: 2\n\ndata: {\"step\":13}\n\n"),
          "two lost records: a gap of 2 between their neighbours (%d events): %s", n, got);
    srv_loop_publish(l, NULL, 0);
    n = read_all(l, &next, got, sizeof got);
    CHECK(n == 1 && !strcmp(got, "event: gap\ndata: 1\n\n"), "a lost last record: a gap of 1 (%d): %s", n, got);
    /* lost and overwritten together: one gap that counts both */
    srv_loop_publish(l, NULL, 0);
    for (int k = 15; k < 20; k++) publish(l, k);
    n = read_all(l, &next, got, sizeof got);
    CHECK(n == 5 && !strncmp(got, "event: gap\ndata: 2\n\ndata: {\"step\":16}\n\n", 39),
          "a lost record, then overwritten ones: one gap of 2 (%d): %s", n, got);
    n = read_all(l, &next, got, sizeof got);
    CHECK(n == 0 && !got[0], "nothing new: nothing (%d): %s", n, got);
    srv_loop_leave(l);
    srv_loop_free(l);
    return tl_test_summary();
}
