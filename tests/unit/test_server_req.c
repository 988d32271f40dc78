/* test_server_req: the server's request parser and reply builder (server/validate.c, prompt.c, reply.c)
 * on the SmolLM2 tokenizer and template: every field's type and range errors,
 * hostile JSON, the srv_req a good request becomes, the JSON shapes of
 * replies and stream chunks built from events, and a stream's events leaving
 * the request as they are taken. */
#include <string.h>

#include <jansson.h>

#include "api.h"
#include "server.h"
#include "tl_test.h"
#include "tools.h"

static const char *MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

static api_ctx A;

/* Parses body; returns 0 or the HTTP status; *param gets the error's param. */
static int parse(srv_kind k, const char *body, size_t len, char *param, srv_req **keep) {
    srv_req *r = srv_req_new();
    api_err e;
    int rc = api_parse_request(&A, k, body, len, r, &e);
    if (param) strcpy(param, rc ? e.param : "");
    if (rc) CHECK(e.msg[0] && e.type, "error without message for %s", body);
    if (!rc && keep) *keep = r;
    else srv_req_release(r);
    return rc ? e.http : 0;
}

#define CHAT_MSG "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"

static void bad_chat(const char *extra, const char *want_param) {
    char body[2048], p[64];
    snprintf(body, sizeof body, "{" CHAT_MSG ",%s}", extra);
    int code = parse(SRV_CHAT, body, strlen(body), p, NULL);
    CHECK(code == 400, "%s -> %d", extra, code);
    if (want_param) CHECK(!strcmp(p, want_param), "%s: param '%s', want '%s'", extra, p, want_param);
}

static void good_chat(const char *extra) {
    char body[2048];
    snprintf(body, sizeof body, "{" CHAT_MSG ",%s}", extra);
    int code = parse(SRV_CHAT, body, strlen(body), NULL, NULL);
    CHECK(code == 0, "%s -> %d", extra, code);
}

static void bad_compl(const char *body, const char *want_param) {
    char p[64];
    int code = parse(SRV_COMPLETION, body, strlen(body), p, NULL);
    CHECK(code == 400, "%s -> %d", body, code);
    if (want_param) CHECK(!strcmp(p, want_param), "%s: param '%s', want '%s'", body, p, want_param);
}

static void test_fields(void) {
    const char *types[][2] = {
        {"\"temperature\":\"1\"", "temperature"}, {"\"temperature\":2.5", "temperature"},
        {"\"temperature\":-0.1", "temperature"},  {"\"top_p\":0", "top_p"},
        {"\"top_p\":1.5", "top_p"},               {"\"top_p\":true", "top_p"},
        {"\"min_p\":-1", "min_p"},                {"\"top_k\":1.5", "top_k"},
        {"\"top_k\":\"5\"", "top_k"},             {"\"top_k\":99999999", "top_k"},
        {"\"seed\":1.25", "seed"},                {"\"seed\":\"x\"", "seed"},
        {"\"presence_penalty\":3", "presence_penalty"}, {"\"frequency_penalty\":-2.5", "frequency_penalty"},
        {"\"max_tokens\":0", "max_tokens"},       {"\"max_tokens\":-3", "max_tokens"},
        {"\"max_tokens\":100000", "max_tokens"},  {"\"max_tokens\":\"9\"", "max_tokens"},
        {"\"max_completion_tokens\":1e6", "max_completion_tokens"},
        {"\"n\":2", "n"},                         {"\"stream\":1", "stream"},
        {"\"stream_options\":[]", "stream_options"}, {"\"stream_options\":{\"x\":1}", "stream_options"},
        {"\"stream_options\":{\"include_usage\":\"yes\"}", "include_usage"},
        {"\"stop\":5", "stop"},                   {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop"},
        {"\"stop\":[\"\"]", "stop"},              {"\"stop\":[1]", "stop"},
        {"\"logit_bias\":[]", "logit_bias"},      {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"logit_bias\":{\"49152\":1}", "logit_bias"}, {"\"logit_bias\":{\"5\":101}", "logit_bias"},
        {"\"logit_bias\":{\"5\":\"1\"}", "logit_bias"}, {"\"logit_bias\":{\"-1\":1}", "logit_bias"},
        {"\"logprobs\":1", "logprobs"},           {"\"top_logprobs\":3", "top_logprobs"},
        {"\"logprobs\":true,\"top_logprobs\":21", "top_logprobs"},
        {"\"model\":5", "model"},                 {"\"user\":[]", "user"},
        {"\"prompt_cache_key\":1", "prompt_cache_key"},
        {"\"tools\":[{\"type\":\"function\"}]", "tools"}, {"\"tool_choice\":\"auto\"", "tool_choice"},
        {"\"functions\":[]", "functions"},        {"\"audio\":{}", "audio"},
        {"\"response_format\":{\"type\":\"xml\"}", "response_format"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"minimum\":1}}}",
         "response_format"},
        {"\"response_format\":{\"type\":\"json_object\",\"x\":1}", "response_format"},
        {"\"grammar\":\"root ::= nothing\"", "grammar"},     {"\"grammar\":5", "grammar"},
        {"\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}", "grammar"},
        {"\"bogus_field\":1", "bogus_field"},     {"\"prompt\":\"x\"", "prompt"},
        {"\"echo\":true", "echo"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) bad_chat(types[i][0], types[i][1]);
    const char *ok[] = {"\"temperature\":0", "\"temperature\":null", "\"top_k\":5.0", "\"seed\":-7",
                        "\"max_tokens\":3.0", "\"tools\":null", "\"stop\":\"x\"", "\"stop\":null",
                        "\"stop\":[\"a\",\"b\"]", "\"logit_bias\":{\"5\":-100,\"7\":2.5}",
                        "\"logprobs\":true,\"top_logprobs\":20", "\"n\":1", "\"user\":\"u\"",
                        "\"model\":\"anything\"", "\"prompt_cache_key\":\"k\"",
                        "\"response_format\":{\"type\":\"text\"}", "\"response_format\":{\"type\":\"json_object\"}",
                        ("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":"
                         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}"),
                        "\"grammar\":\"root ::= [a-z]+\"", "\"grammar\":null",
                        "\"stream\":true,\"stream_options\":{\"include_usage\":true}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) good_chat(ok[i]);

    bad_compl("{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
    bad_compl("{\"prompt\":\"x\",\"logprobs\":21}", "logprobs");
    bad_compl("{\"prompt\":\"x\",\"echo\":1}", "echo");
    bad_compl("{\"prompt\":\"x\",\"best_of\":2}", "best_of");
    bad_compl("{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix");
    bad_compl("{\"prompt\":[\"a\",\"b\"]}", "prompt");
    bad_compl("{\"prompt\":[1,-2]}", "prompt");
    bad_compl("{\"prompt\":[1,49152]}", "prompt");
    bad_compl("{\"prompt\":5}", "prompt");
    bad_compl("{\"prompt\":\"\"}", "prompt");
    bad_compl("{}", "prompt");
    bad_compl("{\"prompt\":\"x\",\"messages\":[]}", "messages");
    bad_compl("{\"prompt\":\"x\",\"max_completion_tokens\":3}", "max_completion_tokens");
    const char *e0 = "{\"prompt\":\"x\",\"max_tokens\":0,\"echo\":true,\"logprobs\":0}";
    CHECK(parse(SRV_COMPLETION, e0, strlen(e0), NULL, NULL) == 0, "echo + max_tokens 0");
    const char *ta = "{\"prompt\":[[1,2,3]],\"best_of\":1}";
    CHECK(parse(SRV_COMPLETION, ta, strlen(ta), NULL, NULL) == 0, "one token-id prompt in an array");
}

static void test_messages(void) {
    char p[64];
    const char *bad[][2] = {
        {"{\"messages\":[]}", "messages"},
        {"{}", "messages"},
        {"{\"messages\":{}}", "messages"},
        {"{\"messages\":[1]}", "messages[0]"},
        {"{\"messages\":[{\"content\":\"x\"}]}", "messages[0]"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0]"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":5}]}", "messages[0]"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"function\":{}}]}]}",
         "messages[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"extra\":1}]}", "messages[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}}]}]}",
         "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", "messages[0]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code = parse(SRV_CHAT, bad[i][0], strlen(bad[i][0]), p, NULL);
        CHECK(code == 400 && !strcmp(p, bad[i][1]), "%s -> %d param '%s'", bad[i][0], code, p);
    }
    /* Text parts are joined with "\n": the same tokens as the joined string. */
    srv_req *a = NULL, *b = NULL;
    const char *parts = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                        "{\"type\":\"text\",\"text\":\"b\"}]}]}";
    const char *joined = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\"}]}";
    CHECK(parse(SRV_CHAT, parts, strlen(parts), NULL, &a) == 0, "text parts");
    CHECK(parse(SRV_CHAT, joined, strlen(joined), NULL, &b) == 0, "joined");
    if (a && b)
        CHECK(a->n_prompt == b->n_prompt && !memcmp(a->prompt, b->prompt, (size_t)a->n_prompt * 4),
              "parts and joined string differ");
    srv_req_release(a);
    srv_req_release(b);
    /* Too many messages. */
    size_t cap = 1100 * 40 + 64, n = 0;
    char *big = malloc(cap);
    n += (size_t)snprintf(big + n, cap - n, "{\"messages\":[");
    for (int i = 0; i < 1100; i++)
        n += (size_t)snprintf(big + n, cap - n, "%s{\"role\":\"user\",\"content\":\"x\"}", i ? "," : "");
    n += (size_t)snprintf(big + n, cap - n, "]}");
    CHECK(parse(SRV_CHAT, big, n, p, NULL) == 400 && !strcmp(p, "messages"), "1100 messages");
    free(big);
}

static void test_hostile(void) {
    char deep[200] = "{\"messages\":", *d = deep + strlen(deep);
    for (int i = 0; i < 32; i++) *d++ = '[';
    for (int i = 0; i < 32; i++) *d++ = ']';
    strcpy(d, "}");
    CHECK(api_json_depth(deep, strlen(deep)) == 33, "depth %d", api_json_depth(deep, strlen(deep)));
    CHECK(parse(SRV_CHAT, deep, strlen(deep), NULL, NULL) == 400, "depth 33");
    CHECK(api_json_depth("{\"a\":\"[[[[\\\"[[\"}", 16) == 1, "brackets inside strings");
    const char *bad[] = {
        "", "{", "[]", "null", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]} trailing",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\\u0000\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"messages\":[]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1e999}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":18446744073709551616}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":9223372036854775807}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
        "{'messages':1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse(SRV_CHAT, bad[i], strlen(bad[i]), NULL, NULL) == 400, "hostile %zu: %s", i, bad[i]);
    const char inv[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}";
    CHECK(parse(SRV_CHAT, inv, sizeof inv - 1, NULL, NULL) == 400, "invalid UTF-8");
    const char nul[] = "{\"prompt\":\"a\0b\"}";
    CHECK(parse(SRV_COMPLETION, nul, sizeof nul - 1, NULL, NULL) == 400, "raw NUL");
}

static void test_good(void) {
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Hi there\"}],\"temperature\":0.5,\"top_p\":0.9,"
                       "\"top_k\":7,\"min_p\":0.1,\"seed\":42,\"stop\":[\"END\",\"\\n\\n\"],"
                       "\"presence_penalty\":0.5,\"frequency_penalty\":-0.25,\"logit_bias\":{\"17\":-100},"
                       "\"logprobs\":true,\"top_logprobs\":3,\"max_completion_tokens\":9,\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true}}";
    srv_req *r = NULL;
    CHECK(parse(SRV_CHAT, chat, strlen(chat), NULL, &r) == 0, "good chat");
    if (r) {
        CHECK(r->kind == SRV_CHAT && r->stream && r->include_usage, "flags");
        CHECK(r->max_tokens == 9 && r->logprobs && r->top_logprobs == 3 && !r->echo, "counts");
        CHECK_NEAR(r->sp.temp, 0.5, 0, "temp");
        CHECK_NEAR(r->sp.top_p, 0.9f, 0, "top_p");
        CHECK(r->sp.top_k == 7 && r->sp.seed == 42, "top_k %d seed", r->sp.top_k);
        CHECK_NEAR(r->sp.min_p, 0.1f, 0, "min_p");
        CHECK_NEAR(r->sp.presence_penalty, 0.5, 0, "presence");
        CHECK_NEAR(r->sp.freq_penalty, -0.25, 0, "frequency");
        CHECK(r->sp.repeat_penalty == 1 && r->sp.penalty_last_n == -1, "penalty window");
        CHECK(r->sp.n_logit_bias == 1 && r->sp.logit_bias[0].token == 17 &&
              r->sp.logit_bias[0].bias == -100, "bias");
        CHECK(r->n_stop == 2 && !strcmp(r->stop[0], "END") && !strcmp(r->stop[1], "\n\n"), "stop");
        CHECK(!strncmp(r->id, "chatcmpl-", 9) && r->created > 1600000000, "id %s", r->id);
        /* The prompt: the model's own template, special tokens parsed, no BOS. */
        tl_chat_msg msgs[2] = {{"system", "Be brief."}, {"user", "Hi there"}};
        char *txt = NULL;
        size_t tl = 0, n = 0;
        int32_t *ids = NULL;
        tl_error err;
        CHECK(tl_chat_apply_msgs(A.m, NULL, msgs, 2, 1, &txt, &tl, &err) == 0, "render");
        CHECK(tl_tokenize(A.m, txt, tl, TL_TOK_PARSE_SPECIAL, &ids, &n, &err) == 0, "tokenize");
        CHECK((size_t)r->n_prompt == n && !memcmp(ids, r->prompt, n * 4), "chat prompt tokens");
        CHECK(strstr(txt, "<|im_start|>assistant\n") != NULL, "generation prompt");
        tl_free(txt);
        tl_free(ids);
        srv_req_release(r);
    }
    const char *defaults = "{" CHAT_MSG "}";
    r = NULL;
    CHECK(parse(SRV_CHAT, defaults, strlen(defaults), NULL, &r) == 0, "defaults");
    if (r) {
        CHECK(r->sp.temp == 1.0f && r->sp.top_k == 0 && r->sp.top_p == 1.0f && r->sp.min_p == 0,
              "OpenAI defaults");
        CHECK(r->sp.seed == TL_SEED_RANDOM && r->max_tokens == -1 && !r->stream && !r->logprobs,
              "absent fields");
        srv_req_release(r);
    }
    const char *compl = "{\"prompt\":\"The capital of France is\",\"max_tokens\":5,\"echo\":true,"
                        "\"logprobs\":2,\"temperature\":0}";
    r = NULL;
    CHECK(parse(SRV_COMPLETION, compl, strlen(compl), NULL, &r) == 0, "good completion");
    if (r) {
        int32_t *ids = NULL;
        size_t n = 0;
        tl_error err;
        const char *p = "The capital of France is";
        tl_tokenize(A.m, p, strlen(p), TL_TOK_PARSE_SPECIAL | (tl_model_add_bos(A.m) ? TL_TOK_ADD_BOS : 0),
                    &ids, &n, &err);
        CHECK((size_t)r->n_prompt == n && n > 3 && !memcmp(ids, r->prompt, n * 4), "completion tokens");
        CHECK(r->kind == SRV_COMPLETION && r->echo && r->logprobs && r->top_logprobs == 2 &&
              r->max_tokens == 5 && r->sp.temp == 0, "completion fields");
        CHECK(!strncmp(r->id, "cmpl-", 5), "id");
        tl_free(ids);
        srv_req_release(r);
    }
    /* Context: prompt + max_tokens beyond -c. */
    char p[64];
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":[1,2,3],\"max_tokens\":%d}", A.n_ctx - 2);
    CHECK(parse(SRV_COMPLETION, body, strlen(body), p, NULL) == 400, "too long");
    snprintf(body, sizeof body, "{\"prompt\":[1,2,3],\"max_tokens\":%d}", A.n_ctx - 3);
    CHECK(parse(SRV_COMPLETION, body, strlen(body), p, NULL) == 0, "fits exactly");
}

static void push_tok(srv_req *r, srv_ev_kind k, int32_t tok, const char *text, int has_lp) {
    srv_event ev = {0};
    ev.kind = k;
    ev.token = tok;
    ev.text = strdup(text);
    ev.text_len = strlen(text);
    ev.has_logprob = has_lp;
    ev.chosen = (tl_token_prob){tok, 0.5f, -0.6931472f};
    ev.n_top = 3;
    for (int i = 0; i < 3; i++) ev.top[i] = (tl_token_prob){tok + i, 0.5f / (float)(i + 1), -(float)i - 0.5f};
    ev.top[0].token = tok;
    srv_req_push(r, &ev);
}

static json_t *loads(const char *s) {
    json_error_t je;
    json_t *j = s ? json_loads(s, 0, &je) : NULL;
    CHECK(j != NULL, "reply is not JSON: %s", s ? s : "(null)");
    return j;
}

static void test_replies(void) {
    srv_req *r = NULL;
    const char *chat = "{" CHAT_MSG ",\"logprobs\":true,\"top_logprobs\":2}";
    CHECK(parse(SRV_CHAT, chat, strlen(chat), NULL, &r) == 0, "chat");
    if (!r) return;
    int32_t hello = r->prompt[r->n_prompt - 1];
    push_tok(r, SRV_EV_TOKEN, hello, "Hel", 1);
    push_tok(r, SRV_EV_TOKEN, hello, "lo\xff", 1);
    srv_event done = {.kind = SRV_EV_DONE, .text = strdup("!"), .text_len = 1, .finish_reason = "length"};
    srv_req_push(r, &done);
    r->prompt_tokens = r->n_prompt;
    r->completion_tokens = 2;
    r->cached_tokens = 16;
    CHECK(r->finished, "finished after DONE");
    size_t n;
    char *s = api_reply_json(&A, r, &n);
    json_t *j = loads(s);
    if (j) {
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"), "object");
        const char *content = json_string_value(json_object_get(json_object_get(c0, "message"), "content"));
        CHECK(content && !strcmp(content, "Hello\xef\xbf\xbd!"), "content '%s'", content ? content : "");
        CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "length"), "finish");
        json_t *u = json_object_get(j, "usage");
        CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 2 &&
              json_integer_value(json_object_get(u, "total_tokens")) == r->n_prompt + 2 &&
              json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 16,
              "usage");
        json_t *lp = json_object_get(json_object_get(c0, "logprobs"), "content");
        CHECK(json_array_size(lp) == 2, "logprob entries %zu", json_array_size(lp));
        json_t *e0 = json_array_get(lp, 0);
        CHECK(json_array_size(json_object_get(e0, "top_logprobs")) == 2, "top 2");
        CHECK(json_is_array(json_object_get(e0, "bytes")) && json_is_string(json_object_get(e0, "token")),
              "entry shape");
        CHECK_NEAR(json_real_value(json_object_get(e0, "logprob")), -0.6931472f, 1e-7, "logprob value");
        json_decref(j);
    }
    free(s);
    /* Streamed: role delta first, content chunks, finish, usage, [DONE]. */
    r->include_usage = 1;
    api_stream st = {0};
    api_buf out = {0};
    for (int i = 0; i < r->n_ev; i++) CHECK(api_stream_event(&A, r, &st, &r->ev[i], &out) == 0, "frame");
    CHECK(st.ended && out.p && strstr(out.p, "\"role\":\"assistant\"") != NULL, "role chunk");
    CHECK(out.p && strstr(out.p, "\"choices\":[],") != NULL, "usage chunk");
    CHECK(out.n >= 14 && !strcmp(out.p + out.n - 14, "data: [DONE]\n\n"), "[DONE] last");
    int frames = 0;
    for (char *q = out.p; q && (q = strstr(q, "data: ")); q += 6) frames++;
    CHECK(frames == 7, "frames %d (role, 2 tokens, trailing text, finish, usage, done)", frames);
    api_buf_free(&out);
    srv_req_release(r);

    /* Legacy logprobs with echo: the first prompt entry is null. */
    r = NULL;
    const char *compl = "{\"prompt\":\"Hi there\",\"echo\":true,\"logprobs\":1,\"max_tokens\":1}";
    CHECK(parse(SRV_COMPLETION, compl, strlen(compl), NULL, &r) == 0, "legacy");
    if (!r) return;
    for (int i = 0; i < r->n_prompt; i++) push_tok(r, SRV_EV_PROMPT, r->prompt[i], "", i > 0);
    push_tok(r, SRV_EV_TOKEN, 42, "x", 1);
    srv_event d2 = {.kind = SRV_EV_DONE, .text = strdup(""), .finish_reason = "length"};
    srv_req_push(r, &d2);
    s = api_reply_json(&A, r, &n);
    j = loads(s);
    if (j) {
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        const char *text = json_string_value(json_object_get(c0, "text"));
        CHECK(text && !strcmp(text, "Hi therex"), "echo text '%s'", text ? text : "");
        json_t *lp = json_object_get(c0, "logprobs");
        json_t *tl = json_object_get(lp, "token_logprobs"), *tp = json_object_get(lp, "top_logprobs");
        CHECK(json_array_size(tl) == (size_t)r->n_prompt + 1 && json_is_null(json_array_get(tl, 0)) &&
              json_is_null(json_array_get(tp, 0)) && json_is_object(json_array_get(tp, 1)),
              "legacy columns");
        CHECK(json_object_size(json_array_get(tp, 1)) == 1, "top dict: top-1 plus the chosen");
        json_t *off = json_object_get(lp, "text_offset");
        CHECK(json_integer_value(json_array_get(off, 0)) == 0 &&
              json_integer_value(json_array_get(off, r->n_prompt)) == 8, "text_offset");
        json_decref(j);
    }
    free(s);
    srv_req_release(r);
}

/* Reasoning is what the loop says it is (srv_event.reasoning, from
 * tl_gen_event.reasoning), not what the text looks like: a reply and a
 * stream built from the same events split them the same way. */
typedef struct split {
    char reasoning[256], content[256];
    int has_reasoning;
} split;

static void cat(char *dst, size_t cap, const char *s) {
    if (s && strlen(dst) + strlen(s) < cap) strcat(dst, s);
}

/* The markers (NULL: <think>'s) and whether the prompt opened the reasoning. */
typedef struct markers {
    const char *open, *close;
    int started;
} markers;

static void reasoning_case_m(const char *what, markers mk, const char *const *texts, const int *flags, int n,
                             const char *want_r, const char *want_c) {
    srv_req *r = NULL;
    const char *chat = "{" CHAT_MSG "}";
    CHECK(parse(SRV_CHAT, chat, strlen(chat), NULL, &r) == 0, "chat");
    if (!r) return;
    r->think = 1;
    r->think_started = mk.started;
    if (mk.open) r->think_open = mk.open, r->think_close = mk.close;
    for (int i = 0; i < n; i++) {
        srv_event ev = {.kind = SRV_EV_TOKEN, .token = 1, .text = strdup(texts[i]), .text_len = strlen(texts[i]),
                        .reasoning = flags[i]};
        srv_req_push(r, &ev);
    }
    srv_event done = {.kind = SRV_EV_DONE, .text = strdup(""), .finish_reason = "stop"};
    srv_req_push(r, &done);
    split whole = {{0}, {0}, 0}, streamed = {{0}, {0}, 0};
    size_t len;
    char *s = api_reply_json(&A, r, &len);
    json_t *j = loads(s);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    json_t *rc = json_object_get(m, "reasoning_content");
    whole.has_reasoning = rc != NULL;
    cat(whole.reasoning, sizeof whole.reasoning, json_string_value(rc));
    cat(whole.content, sizeof whole.content, json_string_value(json_object_get(m, "content")));
    json_decref(j);
    free(s);
    api_stream st = {0};
    api_buf out = {0};
    for (int i = 0; i < r->n_ev; i++) CHECK(api_stream_event(&A, r, &st, &r->ev[i], &out) == 0, "frame");
    for (char *q = out.p; q && (q = strstr(q, "data: {")); q += 6) {
        json_error_t je;
        json_t *f = json_loadb(q + 6, strcspn(q + 6, "\n"), 0, &je);
        json_t *d = json_object_get(json_array_get(json_object_get(f, "choices"), 0), "delta");
        json_t *dr = json_object_get(d, "reasoning_content");
        if (dr) streamed.has_reasoning = 1;
        cat(streamed.reasoning, sizeof streamed.reasoning, json_string_value(dr));
        cat(streamed.content, sizeof streamed.content, json_string_value(json_object_get(d, "content")));
        json_decref(f);
    }
    api_buf_free(&out);
    api_stream_free(&st);
    srv_req_release(r);
    const split *sp[2] = {&whole, &streamed};
    for (int k = 0; k < 2; k++) {
        CHECK(sp[k]->has_reasoning == (want_r != NULL) && !strcmp(sp[k]->reasoning, want_r ? want_r : ""),
              "%s (%s): reasoning '%s', want '%s'", what, k ? "stream" : "reply", sp[k]->reasoning, want_r ? want_r : "(none)");
        CHECK(!strcmp(sp[k]->content, want_c), "%s (%s): content '%s', want '%s'", what, k ? "stream" : "reply",
              sp[k]->content, want_c);
    }
}

static void reasoning_case(const char *what, const char *const *texts, const int *flags, int n, const char *want_r,
                           const char *want_c) {
    reasoning_case_m(what, (markers){NULL, NULL, 0}, texts, flags, n, want_r, want_c);
}

static void test_reasoning(void) {
    /* the open marker in pieces: the loop counts it from the piece that
     * completes it */
    const char *t1[] = {"\n", "<th", "ink>", "Let me", " se", "e.</", "think>", "\n\n", "Four", "."};
    const int f1[] = {0, 0, 1, 1, 1, 1, 1, 0, 0, 0};
    reasoning_case("the loop's reasoning", t1, f1, 10, "Let me see.", "Four.");
    /* the loop did not count the markers as reasoning (a grammar held the
     * reply, or they came too late): they are the reply's text */
    const char *t2[] = {"<think>", "x</think>", " y"};
    const int f2[] = {0, 0, 0};
    reasoning_case("markers the loop did not count", t2, f2, 3, NULL, "<think>x</think> y");
    /* a reply still reasoning when it stopped */
    const char *t3[] = {"<think>", "Hmm", " wait</"};
    const int f3[] = {1, 1, 1};
    reasoning_case("reasoning cut off", t3, f3, 3, "Hmm wait</", "");
    /* Gemma 4's thought channel: the open marker names the channel, and the
     * newline that ends its header is not reasoning */
    const markers g4 = {"<|channel>thought", "<channel|>", 0};
    const char *t4[] = {"<|channel>", "thought", "\n", "I'm\nthinking", "\n", "<channel|>", "Hello", ", world!"};
    const int f4[] = {0, 1, 1, 1, 1, 1, 0, 0};
    reasoning_case_m("Gemma 4's channel", g4, t4, f4, 8, "I'm\nthinking\n", "Hello, world!");
    const char *t5[] = {"\n<|channel>thought", "  ", "x", "<channel|>", "\n\nHi"}; /* blanks around */
    const int f5[] = {1, 1, 1, 1, 0};
    reasoning_case_m("Gemma 4's channel, blanks around", g4, t5, f5, 5, "x", "Hi");
    /* the prompt opened it (a grammar follows, or --reasoning on) */
    const char *t6[] = {"\n", "Plan", ": call", "<chan", "nel|>", "<|tool_call>"};
    const int f6[] = {1, 1, 1, 1, 1, 0};
    reasoning_case_m("Gemma 4's channel opened by the prompt", (markers){g4.open, g4.close, 1}, t6, f6, 6,
                     "Plan: call", "<|tool_call>");
    /* a marker the loop did not count stays text */
    const char *t7[] = {"Sure. ", "<|channel>thought\nx<channel|>"};
    const int f7[] = {0, 0};
    reasoning_case_m("Gemma 4's channel late", g4, t7, f7, 2, NULL, "Sure. <|channel>thought\nx<channel|>");
}

/* A stream's events leave the request as its reader takes them: however many
 * tokens a reply runs, the request stores the reader's lag, not the reply. */
static void test_event_storage(void) {
    srv_req *r = srv_req_new();
    if (!r) return;
    enum { N = 100000, LAG = 40 };
    srv_event got[32];
    char want[32];
    int pushed = 0, taken = 0, in_order = 1, max_cap = 0;
    while (taken < N) {
        for (int k = 0; k < LAG && pushed < N; k++, pushed++) {
            srv_event ev = {0};
            ev.kind = pushed == N - 1 ? SRV_EV_DONE : SRV_EV_TOKEN;
            ev.token = pushed;
            snprintf(want, sizeof want, "t%d", pushed);
            ev.text = strdup(want);
            ev.text_len = strlen(want);
            srv_req_push(r, &ev);
        }
        if (r->cap_ev > max_cap) max_cap = r->cap_ev;
        int n;
        while ((n = srv_req_take(r, got, 32)) > 0) {
            for (int i = 0; i < n; i++, taken++) {
                snprintf(want, sizeof want, "t%d", taken);
                in_order &= got[i].token == taken && got[i].text && !strcmp(got[i].text, want);
                free(got[i].text); /* the taker's now */
            }
        }
    }
    CHECK(taken == N && in_order && r->finished, "%d events taken in order (%d)", taken, in_order);
    CHECK(max_cap <= 2 * LAG, "stored at most %d events for a lag of %d over %d events (want <= %d)", max_cap, LAG, N,
          2 * LAG);
    /* a reader that lagged 5000 events and caught up: the peak is not kept */
    for (int i = 0; i < 5000; i++) {
        srv_event ev = {.kind = SRV_EV_TOKEN, .token = i, .text = strdup("x"), .text_len = 1};
        srv_req_push(r, &ev);
    }
    CHECK(r->cap_ev >= 5000, "a lag of 5000 events is stored (%d)", r->cap_ev);
    int n, left = 5000;
    while ((n = srv_req_take(r, got, 32)) > 0) {
        left -= n;
        for (int i = 0; i < n; i++) free(got[i].text);
    }
    CHECK(left == 0 && r->cap_ev <= 64, "after catching up: %d left, %d stored", left, r->cap_ev);
    /* events never taken are the request's to free (ASan and valgrind check) */
    for (int i = 0; i < 10; i++) {
        srv_event ev = {.kind = SRV_EV_TOKEN, .token = i, .text = strdup("unread"), .text_len = 6};
        srv_req_push(r, &ev);
    }
    CHECK(srv_req_take(r, got, 3) == 3, "take 3 of 10");
    for (int i = 0; i < 3; i++) free(got[i].text);
    srv_req_release(r);
}

/* /tokenize's special tokens as llama-server's add_special (default false,
 * with "content") and vLLM's add_special_tokens (default true, with
 * "prompt") take them: the vocabulary's own, so BOS only where it adds one. */
static int tok_ids(const api_ctx *a, const char *body, int32_t *ids, int cap) {
    size_t n;
    api_err e;
    char *t = api_tokenize(a, body, strlen(body), &n, &e);
    json_t *j = loads(t), *arr = j ? json_object_get(j, "tokens") : NULL;
    int k = 0;
    for (; arr && k < cap && k < (int)json_array_size(arr); k++) ids[k] = (int32_t)json_integer_value(json_array_get(arr, k));
    if (!arr) k = -1;
    json_decref(j);
    free(t);
    return k;
}

static void test_tokenize_special(void) {
    const char *dir = getenv("TL_VOCAB_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-llama-spm.gguf", dir && *dir ? dir : "../shared/vocab");
    tl_model *spm = NULL;
    tl_error err = {0};
    if (tl_model_load_vocab(path, &spm, &err)) {
        CHECK(0, "cannot load %s: %s", path, err.msg);
        return;
    }
    api_ctx b = A;
    b.m = spm;
    const int32_t bos = tl_token_bos(spm);
    int32_t ids[64];
    const int plain = tok_ids(&b, "{\"content\":\"Hello world\"}", ids, 64);
    CHECK(plain > 0 && ids[0] != bos, "content: no BOS unless asked (llama-server's default)");
    int k = tok_ids(&b, "{\"content\":\"Hello world\",\"add_special\":true}", ids, 64);
    CHECK(k == plain + 1 && ids[0] == bos, "add_special: the vocabulary's BOS (%d ids of %d)", k, plain);
    k = tok_ids(&b, "{\"prompt\":\"Hello world\"}", ids, 64);
    CHECK(k == plain + 1 && ids[0] == bos, "prompt: BOS by default (vLLM's add_special_tokens)");
    k = tok_ids(&b, "{\"prompt\":\"Hello world\",\"add_special_tokens\":false}", ids, 64);
    CHECK(k == plain && ids[0] != bos, "add_special_tokens false: none");
    /* a vocabulary that adds no BOS (SmolLM2's): add_special adds nothing */
    const int a0 = tok_ids(&A, "{\"content\":\"Hello world\"}", ids, 64);
    k = tok_ids(&A, "{\"content\":\"Hello world\",\"add_special\":true}", ids, 64);
    CHECK(a0 > 0 && k == a0 && !tl_model_add_bos(A.m), "add_special on a vocabulary without BOS: %d vs %d ids", k, a0);
    tl_model_free(spm);
}

static void test_misc(void) {
    size_t n;
    /* one U+FFFD per maximal subpart (a lead byte and the continuation bytes
     * it could still take), as Python's bytes.decode('utf-8', 'replace')
     * gives for each input (its outputs, by hand) */
    static const struct {
        const char *in, *want;
    } fix[] = {
        {"a\xff\xc3\xa9\xe2\x82", "a\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd"},
        {"\xe1\xac", "\xef\xbf\xbd"},
        {"\xe1" "A", "\xef\xbf\xbd" "A"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x9f\x98\x80\xf0\x9f", "\xf0\x9f\x98\x80\xef\xbf\xbd"},
        {"\x80\x80x", "\xef\xbf\xbd\xef\xbf\xbdx"},
    };
    for (size_t i = 0; i < sizeof fix / sizeof fix[0]; i++) {
        char *f = api_utf8_fix(fix[i].in, strlen(fix[i].in), &n);
        CHECK(f && n == strlen(fix[i].want) && !strcmp(f, fix[i].want), "api_utf8_fix case %zu: U+FFFD per maximal subpart",
              i);
        free(f);
    }
    api_err e;
    char *t = api_tokenize(&A, "{\"content\":\"Hello world\"}", 25, &n, &e);
    json_t *j = loads(t);
    if (j) {
        CHECK(json_integer_value(json_object_get(j, "count")) == (json_int_t)json_array_size(json_object_get(j, "tokens")) &&
              json_array_size(json_object_get(j, "tokens")) >= 2, "tokenize");
        json_decref(j);
    }
    free(t);
    char *d = api_detokenize(&A, "{\"tokens\":[19556, 905]}", 23, &n, &e);
    json_t *dj = loads(d);
    if (dj) {
        int32_t ids[2] = {19556, 905};
        char expect[128] = "";
        for (int i = 0; i < 2; i++) {
            size_t pl = strlen(expect);
            pl += tl_token_piece(A.m, ids[i], 1, expect + pl, sizeof expect - pl - 1);
            expect[pl] = 0;
        }
        CHECK(!strcmp(json_string_value(json_object_get(dj, "content")), expect), "detokenize");
        json_decref(dj);
    }
    free(d);
    CHECK(api_detokenize(&A, "{\"tokens\":[-1]}", 15, &n, &e) == NULL && e.http == 400, "bad ids");
    CHECK(api_tokenize(&A, "{\"x\":1}", 7, &n, &e) == NULL && e.http == 400, "unknown key");
    char *m = api_models_json(&A, &n);
    j = loads(m);
    if (j) {
        json_t *d0 = json_array_get(json_object_get(j, "data"), 0);
        CHECK(!strcmp(json_string_value(json_object_get(d0, "id")), A.model_id), "model id");
        json_decref(j);
    }
    free(m);
    api_fail(&e, 400, NULL, "temperature", NULL, "bad %d", 1);
    char *es = api_error_json(&e, &n);
    j = loads(es);
    if (j) {
        json_t *eo = json_object_get(j, "error");
        CHECK(!strcmp(json_string_value(json_object_get(eo, "param")), "temperature") &&
              json_is_null(json_object_get(eo, "code")) &&
              !strcmp(json_string_value(json_object_get(eo, "type")), "invalid_request_error"),
              "error shape");
        json_decref(j);
    }
    free(es);
}

/* Each family's call format, split whole and streamed in chunks of every
 * size: the same content and calls (name, arguments, id, index). */
static void test_tool_formats(void) {
    static const struct {
        int fmt;
        const char *text, *content, *names, *args0;
    } C[] = {
        {TOOLS_HERMES, "Hi.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>", "Hi.", "f,g", "{\"x\":1}"},
        {TOOLS_LLAMA3, "{\"name\": \"f\", \"parameters\": {\"x\": [1, \"}\"]}}", "", "f", "{\"x\":[1,\"}\"]}"},
        {TOOLS_LLAMA3, "\n {\"name\": \"get\", \"parameters\": {}}", "", "get", "{}"},
        /* Llama 3's call is the whole reply: JSON later in an answer is content */
        {TOOLS_LLAMA3, "Let me look. {\"name\": \"get\", \"parameters\": {}}",
         "Let me look. {\"name\": \"get\", \"parameters\": {}}", "", NULL},
        {TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}}, "
                        "{\"name\": \"g\", \"arguments\": {\"y\": \"]\"}}]", "", "f,g", "{\"x\":1}"},
        {TOOLS_MISTRAL, "no calls [TOOL_CALL here", "no calls [TOOL_CALL here", "", NULL},
        {TOOLS_LLAMA3, "{\"name\" is not JSON", "{\"name\" is not JSON", "", NULL},
        /* Qwen3.5's XML: f's s is a string parameter (raw text, even as digits), x is JSON */
        {TOOLS_QWEN_XML, "Checking.\n\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=s>\n12\n"
                         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>",
         "Checking.", "f,g", "{\"x\":1,\"s\":\"12\"}"},
        {TOOLS_QWEN_XML, "<tool_call>\n<function=f>\n<parameter=s>\na <b> c\nd\n</parameter>\n</function>\n</tool_call>",
         "", "f", "{\"s\":\"a <b> c\\nd\"}"},
        {TOOLS_QWEN_XML, "<tool_call> is what I would write", "<tool_call> is what I would write", "", NULL},
        /* Gemma 4's: keys bare, strings between <|"|> (a close tag inside one is text), the rest JSON */
        {TOOLS_GEMMA4, "Let me check.\n<|tool_call>call:f{x:1,s:<|\"|>a, b}<tool_call|> c<|\"|>}<tool_call|>"
                       "<|tool_call>call:g{}<tool_call|>", "Let me check.", "f,g", "{\"x\":1,\"s\":\"a, b}<tool_call|> c\"}"},
        {TOOLS_GEMMA4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,opts:{a:[1,-7,3.25,true,null,<|\"|>x<|\"|>],"
                       "B:{}},n:None, q : false}<tool_call|>", "", "get_weather",
         "{\"city\":\"Paris\",\"opts\":{\"a\":[1,-7,3.25,true,null,\"x\"],\"B\":{}},\"n\":null,\"q\":false}"},
        {TOOLS_GEMMA4, "<|tool_call> is the tag", "<|tool_call> is the tag", "", NULL},
        {TOOLS_GEMMA4, "<|tool_call>call:f{x:}<tool_call|>", "<|tool_call>call:f{x:}<tool_call|>", "", NULL},
        {TOOLS_GEMMA4, "<|tool_call>call:f{x:<|\"|>open", "<|tool_call>call:f{x:<|\"|>open", "", NULL},
    };
    json_t *strs = json_pack("{s:[s]}", "f", "s");
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
        const size_t n = strlen(C[i].text);
        size_t clen = 0;
        json_t *calls = tools_split(C[i].fmt, C[i].text, n, "chatcmpl-abc", strs, &clen);
        char names[64] = "";
        for (size_t j = 0; j < json_array_size(calls); j++) {
            json_t *f = json_object_get(json_array_get(calls, j), "function");
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", j ? "," : "",
                     json_string_value(json_object_get(f, "name")));
        }
        const char *a0 = json_string_value(
            json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments"));
        CHECK(clen == strlen(C[i].content) && !memcmp(C[i].text, C[i].content, clen) && !strcmp(names, C[i].names) &&
                  (C[i].args0 ? a0 && !strcmp(a0, C[i].args0) : !calls),
              "format %d case %zu: content %.*s, calls %s, arguments %s", C[i].fmt, i, (int)clen, C[i].text, names,
              a0 ? a0 : "-");
        const char *id0 = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
        if (C[i].fmt == TOOLS_MISTRAL && id0) {
            int ok = strlen(id0) == 9;
            for (const char *c = id0; *c; c++) ok &= (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9');
            CHECK(ok, "Mistral's call ids are nine letters and digits: %s", id0);
        }
        if (!calls) { /* streamed: what went out as content and what is held are the whole text */
            for (size_t step = 1; step <= n; step += step < 4 ? 1 : 5) {
                tools_stream_st st = {0};
                api_buf content = {0};
                json_t *got = json_array();
                int rc = 0;
                for (size_t at = 0; !rc && at < n; at += step)
                    rc = tools_stream(&st, C[i].fmt, C[i].text + at, at + step > n ? n - at : step, "chatcmpl-abc",
                                      strs, &content, got);
                /* the end, as reply.c's stream_tools has it */
                if (!rc && !st.in_call && !st.seen_call) rc = api_buf_add(&content, st.hold.p, st.hold.n);
                else if (!rc && st.in_call && !st.n_calls)
                    rc = api_buf_add(&content, tools_lost_open(C[i].fmt), strlen(tools_lost_open(C[i].fmt))) ||
                         api_buf_add(&content, st.hold.p, st.hold.n);
                CHECK(!rc && !json_array_size(got) && content.n == n && !memcmp(content.p, C[i].text, n),
                      "format %d case %zu streamed in %zu-byte chunks: no calls, the text as content", C[i].fmt, i,
                      step);
                json_decref(got);
                api_buf_free(&content);
                api_buf_free(&st.hold);
            }
            continue;
        }
        for (size_t step = 1; step <= n; step += step < 4 ? 1 : 5) {
            tools_stream_st st = {0};
            api_buf content = {0};
            json_t *got = json_array();
            int rc = 0;
            for (size_t at = 0; !rc && at < n; at += step)
                rc = tools_stream(&st, C[i].fmt, C[i].text + at, at + step > n ? n - at : step, "chatcmpl-abc",
                                  strs, &content, got);
            int same = !rc && json_array_size(got) == json_array_size(calls) && content.n == clen &&
                       (!clen || !memcmp(content.p, C[i].text, clen));
            for (size_t j = 0; same && j < json_array_size(got); j++) {
                json_t *g = json_array_get(got, j), *w = json_array_get(calls, j);
                same = json_integer_value(json_object_get(g, "index")) == (json_int_t)j &&
                       json_equal(json_object_get(g, "function"), json_object_get(w, "function")) &&
                       json_equal(json_object_get(g, "id"), json_object_get(w, "id"));
            }
            CHECK(same, "format %d case %zu streamed in %zu-byte chunks equals whole", C[i].fmt, i, step);
            json_decref(got);
            api_buf_free(&content);
            api_buf_free(&st.hold);
        }
        json_decref(calls);
    }
    CHECK(tools_format("{{ '[TOOL_CALLS] [' }}{% for t in tools %}", 1) == TOOLS_MISTRAL &&
              tools_format("<|python_tag|>{{ tools }}", 1) == TOOLS_LLAMA3 &&
              tools_format("<tool_call>{{ tools }}", 1) == TOOLS_HERMES &&
              tools_format("[TOOL_CALLS]", 0) == TOOLS_HERMES &&
              tools_format("<tool_call>\n<function=example_function_name>{{ tools }}", 1) == TOOLS_QWEN_XML &&
              tools_format("{{- '<|tool_call>call:' + function['name'] + '{' -}}{{ tools }}", 1) == TOOLS_GEMMA4,
          "the format follows the template");
    json_decref(strs);
}

/* Gemma 4's grammar: calls in its syntax whose arguments follow each
 * function's parameters (the keys in the template's order, the required
 * ones always, strings between <|"|> within their enum or length). */
static void g4_grammar_case(const tl_vocab_trie *trie, const char *tools, int parallel, const char *only,
                            const char *text, int want) {
    json_t *root = json_loads(tools, 0, NULL);
    tools_req t;
    api_err e;
    json_t *body = json_pack("{s:O, s:b, s:o}", "tools", json_object_get(root, "tools"), "parallel_tool_calls",
                             parallel, "tool_choice",
                             only ? json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", only)
                                  : json_string("required"));
    tl_grammar *g = NULL;
    tl_matcher *m = NULL;
    tl_error err = {0};
    int ok = body && !tools_parse(body, &t, &e) && !tools_grammar(&t, TOOLS_GEMMA4, &g, &err) &&
             !tl_matcher_new(g, trie, &m, &err);
    CHECK(ok, "Gemma 4 grammar compiles: %s", err.msg);
    if (ok) {
        int got = tl_matcher_accept_bytes(m, text, strlen(text), NULL) == 0 && tl_matcher_can_end(m);
        CHECK(got == want, "Gemma 4 grammar %s %s", want ? "accepts" : "refuses", text);
    }
    tl_matcher_free(m);
    tl_grammar_free(g);
    json_decref(body);
    json_decref(root);
}

static void test_gemma4_grammar(void) {
    tl_vocab_trie *trie = NULL;
    tl_error err = {0};
    CHECK(tl_vocab_trie_new(A.m, &trie, &err) == TL_OK, "trie: %s", err.msg);
    if (!trie) return;
    static const char TOOLS[] =
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]},\"City\":{\"type\":\"string\",\"maxLength\":12},"
        "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7,\"nullable\":true}},\"required\":[\"City\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"}},\"required\":[\"a\",\"b\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"plan\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"steps\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":2,\"items\":{\"type\":\"object\",\"properties\":"
        "{\"do\":{\"type\":\"string\"},\"done\":{\"type\":\"boolean\"}},\"required\":[\"do\"]}},"
        "\"note\":{\"type\":[\"string\",\"null\"]},\"mode\":{\"anyOf\":[{\"const\":1},{\"type\":\"string\",\"enum\":[\"x\"]}]},"
        "\"extra\":{}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]}";
#define Q "<|\"|>"
#define CALL(x) "<|tool_call>call:" x "<tool_call|>"
    static const struct {
        const char *text;
        int parallel, want;
    } C[] = {
        {CALL("get_weather{City:" Q "Paris" Q "}"), 1, 1},
        /* the template's order: case-folded names (City, days, unit) */
        {CALL("get_weather{City:" Q "Paris" Q ",days:3,unit:" Q "c" Q "}"), 1, 1},
        {CALL("get_weather{City:" Q "a<b" Q ",unit:" Q "f" Q "}"), 1, 0}, /* maxLength: no '<' counted */
        {CALL("get_weather{unit:" Q "c" Q ",City:" Q "Paris" Q "}"), 1, 0},
        {CALL("get_weather{days:3}"), 1, 0},                                /* City is required */
        {CALL("get_weather{City:" Q "Paris" Q ",days:9}"), 1, 0},          /* maximum */
        {CALL("get_weather{City:" Q "Paris" Q ",days:null}"), 1, 1},       /* nullable */
        {CALL("get_weather{City:" Q "Paris" Q ",unit:" Q "k" Q "}"), 1, 0}, /* enum */
        {CALL("get_weather{City:" Q "Constantinople" Q "}"), 1, 0},        /* maxLength 12 */
        {CALL("get_weather{City:\"Paris\"}"), 1, 0},                       /* JSON's quotes */
        {CALL("get_weather{City:" Q "Paris" Q ",wind:1}"), 1, 0},
        {CALL("add{a:2,b:-3.5e2}") CALL("add{a:0,b:1}"), 1, 1},
        {CALL("add{a:2,b:3}") CALL("add{a:0,b:1}"), 0, 0}, /* one call when not parallel */
        {CALL("add{a:" Q "2" Q ",b:3}"), 1, 0},
        {CALL("plan{steps:[{do:" Q "a<b>" Q ",done:true}]}"), 1, 1},
        {CALL("plan{extra:{k:[1,{z:null}],s:" Q "x" Q "},mode:1,note:null,steps:[{do:" Q "a" Q "},{do:" Q "b" Q "}]}"),
         1, 1},
        {CALL("plan{mode:" Q "x" Q ",note:" Q "n" Q "}"), 1, 1},
        {CALL("plan{steps:[]}"), 1, 0},                                        /* minItems */
        {CALL("plan{steps:[{do:" Q "a" Q "},{do:" Q "b" Q "},{do:" Q "c" Q "}]}"), 1, 0}, /* maxItems */
        {CALL("plan{steps:[{done:true}]}"), 1, 0},
        {CALL("plan{mode:2}"), 1, 0},
        {CALL("plan{note:" Q "a<|b" Q "}"), 1, 0}, /* no string marker's start inside a string */
        {CALL("now{}"), 1, 1},
        {CALL("now{any:[1,2],k:" Q "v" Q "}"), 1, 1}, /* no parameters: any object */
        {CALL("unknown{}"), 1, 0},
        {"<|tool_call>call:now{}", 1, 0},
    };
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) g4_grammar_case(trie, TOOLS, C[i].parallel, NULL, C[i].text, C[i].want);
    g4_grammar_case(trie, TOOLS, 1, "add", CALL("add{a:1,b:2}"), 1);
    g4_grammar_case(trie, TOOLS, 1, "add", CALL("now{}"), 0);
#undef CALL
#undef Q
    tl_vocab_trie_free(trie);
}

int main(void) {
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load_vocab(MODEL, &m, &err)) {
        CHECK(0, "cannot load %s: %s (run make models)", MODEL, err.msg);
        return tl_test_summary();
    }
    tl_chat_template *tmpl = NULL;
    CHECK(tl_chat_template_new(m, NULL, &tmpl, &err) == TL_OK, "compile the template: %s", err.msg);
    A = (api_ctx){m, "SmolLM2-135M-Instruct.Q4_1.gguf", 2048, 1024, 0, tmpl, NULL, NULL, 1};
    test_fields();
    test_messages();
    test_hostile();
    test_good();
    test_replies();
    test_reasoning();
    test_event_storage();
    test_misc();
    test_tokenize_special();
    test_tool_formats();
    test_gemma4_grammar();
    /* and compiled per request, as where the server could not compile it */
    A.tmpl = NULL;
    test_messages();
    tl_chat_template_free(tmpl);
    tl_model_free(m);
    return tl_test_summary();
}
