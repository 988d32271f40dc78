/* forward: one context (tl_ctx): the paged KV cache, the activation
 * buffers, the kernel table and thread pool, and the forward pass over a batch
 * of tokens of any sequences. The per-row arithmetic never depends on the batch size or the
 * thread count (rows are split across threads, never a row's reduction), so a
 * prompt gives the same logits however it is chunked or threaded. */
#ifndef TL_FORWARD_H
#define TL_FORWARD_H

#include "cpu/kernels.h"
#include "model.h"
#include "threadpool.h"

/* The model a context runs. */
const tl_model *tl_ctx_model(const tl_ctx *ctx);

/* Adds one call of n tokens that took s seconds to the cost model that
 * tl_ctx_decode_cost reads. tl_ctx_decode records each of its calls here;
 * tests record fixed costs instead, so that speculation's policy is checked
 * on known figures whatever else the machine is running. */
void tl_ctx_cost_record(tl_ctx *ctx, int n, double s);

#endif
