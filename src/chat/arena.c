/* arena.c: where a compile's or a render's memory comes from and how it fails.
 * One arena per R, freed as a whole, because a render makes thousands of small
 * values whose lifetimes all end together; one longjmp out on any error,
 * because the interpreter is deeply recursive and checking a status at every
 * level would double its size. The arena is capped so that a hostile template
 * or conversation fails with a message instead of eating the machine. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"
#include "base/util.h"

#define ARENA_LIMIT ((size_t)256 << 20) /* a template cannot eat the machine */

/* Line and column of a byte offset, counted only when an error needs them. */
static void pos_linecol(const R *r, int pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (int i = 0; r->src && i < pos && r->src[i]; i++) {
        if (r->src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

_Noreturn void jj_die(R *r, int status, int pos, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos >= 0) {
        int line, col;
        pos_linecol(r, pos, &line, &col);
        tl_fail(r->err, status, "chat template, line %d column %d: %s", line, col, msg);
    } else {
        tl_fail(r->err, status, "chat template: %s", msg);
    }
    r->status = status;
    longjmp(r->jb, 1);
}

void *jj_alloc(R *r, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ablock *b = r->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (r->total + cap > ARENA_LIMIT) jj_die(r, TL_ERR_NOMEM, -1, "render needs too much memory");
        b = malloc(sizeof *b + cap);
        if (!b) jj_die(r, TL_ERR_NOMEM, -1, "out of memory");
        b->next = r->blocks;
        b->used = 0;
        b->cap = cap;
        r->blocks = b;
        r->total += cap;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void jj_arena_free(R *r) {
    while (r->blocks) {
        ablock *n = r->blocks->next;
        free(r->blocks);
        r->blocks = n;
    }
}

char *jj_strdup(R *r, const char *s, size_t n) {
    char *d = jj_alloc(r, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}
