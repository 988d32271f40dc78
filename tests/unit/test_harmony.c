/* Harmony's parser (src/chat/harmony.c) on tricky replies: the recipient
 * before and after the channel, a call without <|constrain|>, a reply with no
 * final message, a preamble, a built-in tool's call, a stray channel, text
 * that looks like a control token, plain text without headers; and every
 * reply fed whole, one byte at a time and split in two at every byte gives
 * the same pieces. */
#include <string.h>

#include "tokenloop.h"
#include "tl_test.h"

typedef struct got {
    char reasoning[512], content[1024], calls[512];
    char order[32]; /* the kinds in order, repeats merged: "RC" */
    int n_pieces;
} got;

static void cat(char *dst, size_t cap, const char *s, size_t n) {
    size_t l = strlen(dst);
    if (l + n >= cap) n = cap - l - 1;
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static int collect(void *user, int kind, const char *name, const char *text, size_t n) {
    got *g = user;
    const char k = kind == TL_HARMONY_REASONING ? 'R' : kind == TL_HARMONY_CONTENT ? 'C' : 'T';
    size_t ol = strlen(g->order);
    if ((!ol || g->order[ol - 1] != k) && ol + 1 < sizeof g->order) g->order[ol] = k, g->order[ol + 1] = 0;
    g->n_pieces++;
    if (kind == TL_HARMONY_REASONING) cat(g->reasoning, sizeof g->reasoning, text, n);
    if (kind == TL_HARMONY_CONTENT) cat(g->content, sizeof g->content, text, n);
    if (kind == TL_HARMONY_CALL) {
        CHECK(name != NULL, "a call has a name");
        cat(g->calls, sizeof g->calls, name ? name : "?", name ? strlen(name) : 1);
        cat(g->calls, sizeof g->calls, "(", 1);
        cat(g->calls, sizeof g->calls, text, n);
        cat(g->calls, sizeof g->calls, ")", 1);
    }
    return 0;
}

/* Feeds s in pieces: step bytes at a time (0: whole), or split at `at` (step < 0). */
static void run(const char *s, int step, size_t at, got *g) {
    memset(g, 0, sizeof *g);
    tl_harmony *h = NULL;
    tl_error err = {0};
    CHECK(tl_harmony_new(&h, &err) == TL_OK, "new");
    if (!h) return;
    const size_t n = strlen(s);
    int rc = 0;
    if (step == 0) {
        rc = tl_harmony_feed(h, s, n, 1, collect, g);
    } else if (step < 0) {
        rc = tl_harmony_feed(h, s, at, 0, collect, g);
        rc |= tl_harmony_feed(h, s + at, n - at, 1, collect, g);
    } else {
        for (size_t i = 0; i < n && !rc; i += (size_t)step)
            rc = tl_harmony_feed(h, s + i, n - i < (size_t)step ? n - i : (size_t)step, 0, collect, g);
        rc |= tl_harmony_feed(h, "", 0, 1, collect, g);
    }
    CHECK(rc == 0, "feed: %d", rc);
    tl_harmony_free(h);
}

static void expect(const char *label, const char *s, const char *reasoning, const char *content, const char *calls,
                   const char *order) {
    got w, b;
    run(s, 0, 0, &w);
    CHECK(!strcmp(w.reasoning, reasoning), "%s: reasoning %s", label, w.reasoning);
    CHECK(!strcmp(w.content, content), "%s: content %s", label, w.content);
    CHECK(!strcmp(w.calls, calls), "%s: calls %s", label, w.calls);
    CHECK(!strcmp(w.order, order), "%s: order %s", label, w.order);
    run(s, 1, 0, &b);
    CHECK(!strcmp(b.reasoning, w.reasoning) && !strcmp(b.content, w.content) && !strcmp(b.calls, w.calls) &&
              !strcmp(b.order, w.order),
          "%s: byte by byte: R=%s C=%s T=%s order=%s", label, b.reasoning, b.content, b.calls, b.order);
    int same = 1;
    for (size_t at = 0; at <= strlen(s); at++) {
        run(s, -1, at, &b);
        same &= !strcmp(b.reasoning, w.reasoning) && !strcmp(b.content, w.content) && !strcmp(b.calls, w.calls) &&
                !strcmp(b.order, w.order);
    }
    CHECK(same, "%s: split in two somewhere differs", label);
}

int main(void) {
    expect("analysis, final",
           "<|channel|>analysis<|message|>Think <a|b>.<|end|><|start|>assistant<|channel|>final<|message|>The "
           "answer.<|return|>",
           "Think <a|b>.", "The answer.", "", "RC");
    expect("final cut by its end-of-generation token",
           "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>Done", "x", "Done", "",
           "RC");
    expect("to= after the channel, <|constrain|>",
           "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
           "Need weather.", "", "get_weather({\"city\":\"Paris\"})", "RT");
    expect("to= before the channel, no <|constrain|>, <|call|> not shown",
           "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.add<|channel|>commentary "
           "json<|message|>{\"a\": 1, \"b\": 2}",
           "x", "", "add({\"a\": 1, \"b\": 2})", "RT");
    expect("a call first, no analysis",
           " to=functions.now<|channel|>commentary<|message|>{}<|call|>", "", "", "now({})", "T");
    expect("no final message", "<|channel|>analysis<|message|>only thinking", "only thinking", "", "", "R");
    expect("no final message, ended", "<|channel|>analysis<|message|>only thinking<|end|>", "only thinking", "", "",
           "R");
    expect("a preamble, then a call",
           "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant to=functions.now"
           "<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
           "", "Let me check.", "now({})", "CT");
    expect("a built-in tool's call is dropped",
           "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=browser.search "
           "json<|message|>{\"q\":1}<|call|>",
           "a", "", "", "R");
    expect("a stray channel before the real one",
           "<|channel|>commentary to=assistant<|channel|>analysis<|message|>hmm<|end|><|start|>assistant"
           "<|channel|>final<|message|>ok",
           "hmm", "ok", "", "RC");
    expect("text like a control token", "<|channel|>final<|message|>a <| b <|en d <|endx<|end|>", "",
           "a <| b <|en d <|endx", "", "C");
    expect("a message that never closed", "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final"
           "<|message|>b", "a", "b", "", "RC");
    expect("plain text", "Hello, <b>world</b>!", "", "Hello, <b>world</b>!", "", "C");
    expect("empty", "", "", "", "", "");
    expect("an unfinished header", "<|channel|>analysis<|mess", "", "", "", "");

    /* plain text streams once it is longer than any header */
    char plain[400];
    memset(plain, 'a', sizeof plain - 1);
    plain[sizeof plain - 1] = 0;
    tl_harmony *h = NULL;
    tl_error err = {0};
    got g;
    memset(&g, 0, sizeof g);
    CHECK(tl_harmony_new(&h, &err) == TL_OK, "new");
    CHECK(tl_harmony_feed(h, plain, sizeof plain - 1, 0, collect, &g) == 0, "feed");
    CHECK(strlen(g.content) == sizeof plain - 1, "plain text out before the end: %zu", strlen(g.content));
    /* reasoning streams before its message ends, all but what may be a marker */
    tl_harmony_free(h);
    memset(&g, 0, sizeof g);
    CHECK(tl_harmony_new(&h, &err) == TL_OK, "new");
    const char *part = "<|channel|>analysis<|message|>abc<|en";
    CHECK(tl_harmony_feed(h, part, strlen(part), 0, collect, &g) == 0, "feed");
    CHECK(!strcmp(g.reasoning, "abc"), "streamed reasoning: %s", g.reasoning);
    tl_harmony_free(h);

    CHECK(tl_chat_harmony("{{ '<|start|>assistant<|channel|>final<|message|>' }}"), "detects harmony");
    CHECK(!tl_chat_harmony("<|im_start|>assistant"), "not harmony");
    CHECK(!tl_chat_harmony(NULL), "no template");
    return tl_test_summary();
}
