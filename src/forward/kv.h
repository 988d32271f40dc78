/* kv: the bookkeeping of the paged KV cache. Owns the block pool (reference
 * counts, free list, least-recently-used list), every sequence's block table
 * and tokens, and the prefix cache that maps (what came before, the next
 * TL_KV_BLOCK tokens) to a block already computed. The K/V numbers themselves
 * live in the context (forward.c); a block id indexes them in every layer. */
#ifndef TL_KV_H
#define TL_KV_H

#include <stdint.h>

#include "tokenloop.h"

typedef struct tl_kv tl_kv;

typedef struct tl_kv_seq {
    int open;
    int cache;        /* registers its full blocks in the prefix cache */
    int len;          /* positions written */
    int n_blk;        /* blocks in blk[] (may run ahead of len) */
    int n_reg;        /* full blocks already offered to the prefix cache */
    int pend;         /* positions written past len, not yet committed */
    uint64_t chain;   /* serial of the prefix through block n_reg - 1 (0: none) */
    uint64_t *chains; /* [max_blocks] chain after each registered block (truncation) */
    uint8_t (*keys)[16]; /* [max_blocks] the content key after each (with keys on) */
    uint8_t key[16];  /* the content key through block n_reg - 1 (zeros: none) */
    int32_t *blk;     /* [max_blocks] */
    int32_t *tok;     /* [n_ctx] the tokens at each position */
} tl_kv_seq;

/* n_seq sequences (id 0 is the implicit one, which never caches). */
int tl_kv_new(int n_blocks, int n_seq, int n_ctx, tl_kv **out);
void tl_kv_free(tl_kv *kv);
int tl_kv_n_blocks(const tl_kv *kv);
tl_kv_seq *tl_kv_seq_get(tl_kv *kv, int id); /* NULL unless open */
const tl_kv_seq *tl_kv_seq_peek(const tl_kv *kv, int id);
/* Opens a free id in 1..n_seq-1, or -1. */
int tl_kv_seq_open(tl_kv *kv, int cache);
/* Releases every block (full ones stay cached) and closes (id 0 stays open). */
void tl_kv_seq_close(tl_kv *kv, int id);
/* Drops positions >= len (and anything pending). Blocks wholly past len are
 * released (registered ones stay cached). When len falls inside a block that
 * is shared or registered, that block is replaced by a private one: *copy_from
 * and *copy_to name the blocks whose K/V the caller must copy (else both -1).
 * -1 when len is out of range or no block is free for the copy. */
int tl_kv_seq_truncate(tl_kv *kv, int id, int len, int32_t *copy_from, int32_t *copy_to);
/* Makes blocks cover positions < len; -1 when the pool is exhausted. */
int tl_kv_seq_grow(tl_kv *kv, int id, int len);
/* After positions [seq->len, len) were written (their tokens already in
 * seq->tok): advances len and offers newly full blocks to the prefix cache.
 * Whatever was pending past len is dropped. */
void tl_kv_seq_commit(tl_kv *kv, int id, int len);
/* Maps cached blocks matching tok[0..n) (at most max_reuse positions) into
 * an empty sequence; returns positions reused. */
int tl_kv_seq_reuse(tl_kv *kv, int id, const int32_t *tok, size_t n, size_t max_reuse);
void tl_kv_get_stats(const tl_kv *kv, tl_kv_stats *out);

/* Content keys (the disk cache's): from now on each registered block also
 * carries the key of the prefix through it (tl_kvdisk_key_next), and newly
 * registered blocks are listed for tl_kv_take_fresh. -1 out of memory. */
int tl_kv_key_on(tl_kv *kv);
/* Up to max blocks registered since the last call (evicted ones left out). */
int tl_kv_take_fresh(tl_kv *kv, int32_t *out, int max);
void tl_kv_block_key(const tl_kv *kv, int32_t b, const uint8_t **key, const uint8_t **parent, const int32_t **tok);
/* Appends to a sequence that ends on a registered block boundary a fresh
 * block registered as the next one of its prefix with tokens tok and content
 * key `key` (its K/V about to be written by the caller, from disk); the
 * block, or -1 (no block, the context is full, or the prefix is cached in
 * RAM after all). */
int32_t tl_kv_seq_adopt(tl_kv *kv, int id, const int32_t *tok, const uint8_t key[16]);

#endif
