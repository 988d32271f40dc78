/* sched: the scheduler thread. It owns the tl_ctx (weights, paged KV, prefix
 * cache), admits queued requests into sequences, and runs every live sequence
 * in one tl_ctx_decode per step (decode tokens first, then chunked prefill).
 * A generating sequence's loop is a tl_step, the same as the CLI's: it says
 * what the sequence feeds, samples from its rows and commits its KV; the
 * scheduler turns what it emits into events on the request. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop.h"
#include "server.h"
#include "tools.h"

/* Logits rows one step may keep (tl_ctx_params.n_logits_max): bounds the
 * memory of echo-with-logprobs prefill. */
#define SCHED_MAX_ROWS 64
/* Embedding inputs one forward call may run side by side, each its own
 * sequence (tl_ctx_embed_batch), and the sequences the context keeps for
 * them beside the slots'. */
#define SCHED_EMB_TEXTS 64
#define SCHED_EMB_SEQS 32
/* How long an idle scheduler sleeps before looking for cancellations. */
#define SCHED_IDLE_NS 50000000L
#define PIECE_CAP 256

typedef struct slot {
    srv_sched *owner;
    srv_req *r;
    int seq;
    tl_sampler *smp;
    tl_step *step;      /* the token loop (feeds nothing until the prompt's last row) */
    tl_matcher *matcher; /* the request's grammar, followed (NULL: free text) */
    int dseq;           /* its sequence in the draft context (0: none) */
    int n_fed;          /* prompt tokens in the sequence (reused ones included) */
    int n_take;         /* prompt tokens in the current step's batch */
    int prompt_lp;      /* echo with logprobs: a row for every prompt token */
    int need_blocks;    /* blocks the sequence may hold at its longest */
    double t_last;      /* when the last token was sampled (inter-token latency) */
    int reused;         /* prompt tokens the prefix cache gave it (the trace reports them with the next chunk) */
    int cut;            /* a prompt chunk ends here: the boundary whose state is kept for other
                         * conversations (the end of the system prompt; 0: none) */
    int n_step;         /* tokens its step put in the current batch */
    uint64_t order;     /* admission order: prefill goes oldest first */
} slot;

/* What a kept logits row is for. */
typedef struct row_use {
    int slot;
    int pos; /* prompt position of the token whose logits these are */
} row_use;

struct srv_sched {
    const tl_model *m;
    srv_metrics *mx;
    tl_ctx *ctx;
    tl_ctx *dctx; /* the draft model's (--draft), on ctx's threads, a sequence per slot */
    int n_ctx, n_batch, chunk, np, n_vocab, max_queue, max_rows, spec;
    int kv_blocks;       /* blocks in the KV pool: a request that needs more can never run */
    tl_kv_stats kv0;         /* the pool as made (its size, block bytes, types) */
    int has_disk;            /* --cache-dir */
    const char *kv_why;      /* what set the pool's size, for refusals */
    tl_vocab_trie *trie; /* the vocabulary's byte trie for grammars, made at start */
    srv_loop *loop;      /* the live loop's readers (o->loop) */
    tl_tracer *tracer;   /* records for them, made only while someone watches */
    int tracing;         /* this step is traced */
    char *tjson;         /* a record's JSON line, reused */
    size_t tjson_cap;

    pthread_t th;
    int th_started;
    pthread_mutex_t mu; /* guards everything below up to the slots */
    pthread_cond_t cv;
    int stop, draining;
    srv_req **wait; /* FIFO ring */
    int w_head, w_len, w_cap;
    srv_req **eq;   /* embedding requests (FIFO ring, w_cap too), served between steps */
    int e_head, e_len;
    int n_running;

    /* scheduler thread only */
    slot *slots;
    uint64_t next_order;
    int32_t *b_tok, *b_seq;
    uint8_t *b_lg;
    row_use *rows;
    int *order_idx;
    const int32_t **e_tok; /* [SCHED_EMB_TEXTS] the texts of one embedding call */
    size_t *e_n;
    float **e_out;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int blocks_for(int positions) {
    return (positions + TL_KV_BLOCK - 1) / TL_KV_BLOCK;
}

/* ---- events ------------------------------------------------------------------ */

static char *dup_text(const char *p, size_t n) {
    char *t = malloc(n + 1);
    if (!t) return NULL;
    if (n) memcpy(t, p, n);
    t[n] = 0;
    return t;
}

/* srv_req_push marks the request finished even when it runs out of memory
 * for a final event, so the reader always learns the outcome. */
static void push_event(srv_req *r, srv_event *ev) {
    (void)srv_req_push(r, ev);
}

/* status: 400 when the request itself can never run (a reply not yet begun
 * says so, and no proxy retries it); 0 for the rest (503). */
static void push_error(srv_req *r, int status, const char *msg) {
    srv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SRV_EV_ERROR;
    ev.status = status;
    ev.text = dup_text(msg, strlen(msg));
    ev.text_len = ev.text ? strlen(msg) : 0;
    push_event(r, &ev);
}

/* ---- slots -------------------------------------------------------------------- */

static void slot_clear(srv_sched *s, slot *sl) {
    if (sl->seq > 0) tl_seq_close(s->ctx, sl->seq);
    if (sl->dseq > 0) tl_seq_close(s->dctx, sl->dseq);
    tl_step_free(sl->step);
    tl_matcher_free(sl->matcher);
    tl_sampler_free(sl->smp);
    srv_req *r = sl->r;
    memset(sl, 0, sizeof *sl);
    sl->owner = s;
    if (r) {
        srv_req_release(r);
        pthread_mutex_lock(&s->mu);
        s->n_running--;
        pthread_mutex_unlock(&s->mu);
    }
}

static void slot_fail_status(srv_sched *s, slot *sl, int status, const char *msg) {
    push_error(sl->r, status, msg);
    slot_clear(s, sl);
}

static void slot_fail(srv_sched *s, slot *sl, const char *msg) {
    slot_fail_status(s, sl, 0, msg);
}

/* An engine error that the request's own content causes, so that it would
 * fail again on any replica: its grammar asks more than the matcher follows,
 * or its parameters are refused. */
static int request_status(int rc) {
    return rc == TL_ERR_ARG || rc == TL_ERR_UNSUPPORTED ? 400 : 0;
}

static void slot_done(srv_sched *s, slot *sl, int reason) {
    srv_req *r = sl->r;
    srv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SRV_EV_DONE;
    const char *tail = "";
    size_t n = 0;
    if (sl->step && reason != TL_STOP_STRING) n = tl_step_flush(sl->step, &tail);
    if (n && s->tracing) { /* the held-back text: the trace's texts join to the reply */
        tl_gen_event te = {.token = -1, .text = tail, .text_len = n};
        tl_tracer_token(s->tracer, sl->seq, &te);
    }
    ev.text = dup_text(tail, n);
    ev.text_len = ev.text ? n : 0;
    ev.finish_reason = (reason == TL_STOP_EOG || reason == TL_STOP_STRING) ? "stop" : "length";
    r->prompt_tokens = r->n_prompt;
    int n_gen = sl->step ? tl_step_count(sl->step) : 0;
    r->completion_tokens = n_gen;
    r->stop_index = sl->step && reason == TL_STOP_STRING ? tl_step_stop_index(sl->step) : -1;
    if (sl->step) tl_step_spec_stats(sl->step, &r->spec_drafted, &r->spec_accepted);
    r->reasoning_tokens = sl->step ? tl_step_reasoning_count(sl->step) : 0;
    srv_metrics_tokens(s->mx, r->n_prompt, n_gen, r->cached_tokens);
    srv_metrics_spec(s->mx, r->spec_drafted, r->spec_accepted);
    push_event(r, &ev);
    slot_clear(s, sl);
}

/* Blocks the running sequences may still take before they end. */
static int blocks_reserved(srv_sched *s) {
    int n = 0;
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r) continue;
        int held = blocks_for(tl_seq_len(s->ctx, sl->seq));
        if (sl->need_blocks > held) n += sl->need_blocks - held;
    }
    return n;
}

/* A token the slot's step emitted: an event on the request. */
static int slot_token(const tl_gen_event *ge, void *user) {
    slot *sl = user;
    srv_sched *s = sl->owner;
    srv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SRV_EV_TOKEN;
    ev.token = ge->token;
    ev.chosen = ge->chosen;
    ev.n_top = ge->n_top < SRV_MAX_TOP ? ge->n_top : SRV_MAX_TOP;
    if (ev.n_top > 0) memcpy(ev.top, ge->top, (size_t)ev.n_top * sizeof *ev.top);
    double t = now_s();
    if (tl_step_count(sl->step) == 1) {
        srv_metrics_ttft(s->mx, t - sl->r->t_arrival);
        sl->r->t_first = t;
    }
    else srv_metrics_itl(s->mx, t - sl->t_last);
    sl->t_last = t;
    if (s->tracing) tl_tracer_token(s->tracer, sl->seq, ge);
    ev.text = dup_text(ge->text ? ge->text : "", ge->text ? ge->text_len : 0);
    ev.text_len = ev.text && ge->text ? ge->text_len : 0;
    ev.reasoning = ge->reasoning;
    push_event(sl->r, &ev);
    return 0;
}

static int slot_setup(srv_sched *s, slot *sl, srv_req *r, tl_error *err) {
    /* the sampler and matcher srv_sched_submit made, if it could */
    sl->smp = r->smp;
    sl->matcher = r->matcher;
    r->smp = NULL;
    r->matcher = NULL;
    int rc = sl->smp ? TL_OK : tl_sampler_new(&r->sp, s->n_vocab, &sl->smp, err);
    if (rc) return rc;
    /* the prompt is in the penalty history, as with the CLI and llama.cpp */
    for (int i = 0; i < r->n_prompt; i++) tl_sampler_accept(sl->smp, r->prompt[i]);
    tl_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.n_predict = r->max_tokens;
    gp.stop = (const char *const *)r->stop;
    gp.n_stop = r->n_stop;
    gp.n_top = r->logprobs ? r->top_logprobs : 0;
    gp.on_token = slot_token;
    gp.user = sl;
    gp.spec = s->spec;
    gp.special_text = r->tool_mode && tools_special_text(r->tool_fmt);
    if (r->think) {
        gp.think_open = r->think_open; /* the template's (validate.c) */
        gp.think_close = r->think_close;
        gp.think_started = r->think_started;
        gp.think_budget = r->think_budget;
    } else if (r->harmony) { /* the analysis message, counted as reasoning; no budget */
        gp.think_open = TL_HARMONY_THINK_OPEN;
        gp.think_close = TL_HARMONY_THINK_CLOSE;
        gp.think_budget = -1;
    }
    if (r->grammar) {
        if (!s->trie && (rc = tl_vocab_trie_new(s->m, &s->trie, err))) return rc;
        if (!sl->matcher && (rc = tl_matcher_new(r->grammar, s->trie, &sl->matcher, err))) return rc;
        gp.grammar = sl->matcher;
        if (r->grammar_lazy) {
            gp.grammar_trigger = tools_trigger(r->tool_fmt);
            gp.grammar_trigger_start = tools_at_start(r->tool_fmt);
        }
    }
    if (s->dctx && tl_seq_open(s->dctx, &sl->dseq, err) == 0) { /* without one it guesses from the text */
        gp.draft_ctx = s->dctx;
        gp.draft_seq = sl->dseq;
    }
    return tl_step_new(s->ctx, sl->seq, sl->smp, &gp, &sl->step, err);
}

static void emit_first_prompt_token(srv_sched *s, srv_req *r) {
    char piece[PIECE_CAP];
    srv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SRV_EV_PROMPT;
    ev.token = r->prompt[0];
    size_t n = tl_token_piece(s->m, r->prompt[0], 1, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    ev.text = dup_text(piece, n);
    ev.text_len = ev.text ? n : 0;
    push_event(r, &ev);
}

/* Tries to start the request at the queue's head in a free slot. Returns 1 if
 * admitted (or failed and answered), 0 if it must wait for KV blocks. */
static int admit_one(srv_sched *s, slot *sl, srv_req *r) {
    tl_error err = {0};
    int seq = 0;
    if (tl_seq_open(s->ctx, &seq, &err) != 0) return 0;
    int prompt_lp = r->echo && r->logprobs;
    size_t max_reuse = prompt_lp ? 0 : (size_t)(r->n_prompt - 1);
    int reused = tl_seq_reuse_prefix(s->ctx, seq, r->prompt, (size_t)r->n_prompt, max_reuse);
    if (reused < 0) reused = 0;
    int target = r->max_tokens < 0 ? s->n_ctx : r->n_prompt + r->max_tokens;
    if (target > s->n_ctx) target = s->n_ctx;
    int need = blocks_for(target);
    tl_kv_stats kv;
    tl_ctx_kv_stats(s->ctx, &kv);
    int have = kv.n_free - blocks_reserved(s);
    if (need - reused / TL_KV_BLOCK > have) {
        tl_seq_close(s->ctx, seq);
        /* With nothing else running the blocks will never come: say so
         * (srv_sched_submit refuses such requests first; this is the guard). */
        if (s->n_running > 0) return 0;
        push_error(r, 400, "the request needs more KV cache than --kv-mem provides");
        srv_req_release(r);
        return 1;
    }
    memset(sl, 0, sizeof *sl);
    sl->owner = s;
    sl->r = r;
    sl->seq = seq;
    sl->n_fed = reused;
    sl->reused = reused;
    sl->prompt_lp = prompt_lp;
    sl->need_blocks = need;
    sl->order = s->next_order++;
    r->cached_tokens = reused;
    /* a model with a state resumes cached prompts where it was kept: at the
     * end of this prompt, and of its system prompt, which other
     * conversations share (a chunk is cut there) */
    tl_seq_keep_state_at(s->ctx, seq, r->n_prompt);
    if (r->n_shared / TL_KV_BLOCK * TL_KV_BLOCK > reused) {
        const int b = tl_seq_keep_state_at(s->ctx, seq, r->n_shared);
        sl->cut = b > reused ? b : 0;
    }
    pthread_mutex_lock(&s->mu);
    s->n_running++;
    pthread_mutex_unlock(&s->mu);
    int rc = slot_setup(s, sl, r, &err);
    if (rc != 0) {
        slot_fail_status(s, sl, request_status(rc), err.msg[0] ? err.msg : "could not set up sampling");
        return 1;
    }
    if (prompt_lp) emit_first_prompt_token(s, r);
    return 1;
}

static srv_req *queue_pop(srv_sched *s) {
    srv_req *r = s->wait[s->w_head];
    s->w_head = (s->w_head + 1) % s->w_cap;
    s->w_len--;
    return r;
}

/* Cancelled waiting requests leave the queue; the rest keep their order. */
static void drop_cancelled_waiting(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->w_len;
    for (int i = 0; i < n; i++) {
        srv_req *r = queue_pop(s);
        if (atomic_load(&r->cancelled)) {
            push_error(r, 0, "cancelled");
            srv_req_release(r);
        } else {
            s->wait[(s->w_head + s->w_len) % s->w_cap] = r;
            s->w_len++;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* Whether r should wait for a running request that is still computing
 * blocks r could reuse: requests that arrive together with the same long
 * prefix then compute it once, not once each. Those blocks are registered
 * within a few steps (the running one prefills oldest first). */
static int wait_for_shared_prefix(const srv_sched *s, const srv_req *r) {
    if (r->echo && r->logprobs) return 0; /* computes its whole prompt anyway */
    for (int i = 0; i < s->np; i++) {
        const slot *sl = &s->slots[i];
        if (!sl->r || sl->n_fed >= sl->r->n_prompt) continue;
        const srv_req *o = sl->r;
        int n = r->n_prompt - 1 < o->n_prompt ? r->n_prompt - 1 : o->n_prompt, k = 0;
        while (k < n && r->prompt[k] == o->prompt[k]) k++;
        /* a whole block in common that the other has not written yet */
        if (k / TL_KV_BLOCK > sl->n_fed / TL_KV_BLOCK) return 1;
    }
    return 0;
}

static void admit(srv_sched *s) {
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (sl->r) continue;
        /* Only this thread pops, so the head stays put while admit_one runs;
         * it leaves the queue only once started or answered (FIFO: nobody
         * overtakes a request that waits for blocks). */
        pthread_mutex_lock(&s->mu);
        srv_req *r = s->w_len ? s->wait[s->w_head] : NULL;
        pthread_mutex_unlock(&s->mu);
        if (!r || wait_for_shared_prefix(s, r) || !admit_one(s, sl, r)) return;
        pthread_mutex_lock(&s->mu);
        (void)queue_pop(s);
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---- embeddings ---------------------------------------------------------------- */

/* The embedding request at the queue's head leaves it (answered before). */
static void embed_pop(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    srv_req *r = s->eq[s->e_head];
    s->e_head = (s->e_head + 1) % s->w_cap;
    s->e_len--;
    pthread_mutex_unlock(&s->mu);
    srv_req_release(r);
}

/* The head request's reply, now that every input is embedded. */
static void embed_finish(srv_sched *s, srv_req *r) {
    int total = 0;
    for (int k = 0; k < r->emb->n; k++) total += r->emb->n_tok[k];
    r->prompt_tokens = total;
    srv_metrics_tokens(s->mx, total, 0, 0);
    srv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SRV_EV_DONE;
    ev.finish_reason = "stop";
    ev.text = dup_text("", 0);
    push_event(r, &ev);
    embed_pop(s);
}

/* The inputs of the next call, in queue order from the head request's next
 * one: those of the requests that pool and normalise as it does, up to
 * SCHED_EMB_TEXTS and n_batch tokens, so the decoding sequences wait one
 * forward call at most (a first input longer than that runs alone, in its
 * chunks); max 1: the head's next input alone. Returns the inputs taken. */
static int embed_gather(srv_sched *s, srv_req *head, int max) {
    const srv_embed *h = head->emb;
    int k = 0;
    size_t total = 0;
    pthread_mutex_lock(&s->mu);
    for (int q = 0; q < s->e_len && k < max; q++) {
        const srv_req *r = s->eq[(s->e_head + q) % s->w_cap];
        const srv_embed *em = r->emb;
        if (q && (atomic_load(&r->cancelled) || em->pooling != h->pooling || em->normalize != h->normalize ||
                  em->d != h->d))
            break;
        int i = em->done;
        for (; i < em->n && k < max; i++, k++) {
            if (k && total + (size_t)em->n_tok[i] > (size_t)s->n_batch) break;
            total += (size_t)em->n_tok[i];
            s->e_tok[k] = em->tok[i];
            s->e_n[k] = (size_t)em->n_tok[i];
            s->e_out[k] = em->out + em->off[i];
        }
        if (i < em->n) break;
    }
    pthread_mutex_unlock(&s->mu);
    return k;
}

/* Embeds the next inputs of the queued embedding requests together in one
 * tl_ctx_embed_batch between steps (the context is this thread's alone; a
 * text's vector is the same bits whichever others share its call). Returns
 * whether there is more to do. */
static int serve_embed(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    srv_req *r = s->e_len ? s->eq[s->e_head] : NULL;
    pthread_mutex_unlock(&s->mu);
    if (!r) return 0;
    if (atomic_load(&r->cancelled)) {
        push_error(r, 0, "cancelled");
        embed_pop(s);
        return 1;
    }
    srv_embed *em = r->emb;
    tl_error err = {0};
    int k = embed_gather(s, r, SCHED_EMB_TEXTS);
    int st = tl_ctx_embed_batch(s->ctx, s->e_tok, s->e_n, k, em->pooling, em->normalize, s->e_out, &err);
    if (st && k > 1) {
        /* the head's input alone, so that a failure is its request's */
        k = embed_gather(s, r, 1);
        st = tl_ctx_embed_batch(s->ctx, s->e_tok, s->e_n, k, em->pooling, em->normalize, s->e_out, &err);
    }
    if (st) {
        /* blocks the running sequences hold now come back as they end */
        if (st == TL_ERR_CONTEXT_FULL && s->n_running > 0) return 0;
        push_error(r, request_status(st), err.msg[0] ? err.msg : "embedding failed");
        embed_pop(s);
        return 1;
    }
    /* the inputs taken were the head requests' next, in order */
    for (int left = k; left > 0;) {
        pthread_mutex_lock(&s->mu);
        srv_req *q = s->eq[s->e_head];
        pthread_mutex_unlock(&s->mu);
        const int take = q->emb->n - q->emb->done < left ? q->emb->n - q->emb->done : left;
        q->emb->done += take;
        left -= take;
        if (q->emb->done == q->emb->n) embed_finish(s, q);
    }
    return 1;
}

/* ---- one step ------------------------------------------------------------------ */

static void batch_add(srv_sched *s, int *n, int32_t tok, int seq, int keep, int *n_rows, int si,
                      int pos) {
    s->b_tok[*n] = tok;
    s->b_seq[*n] = seq;
    s->b_lg[*n] = (uint8_t)(keep != 0);
    if (keep) {
        s->rows[*n_rows].slot = si;
        s->rows[*n_rows].pos = pos;
        (*n_rows)++;
    }
    (*n)++;
}

/* Slots still prefilling, oldest first. */
static int prefill_order(srv_sched *s, int *idx) {
    int k = 0;
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r || sl->n_fed >= sl->r->n_prompt) continue;
        int j = k++;
        while (j > 0 && s->slots[idx[j - 1]].order > sl->order) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    return k;
}

static int build_batch(srv_sched *s, int *n_rows_out) {
    int n = 0, n_rows = 0;
    /* Only a -c smaller than -np makes the call too small for every decode
     * token; the rest then wait a step. */
    int32_t feed[TL_STEP_MAX_FEED];
    int n_gen = 0; /* generating sequences: each feeds at least a row */
    for (int i = 0; i < s->np; i++) n_gen += s->slots[i].r && s->slots[i].n_fed >= s->slots[i].r->n_prompt;
    /* every slot starts the step with nothing in the batch (the loop below
     * may stop before it reaches them all) */
    for (int i = 0; i < s->np; i++) s->slots[i].n_step = s->slots[i].n_take = 0;
    for (int i = 0; i < s->np && n < s->n_batch && n_rows < s->max_rows; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r || !sl->step || sl->n_fed < sl->r->n_prompt) continue; /* still prefilling */
        int room = s->n_batch - n < s->max_rows - n_rows ? s->n_batch - n : s->max_rows - n_rows;
        /* the call's other rows: those already in it (guesses included)
         * and a row of each generating sequence still to come */
        int others = n + (n_gen - 1 > 0 ? n_gen - 1 : 0);
        n_gen--;
        int k = tl_step_feed(sl->step, others, feed, room < TL_STEP_MAX_FEED ? room : TL_STEP_MAX_FEED);
        sl->n_step = k;
        for (int t = 0; t < k; t++) batch_add(s, &n, feed[t], sl->seq, 1, &n_rows, i, -1);
    }
    int budget = s->chunk < s->n_batch - n ? s->chunk : s->n_batch - n;
    int *idx = s->order_idx;
    int k = prefill_order(s, idx);
    for (int q = 0; q < k && budget > 0; q++) {
        slot *sl = &s->slots[idx[q]];
        srv_req *r = sl->r;
        int take = r->n_prompt - sl->n_fed;
        if (take > budget) take = budget;
        if (sl->cut > sl->n_fed && sl->n_fed + take > sl->cut) take = sl->cut - sl->n_fed;
        if (sl->prompt_lp) {
            int room = s->max_rows - n_rows;
            if (take > room) take = room;
        } else if (sl->n_fed + take == r->n_prompt && n_rows >= s->max_rows) {
            take--; /* the last token needs a row: leave it for the next step */
        }
        sl->n_take = take;
        for (int t = 0; t < take; t++) {
            int pos = sl->n_fed + t;
            int keep = sl->prompt_lp || pos == r->n_prompt - 1;
            batch_add(s, &n, r->prompt[pos], sl->seq, keep, &n_rows, idx[q], pos);
        }
        budget -= take;
    }
    *n_rows_out = n_rows;
    return n;
}

/* A prompt row of an echo request: the entry of the next prompt token. */
static void emit_prompt_row(srv_sched *s, slot *sl, const float *lg, int pos) {
    srv_req *r = sl->r;
    int32_t tok = r->prompt[pos + 1];
    char piece[PIECE_CAP];
    srv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SRV_EV_PROMPT;
    ev.token = tok;
    ev.has_logprob = 1;
    ev.n_top = tl_sampler_report(sl->smp, lg, tok, &ev.chosen, ev.top, r->top_logprobs);
    size_t n = tl_token_piece(s->m, tok, 1, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    ev.text = dup_text(piece, n);
    ev.text_len = ev.text ? n : 0;
    push_event(r, &ev);
}

/* Gives a generating slot its rows; finishes the request if it stops. */
static void step_rows(srv_sched *s, slot *sl, const float *const *rows, int n) {
    tl_error err = {0};
    /* the live page shows 5 alternatives of each token: computed only while
     * someone watches (a pass over the vocabulary per token otherwise) */
    const int top = sl->r->logprobs ? sl->r->top_logprobs : 0;
    tl_step_set_top(sl->step, s->tracing && top < 5 ? 5 : top);
    int stop = tl_step_take(sl->step, rows, n, &err);
    /* only a grammar past the matcher's limits is the request's own doing
     * here; TL_ERR_ARG from a step would be the engine's inconsistency */
    if (stop < 0)
        slot_fail_status(s, sl, stop == TL_ERR_UNSUPPORTED ? 400 : 0, err.msg[0] ? err.msg : "sampling failed");
    else if (stop != TL_STOP_NONE) slot_done(s, sl, stop);
}

static void fail_batch(srv_sched *s, int n, const char *msg) {
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r) continue;
        for (int t = 0; t < n; t++) {
            if (s->b_seq[t] == sl->seq) {
                slot_fail(s, sl, msg);
                break;
            }
        }
    }
}

/* The call's sequences, for the trace: a prompt chunk, or a step's tokens. */
static void trace_call(srv_sched *s) {
    tl_tracer_call(s->tracer);
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r) continue;
        const int id = (int)sl->order + 1;
        if (sl->n_take > 0) { /* the cached prefix is reported with the first chunk after it */
            tl_tracer_seq(s->tracer, sl->seq, id, TL_PHASE_PREFILL, sl->n_take, sl->n_fed == sl->reused ? sl->reused : 0,
                          0);
        } else if (sl->n_step > 0) {
            const int guesses = sl->n_step - 1 - tl_step_fed_forced(sl->step);
            tl_tracer_seq(s->tracer, sl->seq, id, guesses > 0 ? TL_PHASE_VERIFY : TL_PHASE_DECODE, sl->n_step, 0,
                          guesses);
        }
    }
}

static void run_batch(srv_sched *s, int n, int n_rows) {
    tl_batch b = {.n = n, .token = s->b_tok, .seq = s->b_seq, .logits = s->b_lg, .pending = 1};
    tl_error err = {0};
    if (s->tracing) trace_call(s);
    if (tl_ctx_decode(s->ctx, &b, &err) != 0) {
        fail_batch(s, n, err.msg[0] ? err.msg : "decode failed");
        return;
    }
    if (s->tracing) tl_tracer_called(s->tracer, n);
    /* Prompt tokens stay whole; a generating slot's step commits its own. */
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r || !sl->n_take) continue;
        if (tl_seq_commit(s->ctx, sl->seq, sl->n_take, &err) != 0) {
            slot_fail(s, sl, err.msg);
            continue;
        }
        sl->n_fed += sl->n_take;
    }
    const float *rows[TL_STEP_MAX_FEED];
    for (int k = 0; k < n_rows;) {
        const int si = s->rows[k].slot, pos = s->rows[k].pos;
        slot *sl = &s->slots[si];
        int run = 1; /* a step's rows come together */
        while (pos < 0 && k + run < n_rows && s->rows[k + run].slot == si && run < TL_STEP_MAX_FEED) run++;
        if (!sl->r) { /* finished by an earlier row */
            k += run;
            continue;
        }
        for (int j = 0; j < run; j++) rows[j] = tl_ctx_batch_logits(s->ctx, k + j);
        k += run;
        if (!rows[0] || !rows[run - 1]) {
            slot_fail(s, sl, "missing logits row");
            continue;
        }
        if (pos >= 0 && pos < sl->r->n_prompt - 1) {
            emit_prompt_row(s, sl, rows[0], pos);
            continue;
        }
        step_rows(s, sl, rows, run); /* the prompt's last row starts the loop */
    }
    if (s->tracing) tl_tracer_emit(s->tracer);
}

/* A record for the live loop's readers. */
static void sched_trace(const tl_trace_step *st, void *user) {
    srv_sched *s = user;
    size_t n = tl_trace_json(st, s->m, s->tjson, s->tjson_cap);
    if (n >= s->tjson_cap) {
        char *p = realloc(s->tjson, n + 1);
        if (!p) {
            srv_loop_publish(s->loop, NULL, 0); /* its readers learn of the record they lost */
            return;
        }
        s->tjson = p;
        s->tjson_cap = n + 1;
        tl_trace_json(st, s->m, s->tjson, s->tjson_cap);
    }
    srv_loop_publish(s->loop, s->tjson, n);
}

static void drop_cancelled_running(srv_sched *s) {
    for (int i = 0; i < s->np; i++) {
        slot *sl = &s->slots[i];
        if (sl->r && atomic_load(&sl->r->cancelled)) slot_fail(s, sl, "cancelled");
    }
}

static void publish_state(srv_sched *s) {
    tl_kv_stats kv;
    tl_ctx_kv_stats(s->ctx, &kv);
    pthread_mutex_lock(&s->mu);
    int w = s->w_len, run = s->n_running;
    pthread_mutex_unlock(&s->mu);
    srv_metrics_state(s->mx, w, run, &kv);
    if (s->has_disk) {
        tl_disk_stats d;
        tl_ctx_disk_stats(s->ctx, &d);
        srv_metrics_disk(s->mx, &d);
    }
}

static void idle_wait(srv_sched *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SCHED_IDLE_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    if (!s->stop && s->w_len == 0 && s->e_len == 0) pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    pthread_mutex_unlock(&s->mu);
}

static void shutdown_all(srv_sched *s) {
    for (int i = 0; i < s->np; i++)
        if (s->slots[i].r) slot_fail(s, &s->slots[i], "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    while (s->w_len) {
        srv_req *r = queue_pop(s);
        push_error(r, 0, "the server is shutting down");
        srv_req_release(r);
    }
    while (s->e_len) {
        srv_req *r = s->eq[s->e_head];
        s->e_head = (s->e_head + 1) % s->w_cap;
        s->e_len--;
        push_error(r, 0, "the server is shutting down");
        srv_req_release(r);
    }
    pthread_mutex_unlock(&s->mu);
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        drop_cancelled_running(s);
        drop_cancelled_waiting(s);
        admit(s);
        int n_rows = 0;
        int n = build_batch(s, &n_rows);
        s->tracing = s->tracer && srv_loop_watched(s->loop);
        if (n > 0) run_batch(s, n, n_rows);
        const int more = serve_embed(s);
        publish_state(s);
        if (n == 0 && !more) idle_wait(s);
    }
    shutdown_all(s);
    publish_state(s);
    return NULL;
}

/* ---- public ---------------------------------------------------------------------- */

static int sched_alloc(srv_sched *s, tl_error *err) {
    size_t nb = (size_t)s->n_batch;
    s->slots = calloc((size_t)s->np, sizeof *s->slots);
    s->wait = calloc((size_t)s->w_cap, sizeof *s->wait);
    s->eq = calloc((size_t)s->w_cap, sizeof *s->eq);
    s->b_tok = calloc(nb, sizeof *s->b_tok);
    s->b_seq = calloc(nb, sizeof *s->b_seq);
    s->b_lg = calloc(nb, sizeof *s->b_lg);
    s->rows = calloc(nb, sizeof *s->rows);
    s->order_idx = calloc((size_t)s->np, sizeof *s->order_idx);
    s->e_tok = calloc(SCHED_EMB_TEXTS, sizeof *s->e_tok);
    s->e_n = calloc(SCHED_EMB_TEXTS, sizeof *s->e_n);
    s->e_out = calloc(SCHED_EMB_TEXTS, sizeof *s->e_out);
    if (!s->e_tok || !s->e_n || !s->e_out || !s->order_idx || !s->slots || !s->wait || !s->eq || !s->b_tok || !s->b_seq || !s->b_lg || !s->rows) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        err->status = TL_ERR_NOMEM;
        return TL_ERR_NOMEM;
    }
    for (int i = 0; i < s->np; i++) s->slots[i].owner = s;
    return 0;
}

static void sched_release_mem(srv_sched *s) {
    for (int i = 0; s->slots && i < s->np; i++) tl_matcher_free(s->slots[i].matcher);
    free(s->slots);
    tl_vocab_trie_free(s->trie);
    free(s->wait);
    free(s->eq);
    free(s->b_tok);
    free(s->b_seq);
    free(s->b_lg);
    free(s->rows);
    free(s->order_idx);
    free(s->e_tok);
    free(s->e_n);
    free(s->e_out);
    tl_tracer_free(s->tracer);
    free(s->tjson);
    tl_ctx_free(s->dctx); /* before ctx: it runs on ctx's threads */
    tl_ctx_free(s->ctx);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static int sched_fail(tl_error *err, int status, const char *msg) {
    if (err) {
        err->status = status;
        snprintf(err->msg, sizeof err->msg, "%s", msg);
    }
    return status;
}

/* --kv-mem, or 0: the engine sizes the pool for np full sequences, cut to
 * what the machine's memory allows (tl_ctx_params.kv_bytes), and a request
 * that needs more than the pool holds gets a 4xx naming the limit. */
static void disk_log(void *arg, const char *msg) {
    (void)arg;
    fprintf(stderr, "tokenloop serve: cache: %s\n", msg);
}

static size_t kv_bytes_for(const srv_opts *o) { return o->kv_mem_mib > 0 ? (size_t)o->kv_mem_mib << 20 : 0; }

int srv_sched_new(const tl_model *m, const srv_opts *o, srv_metrics *mx, srv_sched **out,
                  tl_error *err) {
    tl_error scratch = {0};
    if (!err) err = &scratch;
    *out = NULL;
    if (!m || !o || o->n_parallel < 1) return sched_fail(err, TL_ERR_ARG, "scheduler: bad options");
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return sched_fail(err, TL_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->m = m;
    s->mx = mx;
    s->np = o->n_parallel;
    s->spec = o->spec;
    s->max_rows = s->np > SCHED_MAX_ROWS ? s->np : SCHED_MAX_ROWS;
    /* kv_bytes 0 lets the engine size the pool for np full sequences: enough
     * for every admitted request, and whatever they leave unused caches. */
    /* Every running sequence's decode token should fit in one call, with room
     * left for prefill. */
    int nb = o->n_batch > 0 ? o->n_batch : 512;
    if (nb < 2 * s->np) nb = 2 * s->np;
    tl_ctx_params cp = {.n_ctx = o->n_ctx,
                        .n_threads = o->n_threads,
                        .n_batch = nb,
                        .n_seq_max = s->np,
                        /* a ring of sliding-window layers each: fewer lanes (a generative
                         * model's embeddings are not its main use) */
                        .n_seq_embd = !o->swa_full && tl_model_kv_window_bytes(m, o->kv_type_k, o->kv_type_v, NULL)
                                          ? 4 : SCHED_EMB_SEQS,
                        .n_logits_max = s->max_rows,
                        .numerics = o->numerics,
                        .kv_type_k = o->kv_type_k,
                        .kv_type_v = o->kv_type_v,
                        .swa_full = o->swa_full};
    cp.kv_bytes = kv_bytes_for(o);
    int rc = tl_ctx_new(m, &cp, &s->ctx, err);
    if (rc == 0 && o->cache_dir) {
        const uint64_t budget = (uint64_t)(o->cache_disk_mib > 0 ? o->cache_disk_mib : 8192) << 20;
        rc = tl_ctx_disk_cache(s->ctx, o->cache_dir, budget, disk_log, NULL, err);
        s->has_disk = rc == 0;
    }
    if (rc) {
        sched_release_mem(s);
        return rc;
    }
    if (o->draft && o->spec != TL_SPEC_OFF && o->spec != TL_SPEC_NGRAM) {
        tl_ctx_params dp = {.n_ctx = tl_ctx_n_ctx(s->ctx), .n_seq_max = s->np, .numerics = o->numerics,
                            .share_threads = s->ctx, .swa_full = o->swa_full};
        if ((rc = tl_ctx_new(o->draft, &dp, &s->dctx, err))) {
            sched_release_mem(s);
            return rc;
        }
    }
    s->n_ctx = tl_ctx_n_ctx(s->ctx);
    tl_kv_stats kv;
    tl_ctx_kv_stats(s->ctx, &kv);
    s->kv_blocks = kv.n_blocks;
    s->kv0 = kv;
    srv_metrics_state(s->mx, 0, 0, &kv); /* /metrics has the pool before the loop's first turn */
    s->kv_why = o->kv_mem_mib > 0 ? "--kv-mem" : strstr(tl_ctx_sizing(s->ctx), "cut from")
                ? "the memory this machine has left: see serve's ready line; --kv-mem sets it" : "-np x -c";
    /* The engine caps a call at the context length. */
    s->n_batch = nb < s->n_ctx ? nb : s->n_ctx;
    if (s->max_rows > s->n_batch) s->max_rows = s->n_batch;
    s->chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 256;
    s->n_vocab = tl_model_n_vocab(m);
    s->max_queue = o->max_queue > 0 ? o->max_queue : 64;
    s->w_cap = s->np + s->max_queue + 1; /* a request waits until a slot takes it, free ones too */
    if ((rc = sched_alloc(s, err)) != 0) {
        sched_release_mem(s);
        return rc;
    }
    /* the vocabulary's byte trie for grammars, made now rather than in the
     * first constrained request's time to first token (0.03 s on SmolLM2's
     * 49k tokens, 0.2 s on Gemma 3's 262k) */
    if ((rc = tl_vocab_trie_new(m, &s->trie, err)) != 0) {
        sched_release_mem(s);
        return rc;
    }
    s->loop = o->loop;
    if (s->loop && (rc = tl_tracer_new(s->ctx, sched_trace, s, &s->tracer, err)) != 0) {
        sched_release_mem(s);
        return rc;
    }
    if (pthread_create(&s->th, NULL, sched_main, s) != 0) {
        sched_release_mem(s);
        return sched_fail(err, TL_ERR_NOMEM, "could not start the scheduler thread");
    }
    s->th_started = 1;
    *out = s;
    return 0;
}

static int refuse(char *why, size_t cap, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int refuse(char *why, size_t cap, int rc, const char *fmt, ...) {
    if (why && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Whether r could ever run here, however idle the server: SRV_OK, or the
 * refusal that names the limit. It reads only what is fixed once
 * srv_sched_new returns (-c, the pool's size, the vocabulary trie), so the
 * HTTP threads call it, and a stream is refused before its 200. The sampler
 * and the grammar's matcher are made here, to see that they can be (made at
 * admission, they would fail after the reply began), and left on the request
 * for admission to take. */
static int sched_check(const srv_sched *s, srv_req *r, char *why, size_t cap) {
    const int mt = r->max_tokens > 0 ? r->max_tokens : 0;
    if (r->n_prompt < 1) return refuse(why, cap, SRV_TOO_LONG, "the prompt has no tokens");
    if (r->n_prompt >= s->n_ctx)
        return refuse(why, cap, SRV_TOO_LONG,
                      "the prompt is %d tokens; the server's context is %d tokens per sequence (-c), one of them "
                      "for the reply", r->n_prompt, s->n_ctx);
    if (r->n_prompt + mt > s->n_ctx)
        return refuse(why, cap, SRV_TOO_LONG,
                      "this request needs %d tokens of context (%d in the prompt, %d for max_tokens); the server "
                      "has %d per sequence (-c)", r->n_prompt + mt, r->n_prompt, mt, s->n_ctx);
    /* as admit_one reserves: without max_tokens, the whole context */
    int target = r->max_tokens < 0 ? s->n_ctx : r->n_prompt + r->max_tokens;
    if (target > s->n_ctx) target = s->n_ctx;
    const int have = s->kv_blocks * TL_KV_BLOCK;
    if (blocks_for(target) > s->kv_blocks) {
        if (r->max_tokens < 0)
            return refuse(why, cap, SRV_NO_KV,
                          "this request needs %d tokens of KV cache (no max_tokens: the whole context of %d per "
                          "sequence); the server has %d in all (%s): set max_tokens to at most %d",
                          target, s->n_ctx, have, s->kv_why, have - r->n_prompt);
        return refuse(why, cap, SRV_NO_KV,
                      "this request needs %d tokens of KV cache (%d in the prompt, %d for max_tokens); the server "
                      "has %d in all (%s)", target, r->n_prompt, r->max_tokens, have, s->kv_why);
    }
    /* a failure for want of memory is not the request's: it is left for
     * admission to meet again (503) */
    tl_error err = {0};
    int rc = r->smp ? TL_OK : tl_sampler_new(&r->sp, s->n_vocab, &r->smp, &err);
    if (request_status(rc)) return refuse(why, cap, SRV_INVALID, "%s", err.msg);
    if (r->grammar && s->trie && !r->matcher) {
        rc = tl_matcher_new(r->grammar, s->trie, &r->matcher, &err);
        if (request_status(rc)) return refuse(why, cap, SRV_INVALID, "%s", err.msg);
    }
    return SRV_OK;
}

int srv_sched_submit(srv_sched *s, srv_req *r, char *why, size_t why_cap) {
    if (why && why_cap) why[0] = 0;
    int bad = sched_check(s, r, why, why_cap);
    if (bad) return bad;
    pthread_mutex_lock(&s->mu);
    int rc = SRV_OK;
    if (s->draining || s->stop) rc = SRV_DRAINING;
    /* --max-queue counts the requests beyond -np: those the slots cannot take
     * now. A submission the scheduler has not admitted yet (it admits between
     * forward calls) still has its free slot. */
    else if (s->w_len + s->n_running >= s->np + s->max_queue) rc = SRV_QUEUE_FULL;
    else {
        atomic_fetch_add(&r->refs, 1);
        s->wait[(s->w_head + s->w_len) % s->w_cap] = r;
        s->w_len++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int srv_sched_embed(srv_sched *s, srv_req *r, char *why, size_t why_cap) {
    if (why && why_cap) why[0] = 0;
    const srv_embed *em = r->emb;
    for (int i = 0; i < em->n; i++) {
        if (em->n_tok[i] > s->n_ctx)
            return refuse(why, why_cap, SRV_TOO_LONG,
                          "input %d is %d tokens; the server's context is %d tokens per sequence (-c)", i,
                          em->n_tok[i], s->n_ctx);
        if (blocks_for(em->n_tok[i]) > s->kv_blocks)
            return refuse(why, why_cap, SRV_TOO_LONG,
                          "input %d needs %d tokens of KV cache; the server has %d in all (%s)", i, em->n_tok[i],
                          s->kv_blocks * TL_KV_BLOCK, s->kv_why);
    }
    pthread_mutex_lock(&s->mu);
    int rc = SRV_OK;
    if (s->draining || s->stop) rc = SRV_DRAINING;
    else if (s->e_len >= s->max_queue) rc = SRV_QUEUE_FULL;
    else {
        atomic_fetch_add(&r->refs, 1);
        s->eq[(s->e_head + s->e_len) % s->w_cap] = r;
        s->e_len++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void srv_sched_drain(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_mutex_unlock(&s->mu);
}

int srv_sched_pending(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->w_len + s->n_running + s->e_len;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void srv_sched_kv_stats(const srv_sched *s, tl_kv_stats *out) { *out = s->kv0; }
const char *srv_sched_sizing(const srv_sched *s) { return tl_ctx_sizing(s->ctx); }
void srv_sched_disk_stats(const srv_sched *s, tl_disk_stats *out) { tl_ctx_disk_stats(s->ctx, out); }

int srv_sched_n_ctx(const srv_sched *s) {
    return s->n_ctx;
}

void srv_sched_free(srv_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->th_started) pthread_join(s->th, NULL);
    sched_release_mem(s);
}
