/* forward/pool: folding an embedding's token rows into one vector, in the
 * order llama.cpp's CPU path computes it, streamed over however many calls
 * the text is cut into. */
#ifndef TL_FORWARD_POOL_H
#define TL_FORWARD_POOL_H

#include <stddef.h>

/* Mean pooling over n rows of d floats. */
typedef struct tl_mean_pool {
    int d;
    size_t n, seen;
    float inv;   /* 1/n as llama.cpp's mean column holds it */
    float *acc;  /* d x 32 lanes */
    float *tail; /* d running sums past the last step of 32 */
} tl_mean_pool;

/* 0, or -1 when out of memory. */
int tl_mean_pool_init(tl_mean_pool *p, int d, size_t n);
/* Adds the next nr rows (in token order). */
void tl_mean_pool_add(tl_mean_pool *p, const float *rows, int nr);
/* Writes the mean of all n rows to out[d]; call once every row was added. */
void tl_mean_pool_finish(tl_mean_pool *p, float *out);
void tl_mean_pool_free(tl_mean_pool *p);

#endif
