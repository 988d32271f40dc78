/* cost: what a forward call of n tokens costs this context, measured, for
 * speculation's policy (gen/spec.c): each call size's cost is the fastest of
 * its latest calls, read through a monotone curve (tl_curve_at). Owns only
 * the figures; the context records every tl_ctx_decode into it. */
#ifndef TL_COST_H
#define TL_COST_H

/* Call sizes timed, and how many of each size's latest calls its cost is the
 * lowest of: another process on the cores only ever adds time, and one call
 * slowed threefold must not keep a size looking dear (an average took tens of
 * steps to forget it, and the policy stopped guessing meanwhile); four calls
 * slower for good are. */
#define TL_COST_N 64
#define TL_COST_WIN 4

typedef struct tl_cost {
    double cost[TL_COST_N + 1];             /* seconds per call of n tokens (the lowest of win) */
    double win[TL_COST_N + 1][TL_COST_WIN]; /* the latest calls' seconds */
    int seen[TL_COST_N + 1];                /* calls in win (up to TL_COST_WIN) */
    int next[TL_COST_N + 1];                /* the slot the next call takes */
} tl_cost;

/* One call of n tokens took s seconds (sizes above TL_COST_N are not kept). */
void tl_cost_record(tl_cost *c, int n, double s);
/* The cost of a call of n tokens; 0 while nothing at or below n was seen. */
double tl_cost_at(const tl_cost *c, int n);

#endif
