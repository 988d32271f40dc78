/* tokenizer: vocabulary, merges/scores, pre-tokenizer, special tokens and
 * byte handling, all from a GGUF file's tokenizer.ggml.* metadata. Owns copies
 * of what it needs, so it outlives nothing. Knows nothing of models.
 * Types: "gpt2" (byte-level BPE, pre-tokenizer by tokenizer.ggml.pre);
 * "gemma4" (BPE over raw UTF-8, spaces as U+2581, <0xXX> byte fallback);
 * "llama" (SentencePiece-style). */
#ifndef TL_TOKENIZER_H
#define TL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "load/gguf.h"
#include "tokenloop.h"

typedef struct tl_tokenizer tl_tokenizer;

int tl_tokenizer_load(const tl_gguf *g, tl_tokenizer **out, tl_error *err);
void tl_tokenizer_free(tl_tokenizer *t);

/* flags: TL_TOK_ADD_BOS, TL_TOK_PARSE_SPECIAL. *ids is malloc'ed. */
int tl_tokenizer_encode(const tl_tokenizer *t, const char *text, size_t len, int flags,
                        int32_t **ids, size_t *n_ids, tl_error *err);
int tl_tokenizer_n_vocab(const tl_tokenizer *t);
/* 0 for a file without a vocabulary (tokenizer.ggml.model = "none"): its
 * model's n_vocab then comes from the weights, and text cannot be tokenized. */
int tl_tokenizer_has_vocab(const tl_tokenizer *t);
int32_t tl_tokenizer_bos(const tl_tokenizer *t);
int32_t tl_tokenizer_eos(const tl_tokenizer *t);
int32_t tl_tokenizer_eot(const tl_tokenizer *t);
int tl_tokenizer_add_bos(const tl_tokenizer *t);
int tl_tokenizer_add_eos(const tl_tokenizer *t); /* tokenizer.ggml.add_eos_token, with an EOS */
int tl_tokenizer_add_eos_key(const tl_tokenizer *t); /* the flag alone, EOS or not */
int tl_tokenizer_add_sep(const tl_tokenizer *t); /* tokenizer.ggml.add_sep_token, with a SEP */
int32_t tl_tokenizer_sep(const tl_tokenizer *t);  /* seperator_token_id (sic, llama.cpp's key), or -1 */
int tl_tokenizer_is_eog(const tl_tokenizer *t, int32_t id);
int tl_tokenizer_is_control(const tl_tokenizer *t, int32_t id);
/* Bytes of token id (see tl_token_piece in tokenloop.h). */
size_t tl_tokenizer_piece(const tl_tokenizer *t, int32_t id, int special, char *out, size_t cap);
/* The token's text as stored in the vocabulary (for display). */
const char *tl_tokenizer_text(const tl_tokenizer *t, int32_t id);
const char *tl_tokenizer_model_name(const tl_tokenizer *t); /* "gpt2", "gemma4", "llama" */
const char *tl_tokenizer_pre_name(const tl_tokenizer *t);   /* "smollm", ... */

/* The byte-level core of tl_detok_push (src/tokenize/detok.c), testable without a
 * model: appends piece[0..len) to what d holds, writes the complete UTF-8 to
 * out (NUL-terminated, at most cap-1 bytes) and keeps back an unfinished
 * trailing character. Returns the byte count written. */
size_t tl_detok_feed_bytes(tl_detok *d, const char *piece, size_t len, char *out, size_t cap);

#endif
