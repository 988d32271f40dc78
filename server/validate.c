/* server/validate: a request body into srv_req. The keys each endpoint
 * knows, sampling, stop strings, logit bias, response formats, the prompt's
 * length against the context; every failure is a 4xx with a message naming
 * the field, never an abort. Prompts are prompt.c's. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "api.h"
#include "chat/chat.h"
#include "tools.h"

#define MAX_STOP 4
#define MAX_STOP_LEN 256
#define MAX_BIAS 1024
#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* ---- which keys exist ------------------------------------------------------- */

static const char *const COMMON_KEYS[] = {
    "model", "max_tokens", "temperature", "top_p", "min_p", "top_k", "seed", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "stream",
    "stream_options", "n", "user", "prompt_cache_key", "response_format", "grammar", NULL};
static const char *const CHAT_KEYS[] = {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                        "tool_choice", "parallel_tool_calls", "max_thinking_tokens",
                                        "reasoning_effort", "chat_template_kwargs", NULL};
static const char *const COMPL_KEYS[] = {"prompt", "echo", "best_of", "suffix", NULL};
/* Known OpenAI fields this server does not implement: a clear 400, not silence. */
static const char *const UNSUPPORTED[] = {
    "functions", "function_call", "audio",
    "modalities", "prediction", "web_search_options", "store", "metadata",
    "service_tier", "verbosity", "safety_identifier", NULL};

static int check_keys(json_t *root, srv_kind kind, api_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (api_in_list(COMMON_KEYS, k) || api_in_list(kind == SRV_CHAT ? CHAT_KEYS : COMPL_KEYS, k))
            continue;
        if (api_in_list(UNSUPPORTED, k)) {
            if (json_is_null(v)) continue;
            return BAD(k, "'%s' is not supported by this server", k);
        }
        return BAD(k, "unknown field '%s'", k);
    }
    return 0;
}

/* ---- sampling, stop, bias -------------------------------------------------- */

static int parse_stop(json_t *root, srv_req *r, api_err *e) {
    json_t *v = api_field(root, "stop");
    if (!v) return 0;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > MAX_STOP) return BAD("stop", "at most %d stop strings", MAX_STOP);
    } else if (!json_is_string(v)) {
        return BAD("stop", "'stop' must be a string or an array of strings");
    }
    if (!n) return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s)) return BAD("stop", "'stop' must hold strings");
        size_t sl = json_string_length(s);
        if (sl == 0 || sl > MAX_STOP_LEN)
            return BAD("stop", "stop strings must be 1..%d bytes", MAX_STOP_LEN);
        if (!(r->stop[i] = strdup(json_string_value(s))))
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        r->n_stop = (int)i + 1;
    }
    return 0;
}

static int parse_bias(const api_ctx *a, json_t *root, srv_req *r, api_err *e) {
    json_t *v = api_field(root, "logit_bias");
    if (!v) return 0;
    if (!json_is_object(v)) return BAD("logit_bias", "'logit_bias' must be an object");
    size_t n = json_object_size(v);
    if (n > MAX_BIAS) return BAD("logit_bias", "at most %d logit_bias entries", MAX_BIAS);
    if (!n) return 0;
    if (!(r->bias = calloc(n, sizeof *r->bias)))
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const char *k;
    json_t *b;
    int i = 0, nv = tl_model_n_vocab(a->m);
    json_object_foreach(v, k, b) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= nv || strlen(k) > 9)
            return BAD("logit_bias", "logit_bias key '%.40s' is not a token id in 0..%d", k, nv - 1);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return BAD("logit_bias", "logit_bias values must be numbers in -100..100");
        r->bias[i].token = (int32_t)id;
        r->bias[i].bias = (float)json_number_value(b);
        i++;
    }
    r->sp.logit_bias = r->bias;
    r->sp.n_logit_bias = i;
    return 0;
}

static int parse_sampling(const api_ctx *a, json_t *root, srv_req *r, api_err *e) {
    tl_sampler_params *sp = &r->sp;
    memset(sp, 0, sizeof *sp);
    sp->temp = 1.0f; /* OpenAI's default */
    sp->top_p = 1.0f;
    sp->repeat_penalty = 1.0f;
    sp->penalty_last_n = -1;
    sp->seed = TL_SEED_RANDOM;
    long long x;
    int rc;
    if (api_get_num(root, "temperature", 0, 2, 0, &sp->temp, e) < 0 ||
        api_get_num(root, "top_p", 0, 1, 1, &sp->top_p, e) < 0 ||
        api_get_num(root, "min_p", 0, 1, 0, &sp->min_p, e) < 0 ||
        api_get_num(root, "presence_penalty", -2, 2, 0, &sp->presence_penalty, e) < 0 ||
        api_get_num(root, "frequency_penalty", -2, 2, 0, &sp->freq_penalty, e) < 0)
        return -1;
    if ((rc = api_get_int(root, "top_k", -1, tl_model_n_vocab(a->m), &x, e)) < 0) return -1;
    if (rc) sp->top_k = (int)x;
    if ((rc = api_get_int(root, "seed", INT64_MIN, INT64_MAX, &x, e)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)x;
    return parse_bias(a, root, r, e);
}

/* n, stream, stream_options, model, user, prompt_cache_key, max_tokens. */
static int parse_common(const api_ctx *a, json_t *root, srv_kind kind, srv_req *r, api_err *e) {
    long long x;
    int rc;
    if (api_get_int(root, "n", 1, 1, &x, e) < 0) return BAD("n", "only n = 1 is supported");
    if (api_get_str(root, "model", NULL, e) < 0 || api_get_str(root, "user", NULL, e) < 0 ||
        api_get_str(root, "prompt_cache_key", NULL, e) < 0 || api_get_bool(root, "stream", &r->stream, e) < 0)
        return -1;
    json_t *so = api_field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) return BAD("stream_options", "'stream_options' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(so, k, v) if (strcmp(k, "include_usage"))
            return BAD("stream_options", "unknown field 'stream_options.%.40s'", k);
        if (api_get_bool(so, "include_usage", &r->include_usage, e) < 0) return -1;
        if (!r->stream) r->include_usage = 0;
    }
    const char *mt = kind == SRV_CHAT && api_field(root, "max_completion_tokens")
                         ? "max_completion_tokens" : "max_tokens";
    if ((rc = api_get_int(root, mt, kind == SRV_CHAT ? 1 : 0, a->n_ctx, &x, e)) < 0) return -1;
    r->max_tokens = rc ? (int)x : -1;
    return 0;
}

/* ---- the two endpoints ---------------------------------------------------------- */

/* response_format (text, json_object, json_schema) and llama.cpp's `grammar`
 * (GBNF): compiled here, on the HTTP thread, into r->grammar. */
static const char ANY_OBJECT[] = "{\"type\": \"object\", \"additionalProperties\": true}";

static int parse_format(json_t *root, srv_req *r, api_err *e) {
    json_t *rf = api_field(root, "response_format"), *g = api_field(root, "grammar");
    tl_error err = {0};
    int rc = 0;
    const char *param = "response_format";
    if (rf) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        const char *type = json_is_string(t) ? json_string_value(t) : "";
        if (!strcmp(type, "text")) {
            if (json_object_size(rf) != 1) return BAD("response_format", "response_format 'text' takes no other field");
            rf = NULL;
        } else if (!strcmp(type, "json_object")) {
            if (json_object_size(rf) != 1) return BAD("response_format", "response_format 'json_object' takes no other field");
            rc = tl_grammar_from_json_schema(ANY_OBJECT, sizeof ANY_OBJECT - 1, &r->grammar, &err);
        } else if (!strcmp(type, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *sch = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!json_is_object(js)) return BAD("response_format", "response_format 'json_schema' needs a 'json_schema' object");
            const char *k;
            json_t *v;
            json_object_foreach(js, k, v) if (strcmp(k, "name") && strcmp(k, "schema") && strcmp(k, "strict") &&
                                              strcmp(k, "description"))
                return BAD("response_format", "unknown field 'json_schema.%.40s'", k);
            char *text = sch ? json_dumps(sch, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            if (sch && !text) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            /* no schema: any JSON object, as OpenAI does */
            rc = text ? tl_grammar_from_json_schema(text, strlen(text), &r->grammar, &err)
                      : tl_grammar_from_json_schema(ANY_OBJECT, sizeof ANY_OBJECT - 1, &r->grammar, &err);
            free(text);
        } else {
            return BAD("response_format", "response_format type must be 'text', 'json_object' or 'json_schema'");
        }
    }
    if (!rc && g && !json_is_null(g)) {
        param = "grammar";
        if (!json_is_string(g)) return BAD("grammar", "'grammar' must be a string (GBNF)");
        if (r->grammar) return BAD("grammar", "give 'grammar' or a JSON response_format, not both");
        rc = tl_grammar_parse(json_string_value(g), json_string_length(g), &r->grammar, &err);
    }
    if (rc == TL_ERR_NOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rc) return BAD(param, "%s", err.msg);
    return 0;
}

static int parse_chat(const api_ctx *a, json_t *root, srv_req *r, api_err *e) {
    long long x;
    int rc;
    json_t *lp = api_field(root, "logprobs");
    if (lp && !json_is_boolean(lp)) return BAD("logprobs", "'logprobs' must be true or false");
    r->logprobs = lp && json_is_true(lp);
    if ((rc = api_get_int(root, "top_logprobs", 0, SRV_MAX_TOP, &x, e)) < 0) return -1;
    if (rc && !r->logprobs) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = rc ? (int)x : 0;
    tools_req t;
    if (tools_parse(root, &t, e)) return -1;
    r->harmony = tl_chat_harmony(tl_model_chat_template(a->m));
    if (t.tools && t.mode != TOOLS_NONE) {
        if (r->grammar) return BAD("tools", "tool calls and a JSON response_format or grammar in one request are not supported");
        tl_error err = {0};
        const char *tm = tl_model_chat_template(a->m);
        r->tool_fmt = tools_format(tm, tm && strstr(tm, "tools"));
        if (r->tool_fmt == TOOLS_QWEN_XML && !(r->tool_strs = tools_string_params(t.tools)))
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        rc = tools_grammar(&t, r->tool_fmt, &r->grammar, &err);
        if (rc == TL_ERR_NOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (rc) return BAD("tools", "%s", err.msg);
        r->grammar_lazy = t.mode == TOOLS_AUTO;
        r->tool_mode = t.mode;
        if (r->harmony != (r->tool_fmt == TOOLS_HARMONY)) r->harmony = 0; /* a template that speaks of
                                                                              * no tools: Hermes */
    }
    /* reasoning: its budget (max_thinking_tokens, or reasoning_effort's) */
    r->think_budget = -1;
    json_t *effort = api_field(root, "reasoning_effort");
    if (effort) {
        static const struct {
            const char *name;
            int budget;
        } EFFORT[] = {{"none", 0}, {"minimal", 0}, {"low", 256}, {"medium", 1024}, {"high", 4096}};
        const char *ev = json_is_string(effort) ? json_string_value(effort) : "";
        size_t k = 0;
        while (k < sizeof EFFORT / sizeof *EFFORT && strcmp(EFFORT[k].name, ev)) k++;
        if (k == sizeof EFFORT / sizeof *EFFORT)
            return BAD("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium or high");
        r->think_budget = EFFORT[k].budget;
    }
    if ((rc = api_get_int(root, "max_thinking_tokens", 0, a->n_ctx, &x, e)) < 0) return -1;
    if (rc) r->think_budget = (int)x;
    r->think = a->reasoning != 0 && !r->harmony; /* harmony's reasoning is a channel */
    tl_chat_think_markers(tl_model_chat_template(a->m), &r->think_open, &r->think_close);
    if (r->harmony) r->think_budget = -1;
    json_t *kw = api_field(root, "chat_template_kwargs");
    api_think th = {r->think_budget, r->think && r->grammar && !r->grammar_lazy, 0};
    if (!r->harmony || !effort || (kw && !json_is_object(kw))) {
        rc = api_chat_prompt(a, api_field(root, "messages"), &t, kw, 1, &th, &r->prompt, &r->n_prompt, &r->n_shared, e);
        r->think_started = th.started;
        return rc;
    }
    /* harmony: the effort is the template's reasoning_effort (low, medium or
     * high), as llama.cpp passes it; the reasoning has no budget */
    const char *ev = json_string_value(effort);
    json_t *kw2 = kw ? json_deep_copy(kw) : json_object();
    if (!kw2 || (!json_object_get(kw2, "reasoning_effort") &&
                 json_object_set_new(kw2, "reasoning_effort",
                                     json_string(!strcmp(ev, "none") || !strcmp(ev, "minimal") ? "low" : ev)))) {
        json_decref(kw2);
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    rc = api_chat_prompt(a, api_field(root, "messages"), &t, kw2, 1, &th, &r->prompt, &r->n_prompt, &r->n_shared, e);
    r->think_started = th.started;
    json_decref(kw2);
    return rc;
}

static int parse_completion(const api_ctx *a, json_t *root, srv_req *r, api_err *e) {
    long long x;
    int rc;
    if ((rc = api_get_int(root, "logprobs", 0, SRV_MAX_TOP, &x, e)) < 0) return -1;
    r->logprobs = rc;
    r->top_logprobs = rc ? (int)x : 0;
    if (api_get_bool(root, "echo", &r->echo, e) < 0) return -1;
    if ((rc = api_get_int(root, "best_of", 1, 1 << 20, &x, e)) < 0) return -1;
    if (rc && x > 1) return BAD("best_of", "'best_of' > 1 is not supported");
    json_t *sfx = api_field(root, "suffix");
    if (sfx && !(json_is_string(sfx) && json_string_length(sfx) == 0))
        return BAD("suffix", "'suffix' is not supported");
    return api_completion_prompt(a, api_field(root, "prompt"), &r->prompt, &r->n_prompt, e);
}

static void make_id(srv_req *r) {
    unsigned char rnd[12] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        memcpy(rnd, &ts, sizeof rnd < sizeof ts ? sizeof rnd : sizeof ts);
    }
    int n = snprintf(r->id, sizeof r->id, "%s", r->kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof rnd; i++) n += snprintf(r->id + n, sizeof r->id - (size_t)n, "%02x", rnd[i]);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->created = ts.tv_sec;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r->t_arrival = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The prompt must leave room for the requested tokens within -c. */
static int check_length(const api_ctx *a, srv_req *r, api_err *e) {
    const char *p = r->kind == SRV_CHAT ? "messages" : "prompt";
    if (r->n_prompt == 0) return BAD(p, "the prompt is empty");
    int room = r->max_tokens > 0 ? r->max_tokens : r->max_tokens == 0 ? 0 : 1;
    /* Anthropic's and the Responses clients ask for more than a small
     * context holds (Claude Code: 32,000): they get what is left */
    if (r->dialect && r->max_tokens > 0 && (long long)r->n_prompt + room > a->n_ctx && r->n_prompt < a->n_ctx)
        r->max_tokens = room = a->n_ctx - r->n_prompt;
    if ((long long)r->n_prompt + room > a->n_ctx)
        return api_fail(e, 400, "invalid_request_error", p, "context_length_exceeded",
                        "this model's context is %d tokens; the prompt has %d and %d more were "
                        "requested", a->n_ctx, r->n_prompt, room);
    return 0;
}

static int parse_root(const api_ctx *a, srv_kind kind, json_t *root, srv_req *r, int count_only, api_err *e) {
    r->kind = kind;
    int rc = check_keys(root, kind, e);
    if (!rc) rc = parse_common(a, root, kind, r, e);
    if (!rc) rc = parse_sampling(a, root, r, e);
    if (!rc) rc = parse_stop(root, r, e);
    if (!rc) rc = parse_format(root, r, e);
    if (!rc) rc = kind == SRV_CHAT ? parse_chat(a, root, r, e) : parse_completion(a, root, r, e);
    if (!rc && !count_only) rc = check_length(a, r, e);
    if (rc) return -1;
    make_id(r);
    return 0;
}

int api_parse_request(const api_ctx *a, srv_kind kind, const char *body, size_t len, srv_req *r,
                      api_err *e) {
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return -1;
    int rc = parse_root(a, kind, root, r, 0, e);
    json_decref(root);
    return rc;
}

int api_parse_chat_obj(const api_ctx *a, json_t *root, srv_req *r, int count_only, api_err *e) {
    return parse_root(a, SRV_CHAT, root, r, count_only, e);
}
