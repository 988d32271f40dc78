/* grammar: constrained decoding. A GBNF grammar (llama.cpp's notation) is
 * compiled once into flat rules (gbnf.c); a matcher (match.c) follows one
 * output through it byte by byte, as a set of pushdown stacks, and gives the
 * tokens that may come next as a bitset over the vocabulary, found by walking
 * a byte trie of the vocabulary and cached per matcher state. */
#ifndef TL_GRAMMAR_H
#define TL_GRAMMAR_H

#include <stdint.h>

#include "tokenloop.h"

/* One element of an alternative: a set of code points, a rule reference, or
 * the end of the alternative. */
enum { GE_END = 0, GE_CHARS = 1, GE_RULE = 2 };

typedef struct tl_gelem {
    uint8_t kind;
    uint8_t neg;  /* GE_CHARS: the set is the complement of the ranges */
    uint32_t a;   /* GE_CHARS: first range; GE_RULE: the rule */
    uint32_t n;   /* GE_CHARS: ranges */
} tl_gelem;

typedef struct tl_grange {
    uint32_t lo, hi; /* code points, inclusive */
} tl_grange;

struct tl_grammar {
    tl_gelem *el;   /* every alternative, each ended by GE_END */
    int n_el, cap_el;
    tl_grange *rg;
    int n_rg, cap_rg;
    /* rule r's alternatives start at el[alt[rule_alt[r] .. rule_alt[r + 1])] */
    int32_t *alt;
    int n_alt, cap_alt;
    int32_t *rule_alt; /* n_rule + 1 */
    char **name;       /* n_rule; synthesized rules are named "name_N" */
    int n_rule, cap_rule;
    int root;
};

/* Whether code point c is in element e's set. */
int tl_gelem_match(const tl_grammar *g, const tl_gelem *e, uint32_t c);

#endif
