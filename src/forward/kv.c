/* kv: block pool, sequences' block tables and the prefix cache (see kv.h).
 *
 * A block is free (on the free list), used (ref > 0) or cached (ref == 0,
 * registered, on the LRU list). Allocation takes free blocks first, then
 * evicts the least recently released cached block. A registered block's key
 * is its parent's serial and its TL_KV_BLOCK tokens, compared in full: a hash
 * collision can cost a miss, never wrong KV. Serials are never reused, so
 * once a parent is evicted its children cannot be reached and age out. */
#include "forward/kv.h"

#include <stdlib.h>
#include <string.h>

#include "forward/kvdisk.h"

#define B TL_KV_BLOCK

typedef struct kv_block {
    int ref;
    uint64_t serial;     /* nonzero while registered */
    uint64_t parent;     /* key: the serial of the prefix before it ... */
    int32_t tok[B];      /* ... and its tokens */
    uint8_t key[TL_KVKEY], pkey[TL_KVKEY]; /* with keys on: its prefix's content key, and its parent's */
    int32_t hnext;       /* hash chain */
    int32_t prev, next;  /* LRU list (cached) or free list (next only) */
} kv_block;

struct tl_kv {
    int n_blocks, n_seq, n_ctx, max_blk;
    kv_block *b;
    int32_t *hash;       /* bucket heads, n_hash a power of two */
    uint32_t n_hash;
    int32_t free_head;
    int32_t lru_head, lru_tail; /* head = evicted first */
    int n_free, n_cached;
    int n_touched;       /* the free list starts in index order: blocks [0, n_touched) were handed out */
    uint64_t next_serial;
    uint64_t query_tokens, hit_tokens;
    tl_kv_seq *seq;
    int keyed;           /* content keys on (tl_kv_key_on) */
    int32_t *fresh;      /* [n_blocks] registered since the last tl_kv_take_fresh */
    int n_fresh;
};

static uint64_t key_hash(uint64_t parent, const int32_t *tok) {
    uint64_t h = parent * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < B; i++) {
        h ^= (uint32_t)tok[i];
        h *= 0x100000001B3ull;
        h ^= h >> 29;
    }
    return h;
}

int tl_kv_new(int n_blocks, int n_seq, int n_ctx, tl_kv **out) {
    *out = NULL;
    tl_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return -1;
    kv->n_blocks = n_blocks;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->max_blk = (n_ctx + B - 1) / B;
    kv->n_hash = 16;
    while (kv->n_hash < (uint32_t)n_blocks * 2u) kv->n_hash <<= 1;
    kv->b = calloc((size_t)n_blocks, sizeof *kv->b);
    kv->hash = malloc(kv->n_hash * sizeof *kv->hash);
    kv->seq = calloc((size_t)n_seq, sizeof *kv->seq);
    int fail = !kv->b || !kv->hash || !kv->seq;
    for (int i = 0; !fail && i < n_seq; i++) {
        kv->seq[i].blk = malloc((size_t)kv->max_blk * sizeof(int32_t));
        kv->seq[i].tok = malloc((size_t)n_ctx * sizeof(int32_t));
        kv->seq[i].chains = malloc((size_t)kv->max_blk * sizeof(uint64_t));
        kv->seq[i].keys = calloc((size_t)kv->max_blk, TL_KVKEY);
        fail = !kv->seq[i].blk || !kv->seq[i].tok || !kv->seq[i].chains || !kv->seq[i].keys;
    }
    if (fail) {
        tl_kv_free(kv);
        return -1;
    }
    for (uint32_t i = 0; i < kv->n_hash; i++) kv->hash[i] = -1;
    for (int i = 0; i < n_blocks; i++) kv->b[i].next = i + 1 < n_blocks ? i + 1 : -1;
    kv->free_head = n_blocks ? 0 : -1;
    kv->n_free = n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    kv->next_serial = 1;
    kv->seq[0].open = 1;
    *out = kv;
    return 0;
}

void tl_kv_free(tl_kv *kv) {
    if (!kv) return;
    for (int i = 0; kv->seq && i < kv->n_seq; i++) {
        free(kv->seq[i].blk);
        free(kv->seq[i].tok);
        free(kv->seq[i].chains);
        free(kv->seq[i].keys);
    }
    free(kv->seq);
    free(kv->fresh);
    free(kv->b);
    free(kv->hash);
    free(kv);
}

int tl_kv_n_blocks(const tl_kv *kv) { return kv->n_blocks; }

int tl_kv_key_on(tl_kv *kv) {
    if (!kv->fresh && !(kv->fresh = malloc((size_t)(kv->n_blocks ? kv->n_blocks : 1) * sizeof *kv->fresh))) return -1;
    kv->keyed = 1;
    return 0;
}

int tl_kv_take_fresh(tl_kv *kv, int32_t *out, int max) {
    int n = kv->n_fresh < max ? kv->n_fresh : max;
    memcpy(out, kv->fresh, (size_t)n * sizeof *out);
    memmove(kv->fresh, kv->fresh + n, (size_t)(kv->n_fresh - n) * sizeof *out);
    kv->n_fresh -= n;
    return n;
}

void tl_kv_block_key(const tl_kv *kv, int32_t b, const uint8_t **key, const uint8_t **parent, const int32_t **tok) {
    *key = kv->b[b].key;
    *parent = kv->b[b].pkey;
    *tok = kv->b[b].tok;
}

tl_kv_seq *tl_kv_seq_get(tl_kv *kv, int id) {
    return id >= 0 && id < kv->n_seq && kv->seq[id].open ? &kv->seq[id] : NULL;
}

const tl_kv_seq *tl_kv_seq_peek(const tl_kv *kv, int id) {
    return id >= 0 && id < kv->n_seq && kv->seq[id].open ? &kv->seq[id] : NULL;
}

/* ---- lists and the table ---------------------------------------------------- */

static void lru_unlink(tl_kv *kv, int32_t i) {
    kv_block *x = &kv->b[i];
    if (x->prev >= 0) kv->b[x->prev].next = x->next;
    else kv->lru_head = x->next;
    if (x->next >= 0) kv->b[x->next].prev = x->prev;
    else kv->lru_tail = x->prev;
    kv->n_cached--;
}

static void lru_append(tl_kv *kv, int32_t i) {
    kv_block *x = &kv->b[i];
    x->prev = kv->lru_tail;
    x->next = -1;
    if (kv->lru_tail >= 0) kv->b[kv->lru_tail].next = i;
    else kv->lru_head = i;
    kv->lru_tail = i;
    kv->n_cached++;
}

static int32_t *bucket(tl_kv *kv, uint64_t parent, const int32_t *tok) {
    return &kv->hash[key_hash(parent, tok) & (kv->n_hash - 1)];
}

static int32_t lookup(tl_kv *kv, uint64_t parent, const int32_t *tok) {
    for (int32_t i = *bucket(kv, parent, tok); i >= 0; i = kv->b[i].hnext)
        if (kv->b[i].parent == parent && memcmp(kv->b[i].tok, tok, sizeof kv->b[i].tok) == 0)
            return i;
    return -1;
}

static void unregister(tl_kv *kv, int32_t i) {
    kv_block *x = &kv->b[i];
    for (int k = 0; k < kv->n_fresh; k++) /* evicted before the disk copy was taken */
        if (kv->fresh[k] == i) {
            kv->fresh[k] = kv->fresh[--kv->n_fresh];
            break;
        }
    for (int32_t *p = bucket(kv, x->parent, x->tok); *p >= 0; p = &kv->b[*p].hnext)
        if (*p == i) {
            *p = x->hnext;
            break;
        }
    x->serial = 0;
}

/* A block for a sequence (ref 1), or -1. */
static int32_t block_alloc(tl_kv *kv) {
    int32_t i = kv->free_head;
    if (i >= 0) {
        kv->free_head = kv->b[i].next;
        kv->n_free--;
    } else if ((i = kv->lru_head) >= 0) {
        lru_unlink(kv, i);
        unregister(kv, i);
    } else {
        return -1;
    }
    kv->b[i].ref = 1;
    if (i >= kv->n_touched) kv->n_touched = i + 1;
    return i;
}

static void block_release(tl_kv *kv, int32_t i) {
    kv_block *x = &kv->b[i];
    if (--x->ref > 0) return;
    if (x->serial) {
        lru_append(kv, i);
    } else {
        x->next = kv->free_head;
        kv->free_head = i;
        kv->n_free++;
    }
}

/* ---- sequences -------------------------------------------------------------- */

int tl_kv_seq_open(tl_kv *kv, int cache) {
    for (int id = 1; id < kv->n_seq; id++)
        if (!kv->seq[id].open) {
            tl_kv_seq *s = &kv->seq[id];
            s->open = 1;
            s->cache = cache;
            s->len = s->n_blk = s->n_reg = s->pend = 0;
            s->chain = 0;
            memset(s->key, 0, sizeof s->key);
            return id;
        }
    return -1;
}

int tl_kv_seq_truncate(tl_kv *kv, int id, int len, int32_t *copy_from, int32_t *copy_to) {
    *copy_from = *copy_to = -1;
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s || len < 0 || len > s->len) return -1;
    int keep = (len + B - 1) / B;
    if (len % B) {
        /* The block that will be written again from len on must be ours
         * alone: a registered block's bits answer for its key, a shared one
         * for its other holders. Both keep their bits; we take a copy. */
        int32_t i = s->blk[keep - 1];
        if (kv->b[i].ref > 1 || kv->b[i].serial) {
            int32_t fresh = block_alloc(kv);
            if (fresh < 0) return -1;
            s->blk[keep - 1] = fresh;
            *copy_from = i;
            *copy_to = fresh;
            block_release(kv, i);
        }
    }
    /* tail first, as in close */
    while (s->n_blk > keep) block_release(kv, s->blk[--s->n_blk]);
    s->len = len;
    s->pend = 0;
    if (s->n_reg > len / B) s->n_reg = len / B;
    s->chain = s->n_reg ? s->chains[s->n_reg - 1] : 0;
    if (s->n_reg) memcpy(s->key, s->keys[s->n_reg - 1], TL_KVKEY);
    else memset(s->key, 0, sizeof s->key);
    return 0;
}

void tl_kv_seq_close(tl_kv *kv, int id) {
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s) return;
    /* tail first: a prefix's last blocks are evicted before its shared head */
    while (s->n_blk > 0) block_release(kv, s->blk[--s->n_blk]);
    s->len = s->n_reg = s->pend = 0;
    s->chain = 0;
    memset(s->key, 0, sizeof s->key);
    if (id != 0) s->open = 0;
}

int tl_kv_seq_grow(tl_kv *kv, int id, int len) {
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s || len > kv->n_ctx) return -1;
    while (s->n_blk * B < len) {
        int32_t b = block_alloc(kv);
        if (b < 0) return -1;
        s->blk[s->n_blk++] = b;
    }
    return 0;
}

void tl_kv_seq_commit(tl_kv *kv, int id, int len) {
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s || len < s->len) return;
    s->len = len;
    s->pend = 0;
    for (; s->cache && s->n_reg < len / B; s->n_reg++) {
        const int32_t *tok = s->tok + (size_t)s->n_reg * B;
        uint8_t key[TL_KVKEY];
        if (kv->keyed) tl_kvdisk_key_next(s->key, tok, key);
        int32_t have = lookup(kv, s->chain, tok);
        kv_block *x = &kv->b[s->blk[s->n_reg]];
        if (have >= 0) { /* someone computed the same prefix: its bits are ours */
            s->chain = kv->b[have].serial;
        } else if (x->serial) { /* already registered (reused block) */
            s->chain = x->serial;
        } else {
            x->parent = s->chain;
            memcpy(x->tok, tok, sizeof x->tok);
            x->serial = kv->next_serial++;
            int32_t *p = bucket(kv, x->parent, x->tok);
            x->hnext = *p;
            *p = s->blk[s->n_reg];
            s->chain = x->serial;
            if (kv->keyed) {
                memcpy(x->key, key, TL_KVKEY);
                memcpy(x->pkey, s->key, TL_KVKEY);
                kv->fresh[kv->n_fresh++] = s->blk[s->n_reg];
            }
        }
        if (kv->keyed) memcpy(s->key, key, TL_KVKEY);
        s->chains[s->n_reg] = s->chain;
        memcpy(s->keys[s->n_reg], s->key, TL_KVKEY);
    }
}

int32_t tl_kv_seq_adopt(tl_kv *kv, int id, const int32_t *tok, const uint8_t key[TL_KVKEY]) {
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s || !s->cache || s->len % B || s->n_reg != s->len / B || s->n_blk != s->n_reg ||
        s->len + B > kv->n_ctx || lookup(kv, s->chain, tok) >= 0)
        return -1;
    int32_t i = block_alloc(kv);
    if (i < 0) return -1;
    kv_block *x = &kv->b[i];
    x->parent = s->chain;
    memcpy(x->tok, tok, sizeof x->tok);
    x->serial = kv->next_serial++;
    memcpy(x->key, key, TL_KVKEY);
    memcpy(x->pkey, s->key, TL_KVKEY);
    int32_t *p = bucket(kv, x->parent, x->tok);
    x->hnext = *p;
    *p = i;
    s->blk[s->n_blk++] = i;
    memcpy(s->tok + s->len, tok, B * sizeof *tok);
    s->len += B;
    s->chain = x->serial;
    memcpy(s->key, key, TL_KVKEY);
    s->chains[s->n_reg] = s->chain;
    memcpy(s->keys[s->n_reg], key, TL_KVKEY);
    s->n_reg++;
    kv->hit_tokens += B;
    return i;
}

int tl_kv_seq_reuse(tl_kv *kv, int id, const int32_t *tok, size_t n, size_t max_reuse) {
    tl_kv_seq *s = tl_kv_seq_get(kv, id);
    if (!s || s->len != 0 || s->n_blk != 0 || !s->cache) return 0;
    kv->query_tokens += n;
    if (max_reuse > n) max_reuse = n;
    if (max_reuse > (size_t)kv->n_ctx) max_reuse = (size_t)kv->n_ctx;
    int nb = (int)(max_reuse / B);
    uint64_t chain = 0;
    int got = 0;
    for (; got < nb; got++) {
        int32_t i = lookup(kv, chain, tok + (size_t)got * B);
        if (i < 0) break;
        if (kv->b[i].ref++ == 0) lru_unlink(kv, i);
        s->blk[s->n_blk++] = i;
        chain = kv->b[i].serial;
        s->chains[got] = chain;
        memcpy(s->keys[got], kv->b[i].key, TL_KVKEY);
        memcpy(s->key, kv->b[i].key, TL_KVKEY);
    }
    memcpy(s->tok, tok, (size_t)got * B * sizeof *tok);
    s->len = got * B;
    s->n_reg = got;
    s->chain = chain;
    kv->hit_tokens += (uint64_t)got * B;
    return got * B;
}

void tl_kv_get_stats(const tl_kv *kv, tl_kv_stats *o) {
    memset(o, 0, sizeof *o);
    o->block_size = B;
    o->n_blocks = kv->n_blocks;
    o->n_cached = kv->n_cached;
    o->n_free = kv->n_free + kv->n_cached;
    o->n_used = kv->n_blocks - o->n_free;
    o->n_touched = kv->n_touched;
    o->query_tokens = kv->query_tokens;
    o->hit_tokens = kv->hit_tokens;
}
