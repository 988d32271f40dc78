/* packed: the copies of a model's matmul weights in the layout its gemm
 * kernels read (cpu/kernels.h: r8 in the fast numerics, pack32 in the exact),
 * made once per model and layout on first use and shared by every context of
 * the model: a second context, a draft model's or the server's probe costs no
 * second copy. The one mutable part of a loaded model, behind its mutex. */
#ifndef TL_PACKED_H
#define TL_PACKED_H

#include "cpu/kernels.h"
#include "load/model.h"

typedef struct tl_packed tl_packed;

/* The packed copies k's gemm kernels take for m's weights (made now if this
 * model has none for k's layout yet). Valid until the model is freed. */
int tl_model_packed(const tl_model *m, const tl_kernels *k, const tl_packed **out, tl_error *err);
/* w's packed twin (same shape and type, data in the packed layout), or NULL
 * if w is not packed (its gemm, if any, reads it as stored). */
tl_w tl_packed_find(const tl_packed *p, tl_w w);
/* Frees every layout's copies (tl_model_free). */
void tl_model_packed_free(tl_model *m);

#endif
