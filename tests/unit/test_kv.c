/* The KV bookkeeping (src/forward/kv.c) alone, without a model: reference counts of
 * shared blocks, least-recently-used eviction released tail first, prefixes
 * registered under their parents, two sequences computing the same prefix,
 * the n - 1 cap of a lookup, running out of blocks, the statistics, and the
 * implicit sequence 0 that rewinds, and caching sequences that rewind
 * (copy on write of a registered or shared block). */
#include <stdio.h>
#include <string.h>

#include "forward/kv.h"
#include "tl_test.h"

#define B TL_KV_BLOCK

/* Writes tok[0..n) into sequence id (as tl_ctx_decode does) and commits. */
static int feed(tl_kv *kv, int id, const int32_t *tok, int n) {
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s || tl_kv_seq_grow(kv, id, s->len + n)) return -1;
    memcpy(s->tok + s->len, tok, (size_t)n * sizeof *tok);
    tl_kv_seq_commit(kv, id, s->len + n);
    return 0;
}

static tl_kv_stats stats(const tl_kv *kv) {
    tl_kv_stats st;
    tl_kv_get_stats(kv, &st);
    return st;
}

int main(void) {
    int32_t t[8 * B], u[8 * B];
    for (int i = 0; i < 8 * B; i++) t[i] = 1000 + i, u[i] = 5000 + i;
    tl_kv *kv;
    CHECK(tl_kv_new(10, 4, 8 * B, &kv) == 0, "new");
    if (!kv) return tl_test_summary();
    tl_kv_stats st = stats(kv);
    CHECK(st.n_blocks == 10 && st.n_free == 10 && st.n_used == 0, "fresh pool");

    int a = tl_kv_seq_open(kv, 1), b = tl_kv_seq_open(kv, 1), c = tl_kv_seq_open(kv, 1);
    CHECK(a > 0 && b > 0 && c > 0 && tl_kv_seq_open(kv, 1) < 0, "three sequences, no fourth");
    CHECK(feed(kv, a, t, 3 * B + 5) == 0, "a: 3 full blocks + 5");
    st = stats(kv);
    CHECK(st.n_used == 4 && st.n_cached == 0, "a holds 4 blocks (used %d)", st.n_used);

    /* b shares a's first 3 blocks while a runs; the cap n - 1 stops at 2 for a 3-block prompt */
    CHECK(tl_kv_seq_reuse(kv, b, t, 3 * B, 3 * B - 1) == 2 * B, "cap: 2 blocks of a 3-block prompt");
    tl_kv_seq_close(kv, b);
    b = tl_kv_seq_open(kv, 1);
    CHECK(tl_kv_seq_reuse(kv, b, t, 4 * B, 4 * B - 1) == 3 * B, "b reuses a's 3 full blocks");
    st = stats(kv);
    CHECK(st.n_used == 4, "shared blocks count once (used %d)", st.n_used);
    CHECK(tl_kv_seq_reuse(kv, c, u, 4 * B, 4 * B) == 0, "other tokens: no hit");
    int32_t mix[2 * B];
    memcpy(mix, t, B * sizeof *t);
    memcpy(mix + B, u, B * sizeof *u);
    tl_kv_seq_close(kv, c);
    c = tl_kv_seq_open(kv, 1);
    CHECK(tl_kv_seq_reuse(kv, c, mix, 2 * B, 2 * B) == B, "a shared first block, a different second");
    tl_kv_seq_close(kv, c);

    /* a closes: the shared blocks stay used by b, a's partial block is freed */
    tl_kv_seq_close(kv, a);
    st = stats(kv);
    CHECK(st.n_used == 3 && st.n_cached == 0, "after a closes: used %d cached %d", st.n_used, st.n_cached);
    tl_kv_seq_close(kv, b);
    st = stats(kv);
    CHECK(st.n_used == 0 && st.n_cached == 3 && st.n_free == 10, "all released: cached %d", st.n_cached);

    /* two sequences computing the same new prefix at once: both work, the
     * second's blocks stay private, and a later lookup finds the whole chain */
    a = tl_kv_seq_open(kv, 1);
    b = tl_kv_seq_open(kv, 1);
    CHECK(feed(kv, a, u, 2 * B) == 0 && feed(kv, b, u, 2 * B) == 0, "same prefix twice");
    CHECK(feed(kv, b, u + 2 * B, B) == 0, "b goes one block further");
    tl_kv_seq_close(kv, a);
    tl_kv_seq_close(kv, b);
    c = tl_kv_seq_open(kv, 1);
    CHECK(tl_kv_seq_reuse(kv, c, u, 4 * B, 4 * B) == 3 * B, "b's third block hangs under a's chain");
    tl_kv_seq_close(kv, c);

    /* eviction: fill the pool with other tokens; the oldest released go first */
    st = stats(kv);
    int cached_before = st.n_cached;
    a = tl_kv_seq_open(kv, 1);
    int32_t w[8 * B];
    for (int i = 0; i < 8 * B; i++) w[i] = 9000 + i;
    CHECK(feed(kv, a, w, 8 * B) == 0, "8 blocks with evictions");
    st = stats(kv);
    CHECK(st.n_used == 8 && st.n_cached == 2 && st.n_cached < cached_before, "used %d cached %d", st.n_used, st.n_cached);
    b = tl_kv_seq_open(kv, 1);
    CHECK(feed(kv, b, w, 3 * B) == -1, "pool exhausted: an error");
    st = stats(kv);
    CHECK(st.n_used == 10 && st.n_free == 0, "b kept what it got (used %d)", st.n_used);
    tl_kv_seq_close(kv, b);
    tl_kv_seq_close(kv, a);
    st = stats(kv);
    CHECK(st.n_used == 0 && st.n_free == 10, "everything back (free %d)", st.n_free);
    CHECK(st.query_tokens > 0 && st.hit_tokens == 2 * B + 3 * B + B + 3 * B, "hits %llu",
          (unsigned long long)st.hit_tokens);

    /* the implicit sequence 0 never caches and can rewind */
    int32_t from, to;
    CHECK(feed(kv, 0, t, 2 * B + 3) == 0, "sequence 0");
    CHECK(tl_kv_seq_truncate(kv, 0, B + 1, &from, &to) == 0 && from < 0 && to < 0, "rewind, no copy");
    CHECK(tl_kv_seq_peek(kv, 0)->len == B + 1 && tl_kv_seq_peek(kv, 0)->n_blk == 2, "rewound");
    CHECK(tl_kv_seq_truncate(kv, 0, B + 2, &from, &to) == -1, "cannot truncate forward");
    tl_kv_seq_close(kv, 0);
    st = stats(kv);
    CHECK(st.n_used == 0 && st.n_free == 10 && tl_kv_seq_peek(kv, 0) != NULL, "sequence 0 cleared, still open");

    /* a caching sequence rewinds too: the registered block it cuts into is
     * copied (it keeps answering for its tokens), the chain goes back, and
     * committing other tokens registers them under the right parent */
    a = tl_kv_seq_open(kv, 1);
    CHECK(feed(kv, a, t, 3 * B) == 0, "a: 3 full blocks");
    int32_t blk1 = tl_kv_seq_peek(kv, a)->blk[1];
    CHECK(tl_kv_seq_truncate(kv, a, B + 4, &from, &to) == 0 && from == blk1 && to >= 0 && to != blk1,
          "cut into a registered block: copy %d -> %d", from, to);
    const tl_kv_seq *sa = tl_kv_seq_peek(kv, a);
    CHECK(sa->len == B + 4 && sa->n_blk == 2 && sa->n_reg == 1 && sa->blk[1] == to, "rewound to B + 4");
    st = stats(kv);
    CHECK(st.n_used == 2 && st.n_free == 8, "a holds 2 blocks (used %d)", st.n_used);
    int32_t alt[2 * B];
    memcpy(alt, t + B, 4 * sizeof *t);
    for (int i = 4; i < 2 * B; i++) alt[i] = 7000 + i;
    tl_kv_seq *sw = tl_kv_seq_get(kv, a);
    CHECK(tl_kv_seq_grow(kv, a, 3 * B) == 0, "grow again");
    memcpy(sw->tok + B + 4, alt + 4, (size_t)(2 * B - 4) * sizeof *t);
    tl_kv_seq_commit(kv, a, 3 * B);
    b = tl_kv_seq_open(kv, 1);
    CHECK(tl_kv_seq_reuse(kv, b, t, 3 * B, 3 * B) == 3 * B, "the original 3 blocks still cached");
    tl_kv_seq_close(kv, b);
    int32_t both[3 * B];
    memcpy(both, t, B * sizeof *t);
    memcpy(both + B, alt, 2 * B * sizeof *t);
    b = tl_kv_seq_open(kv, 1);
    CHECK(tl_kv_seq_reuse(kv, b, both, 3 * B, 3 * B) == 3 * B, "the rewritten tail registered under block 0");
    /* b shares all of a's blocks now: cutting b copies, a keeps its bits */
    int32_t shared = tl_kv_seq_peek(kv, b)->blk[2];
    CHECK(tl_kv_seq_truncate(kv, b, 2 * B + 1, &from, &to) == 0 && from == shared && to != shared,
          "cut into a shared block: copy");
    CHECK(tl_kv_seq_peek(kv, a)->blk[2] == shared, "a keeps its block");
    /* pending positions: committed ones stay, the rest are dropped */
    tl_kv_seq *sb = tl_kv_seq_get(kv, b);
    sb->pend = 3;
    CHECK(tl_kv_seq_truncate(kv, b, 2 * B + 1, &from, &to) == 0 && sb->pend == 0 && from < 0, "pending dropped");
    tl_kv_seq_close(kv, a);
    tl_kv_seq_close(kv, b);
    st = stats(kv);
    CHECK(st.n_used == 0 && st.n_free == 10, "no block leaked (used %d free %d)", st.n_used, st.n_free);
    tl_kv_free(kv);
    return tl_test_summary();
}
