/* markers: what the CLI, the server and the token loop agree about rendered
 * text, spelled once: the reasoning markers (<think>, or Gemma 4's thought
 * channel where the template writes it) and whether a prompt opened them,
 * and the lead (Llama 3's <|python_tag|>, then blanks) a tool call may
 * follow. */
#include <string.h>

#include "tokenloop.h"

/* The markers DeepSeek-R1, Qwen 3 and SmolLM3 templates write. */
static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
/* Gemma 4's: a thought channel, "<|channel>thought\n...<channel|>" (the
 * channel's name is part of the open marker; the blanks after it are the
 * header's end, not reasoning). */
static const char CHANNEL_OPEN[] = "<|channel>thought", CHANNEL_CLOSE[] = "<channel|>";
static const char PYTHON_TAG[] = "<|python_tag|>";

int tl_chat_think_markers(const char *tmpl, const char **open, const char **close) {
    if (tmpl && strstr(tmpl, CHANNEL_OPEN) && strstr(tmpl, CHANNEL_CLOSE)) {
        *open = CHANNEL_OPEN;
        *close = CHANNEL_CLOSE;
        return 1;
    }
    *open = THINK_OPEN;
    *close = THINK_CLOSE;
    return tmpl && strstr(tmpl, THINK_OPEN) != NULL;
}

static int ends_with(const char *s, size_t len, const char *m) {
    const size_t ml = strlen(m);
    return len >= ml && !memcmp(s + len - ml, m, ml);
}

int tl_chat_think_started(const char *rendered, size_t len) {
    while (len && (rendered[len - 1] == '\n' || rendered[len - 1] == ' ')) len--;
    return ends_with(rendered, len, THINK_OPEN) || ends_with(rendered, len, CHANNEL_OPEN);
}

size_t tl_chat_call_lead(const char *text, size_t n, int *partial) {
    const size_t tl = sizeof PYTHON_TAG - 1;
    size_t k = n >= tl && !memcmp(text, PYTHON_TAG, tl) ? tl : 0;
    if (partial) *partial = n < tl && !memcmp(text, PYTHON_TAG, n);
    while (k < n && (text[k] == ' ' || text[k] == '\n' || text[k] == '\t' || text[k] == '\r')) k++;
    return k;
}
