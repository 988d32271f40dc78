/* cost: the measured cost of a forward call by its size (cost.h). */
#include "forward/cost.h"

#include "base/util.h"

void tl_cost_record(tl_cost *c, int n, double s) {
    if (n < 1 || n > TL_COST_N) return;
    double *w = c->win[n];
    w[c->next[n]] = s;
    c->next[n] = (c->next[n] + 1) % TL_COST_WIN;
    if (c->seen[n] < TL_COST_WIN) c->seen[n]++;
    double lo = w[0];
    for (int i = 1; i < c->seen[n]; i++) lo = w[i] < lo ? w[i] : lo;
    c->cost[n] = lo;
}

double tl_cost_at(const tl_cost *c, int n) {
    /* Each size's own figure, not a line through all of them: a draft
     * model's context sees one-token calls beside its catch-up calls of tens
     * of tokens, and a line through both put a one-token call at a seventh
     * of its cost (and below zero before one was seen). */
    return tl_curve_at(c->cost, c->seen, TL_COST_N, n);
}
