/* fuzz_request: libFuzzer target for the server's request parser and
 * validator (server/validate.c): arbitrary bytes as a /v1/chat/completions and a
 * /v1/completions body, then as /tokenize and /detokenize bodies. Checks that
 * nothing crashes or leaks and that every rejection carries a 4xx (or 500 for
 * out of memory) and a message. Chat prompts go through SmolLM2's template.
 * Not built by `make all`. Build and run from the repository root with:
 *
 *   make BUILD=build-fuzz CC=clang SAN="-fsanitize=address,undefined" lib
 *   clang -std=c11 -g -O1 -D_GNU_SOURCE -Iinclude -Isrc -Iserver \
 *     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
 *     tests/fuzz/fuzz_request.c server/wire.c server/validate.c server/prompt.c server/reply.c server/tools.c server/dialect.c server/req.c build-fuzz/libtokenloop.a \
 *     -ljansson -lpcre2-8 -lm -lpthread -o fuzz_request
 *   mkdir -p corpus && TL_FUZZ_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf \
 *     ./fuzz_request -max_total_time=120 -max_len=4096 -dict=tests/fuzz/request.dict corpus
 *
 * The model is loaded once, vocabulary and template only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const tl_model *model(void) {
    /* libFuzzer's entry point has no user pointer; the model is loaded once and
     * never changes, so this is the one piece of process-wide state. */
    static tl_model *m;
    if (!m) {
        const char *p = getenv("TL_FUZZ_MODEL");
        tl_error err;
        if (tl_model_load_vocab(p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf", &m, &err)) {
            fprintf(stderr, "fuzz_request: %s\n", err.msg);
            abort();
        }
    }
    return m;
}

static void check_err(const api_err *e) {
    if (!((e->http >= 400 && e->http < 500) || e->http == 500) || !e->msg[0]) abort();
    size_t n;
    char *s = api_error_json(e, &n);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    api_ctx a = {model(), "fuzz", 2048, 1024, 0, NULL};
    const char *body = (const char *)data;
    for (int k = 0; k < 2; k++) {
        srv_req *r = srv_req_new();
        if (!r) return 0;
        api_err e;
        if (api_parse_request(&a, k ? SRV_COMPLETION : SRV_CHAT, body, size, r, &e)) {
            check_err(&e);
        } else {
            /* A parsed request must be one the scheduler can take. */
            if (r->n_prompt <= 0 || r->n_prompt > a.n_ctx || r->top_logprobs > SRV_MAX_TOP ||
                r->n_stop > 4)
                abort();
            srv_event done = {.kind = SRV_EV_DONE, .text = strdup("x"), .text_len = 1,
                              .finish_reason = "stop"};
            srv_req_push(r, &done);
            size_t n;
            free(api_reply_json(&a, r, &n));
        }
        srv_req_release(r);
    }
    api_err e;
    size_t n;
    char *t = api_tokenize(&a, body, size, &n, &e);
    if (!t) check_err(&e);
    free(t);
    t = api_detokenize(&a, body, size, &n, &e);
    if (!t) check_err(&e);
    free(t);
    return 0;
}
