/* server/endpoints: the small endpoints: /v1/models, /props, /tokenize and
 * /detokenize. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "api.h"
#include "chat/chat.h"
#include "tools.h"

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* ---- /v1/models, /tokenize, /detokenize --------------------------------------- */

/* What an agent may ask of the model: tools, reasoning, structured output. */
static json_t *capabilities(const api_ctx *a) {
    const char *tm = tl_model_chat_template(a->m);
    return json_pack("{s:b, s:b, s:b, s:b, s:b}", "chat", tm != NULL, "tools", tm != NULL, "reasoning",
                     a->reasoning != 0, "structured_output", 1, "vision", 0);
}

/* llama.cpp's /props: n_ctx where its clients look for it. */
char *api_props_json(const api_ctx *a, size_t *len) {
    const char *tm = tl_model_chat_template(a->m);
    json_t *o = json_pack("{s:{s:i, s:{s:i}}, s:i, s:s, s:s, s:i, s:o, s:s, s:{s:b, s:b}}", "default_generation_settings",
                          "n_ctx", a->n_ctx, "params", "n_ctx", a->n_ctx, "total_slots", a->n_parallel, "model_path",
                          a->model_path ? a->model_path : "", "model_alias", a->model_id, "n_ctx", a->n_ctx,
                          "capabilities", capabilities(a), "chat_template", tm ? tm : "", "modalities", "vision", 0,
                          "audio", 0);
    return o ? api_dump(o, len) : NULL;
}

char *api_models_json(const api_ctx *a, size_t *len) {
    json_t *root = json_object(), *data = json_array(), *m = json_object();
    if (!root || !data || !m || api_jset(m, "id", api_jstr_bytes(a->model_id, strlen(a->model_id))) ||
        api_jset(m, "object", json_string("model")) || api_jset(m, "created", json_integer(time(NULL))) ||
        api_jset(m, "owned_by", json_string("tokenloop")) ||
        api_jset(m, "max_model_len", json_integer(a->n_ctx)) || api_jset(m, "context_length", json_integer(a->n_ctx)) ||
        api_jset(m, "capabilities", capabilities(a)) || api_jset(m, "type", json_string("model")) ||
        api_jset(m, "display_name", api_jstr_bytes(a->model_id, strlen(a->model_id))) ||
        api_jset(m, "created_at", json_string("1970-01-01T00:00:00Z")) || json_array_append(data, m) ||
        api_jset(root, "object", json_string("list")) || json_object_set(root, "data", data)) {
        json_decref(root);
        json_decref(data);
        json_decref(m);
        return NULL;
    }
    json_decref(data);
    json_decref(m);
    return api_dump(root, len);
}

static int only_keys(json_t *root, const char *const *keys, api_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) if (!api_in_list(keys, k)) return BAD(k, "unknown field '%.40s'", k);
    return 0;
}

char *api_tokenize(const api_ctx *a, const char *body, size_t len, size_t *out_len, api_err *e) {
    static const char *const keys[] = {"content", "prompt", "messages", "add_special", "add_special_tokens",
                                       "add_generation_prompt", "chat_template_kwargs", "model", NULL};
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return NULL;
    int32_t *ids = NULL;
    int n = 0, add_special = -1, add_tokens = -1, add_gen = 1, rc = only_keys(root, keys, e);
    const char *text = NULL;
    json_t *msgs = api_field(root, "messages");
    if (!rc && (api_get_bool(root, "add_special", &add_special, e) < 0 ||
                api_get_bool(root, "add_special_tokens", &add_tokens, e) < 0 ||
                api_get_bool(root, "add_generation_prompt", &add_gen, e) < 0 ||
                api_get_str(root, "content", &text, e) < 0 || (!text && api_get_str(root, "prompt", &text, e) < 0)))
        rc = -1;
    if (!rc && !text && !msgs) rc = BAD("content", "give 'content', 'prompt' or 'messages'");
    if (!rc && msgs) {
        rc = api_chat_prompt(a, msgs, NULL, api_field(root, "chat_template_kwargs"), add_gen, NULL, &ids, &n, NULL, e);
    } else if (!rc) {
        /* the tokenizer's own special tokens (BOS, EOS where the vocabulary
         * adds them) or none: llama-server's add_special (default false,
         * with its "content") or vLLM's add_special_tokens (default true,
         * with its "prompt") */
        const int special = add_special >= 0 ? add_special : add_tokens >= 0 ? add_tokens : !api_field(root, "content");
        rc = api_tokenize_text(a->m, text, strlen(text), TL_TOK_PARSE_SPECIAL | (special ? TL_TOK_ADD_SPECIAL : 0),
                               &ids, &n, e);
    }
    json_decref(root);
    json_t *o = rc ? NULL : json_object(), *arr = rc ? NULL : json_array();
    int bad = rc || !o || !arr;
    for (int i = 0; !bad && i < n; i++) bad = api_jpush(arr, json_integer(ids[i]));
    tl_free(ids);
    if (bad || json_object_set(o, "tokens", arr) || api_jset(o, "count", json_integer(n)) ||
        api_jset(o, "max_model_len", json_integer(a->n_ctx))) {
        json_decref(o);
        json_decref(arr);
        if (!rc) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    json_decref(arr);
    return api_dump(o, out_len);
}

char *api_detokenize(const api_ctx *a, const char *body, size_t len, size_t *out_len, api_err *e) {
    static const char *const keys[] = {"tokens", "model", NULL};
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return NULL;
    int32_t *ids = NULL;
    int n = 0, rc = only_keys(root, keys, e);
    json_t *t = api_field(root, "tokens");
    if (!rc && !json_is_array(t)) rc = BAD("tokens", "'tokens' must be an array of token ids");
    if (!rc) rc = api_token_array(a, t, "tokens", &ids, &n, e);
    json_decref(root);
    api_buf b = {0};
    if (!rc) {
        tl_detok d;
        tl_detok_init(&d, 1);
        char tmp[1024];
        rc = api_buf_add(&b, "", 0);
        for (int i = 0; !rc && i < n; i++) {
            size_t k = tl_detok_push(&d, a->m, ids[i], tmp, sizeof tmp);
            rc = api_buf_add(&b, tmp, k < sizeof tmp ? k : sizeof tmp - 1);
        }
        size_t k = tl_detok_flush(&d, tmp, sizeof tmp);
        if (!rc) rc = api_buf_add(&b, tmp, k < sizeof tmp ? k : sizeof tmp - 1);
        if (rc) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    free(ids);
    json_t *o = rc ? NULL : json_object();
    if (rc || !o || api_jset(o, "content", api_jstr_bytes(b.p, b.n)) ||
        api_jset(o, "prompt", api_jstr_bytes(b.p, b.n))) {
        json_decref(o);
        api_buf_free(&b);
        if (!rc) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    api_buf_free(&b);
    return api_dump(o, out_len);
}
