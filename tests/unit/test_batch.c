/* Many sequences in one forward call (tl_seq_* and tl_ctx_decode) on the real
 * models: every token's logits must be bitwise the same as when its sequence
 * runs alone, whatever the other sequences in the batch, the chunking, the
 * thread count, or whether its prefix came from the prefix cache. Also the
 * errors: closed sequences, too many logits rows, an exhausted KV pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tl_test.h"
#include "tokenloop.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GEMMA "models/gemma-3-270m-q4_k_m.gguf"
#define MOE_QWEN3 "models/random/batch_qwen3moe.gguf"
#define MOE_QWEN2 "models/random/batch_qwen2moe.gguf"
#define HYB_QWEN35 "models/random/batch_qwen35.gguf"
#define HYB_QWEN35MOE "models/random/batch_qwen35moe.gguf"
#define GEMMA4 "models/random/batch_gemma4.gguf"
#define GEMMA4MOE "models/random/batch_gemma4moe.gguf"
#define NS 3

static uint64_t rng = 88172645463325252ull;
static int rnd(int n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

/* All logits of ids[0..n) evaluated on the implicit sequence of a context
 * made with cp (its KV stats after, in st if not NULL); NULL on failure. */
static float *eval_all(tl_model *m, const tl_ctx_params *cp, const int32_t *ids, int n, tl_kv_stats *st) {
    tl_ctx *c;
    tl_error err = {0};
    if (tl_ctx_new(m, cp, &c, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        return NULL;
    }
    int nv = tl_model_n_vocab(m);
    float *out = malloc((size_t)n * nv * sizeof *out);
    const int ok = out && tl_ctx_eval(c, ids, (size_t)n, 1, &err) == 0;
    CHECK(ok, "eval: %s", out ? err.msg : "out of memory");
    for (int i = 0; ok && i < n; i++) memcpy(out + (size_t)i * nv, tl_ctx_logits(c, i), (size_t)nv * sizeof *out);
    if (!ok) {
        free(out);
        out = NULL;
    }
    if (st) tl_ctx_kv_stats(c, st);
    tl_ctx_free(c);
    return out;
}

/* All logits of ids[0..n) evaluated alone, in one call. */
static float *alone(tl_model *m, const int32_t *ids, int n, int threads) {
    const tl_ctx_params cp = {.n_ctx = 256, .n_threads = threads};
    return eval_all(m, &cp, ids, n, NULL);
}

/* The NS prompts fed together in random chunks (max_chunk tokens of each
 * sequence per call, random order); each token's row is compared with ref. */
static void interleaved(tl_model *m, int32_t *const *ids, const int *n, float *const *ref,
                        int max_chunk, int threads, const char *what) {
    tl_ctx_params cp = {.n_ctx = 256, .n_threads = threads, .n_seq_max = 4, .n_batch = 64,
                        .n_logits_max = 64};
    tl_ctx *c;
    tl_error err = {0};
    if (tl_ctx_new(m, &cp, &c, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        return;
    }
    int nv = tl_model_n_vocab(m), seq[NS], done[NS] = {0}, bad = 0;
    for (int s = 0; s < NS; s++) CHECK(tl_seq_open(c, &seq[s], &err) == 0, "open: %s", err.msg);
    int32_t tok[64], sid[64], pos[64];
    uint8_t want[64];
    for (int left = 1; left && !bad;) {
        int nb = 0;
        for (int k = 0, s0 = rnd(NS); k < NS; k++) {
            int s = (s0 + k) % NS, take = 1 + rnd(max_chunk);
            for (int i = 0; i < take && done[s] < n[s] && nb < 64; i++, done[s]++) {
                tok[nb] = ids[s][done[s]], sid[nb] = seq[s], pos[nb] = done[s] + 100 * s, want[nb] = 1;
                nb++;
            }
        }
        tl_batch b = {nb, tok, sid, want, 0};
        if (tl_ctx_decode(c, &b, &err)) {
            CHECK(0, "%s: decode: %s", what, err.msg);
            break;
        }
        for (int i = 0; i < nb; i++) {
            int s = pos[i] / 100, p = pos[i] % 100;
            if (memcmp(tl_ctx_batch_logits(c, i), ref[s] + (size_t)p * nv, (size_t)nv * sizeof(float)))
                bad++;
        }
        left = 0;
        for (int s = 0; s < NS; s++) left |= done[s] < n[s];
    }
    CHECK(bad == 0, "%s: %d rows differ from the sequence alone", what, bad);
    for (int s = 0; s < NS; s++) CHECK(tl_seq_len(c, seq[s]) == n[s], "%s: length %d", what, tl_seq_len(c, seq[s]));
    tl_ctx_free(c);
}

/* A prompt whose first blocks come from the prefix cache: the new tokens'
 * logits equal a cold run's; cached_tokens is whole blocks, at most n - 1. */
static void prefix_reuse(tl_model *m, const int32_t *ids, int n, const float *ref) {
    tl_ctx_params cp = {.n_ctx = 256, .n_threads = 2, .n_seq_max = 2};
    tl_ctx *c;
    tl_error err = {0};
    if (tl_ctx_new(m, &cp, &c, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        return;
    }
    int nv = tl_model_n_vocab(m), a, b;
    int32_t sid[256];
    uint8_t want[256] = {0};
    CHECK(tl_seq_open(c, &a, &err) == 0, "%s", err.msg);
    CHECK(tl_seq_reuse_prefix(c, a, ids, (size_t)n, (size_t)n - 1) == 0, "empty cache gave a hit");
    for (int i = 0; i < n; i++) sid[i] = a;
    tl_batch bt = {n, ids, sid, want, 0};
    CHECK(tl_ctx_decode(c, &bt, &err) == 0, "%s", err.msg);
    tl_seq_close(c, a);
    tl_kv_stats st;
    tl_ctx_kv_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_cached == n / TL_KV_BLOCK, "after close: used %d cached %d", st.n_used, st.n_cached);
    for (int cut = n; cut >= n - 1; cut--) { /* the whole prompt again, or all but its last token */
        CHECK(tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
        int got = tl_seq_reuse_prefix(c, b, ids, (size_t)cut, (size_t)cut - 1);
        int expect = (cut - 1) / TL_KV_BLOCK * TL_KV_BLOCK;
        CHECK(got == expect && tl_seq_len(c, b) == got, "reused %d, expected %d", got, expect);
        int rest = cut - got;
        for (int i = 0; i < rest; i++) sid[i] = b, want[i] = 1;
        tl_batch b2 = {rest, ids + got, sid, want, 0};
        CHECK(tl_ctx_decode(c, &b2, &err) == 0, "%s", err.msg);
        int bad = 0;
        for (int i = 0; i < rest; i++)
            bad += memcmp(tl_ctx_batch_logits(c, i), ref + (size_t)(got + i) * nv, (size_t)nv * sizeof(float)) != 0;
        CHECK(bad == 0, "prefix reuse: %d of %d rows differ from cold", bad, rest);
        tl_seq_close(c, b);
        memset(want, 0, sizeof want);
    }
    tl_ctx_kv_stats(c, &st);
    CHECK(st.hit_tokens > 0 && st.query_tokens >= st.hit_tokens, "stats: %llu hits of %llu",
          (unsigned long long)st.hit_tokens, (unsigned long long)st.query_tokens);
    tl_ctx_free(c);
}

/* Recurrent layers: guesses past a block boundary rejected (the state goes
 * back), then a truncation further back than the state keeps (recomputed
 * from a snapshot or the start): every later row as a cold run's. */
static void rollback(tl_model *m, const int32_t *ids, int n, const float *ref) {
    tl_ctx_params cp = {.n_ctx = 256, .n_threads = 2, .n_seq_max = 2, .n_logits_max = 64};
    tl_ctx *c;
    tl_error err = {0};
    if (n < 36 || tl_ctx_new(m, &cp, &c, &err)) {
        CHECK(0, "rollback: %d tokens, ctx: %s", n, err.msg);
        return;
    }
    int nv = tl_model_n_vocab(m), a, bad = 0;
    int32_t sid[256], tok[256];
    uint8_t want[256];
    CHECK(tl_seq_open(c, &a, &err) == 0, "%s", err.msg);
    for (int i = 0; i < n; i++) sid[i] = a, want[i] = 1;
    tl_batch b0 = {13, ids, sid, want, 0};
    CHECK(tl_ctx_decode(c, &b0, &err) == 0, "%s", err.msg);
    /* 9 guesses at 13..21, right up to 17, wrong from 18 */
    memcpy(tok, ids + 13, 9 * sizeof *tok);
    for (int i = 5; i < 9; i++) tok[i] = ids[(i * 7) % 13];
    tl_batch b1 = {9, tok, sid, want, 1};
    CHECK(tl_ctx_decode(c, &b1, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 5; i++)
        bad += memcmp(tl_ctx_batch_logits(c, i), ref + (size_t)(13 + i) * nv, (size_t)nv * sizeof(float)) != 0;
    CHECK(tl_seq_commit(c, a, 5, &err) == 0 && tl_seq_len(c, a) == 18, "commit: %s", err.msg);
    for (int at = 18; at < n;) { /* the rest in calls of up to 11 */
        const int k = n - at < 11 ? n - at : 11;
        tl_batch b2 = {k, ids + at, sid, want, 0};
        CHECK(tl_ctx_decode(c, &b2, &err) == 0, "%s", err.msg);
        for (int i = 0; i < k; i++)
            bad += memcmp(tl_ctx_batch_logits(c, i), ref + (size_t)(at + i) * nv, (size_t)nv * sizeof(float)) != 0;
        at += k;
    }
    CHECK(bad == 0, "rollback: %d rows after rejected guesses differ from cold", bad);
    for (int cut = 7; cut <= 20; cut += 13) {
        bad = 0;
        CHECK(tl_seq_truncate(c, a, cut, &err) == 0 && tl_seq_len(c, a) == cut, "truncate to %d: %s", cut, err.msg);
        tl_batch b3 = {n - cut, ids + cut, sid, want, 0};
        CHECK(tl_ctx_decode(c, &b3, &err) == 0, "%s", err.msg);
        for (int i = 0; i < n - cut; i++)
            bad += memcmp(tl_ctx_batch_logits(c, i), ref + (size_t)(cut + i) * nv, (size_t)nv * sizeof(float)) != 0;
        CHECK(bad == 0, "truncate to %d: %d rows differ from cold", cut, bad);
    }
    tl_kv_stats st;
    tl_ctx_kv_stats(c, &st);
    CHECK(st.state_bytes > 0 && st.n_snapshots > 0 && st.snapshot_bytes > 0, "state %zu bytes, %d snapshots",
          st.state_bytes, st.n_snapshots);
    /* saved mid-block (tl_ctx_save: the blocks and the boundary's state) and
     * resumed in another context: the rest as cold */
    const int mid = 29;
    char path[64];
    snprintf(path, sizeof path, "/tmp/tl-batch-hybrid-%d.kv", (int)getpid());
    CHECK(tl_seq_truncate(c, a, mid, &err) == 0 && tl_ctx_save(c, a, path, &err) == 0, "save: %s", err.msg);
    tl_ctx_free(c);
    if (tl_ctx_new(m, &cp, &c, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        unlink(path);
        return;
    }
    int n_got = 0;
    CHECK(tl_seq_open(c, &a, &err) == 0 && tl_ctx_load(c, a, path, &n_got, &err) == 0 && n_got == mid &&
              tl_seq_len(c, a) == mid,
          "load: %d positions: %s", n_got, err.msg);
    unlink(path);
    for (int i = 0; i < n; i++) sid[i] = a;
    tl_batch b4 = {n - mid, ids + mid, sid, want, 0};
    bad = 0;
    CHECK(tl_ctx_decode(c, &b4, &err) == 0, "%s", err.msg);
    for (int i = 0; i < n - mid; i++)
        bad += memcmp(tl_ctx_batch_logits(c, i), ref + (size_t)(mid + i) * nv, (size_t)nv * sizeof(float)) != 0;
    CHECK(bad == 0, "resumed from a saved sequence: %d rows differ from cold", bad);
    tl_ctx_free(c);
}

static void errors(tl_model *m, const int32_t *text, int n_text) {
    tl_error err = {0};
    int32_t ids[65]; /* the prompt's tokens, repeated to fill 64 positions and one more */
    for (int i = 0; i < 65; i++) ids[i] = text[i % n_text];
    tl_ctx *c;
    tl_ctx_params cp0 = {.n_ctx = 64, .n_threads = 1, .n_seq_max = 2};
    CHECK(tl_ctx_new(m, &cp0, &c, &err) == 0, "%s", err.msg);
    tl_kv_stats st;
    tl_ctx_kv_stats(c, &st);
    tl_ctx_free(c);
    CHECK(st.n_blocks == 2 * 64 / TL_KV_BLOCK && st.block_bytes > 0, "default pool: %d blocks", st.n_blocks);
    /* a pool of 5 blocks: one 64-position sequence and one block more */
    tl_ctx_params cp = {.n_ctx = 64, .n_threads = 1, .n_seq_max = 2, .n_logits_max = 2};
    cp.kv_bytes = st.block_bytes - 1; /* not even a block */
    CHECK(tl_ctx_new(m, &cp, &c, &err) == TL_ERR_ARG, "a pool without a block accepted");
    cp.kv_bytes = 5 * st.block_bytes;
    CHECK(tl_ctx_new(m, &cp, &c, &err) == 0, "%s", err.msg);
    int a = 0, b = 0, x = 0;
    CHECK(tl_seq_open(c, &a, &err) == 0 && tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
    CHECK(tl_seq_open(c, &x, &err) == TL_ERR_CONTEXT_FULL, "a third sequence opened");
    int32_t sid[64];
    uint8_t want[64];
    for (int i = 0; i < 64; i++) sid[i] = a, want[i] = 1;
    tl_batch bt = {3, ids, sid, want, 0};
    CHECK(tl_ctx_decode(c, &bt, &err) == TL_ERR_ARG, "3 logits rows with a limit of 2");
    bt.logits = NULL;
    sid[1] = 7;
    CHECK(tl_ctx_decode(c, &bt, &err) == TL_ERR_ARG, "a sequence that is not open");
    sid[1] = a;
    bt.n = 0;
    CHECK(tl_ctx_decode(c, &bt, &err) == TL_ERR_ARG, "an empty batch");
    bt.n = 64; /* four of the five blocks */
    CHECK(tl_ctx_decode(c, &bt, &err) == 0 && tl_seq_len(c, a) == 64, "%s", err.msg);
    bt.n = 1;
    CHECK(tl_ctx_decode(c, &bt, &err) == TL_ERR_CONTEXT_FULL, "past n_ctx accepted");
    for (int i = 0; i < 64; i++) sid[i] = b;
    bt.n = 32;
    CHECK(tl_ctx_decode(c, &bt, &err) == TL_ERR_CONTEXT_FULL, "more blocks than the pool has");
    tl_seq_close(c, b); /* b's one block was allocated before the failure: released */
    tl_seq_close(c, a);
    tl_ctx_kv_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_cached == 4 && st.n_free == 5, "after close: used %d cached %d free %d",
          st.n_used, st.n_cached, st.n_free);
    CHECK(tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 64; i++) sid[i] = b;
    bt.n = 64;
    bt.token = ids + 1; /* other tokens: no hit, cached blocks are evicted */
    CHECK(tl_ctx_decode(c, &bt, &err) == 0, "cached blocks are evicted for a new sequence: %s", err.msg);
    CHECK(tl_seq_open(c, &a, &err) == 0, "%s", err.msg);
    /* b took the free block and evicted three cached ones, a's last three
     * first (released tail first): a's first block is still found */
    CHECK(tl_seq_reuse_prefix(c, a, ids, 64, 63) == TL_KV_BLOCK, "tail-first eviction");
    tl_ctx_free(c);
}

/* Gemma 3 (sliding window 512): a cached prefix past the window. */
static void gemma(void) {
    tl_model *m;
    tl_error err = {0};
    if (tl_model_load(GEMMA, &m, &err)) {
        CHECK(0, "load %s: %s", GEMMA, err.msg);
        return;
    }
    char text[8192] = "";
    for (int i = 0; i < 60; i++) {
        char line[96];
        snprintf(line, sizeof line, "Step %d: the lantern lit %d rooms of the tower. ", i, 5 * i + 3);
        strcat(text, line);
    }
    int32_t *ids;
    size_t n_all;
    CHECK(tl_tokenize(m, text, strlen(text), TL_TOK_ADD_BOS, &ids, &n_all, &err) == 0, "%s", err.msg);
    const int n = 540;
    CHECK(n_all >= (size_t)n, "gemma text has %zu tokens", n_all);
    tl_ctx_params cp = {.n_ctx = 640, .n_threads = 2, .n_seq_max = 2, .n_logits_max = 4};
    tl_ctx *c;
    if (n_all >= (size_t)n && tl_ctx_new(m, &cp, &c, &err) == 0) {
        int nv = tl_model_n_vocab(m), a, b;
        int32_t sid[640];
        uint8_t want[640] = {0};
        float *cold = malloc((size_t)nv * sizeof *cold);
        CHECK(tl_seq_open(c, &a, &err) == 0, "%s", err.msg);
        for (int i = 0; i < n; i++) sid[i] = a;
        for (int done = 0; done < n;) {
            int nb = n - done < 512 ? n - done : 512;
            want[nb - 1] = done + nb == n;
            tl_batch bt = {nb, ids + done, sid, want, 0};
            CHECK(tl_ctx_decode(c, &bt, &err) == 0, "%s", err.msg);
            want[nb - 1] = 0;
            done += nb;
        }
        memcpy(cold, tl_ctx_batch_logits(c, 0), (size_t)nv * sizeof *cold);
        tl_seq_close(c, a);
        CHECK(tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
        int got = tl_seq_reuse_prefix(c, b, ids, (size_t)n, (size_t)n - 1);
        CHECK(got == (n - 1) / TL_KV_BLOCK * TL_KV_BLOCK, "gemma reused %d", got);
        for (int i = 0; i < n - got; i++) sid[i] = b;
        want[n - got - 1] = 1;
        tl_batch bt = {n - got, ids + got, sid, want, 0};
        CHECK(tl_ctx_decode(c, &bt, &err) == 0, "%s", err.msg);
        CHECK(!memcmp(cold, tl_ctx_batch_logits(c, 0), (size_t)nv * sizeof *cold),
              "gemma: logits after a cached prefix past the window differ from cold");
        free(cold);
        tl_ctx_free(c);
    } else {
        CHECK(0, "gemma ctx: %s", err.msg);
    }
    tl_free(ids);
    tl_model_free(m);
}

/* Rows of ids[from..to) fed to seq in calls of 1..max_chunk tokens, each
 * compared with ref (if not NULL); returns the rows that differ. */
static int feed(tl_ctx *c, int seq, const int32_t *ids, int from, int to, int max_chunk, const float *ref, int nv) {
    int32_t sid[64];
    uint8_t want[64];
    int bad = 0;
    for (int i = 0; i < 64; i++) sid[i] = seq, want[i] = 1;
    tl_error err = {0};
    for (int at = from; at < to;) {
        int k = 1 + rnd(max_chunk);
        if (k > to - at) k = to - at;
        tl_batch b = {k, ids + at, sid, want, 0};
        if (tl_ctx_decode(c, &b, &err)) {
            CHECK(0, "feed at %d: %s", at, err.msg);
            return to - at;
        }
        for (int i = 0; ref && i < k; i++)
            bad += memcmp(tl_ctx_batch_logits(c, i), ref + (size_t)(at + i) * nv, (size_t)nv * sizeof(float)) != 0;
        at += k;
    }
    return bad;
}

/* Sliding-window layers in rings (tl_ctx_params.swa_full 0) on a file with
 * a window of 16 and batches of 8: a ring of 2 blocks (window - 1 + batch = 23 positions), gone around many
 * times. Every row equals the same context's with the windows in the pool
 * (swa_full), bit for bit: fed in chunks, beside another sequence, after a
 * truncation the ring still covers and one it does not (recomputed), from
 * a cached prefix (resumed at a snapshot of the window), after rejected
 * guesses. The pool's blocks hold the other layers only. */
static void rings(const char *file) {
    tl_model *m;
    tl_error err = {0};
    if (tl_model_load(file, &m, &err)) {
        CHECK(0, "load %s: %s (tests/run.sh makes it with scripts/mkmodel.py)", file, err.msg);
        return;
    }
    enum { N = 300 };
    int32_t ids[N], other[N];
    const int nv = tl_model_n_vocab(m);
    for (int i = 0; i < N; i++) ids[i] = 1 + rnd(nv - 1), other[i] = 1 + rnd(nv - 1);
    tl_ctx_params cp = {.n_ctx = 512, .n_threads = 2, .n_seq_max = 3, .n_batch = 8, .n_logits_max = 8, .swa_full = 1};
    tl_ctx *c;
    tl_kv_stats fs, st;
    float *ref = eval_all(m, &cp, ids, N, &fs);
    cp.swa_full = 0;
    if (!ref || tl_ctx_new(m, &cp, &c, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        free(ref);
        tl_model_free(m);
        return;
    }
    tl_ctx_kv_stats(c, &st);
    CHECK(fs.window_bytes == 0 && st.window_bytes > 0 && st.n_swa == 16 && st.block_bytes < fs.block_bytes &&
              st.block_bytes + st.window_pos_bytes * TL_KV_BLOCK == fs.block_bytes,
          "%s: ring %zu bytes, blocks of %zu (full %zu)", file, st.window_bytes, st.block_bytes, fs.block_bytes);
    int a = 0, b = 0, x = 0;
    CHECK(tl_seq_open(c, &a, &err) == 0 && tl_seq_open(c, &x, &err) == 0, "%s", err.msg);
    int bad = feed(c, a, ids, 0, 150, 8, ref, nv);
    feed(c, x, other, 0, 40, 8, NULL, 0); /* a neighbour between a's calls (its rows are not compared) */
    bad += feed(c, a, ids, 150, N, 8, ref, nv);
    CHECK(bad == 0, "%s: %d rows in rings differ from the windows in the pool", file, bad);
    for (int k = 0; k < 2; k++) { /* within the ring (back 4), then behind it (back 60: recomputed) */
        const int cut = k ? N - 60 : N - 4;
        CHECK(tl_seq_truncate(c, a, cut, &err) == 0 && tl_seq_len(c, a) == cut, "truncate to %d: %s", cut, err.msg);
        bad = feed(c, a, ids, cut, N, 8, ref, nv);
        CHECK(bad == 0, "%s: after a truncation to %d, %d rows differ", file, cut, bad);
    }
    /* 5 guesses, 2 right: the window goes back to the last right one */
    int32_t g[5] = {ids[N - 30], ids[N - 29], other[0], other[1], other[2]}, sid[8];
    uint8_t want[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++) sid[i] = a;
    CHECK(tl_seq_truncate(c, a, N - 30, &err) == 0, "%s", err.msg);
    tl_batch gb = {5, g, sid, want, 1};
    CHECK(tl_ctx_decode(c, &gb, &err) == 0 && tl_seq_commit(c, a, 2, &err) == 0 && tl_seq_len(c, a) == N - 28,
          "guesses: %s", err.msg);
    bad = feed(c, a, ids, N - 28, N, 8, ref, nv);
    CHECK(bad == 0, "%s: after rejected guesses, %d rows differ", file, bad);
    tl_seq_close(c, a); /* its window at the last boundary is kept */
    CHECK(tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
    int got = tl_seq_reuse_prefix(c, b, ids, N, N - 1);
    CHECK(got == (N - 1) / TL_KV_BLOCK * TL_KV_BLOCK && tl_seq_len(c, b) == got, "%s: reused %d", file, got);
    bad = feed(c, b, ids, got, N, 8, ref, nv);
    CHECK(bad == 0, "%s: after a cached prefix, %d rows differ", file, bad);
    tl_seq_close(c, b);
    /* a prompt that parts from the cached one at 200: resumed at a snapshot
     * before that (a boundary a prompt's chunk ended past), or the start */
    int32_t mix[N];
    memcpy(mix, ids, sizeof mix);
    mix[200] = other[7];
    CHECK(tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
    got = tl_seq_reuse_prefix(c, b, mix, 200, 199);
    CHECK(got % TL_KV_BLOCK == 0 && got <= 192 && tl_seq_len(c, b) == got, "%s: reused %d of 200", file, got);
    bad = feed(c, b, ids, got, 200, 8, ref, nv);
    CHECK(bad == 0, "%s: after a cached prefix cut at a snapshot, %d rows differ", file, bad);
    tl_kv_stats st2;
    tl_ctx_kv_stats(c, &st2);
    CHECK(st2.n_snapshots > 0 && st2.snapshot_bytes > 0, "%s: %d window snapshots", file, st2.n_snapshots);
    /* the implicit sequence (tl_ctx_eval, no prefix cache): a prompt, then
     * tokens one by one, then a rewind behind the ring to after the prompt
     * (resumed at the prompt's end) and one to before it (from the start) */
    CHECK(tl_ctx_eval(c, ids, 150, 0, &err) == 0, "%s", err.msg);
    for (int i = 150; i < 250; i++) CHECK(tl_ctx_eval(c, ids + i, 1, 0, &err) == 0, "%s", err.msg);
    for (int k = 0; k < 2; k++) {
        const int cut = k ? 100 : 160;
        int bad0 = 0;
        CHECK(tl_ctx_truncate(c, cut, &err) == 0 && tl_ctx_n_past(c) == cut, "truncate 0 to %d: %s", cut, err.msg);
        for (int i = cut; i < N; i++) {
            CHECK(tl_ctx_eval(c, ids + i, 1, 0, &err) == 0, "%s", err.msg);
            bad0 += memcmp(tl_ctx_logits(c, -1), ref + (size_t)i * nv, (size_t)nv * sizeof(float)) != 0;
        }
        CHECK(bad0 == 0, "%s: sequence 0 rewound to %d, %d rows differ", file, cut, bad0);
        CHECK(tl_ctx_truncate(c, 250, &err) == 0, "%s", err.msg);
    }
    /* saved mid-block (the blocks, the window at the last boundary) and
     * resumed in another context: the rest as the pool's */
    char path[64];
    snprintf(path, sizeof path, "/tmp/tl-batch-ring-%d.kv", (int)getpid());
    CHECK(tl_seq_truncate(c, b, 181, &err) == 0 && tl_ctx_save(c, b, path, &err) == 0, "save: %s", err.msg);
    tl_ctx_free(c);
    int n_got = 0;
    if (tl_ctx_new(m, &cp, &c, &err) == 0) {
        CHECK(tl_seq_open(c, &a, &err) == 0 && tl_ctx_load(c, a, path, &n_got, &err) == 0 && n_got == 181,
              "load: %d positions: %s", n_got, err.msg);
        bad = feed(c, a, ids, 181, N, 8, ref, nv);
        CHECK(bad == 0, "%s: resumed from a saved sequence, %d rows differ", file, bad);
        tl_ctx_free(c);
    } else {
        CHECK(0, "ctx: %s", err.msg);
    }
    unlink(path);
    /* calls of one token: the window before the last boundary is still
     * held 15 positions past it (saved, then resumed as the pool's) */
    tl_ctx_params c1 = cp;
    c1.n_batch = 1;
    if (tl_ctx_new(m, &c1, &c, &err) == 0) {
        CHECK(tl_seq_open(c, &a, &err) == 0, "%s", err.msg);
        bad = feed(c, a, ids, 0, 63, 1, ref, nv);
        CHECK(bad == 0 && tl_ctx_save(c, a, path, &err) == 0, "%s: -b 1, saved at 63: %d rows differ, %s", file, bad,
              err.msg);
        tl_ctx_free(c);
        if (tl_ctx_new(m, &c1, &c, &err) == 0) {
            CHECK(tl_seq_open(c, &a, &err) == 0 && tl_ctx_load(c, a, path, &n_got, &err) == 0 && n_got == 63,
                  "load: %s", err.msg);
            bad = feed(c, a, ids, 63, 120, 1, ref, nv);
            CHECK(bad == 0, "%s: -b 1, resumed at 63: %d rows differ", file, bad);
            tl_ctx_free(c);
        }
        unlink(path);
    } else {
        CHECK(0, "ctx: %s", err.msg);
    }
    free(ref);
    tl_model_free(m);
}

/* Where a sequence state is kept (tl_seq_keep_state_at): a prompt fed in
 * chunks keeps its state at the boundary it was asked for and at its last
 * chunk, no more (each chunk's snapshot replaced the one before); another
 * prompt sharing the first 100 tokens resumes at 96, and its rows equal a
 * cold run's. On a hybrid (recurrent state) and on rings. */
static void keep_state(const char *file) {
    tl_model *m;
    tl_error err = {0};
    if (tl_model_load(file, &m, &err)) {
        CHECK(0, "load %s: %s", file, err.msg);
        return;
    }
    enum { N = 300 };
    int32_t ids[N], mix[N];
    const int nv = tl_model_n_vocab(m);
    for (int i = 0; i < N; i++) ids[i] = 1 + rnd(nv - 1), mix[i] = i < 100 ? ids[i] : 1 + rnd(nv - 1);
    tl_ctx_params cp = {.n_ctx = 512, .n_threads = 2, .n_seq_max = 3, .n_batch = 8, .n_logits_max = 8};
    tl_ctx *c;
    tl_kv_stats st;
    float *ref = eval_all(m, &cp, mix, N, &st);
    CHECK(!ref || st.n_snapshots == 0, "%s: sequence 0 kept %d states", file, st.n_snapshots);
    if (!ref || tl_ctx_new(m, &cp, &c, &err)) {
        CHECK(0, "ctx: %s", err.msg);
        free(ref);
        tl_model_free(m);
        return;
    }
    int a, b;
    CHECK(tl_seq_open(c, &a, &err) == 0, "%s", err.msg);
    CHECK(tl_seq_keep_state_at(c, a, 100) == 96, "%s: keep at 100 -> 96", file);
    int32_t sid[8];
    uint8_t want[8] = {0};
    for (int i = 0; i < 8; i++) sid[i] = a;
    for (int at = 0; at < N; at += 8) { /* chunks of 8: one ends at 96 */
        tl_batch bt = {N - at < 8 ? N - at : 8, ids + at, sid, want, 0};
        CHECK(tl_ctx_decode(c, &bt, &err) == 0, "%s", err.msg);
    }
    tl_ctx_kv_stats(c, &st);
    CHECK(st.n_snapshots == 2, "%s: a prompt of %d chunks kept %d states (96 and its last chunk's)", file,
          (N + 7) / 8, st.n_snapshots);
    CHECK(tl_seq_open(c, &b, &err) == 0, "%s", err.msg);
    const int got = tl_seq_reuse_prefix(c, b, mix, N, N - 1);
    CHECK(got == 96, "%s: a prompt sharing 100 tokens resumed at %d", file, got);
    const int bad = feed(c, b, mix, got, N, 8, ref, nv);
    CHECK(bad == 0, "%s: after the kept state, %d rows differ from a cold run", file, bad);
    tl_seq_close(c, a);
    tl_seq_close(c, b);
    tl_ctx_free(c);
    /* a sequence resumed at another's chunk snapshot and asked to keep that
     * boundary: the other's next chunk no longer replaces it */
    int32_t other[N];
    for (int i = 0; i < N; i++) other[i] = i < 40 ? ids[i] : 1 + rnd(nv - 1);
    if (tl_ctx_new(m, &cp, &c, &err) == 0) {
        int x = 0, y = 0, z = 0;
        CHECK(tl_seq_open(c, &x, &err) == 0 && tl_seq_open(c, &y, &err) == 0, "%s", err.msg);
        feed(c, x, ids, 0, 32, 8, NULL, 0); /* chunk snapshots up to 32 */
        const int ry = tl_seq_reuse_prefix(c, y, ids, N, N - 1);
        CHECK(ry == 32 && tl_seq_keep_state_at(c, y, 32) == 32, "%s: resumed at %d", file, ry);
        feed(c, x, ids, 32, 96, 8, NULL, 0); /* x's next chunks */
        CHECK(tl_seq_open(c, &z, &err) == 0, "%s", err.msg);
        const int rz = tl_seq_reuse_prefix(c, z, other, N, N - 1);
        CHECK(rz == 32, "%s: the kept boundary survived the other's chunks: resumed at %d", file, rz);
        tl_ctx_free(c);
    } else {
        CHECK(0, "ctx: %s", err.msg);
    }
    free(ref);
    tl_model_free(m);
}

/* The same on mixtures of experts (random weights, tests/run.sh makes them):
 * a token's row must not depend on which other tokens chose its experts, or
 * how many did; and on the hybrids, whose Gated DeltaNet layers keep a
 * recurrent state per sequence: token by token, in chunks, beside other
 * sequences, from a snapshot of a cached prefix, after rejected guesses; and
 * on Gemma 4 (layers of two shapes, per-layer inputs, layers reading an
 * earlier layer's cache, experts beside a dense FFN). */
static void experts(void) {
    static const char *files[] = {MOE_QWEN3, MOE_QWEN2, HYB_QWEN35, HYB_QWEN35MOE, GEMMA4, GEMMA4MOE};
    static const char river[] = "The river flows past the old mill and into the sea, where the boats of the "
                                "fishermen wait for the tide to turn, and the gulls circle over the harbour "
                                "wall until evening comes";
    const char *texts[NS] = {river,
                             "Seven apples, three pears and a basket of plums were on the table, and the "
                             "children counted them twice before supper",
                             "In the beginning the town had one road, one bridge and one well"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        tl_model *m;
        tl_error err = {0};
        if (tl_model_load(files[f], &m, &err)) {
            CHECK(0, "load %s: %s (tests/run.sh makes it with scripts/mkmodel.py)", files[f], err.msg);
            continue;
        }
        int32_t *ids[NS];
        int n[NS];
        float *ref[NS];
        for (int s = 0; s < NS; s++) {
            size_t k;
            CHECK(tl_tokenize(m, texts[s], strlen(texts[s]), 0, &ids[s], &k, &err) == 0, "%s", err.msg);
            n[s] = (int)k;
            ref[s] = alone(m, ids[s], n[s], 1);
        }
        if (ref[0] && ref[1] && ref[2]) {
            interleaved(m, ids, n, ref, 1, 2, files[f]);
            interleaved(m, ids, n, ref, 20, 3, files[f]);
            prefix_reuse(m, ids[0], n[0], ref[0]);
            if (f == 2 || f == 3) rollback(m, ids[0], n[0], ref[0]); /* the hybrids */
        }
        for (int s = 0; s < NS; s++) {
            free(ref[s]);
            tl_free(ids[s]);
        }
        tl_model_free(m);
    }
}

int main(void) {
    tl_model *m;
    tl_error err = {0};
    experts();
    rings(GEMMA4);
    rings(GEMMA4MOE);
    keep_state(HYB_QWEN35);
    keep_state(GEMMA4);
    if (tl_model_load(MODEL, &m, &err)) {
        CHECK(0, "load %s: %s (run 'make models')", MODEL, err.msg);
        return tl_test_summary();
    }
    const char *texts[NS] = {
        "<|im_start|>user\nName three rivers in Europe and say which is longest.<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox jumps over the lazy dog. Then it runs into the forest, where the trees are tall and",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # prints"};
    int32_t *ids[NS];
    int n[NS];
    float *ref[NS];
    for (int s = 0; s < NS; s++) {
        size_t k;
        CHECK(tl_tokenize(m, texts[s], strlen(texts[s]), TL_TOK_PARSE_SPECIAL, &ids[s], &k, &err) == 0, "%s", err.msg);
        n[s] = (int)k;
        ref[s] = alone(m, ids[s], n[s], 1);
    }
    if (ref[0] && ref[1] && ref[2]) {
        interleaved(m, ids, n, ref, 1, 2, "one token each per call");
        interleaved(m, ids, n, ref, 7, 1, "chunks up to 7, 1 thread");
        interleaved(m, ids, n, ref, 20, 3, "chunks up to 20, 3 threads");
        prefix_reuse(m, ids[2], n[2], ref[2]);
    }
    errors(m, ids[1], n[1]);
    for (int s = 0; s < NS; s++) {
        free(ref[s]);
        tl_free(ids[s]);
    }
    tl_model_free(m);
    gemma();
    return tl_test_summary();
}
