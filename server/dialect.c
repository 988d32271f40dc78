/* server/dialect: what the Responses and Messages dialects share (see
 * dialect.h): SSE events with a type, text parts joined, the stream state's
 * release. */
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

void dialect_stream_free(void *ds) {
    if (!ds) return;
    dialect_stream *d = ds;
    d->free(d);
}
