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

/* Adds one call of n tokens that took s seconds to the cost model that
 * tl_ctx_decode_cost reads. tl_ctx_decode records each of its calls here;
 * tests record fixed costs instead, so that speculation's policy is checked
 * on known figures whatever else the machine is running. */
void tl_ctx_cost_record(tl_ctx *ctx, int n, double s);

#endif
