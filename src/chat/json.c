/* json.c: the messages and variables JSON text, read straight into template
 * values in the render's arena. */
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"

typedef struct jp {
    R *r;
    const char *b, *s, *e;
    int depth;
} jp;

static _Noreturn void jfail(jp *j, const char *what) {
    jj_die(j->r, TL_ERR_FORMAT, -1, "messages JSON, byte %ld: %s", (long)(j->s - j->b), what);
}

static void jws(jp *j) {
    while (j->s < j->e && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r')) j->s++;
}

static val jstring(jp *j) {
    sb b = {0};
    j->s++; /* opening quote */
    for (;;) {
        if (j->s >= j->e) jfail(j, "unterminated string");
        char c = *j->s++;
        if (c == '"') break;
        if ((unsigned char)c < 0x20) jfail(j, "control character in string");
        if (c != '\\') {
            jj_sb_putc(j->r, &b, c);
            continue;
        }
        if (j->s >= j->e) jfail(j, "unterminated string");
        c = *j->s++;
        const char *m = strchr("\"\\/bfnrt", c);
        if (m && c) {
            jj_sb_putc(j->r, &b, "\"\\/\b\f\n\r\t"[m - "\"\\/bfnrt"]);
        } else if (c == 'u') {
            unsigned cp, lo;
            if (jj_hex4(j->s, j->e, &cp)) jfail(j, "bad \\u escape");
            j->s += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && j->e - j->s >= 6 && j->s[0] == '\\' &&
                j->s[1] == 'u' && !jj_hex4(j->s + 2, j->e, &lo) && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                j->s += 6;
            }
            jj_put_utf8(j->r, &b, cp);
        } else {
            jfail(j, "bad escape");
        }
    }
    if (!b.s) return v_str("", 0);
    return sb_val(&b);
}

static val jvalue(jp *j) {
    jws(j);
    if (j->s >= j->e) jfail(j, "unexpected end");
    if (++j->depth > MAX_DEPTH) jfail(j, "nested too deeply");
    val out;
    char c = *j->s;
    if (c == '"') {
        out = jstring(j);
    } else if (c == '[') {
        vlist *l = jj_list_new(j->r);
        j->s++;
        jws(j);
        if (j->s < j->e && *j->s == ']') j->s++;
        else for (;;) {
            jj_list_push(j->r, l, jvalue(j));
            jws(j);
            if (j->s < j->e && *j->s == ',') { j->s++; continue; }
            if (j->s < j->e && *j->s == ']') { j->s++; break; }
            jfail(j, "expected , or ]");
        }
        out = v_list(l);
    } else if (c == '{') {
        vdict *d = jj_dict_new(j->r);
        j->s++;
        jws(j);
        if (j->s < j->e && *j->s == '}') j->s++;
        else for (;;) {
            jws(j);
            if (j->s >= j->e || *j->s != '"') jfail(j, "expected a key");
            val k = jstring(j);
            jws(j);
            if (j->s >= j->e || *j->s != ':') jfail(j, "expected :");
            j->s++;
            jj_dict_set(j->r, d, k.u.s.s, k.u.s.n, jvalue(j));
            jws(j);
            if (j->s < j->e && *j->s == ',') { j->s++; continue; }
            if (j->s < j->e && *j->s == '}') { j->s++; break; }
            jfail(j, "expected , or }");
        }
        out = v_dict(d);
    } else if (!strncmp(j->s, "true", 4) && j->e - j->s >= 4) { j->s += 4; out = v_bool(1); }
    else if (!strncmp(j->s, "false", 5) && j->e - j->s >= 5) { j->s += 5; out = v_bool(0); }
    else if (!strncmp(j->s, "null", 4) && j->e - j->s >= 4) { j->s += 4; out = v_none(); }
    else if (c == '-' || (c >= '0' && c <= '9')) {
        const char *p = j->s;
        int is_f = 0;
        while (p < j->e && strchr("+-0123456789.eE", *p) && *p) {
            if (*p == '.' || *p == 'e' || *p == 'E') is_f = 1;
            p++;
        }
        char *tmp = jj_strdup(j->r, j->s, (size_t)(p - j->s)), *end;
        if (is_f) out = v_float(strtod(tmp, &end));
        else out = v_int(strtoll(tmp, &end, 10));
        if (*end) jfail(j, "bad number");
        j->s = p;
    } else {
        jfail(j, "unexpected character");
    }
    j->depth--;
    return out;
}

val jj_read_json(R *r, const char *s, size_t n) {
    jp j = {.r = r, .b = s, .s = s, .e = s + n};
    val v = jvalue(&j);
    jws(&j);
    if (j.s != j.e) jfail(&j, "trailing characters");
    return v;
}
