/* unicode: the UTF-8 and regex helpers the tokenizer needs. Owns the
 * llama.cpp-compatible decoding of arbitrary bytes, GPT-2's byte<->unicode
 * table and the pre-tokenizer: a list of PCRE2 patterns applied in turn, each
 * splitting every piece into matches and the gaps between them. */
#ifndef TL_UNICODE_H
#define TL_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenloop.h"

/* Sequence length announced by a lead byte, from its high nibble alone (as
 * llama.cpp's unicode_len_utf8: continuation bytes count as 1). */
size_t tl_utf8_len(unsigned char lead);

/* Encodes cp (any value <= 0x10FFFF, surrogates included) into out[0..4).
 * Returns the byte count, 0 for an out-of-range value. */
int tl_utf8_encode(uint32_t cp, char *out);

/* Re-encodes in[0..n) the way llama.cpp decodes text before its regex split:
 * structurally valid sequences (overlong ones and surrogates included) become
 * their code point in shortest form, anything else becomes U+FFFD, one per
 * offending byte. out must hold 3*n bytes. Returns the length written. If
 * has_surrogate is given, it is set when a surrogate survived (such text is
 * not valid UTF-8 for PCRE2; see tl_utf8_mask_surrogates). */
size_t tl_utf8_normalize(const char *in, size_t n, char *out, int *has_surrogate);

/* Copies s[0..n) to out replacing each encoded surrogate by U+E000 (same
 * length, same "other" category), so PCRE2 sees valid UTF-8 with the same
 * byte offsets. */
void tl_utf8_mask_surrogates(const char *s, size_t n, char *out);

/* Length (1..4) of the well-formed UTF-8 character at s[0..n) (no overlong
 * form, surrogate or code point past U+10FFFF), or 0 if there is none. */
size_t tl_utf8_char(const unsigned char *s, size_t n);
/* Where tl_utf8_char gives 0: how many bytes one U+FFFD replaces (Unicode's
 * maximal subpart, as Python, browsers and llama-server replace them). */
size_t tl_utf8_bad(const unsigned char *s, size_t n);

/* GPT-2's table: the code point each byte is shown as in a byte-level vocab. */
uint32_t tl_gpt2_byte_to_cp(unsigned char b);
/* Inverse: the byte for code point cp, or -1 if cp stands for no byte. */
int tl_gpt2_cp_to_byte(uint32_t cp);

/* A byte span [off, off+len) of a text. */
typedef struct tl_span {
    size_t off, len;
} tl_span;

typedef struct tl_regex_split tl_regex_split;

/* Compiles n patterns (UTF + UCP, $ only at the very end). */
int tl_regex_split_new(const char *const *patterns, int n, tl_regex_split **out, tl_error *err);
void tl_regex_split_free(tl_regex_split *rs);

/* Splits valid UTF-8 text[0..len) into consecutive spans covering it.
 * *spans is malloc'ed. Safe to call from several threads at once. */
int tl_regex_split_run(const tl_regex_split *rs, const char *text, size_t len, tl_span **spans,
                       size_t *n_spans, tl_error *err);

#endif
