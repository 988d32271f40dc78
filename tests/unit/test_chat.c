/* Unit tests of the chat-template renderer (src/chat/): expressions, filters,
 * whitespace control, loops, scoping and errors, on small templates whose
 * output follows by hand from jinja2's rules (trim_blocks, lstrip_blocks). */
#include <string.h>

#include "chat/chat.h"
#include "tl_test.h"
#include "tokenloop.h"

/* Renders tmpl with the JSON variables; returns 1 if the output is want. */
static int renders(const char *tmpl, const char *json, const char *want) {
    char *out = NULL;
    size_t n = 0;
    tl_error err = {0};
    const char *j = json ? json : "{\"messages\": []}";
    int st = tl_chat_apply(NULL, tmpl, j, strlen(j), 1, &out, &n, &err);
    int ok = st == 0 && n == strlen(want) && !memcmp(out, want, n);
    if (!ok) fprintf(stderr, "  template %s\n  want [%s]\n  got  [%s] (%s)\n", tmpl, want, st ? "" : out, err.msg);
    tl_free(out);
    return ok;
}

/* Returns 1 if rendering fails with a message containing what. */
static int fails(const char *tmpl, const char *json, const char *what) {
    char *out = NULL;
    tl_error err = {0};
    const char *j = json ? json : "[]";
    int st = tl_chat_apply(NULL, tmpl, j, strlen(j), 1, &out, NULL, &err);
    int ok = st != 0 && out == NULL && strstr(err.msg, what) != NULL;
    if (!ok) fprintf(stderr, "  template %s: status %d, message [%s], want [%s]\n", tmpl, st, err.msg, what);
    tl_free(out);
    return ok;
}

/* A template compiled once renders many conversations, each as a one-off
 * render would, from JSON text, jansson values or plain messages alike; a
 * syntax error is found when compiling. */
static void test_compiled(void) {
    const char *tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}"
                       "{% if tools %}[{{ tools | tojson }}]{% endif %}{{ eos_token }}";
    tl_error err = {0};
    tl_chat_template *t = NULL;
    CHECK(tl_chat_template_new(NULL, tmpl, &t, &err) == TL_OK, "compile: %s", err.msg);
    if (!t) return;
    for (int i = 0; i < 3; i++) {
        char js[200], want[200], *a = NULL, *b = NULL, *c = NULL;
        snprintf(js, sizeof js, "{\"messages\": [{\"role\": \"user\", \"content\": \" q%d \"}],"
                 " \"tools\": [{\"b\": %d, \"a\": [1.0, \"x\\n\"]}]}", i, i);
        snprintf(want, sizeof want, "<user>q%d[[{\"b\": %d, \"a\": [1.0, \"x\\n\"]}]]", i, i);
        size_t na = 0, nb = 0, nc = 0;
        CHECK(tl_chat_template_render(t, js, strlen(js), 1, &a, &na, &err) == TL_OK && !strcmp(a, want),
              "compiled render %d: [%s] want [%s] (%s)", i, a ? a : "", want, err.msg);
        json_t *jv = json_loads(js, 0, NULL);
        CHECK(jv && tl_chat_template_render_json(t, jv, 1, &b, &nb, &err) == TL_OK && nb == na && !strcmp(a, b),
              "jansson render %d: [%s] (%s)", i, b ? b : "", err.msg);
        json_decref(jv);
        char q[16];
        snprintf(q, sizeof q, " q%d ", i);
        tl_chat_msg m = {"user", q};
        snprintf(want, sizeof want, "<user>q%d", i);
        CHECK(tl_chat_template_render_msgs(t, &m, 1, 1, &c, &nc, &err) == TL_OK && !strcmp(c, want),
              "plain messages %d: [%s] (%s)", i, c ? c : "", err.msg);
        tl_free(a);
        tl_free(b);
        tl_free(c);
    }
    char *o = NULL;
    CHECK(tl_chat_template_render_msgs(t, NULL, 0, 1, &o, NULL, &err) == TL_OK && o && !*o, "no messages");
    tl_free(o);
    tl_chat_template_free(t);
    t = NULL;
    CHECK(tl_chat_template_new(NULL, "a\n{% if x %}b", &t, &err) != TL_OK && !t && strstr(err.msg, "line 2"),
          "a syntax error at compile time, with its line: %s", err.msg);
}

#define R(t, j, w) CHECK(renders(t, j, w), "render")
#define F(t, j, w) CHECK(fails(t, j, w), "failure")

/* The messages JSON text reads as Python's json.loads reads it: keys in the
 * order given, the last of duplicate keys winning in the first one's place,
 * integers apart from floats, \u0000 kept inside a string; a top-level
 * scalar, bad JSON and absurd nesting fail with a message. */
static void test_json_input(void) {
    R("{{ x }}|{{ x | tojson }}", "{\"x\": {\"b\": 1, \"a\": 2, \"b\": 3}}", "{'b': 3, 'a': 2}|{\"b\": 3, \"a\": 2}");
    R("{{ x }}", "{\"x\": [1, 1.0, -0, 1e2, 2.5e-1, 9223372036854775807]}", "[1, 1.0, 0, 100.0, 0.25, 9223372036854775807]");
    R("{{ x | length }}{{ x | tojson }}", "{\"x\": \"a\\u0000b\"}", "3\"a\\u0000b\"");
    F("{{ x }}", "5", "must be a list or an object");
    F("{{ x }}", "[] x", "messages JSON, byte");
    char deep[1200];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{\"x\": ");
    for (int i = 0; i < 500; i++) deep[n++] = '[';
    for (int i = 0; i < 500; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = 0;
    F("{{ x }}", deep, "nested too deeply");
}

int main(void) {
    const char *msgs = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
                       "{\"role\": \"user\", \"content\": \" hi \"},"
                       "{\"role\": \"assistant\", \"content\": \"yo\"}], \"n\": 7}";
    /* expressions */
    R("{{ 1 + 2 * 3 }}", NULL, "7");
    R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}", NULL, "3 -4 2 3.5 1024");
    R("{{ 'a' + 'b' ~ 1 ~ none }}", NULL, "ab1None");
    R("{{ true and 'x' }}|{{ 0 or 'y' }}|{{ not [] }}", NULL, "x|y|True");
    R("{{ 'yes' if 1 < 2 < 3 else 'no' }}{{ 'z' if false }}", NULL, "yes");
    R("{{ 'ell' in 'hello' }}{{ 2 not in [1, 3] }}{{ 'a' in {'a': 1} }}", NULL, "TrueTrueTrue");
    R("{{ [1, 'two', none, true] }} {{ {'k': 'v'} }} {{ (1,) }}", NULL, "[1, 'two', None, True] {'k': 'v'} (1,)");
    R("{{ 1.5 + 1 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 0.00001 }} {{ 123456.5 }}", NULL,
      "2.5 1000.0 0.30000000000000004 1e+16 1e-05 123456.5");
    R("{{ messages[0]['role'] }}{{ messages[1].content }}{{ messages[-1].role }}", msgs, "system hi assistant");
    R("{{ messages[1:] | length }}{{ messages[:1][0].role }}{{ 'abcdef'[1:4] }}{{ 'abc'[::-1] }}", msgs, "2systembcdcba");
    R("{{ 'héllo'[1] }}{{ 'héllo' | length }}", NULL, "é5");
    R("{{ undefined_thing }}|{{ undefined_thing is defined }}|{{ messages[9] is defined }}", msgs, "|False|False");
    R("{{ n is number }}{{ n is string }}{{ messages is iterable }}{{ messages[0] is mapping }}{{ none is none }}",
      msgs, "TrueFalseTrueTrueTrue");
    /* string methods and filters */
    R("{{ '  x  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}",
      NULL, "x|axx|['a', 'b', '', 'c']|['a', 'b']");
    R("{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}{{ 'ab'.upper() }}{{ 'aXa'.replace('a', 'b') }}",
      NULL, "TrueTrueABbXb");
    R("{{ ' t ' | trim }}|{{ 'ab' | upper }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}", NULL,
      "t|AB|Hello World|Hello");
    R("{{ [1, 2, 3] | join('-') }}|{{ [3, 4] | first }}{{ [3, 4] | last }}|{{ x | default('d') }}|{{ 5 | string }}",
      NULL, "1-2-3|34|d|5");
    R("{{ '42' | int + 1 }}|{{ {'b': 1, 'a': 2} | items | list }}", NULL, "43|[('b', 1), ('a', 2)]");
    R("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join }}", msgs, " hi ");
    R("{{ {'a': [1, 'é', none, true, 1.5], 'q': 'x\"y\\n'} | tojson }}", NULL,
      "{\"a\": [1, \"é\", null, true, 1.5], \"q\": \"x\\\"y\\n\"}");
    R("{{ {'a': [1]} | tojson(indent=2) }}", NULL, "{\n  \"a\": [\n    1\n  ]\n}");
    /* whitespace control: trim_blocks drops the newline after a tag, lstrip_blocks the indent before it */
    R("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
    R("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    R("{{ 'x' }}\n{{- 'y' }}  \n{{ 'z' -}}  \n w", NULL, "xy  \nzw");
    R("a {# note #}\nb\n  {#- c -#}\n d", NULL, "a bd");
    R("line\n{%+ if true %}x{% endif +%}\ny", NULL, "line\nx\ny");
    R("x\n", NULL, "x");
    /* loops */
    R("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
      msgs, "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
    R("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
    R("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      NULL, "13");
    R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}", NULL, "a=1 b=2 ");
    R("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", NULL, "2242");
    R("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}", NULL, "012135");
    /* scoping: set in a loop stays in the loop; namespaces carry out */
    R("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", NULL, "231");
    R("{% set ns = namespace(c=0) %}{% for i in [1, 2, 3] %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}", NULL, "6");
    R("{% set b %}in {{ 1 + 1 }}{% endset %}[{{ b }}]", NULL, "[in 2]");
    R("{% if false %}a{% elif 1 %}b{% else %}c{% endif %}", NULL, "b");
    R("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('A') }}, {{ greet('B', p='Yo') }}",
      NULL, "Hi A, Yo B");
    R("{{ bos_token }}{{ add_generation_prompt }}", "{\"messages\": [], \"bos_token\": \"<s>\"}", "<s>True");
    R("{{ messages[0].content }}", "[{\"role\": \"user\", \"content\": \"\\u00e9\\ud83d\\ude42\"}]", "é🙂");
    /* a value that contains itself, or nested past any template's need:
     * printing and tojson fail by name, == compares by identity there (each
     * recursed without end or past the stack) */
    F("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}", NULL, "containing itself");
    F("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns | tojson }}", NULL, "containing itself");
    F("{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v|tojson }}",
      NULL, "nested more than 256");
    F("{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}", NULL,
      "nested more than 256");
    R("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns == ns }}", NULL, "True");
    R("{{ [[[1]], {'a': [2]}] == [[[1]], {'a': [2]}] }}{{ [[1]] == [[2]] }}", NULL, "TrueFalse");
    /* errors: raise_exception, unsupported constructs, syntax, undefined */
    F("{{ raise_exception('Roles must alternate') }}", NULL, "Roles must alternate");
    F("ok\n{% include 'x' %}", NULL, "line 2");
    F("{% filter upper %}x{% endfilter %}", NULL, "unsupported construct");
    F("{{ 'x' | wordwrap }}", NULL, "filter 'wordwrap'");
    F("{% if true %}x", NULL, "endif");
    F("{{ a.b }}", NULL, "'a' is undefined");
    F("{{ 'a' + 1 }}", NULL, "unsupported operand");
    F("{{ [1].append(2) }}", NULL, "unsafe");
    F("{{ x }}", "[{\"role\": }]", "JSON");
    test_json_input();
    test_compiled();
    return tl_test_summary();
}
