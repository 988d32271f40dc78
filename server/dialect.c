/* server/dialect: what the Responses and Messages dialects share (see
 * dialect.h): SSE events with a type, the stream state's release, and the
 * rule that takes per-request lines out of system prompts. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

void dialect_stream_free(void *ds) {
    if (!ds) return;
    dialect_stream *d = ds;
    d->free(d);
}

/* Prefixes of lines that change on every request and tell the model nothing.
 * Claude Code's billing line carries a per-request hash (cch=...) at the very
 * top of its system prompt: kept, it would end every turn's cached prefix
 * there. Anthropic's own API does not show it to the model either. */
static const char *const VOLATILE[] = {"x-anthropic-billing-header:", NULL};

size_t api_volatile_strip(char *s, size_t n) {
    size_t w = 0, i = 0;
    while (i < n) {
        size_t e = i;
        while (e < n && s[e] != '\n') e++;
        size_t end = e < n ? e + 1 : e; /* the line with its newline */
        int drop = 0;
        for (int k = 0; VOLATILE[k]; k++) {
            size_t kl = strlen(VOLATILE[k]);
            if (e - i >= kl && !strncasecmp(s + i, VOLATILE[k], kl)) drop = 1;
        }
        if (!drop) {
            memmove(s + w, s + i, end - i);
            w += end - i;
        }
        i = end;
    }
    /* a stripped first line leaves the blank line that followed it */
    size_t lead = 0;
    if (w < n) {
        while (lead < w && s[lead] == '\n') lead++;
        memmove(s, s + lead, w - lead);
        w -= lead;
    }
    s[w] = 0;
    return w;
}
