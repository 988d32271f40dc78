/* gguf_write: a small GGUF v3 writer. Owns a metadata table (copied from a
 * source file and/or set key by key), a tensor table with offsets laid out at
 * the file's alignment, and the output stream: the header goes out first and
 * tensor data is then streamed in table order, padded as each tensor completes. */
#ifndef TL_GGUF_WRITE_H
#define TL_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "load/gguf.h"
#include "tokenloop.h"

typedef struct tl_gguf_writer tl_gguf_writer;

/* alignment: a power of two (0 = 32, GGUF's default). */
int tl_gguf_writer_new(uint64_t alignment, tl_gguf_writer **out, tl_error *err);
/* Frees everything; closes (and leaves as is) a file still open. */
void tl_gguf_writer_free(tl_gguf_writer *w);

/* ---- metadata (before tl_gguf_writer_open) ---- */

/* Appends every key/value of src, in its order, byte for byte. */
int tl_gguf_writer_copy_kvs(tl_gguf_writer *w, const tl_gguf *src, tl_error *err);
/* Set a key: appended at the end, replacing (removing) an existing one,
 * which is where ggml's gguf_set_* puts it: llama-quantize's key order. */
int tl_gguf_writer_set_u32(tl_gguf_writer *w, const char *key, uint32_t v, tl_error *err);
int tl_gguf_writer_set_f32(tl_gguf_writer *w, const char *key, float v, tl_error *err);
int tl_gguf_writer_set_str(tl_gguf_writer *w, const char *key, const char *v, tl_error *err);
/* Removes a key if present. */
void tl_gguf_writer_remove(tl_gguf_writer *w, const char *key);

/* ---- tensors (before tl_gguf_writer_open) ---- */

/* Appends a tensor info; its data offset follows the previous tensor's,
 * aligned. ne[0] must be a multiple of the type's block size. */
int tl_gguf_writer_add_tensor(tl_gguf_writer *w, const char *name, uint32_t n_dims,
                              const int64_t ne[4], uint32_t type, tl_error *err);
/* Bytes of tensor i's data (as laid out), or 0 if i is out of range. */
uint64_t tl_gguf_writer_tensor_nbytes(const tl_gguf_writer *w, uint64_t i);
/* Total file size once everything is written. */
uint64_t tl_gguf_writer_file_size(const tl_gguf_writer *w);

/* ---- output ---- */

/* Creates path and writes the header, metadata and tensor infos. */
int tl_gguf_writer_open(tl_gguf_writer *w, const char *path, tl_error *err);
/* Streams tensor data: bytes go to the tensors in table order; each tensor's
 * padding is written as soon as its last byte is. Chunks may span tensors. */
int tl_gguf_writer_write(tl_gguf_writer *w, const void *data, size_t n, tl_error *err);
/* Checks that all tensor data came, flushes and closes the file. */
int tl_gguf_writer_close(tl_gguf_writer *w, tl_error *err);

#endif
