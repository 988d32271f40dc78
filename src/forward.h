/* forward: one context (tl_ctx): the KV cache, the activation buffers, the
 * kernel table and thread pool, and the forward pass over a batch of tokens of
 * one sequence. The per-row arithmetic never depends on the batch size or the
 * thread count (rows are split across threads, never a row's reduction), so a
 * prompt gives the same logits however it is chunked or threaded. */
#ifndef TL_FORWARD_H
#define TL_FORWARD_H

#include "cpu/kernels.h"
#include "model.h"
#include "threadpool.h"

/* Runs tokens[0..n) at positions n_past.. ; logits of rows [first_logit, n)
 * land in out (n - first_logit rows of n_vocab floats). n <= n_batch. */
int tl_forward(tl_ctx *ctx, const int32_t *tokens, int n, int first_logit, float *out,
               tl_error *err);

/* The model a context runs. */
const tl_model *tl_ctx_model(const tl_ctx *ctx);

#endif
