/* chat: a Jinja-subset interpreter for the chat templates stored in GGUF
 * files (tokenizer.chat_template), with the semantics Hugging Face
 * transformers gives them (sandboxed, trim_blocks, lstrip_blocks, loop
 * controls, its own tojson). The public entry points are in tokenloop.h. */
#ifndef TL_CHAT_H
#define TL_CHAT_H

#include <jansson.h>

#include "tokenloop.h"

/* Renders with the variables of a jansson value (a list: the messages; an
 * object: its keys), walked directly rather than printed and parsed again. */
int tl_chat_template_render_json(const tl_chat_template *t, const json_t *vars, int add_generation_prompt,
                                 char **out, size_t *out_len, tl_error *err);

/* Renders tmpl with the variables of a JSON object (or, for a JSON list,
 * with messages = that list). bos/eos may be NULL (then undefined unless the
 * JSON gives them). Output is malloc'ed and NUL-terminated. */
int tl_chat_render_vars(const char *tmpl, const char *json, size_t json_len, const char *bos,
                        const char *eos, int add_generation_prompt, char **out, size_t *out_len,
                        tl_error *err);

#endif
