/* chat: the chat stage of the loop, a Jinja-subset interpreter for the chat
 * templates stored in GGUF files (tokenizer.chat_template), matching Python
 * jinja2 as Hugging Face transformers configures it in apply_chat_template:
 * ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
 * loopcontrols extension, transformers' raise_exception and strftime_now,
 * and its json.dumps-style tojson. The output must equal transformers' byte
 * for byte, since the model was trained on exactly that text. The folder is
 * split by stage of the interpreter: arena.c (memory and error unwinding),
 * value.c (values with Python's semantics), lexer.c and parser.c (template
 * text to a tree, once per model), eval.c (the tree against scopes),
 * filters.c (methods, builtins, tests and filters), and this file, the
 * public entry points: compile a template, render it with messages given as
 * JSON text, jansson values or plain structs (JSON text is parsed by jansson,
 * as the server's requests are, so both read JSON alike and the interpreter
 * keeps no parser of its own). bos.c holds the BOS policy;
 * jinja.h is the internal header they share. A compiled template is read-only
 * while rendering, so one serves every request and thread; every render gets
 * its own arena and unwinds to here on any error, so nothing leaks. */
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "chat/jinja.h"
#include "base/util.h"

/* jinja2 reads templates with universal newlines and drops one trailing newline. */
static char *normalize(R *r, const char *tmpl, size_t *len) {
    size_t n = strlen(tmpl), k = 0;
    char *d = jj_alloc(r, n + 1);
    for (size_t i = 0; i < n; i++) {
        if (tmpl[i] == '\r') {
            d[k++] = '\n';
            if (i + 1 < n && tmpl[i + 1] == '\n') i++;
        } else {
            d[k++] = tmpl[i];
        }
    }
    if (k && d[k - 1] == '\n') k--;
    d[k] = 0;
    *len = k;
    return d;
}

/* A compiled template: its source and tree live in their own arena, read
 * only while rendering, so one template serves every request and thread. */
struct tl_chat_template {
    R *r;
    node *root;
    char *bos, *eos; /* the model's special-token text, or NULL */
};

void tl_chat_template_free(tl_chat_template *t) {
    if (!t) return;
    if (t->r) jj_arena_free(t->r);
    free(t->r);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* The text of a special token (BOS/EOS) as transformers passes it. */
static char *token_text(const tl_model *m, int32_t id) {
    if (id < 0) return NULL;
    size_t n = tl_token_piece(m, id, 1, NULL, 0);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    tl_token_piece(m, id, 1, s, n + 1);
    s[n] = 0;
    return s;
}

static void compile_body(R *r, tl_chat_template *t, const char *text) {
    size_t n;
    r->src = normalize(r, text, &n);
    t->root = jj_parse(r, jj_lex(r, r->src, n));
}

/* Compiles into t's arena; a syntax error unwinds to here. */
static int compile(R *r, tl_chat_template *t, const char *text, tl_error *err) {
    r->err = err;
    if (setjmp(r->jb)) return r->status;
    compile_body(r, t, text);
    r->err = NULL;
    return TL_OK;
}

int tl_chat_template_new(const tl_model *model, const char *tmpl, tl_chat_template **out, tl_error *err) {
    if (!out) return tl_fail(err, TL_ERR_ARG, "tl_chat_template_new: no output");
    *out = NULL;
    const char *text = tmpl ? tmpl : model ? tl_model_chat_template(model) : NULL;
    if (!text) return tl_fail(err, TL_ERR_UNSUPPORTED, "the model has no chat template");
    tl_chat_template *t = calloc(1, sizeof *t);
    R *r = calloc(1, sizeof *r);
    if (!t || !r) {
        free(t);
        free(r);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    t->r = r;
    if (model) {
        const int32_t bos = tl_token_bos(model), eos = tl_token_eos(model);
        t->bos = token_text(model, bos);
        t->eos = token_text(model, eos);
        if ((bos >= 0 && !t->bos) || (eos >= 0 && !t->eos)) {
            tl_chat_template_free(t);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory");
        }
    }
    int st = compile(r, t, text, err);
    if (st) {
        tl_chat_template_free(t);
        return st;
    }
    *out = t;
    return TL_OK;
}

/* from_jansson hands the template each object's keys in the order the JSON
 * gave them, as Python's json.loads does; jansson keeps insertion order only
 * from 2.8 on. */
#if JANSSON_VERSION_HEX < 0x020800
#error "chat templates need jansson 2.8 or later (objects in insertion order)"
#endif

/* Where a render's variables come from: jansson values (JSON text is parsed
 * into them first), or plain messages. */
typedef struct vars_src {
    const json_t *jv;
    const tl_chat_msg *msgs;
    size_t n_msgs;
    int plain; /* msgs given (perhaps none) */
} vars_src;

/* A jansson value as a template value; strings point into the jansson
 * value, which outlives the render. */
static val from_jansson(R *r, const json_t *j, int depth) {
    if (depth > MAX_DEPTH) jj_die(r, TL_ERR_FORMAT, -1, "messages nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        vdict *d = jj_dict_new(r);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) jj_dict_set(r, d, k, strlen(k), from_jansson(r, v, depth + 1));
        return v_dict(d);
    }
    case JSON_ARRAY: {
        vlist *l = jj_list_new(r);
        for (size_t i = 0; i < json_array_size(j); i++) jj_list_push(r, l, from_jansson(r, json_array_get(j, i), depth + 1));
        return v_list(l);
    }
    case JSON_STRING: return v_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return v_int((long long)json_integer_value(j));
    case JSON_REAL: return v_float(json_real_value(j));
    case JSON_TRUE: return v_bool(1);
    case JSON_FALSE: return v_bool(0);
    default: return v_none();
    }
}

static void render(R *r, const tl_chat_template *t, const vars_src *vs, int add_gen, sb *out) {
    scope *g = jj_scope_new(r, NULL);
    r->root = g;
    if (t->bos) jj_scope_set(r, g, "bos_token", v_cstr(t->bos));
    if (t->eos) jj_scope_set(r, g, "eos_token", v_cstr(t->eos));
    jj_scope_set(r, g, "add_generation_prompt", v_bool(add_gen));
    val v = {.t = T_UNDEF};
    if (vs->jv) {
        v = from_jansson(r, vs->jv, 0);
    } else if (vs->plain) {
        vlist *l = jj_list_new(r);
        for (size_t i = 0; i < vs->n_msgs; i++) {
            vdict *d = jj_dict_new(r);
            jj_dict_set(r, d, "role", 4, v_cstr(vs->msgs[i].role ? vs->msgs[i].role : ""));
            jj_dict_set(r, d, "content", 7, v_cstr(vs->msgs[i].content ? vs->msgs[i].content : ""));
            jj_list_push(r, l, v_dict(d));
        }
        v = v_list(l);
    }
    if (v.t == T_LIST) {
        jj_scope_set(r, g, "messages", v);
    } else if (v.t == T_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) jj_dict_set(r, &g->vars, v.u.d->k[i], v.u.d->kn[i], v.u.d->v[i]);
    } else if (v.t != T_UNDEF) {
        jj_die(r, TL_ERR_FORMAT, -1, "messages JSON must be a list or an object");
    }
    jj_exec(r, g, t->root, out);
}

static int render_entry(const tl_chat_template *t, const vars_src *vs, int add_generation_prompt, char **out,
                        size_t *out_len, tl_error *err) {
    if (!t || !out) return tl_fail(err, TL_ERR_ARG, "chat template: no template");
    *out = NULL;
    if (out_len) *out_len = 0;
    R *r = calloc(1, sizeof *r);
    if (!r) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    r->err = err;
    r->src = t->r->src; /* positions in errors */
    if (setjmp(r->jb)) {
        int st = r->status;
        jj_arena_free(r);
        free(r);
        return st;
    }
    sb *res = jj_alloc(r, sizeof *res);
    render(r, t, vs, add_generation_prompt, res);
    char *o = malloc(res->n + 1);
    if (!o) jj_die(r, TL_ERR_NOMEM, -1, "out of memory");
    if (res->n) memcpy(o, res->s, res->n);
    o[res->n] = 0;
    *out = o;
    if (out_len) *out_len = res->n;
    jj_arena_free(r);
    free(r);
    return TL_OK;
}

/* The messages or variables JSON text as jansson values. JSON_DECODE_ANY: a
 * top-level scalar parses, then fails as from any other source ("must be a
 * list or an object"); JSON_ALLOW_NUL: "\u0000" in a string stays, as
 * Python's json.loads keeps it (values carry their length). */
static int read_json(const char *text, size_t len, json_t **doc, tl_error *err) {
    json_error_t je;
    *doc = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (*doc) return TL_OK;
    if (json_error_code(&je) == json_error_out_of_memory) return tl_fail(err, TL_ERR_NOMEM, "chat template: out of memory");
    return tl_fail(err, TL_ERR_FORMAT, "chat template: messages JSON, byte %d: %s", je.position, je.text);
}

int tl_chat_template_render(const tl_chat_template *t, const char *vars_json, size_t len, int add_generation_prompt,
                            char **out, size_t *out_len, tl_error *err) {
    json_t *doc = NULL;
    if (t && out && vars_json) { /* else render_entry reports the bad call, or renders without variables */
        int st = read_json(vars_json, len, &doc, err);
        if (st) {
            *out = NULL;
            if (out_len) *out_len = 0;
            return st;
        }
    }
    vars_src vs = {.jv = doc};
    int st = render_entry(t, &vs, add_generation_prompt, out, out_len, err);
    json_decref(doc);
    return st;
}

int tl_chat_template_render_msgs(const tl_chat_template *t, const tl_chat_msg *msgs, size_t n_msgs,
                                 int add_generation_prompt, char **out, size_t *out_len, tl_error *err) {
    if (n_msgs && !msgs) return tl_fail(err, TL_ERR_ARG, "chat template: no messages");
    vars_src vs = {.msgs = msgs, .n_msgs = n_msgs, .plain = 1};
    return render_entry(t, &vs, add_generation_prompt, out, out_len, err);
}

int tl_chat_template_render_json(const tl_chat_template *t, const json_t *vars, int add_generation_prompt,
                                 char **out, size_t *out_len, tl_error *err) {
    if (!vars) return tl_fail(err, TL_ERR_ARG, "chat template: no messages");
    vars_src vs = {.jv = vars};
    return render_entry(t, &vs, add_generation_prompt, out, out_len, err);
}

int tl_chat_render_vars(const char *tmpl, const char *json, size_t json_len, const char *bos,
                        const char *eos, int add_generation_prompt, char **out, size_t *out_len,
                        tl_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!tmpl) return tl_fail(err, TL_ERR_ARG, "chat template: no template");
    tl_chat_template *t;
    int st = tl_chat_template_new(NULL, tmpl, &t, err);
    if (st) return st;
    if ((bos && !(t->bos = strdup(bos))) || (eos && !(t->eos = strdup(eos)))) {
        tl_chat_template_free(t);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    st = tl_chat_template_render(t, json, json_len, add_generation_prompt, out, out_len, err);
    tl_chat_template_free(t);
    return st;
}

int tl_chat_apply(const tl_model *model, const char *tmpl, const char *messages_json, size_t len,
                  int add_generation_prompt, char **out, size_t *out_len, tl_error *err) {
    if (out) *out = NULL;
    tl_chat_template *t;
    int st = tl_chat_template_new(model, tmpl, &t, err);
    if (st) return st;
    st = tl_chat_template_render(t, messages_json, len, add_generation_prompt, out, out_len, err);
    tl_chat_template_free(t);
    return st;
}

int tl_chat_apply_msgs(const tl_model *model, const char *tmpl, const tl_chat_msg *msgs,
                       size_t n_msgs, int add_generation_prompt, char **out, size_t *out_len,
                       tl_error *err) {
    if (out) *out = NULL;
    tl_chat_template *t;
    int st = tl_chat_template_new(model, tmpl, &t, err);
    if (st) return st;
    st = tl_chat_template_render_msgs(t, msgs, n_msgs, add_generation_prompt, out, out_len, err);
    tl_chat_template_free(t);
    return st;
}

