/* trace_out: writes the loop's trace records (--trace, --show-loop). */
#ifndef TL_CLI_TRACE_OUT_H
#define TL_CLI_TRACE_OUT_H

#include <stdio.h>

#include "tokenloop.h"

typedef struct cli_trace {
    FILE *file;          /* --trace: one JSON line per forward call; NULL: none */
    int show;            /* --show-loop: a table row per call on stderr */
    const tl_model *model;
    char *buf;           /* a record's JSON line, reused */
    size_t cap;
} cli_trace;

/* A tl_trace_fn; user is a cli_trace. */
void cli_trace_record(const tl_trace_step *st, void *user);

#endif
