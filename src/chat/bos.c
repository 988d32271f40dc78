/* bos.c: whether a rendered chat prompt still needs the model's BOS token
 * when it is tokenized. It is a policy about the model, not the interpreter,
 * and lives apart so the CLI and the server share one answer: many templates
 * write {{ bos_token }} themselves, and adding BOS again would give the model
 * two, which it never saw in training. BOS is added only when the model asks
 * for it and the rendered text does not already start with it because the
 * template wrote it. */
#include <string.h>

#include "tokenloop.h"

int tl_chat_add_bos(const tl_model *m, const char *rendered) {
    if (!tl_model_add_bos(m) || tl_token_bos(m) < 0) return 0;
    char bos[256];
    const size_t n = tl_token_piece(m, tl_token_bos(m), 1, bos, sizeof bos);
    const char *tmpl = tl_model_chat_template(m);
    return !(n > 0 && n < sizeof bos && rendered && !strncmp(rendered, bos, n) && tmpl && strstr(tmpl, "bos_token"));
}
