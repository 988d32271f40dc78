/* server/dialect: what the Responses and Messages dialects share (see
 * dialect.h): SSE events with a type, text parts joined. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"

int dialect_event(api_buf *out, const char *type, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return -1;
    int rc = api_buf_add(out, "event: ", 7) || api_buf_add(out, type, strlen(type)) ||
             api_buf_add(out, "\ndata: ", 7) || api_buf_add(out, s, strlen(s)) || api_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

int dialect_text(json_t *c, const char *param, const char *const *types, api_buf *b, api_err *e) {
    if (json_is_string(c)) return api_buf_add(b, json_string_value(c), json_string_length(c)) ? -2 : 0;
    if (!json_is_array(c))
        return api_fail(e, 400, "invalid_request_error", param, NULL, "'%s' must be a string or an array of parts", param);
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *t = json_string_value(api_field(p, "type"));
        int k = 0;
        while (t && types[k] && strcmp(types[k], t)) k++;
        if (!t || !types[k])
            return api_fail(e, 400, "invalid_request_error", param, NULL,
                            "parts of type '%.32s' are not supported here (text only)", t ? t : "?");
        const char *key = strcmp(t, "refusal") ? "text" : "refusal";
        json_t *text = api_field(p, key);
        if (!json_is_string(text))
            return api_fail(e, 400, "invalid_request_error", param, NULL, "a '%s' part needs a string '%s'", t, key);
        if ((i && api_buf_add(b, "\n", 1)) || api_buf_add(b, json_string_value(text), json_string_length(text)))
            return -2;
    }
    return 0;
}

json_t *dialect_str(const api_buf *b) { return json_stringn(b->p ? b->p : "", b->n); }

int dialect_tools(json_t *root, dialect_tool_fn fn, void *user, json_t *chat, json_t **warnings, int *n_fn,
                  api_err *e) {
    json_t *tools = api_field(root, "tools");
    *n_fn = 0;
    if (tools && !json_is_array(tools))
        return api_fail(e, 400, "invalid_request_error", "tools", NULL, "'tools' must be an array");
    if (!tools || !json_array_size(tools)) return 0;
    json_t *ct = json_array();
    if (!ct || json_object_set_new(chat, "tools", ct)) return -2;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *params = NULL;
        char why[160] = "";
        const int take = fn(t, user, &params, why, sizeof why, e);
        if (take < 0) return -1;
        if (!take) {
            api_utf8_scrub(why);
            if ((!*warnings && !(*warnings = json_array())) || api_jpush(*warnings, json_string(why))) return -2;
            continue;
        }
        json_t *f = json_pack("{s:O}", "name", api_field(t, "name")), *desc = api_field(t, "description");
        if (!f || (desc && json_object_set(f, "description", desc)) || (params && json_object_set(f, "parameters", params)) ||
            api_jpush(ct, json_pack("{s:s, s:o}", "type", "function", "function", f))) {
            json_decref(params);
            return -2;
        }
        json_decref(params);
        ++*n_fn;
    }
    if (!*n_fn) json_object_del(chat, "tools");
    return 0;
}
