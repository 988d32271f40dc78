/* kvdisk: the prefix cache's blocks on disk, so a restart keeps them. Owns a
 * directory of block files (one per block, named by its key), their index
 * (key -> file, oldest first), the byte budget, and a writer thread that
 * writes queued blocks in the background, so decoding never waits on the
 * disk. A block's key names the whole prefix through it across processes:
 * SHA-256 (first 16 bytes) of its parent's key and its TL_KV_BLOCK tokens
 * (tl_kvdisk_key_next); its file is named by the SHA-256 of the identity
 * and the key, so settings never share a file; each file also carries its parent's key, its tokens,
 * the identity of what computed it (model, numerics, KV types, layout) and a
 * checksum of its bytes, all checked before a block is used. */
#ifndef TL_KVDISK_H
#define TL_KVDISK_H

#include <stddef.h>
#include <stdint.h>

#include "tokenloop.h"

#define TL_KVKEY 16

typedef struct tl_kvdisk tl_kvdisk;

/* The key of the prefix through a block: parent's key (zeros for the first
 * block) and the block's TL_KV_BLOCK tokens. */
void tl_kvdisk_key_next(const uint8_t parent[TL_KVKEY], const int32_t *tok, uint8_t out[TL_KVKEY]);

/* Opens dir (made if missing) for blocks of block_bytes computed by
 * `identity` (16 bytes), indexes the valid files already there (files of
 * another identity or size, and unreadable ones, are logged and left alone),
 * deletes the oldest beyond budget bytes, and starts the writer. */
int tl_kvdisk_open(const char *dir, const uint8_t identity[TL_KVKEY], size_t block_bytes, uint64_t budget,
                   tl_log_fn log, void *log_arg, tl_kvdisk **out, tl_error *err);
/* Writes what is queued, stops the writer, frees. */
void tl_kvdisk_close(tl_kvdisk *d);
/* Queues block key (its parent's key, tokens and block_bytes of data, copied)
 * for the writer; a block already on disk or queued is skipped, and one that
 * would take the queue past its cap is dropped (counted), never waited for. */
void tl_kvdisk_put(tl_kvdisk *d, const uint8_t key[TL_KVKEY], const uint8_t parent[TL_KVKEY], const int32_t *tok,
                   const void *data);
/* Block key's data into out (block_bytes) when it is on disk and its file is
 * whole: header, parent key, tokens and checksum as expected. 0, or -1 (a
 * bad file is logged, deleted and forgotten). */
int tl_kvdisk_get(tl_kvdisk *d, const uint8_t key[TL_KVKEY], const uint8_t parent[TL_KVKEY], const int32_t *tok,
                  void *out);
/* Waits until the queue is written (tests, shutdown). */
void tl_kvdisk_flush(tl_kvdisk *d);
void tl_kvdisk_stats(tl_kvdisk *d, tl_disk_stats *out);

#endif
