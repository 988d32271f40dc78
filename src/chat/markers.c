/* markers: what the CLI, the server and the token loop agree about rendered
 * text, spelled once: the reasoning markers and whether a prompt opened
 * them, and the lead (Llama 3's <|python_tag|>, then blanks) a tool call may
 * follow. */
#include <string.h>

#include "tokenloop.h"

/* The markers DeepSeek-R1, Qwen 3 and SmolLM3 templates write. */
static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char PYTHON_TAG[] = "<|python_tag|>";

int tl_chat_think_markers(const char *tmpl, const char **open, const char **close) {
    *open = THINK_OPEN;
    *close = THINK_CLOSE;
    return tmpl && strstr(tmpl, THINK_OPEN) != NULL;
}

int tl_chat_think_started(const char *rendered, size_t len) {
    const size_t ol = sizeof THINK_OPEN - 1;
    while (len && (rendered[len - 1] == '\n' || rendered[len - 1] == ' ')) len--;
    return len >= ol && !memcmp(rendered + len - ol, THINK_OPEN, ol);
}

size_t tl_chat_call_lead(const char *text, size_t n, int *partial) {
    const size_t tl = sizeof PYTHON_TAG - 1;
    size_t k = n >= tl && !memcmp(text, PYTHON_TAG, tl) ? tl : 0;
    if (partial) *partial = n < tl && !memcmp(text, PYTHON_TAG, n);
    while (k < n && (text[k] == ' ' || text[k] == '\n' || text[k] == '\t' || text[k] == '\r')) k++;
    return k;
}
