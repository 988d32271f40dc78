/* spec: the prompt-lookup drafter and the policy (see spec.h). */
#include "gen/spec.h"

#include <math.h>
#include <string.h>

#include "base/util.h"

#define NGRAM_MAX 4
/* Chance a guess is kept, before any was checked. */
#define ACC_PRIOR 0.5
/* Weight of one checked guess in the acceptance estimate. */
#define ACC_ALPHA 0.1
/* A draft must promise this much more than a plain step: the cost estimates
 * are noisy, and losing is worse than missing a small gain (at 1.03 the
 * server at 16 streams lost 4% to marginal guesses). */
#define GAIN_MIN 1.06
/* While the policy declines guesses that exist, it still checks one every
 * PROBE_EVERY steps (alone), so a sequence that starts copying is noticed. */
#define PROBE_EVERY 16

static inline int32_t hist_at(const tl_hist *h, int i) { return i < h->n_tok ? h->tok[i] : h->last; }

int tl_spec_ngram(const tl_hist *h, int max, int32_t *out, int *match) {
    const int n = h->n_tok + 1;
    *match = 0;
    if (max <= 0 || n < 2) return 0;
    for (int g = n - 1 < NGRAM_MAX ? n - 1 : NGRAM_MAX; g >= 1; g--) {
        /* the latest start i < n - g whose g tokens equal the last g */
        for (int i = n - g - 1; i >= 0; i--) {
            int k = 0;
            while (k < g && hist_at(h, i + k) == hist_at(h, n - g + k)) k++;
            if (k < g) continue;
            int c = 0;
            for (int j = i + g; j < n && c < max; j++) out[c++] = hist_at(h, j);
            *match = g;
            return c;
        }
    }
    return 0;
}

int tl_spec_check_draft(const tl_model *m, const tl_model *d, tl_error *err) {
    const int nm = tl_model_n_vocab(m), nd = tl_model_n_vocab(d);
    if (nm != nd)
        return tl_fail(err, TL_ERR_ARG, "the draft model's vocabulary differs: %d tokens, the model has %d", nd, nm);
    char a[256], b[256];
    for (int i = 0; i < nm; i++) {
        size_t la = tl_token_piece(m, i, 1, a, sizeof a), lb = tl_token_piece(d, i, 1, b, sizeof b);
        if (la != lb || memcmp(a, b, la < sizeof a ? la : sizeof a))
            return tl_fail(err, TL_ERR_ARG, "the draft model's vocabulary differs at token %d ('%.*s' vs '%.*s')", i,
                           (int)(lb < 40 ? lb : 40), b, (int)(la < 40 ? la : 40), a);
    }
    return TL_OK;
}

void tl_spec_policy_init(tl_spec_policy *p, int mode, int max_draft) {
    memset(p, 0, sizeof *p);
    p->mode = mode;
    if (max_draft <= 0 || max_draft > TL_STEP_MAX_FEED - 1) max_draft = TL_STEP_MAX_FEED - 1;
    p->max_draft = max_draft;
    p->acc = ACC_PRIOR;
    for (int i = 0; i < TL_SPEC_BINS; i++) p->acc_bin[i] = ACC_PRIOR;
}

static double *acc_of(tl_spec_policy *p) {
    return p->bin > 0 ? &p->acc_bin[(p->bin > TL_SPEC_BINS ? TL_SPEC_BINS : p->bin) - 1] : &p->acc;
}

/* Tokens a step with k guesses yields on average: 1 + a + ... + a^k. */
static double expected_tokens(double a, int k) {
    double e = 1.0, t = 1.0;
    for (int i = 0; i < k; i++) e += (t *= a);
    return e;
}

int tl_spec_choose(tl_spec_policy *p, const tl_ctx *ctx, int n_avail, int n_other, double guess_s, double *rate) {
    if (rate) *rate = 0;
    if (n_avail > p->max_draft) n_avail = p->max_draft;
    if (p->mode == TL_SPEC_OFF || n_avail <= 0) return 0;
    if (p->mode != TL_SPEC_AUTO) return n_avail;
    /* The batch makes (others + E(k)) tokens in a call of (others + 1 + k)
     * rows; without guesses, (others + 1) in one of (others + 1) rows. */
    const int b0 = n_other + 1;
    const double t0 = tl_ctx_decode_cost(ctx, b0);
    if (!(t0 > 0)) return 0; /* a plain step first: it measures */
    const double base = (double)b0 / t0;
    int best = 0;
    double best_rate = base * GAIN_MIN;
    if (rate) *rate = base;
    for (int k = 1; k <= n_avail; k++) {
        const double tk = tl_ctx_decode_cost(ctx, b0 + k);
        if (!(tk > 0)) break;
        const double r = ((double)n_other + expected_tokens(*acc_of(p), k)) / (tk + k * guess_s);
        if (r > best_rate) {
            best_rate = r;
            best = k;
        }
    }
    if (rate && best) *rate = best_rate;
    /* in a call of b0 sequences' rows each probes b0 times more rarely: the
     * probes of all of them together then cost one row every PROBE_EVERY steps */
    if (best == 0 && !p->no_probe && ++p->idle >= PROBE_EVERY * b0) {
        p->idle = 0;
        return 1;
    }
    if (best) p->idle = 0;
    return best;
}

int tl_spec_could_pay(const tl_ctx *ctx, int n_avail, int n_other, double guess_s) {
    const int b0 = n_other + 1;
    const double t0 = tl_ctx_decode_cost(ctx, b0);
    if (!(t0 > 0) || !(guess_s > 0)) return 1;
    for (int k = 1; k <= n_avail; k++) {
        const double tk = tl_ctx_decode_cost(ctx, b0 + k);
        if (!(tk > 0)) return 1;
        if ((double)(b0 + k) / (tk + k * guess_s) > (double)b0 / t0 * GAIN_MIN) return 1;
    }
    return 0;
}

static void acc_update(double *a, int n_kept, int rejected) {
    for (int i = 0; i < n_kept; i++) *a += ACC_ALPHA * (1.0 - *a);
    if (rejected) *a -= ACC_ALPHA * *a;
}

void tl_spec_update(tl_spec_policy *p, int n_kept, int rejected) {
    acc_update(&p->acc, n_kept, rejected);
    if (p->bin > 0) acc_update(acc_of(p), n_kept, rejected);
}

int tl_spec_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "off")) return TL_SPEC_OFF;
    if (!strcmp(name, "auto")) return TL_SPEC_AUTO;
    if (!strcmp(name, "ngram")) return TL_SPEC_NGRAM;
    if (!strcmp(name, "draft")) return TL_SPEC_DRAFT;
    return -1;
}
