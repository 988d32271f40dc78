/* tokenloop: LLM inference in C. The public API.
 *
 * Every function that can fail returns a tl_status (0 on success, negative
 * otherwise) and, when given a tl_error, fills it with a human-readable message.
 * Nothing here exits or aborts on bad input. Objects are opaque and come in
 * _new/_load and _free pairs; no global mutable state. */
#ifndef TOKENLOOP_H
#define TOKENLOOP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TL_VERSION "0.1.0"

typedef enum tl_status {
    TL_OK = 0,
    TL_ERR_IO = -1,          /* file could not be opened, read or mapped */
    TL_ERR_FORMAT = -2,      /* file is corrupt, truncated or not what it claims */
    TL_ERR_NOMEM = -3,       /* allocation failed */
    TL_ERR_ARG = -4,         /* invalid argument from the caller */
    TL_ERR_UNSUPPORTED = -5, /* valid but not supported (architecture, type, ...) */
    TL_ERR_CONTEXT_FULL = -6 /* the KV cache has no room for more tokens */
} tl_status;

typedef struct tl_error {
    int status;
    char msg[512];
} tl_error;

/* ---- models ------------------------------------------------------------- */

/* A loaded GGUF file: mapped weights (if any) and its tokenizer. A
 * vocabulary-only file loads too; it can tokenize but not run. Immutable after
 * load, so one model can serve many contexts. */
typedef struct tl_model tl_model;

int tl_model_load(const char *path, tl_model **out, tl_error *err);
/* Loads only the header, metadata and tokenizer, not the architecture. */
int tl_model_load_vocab(const char *path, tl_model **out, tl_error *err);
void tl_model_free(tl_model *model);

/* Prints a human-readable summary of a GGUF file (architecture,
 * hyperparameters, tensor types, vocabulary, special tokens, template, size).
 * Works on any valid GGUF file, including vocabulary-only ones. */
int tl_gguf_describe(const char *path, FILE *out, tl_error *err);

/* What this build runs, for --help and info. */
const char *tl_supported_architectures(void);
const char *tl_supported_tokenizers(void);
const char *tl_supported_weight_types(void);

int tl_model_n_vocab(const tl_model *model);
int tl_model_n_ctx_train(const tl_model *model);
int tl_model_can_run(const tl_model *model); /* 1 if it has runnable weights */
/* 1 for an encoder (bert, nomic-bert): it gives embeddings (tl_ctx_embed), never logits */
int tl_model_is_encoder(const tl_model *model);
/* Bytes of weights one decoded token reads: every tensor of every layer (of
 * a mixture of experts, only the share of the experts a token is routed to), the
 * final norm, the output matrix (and RoPE factors, if any), and one row of the
 * token embedding (the whole matrix, once, when it is also the output). 0 for
 * a vocabulary-only file. */
size_t tl_model_decode_bytes(const tl_model *model);
/* Bytes of weights a decode step of n_seq sequences (one token each) reads
 * when each layer routes every token to n_used of its n experts uniformly
 * and independently: the dense weights once, each expert's share with the
 * probability 1 - (1 - n_used/n)^n_seq that some token chose it, and one
 * embedding row per sequence. n_seq 1 gives tl_model_decode_bytes; a dense
 * model reads its weights once whatever n_seq, a mixture more (the bound on
 * what batching streams can gain: docs/PERFORMANCE.md). */
size_t tl_model_step_bytes(const tl_model *model, int n_seq);
/* Experts per mixture-of-experts layer (0: a dense model); *n_used (if not
 * NULL) gets how many each token is routed to. */
int tl_model_n_expert(const tl_model *model, int *n_used);
/* KV cache bytes one position takes with these tl_kv_types in the layers
 * that keep every position (every layer but the sliding-window ones, K and
 * V): what the shared pool holds per position, unless the window layers are
 * in it too (tl_ctx_params.swa_full, or a context too short for a ring:
 * tl_kv_stats.block_bytes says); 0 when the model cannot have that cache (a
 * head size that is not a multiple of the type's 32-element block), runs no
 * weights, or has only window layers. */
size_t tl_model_kv_bytes_per_pos(const tl_model *model, int kv_type_k, int kv_type_v);
/* The same for the sliding-window layers (Gemma 3 and 4, gpt-oss; 0 when
 * there are none), and their window in *n_swa (if not NULL). A context keeps
 * only each sequence's last window plus a batch of those positions, in a
 * ring of its own, unless tl_ctx_params.swa_full puts them in the pool. */
size_t tl_model_kv_window_bytes(const tl_model *model, int kv_type_k, int kv_type_v, int *n_swa);
/* The positions such a ring holds with batches of n_batch: the window
 * before a call's first row, the call, and a block (0: no window layers,
 * or an encoder's, which attends to its whole text). */
int tl_model_kv_ring_positions(const tl_model *model, int n_batch);
/* The recurrent state one sequence carries whatever its length (Gated
 * DeltaNet layers: each value head's state and the convolution's window, in
 * f32), and how many layers keep one; 0 for a transformer. */
size_t tl_model_state_bytes(const tl_model *model, int *n_layers);
/* The chat template from the file's metadata, or NULL. */
const char *tl_model_chat_template(const tl_model *model);

/* ---- tokens --------------------------------------------------------------- */

enum {
    TL_TOK_ADD_BOS = 1,       /* prepend BOS */
    TL_TOK_PARSE_SPECIAL = 2, /* special-token text (e.g. "<|im_start|>") becomes the token */
    TL_TOK_ADD_SPECIAL = 4,   /* the vocabulary's own: BOS where it adds one (WordPiece: and SEP after),
                               * EOS where it adds one (llama.cpp's add_special) */
};

/* Tokenizes text[0..len) (any bytes). *ids is allocated; free with tl_free. */
int tl_tokenize(const tl_model *model, const char *text, size_t len, int flags,
                int32_t **ids, size_t *n_ids, tl_error *err);
/* Whether the model's metadata asks for a BOS token on completions. */
int tl_model_add_bos(const tl_model *model);
/* Whether the file asks for an EOS after a text (tokenizer.ggml.add_eos_token:
 * embedding models pooled at the last token, e.g. Qwen3-Embedding). */
int tl_model_add_eos(const tl_model *model);
int32_t tl_token_bos(const tl_model *model); /* -1 if none */
int32_t tl_token_eos(const tl_model *model); /* -1 if none */
/* End of generation: EOS, EOT and the other end markers (<|im_end|>, ...). */
int tl_token_is_eog(const tl_model *model, int32_t id);
/* The bytes a token stands for. Control tokens give their text only if
 * `special`. Returns the length (may exceed cap; then out holds a prefix). */
size_t tl_token_piece(const tl_model *model, int32_t id, int special, char *out, size_t cap);

/* Streaming detokenizer: holds back an incomplete UTF-8 sequence until the
 * next token completes it, so streamed output never splits a character. */
typedef struct tl_detok {
    char held[8];
    int n_held;
    int special;
} tl_detok;
void tl_detok_init(tl_detok *d, int special);
/* Appends the complete UTF-8 produced by token id to out (NUL-terminated).
 * Returns the byte count written; cap must be at least 8 + the longest piece. */
size_t tl_detok_push(tl_detok *d, const tl_model *model, int32_t id, char *out, size_t cap);
/* Emits whatever is still held (an invalid or truncated sequence, as is). */
size_t tl_detok_flush(tl_detok *d, char *out, size_t cap);

void tl_free(void *p);

/* ---- contexts: the KV cache and the forward pass ---------------------------- */

typedef struct tl_ctx tl_ctx;

/* The float order of the matrix products (docs/NUMERICS.md). Both are batch
 * invariant: a row's result depends on its own data alone. */
typedef enum tl_numerics {
    TL_NUMERICS_AUTO = 0,  /* $TL_NUMERICS ("fast" or "exact") if set, else fast */
    TL_NUMERICS_FAST = 1,  /* exact integer block sums, one fma per block: the default */
    TL_NUMERICS_EXACT = 2  /* bitwise llama.cpp's CPU kernels (docs/NUMERICS.md says which) */
} tl_numerics;

/* Parses "fast", "exact" (or "auto"); -1 for anything else. */
int tl_numerics_parse(const char *name);

/* What the KV cache holds per element (llama.cpp's --cache-type-k/-v):
 * f16 (its default), q8_0 (half the bytes; perplexity within a fraction of
 * a percent) or q4_0 (a quarter; measurably worse, see docs/MEMORY.md). */
typedef enum tl_kv_type { TL_KV_F16 = 0, TL_KV_Q8_0 = 1, TL_KV_Q4_0 = 2 } tl_kv_type;
/* "f16", "q8_0", "q4_0" -> tl_kv_type; -1 for another name. */
int tl_kv_type_parse(const char *name);
/* The name of a tl_kv_type, or NULL. */
const char *tl_kv_type_name(int type);

typedef struct tl_ctx_params {
    int n_ctx;       /* positions per sequence; 0 = the model's training context when the KV
                      * of n_seq_max of them fits the machine, else the longest that fits,
                      * at least min(training, 4096) (tl_ctx_sizing says which) */
    int n_threads;   /* 0 = all online CPUs */
    int n_batch;     /* max tokens per forward call; 0 = 512 */
    int n_seq_max;   /* sequences tl_seq_open may have open at once; 0 = none (eval only) */
    size_t kv_bytes; /* KV cache memory, shared by all sequences and the prefix
                      * cache; 0 = room for max(1, n_seq_max) full sequences, cut to
                      * 3/4 of the memory left (MemAvailable, the cgroup's limit,
                      * ulimit -v) after the model file */
    int n_logits_max;/* logits rows one tl_ctx_decode may keep; 0 = 64 */
    int numerics;    /* tl_numerics; 0 = TL_NUMERICS_AUTO */
    int kv_type_k;   /* tl_kv_type of the keys; 0 = f16 */
    int kv_type_v;   /* tl_kv_type of the values; 0 = f16 */
    const tl_ctx *share_threads; /* run on this context's thread pool (n_threads is then
                                  * its count; it must outlive the new one): a draft
                                  * model beside its target, never fighting it for cores */
    int n_seq_embd;  /* sequences beyond n_seq_max that tl_ctx_embed_batch may open to run
                      * texts side by side; 0 = none. They add nothing to the default KV
                      * pool: an embedding's blocks go back when its call returns (but
                      * each has a ring of sliding-window layers, set aside first) */
    int swa_full;    /* 1: sliding-window layers keep every position in the pool, as the
                      * others do (a cached prefix is reusable at any block, as llama.cpp's
                      * --swa-full); 0 = each sequence keeps their last window plus a batch
                      * in a ring (llama.cpp's default), and a cached prefix resumes where
                      * a snapshot of that window was kept (the end of a prompt or a turn) */
} tl_ctx_params;

int tl_ctx_new(const tl_model *model, const tl_ctx_params *params, tl_ctx **out, tl_error *err);
void tl_ctx_free(tl_ctx *ctx);
int tl_ctx_n_ctx(const tl_ctx *ctx);
int tl_ctx_n_batch(const tl_ctx *ctx);
int tl_ctx_n_past(const tl_ctx *ctx);
/* Forgets positions >= n_past (0 clears the sequence): tl_seq_truncate on
 * the implicit sequence 0. */
int tl_ctx_truncate(tl_ctx *ctx, int n_past, tl_error *err);

/* Appends tokens at positions n_past.. and runs the model over them (in
 * chunks of n_batch). If all_logits, logits of every token are kept (for
 * perplexity and scoring); otherwise only of the last. */
int tl_ctx_eval(tl_ctx *ctx, const int32_t *tokens, size_t n, int all_logits, tl_error *err);
/* Logits row i of the last eval (i = -1: the last token). NULL if not kept. */
const float *tl_ctx_logits(const tl_ctx *ctx, int i);
/* Embeddings: a sequence's final (output-normed) hidden states, pooled
 * into one vector as llama.cpp pools them. Values are llama.cpp's
 * pooling_type numbers. */
typedef enum tl_pooling {
    TL_POOL_MODEL = -1, /* the file's <arch>.pooling_type, else mean (llama-embedding's default) */
    TL_POOL_NONE = 0,   /* one vector per token */
    TL_POOL_MEAN = 1,   /* the tokens' average */
    TL_POOL_CLS = 2,    /* the first token's */
    TL_POOL_LAST = 3,   /* the last token's (decoder embedding models: Qwen3-Embedding) */
    TL_POOL_RANK = 4,   /* rerankers: the last token's row (the first's for a non-causal
                         * model), through the file's classification head: n_cls_out scores */
} tl_pooling;
/* The model's width (the length of an embedding) and its pooling_type. */
int tl_model_n_embd(const tl_model *model);
int tl_model_pooling(const tl_model *model);
/* The scores rank pooling gives: the rows of cls.output (else of cls); 0
 * when the file has no classification head, so cannot rank. A relevance
 * score is score 0 (Qwen3-Reranker: P("yes"), the softmax of its two). */
int tl_model_n_cls_out(const tl_model *model);
/* tokenizer.chat_template.rerank (a prompt with {query} and {document}), or NULL. */
const char *tl_model_rerank_template(const tl_model *model);
/* The tokens of one (query, document) pair as llama-server's
 * format_prompt_rerank makes them: the rerank template with both put in,
 * special tokens parsed, no BOS added; without a template (BERT-style
 * cross-encoders) [BOS] query [EOS] [SEP] document [EOS], each marker where
 * the vocabulary adds it. *ids is malloc'ed (tl_free). */
int tl_rerank_tokens(const tl_model *model, const char *query, size_t query_len, const char *doc, size_t doc_len,
                     int32_t **ids, size_t *n_ids, tl_error *err);
/* "none", "mean", "cls", "last", "rank" -> tl_pooling; -2 for an unknown name. */
int tl_pooling_parse(const char *name);
const char *tl_pooling_name(int pooling);
/* Embeds tokens[0..n) as one sequence on the implicit sequence 0 (cleared
 * first; any length up to n_ctx, run in chunks of n_batch): TL_POOL_NONE
 * writes n rows of tl_model_n_embd floats to out, the others one row;
 * TL_POOL_RANK one row of tl_model_n_cls_out scores (never normalized;
 * TL_ERR_UNSUPPORTED when the file has no head).
 * normalize: each row scaled to unit L2 length (OpenAI's vectors), as
 * llama.cpp's common_embd_normalize computes it. A row depends on the
 * tokens alone, never on n_batch or the thread count. Returns the rows
 * written, or a negative status. */
int tl_ctx_embed(tl_ctx *ctx, const int32_t *tokens, size_t n, int pooling, int normalize, float *out,
                 tl_error *err);
/* Embeds n_texts texts at once: text i is tokens[i][0..n[i]), its rows
 * written to out[i] as tl_ctx_embed writes them (n[i] rows for
 * TL_POOL_NONE, else one). Each text runs as its own sequence (sequence 0,
 * cleared first, and as many as tl_seq_open gives up to the texts' count,
 * closed again before returning), packed into forward calls of n_batch
 * tokens, so short texts share a call; an encoder's text never straddles
 * two calls. Every row is bitwise the one tl_ctx_embed gives that text
 * alone: rows never see another sequence, and pooling runs per sequence in
 * token order. With no sequence to open it runs the texts one after another.
 * Returns TL_OK or a negative status (nothing is then promised of out). */
int tl_ctx_embed_batch(tl_ctx *ctx, const int32_t *const *tokens, const size_t *n, int n_texts, int pooling,
                       int normalize, float *const *out, tl_error *err);
/* The CPU code path in use, e.g. "avx512-vnni". */
const char *tl_ctx_backend(const tl_ctx *ctx);
/* The numerics in use: "fast" or "exact". */
const char *tl_ctx_numerics(const tl_ctx *ctx);
/* How the context length and the KV pool were sized, and why (a sentence for
 * start-up lines: asked for, the training length, or what the memory allows). */
const char *tl_ctx_sizing(const tl_ctx *ctx);

/* The thread pool's work since the context was made: fork-join jobs, their
 * wall time and the threads' busy time inside them (busy / (wall x threads)
 * is the share of the threads' time in jobs that did work). */
typedef struct tl_thread_stats {
    int n_threads;
    uint64_t jobs;
    double wall_s, busy_s;
} tl_thread_stats;
void tl_ctx_thread_stats(const tl_ctx *ctx, tl_thread_stats *out);

/* ---- many sequences in one forward call (the server's path) -----------------
 *
 * The KV cache is a pool of blocks of TL_KV_BLOCK positions shared by every
 * sequence. Each full block a tl_seq_open sequence writes is registered in the
 * prefix cache under its tokens and everything before them; a later sequence
 * that starts with the same tokens maps those blocks instead of computing
 * them. Blocks nobody uses stay cached until memory is needed (least recently
 * used first). A token's logits do not depend on what else is in the batch,
 * on how its prompt was chunked, on whether its prefix came from the cache or
 * on the thread count: the arithmetic of each row is fixed.
 * tl_ctx_eval and friends run on an implicit sequence of their own, which
 * never touches the prefix cache. */

#define TL_KV_BLOCK 16

/* Opens an empty sequence; *seq gets its id (1..n_seq_max). Fails with
 * TL_ERR_CONTEXT_FULL when n_seq_max are open. */
int tl_seq_open(tl_ctx *ctx, int *seq, tl_error *err);
/* Maps the cached blocks that match tokens[0..n) into an empty sequence, at
 * most max_reuse positions (whole blocks). Returns the positions reused (a
 * multiple of TL_KV_BLOCK, 0 if none), which then count as the sequence's
 * first tokens. */
int tl_seq_reuse_prefix(tl_ctx *ctx, int seq, const int32_t *tokens, size_t n, size_t max_reuse);
/* Models whose sequences carry a state beside their KV blocks (recurrent
 * layers, sliding-window layers in rings) resume a cached prefix only at a
 * block boundary where that state was kept: at the end of a prompt (the
 * boundary its last chunk passed), at close, and where asked here. Asks to
 * keep seq's state at the boundary pos rounded down to TL_KV_BLOCK, taken
 * when a tl_ctx_decode's positions for seq end in the block that follows it
 * (a prompt's chunk cut there): a point other prompts share, such as the end
 * of a system prompt. Other snapshots a prompt's chunks leave replace each
 * other, so a long prompt keeps a few, not one per chunk. Returns the
 * boundary (0: nothing to keep: no such state, or pos < TL_KV_BLOCK); up to
 * 2 per sequence, cleared when it closes. */
int tl_seq_keep_state_at(tl_ctx *ctx, int seq, int pos);
/* Positions the sequence holds. */
int tl_seq_len(const tl_ctx *ctx, int seq);
/* Closes the sequence; its full blocks stay in the prefix cache. */
void tl_seq_close(tl_ctx *ctx, int seq);
/* Forgets positions >= len of an open sequence (0: the implicit one), and
 * whatever is pending. Blocks wholly past len are released (those in the
 * prefix cache stay cached); a block len falls inside that the prefix cache or
 * another sequence shares is first copied, so their bits never change.
 * TL_ERR_CONTEXT_FULL when no block is free for that copy. */
int tl_seq_truncate(tl_ctx *ctx, int seq, int len, tl_error *err);
/* After a tl_ctx_decode with pending set: keeps the first n of the positions
 * it wrote for seq (they join the sequence and, once a block fills, the
 * prefix cache) and drops the rest. */
int tl_seq_commit(tl_ctx *ctx, int seq, int n, tl_error *err);
/* The tokens at the sequence's committed positions (*n of them); valid until
 * the next call that changes the sequence. NULL if not open. */
const int32_t *tl_seq_tokens(const tl_ctx *ctx, int seq, int *n);

/* One forward call over tokens of any open sequences. Each token is appended
 * to its sequence, in batch order (a sequence's tokens in order). logits[i]
 * nonzero keeps token i's logits row (NULL: none). n <= n_batch, rows kept
 * <= n_logits_max, and every sequence stays within n_ctx and the blocks free.
 * With pending set, the positions are written but not yet part of their
 * sequences: tl_seq_commit keeps the accepted ones (speculative decoding),
 * and the next call writes over the rest. */
typedef struct tl_batch {
    int n;
    const int32_t *token;
    const int32_t *seq;
    const uint8_t *logits;
    int pending;
} tl_batch;
int tl_ctx_decode(tl_ctx *ctx, const tl_batch *batch, tl_error *err);
/* Row i of the logits the last tl_ctx_decode kept, in batch order; NULL if
 * out of range. */
const float *tl_ctx_batch_logits(const tl_ctx *ctx, int i);
/* Seconds a tl_ctx_decode of n tokens takes on this context, from the calls
 * measured so far: the fastest of the last four calls of n tokens (never
 * below a smaller size's), a line between the sizes seen around n, or past
 * the largest; 0 while no call of n tokens or fewer was seen. Speculation
 * weighs its drafts by it. */
double tl_ctx_decode_cost(const tl_ctx *ctx, int n);

typedef struct tl_kv_stats {
    int block_size;      /* TL_KV_BLOCK */
    size_t block_bytes;  /* memory of one block (the pool's layers, K and V) */
    int kv_type_k, kv_type_v; /* tl_kv_type of the cache's keys and values */
    int n_blocks;        /* blocks in the pool */
    int n_used;          /* blocks some sequence holds */
    int n_cached;        /* blocks nobody holds that keep a cached prefix */
    int n_free;          /* blocks that can be handed out now (free + cached) */
    int n_touched;       /* blocks ever handed out: the pool's memory written so far */
    uint64_t query_tokens; /* prompt tokens looked up in the prefix cache */
    uint64_t hit_tokens;   /* of those, positions reused */
    /* Recurrent layers (Gated DeltaNet): a sequence's state is kept beside
     * the cache, and a cached prefix resumes from a snapshot of it (of its
     * sliding-window rings too, below) */
    size_t state_bytes;    /* one sequence's recurrent state in memory (0: no such layers) */
    size_t state_read_bytes; /* what a step of one sequence reads of it (its state at a block boundary) */
    int n_snapshots;       /* sequence states of cached prefixes held (recurrent, windows) */
    size_t snapshot_bytes; /* their memory */
    /* Sliding-window layers kept in rings (tl_ctx_params.swa_full 0): a
     * sequence's last window plus a batch, outside the pool */
    size_t window_bytes;     /* one sequence's ring (0: no such layers, swa_full, or a context too
                              * short for a ring: then they are in the pool, block_bytes) */
    size_t window_pos_bytes; /* a position of those layers (a step reads n_swa of them at most) */
    int n_swa;               /* the window */
} tl_kv_stats;
void tl_ctx_kv_stats(const tl_ctx *ctx, tl_kv_stats *out);

/* A message for a log (one line, no newline); arg is the caller's. */
typedef void (*tl_log_fn)(void *arg, const char *msg);

/* The prefix cache on disk as well, so that a restart keeps it: every block a
 * tl_seq_open sequence registers is also written under dir (by a background
 * thread; decoding never waits for it, and a block that would overfill the
 * writer's queue is dropped), and tl_seq_reuse_prefix continues a match in
 * RAM with the blocks it finds there, each checked (its file's header names
 * the model, numerics mode, KV types and layout that computed it, its prefix
 * by a SHA-256 chain of the tokens, and a checksum of its bytes) before it is
 * used. Files computed otherwise, and damaged ones, are ignored and reported
 * through log (may be NULL). budget_bytes caps the directory: the least
 * recently used blocks are deleted first. Models with recurrent layers also
 * keep there (dir/states, the same budget) the states at cached block
 * boundaries that a prompt resumes from. Call once, before the first
 * sequence; tl_ctx_free writes what is still queued. */
int tl_ctx_disk_cache(tl_ctx *ctx, const char *dir, uint64_t budget_bytes, tl_log_fn log, void *log_arg,
                      tl_error *err);
typedef struct tl_disk_stats {
    uint64_t files, bytes, budget; /* on disk now, and the cap */
    uint64_t written, loaded;      /* blocks written, and read back into the prefix cache */
    uint64_t rejected;             /* files ignored: another model's, or damaged */
    uint64_t dropped, evicted, failed; /* not queued (writer behind), deleted for the budget, write errors */
} tl_disk_stats;
/* Zeros when the context has no disk cache. */
void tl_ctx_disk_stats(const tl_ctx *ctx, tl_disk_stats *out);
/* Waits until every queued block is on disk (tests, before a planned exit). */
void tl_ctx_disk_flush(tl_ctx *ctx);

/* Sequence seq (0: the implicit one) to a file: its tokens and every
 * position's keys and values, with the identity of what computed them (the
 * model, numerics mode, KV types and layout: tl_ctx_disk_cache's), so that
 * a later process resumes it without computing it again. Written to
 * path.tmp and renamed. */
int tl_ctx_save(tl_ctx *ctx, int seq, const char *path, tl_error *err);
/* Reads a file tl_ctx_save wrote into sequence seq, which must be empty
 * (seq 0: cleared first). A file of another model or setting is
 * TL_ERR_FORMAT saying so; a damaged one TL_ERR_FORMAT too, the sequence
 * left empty. *n_restored (may be NULL): the positions now in it. */
int tl_ctx_load(tl_ctx *ctx, int seq, const char *path, int *n_restored, tl_error *err);

/* ---- sampling -------------------------------------------------------------- */

typedef struct tl_logit_bias {
    int32_t token;
    float bias; /* added to the logit; -INFINITY bans the token */
} tl_logit_bias;

typedef struct tl_sampler_params {
    float temp;             /* <= 0: greedy argmax of the raw logits (+ logit_bias; no penalties/filters) */
    int top_k;              /* <= 0: off */
    float top_p;            /* >= 1: off */
    float min_p;            /* <= 0: off */
    float repeat_penalty;   /* 1: off */
    float freq_penalty;     /* 0: off */
    float presence_penalty; /* 0: off */
    int penalty_last_n;     /* window of previous tokens the penalties see; -1 = whole history */
    uint64_t seed;          /* TL_SEED_RANDOM draws one from the clock */
    const tl_logit_bias *logit_bias;
    int n_logit_bias;
} tl_sampler_params;

#define TL_SEED_RANDOM UINT64_MAX

/* llama.cpp's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05, penalties off. */
tl_sampler_params tl_sampler_default_params(void);

typedef struct tl_sampler tl_sampler;

typedef struct tl_token_prob {
    int32_t token;
    float prob;    /* probability under the model's softmax of the raw logits */
    float logprob; /* its natural log */
} tl_token_prob;

int tl_sampler_new(const tl_sampler_params *params, int n_vocab, tl_sampler **out, tl_error *err);
void tl_sampler_free(tl_sampler *s);
/* Samples from one row of logits (not modified). If top != NULL, fills up to
 * n_top most probable tokens of the model's distribution and *chosen with the
 * sampled token's entry. Returns the token id. */
int32_t tl_sampler_sample(tl_sampler *s, const float *logits, tl_token_prob *chosen,
                          tl_token_prob *top, int n_top);
/* The model's distribution at one row of logits without sampling: fills
 * *chosen with token's entry and up to n_top most probable tokens (scoring a
 * given text, e.g. prompt logprobs). Returns the count written to top. */
int tl_sampler_report(tl_sampler *s, const float *logits, int32_t token, tl_token_prob *chosen,
                      tl_token_prob *top, int n_top);
/* The distribution tl_sampler_sample draws from at this row (after bias,
 * penalties, top-k, top-p, min-p and temperature; one token at temperature
 * 0): up to cap entries with nonzero probability, the most probable when more
 * remain, in no particular order. Returns the count. Draws nothing. */
int tl_sampler_dist(tl_sampler *s, const float *logits, tl_token_prob *out, int cap);
/* Records a token in the penalty history (prompt tokens and generated ones). */
void tl_sampler_accept(tl_sampler *s, int32_t token);
void tl_sampler_reset(tl_sampler *s);
/* The mask for the draws that follow: token i may be drawn only if bit i%32
 * of bits[i/32] is set (NULL: no mask). Applied before the rest of the chain
 * (bias, penalties, filters), at every temperature; reported probabilities
 * stay the model's own. Not owned; the caller keeps it valid while set. With
 * nothing allowed, tl_sampler_sample returns -1. */
void tl_sampler_set_allowed(tl_sampler *s, const uint32_t *bits);

/* ---- grammars: output that always parses ------------------------------------ */

/* A compiled grammar in llama.cpp's GBNF notation (docs/GRAMMAR.md); the
 * start rule is `root`. Immutable once made: any number of matchers, on any
 * threads, may share it. */
typedef struct tl_grammar tl_grammar;
int tl_grammar_parse(const char *gbnf, size_t len, tl_grammar **out, tl_error *err);
void tl_grammar_free(tl_grammar *g);
/* A grammar whose outputs are the JSON texts valid for a JSON Schema (the
 * keywords docs/GRAMMAR.md lists; any other is TL_ERR_ARG naming it). */
int tl_grammar_from_json_schema(const char *schema, size_t len, tl_grammar **out, tl_error *err);
/* The same grammar as GBNF text (*gbnf allocated; free with tl_free). */
int tl_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, tl_error *err);

/* The model's vocabulary as a byte trie, built once per model and shared
 * (read-only) by its matchers. */
typedef struct tl_vocab_trie tl_vocab_trie;
int tl_vocab_trie_new(const tl_model *model, tl_vocab_trie **out, tl_error *err);
void tl_vocab_trie_free(tl_vocab_trie *t);

/* One output's position in a grammar. A grammar past what the matcher follows
 * (nesting, or too many ways to one state) is TL_ERR_UNSUPPORTED, from
 * tl_matcher_new or a later call; TL_ERR_NOMEM is memory alone. */
typedef struct tl_matcher tl_matcher;
int tl_matcher_new(const tl_grammar *g, const tl_vocab_trie *t, tl_matcher **out, tl_error *err);
void tl_matcher_free(tl_matcher *m);
/* Back to the start of the output. */
int tl_matcher_reset(tl_matcher *m, tl_error *err);
/* The tokens that may come next, as bits for tl_sampler_set_allowed (the end
 * tokens when the output may end here); valid until the next call on m. NULL
 * on error. */
const uint32_t *tl_matcher_allowed(tl_matcher *m, tl_error *err);
/* Follows a token (an end token: the output ends) or raw text; TL_ERR_ARG,
 * state unchanged up to the byte that failed, when the grammar forbids it. */
int tl_matcher_accept(tl_matcher *m, int32_t token, tl_error *err);
int tl_matcher_accept_bytes(tl_matcher *m, const char *text, size_t len, tl_error *err);
/* Whether the output may end here, and whether it must (nothing may follow). */
int tl_matcher_can_end(const tl_matcher *m);
int tl_matcher_done(const tl_matcher *m);

/* ---- generation: the loop ----------------------------------------------------- */

typedef enum tl_stop_reason {
    TL_STOP_NONE = 0,
    TL_STOP_EOG,        /* end-of-generation token */
    TL_STOP_STRING,     /* a stop string appeared (not emitted) */
    TL_STOP_LENGTH,     /* n_predict reached */
    TL_STOP_CONTEXT,    /* KV cache full */
    TL_STOP_CALLBACK    /* the callback asked to stop */
} tl_stop_reason;

/* Where an emitted token came from. */
typedef enum tl_token_source {
    TL_SOURCE_SAMPLED = 0, /* drawn by the sampler */
    TL_SOURCE_DRAFT = 1,   /* a speculative guess the sampler's draw confirmed */
    TL_SOURCE_GRAMMAR = 2, /* the only token the grammar allowed */
    TL_SOURCE_FORCED = 3   /* written by the loop (the reasoning budget's close) */
} tl_token_source;

typedef struct tl_gen_event {
    int32_t token;
    const char *text;  /* text now safe to emit (complete UTF-8, stop strings held back) */
    size_t text_len;
    tl_token_prob chosen;
    const tl_token_prob *top; /* n_top alternatives, most probable first */
    int n_top;
    int reasoning;     /* the token belongs to the reasoning (its markers included) */
    int forced;        /* the loop chose it (the reasoning budget's close), not the sampler */
    int source;        /* tl_token_source */
} tl_gen_event;

/* Return nonzero to stop. */
typedef int (*tl_gen_callback)(const tl_gen_event *ev, void *user);

/* ---- the loop's trace (docs/TRACE.md) ---------------------------------------
 *
 * One record per forward call: which sequences it served and how (a prompt
 * chunk, a decode step, or a verification of speculative guesses), the
 * tokens each emitted after it, with their probabilities, alternatives and
 * source, the call's time and the bytes it read, and running totals. The
 * pointers in a record are valid only during the callback. */

#define TL_TRACE_VERSION 1

typedef enum tl_trace_phase {
    TL_PHASE_PREFILL = 1, /* a chunk of prompt */
    TL_PHASE_DECODE = 2,  /* the last token, for the next one (and any forced tokens after it) */
    TL_PHASE_VERIFY = 3   /* the last token and guesses, verified together */
} tl_trace_phase;

typedef struct tl_trace_token {
    int32_t token;       /* -1: text released at the end (held back before) */
    const char *text;    /* the text this token released (may be empty) */
    size_t text_len;
    tl_token_prob chosen;
    const tl_token_prob *top; /* n_top alternatives, most probable first */
    int n_top;
    int source;          /* tl_token_source */
    int reasoning;       /* part of the reasoning */
} tl_trace_token;

typedef struct tl_trace_seq {
    int seq;             /* the sequence (0: the implicit one of tl_ctx_eval) */
    int id;              /* the caller's id for it (the server's request number) */
    int phase;           /* tl_trace_phase */
    int n_fed;           /* tokens this call evaluated for it */
    int n_cached;        /* prompt tokens it skipped, already in the cache (first prefill only) */
    int n_drafted;       /* VERIFY: guesses fed */
    int n_accepted;      /* VERIFY: of those, kept */
    int n_forced;        /* DECODE, VERIFY: tokens fed after the last one that the loop wrote
                          * itself (the reasoning budget's close): n_fed - 1 - n_drafted; not
                          * guesses */
    int pos;             /* positions it holds after the call */
    const tl_trace_token *tokens; /* emitted after this call */
    int n_tokens;
} tl_trace_seq;

typedef struct tl_trace_step {
    int version;         /* TL_TRACE_VERSION */
    uint64_t step;       /* 0, 1, ... per tracer */
    double t_s;          /* the call's start, seconds since the tracer began */
    double unix_s;       /* the record's time on the wall clock (seconds since 1970), to compare
                          * with a reader's clock */
    double wall_s;       /* the forward call's time */
    double emit_s;       /* sampling and emitting after it */
    int n_rows;          /* tokens in the call */
    const tl_trace_seq *seqs;
    int n_seqs;
    uint64_t weight_bytes; /* weights read (once per call) */
    uint64_t kv_bytes;   /* KV cache read (each sequence's positions, once) */
    uint64_t state_bytes; /* recurrent state read (each sequence's, once; 0 without such layers) */
    double gbps;         /* (weight_bytes + kv_bytes + state_bytes) / wall_s / 1e9 */
    int kv_used, kv_cached, kv_blocks; /* KV blocks held, cached-only, in the pool */
    uint64_t tokens_in;  /* prompt tokens evaluated so far */
    uint64_t tokens_cached; /* prompt tokens skipped as cached so far */
    uint64_t tokens_out; /* tokens emitted so far */
    double ttft_s;       /* the first emitted token's time since the tracer began (-1: none yet) */
    double tok_s;        /* tokens emitted per second of decoding so far */
} tl_trace_step;

typedef void (*tl_trace_fn)(const tl_trace_step *step, void *user);

/* Builds the records and hands them to fn: give one to tl_generate
 * (tl_gen_params.tracer), or drive it from a loop that makes forward calls
 * itself (the server's scheduler).
 * Per call: tl_tracer_call, tl_tracer_seq for each sequence in it, the
 * forward call, tl_tracer_called, tl_tracer_token for each token emitted,
 * tl_tracer_emit. Nothing is allocated once the buffers have grown. */
typedef struct tl_tracer tl_tracer;
int tl_tracer_new(const tl_ctx *ctx, tl_trace_fn fn, void *user, tl_tracer **out, tl_error *err);
void tl_tracer_free(tl_tracer *t);
void tl_tracer_call(tl_tracer *t);
/* n_drafted: the guesses among the n_fed tokens (a decode step's tokens after
 * the first that are not guesses are the loop's forced ones, tl_step_fed_forced). */
int tl_tracer_seq(tl_tracer *t, int seq, int id, int phase, int n_fed, int n_cached, int n_drafted);
void tl_tracer_called(tl_tracer *t, int n_rows);
/* A token sequence seq emitted (after tl_tracer_called); unknown sequences are ignored. */
int tl_tracer_token(tl_tracer *t, int seq, const tl_gen_event *ev);
void tl_tracer_emit(tl_tracer *t);
/* The record as one line of JSON (no newline), as docs/TRACE.md describes:
 * written to buf (NUL-terminated, cut at cap - 1); returns the length it
 * needs, as snprintf does. model gives the alternatives' text (may be NULL). */
size_t tl_trace_json(const tl_trace_step *st, const tl_model *model, char *buf, size_t cap);

/* Speculative decoding: guessed tokens verified in the same forward call,
 * kept only when the token sampled at their position equals them, so the
 * output never depends on it (docs/DESIGN.md). */
typedef enum tl_spec_mode {
    TL_SPEC_OFF = 0,
    TL_SPEC_AUTO = 1,  /* guess only while the measured cost says it pays */
    TL_SPEC_NGRAM = 2, /* prompt lookup whenever it finds a match */
    TL_SPEC_DRAFT = 3, /* a draft model's greedy guesses every step: the first always, more up to spec_max
                        * while they pay (measured costs; before any, while its top p >= 0.5) */
} tl_spec_mode;
/* "off", "auto", "ngram", "draft"; -1 for anything else. */
int tl_spec_parse(const char *name);
/* TL_OK if draft can guess for model: the same vocabulary (the count and
 * every token's bytes); TL_ERR_ARG with the first difference otherwise. */
int tl_spec_check_draft(const tl_model *model, const tl_model *draft, tl_error *err);

typedef struct tl_gen_params {
    int n_predict;             /* max new tokens; < 0: until the context is full */
    const char *const *stop;   /* stop strings */
    int n_stop;
    int n_top;                 /* alternatives reported per token (0..20) */
    int ignore_eog;            /* keep going past end-of-generation tokens (benchmarks) */
    tl_gen_callback on_token;
    void *user;
    int spec;                  /* tl_spec_mode (0: off) */
    int spec_max;              /* most guesses per step; 0: TL_STEP_MAX_FEED - 1 */
    tl_ctx *draft_ctx;         /* a draft model's context (tl_spec_check_draft passed): auto
                                * and draft guess with it; NULL: prompt lookup */
    int draft_seq;             /* the sequence of draft_ctx this loop owns (0 or tl_seq_open's) */
    tl_matcher *grammar;       /* the output follows this grammar (the loop masks each draw and
                                * advances it); NULL: free text */
    /* Reasoning ("thinking"): the output between think_open and think_close
     * (text markers; NULL: none). think_started: the prompt already opened it.
     * think_budget >= 0: after that many tokens of reasoning the loop writes
     * the close marker itself. A grammar applies after the reasoning when the
     * prompt opened it. */
    const char *think_open, *think_close;
    int think_started;
    int think_budget;
    const char *grammar_trigger; /* with grammar: free text until the output contains this
                                * string, then the grammar, fed from the trigger's first byte
                                * (a tool call under tool_choice auto); NULL: from the start */
    int grammar_trigger_start;   /* the trigger counts only at the output's start (after blanks):
                                * Llama 3's JSON call is the whole reply */
    tl_tracer *tracer;         /* tl_generate: one record per forward call (docs/TRACE.md), numbered
                                * and totalled across calls that share it; NULL: none */
    int trace_cached;          /* tl_generate: prompt tokens the context already held, for the trace */
    int special_text;          /* control tokens' text shows in the output (a tool-call marker
                                * such as Mistral's [TOOL_CALLS]); end-of-generation ones never */
} tl_gen_params;

typedef struct tl_gen_stats {
    int n_prompt;        /* tokens evaluated for the prompt (excluding cached ones) */
    int n_gen;           /* tokens generated */
    double prefill_s;    /* time to evaluate the prompt */
    double ttft_s;       /* from call to first token sampled */
    double decode_s;     /* time after the first token */
    int n_drafted;       /* speculative guesses verified */
    int n_accepted;      /* of those, kept */
    int n_reasoning;     /* generated tokens of reasoning (markers included) */
    int n_masks;         /* grammar masks computed or taken from the cache */
    double mask_median_us; /* their median time (within 19%) */
    double mask_s;       /* their total time */
    tl_stop_reason stop;
} tl_gen_stats;

/* The output side of one sequence's loop, for callers that run the model
 * themselves (the server): UTF-8 completion, stop strings held back and cut,
 * end-of-generation and the n_predict cap. params->on_token is not called. */
typedef struct tl_gen tl_gen;
int tl_gen_new(const tl_model *model, const tl_gen_params *params, tl_gen **out, tl_error *err);
void tl_gen_free(tl_gen *g);
/* Takes the token just sampled. Fills ev (token, chosen, top as given; text
 * now safe to emit, valid until the next call) and returns why generation
 * stops after this token, TL_STOP_NONE to go on. The caller checks the
 * context length itself (TL_STOP_CONTEXT). */
int tl_gen_push(tl_gen *g, int32_t token, const tl_token_prob *chosen, const tl_token_prob *top,
                int n_top, tl_gen_event *ev);
/* Once stopped (for any reason but a stop string): the text still held back
 * (an incomplete UTF-8 sequence, a possible stop string's start); *text valid
 * until the next call. Returns its length. */
size_t tl_gen_flush(tl_gen *g, const char **text);
/* Tokens pushed so far. */
int tl_gen_count(const tl_gen *g);
/* The index in params->stop of the stop string that ended generation, or -1. */
int tl_gen_stop_index(const tl_gen *g);

/* One sequence's token loop between forward calls, the same for tl_generate
 * and the server: what the sequence feeds next, sampling from the rows that
 * come back, the output rules above, the context limit (prompt + completion
 * never exceed n_ctx), and committing to the KV cache only the positions
 * that stay. params->on_token receives every emitted token. The sampler
 * stays the caller's; tokens already in the sequence (the prompt) should be
 * in its penalty history (tl_sampler_accept). */
typedef struct tl_step tl_step;
#define TL_STEP_MAX_FEED 17 /* tokens one step feeds at most */
int tl_step_new(tl_ctx *ctx, int seq, tl_sampler *smp, const tl_gen_params *params, tl_step **out,
                tl_error *err);
void tl_step_free(tl_step *st);
/* The tokens to put in the next tl_ctx_decode (with pending set), each with
 * a logits row, in this order: the last sampled token, then any guesses.
 * n_other: rows the other sequences put in the same call (0 alone), which
 * speculation weighs. 0 before the first tl_step_take or once stopped.
 * cap >= 1. */
int tl_step_feed(tl_step *st, int n_other, int32_t *tok, int cap);
/* Of the tokens the last tl_step_feed handed out, how many after the first
 * are the reasoning budget's close: written by the loop and certain to stay,
 * not guesses (a trace records them as forced, not as drafted). */
int tl_step_fed_forced(const tl_step *st);
/* Takes the logits rows of the tokens fed (or, the first time, the one row of
 * the prompt's last token). Samples, emits, commits what stays; returns why
 * generation stopped (TL_STOP_NONE: go on), or a negative status. */
int tl_step_take(tl_step *st, const float *const *rows, int n_rows, tl_error *err);
/* Once stopped: the text still held back (tl_gen_flush). */
size_t tl_step_flush(tl_step *st, const char **text);
int tl_step_count(const tl_step *st); /* tokens emitted */
int tl_step_stop_index(const tl_step *st); /* the stop string that ended it (index), or -1 */
/* Alternatives reported per token from now on (as tl_gen_params.n_top): a
 * server computes them only while someone watches the loop. */
void tl_step_set_top(tl_step *st, int n_top);
int tl_step_reasoning_count(const tl_step *st); /* of those, reasoning (markers included) */
/* Grammar masks so far: how many, their median time (within 19%) and total. */
void tl_step_mask_stats(const tl_step *st, int *n, double *median_us, double *total_s);
/* Speculative guesses verified and kept so far. */
void tl_step_spec_stats(const tl_step *st, int *drafted, int *accepted);

/* Appends prompt tokens to the context, then samples and appends until a stop
 * condition. Text goes to the callback as it becomes final. */
int tl_generate(tl_ctx *ctx, tl_sampler *sampler, const int32_t *prompt, size_t n_prompt,
                const tl_gen_params *params, tl_gen_stats *stats, tl_error *err);

/* ---- chat templates ------------------------------------------------------------ */

/* Renders a Jinja chat template the way Hugging Face transformers does
 * (apply_chat_template: trim_blocks, lstrip_blocks, sandboxed). tmpl NULL:
 * the model's own template. messages_json: a list of {"role","content",...}
 * or an object {"messages": [...], other variables such as "tools"}. bos_token
 * and eos_token come from model (may be NULL: then undefined). *out is
 * NUL-terminated; free with tl_free. A template raising an exception or using
 * a construct the renderer lacks fails with the message and its position. */
int tl_chat_apply(const tl_model *model, const char *tmpl, const char *messages_json, size_t len,
                  int add_generation_prompt, char **out, size_t *out_len, tl_error *err);

/* Whether a prompt rendered from the model's template needs BOS prepended
 * when tokenized: the model asks for BOS and the template did not already
 * write it (one rule for the CLI and the server). */
int tl_chat_add_bos(const tl_model *model, const char *rendered);

/* Reasoning ("thinking"): the markers a reply writes around its reasoning,
 * stated once for the CLI, the server and the loop (tl_gen_params.think_open
 * and think_close). Sets *open and *close (static strings); returns whether
 * tmpl (NULL: none) speaks of them, i.e. its model reasons. */
int tl_chat_think_markers(const char *tmpl, const char **open, const char **close);
/* Whether a rendered prompt ends (trailing blanks aside) with the open
 * marker: its generation prompt opened the reasoning (tl_gen_params.think_started). */
int tl_chat_think_started(const char *rendered, size_t len);
/* A tool call that must open the reply (Llama 3's: the whole reply is the
 * call) may come after Llama 3's <|python_tag|> and blanks. Returns how many
 * bytes at text's start are such a lead; *partial (may be NULL): text is a
 * proper prefix of the tag, which more text may complete. */
size_t tl_chat_call_lead(const char *text, size_t n, int *partial);

/* Harmony, gpt-oss's format (src/chat/harmony.c): the reply is a run of
 * messages on channels; `analysis` is reasoning, `final` (and `commentary`
 * without a recipient) content, a message to=functions.NAME a tool call
 * whose body is its JSON arguments. tl_chat_harmony: whether tmpl (may be
 * NULL) writes harmony's headers. The markers that open and close the
 * reasoning, for the loop's count of reasoning tokens (tl_gen_params). */
int tl_chat_harmony(const char *tmpl);
#define TL_HARMONY_THINK_OPEN "<|channel|>analysis<|message|>"
#define TL_HARMONY_THINK_CLOSE "<|end|>"
enum { TL_HARMONY_REASONING = 1, TL_HARMONY_CONTENT = 2, TL_HARMONY_CALL = 3 };
/* One piece of the reply: kind TL_HARMONY_*; name: a call's function (else
 * NULL); text: reasoning or content as it streams, or a call's whole
 * arguments. Returns 0 to go on; anything else stops tl_harmony_feed, which
 * returns it. */
typedef int (*tl_harmony_fn)(void *user, int kind, const char *name, const char *text, size_t n);
/* A reply's parser: text in as it comes (split anywhere, even inside a
 * control token's text), pieces out as soon as they are sure; last: the
 * reply ended (held text goes out; a call cut short by <|call|>, an
 * end-of-generation token that shows no text, goes out here). A reply with
 * no headers at all is content. */
typedef struct tl_harmony tl_harmony;
int tl_harmony_new(tl_harmony **out, tl_error *err);
void tl_harmony_free(tl_harmony *h);
int tl_harmony_feed(tl_harmony *h, const char *text, size_t n, int last, tl_harmony_fn fn, void *user);

typedef struct tl_chat_msg {
    const char *role, *content;
} tl_chat_msg;

/* A template compiled once (lexed and parsed), rendered many times: read
 * only while rendering, so threads may share one. tmpl NULL: the model's own;
 * BOS/EOS text comes from model (may be NULL). A syntax error fails here with
 * its line and column. */
typedef struct tl_chat_template tl_chat_template;
int tl_chat_template_new(const tl_model *model, const char *tmpl, tl_chat_template **out, tl_error *err);
void tl_chat_template_free(tl_chat_template *t);
/* vars_json as for tl_chat_apply. */
int tl_chat_template_render(const tl_chat_template *t, const char *vars_json, size_t len, int add_generation_prompt,
                            char **out, size_t *out_len, tl_error *err);
/* Plain messages as structures: no JSON between caller and renderer. */
int tl_chat_template_render_msgs(const tl_chat_template *t, const tl_chat_msg *msgs, size_t n_msgs,
                                 int add_generation_prompt, char **out, size_t *out_len, tl_error *err);

/* The same for an array of plain messages (compiles the template each call). */
int tl_chat_apply_msgs(const tl_model *model, const char *tmpl, const tl_chat_msg *msgs,
                       size_t n_msgs, int add_generation_prompt, char **out, size_t *out_len,
                       tl_error *err);

#ifdef __cplusplus
}
#endif
#endif
