/* Internals of the grammar module: the rule builder the front ends share, and the
 * compiled form the matcher runs. */
#ifndef PAGODA_TEXT_GRAMMAR_IMPL_H
#define PAGODA_TEXT_GRAMMAR_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "text/grammar.h"

/*
 * Symbols: a byte set (id * 2) or a rule reference (id * 2 + 1); GSYM_END (-1) closes an
 * alternative. Sets 0..255 are the single bytes.
 */
#define GSYM_END        (-1)
#define GSYM_SET(i)     ((int32_t)(i)*2)
#define GSYM_RULE(i)    ((int32_t)(i)*2 + 1)
#define GSYM_IS_RULE(s) ((s)&1)
#define GSYM_ID(s)      ((s) >> 1)

struct gbset {
    uint32_t w[8]; /* bit b of w[b / 32]: byte b */
};

struct gb_rule {
    int32_t **alts; /* [n_alts] symbol arrays */
    int *alt_len;
    int n_alts;
    int anon;    /* made by a helper: a one-alternative rule may be spliced into its user */
    int defined; /* GBNF: has a definition (references may come first) */
    /* made by gb_rep as rep_of?, rep_of* or rep_of+ (rep_lo, rep_hi: 0 1, 0 -1 or 1 -1) */
    int is_rep, rep_lo, rep_hi;
    int32_t rep_of;
    char *name;
};

/* Bounds on one grammar, so that a request cannot make the server build a huge one
 * ("(a{9999}){9999}"), nor a matcher recurse deeper than a thread's stack allows. */
#define GB_MAX_SYMBOLS 1000000
#define GB_MAX_RULES   50000

/* A grammar under construction. Helpers return a symbol that stands for what they built. */
struct gb {
    struct gb_rule *rules;
    int n_rules, cap_rules;
    struct gbset *sets;
    int n_sets, cap_sets;
    int depth;       /* nesting of the front end, against unbounded recursion */
    long n_symbols;  /* in all alternatives so far, against GB_MAX_SYMBOLS */
    double deadline; /* monotonic seconds, 0: none (gram_set_compile_timeout) */
    int timeout_ms;
    struct err *e;
    int failed;
};

void gb_init(struct gb *b, struct err *e);
void gb_dispose(struct gb *b);
/* Records the first error (returns -1); later ones are dropped. */
int gb_fail(struct gb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int gb_rule_new(struct gb *b, const char *name, int anon);
/* name -> rule id (created undefined on first use) */
int gb_rule_named(struct gb *b, const char *name, size_t len);
void gb_alt_add(struct gb *b, int rule, const int32_t *syms, int n);
int32_t gb_set(struct gb *b, const struct gbset *s);
int32_t gb_byte(int c);
int32_t gb_range(struct gb *b, int lo, int hi); /* bytes lo..hi */
int32_t gb_lit(struct gb *b, const char *s, size_t n);
int32_t gb_seq(struct gb *b, const int32_t *syms, int n);
int32_t gb_alt(struct gb *b, const int32_t *syms, int n); /* one of syms */
int32_t gb_empty(struct gb *b);
/* A growing list of symbols, for parsers that collect a sequence or alternatives. */
struct gb_list {
    int32_t *v;
    int n, cap;
};
void gb_list_push(struct gb_list *l, int32_t x);
/* The list's sequence (gb_empty when it is empty) or alternatives; -1 once b failed. Both
 * free the list. */
int32_t gb_list_seq(struct gb *b, struct gb_list *l);
int32_t gb_list_alt(struct gb *b, struct gb_list *l);
int32_t gb_opt(struct gb *b, int32_t x);
int32_t gb_star(struct gb *b, int32_t x);
/* x repeated lo..hi times (hi < 0: unbounded) */
int32_t gb_rep(struct gb *b, int32_t x, int lo, int hi);
/* Any code point in the sorted, disjoint ranges (pairs lo, hi) as UTF-8. */
int32_t gb_cp_ranges(struct gb *b, const uint32_t *r, int n_pairs);
/* Finishes the grammar with root as its start: checks every rule is defined and none is
 * left-recursive. NULL + error. Disposes b either way. */
struct gram *gb_finish(struct gb *b, int root);

/* The character class parser GBNF and regular expressions share: after '[', up to and
 * including ']'. Fills sorted disjoint code-point ranges; returns the bytes read or -1. */
struct cp_ranges {
    uint32_t *r; /* pairs */
    int n, cap;
};
int gram_parse_class(struct gb *b, const char *s, size_t n, int regex, struct cp_ranges *out);
void cp_ranges_add(struct cp_ranges *c, uint32_t lo, uint32_t hi);
void cp_ranges_norm(struct cp_ranges *c, int negate);
/* An escape after '\' in a class or a literal: code point, or a class (\d \w \s ...) added
 * to cls when cls is non-NULL. Returns bytes read, -1 when invalid. */
int gram_parse_escape(const char *s, size_t n, uint32_t *cp, struct cp_ranges *cls, int regex);
/* Decodes one UTF-8 code point; returns its length (1 for an invalid byte, taken as is). */
int gram_utf8(const char *s, size_t n, uint32_t *cp);

/* Regular expression into b (in_json_string: characters that JSON must escape are left
 * out, for string patterns). Returns the symbol or -1. */
int32_t gram_regex_into(struct gb *b, const char *re, size_t n, int in_json_string);

/* A JSON Schema integer (integer: 1) or number's minimum, maximum and exclusive bounds as a
 * regex over its text, heap-allocated (grammar_num.c); NULL with msg empty when it has no
 * bound, NULL with msg set when the bounds cannot be met or read. */
struct cJSON;
char *gram_range_regex(const struct cJSON *schema, int integer, char *msg, size_t cap);

/* The compiled form. */
struct gram_cache; /* masks by state, grammar_mask.c */

struct gram {
    int32_t *syms; /* alternatives one after the other, each closed by GSYM_END */
    int n_syms;
    int32_t *alt_pos;  /* start of each alternative in syms */
    int32_t *rule_alt; /* rule r's alternatives: alt_pos[rule_alt[r] .. rule_alt[r + 1]) */
    int n_rules;
    struct gbset *sets;
    int n_sets;
    int root;
    int refs;
    pthread_mutex_t mu; /* the cache, and the two below when first made */
    struct gram_cache *cache;
    int32_t *pos_rule;    /* the rule of each position in syms (grammar_match.c) */
    struct gbset *follow; /* by rule: the bytes that may come right after it */
};

void gram_cache_free(struct gram_cache *c);
/* The bound gram_set_compile_timeout set (ms, 0: none). */
int gram_compile_timeout(void);
/* Drops the masks cached by state, keeping the token sets by position: the next mask of
 * every state is built from those (bench grammar and tests measure and check that path). */
void gram_forget_states(struct gram *g);
/* The mask of m's state by a walk of the whole trie from the state (no token sets, no
 * cache): the reference the tests hold the cached masks to. */
void gram_matcher_walk_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask);
/* The entries of token sets by position that g holds for v (tests: gram_prepare made all
 * that masks use). */
int gram_n_positions(struct gram *g, const struct gram_vocab *v);

#endif
