/* server/api: the OpenAI-compatible wire format. Owns request parsing and
 * validation (jansson; every failure is a 4xx with a message, never an abort)
 * and the JSON of every reply: completions, stream chunks, usage, logprobs in
 * the chat and legacy shapes, errors, /v1/models, /tokenize, /detokenize. */
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

#define MAX_DEPTH 32
#define MAX_STOP 4
#define MAX_STOP_LEN 256
#define MAX_BIAS 1024
#define LP_FLOOR -9999.0 /* stands for log(0): JSON has no -Infinity */

/* ---- small helpers ----------------------------------------------------------- */

int api_fail(api_err *e, int http, const char *type, const char *param, const char *code,
             const char *fmt, ...) {
    e->http = http;
    e->type = type ? type : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    /* a client's string cut at a byte limit ('%.40s', or these fields' size)
     * may end mid-character: JSON needs whole ones */
    api_utf8_scrub(e->param);
    api_utf8_scrub(e->code);
    api_utf8_scrub(e->msg);
    return -1;
}

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

int api_buf_add(api_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void api_buf_free(api_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

void api_utf8_scrub(char *s) {
    size_t n = strlen(s), j = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k) memmove(s + j, s + i, k), j += k, i += k;
        else i++;
    }
    s[j] = 0;
}

static int utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

char *api_utf8_fix(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1); /* each bad byte may become 3 bytes */
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k) {
            memcpy(o + j, s + i, k);
            j += k;
            i += k;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i++;
        }
    }
    o[j] = 0;
    if (out_len) *out_len = j;
    return o;
}

static size_t utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/* A JSON string of arbitrary bytes (bad UTF-8 -> U+FFFD). */
static json_t *jstr_bytes(const char *s, size_t n) {
    size_t fl;
    char *f = api_utf8_fix(s, n, &fl);
    if (!f) return NULL;
    json_t *j = json_stringn(f, fl);
    free(f);
    return j;
}

static json_t *jlogprob(float lp) {
    return json_real(isfinite(lp) ? (double)lp : LP_FLOOR);
}

int api_json_depth(const char *s, size_t n) {
    int d = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++d > max) max = d;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    return max;
}

json_t *api_load_body(const char *body, size_t len, api_err *e) {
    if (api_json_depth(body, len) > MAX_DEPTH) {
        BAD(NULL, "JSON nesting deeper than %d levels", MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        BAD(NULL, "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        BAD(NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- typed field access (null counts as absent) ------------------------------- */

json_t *api_field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

/* Integers, or reals with an integral value, within lo..hi. 1 set, 0 absent, -1 bad. */
static int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || d < -9.2e18 || d > 9.2e18) return BAD(k, "'%s' must be an integer", k);
        x = (long long)d;
    } else {
        return BAD(k, "'%s' must be an integer", k);
    }
    if (x < lo || x > hi) return BAD(k, "'%s' must be in %lld..%lld, got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

static int get_num(json_t *o, const char *k, double lo, double hi, int lo_open, float *out,
                   api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return BAD(k, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (lo_open && d == lo))
        return BAD(k, "'%s' must be in %s%g..%g, got %g", k, lo_open ? "(" : "", lo, hi, d);
    *out = (float)d;
    return 1;
}

static int get_bool(json_t *o, const char *k, int *out, api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return BAD(k, "'%s' must be true or false", k);
    *out = json_is_true(v);
    return 1;
}

static int get_str(json_t *o, const char *k, const char **out, api_err *e) {
    json_t *v = api_field(o, k);
    if (!v) return 0;
    if (!json_is_string(v)) return BAD(k, "'%s' must be a string", k);
    if (out) *out = json_string_value(v);
    return 1;
}

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

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int check_keys(json_t *root, srv_kind kind, api_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (in_list(COMMON_KEYS, k) || in_list(kind == SRV_CHAT ? CHAT_KEYS : COMPL_KEYS, k))
            continue;
        if (in_list(UNSUPPORTED, k)) {
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
    if (get_num(root, "temperature", 0, 2, 0, &sp->temp, e) < 0 ||
        get_num(root, "top_p", 0, 1, 1, &sp->top_p, e) < 0 ||
        get_num(root, "min_p", 0, 1, 0, &sp->min_p, e) < 0 ||
        get_num(root, "presence_penalty", -2, 2, 0, &sp->presence_penalty, e) < 0 ||
        get_num(root, "frequency_penalty", -2, 2, 0, &sp->freq_penalty, e) < 0)
        return -1;
    if ((rc = get_int(root, "top_k", -1, tl_model_n_vocab(a->m), &x, e)) < 0) return -1;
    if (rc) sp->top_k = (int)x;
    if ((rc = get_int(root, "seed", INT64_MIN, INT64_MAX, &x, e)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)x;
    return parse_bias(a, root, r, e);
}

/* n, stream, stream_options, model, user, prompt_cache_key, max_tokens. */
static int parse_common(const api_ctx *a, json_t *root, srv_kind kind, srv_req *r, api_err *e) {
    long long x;
    int rc;
    if (get_int(root, "n", 1, 1, &x, e) < 0) return BAD("n", "only n = 1 is supported");
    if (get_str(root, "model", NULL, e) < 0 || get_str(root, "user", NULL, e) < 0 ||
        get_str(root, "prompt_cache_key", NULL, e) < 0 || get_bool(root, "stream", &r->stream, e) < 0)
        return -1;
    json_t *so = api_field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) return BAD("stream_options", "'stream_options' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(so, k, v) if (strcmp(k, "include_usage"))
            return BAD("stream_options", "unknown field 'stream_options.%.40s'", k);
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0) return -1;
        if (!r->stream) r->include_usage = 0;
    }
    const char *mt = kind == SRV_CHAT && api_field(root, "max_completion_tokens")
                         ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_int(root, mt, kind == SRV_CHAT ? 1 : 0, a->n_ctx, &x, e)) < 0) return -1;
    r->max_tokens = rc ? (int)x : -1;
    return 0;
}

/* ---- prompts --------------------------------------------------------------- */


static int tokenize(const tl_model *m, const char *s, size_t n, int flags, int32_t **ids,
                    int *n_ids, api_err *e) {
    tl_error err = {0};
    size_t nt = 0;
    if (tl_tokenize(m, s, n, flags, ids, &nt, &err))
        return api_fail(e, 400, "invalid_request_error", NULL, NULL, "cannot tokenize: %s", err.msg);
    if (nt > (size_t)1 << 30) return BAD(NULL, "prompt too long");
    *n_ids = (int)nt;
    return 0;
}

/* One message's content: a string, or text parts joined with "\n". */
static int msg_content(json_t *c, int i, const char *role, api_buf *b, api_err *e) {
    char p[48];
    snprintf(p, sizeof p, "messages[%d].content", i);
    if (!c) {
        if (strcmp(role, "assistant")) return BAD(p, "'%s' is missing", p);
        return api_buf_add(b, "", 0) ? api_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    }
    if (json_is_string(c))
        return api_buf_add(b, json_string_value(c), json_string_length(c))
                   ? api_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    if (!json_is_array(c)) return BAD(p, "'%s' must be a string or an array of parts", p);
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        json_t *t = json_is_object(part) ? json_object_get(part, "type") : NULL;
        if (!json_is_string(t)) return BAD(p, "each part of '%s' needs a string 'type'", p);
        const char *ty = json_string_value(t);
        if (strcmp(ty, "text")) {
            if (!strcmp(ty, "image_url") || !strcmp(ty, "input_audio") || !strcmp(ty, "file") ||
                !strcmp(ty, "image"))
                return BAD(p, "'%s' parts are not supported (text only)", ty);
            return BAD(p, "unknown content part type '%.40s'", ty);
        }
        json_t *tx = json_object_get(part, "text");
        if (!json_is_string(tx) || json_object_size(part) != 2)
            return BAD(p, "a text part is {\"type\":\"text\",\"text\":STRING}");
        if ((j && api_buf_add(b, "\n", 1)) ||
            api_buf_add(b, json_string_value(tx), json_string_length(tx)))
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!b->p && api_buf_add(b, "", 0)) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

/* Prefixes of lines that change on every request and tell the model nothing.
 * Claude Code's billing line carries a per-request hash (cch=...) at the very
 * top of its system prompt: kept, it would end every turn's cached prefix
 * there. Anthropic's own API does not show it to the model either. */
static const char *const VOLATILE[] = {"x-anthropic-billing-header:", NULL};

size_t api_volatile_strip(char *s, size_t n) {
    size_t w = 0, i = 0;
    while (i < n) {
        size_t e = i;
        while (e < n && s[e] != '\n') e++;
        size_t end = e < n ? e + 1 : e; /* the line with its newline */
        int drop = 0;
        for (int k = 0; VOLATILE[k]; k++) {
            size_t kl = strlen(VOLATILE[k]);
            if (e - i >= kl && !strncasecmp(s + i, VOLATILE[k], kl)) drop = 1;
        }
        if (!drop) {
            memmove(s + w, s + i, end - i);
            w += end - i;
        }
        i = end;
    }
    /* a stripped first line leaves the blank line that followed it */
    size_t lead = 0;
    if (w < n) {
        while (lead < w && s[lead] == '\n') lead++;
        memmove(s, s + lead, w - lead);
        w -= lead;
    }
    s[w] = 0;
    return w;
}

/* One {role, content} for the template, from a request message. */
static json_t *chat_message(json_t *msg, int i, int tools_native, api_err *e) {
    char p[32];
    snprintf(p, sizeof p, "messages[%d]", i);
    if (!json_is_object(msg)) return BAD(p, "'%s' must be an object", p), NULL;
    const char *k;
    json_t *v;
    json_object_foreach(msg, k, v) {
        if (!strcmp(k, "role") || !strcmp(k, "content") || !strcmp(k, "name") || !strcmp(k, "tool_calls") ||
            !strcmp(k, "tool_call_id") || !strcmp(k, "reasoning_content"))
            continue;
        if (!strcmp(k, "function_call") || !strcmp(k, "refusal") || !strcmp(k, "audio")) {
            if (json_is_null(v)) continue;
            return BAD(p, "'%s.%s' is not supported by this server", p, k), NULL;
        }
        return BAD(p, "unknown field '%s.%.40s'", p, k), NULL;
    }
    json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role)) return BAD(p, "'%s.role' must be a string", p), NULL;
    const char *ro = json_string_value(role);
    if (!strcmp(ro, "developer")) ro = "system";
    else if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "tool"))
        return BAD(p, "role '%.40s' is not supported (system, developer, user, assistant, tool)", ro), NULL;
    json_t *name = api_field(msg, "name");
    if (name && !json_is_string(name)) return BAD(p, "'%s.name' must be a string", p), NULL;
    api_buf b = {0};
    if (msg_content(api_field(msg, "content"), i, ro, &b, e)) {
        api_buf_free(&b);
        return NULL;
    }
    /* here, where every dialect's system messages pass, so the rule is one */
    if (!strcmp(ro, "system") && b.p) b.n = api_volatile_strip(b.p, b.n);
    /* tool calls the assistant made: the template renders them (arguments as
     * objects, as Hugging Face templates expect), or, without tool support,
     * they become the tagged blocks the model was asked to write */
    json_t *tc = api_field(msg, "tool_calls"), *calls = NULL;
    if (tc) {
        if (strcmp(ro, "assistant") || !json_is_array(tc)) {
            api_buf_free(&b);
            return BAD(p, "'%s.tool_calls' must be an array on an assistant message", p), NULL;
        }
        calls = json_array();
        size_t j;
        json_t *c;
        json_array_foreach(tc, j, c) {
            json_t *fn = json_object_get(c, "function"), *nm = json_object_get(fn, "name"),
                   *args = json_object_get(fn, "arguments");
            json_t *av = json_is_string(args) ? json_loads(json_string_value(args), JSON_DECODE_ANY, NULL)
                                              : json_incref(args);
            if (!json_is_string(nm) || !av) {
                json_decref(av);
                json_decref(calls);
                api_buf_free(&b);
                return BAD(p, "'%s.tool_calls' entries need function.name and JSON function.arguments", p), NULL;
            }
            json_t *id = json_object_get(c, "id");
            json_array_append_new(calls, json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id", id, "type", "function",
                                                   "function", "name", nm, "arguments", av));
            if (!tools_native) {
                json_t *blk = json_pack("{s:O, s:O}", "name", nm, "arguments", av);
                char *t = blk ? json_dumps(blk, JSON_COMPACT) : NULL;
                json_decref(blk);
                if (!t || (b.n && api_buf_add(&b, "\n", 1)) || api_buf_add(&b, "<tool_call>\n", 12) ||
                    api_buf_add(&b, t, strlen(t)) || api_buf_add(&b, "\n</tool_call>", 13)) {
                    free(t);
                    json_decref(calls);
                    api_buf_free(&b);
                    return api_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
                }
                free(t);
            }
        }
    }
    /* an earlier turn's reasoning, as this server returned it: the
     * template decides whether it renders (Qwen 3's keeps it after the last
     * user turn, within a tool-calling loop) */
    json_t *reas = api_field(msg, "reasoning_content");
    if (reas && (!json_is_string(reas) || strcmp(ro, "assistant"))) {
        json_decref(calls);
        api_buf_free(&b);
        return BAD(p, "'%s.reasoning_content' must be a string on an assistant message", p), NULL;
    }
    json_t *tid = api_field(msg, "tool_call_id");
    if (tid && !json_is_string(tid)) {
        json_decref(calls);
        api_buf_free(&b);
        return BAD(p, "'%s.tool_call_id' must be a string", p), NULL;
    }
    const char *role_out = ro;
    if (!strcmp(ro, "tool") && !tools_native) { /* a result, as a user turn in the tagged form */
        api_buf w = {0};
        if (api_buf_add(&w, "<tool_response>\n", 16) || (b.n && api_buf_add(&w, b.p, b.n)) ||
            api_buf_add(&w, "\n</tool_response>", 17)) {
            api_buf_free(&w);
            json_decref(calls);
            api_buf_free(&b);
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
        }
        api_buf_free(&b);
        b = w;
        role_out = "user";
    }
    json_t *o = json_object();
    json_t *c = json_stringn(b.p ? b.p : "", b.n);
    api_buf_free(&b);
    if (!o || !c || json_object_set_new(o, "role", json_string(role_out)) ||
        json_object_set_new(o, "content", c) || (calls && tools_native && json_object_set(o, "tool_calls", calls)) ||
        (tid && tools_native && json_object_set(o, "tool_call_id", tid)) ||
        (reas && json_object_set(o, "reasoning_content", reas))) {
        json_decref(o);
        json_decref(calls);
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    json_decref(calls);
    return o;
}

/* messages -> the model's template -> tokens. */
/* Renders messages (not taken) with the template's variables beside them. */
static int render_msgs(const api_ctx *a, json_t *arr, json_t *tools, json_t *kwargs, int add_gen, char **out,
                       size_t *ol, tl_error *err) {
    json_t *top = json_incref(arr);
    if (tools || kwargs) { /* template variables beside the messages */
        top = json_pack("{s:o}", "messages", top); /* takes it, even failing */
        if (top && ((tools && json_object_set(top, "tools", tools)) || (kwargs && json_object_update_missing(top, kwargs)))) {
            json_decref(top);
            top = NULL;
        }
        if (!top) return TL_ERR_NOMEM;
    }
    tl_chat_template *own = NULL;
    int rc = a->tmpl ? TL_OK : tl_chat_template_new(a->m, NULL, &own, err);
    if (!rc) rc = tl_chat_template_render_json(a->tmpl ? a->tmpl : own, top, add_gen, out, ol, err);
    tl_chat_template_free(own);
    json_decref(top);
    return rc;
}

static const char *sval(json_t *v) { return json_is_string(v) ? json_string_value(v) : ""; }

/* The messages with each system message after the first folded into the
 * next user message (or a user message of its own at the end); NULL if there
 * is none such (or no memory). */
static json_t *fold_system(json_t *arr) {
    size_t n = json_array_size(arr), mid = 0;
    for (size_t i = 1; i < n; i++)
        if (!strcmp(sval(json_object_get(json_array_get(arr, i), "role")), "system")) mid++;
    json_t *out = mid ? json_array() : NULL;
    char *pend = NULL;
    int bad = !out;
    for (size_t i = 0; !bad && i < n; i++) {
        json_t *m = json_array_get(arr, i);
        const char *role = sval(json_object_get(m, "role")), *c = sval(json_object_get(m, "content"));
        if (i && !strcmp(role, "system")) {
            size_t l = (pend ? strlen(pend) + 2 : 0) + strlen(c) + 1;
            char *p = malloc(l);
            if (p) snprintf(p, l, "%s%s%s", pend ? pend : "", pend ? "\n\n" : "", c);
            free(pend);
            pend = p;
            bad = !p;
        } else if (pend && !strcmp(role, "user")) {
            size_t l = strlen(pend) + strlen(c) + 3;
            char *p = malloc(l);
            json_t *u = p ? json_deep_copy(m) : NULL;
            if (p) snprintf(p, l, "%s\n\n%s", pend, c);
            bad = !u || json_object_set_new(u, "content", json_string(p)) || json_array_append_new(out, u);
            free(p);
            free(pend);
            pend = NULL;
        } else {
            bad = json_array_append(out, m);
        }
    }
    if (!bad && pend) bad = json_array_append_new(out, json_pack("{s:s, s:s}", "role", "user", "content", pend));
    free(pend);
    if (bad) {
        json_decref(out);
        return NULL;
    }
    return out;
}

static int chat_prompt(const api_ctx *a, json_t *msgs, const tools_req *t, json_t *kwargs, int add_gen, int *think_started,
                       int32_t **ids, int *n, api_err *e) {
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!json_is_array(msgs)) return BAD("messages", "'messages' must be an array");
    if (kwargs && !json_is_object(kwargs))
        return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    static const char *const RESERVED[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", NULL};
    for (int i = 0; kwargs && RESERVED[i]; i++)
        if (json_object_get(kwargs, RESERVED[i]))
            return BAD("chat_template_kwargs", "'chat_template_kwargs' may not set '%s'", RESERVED[i]);
    size_t nm = json_array_size(msgs);
    if (!nm) return BAD("messages", "'messages' must not be empty");
    if (nm > (size_t)a->max_messages) return BAD("messages", "at most %d messages", a->max_messages);
    if (!tl_model_chat_template(a->m))
        return BAD("messages", "this model has no chat template; use /v1/completions");
    /* tools: through the template's own `tools` variable where it has one,
     * else listed in a system message (server/tools.c) */
    const int with_tools = t && t->tools && t->mode != TOOLS_NONE;
    /* history with tool calls renders the template's way if it has one,
     * else as the tagged blocks, whether or not this request offers tools */
    const int tmpl_tools = strstr(tl_model_chat_template(a->m), "tools") != NULL;
    const int native = with_tools && tmpl_tools;
    json_t *arr = json_array();
    if (!arr) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < nm; i++) {
        json_t *o = chat_message(json_array_get(msgs, i), (int)i, tmpl_tools, e);
        if (!o || json_array_append_new(arr, o)) {
            json_decref(arr);
            return -1;
        }
    }
    if (with_tools && !native) {
        char *sys = tools_system_text(t->tools);
        json_t *first = json_array_get(arr, 0);
        const char *r0 = json_string_value(json_object_get(first, "role"));
        int bad = !sys;
        if (sys && r0 && !strcmp(r0, "system")) { /* joined to the caller's system message */
            const char *c0 = json_string_value(json_object_get(first, "content"));
            size_t l = strlen(c0) + strlen(sys) + 3;
            char *j = malloc(l);
            if (j) snprintf(j, l, "%s\n\n%s", c0, sys);
            bad = !j || json_object_set_new(first, "content", json_string(j));
            free(j);
        } else if (sys) {
            bad = json_array_insert_new(arr, 0, json_pack("{s:s, s:s}", "role", "system", "content", sys));
        }
        free(sys);
        if (bad) {
            json_decref(arr);
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    char *out = NULL;
    size_t ol = 0;
    tl_error err = {0};
    int rc = render_msgs(a, arr, native ? t->tools : NULL, kwargs, add_gen, &out, &ol, &err);
    if (rc && rc != TL_ERR_NOMEM) {
        /* a template that refuses a system message after the first (Gemma's
         * alternation check) gets it folded into the next user turn */
        json_t *folded = fold_system(arr);
        if (folded) {
            tl_free(out);
            out = NULL;
            tl_error err2 = {0};
            if (!render_msgs(a, folded, native ? t->tools : NULL, kwargs, add_gen, &out, &ol, &err2)) rc = TL_OK;
            json_decref(folded);
        }
    }
    json_decref(arr);
    if (rc) {
        tl_free(out);
        if (rc == TL_ERR_NOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return BAD("messages", "chat template: %s", err.msg);
    }
    if (think_started && a->reasoning) {
        /* the reasoning starts in the prompt when the generation prompt ends
         * with the open marker; with --reasoning on the server writes it there */
        *think_started = tl_chat_think_started(out, ol);
        if (!*think_started && a->reasoning == 2 && add_gen) {
            const char *open, *close;
            tl_chat_think_markers(NULL, &open, &close);
            const size_t k = strlen(open);
            char *o2 = realloc(out, ol + k + 2);
            if (!o2) {
                tl_free(out);
                return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            }
            out = o2;
            memcpy(out + ol, open, k);
            memcpy(out + ol + k, "\n", 2);
            ol += k + 1;
            *think_started = 1;
        }
    }
    int flags = TL_TOK_PARSE_SPECIAL | (tl_chat_add_bos(a->m, out) ? TL_TOK_ADD_BOS : 0);
    rc = tokenize(a->m, out, ol, flags, ids, n, e);
    tl_free(out);
    return rc;
}

/* An array of token ids, each < n_vocab. */
static int token_array(const api_ctx *a, json_t *arr, const char *param, int32_t **ids, int *n,
                       api_err *e) {
    size_t na = json_array_size(arr), i;
    int nv = tl_model_n_vocab(a->m);
    if (na > (size_t)1 << 24) return BAD(param, "too many tokens");
    *ids = malloc((na ? na : 1) * sizeof **ids);
    if (!*ids) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv)
            return BAD(param, "'%s' token ids must be integers in 0..%d", param, nv - 1);
        (*ids)[i] = (int32_t)json_integer_value(v);
    }
    *n = (int)na;
    return 0;
}

/* prompt: a string, token ids, or a one-element array of either. */
static int completion_prompt(const api_ctx *a, json_t *p, int32_t **ids, int *n, api_err *e) {
    if (!p) return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) >= 1 && !json_is_integer(json_array_get(p, 0))) {
        if (json_array_size(p) > 1) return BAD("prompt", "only one prompt per request is supported");
        p = json_array_get(p, 0);
        if (json_is_array(p) && json_array_size(p) && !json_is_integer(json_array_get(p, 0)))
            return BAD("prompt", "'prompt' must be a string or an array of token ids");
    }
    if (json_is_string(p)) {
        int flags = TL_TOK_PARSE_SPECIAL | (tl_model_add_bos(a->m) ? TL_TOK_ADD_BOS : 0);
        return tokenize(a->m, json_string_value(p), json_string_length(p), flags, ids, n, e);
    }
    if (json_is_array(p)) return token_array(a, p, "prompt", ids, n, e);
    return BAD("prompt", "'prompt' must be a string or an array of token ids");
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
    if ((rc = get_int(root, "top_logprobs", 0, SRV_MAX_TOP, &x, e)) < 0) return -1;
    if (rc && !r->logprobs) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = rc ? (int)x : 0;
    tools_req t;
    if (tools_parse(root, &t, e)) return -1;
    if (t.tools && t.mode != TOOLS_NONE) {
        if (r->grammar) return BAD("tools", "tool calls and a JSON response_format or grammar in one request are not supported");
        tl_error err = {0};
        const char *tm = tl_model_chat_template(a->m);
        r->tool_fmt = tools_format(tm, tm && strstr(tm, "tools"));
        rc = tools_grammar(&t, r->tool_fmt, &r->grammar, &err);
        if (rc == TL_ERR_NOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (rc) return BAD("tools", "%s", err.msg);
        r->grammar_lazy = t.mode == TOOLS_AUTO;
        r->tool_mode = t.mode;
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
    if ((rc = get_int(root, "max_thinking_tokens", 0, a->n_ctx, &x, e)) < 0) return -1;
    if (rc) r->think_budget = (int)x;
    r->think = a->reasoning != 0;
    return chat_prompt(a, api_field(root, "messages"), &t, api_field(root, "chat_template_kwargs"), 1, &r->think_started,
                       &r->prompt, &r->n_prompt, e);
}

static int parse_completion(const api_ctx *a, json_t *root, srv_req *r, api_err *e) {
    long long x;
    int rc;
    if ((rc = get_int(root, "logprobs", 0, SRV_MAX_TOP, &x, e)) < 0) return -1;
    r->logprobs = rc;
    r->top_logprobs = rc ? (int)x : 0;
    if (get_bool(root, "echo", &r->echo, e) < 0) return -1;
    if ((rc = get_int(root, "best_of", 1, 1 << 20, &x, e)) < 0) return -1;
    if (rc && x > 1) return BAD("best_of", "'best_of' > 1 is not supported");
    json_t *sfx = api_field(root, "suffix");
    if (sfx && !(json_is_string(sfx) && json_string_length(sfx) == 0))
        return BAD("suffix", "'suffix' is not supported");
    return completion_prompt(a, api_field(root, "prompt"), &r->prompt, &r->n_prompt, e);
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

/* ---- replies ----------------------------------------------------------------- */

int api_jset(json_t *o, const char *k, json_t *v) { return !v || json_object_set_new(o, k, v); }
int api_jpush(json_t *a, json_t *v) { return !v || json_array_append_new(a, v); }

char *api_dump(json_t *j, size_t *len) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (s && len) *len = strlen(s);
    return s;
}

char *api_error_json(const api_err *e, size_t *len) {
    json_t *err = json_object(), *root = json_object();
    if (!err || !root || api_jset(err, "message", jstr_bytes(e->msg, strlen(e->msg))) ||
        api_jset(err, "type", json_string(e->type ? e->type : "invalid_request_error")) ||
        api_jset(err, "param", e->param[0] ? json_string(e->param) : json_null()) ||
        api_jset(err, "code", e->code[0] ? json_string(e->code) : json_null()) ||
        json_object_set_new(root, "error", err)) {
        json_decref(err);
        json_decref(root);
        return NULL;
    }
    return api_dump(root, len);
}

/* The text a token stands for (control tokens by name). */
static size_t piece(const api_ctx *a, int32_t tok, char *buf, size_t cap) {
    size_t n = tl_token_piece(a->m, tok, 1, buf, cap);
    return n < cap ? n : cap;
}

/* Chat shape: {token, logprob, bytes}. */
static json_t *chat_lp_one(const api_ctx *a, const tl_token_prob *p) {
    char b[256];
    size_t n = piece(a, p->token, b, sizeof b);
    json_t *o = json_object(), *bytes = json_array();
    int bad = !o || !bytes;
    for (size_t i = 0; !bad && i < n; i++) bad = api_jpush(bytes, json_integer((unsigned char)b[i]));
    if (bad || api_jset(o, "token", jstr_bytes(b, n)) || api_jset(o, "logprob", jlogprob(p->logprob)) ||
        json_object_set_new(o, "bytes", bytes)) {
        json_decref(o);
        json_decref(bytes);
        return NULL;
    }
    return o;
}

static json_t *chat_lp_entry(const api_ctx *a, const srv_req *r, const srv_event *ev) {
    json_t *o = chat_lp_one(a, &ev->chosen), *tops = json_array();
    int n = ev->n_top < r->top_logprobs ? ev->n_top : r->top_logprobs;
    int bad = !o || !tops;
    for (int i = 0; !bad && i < n; i++) bad = api_jpush(tops, chat_lp_one(a, &ev->top[i]));
    if (bad || json_object_set_new(o, "top_logprobs", tops)) {
        json_decref(o);
        json_decref(tops);
        return NULL;
    }
    return o;
}

/* Legacy dict key: the token's text, or "bytes:\xNN..." when it is not valid UTF-8. */
static void legacy_key(const api_ctx *a, int32_t tok, char *out, size_t cap) {
    char b[256];
    size_t n = piece(a, tok, b, sizeof b);
    if (utf8_valid(b, n)) {
        snprintf(out, cap, "%.*s", (int)n, b);
        return;
    }
    size_t k = (size_t)snprintf(out, cap, "bytes:");
    for (size_t i = 0; i < n && k + 5 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "\\x%02x", (unsigned char)b[i]);
}

/* Legacy logprobs columns, appended to in event order. */
typedef struct legacy_lp {
    json_t *tokens, *token_logprobs, *top_logprobs, *text_offset;
    size_t offset; /* code points so far */
} legacy_lp;

static int legacy_add(const api_ctx *a, const srv_req *r, legacy_lp *l, const srv_event *ev) {
    char b[256], key[1100];
    size_t n = piece(a, ev->token, b, sizeof b);
    int has = ev->kind == SRV_EV_TOKEN || ev->has_logprob;
    json_t *top = has ? json_object() : json_null();
    if (!top) return -1;
    int nt = ev->n_top < r->top_logprobs ? ev->n_top : r->top_logprobs;
    for (int i = 0; has && i < nt; i++) {
        legacy_key(a, ev->top[i].token, key, sizeof key);
        if (api_jset(top, key, jlogprob(ev->top[i].logprob))) goto fail;
    }
    if (has) {
        legacy_key(a, ev->chosen.token, key, sizeof key);
        if (!json_object_get(top, key) && api_jset(top, key, jlogprob(ev->chosen.logprob))) goto fail;
    }
    if (api_jpush(l->tokens, jstr_bytes(b, n)) ||
        api_jpush(l->token_logprobs, has ? jlogprob(ev->chosen.logprob) : json_null()) ||
        json_array_append_new(l->top_logprobs, top) ||
        api_jpush(l->text_offset, json_integer((json_int_t)l->offset)))
        return -1;
    l->offset += utf8_count(b, n);
    return 0;
fail:
    json_decref(top);
    return -1;
}

static int legacy_init(legacy_lp *l, size_t offset) {
    l->tokens = json_array();
    l->token_logprobs = json_array();
    l->top_logprobs = json_array();
    l->text_offset = json_array();
    l->offset = offset;
    return l->tokens && l->token_logprobs && l->top_logprobs && l->text_offset ? 0 : -1;
}

/* Takes the columns into one object (NULL on failure, columns freed either way). */
static json_t *legacy_obj(legacy_lp *l) {
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "tokens", l->tokens) ||
        json_object_set_new(o, "token_logprobs", l->token_logprobs) ||
        json_object_set_new(o, "top_logprobs", l->top_logprobs) ||
        json_object_set_new(o, "text_offset", l->text_offset)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void legacy_drop(legacy_lp *l) {
    json_decref(l->tokens);
    json_decref(l->token_logprobs);
    json_decref(l->top_logprobs);
    json_decref(l->text_offset);
}

/* The prompt as text for echo (an added BOS is not part of what was sent). */
static int echo_text(const api_ctx *a, const srv_req *r, api_buf *b) {
    tl_detok d;
    tl_detok_init(&d, 1);
    char tmp[1024];
    int i0 = r->n_prompt && tl_model_add_bos(a->m) && r->prompt[0] == tl_token_bos(a->m);
    if (api_buf_add(b, "", 0)) return -1;
    for (int i = i0; i < r->n_prompt; i++) {
        size_t n = tl_detok_push(&d, a->m, r->prompt[i], tmp, sizeof tmp);
        if (n >= sizeof tmp) n = sizeof tmp - 1;
        if (api_buf_add(b, tmp, n)) return -1;
    }
    size_t n = tl_detok_flush(&d, tmp, sizeof tmp);
    return api_buf_add(b, tmp, n < sizeof tmp ? n : sizeof tmp - 1);
}

/* OpenAI's usage, plus "speculative": {drafted, accepted} (a field of our
 * own beside theirs: clients that do not know it ignore it). */
static json_t *usage_json(const srv_req *r) {
    int pt = r->prompt_tokens ? r->prompt_tokens : r->n_prompt;
    json_t *u = json_object(), *d = json_object(), *sp = json_object();
    if (!u || !d || !sp || api_jset(u, "prompt_tokens", json_integer(pt)) ||
        api_jset(u, "completion_tokens", json_integer(r->completion_tokens)) ||
        api_jset(u, "total_tokens", json_integer(pt + r->completion_tokens)) ||
        api_jset(d, "cached_tokens", json_integer(r->cached_tokens)) ||
        api_jset(sp, "drafted", json_integer(r->spec_drafted)) ||
        api_jset(sp, "accepted", json_integer(r->spec_accepted))) {
        json_decref(u);
        json_decref(d);
        json_decref(sp);
        return NULL;
    }
    if (json_object_set_new(u, "prompt_tokens_details", d)) { /* d is taken either way */
        json_decref(sp);
        json_decref(u);
        return NULL;
    }
    if (json_object_set_new(u, "speculative", sp)) {
        json_decref(u);
        return NULL;
    }
    if (r->think && json_object_set_new(u, "completion_tokens_details",
                                        json_pack("{s:i}", "reasoning_tokens", r->reasoning_tokens))) {
        json_decref(u);
        return NULL;
    }
    return u;
}

/* {id, object, created, model} */
static json_t *reply_head(const api_ctx *a, const srv_req *r, const char *object) {
    json_t *o = json_object();
    if (!o || api_jset(o, "id", json_string(r->id)) || api_jset(o, "object", json_string(object)) ||
        api_jset(o, "created", json_integer(r->created)) ||
        api_jset(o, "model", jstr_bytes(a->model_id, strlen(a->model_id)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int skip_lp(const api_ctx *a, const srv_event *ev) {
    return ev->kind == SRV_EV_TOKEN && tl_token_is_eog(a->m, ev->token);
}

/* Collects text, finish reason and logprobs over all events. */
static json_t *reply_choice(const api_ctx *a, const srv_req *r) {
    api_buf text = {0}, think = {0};
    int in_think = 0, saw_think = 0; /* the last token was reasoning; any was */
    const char *open, *close;
    tl_chat_think_markers(NULL, &open, &close);
    const size_t ol = strlen(open), cl = strlen(close);
    json_t *chat_lp = r->kind == SRV_CHAT && r->logprobs ? json_array() : NULL;
    legacy_lp l = {0};
    int legacy = r->kind == SRV_COMPLETION && r->logprobs, bad = 0;
    const char *finish = "stop";
    if (r->echo && echo_text(a, r, &text)) bad = 1;
    if (legacy && legacy_init(&l, 0)) bad = 1;
    if (r->kind == SRV_CHAT && r->logprobs && !chat_lp) bad = 1;
    for (int i = 0; !bad && i < r->n_ev; i++) {
        const srv_event *ev = &r->ev[i];
        /* the loop says which tokens are reasoning; the text held back at
         * the end belongs with the last token */
        if (ev->kind == SRV_EV_TOKEN) in_think = r->kind == SRV_CHAT && r->think && ev->reasoning;
        if (in_think && !saw_think) {
            /* the loop knows it reasons once the open marker is whole: text
             * before, blanks and the marker's first pieces, goes with it */
            saw_think = 1;
            size_t k = 0;
            while (k < text.n && (text.p[k] == ' ' || text.p[k] == '\n')) k++;
            if (text.n - k <= ol && !memcmp(text.p ? text.p + k : "", open, text.n - k)) {
                bad = text.n && api_buf_add(&think, text.p, text.n);
                text.n = 0;
            }
        }
        if (ev->kind == SRV_EV_TOKEN || ev->kind == SRV_EV_DONE)
            bad = ev->text_len && api_buf_add(in_think ? &think : &text, ev->text, ev->text_len);
        if (ev->kind == SRV_EV_DONE && ev->finish_reason) finish = ev->finish_reason;
        if (bad || skip_lp(a, ev) || (ev->kind != SRV_EV_TOKEN && ev->kind != SRV_EV_PROMPT)) continue;
        if (chat_lp && ev->kind == SRV_EV_TOKEN) bad = api_jpush(chat_lp, chat_lp_entry(a, r, ev));
        if (legacy) bad = legacy_add(a, r, &l, ev);
    }
    json_t *c = json_object(), *lp = NULL;
    if (!bad && chat_lp) {
        lp = json_object();
        if (!lp || json_object_set(lp, "content", chat_lp) || api_jset(lp, "refusal", json_null())) bad = 1;
    } else if (!bad && legacy) {
        lp = legacy_obj(&l);
        legacy = 0;
        bad = !lp;
    }
    json_decref(chat_lp);
    if (legacy) legacy_drop(&l);
    /* reasoning: the reasoning tokens' text without its markers (the open
     * one only if the reply wrote it); the content, without leading blanks */
    const char *body = text.p ? text.p : "";
    size_t blen = text.n;
    json_t *reasoning = NULL;
    api_buf joined = {0};
    if (!bad && r->kind == SRV_CHAT && r->think && (saw_think || r->think_started)) {
        const char *rs = think.p ? think.p : "";
        size_t rn = think.n, k = 0;
        while (k < rn && (rs[k] == ' ' || rs[k] == '\n')) k++;
        if (!r->think_started && rn - k >= ol && !memcmp(rs + k, open, ol)) rs += k + ol, rn -= k + ol;
        const char *end = rn ? memmem(rs, rn, close, cl) : NULL;
        reasoning = jstr_bytes(rs, end ? (size_t)(end - rs) : rn);
        const size_t after = end ? (size_t)(rs + rn - end) - cl : 0; /* the close token's own text after it */
        if (after) {
            bad |= api_buf_add(&joined, end + cl, after) || (blen && api_buf_add(&joined, body, blen));
            body = joined.p ? joined.p : "";
            blen = joined.n;
        }
        while (blen && (*body == '\n' || *body == ' ')) body++, blen--;
    }
    /* tool calls: the content before them, the calls parsed out */
    json_t *calls = NULL;
    size_t clen = blen;
    if (!bad && r->kind == SRV_CHAT && r->tool_mode) calls = tools_split(r->tool_fmt, body, blen, r->id, &clen);
    if (calls) finish = "tool_calls";
    json_t *txt = bad ? NULL : calls && !clen ? json_null() : jstr_bytes(body, clen);
    api_buf_free(&text);
    api_buf_free(&think);
    api_buf_free(&joined);
    if (r->kind == SRV_CHAT) {
        json_t *m = json_object();
        if (!m || api_jset(m, "role", json_string("assistant")) || json_object_set_new(m, "content", txt) ||
            (reasoning && json_object_set(m, "reasoning_content", reasoning)) ||
            (calls && json_object_set(m, "tool_calls", calls))) {
            json_decref(m);
            m = NULL;
        }
        json_decref(calls);
        json_decref(reasoning);
        reasoning = NULL;
        txt = NULL;
        bad |= !c || api_jset(c, "index", json_integer(0)) || api_jset(c, "message", m);
    } else {
        bad |= !c || api_jset(c, "index", json_integer(0)) || api_jset(c, "text", txt);
        txt = NULL;
    }
    json_decref(txt);
    json_decref(reasoning);
    if (bad || api_jset(c, "logprobs", lp ? lp : json_null()) ||
        api_jset(c, "finish_reason", json_string(finish))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *api_reply_obj(const api_ctx *a, const srv_req *r) {
    json_t *o = reply_head(a, r, r->kind == SRV_CHAT ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    if (!o || !choices || api_jpush(choices, reply_choice(a, r)) ||
        json_object_set_new(o, "choices", choices) || api_jset(o, "usage", usage_json(r))) {
        json_decref(o);
        if (!o) json_decref(choices);
        return NULL;
    }
    return o;
}

char *api_reply_json(const api_ctx *a, const srv_req *r, size_t *len) {
    json_t *o = api_reply_obj(a, r);
    if (!o) return NULL;
    if (r->wire) return r->wire->reply(a, r, o, len);
    return api_dump(o, len);
}

void api_stream_free(api_stream *st) {
    api_buf_free(&st->tools.hold);
    api_buf_free(&st->think_hold);
    if (st->ds) ((dialect_stream *)st->ds)->free(st->ds);
    st->ds = NULL;
}

/* ---- streams ----------------------------------------------------------------- */

/* One chunk (taken) out: as an SSE data line, or through the request's
 * dialect, which turns chat chunks into its own events. */
static int frame(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out, json_t *j) {
    if (r->wire) return r->wire->stream_chunk(a, r, &st->ds, j, out);
    char *s = api_dump(j, NULL);
    if (!s) return -1;
    int rc = api_buf_add(out, "data: ", 6) || api_buf_add(out, s, strlen(s)) ||
             api_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

/* One chunk with a single choice; text/role/lp/finish may be NULL (lp taken). */
static int chunk(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out, const char *role,
                 const char *text, size_t tlen, json_t *lp, const char *finish) {
    int chat = r->kind == SRV_CHAT;
    json_t *o = reply_head(a, r, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_object(), *choices = json_array(), *delta = chat ? json_object() : NULL;
    int bad = !o || !c || !choices || (chat && !delta);
    if (!bad && chat) {
        if (role) bad |= api_jset(delta, "role", json_string(role));
        if (text) bad |= api_jset(delta, "content", jstr_bytes(text, tlen));
        bad |= json_object_set_new(c, "delta", delta);
        delta = NULL;
    } else if (!bad) {
        bad |= api_jset(c, "text", jstr_bytes(text ? text : "", text ? tlen : 0));
    }
    bad = bad || api_jset(c, "index", json_integer(0)) || api_jset(c, "logprobs", lp ? lp : json_null());
    lp = NULL;
    bad = bad || api_jset(c, "finish_reason", finish ? json_string(finish) : json_null()) ||
          json_array_append(choices, c) || json_object_set(o, "choices", choices) ||
          (r->include_usage && api_jset(o, "usage", json_null()));
    json_decref(lp);
    json_decref(delta);
    json_decref(c);
    json_decref(choices);
    if (bad) {
        json_decref(o);
        return -1;
    }
    return frame(a, r, st, out, o);
}

static int usage_chunk(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out) {
    json_t *o = reply_head(a, r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!o || api_jset(o, "choices", json_array()) || api_jset(o, "usage", usage_json(r))) {
        json_decref(o);
        return -1;
    }
    return frame(a, r, st, out, o);
}

static int stream_error(const srv_event *ev, api_buf *out) {
    api_err e;
    const char *m = ev->text && ev->text[0] ? ev->text : "the request failed";
    api_fail(&e, 503, "server_error", NULL, NULL, "%s", m);
    size_t n;
    char *s = api_error_json(&e, &n);
    if (!s) return -1;
    int rc = api_buf_add(out, "data: ", 6) || api_buf_add(out, s, n) || api_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

/* The logprobs of one event in the shape of a chunk (NULL if not wanted). */
static json_t *event_lp(const api_ctx *a, const srv_req *r, api_stream *st, const srv_event *ev,
                        int *bad) {
    if (!r->logprobs || skip_lp(a, ev)) return NULL;
    if (r->kind == SRV_CHAT) {
        json_t *o = json_object(), *arr = json_array();
        if (!o || !arr || api_jpush(arr, chat_lp_entry(a, r, ev)) ||
            json_object_set_new(o, "content", arr) || api_jset(o, "refusal", json_null())) {
            json_decref(o);
            *bad = 1;
            return NULL;
        }
        return o;
    }
    legacy_lp l;
    if (legacy_init(&l, st->text_off) || legacy_add(a, r, &l, ev)) {
        legacy_drop(&l);
        *bad = 1;
        return NULL;
    }
    st->text_off = l.offset;
    json_t *o = legacy_obj(&l);
    if (!o) *bad = 1;
    return o;
}

static int stream_start(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out) {
    st->started = 1;
    if (r->kind == SRV_CHAT) return chunk(a, r, st, out, "assistant", "", 0, NULL, NULL);
    if (!r->echo) return 0;
    api_buf t = {0};
    int rc = echo_text(a, r, &t) || chunk(a, r, st, out, NULL, t.p, t.n, NULL, NULL);
    api_buf_free(&t);
    return rc ? -1 : 0;
}

/* A chat chunk whose delta is {key: value} (value taken): tool calls, reasoning. */
static int chunk_delta(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out, const char *key,
                       json_t *value) {
    json_t *o = reply_head(a, r, "chat.completion.chunk");
    json_t *c = value ? json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta", key, value, "logprobs",
                                  "finish_reason")
                      : NULL;
    json_t *choices = c ? json_pack("[o]", c) : NULL;
    if (!o || !choices || json_object_set_new(o, "choices", choices) ||
        (r->include_usage && api_jset(o, "usage", json_null()))) {
        json_decref(o);
        return -1;
    }
    return frame(a, r, st, out, o);
}

/* Text of a tool-calling reply: content while it cannot be a tag, each call
 * when its block closes; at the end (last), what is still held goes out as
 * content. */
static int stream_tools(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                        int last, api_buf *out) {
    api_buf content = {0};
    json_t *calls = json_array();
    int rc = !calls || tools_stream(&st->tools, r->tool_fmt, t, n, r->id, &content, calls);
    const char *lost = tools_lost_open(r->tool_fmt);
    /* the end, as the whole reply has it: text after the calls is dropped;
     * an unterminated call with none before it is content, tag included */
    if (!rc && last && st->tools.hold.n) {
        if (!st->tools.in_call && !st->tools.seen_call)
            rc = api_buf_add(&content, st->tools.hold.p, st->tools.hold.n);
        else if (st->tools.in_call && !st->tools.n_calls)
            rc = api_buf_add(&content, lost, strlen(lost)) || api_buf_add(&content, st->tools.hold.p, st->tools.hold.n);
        st->tools.hold.n = 0;
    } else if (!rc && last && st->tools.in_call && !st->tools.n_calls) {
        rc = api_buf_add(&content, lost, strlen(lost));
    }
    if (!rc && (content.n || lp)) rc = chunk(a, r, st, out, NULL, content.p ? content.p : "", content.n, lp, NULL);
    else json_decref(lp);
    if (!rc && json_array_size(calls)) rc = chunk_delta(a, r, st, out, "tool_calls", json_incref(calls));
    api_buf_free(&content);
    json_decref(calls);
    return rc ? -1 : 0;
}

/* Content of a reply (after any reasoning): through the tool-call splitter
 * when tools are on, else as is. */
static int stream_content(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                          int last, api_buf *out) {
    if (r->kind == SRV_CHAT && r->tool_mode) return stream_tools(a, r, st, t, n, lp, last, out);
    if (!n && !lp) return 0;
    return chunk(a, r, st, out, NULL, t, n, lp, NULL);
}

/* A reply that may reason: the loop marks each token as reasoning or not
 * (ev->reasoning); reasoning goes out as reasoning_content deltas without
 * its markers (the close held back while the text may be its start), then
 * content without its leading blank lines. Blanks before the reasoning are
 * held until it is clear whether any comes. */
static int stream_think(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                        int reasoning, int last, api_buf *out) {
    if (lp && chunk(a, r, st, out, NULL, "", 0, lp, NULL)) return -1; /* logprobs travel on their own */
    const char *open, *close;
    tl_chat_think_markers(NULL, &open, &close);
    const size_t ol = strlen(open), cl = strlen(close);
    if (reasoning && st->think == 0) { /* it starts: what is held is its open marker's start */
        st->think = 1;
        st->think_opening = !r->think_started; /* the reply writes its open marker */
    }
    if (!reasoning && st->think == 1) { /* it ended without a close marker seen (held text) */
        if (st->think_hold.n &&
            chunk_delta(a, r, st, out, "reasoning_content", jstr_bytes(st->think_hold.p, st->think_hold.n)))
            return -1;
        st->think_hold.n = 0;
        st->think = 2;
    }
    if (n && api_buf_add(&st->think_hold, t, n)) return -1;
    char *h = st->think_hold.p;
    size_t hn = st->think_hold.n;
    if (st->think == 0) { /* no reasoning yet: what may still open it waits, anything else is content */
        size_t k = 0;
        while (k < hn && (h[k] == ' ' || h[k] == '\n')) k++;
        if (!last && (!hn || (hn - k < ol && !memcmp(h + k, open, hn - k)))) return 0;
        st->think = 2;
        st->content_on = 1;
    }
    if (st->think == 1) {
        if (st->think_opening) {
            size_t k = 0;
            while (k < hn && (h[k] == ' ' || h[k] == '\n')) k++;
            if (!last && (!hn || (hn - k < ol && !memcmp(h + k, open, hn - k)))) return 0; /* too early to say */
            st->think_opening = 0;
            if (hn - k >= ol && !memcmp(h + k, open, ol)) {
                memmove(h, h + k + ol, hn - k - ol);
                hn = st->think_hold.n = hn - k - ol;
            }
        }
        const char *end = hn ? memmem(h, hn, close, cl) : NULL;
        /* without the marker: all but a tail that may be its start (whole
         * characters either way: the marker is ASCII) */
        size_t emit = end ? (size_t)(end - h) : hn;
        if (!end && !last)
            for (size_t k = cl - 1; k > 0; k--)
                if (hn >= k && !memcmp(h + hn - k, close, k)) {
                    emit = hn - k;
                    break;
                }
        if (emit && chunk_delta(a, r, st, out, "reasoning_content", jstr_bytes(h, emit))) return -1;
        if (!end) {
            memmove(h, h + emit, hn - emit);
            st->think_hold.n = hn - emit;
            return 0;
        }
        memmove(h, end + cl, hn - emit - cl);
        hn = st->think_hold.n = hn - emit - cl;
        st->think = 2;
    }
    size_t k = 0;
    if (!st->content_on) {
        while (k < hn && (h[k] == ' ' || h[k] == '\n')) k++;
        if (k < hn) st->content_on = 1;
    }
    int rc = stream_content(a, r, st, h + k, hn - k, NULL, last, out);
    st->think_hold.n = 0;
    return rc;
}

int api_stream_event(const api_ctx *a, const srv_req *r, api_stream *st, const srv_event *ev,
                     api_buf *out) {
    if (st->ended) return 0;
    if (!st->started && ev->kind != SRV_EV_ERROR && stream_start(a, r, st, out)) return -1;
    int bad = 0;
    const int tools = r->kind == SRV_CHAT && r->tool_mode;
    switch (ev->kind) {
    case SRV_EV_PROMPT:
    case SRV_EV_TOKEN: {
        json_t *lp = event_lp(a, r, st, ev, &bad);
        if (bad) return -1;
        if (ev->kind == SRV_EV_PROMPT && !lp) return 0;
        const char *t = ev->kind == SRV_EV_TOKEN ? ev->text : "";
        size_t n = ev->kind == SRV_EV_TOKEN ? ev->text_len : 0;
        if (!n && !lp) return 0;
        if (r->kind == SRV_CHAT && r->think)
            return stream_think(a, r, st, t ? t : "", t ? n : 0, lp, ev->kind == SRV_EV_TOKEN && ev->reasoning, 0, out);
        if (tools) return stream_tools(a, r, st, t ? t : "", t ? n : 0, lp, 0, out);
        return chunk(a, r, st, out, NULL, t ? t : "", t ? n : 0, lp, NULL);
    }
    case SRV_EV_DONE:
        if (r->kind == SRV_CHAT && r->think) {
            /* the text held back to the end belongs with the last token */
            if (stream_think(a, r, st, ev->text ? ev->text : "", ev->text_len, NULL, st->think == 1, 1, out)) return -1;
        } else if (tools) {
            if (stream_tools(a, r, st, ev->text ? ev->text : "", ev->text_len, NULL, 1, out)) return -1;
        } else if (ev->text_len && chunk(a, r, st, out, NULL, ev->text, ev->text_len, NULL, NULL)) {
            return -1;
        }
        if (chunk(a, r, st, out, NULL, NULL, 0, NULL,
                  tools && st->tools.n_calls ? "tool_calls" : ev->finish_reason ? ev->finish_reason : "stop"))
            return -1;
        if ((r->include_usage || r->dialect) && usage_chunk(a, r, st, out)) return -1;
        break;
    case SRV_EV_ERROR: {
        const char *m = ev->text && ev->text[0] ? ev->text : "the request failed";
        st->ended = 1;
        if (r->wire) return r->wire->stream_error(a, r, &st->ds, m, out);
        if (stream_error(ev, out)) return -1;
        break;
    }
    }
    st->ended = 1;
    if (r->dialect) return 0; /* the dialect's last event was its end */
    return api_buf_add(out, "data: [DONE]\n\n", 14);
}

/* ---- /v1/models, /tokenize, /detokenize --------------------------------------- */

/* What an agent may ask of the model: tools, reasoning, structured output. */
static json_t *capabilities(const api_ctx *a) {
    const char *tm = tl_model_chat_template(a->m);
    return json_pack("{s:b, s:b, s:b, s:b, s:b}", "chat", tm != NULL, "tools", tm != NULL, "reasoning",
                     a->reasoning != 0, "structured_output", 1, "vision", 0);
}

/* llama.cpp's /props: n_ctx where its clients look for it. */
char *api_props_json(const api_ctx *a, size_t *len) {
    const char *tm = tl_model_chat_template(a->m);
    json_t *o = json_pack("{s:{s:i, s:{s:i}}, s:i, s:s, s:s, s:i, s:o, s:s, s:{s:b, s:b}}", "default_generation_settings",
                          "n_ctx", a->n_ctx, "params", "n_ctx", a->n_ctx, "total_slots", a->n_parallel, "model_path",
                          a->model_path ? a->model_path : "", "model_alias", a->model_id, "n_ctx", a->n_ctx,
                          "capabilities", capabilities(a), "chat_template", tm ? tm : "", "modalities", "vision", 0,
                          "audio", 0);
    return o ? api_dump(o, len) : NULL;
}

char *api_models_json(const api_ctx *a, size_t *len) {
    json_t *root = json_object(), *data = json_array(), *m = json_object();
    if (!root || !data || !m || api_jset(m, "id", jstr_bytes(a->model_id, strlen(a->model_id))) ||
        api_jset(m, "object", json_string("model")) || api_jset(m, "created", json_integer(time(NULL))) ||
        api_jset(m, "owned_by", json_string("tokenloop")) ||
        api_jset(m, "max_model_len", json_integer(a->n_ctx)) || api_jset(m, "context_length", json_integer(a->n_ctx)) ||
        api_jset(m, "capabilities", capabilities(a)) || api_jset(m, "type", json_string("model")) ||
        api_jset(m, "display_name", jstr_bytes(a->model_id, strlen(a->model_id))) ||
        api_jset(m, "created_at", json_string("1970-01-01T00:00:00Z")) || json_array_append(data, m) ||
        api_jset(root, "object", json_string("list")) || json_object_set(root, "data", data)) {
        json_decref(root);
        json_decref(data);
        json_decref(m);
        return NULL;
    }
    json_decref(data);
    json_decref(m);
    return api_dump(root, len);
}

static int only_keys(json_t *root, const char *const *keys, api_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) if (!in_list(keys, k)) return BAD(k, "unknown field '%.40s'", k);
    return 0;
}

char *api_tokenize(const api_ctx *a, const char *body, size_t len, size_t *out_len, api_err *e) {
    static const char *const keys[] = {"content", "prompt", "messages", "add_special",
                                       "add_generation_prompt", "chat_template_kwargs", "model", NULL};
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return NULL;
    int32_t *ids = NULL;
    int n = 0, add_special = -1, add_gen = 1, rc = only_keys(root, keys, e);
    const char *text = NULL;
    json_t *msgs = api_field(root, "messages");
    if (!rc && (get_bool(root, "add_special", &add_special, e) < 0 ||
                get_bool(root, "add_generation_prompt", &add_gen, e) < 0 ||
                get_str(root, "content", &text, e) < 0 || (!text && get_str(root, "prompt", &text, e) < 0)))
        rc = -1;
    if (!rc && !text && !msgs) rc = BAD("content", "give 'content', 'prompt' or 'messages'");
    if (!rc && msgs) {
        rc = chat_prompt(a, msgs, NULL, api_field(root, "chat_template_kwargs"), add_gen, NULL, &ids, &n, e);
    } else if (!rc) {
        size_t tl = strlen(text);
        int bos = add_special < 0 ? tl_model_add_bos(a->m) : add_special;
        rc = tokenize(a->m, text, tl, TL_TOK_PARSE_SPECIAL | (bos ? TL_TOK_ADD_BOS : 0), &ids, &n, e);
    }
    json_decref(root);
    json_t *o = rc ? NULL : json_object(), *arr = rc ? NULL : json_array();
    int bad = rc || !o || !arr;
    for (int i = 0; !bad && i < n; i++) bad = api_jpush(arr, json_integer(ids[i]));
    tl_free(ids);
    if (bad || json_object_set(o, "tokens", arr) || api_jset(o, "count", json_integer(n)) ||
        api_jset(o, "max_model_len", json_integer(a->n_ctx))) {
        json_decref(o);
        json_decref(arr);
        if (!rc) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    json_decref(arr);
    return api_dump(o, out_len);
}

char *api_detokenize(const api_ctx *a, const char *body, size_t len, size_t *out_len, api_err *e) {
    static const char *const keys[] = {"tokens", "model", NULL};
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return NULL;
    int32_t *ids = NULL;
    int n = 0, rc = only_keys(root, keys, e);
    json_t *t = api_field(root, "tokens");
    if (!rc && !json_is_array(t)) rc = BAD("tokens", "'tokens' must be an array of token ids");
    if (!rc) rc = token_array(a, t, "tokens", &ids, &n, e);
    json_decref(root);
    api_buf b = {0};
    if (!rc) {
        tl_detok d;
        tl_detok_init(&d, 1);
        char tmp[1024];
        rc = api_buf_add(&b, "", 0);
        for (int i = 0; !rc && i < n; i++) {
            size_t k = tl_detok_push(&d, a->m, ids[i], tmp, sizeof tmp);
            rc = api_buf_add(&b, tmp, k < sizeof tmp ? k : sizeof tmp - 1);
        }
        size_t k = tl_detok_flush(&d, tmp, sizeof tmp);
        if (!rc) rc = api_buf_add(&b, tmp, k < sizeof tmp ? k : sizeof tmp - 1);
        if (rc) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    free(ids);
    json_t *o = rc ? NULL : json_object();
    if (rc || !o || api_jset(o, "content", jstr_bytes(b.p, b.n)) ||
        api_jset(o, "prompt", jstr_bytes(b.p, b.n))) {
        json_decref(o);
        api_buf_free(&b);
        if (!rc) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    api_buf_free(&b);
    return api_dump(o, out_len);
}
