/* trace_out: the CLI's ends of the loop's trace (docs/TRACE.md): one JSON
 * line per forward call for `--trace FILE`, and a compact live table on
 * stderr for `--show-loop`. */
#include <stdio.h>
#include <string.h>

#include "trace_out.h"

static const char *const PHASE[] = {"?", "prefill", "decode", "verify"};
static const char *const SOURCE[] = {"sampled", "draft", "grammar", "forced"};

/* A JSON string: escapes, and U+FFFD for bytes that are not UTF-8 (a
 * token may end inside a character the next one completes). */
static void jstr(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            i++;
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            fputc(c, f);
            i++;
        } else {
            size_t k = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
            int ok = k && i + k <= n;
            for (size_t j = 1; ok && j < k; j++) ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
            if (ok) {
                fwrite(s + i, 1, k, f);
                i += k;
            } else {
                fputs("\\ufffd", f);
                i++;
            }
        }
    }
    fputc('"', f);
}

static void piece(FILE *f, const tl_model *m, int32_t id) {
    char buf[256];
    size_t n = tl_token_piece(m, id, 1, buf, sizeof buf);
    jstr(f, buf, n < sizeof buf ? n : sizeof buf - 1);
}

static void write_json(cli_trace *ct, const tl_trace_step *st) {
    FILE *f = ct->file;
    fprintf(f, "{\"v\":%d,\"step\":%llu,\"t_ms\":%.3f,\"wall_ms\":%.3f,\"emit_ms\":%.3f,\"rows\":%d,\"seqs\":[",
            st->version, (unsigned long long)st->step, st->t_s * 1e3, st->wall_s * 1e3, st->emit_s * 1e3, st->n_rows);
    for (int i = 0; i < st->n_seqs; i++) {
        const tl_trace_seq *s = &st->seqs[i];
        fprintf(f, "%s{\"seq\":%d,\"id\":%d,\"phase\":\"%s\",\"fed\":%d,\"cached\":%d,\"drafted\":%d,\"accepted\":%d,"
                   "\"pos\":%d,\"tokens\":[",
                i ? "," : "", s->seq, s->id, PHASE[s->phase >= 1 && s->phase <= 3 ? s->phase : 0], s->n_fed,
                s->n_cached, s->n_drafted, s->n_accepted, s->pos);
        for (int j = 0; j < s->n_tokens; j++) {
            const tl_trace_token *t = &s->tokens[j];
            fprintf(f, "%s{\"id\":%d,\"text\":", j ? "," : "", t->token);
            jstr(f, t->text, t->text_len);
            if (t->token >= 0) {
                fprintf(f, ",\"p\":%.6g,\"logprob\":%.6g,\"source\":\"%s\",\"reasoning\":%s,\"top\":[", t->chosen.prob,
                        t->chosen.logprob, SOURCE[t->source >= 0 && t->source <= 3 ? t->source : 0],
                        t->reasoning ? "true" : "false");
                for (int k = 0; k < t->n_top; k++) {
                    fprintf(f, "%s{\"id\":%d,\"text\":", k ? "," : "", t->top[k].token);
                    piece(f, ct->model, t->top[k].token);
                    fprintf(f, ",\"p\":%.6g,\"logprob\":%.6g}", t->top[k].prob, t->top[k].logprob);
                }
                fputc(']', f);
            }
            fputc('}', f);
        }
        fputs("]}", f);
    }
    fprintf(f, "],\"weight_bytes\":%llu,\"kv_bytes\":%llu,\"gbps\":%.3f,\"kv_blocks\":{\"used\":%d,\"cached\":%d,"
               "\"total\":%d},\"totals\":{\"tokens_in\":%llu,\"tokens_cached\":%llu,\"tokens_out\":%llu,",
            (unsigned long long)st->weight_bytes, (unsigned long long)st->kv_bytes, st->gbps, st->kv_used,
            st->kv_cached, st->kv_blocks, (unsigned long long)st->tokens_in, (unsigned long long)st->tokens_cached,
            (unsigned long long)st->tokens_out);
    if (st->ttft_s >= 0) fprintf(f, "\"ttft_ms\":%.3f,", st->ttft_s * 1e3);
    else fputs("\"ttft_ms\":null,", f);
    fprintf(f, "\"tok_s\":%.3f}}\n", st->tok_s);
}

/* One line per call: what it was, its cost, what came out. */
static void write_row(cli_trace *ct, const tl_trace_step *st) {
    FILE *f = stderr;
    if (st->step == 0)
        fprintf(f, "\x1b[2m%5s %-8s %5s %8s %7s %9s  %s\x1b[0m\n", "step", "phase", "rows", "ms", "GB/s", "kv", "tokens");
    for (int i = 0; i < st->n_seqs; i++) {
        const tl_trace_seq *s = &st->seqs[i];
        char ph[24];
        if (s->phase == TL_PHASE_VERIFY) snprintf(ph, sizeof ph, "verify %d/%d", s->n_accepted, s->n_drafted);
        else snprintf(ph, sizeof ph, "%s", PHASE[s->phase >= 1 && s->phase <= 3 ? s->phase : 0]);
        fprintf(f, "\x1b[2m%5llu %-8s %5d %8.2f %7.2f %4d/%-4d ", (unsigned long long)st->step, ph, st->n_rows,
                st->wall_s * 1e3, st->gbps, st->kv_used, st->kv_blocks);
        for (int j = 0; j < s->n_tokens && j < 6; j++) {
            const tl_trace_token *t = &s->tokens[j];
            if (t->token < 0) continue;
            char txt[24];
            size_t n = t->text_len < sizeof txt - 1 ? t->text_len : sizeof txt - 1;
            for (size_t k = 0; k < n; k++) txt[k] = (unsigned char)t->text[k] < 0x20 ? ' ' : t->text[k];
            txt[n] = 0;
            fprintf(f, " '%s' %.2f%s", txt, t->chosen.prob, t->source == TL_SOURCE_DRAFT ? "d"
                                                            : t->source == TL_SOURCE_GRAMMAR ? "g"
                                                            : t->source == TL_SOURCE_FORCED ? "f" : "");
        }
        if (s->n_cached) fprintf(f, " (%d cached)", s->n_cached);
        fprintf(f, "\x1b[0m\n");
    }
    fflush(f);
}

void cli_trace_record(const tl_trace_step *st, void *user) {
    cli_trace *ct = user;
    if (ct->file) write_json(ct, st);
    if (ct->show) write_row(ct, st);
}
