/* The recurrent-state snapshot store (src/forward/rsnap.c) alone: a snapshot
 * found by the chain serial it was put under and no other, the least
 * recently used one replaced when the store is full (a get counts as a use),
 * a dropped one gone, serial 0 never stored, and the count and bytes. */
#include <string.h>

#include "forward/rsnap.h"
#include "tl_test.h"

static void *put(tl_rsnap *s, uint64_t chain, char fill) {
    void *p = tl_rsnap_put(s, chain);
    if (p) memset(p, fill, 64);
    return p;
}

static int holds(tl_rsnap *s, uint64_t chain, char fill) {
    const char *p = tl_rsnap_get(s, chain);
    return p && p[0] == fill && p[63] == fill;
}

int main(void) {
    tl_rsnap *s = tl_rsnap_new(64, 3);
    CHECK(s != NULL, "new");
    if (!s) return tl_test_summary();
    size_t bytes = 1;
    CHECK(tl_rsnap_count(s, &bytes) == 0 && bytes == 0, "empty: nothing held, no memory");
    CHECK(tl_rsnap_get(s, 7) == NULL && tl_rsnap_put(s, 0) == NULL, "nothing under 7; serial 0 is no prefix");
    CHECK(put(s, 11, 'a') && put(s, 12, 'b') && put(s, 13, 'c'), "three puts");
    CHECK(holds(s, 11, 'a') && holds(s, 12, 'b') && holds(s, 13, 'c') && !tl_rsnap_get(s, 14), "each by its serial");
    CHECK(tl_rsnap_count(s, &bytes) == 3 && bytes == 3 * 64, "three held, 192 bytes");
    /* 11 was used last of all (the gets above ran 11, 12, 13): touch 11, so 12 is the oldest */
    CHECK(holds(s, 11, 'a'), "11 touched");
    CHECK(put(s, 14, 'd') != NULL, "a fourth put");
    CHECK(!tl_rsnap_get(s, 12) && holds(s, 11, 'a') && holds(s, 13, 'c') && holds(s, 14, 'd'),
          "the least recently used (12) replaced");
    CHECK(put(s, 13, 'e') && holds(s, 13, 'e') && tl_rsnap_count(s, NULL) == 3, "a put under a held serial rewrites it");
    tl_rsnap_drop(s, 11);
    CHECK(!tl_rsnap_get(s, 11) && tl_rsnap_count(s, &bytes) == 2 && bytes == 3 * 64,
          "dropped: gone, its buffer kept for the next put");
    CHECK(put(s, 15, 'f') && holds(s, 15, 'f') && holds(s, 13, 'e') && holds(s, 14, 'd'), "the free entry reused first");
    tl_rsnap_free(s);
    tl_rsnap_free(NULL);
    return tl_test_summary();
}
