/* test_server_embed: the embedding and Ollama parsers and replies
 * (server/embed.c, server/ollama.c) on SmolLM2, without HTTP: base64 against
 * RFC 4648's vectors; /v1/embeddings' inputs, options and errors (each a
 * 4xx naming its field), the reply's floats and base64 read back to the same
 * bits; Ollama's option names and defaults landing in the srv_req, its load
 * call, raw generates, and its errors. */
#include <string.h>

#include <jansson.h>

#include "embed.h"
#include "ollama.h"
#include "server.h"
#include "tl_test.h"

static const char *MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
static api_ctx A;

static void test_base64(void) {
    static const char *const V[][2] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                       {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                                       {"foobar", "Zm9vYmFy"}};
    char out[32];
    for (size_t i = 0; i < sizeof V / sizeof *V; i++) {
        emb_base64((const unsigned char *)V[i][0], strlen(V[i][0]), out);
        CHECK(!strcmp(out, V[i][1]), "base64(%s) = %s, want %s", V[i][0], out, V[i][1]);
    }
}

/* Parses an embedding body; 0 or the HTTP status; *keep the request if good. */
static int eparse(int fmt, const char *body, char *param, srv_req **keep) {
    srv_req *r = srv_req_new();
    api_err e;
    int rc = emb_parse(&A, fmt, TL_POOL_MODEL, body, strlen(body), r, &e);
    if (param) strcpy(param, rc ? e.param : "");
    if (rc) CHECK(e.msg[0] && e.http >= 400, "error without message for %s", body);
    if (!rc && keep) *keep = r;
    else srv_req_release(r);
    return rc ? e.http : 0;
}

static void test_embed_parse(void) {
    static const char *const BAD[][2] = {
        {"{}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":\"\"}", "input"},
        {"{\"input\":[\"a\",\"\"]}", "input"},
        {"{\"input\":[[]]}", "input"},
        {"{\"input\":[1,2,99999999]}", "input"},
        {"{\"input\":[-1]}", "input"},
        {"{\"input\":[1.5]}", "input"},
        {"{\"input\":{\"a\":1}}", "input"},
        {"{\"input\":[\"a\",[1],3]}", "input"},
        {"{\"input\":\"a\",\"pooling\":\"max\"}", "pooling"},
        {"{\"input\":\"a\",\"pooling\":1}", "pooling"},
        {"{\"input\":\"a\",\"dimensions\":3}", "dimensions"},
        {"{\"input\":\"a\",\"dimensions\":0}", "dimensions"},
        {"{\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format"},
        {"{\"input\":\"a\",\"normalize\":1}", "normalize"},
        {"{\"input\":\"a\",\"embd_normalize\":1}", "embd_normalize"},
        {"{\"input\":\"a\",\"pooling\":\"none\",\"encoding_format\":\"base64\"}", "pooling"},
        {"[1,2]", NULL},
        {"{\"input\":", NULL},
    };
    char p[64];
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        int code = eparse(EMB_OPENAI, BAD[i][0], p, NULL);
        CHECK(code == 400, "%s -> %d", BAD[i][0], code);
        if (BAD[i][1]) CHECK(!strcmp(p, BAD[i][1]), "%s: param '%s', want '%s'", BAD[i][0], p, BAD[i][1]);
    }
    srv_req *r = NULL;
    CHECK(eparse(EMB_OPENAI, "{\"input\":[\"Hello world\",[1,2,3]],\"model\":\"x\",\"dimensions\":576}", p, &r) == 0,
          "good: %s", p);
    if (r) {
        const srv_embed *em = r->emb;
        CHECK(r->kind == SRV_EMBED && em->n == 2 && em->n_tok[0] == 2 && em->n_tok[1] == 3 && em->d == 576 &&
                  em->pooling == TL_POOL_MEAN && em->normalize && !em->base64 && em->off[1] == 576,
              "the request: n %d, tokens %d %d, d %d, pooling %d", em->n, em->n_tok[0], em->n_tok[1], em->d,
              em->pooling);
        srv_req_release(r);
    }
    r = NULL;
    CHECK(eparse(EMB_OPENAI, "{\"input\":\"Hello\",\"pooling\":\"none\",\"normalize\":false}", p, &r) == 0, "none");
    if (r) {
        CHECK(r->emb->pooling == TL_POOL_NONE && !r->emb->normalize, "pooling none, normalize false");
        srv_req_release(r);
    }
    r = NULL;
    CHECK(eparse(EMB_OPENAI, "{\"input\":\"Hello\",\"embd_normalize\":-1,\"pooling\":\"last\"}", p, &r) == 0, "-1");
    if (r) {
        CHECK(r->emb->pooling == TL_POOL_LAST && !r->emb->normalize, "embd_normalize -1, pooling last");
        srv_req_release(r);
    }
    /* Ollama's: strings only, cut at the context unless truncate is false */
    CHECK(eparse(EMB_OLLAMA, "{\"input\":[1,2]}", p, NULL) == 400, "ollama: token ids");
    CHECK(eparse(EMB_OLLAMA_OLD, "{\"input\":\"a\"}", p, NULL) == 400 && !strcmp(p, "prompt"), "old: no prompt");
    char big[9000] = "{\"input\":\"";
    for (int i = 0; i < 1500; i++) strcat(big, "word ");
    strcat(big, "\"}");
    r = NULL;
    CHECK(eparse(EMB_OLLAMA, big, p, &r) == 0 && r && r->emb->n_tok[0] == A.n_ctx, "ollama: truncated to -c");
    srv_req_release(r);
    r = NULL;
    CHECK(eparse(EMB_OLLAMA_OLD, "{\"prompt\":\"a\"}", p, &r) == 0 && r && !r->emb->normalize, "old: raw vector");
    srv_req_release(r);
}

/* A reply's vectors read back: floats and base64 give the same bits. */
static void test_embed_reply(void) {
    for (int b64 = 0; b64 < 2; b64++) {
        srv_req *r = NULL;
        char p[64];
        const char *body = b64 ? "{\"input\":[\"a\",\"b c\"],\"encoding_format\":\"base64\"}" : "{\"input\":[\"a\",\"b c\"]}";
        if (eparse(EMB_OPENAI, body, p, &r) || !r) {
            CHECK(0, "parse %s", body);
            continue;
        }
        srv_embed *em = r->emb;
        for (int i = 0; i < 2 * em->d; i++) em->out[i] = (float)((i * 7919) % 1000 - 500) / 3.0e4f + 1e-9f * (float)i;
        size_t n = 0;
        char *s = emb_reply_json(&A, r, &n);
        json_t *j = s ? json_loadb(s, n, 0, NULL) : NULL;
        json_t *data = json_object_get(j, "data");
        CHECK(j && json_array_size(data) == 2 && !strcmp(json_string_value(json_object_get(j, "object")), "list") &&
                  json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) ==
                      em->n_tok[0] + em->n_tok[1],
              "reply shape: %.200s", s ? s : "(null)");
        int same = 1;
        for (int i = 0; i < 2 && j; i++) {
            json_t *v = json_object_get(json_array_get(data, (size_t)i), "embedding");
            const float *want = em->out + em->off[i];
            if (b64) {
                char ref[4 * 576 * 4 / 3 + 8];
                emb_base64((const unsigned char *)want, (size_t)em->d * 4, ref);
                same &= json_is_string(v) && !strcmp(json_string_value(v), ref);
            } else {
                for (int k = 0; k < em->d; k++) same &= (float)json_real_value(json_array_get(v, (size_t)k)) == want[k];
            }
        }
        CHECK(same, "the vectors read back (%s)", b64 ? "base64" : "float");
        json_decref(j);
        free(s);
        srv_req_release(r);
    }
}

/* Parses an Ollama chat (generate) body; 0 or the HTTP status. */
static int oparse(int generate, const char *body, int *empty, srv_req **keep) {
    srv_req *r = srv_req_new();
    api_err e;
    int em = 0;
    int rc = oll_parse(&A, generate, body, strlen(body), r, &em, &e);
    if (empty) *empty = em;
    if (rc) CHECK(e.msg[0] && e.http >= 400, "error without message for %s", body);
    if (!rc && keep) *keep = r;
    else srv_req_release(r);
    return rc ? e.http : 0;
}

static void test_ollama_parse(void) {
    srv_req *r = NULL;
    CHECK(oparse(0, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", NULL, &r) == 0, "chat");
    if (r) {
        CHECK(r->stream && r->kind == SRV_CHAT && r->dialect == SRV_DIALECT_OLLAMA && r->max_tokens == -1 &&
                  r->sp.temp == 0.8f && r->sp.top_k == 40 && r->sp.top_p == 0.9f && r->sp.repeat_penalty == 1.1f &&
                  r->sp.penalty_last_n == 64,
              "Ollama's defaults: stream %d temp %g top_k %d top_p %g rp %g", r->stream, (double)r->sp.temp,
              r->sp.top_k, (double)r->sp.top_p, (double)r->sp.repeat_penalty);
        srv_req_release(r);
    }
    r = NULL;
    CHECK(oparse(0,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":false,\"keep_alive\":\"5m\","
                 "\"format\":\"json\",\"think\":false,\"options\":{\"temperature\":0,\"top_k\":3,\"top_p\":0.5,"
                 "\"min_p\":0.1,\"seed\":7,\"num_predict\":9,\"num_ctx\":99999,\"stop\":[\"x\"],"
                 "\"repeat_penalty\":1.3,\"repeat_last_n\":8,\"num_thread\":2}}",
                 NULL, &r) == 0,
          "chat with options");
    if (r) {
        CHECK(!r->stream && r->max_tokens == 9 && r->sp.temp == 0.0f && r->sp.top_k == 3 && r->sp.top_p == 0.5f &&
                  r->sp.min_p == 0.1f && r->sp.seed == 7 && r->n_stop == 1 && r->sp.repeat_penalty == 1.3f &&
                  r->sp.penalty_last_n == 8 && r->grammar && r->think_budget == 0,
              "options in the request");
        srv_req_release(r);
    }
    int empty = 0;
    CHECK(oparse(1, "{\"model\":\"m\"}", &empty, NULL) == 0 && empty, "generate without a prompt: load");
    r = NULL;
    CHECK(oparse(1, "{\"prompt\":\"The sky\",\"raw\":true,\"options\":{\"num_predict\":4}}", &empty, &r) == 0 && !empty,
          "raw generate");
    if (r) {
        CHECK(r->kind == SRV_COMPLETION && r->max_tokens == 4 && r->dialect == SRV_DIALECT_OLLAMA && r->wire,
              "raw: a completion in Ollama's dialect");
        srv_req_release(r);
    }
    r = NULL;
    CHECK(oparse(1, "{\"prompt\":\"Hi\",\"system\":\"Be brief.\",\"format\":{\"type\":\"object\"}}", NULL, &r) == 0,
          "generate with system and a schema");
    if (r) {
        CHECK(r->kind == SRV_CHAT && r->grammar, "generate: a chat with a grammar");
        srv_req_release(r);
    }
    static const char *const BAD[] = {
        "{\"messages\":[]}",
        "{}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"format\":3}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"format\":\"yaml\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"think\":\"max\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":[1]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"temperature\":\"hot\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"num_predict\":\"9\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"repeat_penalty\":-1}}",
        "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{}}]}]}",
        "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"template\":\"{{ .Prompt }}\"}",
        "[]",
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        int code = oparse(0, BAD[i], NULL, NULL);
        CHECK(code >= 400 && code < 500, "%s -> %d", BAD[i], code);
    }
    CHECK(oparse(1, "{\"prompt\":5}", NULL, NULL) == 400, "generate: prompt not a string");
    CHECK(oparse(1, "{\"prompt\":\"x\",\"suffix\":\"y\"}", NULL, NULL) == 400, "generate: suffix");
    api_err e;
    api_fail(&e, 400, NULL, NULL, NULL, "bad \"thing\"");
    size_t n = 0;
    char *s = oll_error_json(&e, &n);
    CHECK(s && !strcmp(s, "{\"error\":\"bad \\\"thing\\\"\"}"), "Ollama's error: %s", s ? s : "(null)");
    free(s);
}

int main(void) {
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load(MODEL, &m, &err)) {
        CHECK(0, "cannot load %s: %s (run make models)", MODEL, err.msg);
        return tl_test_summary();
    }
    tl_chat_template *tmpl = NULL;
    CHECK(tl_chat_template_new(m, NULL, &tmpl, &err) == TL_OK, "compile the template: %s", err.msg);
    A = (api_ctx){m, "SmolLM2-135M-Instruct.Q4_1.gguf", 512, 1024, 0, tmpl, NULL, MODEL, 1};
    test_base64();
    test_embed_parse();
    test_embed_reply();
    test_ollama_parse();
    tl_chat_template_free(tmpl);
    tl_model_free(m);
    return tl_test_summary();
}
