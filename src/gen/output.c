/* output: the output side of one sequence (tl_gen): the streaming
 * detokenizer, the stop-string hold-back buffer, the token count and the
 * stop rules. The token loop (step.c) pushes each sampled token through it;
 * it knows nothing of the model's calls. */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "tokenloop.h"

/* Longest token piece passed on whole; longer ones are truncated (none of the
 * supported vocabularies comes near). +16 leaves room for held UTF-8 bytes. */
#define PIECE_CAP 1024
#define PIECE_ROOM (PIECE_CAP + 16)

struct tl_gen {
    const tl_model *model;
    int n_predict, ignore_eog;
    char **stop; /* private copies: the caller's strings need not outlive tl_gen_new */
    size_t *stop_len;
    int n_stop;
    tl_detok dt;
    /* Text decoded but not yet final (it could start a stop string). Sized at
     * creation so that push never allocates: what stays held is shorter than
     * the longest stop string, and one push adds at most PIECE_ROOM bytes. */
    char *buf;
    size_t len, cap;
    size_t consumed; /* bytes of buf handed out by the last call, dropped by the next */
    int count;
    int stop_reason;
    int stop_index;     /* the stop string that ended it (TL_STOP_STRING), else -1 */
};

void tl_gen_free(tl_gen *g) {
    if (!g) return;
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->stop_len);
    free(g->buf);
    free(g);
}

static int copy_stops(tl_gen *g, const tl_gen_params *gp, size_t *max_len) {
    *max_len = 0;
    if (gp->n_stop <= 0) return 0;
    g->stop = calloc((size_t)gp->n_stop, sizeof *g->stop);
    g->stop_len = calloc((size_t)gp->n_stop, sizeof *g->stop_len);
    if (!g->stop || !g->stop_len) return -1;
    for (int i = 0; i < gp->n_stop; i++) {
        const char *s = gp->stop[i] ? gp->stop[i] : "";
        size_t n = strlen(s);
        if (!(g->stop[i] = malloc(n + 1))) return -1;
        g->n_stop = i + 1;
        memcpy(g->stop[i], s, n + 1);
        g->stop_len[i] = n;
        if (n > *max_len) *max_len = n;
    }
    return 0;
}

int tl_gen_new(const tl_model *model, const tl_gen_params *gp, tl_gen **out, tl_error *err) {
    *out = NULL;
    if (!model || !gp) return tl_fail(err, TL_ERR_ARG, "tl_gen_new: missing model or params");
    if (gp->n_stop > 0 && !gp->stop) return tl_fail(err, TL_ERR_ARG, "tl_gen_new: n_stop without stop");
    tl_gen *g = calloc(1, sizeof *g);
    if (!g) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    g->model = model;
    g->n_predict = gp->n_predict;
    g->ignore_eog = gp->ignore_eog;
    size_t max_stop = 0;
    if (copy_stops(g, gp, &max_stop) == 0) {
        g->cap = max_stop + PIECE_ROOM + 16;
        g->buf = malloc(g->cap);
    }
    if (!g->buf) {
        tl_gen_free(g);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    g->buf[0] = 0;
    tl_detok_init(&g->dt, gp->special_text);
    *out = g;
    return 0;
}

int tl_gen_count(const tl_gen *g) { return g ? g->count : 0; }

/* Drops what the previous call handed out (its text was valid until now). */
static void drop_consumed(tl_gen *g) {
    memmove(g->buf, g->buf + g->consumed, g->len - g->consumed);
    g->len -= g->consumed;
    g->consumed = 0;
}

/* Length of the longest suffix of buf that is a proper prefix of a stop string. */
static size_t held_suffix(const tl_gen *g) {
    size_t best = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t sl = g->stop_len[i];
        for (size_t k = sl ? sl - 1 : 0; k > best; k--)
            if (k <= g->len && memcmp(g->buf + g->len - k, g->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Offset of the earliest stop string in buf, or -1; *which: its index. */
static long find_stop(const tl_gen *g, int *which) {
    long best = -1;
    for (int i = 0; i < g->n_stop; i++) {
        size_t sl = g->stop_len[i];
        if (!sl || sl > g->len) continue;
        for (size_t at = 0; at + sl <= g->len; at++)
            if (memcmp(g->buf + at, g->stop[i], sl) == 0) {
                if (best < 0 || (long)at < best) best = (long)at, *which = i;
                break;
            }
    }
    return best;
}

int tl_gen_push(tl_gen *g, int32_t token, const tl_token_prob *chosen, const tl_token_prob *top,
                int n_top, tl_gen_event *ev) {
    memset(ev, 0, sizeof *ev);
    ev->token = token;
    if (chosen) ev->chosen = *chosen;
    ev->top = top;
    ev->n_top = top ? n_top : 0;
    ev->text = "";
    drop_consumed(g);
    if (g->stop_reason) return g->stop_reason; /* already stopped: nothing more comes out */
    g->count++;
    if (!g->ignore_eog && tl_token_is_eog(g->model, token)) {
        g->stop_reason = TL_STOP_EOG; /* the token is reported, its text is not */
        return g->stop_reason;
    }
    g->len += tl_detok_push(&g->dt, g->model, token, g->buf + g->len, PIECE_ROOM);
    int which = -1;
    long at = find_stop(g, &which);
    if (at >= 0) {
        g->stop_index = which;
        ev->text = g->buf;
        ev->text_len = (size_t)at;
        g->consumed = g->len; /* the stop string and whatever follows it are dropped */
        g->stop_reason = TL_STOP_STRING;
        return g->stop_reason;
    }
    ev->text = g->buf;
    ev->text_len = g->len - held_suffix(g);
    g->consumed = ev->text_len;
    if (g->n_predict >= 0 && g->count >= g->n_predict) g->stop_reason = TL_STOP_LENGTH;
    return g->stop_reason;
}

int tl_gen_stop_index(const tl_gen *g) { return g->stop_reason == TL_STOP_STRING ? g->stop_index : -1; }

size_t tl_gen_flush(tl_gen *g, const char **text) {
    drop_consumed(g);
    *text = "";
    if (g->stop_reason == TL_STOP_STRING) return 0;
    g->len += tl_detok_flush(&g->dt, g->buf + g->len, g->cap - g->len);
    *text = g->buf;
    g->consumed = g->len;
    return g->len;
}
