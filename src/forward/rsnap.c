/* rsnap: the recurrent-state snapshots of the prefix cache (rsnap.h). A
 * handful of entries, found by a linear scan: a lookup costs nothing beside
 * the state copy it saves or replaces. */
#include "forward/rsnap.h"

#include <stdlib.h>

typedef struct snap {
    uint64_t chain; /* 0: empty */
    uint64_t used;  /* the clock at its last get or put */
    void *data;
} snap;

struct tl_rsnap {
    size_t bytes;
    int cap;
    uint64_t clock;
    snap *s;
};

tl_rsnap *tl_rsnap_new(size_t bytes, int cap) {
    tl_rsnap *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->bytes = bytes;
    r->cap = cap > 0 ? cap : 1;
    r->s = calloc((size_t)r->cap, sizeof *r->s);
    if (!r->s) {
        free(r);
        return NULL;
    }
    return r;
}

void tl_rsnap_free(tl_rsnap *r) {
    if (!r) return;
    for (int i = 0; i < r->cap; i++) free(r->s[i].data);
    free(r->s);
    free(r);
}

static snap *find(tl_rsnap *r, uint64_t chain) {
    for (int i = 0; chain && i < r->cap; i++)
        if (r->s[i].chain == chain) return &r->s[i];
    return NULL;
}

const void *tl_rsnap_get(tl_rsnap *r, uint64_t chain) {
    snap *x = r ? find(r, chain) : NULL;
    if (!x) return NULL;
    x->used = ++r->clock;
    return x->data;
}

void *tl_rsnap_put(tl_rsnap *r, uint64_t chain) {
    if (!r || !chain) return NULL;
    snap *x = find(r, chain);
    if (!x) {
        x = &r->s[0];
        for (int i = 1; i < r->cap && x->chain; i++)
            if (!r->s[i].chain || r->s[i].used < x->used) x = &r->s[i];
    }
    if (!x->data && !(x->data = malloc(r->bytes))) return NULL;
    x->chain = chain;
    x->used = ++r->clock;
    return x->data;
}

void tl_rsnap_drop(tl_rsnap *r, uint64_t chain) {
    snap *x = r ? find(r, chain) : NULL;
    if (x) x->chain = 0;
}

int tl_rsnap_count(const tl_rsnap *r, size_t *bytes) {
    int n = 0;
    size_t b = 0;
    for (int i = 0; r && i < r->cap; i++) {
        n += r->s[i].chain != 0;
        b += r->s[i].data ? r->bytes : 0;
    }
    if (bytes) *bytes = b;
    return n;
}
