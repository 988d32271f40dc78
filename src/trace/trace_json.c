/* trace_json: a trace record as one line of JSON (docs/TRACE.md; the CLI's
 * --trace file and the server's /v1/loop stream write the same). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tokenloop.h"
#include "tokenize/unicode.h"

static const char *const PHASE[] = {"?", "prefill", "decode", "verify"};
static const char *const SOURCE[] = {"sampled", "draft", "grammar", "forced"};

/* snprintf's contract over a running buffer: what does not fit is counted. */
typedef struct jw {
    char *buf;
    size_t cap, n;
} jw;

static void put(jw *w, const char *s, size_t k) {
    if (w->n < w->cap) {
        size_t room = w->cap - w->n;
        memcpy(w->buf + w->n, s, k < room ? k : room);
    }
    w->n += k;
}

static __attribute__((format(printf, 2, 3))) void pf(jw *w, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) put(w, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* A JSON string: escapes, and U+FFFD for bytes that are not UTF-8 (a
 * token may end inside a character the next one completes), one per
 * maximal subpart as the server's replies have it. */
static void jstr(jw *w, const char *s, size_t n) {
    put(w, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(w, e, 2);
            i++;
        } else if (c < 0x20) {
            pf(w, "\\u%04x", c);
            i++;
        } else {
            const size_t k = tl_utf8_char((const unsigned char *)s + i, n - i);
            if (k) {
                put(w, s + i, k);
                i += k;
            } else {
                put(w, "\\ufffd", 6);
                i += tl_utf8_bad((const unsigned char *)s + i, n - i);
            }
        }
    }
    put(w, "\"", 1);
}

/* JSON has no infinities: a -inf logprob (a banned or -inf logit) is null. */
static void num(jw *w, double v) {
    if (isfinite(v)) pf(w, "%.6g", v);
    else put(w, "null", 4);
}

static double finite_or0(double v) { return isfinite(v) ? v : 0; }

static void piece(jw *w, const tl_model *m, int32_t id) {
    char buf[256];
    size_t n = m ? tl_token_piece(m, id, 1, buf, sizeof buf) : 0;
    jstr(w, buf, n < sizeof buf ? n : sizeof buf - 1);
}

size_t tl_trace_json(const tl_trace_step *st, const tl_model *model, char *buf, size_t cap) {
    jw w = {buf, cap, 0};
    pf(&w, "{\"v\":%d,\"step\":%llu,\"t_ms\":%.3f,\"unix_ms\":%.3f,\"wall_ms\":%.3f,\"emit_ms\":%.3f,\"rows\":%d,\"seqs\":[", st->version,
       (unsigned long long)st->step, st->t_s * 1e3, st->unix_s * 1e3, st->wall_s * 1e3, st->emit_s * 1e3, st->n_rows);
    for (int i = 0; i < st->n_seqs; i++) {
        const tl_trace_seq *s = &st->seqs[i];
        pf(&w, "%s{\"seq\":%d,\"id\":%d,\"phase\":\"%s\",\"fed\":%d,\"cached\":%d,\"drafted\":%d,\"accepted\":%d,"
               "\"forced\":%d,\"pos\":%d,\"tokens\":[",
           i ? "," : "", s->seq, s->id, PHASE[s->phase >= 1 && s->phase <= 3 ? s->phase : 0], s->n_fed, s->n_cached,
           s->n_drafted, s->n_accepted, s->n_forced, s->pos);
        for (int j = 0; j < s->n_tokens; j++) {
            const tl_trace_token *t = &s->tokens[j];
            pf(&w, "%s{\"id\":%d,\"text\":", j ? "," : "", t->token);
            jstr(&w, t->text, t->text_len);
            if (t->token >= 0) {
                pf(&w, ",\"p\":%.6g,\"logprob\":", finite_or0(t->chosen.prob));
                num(&w, t->chosen.logprob);
                pf(&w, ",\"source\":\"%s\",\"reasoning\":%s,\"top\":[",
                   SOURCE[t->source >= 0 && t->source <= 3 ? t->source : 0], t->reasoning ? "true" : "false");
                for (int k = 0; k < t->n_top; k++) {
                    pf(&w, "%s{\"id\":%d,\"text\":", k ? "," : "", t->top[k].token);
                    piece(&w, model, t->top[k].token);
                    pf(&w, ",\"p\":%.6g,\"logprob\":", finite_or0(t->top[k].prob));
                    num(&w, t->top[k].logprob);
                    put(&w, "}", 1);
                }
                put(&w, "]", 1);
            }
            put(&w, "}", 1);
        }
        put(&w, "]}", 2);
    }
    pf(&w, "],\"weight_bytes\":%llu,\"kv_bytes\":%llu,\"state_bytes\":%llu,\"gbps\":%.3f,\"kv_blocks\":{\"used\":%d,"
           "\"cached\":%d,\"total\":%d},\"totals\":{\"tokens_in\":%llu,\"tokens_cached\":%llu,\"tokens_out\":%llu,",
       (unsigned long long)st->weight_bytes, (unsigned long long)st->kv_bytes, (unsigned long long)st->state_bytes,
       st->gbps, st->kv_used, st->kv_cached,
       st->kv_blocks, (unsigned long long)st->tokens_in, (unsigned long long)st->tokens_cached,
       (unsigned long long)st->tokens_out);
    if (st->ttft_s >= 0) pf(&w, "\"ttft_ms\":%.3f,", st->ttft_s * 1e3);
    else put(&w, "\"ttft_ms\":null,", 15);
    pf(&w, "\"tok_s\":%.3f}}", st->tok_s);
    if (cap) buf[w.n < cap ? w.n : cap - 1] = 0;
    return w.n;
}
