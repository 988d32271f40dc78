/* packed: one packed copy of a model's matmul weights per layout, shared by
 * all its contexts (packed.h). */
#include "load/packed.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

struct pk_twin {
    const void *src; /* the weight's data in the mapping: the lookup key */
    tl_gguf_tensor t;
};

struct tl_packed {
    struct pk_twin *twin; /* sorted by src */
    int n;
    uint8_t *data;
};

static int twin_cmp(const void *a, const void *b) {
    const uint8_t *x = ((const struct pk_twin *)a)->src, *y = ((const struct pk_twin *)b)->src;
    return x < y ? -1 : x > y;
}

static int key_cmp(const void *key, const void *el) {
    const uint8_t *a = key, *b = ((const struct pk_twin *)el)->src;
    return a < b ? -1 : a > b;
}

tl_w tl_packed_find(const tl_packed *p, tl_w w) {
    if (!p || !p->n) return NULL;
    const struct pk_twin *t = bsearch(w->data, p->twin, (size_t)p->n, sizeof *p->twin, key_cmp);
    return t && t->t.type == w->type && t->t.ne[0] == w->ne[0] && t->t.ne[1] == w->ne[1] && t->t.ne[2] == w->ne[2]
               ? &t->t
               : NULL;
}

static void packed_free(tl_packed *p) {
    if (!p) return;
    free(p->twin);
    tl_big_free(p->data);
    free(p);
}

/* Every matmul weight whose type k's gemm reads packed, in one allocation. */
static int make(const tl_model *m, const tl_kernels *k, tl_packed **out) {
    tl_packed *p = calloc(1, sizeof *p);
    tl_w *all = malloc(((size_t)m->hp.n_layer * TL_LAYER_MAX_BLOCKS * TL_BLOCK_MAX_W + 4) * sizeof *all);
    if (!p || !all) {
        free(p);
        free(all);
        return -1;
    }
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++)
        for (int b = 0; b < m->layers[il].n_block; b++) n += tl_block_weights(&m->layers[il].block[b], 1, all + n);
    if (m->output) all[n++] = m->output; /* encoders have none */
    if (m->pl_model_proj) all[n++] = m->pl_model_proj;
    if (m->cls) all[n++] = m->cls; /* the rank head takes the matmul path too */
    if (m->cls_out) all[n++] = m->cls_out;
    size_t bytes = 0;
    int np = 0;
    for (int i = 0; i < n; i++)
        if (tl_kern_packs_matrix(k, (tl_type)all[i]->type, all[i]->ne[1])) {
            bytes += (size_t)tl_kern_packed_rows(k, (tl_type)all[i]->type, tl_w_rows(all[i])) *
                     tl_kern_row_bytes(k, (tl_type)all[i]->type, all[i]->ne[0]);
            np++;
        }
    int st = 0;
    if (np) {
        p->twin = calloc((size_t)np, sizeof *p->twin);
        p->data = tl_big_alloc(bytes);
        st = p->twin && p->data ? 0 : -1;
    }
    size_t off = 0;
    for (int i = 0; np && !st && i < n; i++) {
        tl_w w = all[i];
        if (!tl_kern_packs_matrix(k, (tl_type)w->type, w->ne[1])) continue;
        const size_t sz = (size_t)tl_kern_packed_rows(k, (tl_type)w->type, tl_w_rows(w)) *
                          tl_kern_row_bytes(k, (tl_type)w->type, w->ne[0]);
        struct pk_twin *tw = &p->twin[p->n++];
        tw->src = w->data;
        tw->t = *w;
        tw->t.data = p->data + off;
        st = tl_kern_pack(k, (tl_type)w->type, w->data, p->data + off, tl_w_rows(w), w->ne[0]);
        /* the gemm reads the copy from now on: the file's pages need not stay
         * resident beside it (the embedding rows of a tied output fault back
         * in one by one) */
        if (m->gguf->mapped) tl_release_pages(w->data, (size_t)w->nbytes);
        off += sz;
    }
    if (p->n) qsort(p->twin, (size_t)p->n, sizeof *p->twin, twin_cmp);
    free(all);
    if (st) {
        packed_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

_Static_assert(TL_PACK_LEVELS == TL_CPU_AMX + 1, "a pack slot per CPU level");

/* Layouts by (numerics mode, CPU level): what k packs depends on both. */
static int slot_of(const tl_kernels *k) { return (int)k->mode * TL_PACK_LEVELS + (int)k->level; }

int tl_model_packed(const tl_model *cm, const tl_kernels *k, const tl_packed **out, tl_error *err) {
    /* The cache is the model's one mutable part; the mutex makes its lazy
     * filling safe for contexts created on several threads. */
    tl_model *m = (tl_model *)cm;
    const int slot = slot_of(k);
    if (slot < 0 || slot >= TL_PACK_SLOTS) return tl_fail(err, TL_ERR_ARG, "no packed layout for this kernel table");
    pthread_mutex_lock(&m->pack_mu);
    int st = TL_OK;
    if (!m->packs[slot] && make(m, k, &m->packs[slot]))
        st = tl_fail(err, TL_ERR_NOMEM, "out of memory for the packed weights");
    *out = m->packs[slot];
    pthread_mutex_unlock(&m->pack_mu);
    return st;
}

void tl_model_packed_free(tl_model *m) {
    for (int i = 0; i < TL_PACK_SLOTS; i++) {
        packed_free(m->packs[i]);
        m->packs[i] = NULL;
    }
}
