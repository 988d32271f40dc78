/* trace_out: the CLI's ends of the loop's trace (docs/TRACE.md): one JSON
 * line per forward call for `--trace FILE`, and a compact live table on
 * stderr for `--show-loop`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_out.h"

static const char *const PHASE[] = {"?", "prefill", "decode", "verify"};

static void write_json(cli_trace *ct, const tl_trace_step *st) {
    size_t n = tl_trace_json(st, ct->model, ct->buf, ct->cap);
    if (n >= ct->cap) { /* grown once to the longest record (a verify step's tokens) */
        char *b = realloc(ct->buf, n + 1);
        if (!b) return;
        ct->buf = b;
        ct->cap = n + 1;
        tl_trace_json(st, ct->model, ct->buf, ct->cap);
    }
    fwrite(ct->buf, 1, n, ct->file);
    fputc('\n', ct->file);
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
