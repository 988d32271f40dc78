/* dequant_tensor: writes one tensor of a GGUF file, dequantized with
 * tl_dequantize_row, as little-endian float32 rows, so tests/py can compare
 * it bit for bit with the gguf package. Optional ROW0 NROWS pick a slice of
 * rows (for embedding tables too big to dump whole). The --quantize mode
 * runs tl_quantize_row over a float32 file, for the same comparison the other
 * way round.
 * Usage: dequant_tensor FILE TENSOR_NAME OUT.bin [ROW0 NROWS]
 *        dequant_tensor --quantize TYPE_ID ROW_LEN IN.f32 OUT.bin */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/gguf.h"
#include "quant/quant.h"
#include "base/util.h"

static int dump_rows(const tl_gguf_tensor *t, int64_t row0, int64_t nrows, FILE *out, tl_error *err) {
    const int64_t ne0 = t->ne[0];
    const size_t row_bytes = tl_row_size((tl_type)t->type, ne0);
    if (!row_bytes) return tl_fail(err, TL_ERR_FORMAT, "row of %lld elements has no size", (long long)ne0);
    float *buf = malloc((size_t)ne0 * sizeof *buf);
    if (!buf) return tl_fail(err, TL_ERR_NOMEM, "out of memory for a row of %lld floats", (long long)ne0);
    int rc = TL_OK;
    for (int64_t r = row0; r < row0 + nrows && rc == TL_OK; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * row_bytes;
        if (tl_dequantize_row((tl_type)t->type, src, buf, ne0) != 0)
            rc = tl_fail(err, TL_ERR_UNSUPPORTED, "cannot dequantize type %u", t->type);
        else if (fwrite(buf, sizeof *buf, (size_t)ne0, out) != (size_t)ne0)
            rc = tl_fail(err, TL_ERR_IO, "write failed");
    }
    free(buf);
    return rc;
}

static int run(int argc, char **argv, tl_error *err) {
    tl_gguf *g = NULL;
    int rc = tl_gguf_open(argv[1], &g, err);
    if (rc != TL_OK) return rc;
    const tl_gguf_tensor *t = tl_gguf_find_tensor(g, argv[2]);
    int64_t nrows_all = t ? t->ne[1] * t->ne[2] * t->ne[3] : 0;
    int64_t row0 = argc > 4 ? atoll(argv[4]) : 0, nrows = argc > 5 ? atoll(argv[5]) : nrows_all - row0;
    FILE *out = NULL;
    if (!t)
        rc = tl_fail(err, TL_ERR_ARG, "no tensor '%s' in %s", argv[2], argv[1]);
    else if (row0 < 0 || nrows < 0 || row0 > nrows_all || nrows > nrows_all - row0)
        rc = tl_fail(err, TL_ERR_ARG, "rows %lld+%lld out of range (%lld rows)", (long long)row0, (long long)nrows,
                     (long long)nrows_all);
    else if (!(out = fopen(argv[3], "wb")))
        rc = tl_fail(err, TL_ERR_IO, "cannot create %s", argv[3]);
    else
        rc = dump_rows(t, row0, nrows, out, err);
    if (out && fclose(out) != 0 && rc == TL_OK) rc = tl_fail(err, TL_ERR_IO, "cannot write %s", argv[3]);
    tl_gguf_close(g);
    return rc;
}

/* Reads all of path into a malloc'ed buffer. */
static int read_all(const char *path, void **out, size_t *size, tl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tl_fail(err, TL_ERR_IO, "cannot open %s", path);
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    void *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    int rc = TL_OK;
    if (n < 0 || !buf)
        rc = tl_fail(err, n < 0 ? TL_ERR_IO : TL_ERR_NOMEM, "cannot read %s", path);
    else if (fseek(f, 0, SEEK_SET) != 0 || fread(buf, 1, (size_t)n, f) != (size_t)n)
        rc = tl_fail(err, TL_ERR_IO, "short read on %s", path);
    fclose(f);
    if (rc != TL_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    *size = (size_t)n;
    return TL_OK;
}

static int quantize_file(const char *type_s, const char *len_s, const char *in, const char *outp, tl_error *err) {
    const tl_type type = (tl_type)atoi(type_s);
    const int64_t ne0 = atoll(len_s);
    const size_t row_bytes = tl_row_size(type, ne0);
    if (!row_bytes) return tl_fail(err, TL_ERR_ARG, "bad type %s or row length %s", type_s, len_s);
    void *src = NULL;
    size_t size = 0;
    int rc = read_all(in, &src, &size, err);
    if (rc != TL_OK) return rc;
    const size_t nrows = size / ((size_t)ne0 * sizeof(float));
    uint8_t *dst = NULL;
    FILE *out = NULL;
    if (size % ((size_t)ne0 * sizeof(float)))
        rc = tl_fail(err, TL_ERR_ARG, "%s is not whole rows of %lld floats", in, (long long)ne0);
    else if (!(dst = malloc(row_bytes)))
        rc = tl_fail(err, TL_ERR_NOMEM, "out of memory");
    else if (!(out = fopen(outp, "wb")))
        rc = tl_fail(err, TL_ERR_IO, "cannot create %s", outp);
    for (size_t r = 0; r < nrows && rc == TL_OK; r++) {
        if (tl_quantize_row(type, (const float *)src + r * (size_t)ne0, dst, ne0) != 0)
            rc = tl_fail(err, TL_ERR_UNSUPPORTED, "cannot quantize to type %d", (int)type);
        else if (fwrite(dst, 1, row_bytes, out) != row_bytes)
            rc = tl_fail(err, TL_ERR_IO, "write failed");
    }
    if (out && fclose(out) != 0 && rc == TL_OK) rc = tl_fail(err, TL_ERR_IO, "cannot write %s", outp);
    free(dst);
    free(src);
    return rc;
}

int main(int argc, char **argv) {
    tl_error qerr = {0, ""};
    if (argc == 6 && !strcmp(argv[1], "--quantize")) {
        if (quantize_file(argv[2], argv[3], argv[4], argv[5], &qerr) == TL_OK) return 0;
        fprintf(stderr, "dequant_tensor: %s\n", qerr.msg);
        return 1;
    }
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s FILE TENSOR_NAME OUT.bin [ROW0 NROWS]\n"
                        "       %s --quantize TYPE_ID ROW_LEN IN.f32 OUT.bin\n", argv[0], argv[0]);
        return 2;
    }
    tl_error err = {0, ""};
    if (run(argc, argv, &err) != TL_OK) {
        fprintf(stderr, "dequant_tensor: %s\n", err.msg);
        return 1;
    }
    return 0;
}
