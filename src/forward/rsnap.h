/* rsnap: the prefix cache's recurrent-state snapshots. A model with
 * recurrent layers (Gated DeltaNet) cannot rebuild a sequence's state from
 * cached blocks: a cached prefix is only usable up to a block boundary whose
 * state was saved. This store keeps such states, each keyed by the prefix
 * cache's chain serial of the block it ends (kv.h: equal serials, equal
 * tokens before), a fixed number of them, the least recently used replaced
 * first. Memory is taken as snapshots are made. */
#ifndef TL_RSNAP_H
#define TL_RSNAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct tl_rsnap tl_rsnap;

/* cap snapshots of bytes each; NULL when out of memory. */
tl_rsnap *tl_rsnap_new(size_t bytes, int cap);
void tl_rsnap_free(tl_rsnap *s);
/* The snapshot ending the prefix of chain serial `chain`, or NULL. */
const void *tl_rsnap_get(tl_rsnap *s, uint64_t chain);
/* A buffer to write chain's snapshot into (the least recently used one's,
 * or a new one); NULL when out of memory. Call tl_rsnap_drop if it was not
 * written after all. */
void *tl_rsnap_put(tl_rsnap *s, uint64_t chain);
void tl_rsnap_drop(tl_rsnap *s, uint64_t chain);
/* Snapshots held, and their bytes. */
int tl_rsnap_count(const tl_rsnap *s, size_t *bytes);

#endif
