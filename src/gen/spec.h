/* spec: speculative decoding for one sequence. The drafters guess what comes
 * next; the policy decides, step by step, how many guesses are worth a
 * verification row. Verification itself is the stepper's (step.c): a guess is
 * kept only when the token sampled at its position equals it, so the output
 * is the one without speculation, token for token, at any temperature. */
#ifndef TL_SPEC_H
#define TL_SPEC_H

#include <stdint.h>

#include "tokenloop.h"

/* The sequence's tokens: hist[0..n) (the committed ones, then the last
 * sampled token). */
typedef struct tl_hist {
    const int32_t *tok;
    int n_tok;
    int32_t last;
} tl_hist;

/* Prompt lookup: the continuation of the most recent earlier occurrence of
 * the longest suffix n-gram (n = 4 down to 1) of hist. Writes up to max
 * tokens; returns the count and, in *match, the n-gram's length. */
int tl_spec_ngram(const tl_hist *h, int max, int32_t *out, int *match);

/* The per-sequence policy: acceptance so far, and the draft length that
 * maximises the tokens per second the whole batch makes, from the context's
 * measured cost of a forward call of n rows. */
#define TL_SPEC_BINS 4
typedef struct tl_spec_policy {
    int mode;          /* tl_spec_mode */
    int max_draft;     /* cap (TL_STEP_MAX_FEED - 1 at most) */
    double acc;        /* estimated chance that a guess is kept (EMA over guesses) */
    /* Prompt lookup's guesses are kept at rates that depend on the matched
     * n-gram's length (a 4-gram inside copied text, a lone word in free
     * text), so each length has its own estimate; bin: the length of the
     * match the next choose and update are about (set by the caller; 0: acc) */
    double acc_bin[TL_SPEC_BINS];
    int bin;
    int idle;          /* steps since the last draft while guesses existed */
    int no_probe;      /* never guess against the estimate (a draft model: a probe
                        * would first have to run it over every token since) */
} tl_spec_policy;

void tl_spec_policy_init(tl_spec_policy *p, int mode, int max_draft);
/* How many of n_avail guesses to verify in a call where the other sequences
 * feed n_other rows (0 alone); guess_s: seconds each guess costs to make (a
 * draft model's forward call; 0 for prompt lookup). *rate (if not NULL): the
 * tokens per second the batch is expected to make with that many (0 when
 * the costs are not measured yet). */
int tl_spec_choose(tl_spec_policy *p, const tl_ctx *ctx, int n_avail, int n_other, double guess_s, double *rate);
/* Whether guesses costing guess_s each to make could beat plain decoding by
 * the policy's margin even if every one were kept (1 while a cost is not
 * measured yet): a draft model about as dear as the model never can. */
int tl_spec_could_pay(const tl_ctx *ctx, int n_avail, int n_other, double guess_s);
/* After a step whose first n_kept guesses were kept, the next one rejected
 * if `rejected` (else the step ended for another reason). */
void tl_spec_update(tl_spec_policy *p, int n_kept, int rejected);

#endif
