/* forward: the stage that turns a batch of tokens into logits. A context
 * (tl_ctx, include/tokenloop.h) is a backend (backend.h: the CPU's is
 * cpu.c) beside the sequences' state (ctx.h: the KV cache's bookkeeping in
 * kv.h, the batch's positions and block tables, the logits kept, the call
 * costs in cost.h); seq.c is the sequence API. A row's result never depends
 * on the batch, its neighbours, the chunking or the thread count. This
 * header is what the other stages may see of it. */
#ifndef TL_FORWARD_H
#define TL_FORWARD_H

#include "load/model.h"

/* The model a context runs. */
const tl_model *tl_ctx_model(const tl_ctx *ctx);

#endif
