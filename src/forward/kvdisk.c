/* kvdisk: the prefix cache's blocks on disk (see kvdisk.h).
 *
 * A file is "<key as 32 hex digits>.kvb": a header (magic, identity, key,
 * parent key, tokens, block bytes, data checksum) and the block's bytes as
 * the backend lays them out. Files are written as ".tmp" and renamed, so a
 * crash leaves either a whole file or a stray ".tmp" (deleted at open). The
 * index is a hash table over entries kept in a list by last use (head:
 * deleted first when the directory passes its budget). The checksum is a
 * fast 64-bit one for torn or corrupted files; the key's SHA-256 is what
 * makes one prompt's blocks unreachable from another's. Host byte order:
 * the directory belongs to this machine's server. */
#include "forward/kvdisk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"

#define MAGIC "TLKVB001"
#define QUEUE_CAP ((size_t)64 << 20) /* bytes of blocks waiting for the writer */

typedef struct {
    char magic[8];
    uint8_t ident[TL_KVKEY], key[TL_KVKEY], parent[TL_KVKEY];
    int32_t tok[TL_KV_BLOCK];
    uint64_t block_bytes, sum;
} kvd_head;

typedef struct {
    uint8_t key[TL_KVKEY];
    int32_t hnext, prev, next; /* hash chain; use list (or the free list: next) */
    int queued;                /* written by the writer when it gets there */
} kvd_ent;

typedef struct pend {
    struct pend *next;
    kvd_head h;
    uint8_t data[];
} pend;

struct tl_kvdisk {
    char *dir;
    uint8_t ident[TL_KVKEY];
    size_t block_bytes;
    uint64_t budget, bytes, file_bytes;
    kvd_ent *e;
    int32_t n_e, cap_e, free_e;
    int32_t *hash;
    uint32_t n_hash;
    int32_t head, tail; /* head: least recently used */
    pthread_mutex_t mu;
    pthread_cond_t cv, idle;
    pthread_t th;
    int started, stop, busy;
    pend *q_head, *q_tail;
    size_t q_bytes;
    tl_disk_stats st;
    tl_log_fn log;
    void *log_arg;
};

void tl_kvdisk_key_next(const uint8_t parent[TL_KVKEY], const int32_t *tok, uint8_t out[TL_KVKEY]) {
    struct sha256_ctx s;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&s);
    sha256_update(&s, TL_KVKEY, parent);
    sha256_update(&s, TL_KV_BLOCK * sizeof *tok, (const uint8_t *)tok);
    sha256_digest(&s, sizeof d, d);
    memcpy(out, d, TL_KVKEY);
}

/* Four 64-bit lanes over the words, folded: several GB/s, so checking a
 * block costs far less than reading it. */
static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t a = 0x9E3779B97F4A7C15ull, b = 0xC2B2AE3D27D4EB4Full, c = 0x165667B19E3779F9ull, d = n;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        a = (a ^ w[0]) * 0x100000001B3ull, a ^= a >> 31;
        b = (b ^ w[1]) * 0x100000001B3ull, b ^= b >> 31;
        c = (c ^ w[2]) * 0x100000001B3ull, c ^= c >> 31;
        d = (d ^ w[3]) * 0x100000001B3ull, d ^= d >> 31;
    }
    for (; i < n; i++) a = (a ^ p[i]) * 0x100000001B3ull;
    uint64_t h = a ^ (b * 0x9E3779B97F4A7C15ull) ^ (c * 0xC2B2AE3D27D4EB4Full) ^ (d * 0x165667B19E3779F9ull);
    h ^= h >> 33, h *= 0xFF51AFD7ED558CCDull, h ^= h >> 33;
    return h;
}

static void say(tl_kvdisk *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(tl_kvdisk *d, const char *fmt, ...) {
    if (!d->log) return;
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    d->log(d->log_arg, msg);
}

/* A file's name: SHA-256 of the identity and the key, so that blocks of the
 * same tokens computed by another model or setting never share a file. */
static void file_id(const uint8_t ident[TL_KVKEY], const uint8_t key[TL_KVKEY], uint8_t out[TL_KVKEY]) {
    struct sha256_ctx s;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&s);
    sha256_update(&s, TL_KVKEY, ident);
    sha256_update(&s, TL_KVKEY, key);
    sha256_digest(&s, sizeof d, d);
    memcpy(out, d, TL_KVKEY);
}

static void path_of(const tl_kvdisk *d, const uint8_t key[TL_KVKEY], const char *ext, char *out, size_t cap) {
    uint8_t id[TL_KVKEY];
    char hex[2 * TL_KVKEY + 1];
    file_id(d->ident, key, id);
    for (int i = 0; i < TL_KVKEY; i++) snprintf(hex + 2 * i, 3, "%02x", id[i]);
    snprintf(out, cap, "%s/%s%s", d->dir, hex, ext);
}

/* ---- the index (under mu) -------------------------------------------------- */

static uint32_t key_bucket(const tl_kvdisk *d, const uint8_t key[TL_KVKEY]) {
    uint32_t h;
    memcpy(&h, key, sizeof h); /* a SHA-256 prefix: already uniform */
    return h & (d->n_hash - 1);
}

static int32_t find(const tl_kvdisk *d, const uint8_t key[TL_KVKEY]) {
    for (int32_t i = d->hash[key_bucket(d, key)]; i >= 0; i = d->e[i].hnext)
        if (!memcmp(d->e[i].key, key, TL_KVKEY)) return i;
    return -1;
}

static void list_unlink(tl_kvdisk *d, int32_t i) {
    kvd_ent *x = &d->e[i];
    if (x->prev >= 0) d->e[x->prev].next = x->next;
    else d->head = x->next;
    if (x->next >= 0) d->e[x->next].prev = x->prev;
    else d->tail = x->prev;
}

static void list_append(tl_kvdisk *d, int32_t i) {
    kvd_ent *x = &d->e[i];
    x->prev = d->tail;
    x->next = -1;
    if (d->tail >= 0) d->e[d->tail].next = i;
    else d->head = i;
    d->tail = i;
}

static int grow(tl_kvdisk *d) {
    int32_t cap = d->cap_e ? 2 * d->cap_e : 1024;
    kvd_ent *e = realloc(d->e, (size_t)cap * sizeof *e);
    if (!e) return -1;
    d->e = e;
    for (int32_t i = d->cap_e; i < cap; i++) e[i].next = i + 1 < cap ? i + 1 : d->free_e;
    d->free_e = d->cap_e;
    d->cap_e = cap;
    uint32_t nh = d->n_hash;
    while (nh < (uint32_t)cap * 2u) nh <<= 1;
    if (nh != d->n_hash) {
        int32_t *h = malloc(nh * sizeof *h);
        if (!h) return -1;
        free(d->hash);
        d->hash = h;
        d->n_hash = nh;
        for (uint32_t i = 0; i < nh; i++) h[i] = -1;
        for (int32_t i = d->head; i >= 0; i = d->e[i].next) {
            int32_t *b = &d->hash[key_bucket(d, d->e[i].key)];
            d->e[i].hnext = *b;
            *b = i;
        }
    }
    return 0;
}

/* A new entry at the tail (most recently used), or -1. */
static int32_t insert(tl_kvdisk *d, const uint8_t key[TL_KVKEY], int queued) {
    if (d->free_e < 0 && grow(d)) return -1;
    int32_t i = d->free_e;
    d->free_e = d->e[i].next;
    kvd_ent *x = &d->e[i];
    memcpy(x->key, key, TL_KVKEY);
    x->queued = queued;
    int32_t *b = &d->hash[key_bucket(d, key)];
    x->hnext = *b;
    *b = i;
    list_append(d, i);
    d->n_e++;
    return i;
}

static void forget(tl_kvdisk *d, int32_t i) {
    kvd_ent *x = &d->e[i];
    for (int32_t *p = &d->hash[key_bucket(d, x->key)]; *p >= 0; p = &d->e[*p].hnext)
        if (*p == i) {
            *p = x->hnext;
            break;
        }
    list_unlink(d, i);
    if (!x->queued) d->bytes -= d->file_bytes;
    x->next = d->free_e;
    d->free_e = i;
    d->n_e--;
}

/* Deletes the least recently used files while the directory is over budget
 * (never one still queued: it has no file yet). */
static void evict(tl_kvdisk *d) {
    for (int32_t i = d->head; i >= 0 && d->bytes > d->budget;) {
        int32_t nx = d->e[i].next;
        if (!d->e[i].queued) {
            char p[4096];
            path_of(d, d->e[i].key, ".kvb", p, sizeof p);
            unlink(p);
            forget(d, i);
            d->st.evicted++;
        }
        i = nx;
    }
}

/* ---- the writer ------------------------------------------------------------ */

static int write_file(tl_kvdisk *d, const pend *w) {
    char tmp[4096], fin[4096];
    path_of(d, w->h.key, ".tmp", tmp, sizeof tmp);
    path_of(d, w->h.key, ".kvb", fin, sizeof fin);
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fwrite(&w->h, sizeof w->h, 1, f) == 1 && fwrite(w->data, 1, d->block_bytes, f) == d->block_bytes;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, fin)) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void *writer(void *arg) {
    tl_kvdisk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->q_head && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
        if (!d->q_head) break;
        pend *w = d->q_head;
        d->q_head = w->next;
        if (!d->q_head) d->q_tail = NULL;
        d->busy = 1;
        pthread_mutex_unlock(&d->mu);
        const int rc = write_file(d, w);
        pthread_mutex_lock(&d->mu);
        d->busy = 0;
        d->q_bytes -= d->block_bytes;
        const int32_t i = find(d, w->h.key);
        if (i >= 0 && d->e[i].queued) {
            if (rc) {
                forget(d, i);
                d->st.failed++;
            } else {
                d->e[i].queued = 0;
                d->bytes += d->file_bytes;
                d->st.written++;
                evict(d);
            }
        }
        if (rc && d->st.failed == 1) {
            pthread_mutex_unlock(&d->mu);
            say(d, "cannot write to %s (%s); blocks that fail are not kept on disk", d->dir, strerror(errno));
            pthread_mutex_lock(&d->mu);
        }
        free(w);
        if (!d->q_head) pthread_cond_broadcast(&d->idle);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

void tl_kvdisk_put(tl_kvdisk *d, const uint8_t key[TL_KVKEY], const uint8_t parent[TL_KVKEY], const int32_t *tok,
                   const void *data) {
    pthread_mutex_lock(&d->mu);
    if (find(d, key) >= 0) {
        pthread_mutex_unlock(&d->mu);
        return;
    }
    pend *w = NULL;
    if (d->q_bytes + d->block_bytes > QUEUE_CAP || !(w = malloc(sizeof *w + d->block_bytes)) ||
        insert(d, key, 1) < 0) {
        free(w);
        d->st.dropped++;
        pthread_mutex_unlock(&d->mu);
        return;
    }
    pthread_mutex_unlock(&d->mu);
    memset(&w->h, 0, sizeof w->h);
    memcpy(w->h.magic, MAGIC, 8);
    memcpy(w->h.ident, d->ident, TL_KVKEY);
    memcpy(w->h.key, key, TL_KVKEY);
    memcpy(w->h.parent, parent, TL_KVKEY);
    memcpy(w->h.tok, tok, sizeof w->h.tok);
    w->h.block_bytes = d->block_bytes;
    memcpy(w->data, data, d->block_bytes);
    w->h.sum = checksum(w->data, d->block_bytes);
    w->next = NULL;
    pthread_mutex_lock(&d->mu);
    if (d->q_tail) d->q_tail->next = w;
    else d->q_head = w;
    d->q_tail = w;
    d->q_bytes += d->block_bytes;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

int tl_kvdisk_get(tl_kvdisk *d, const uint8_t key[TL_KVKEY], const uint8_t parent[TL_KVKEY], const int32_t *tok,
                  void *out) {
    pthread_mutex_lock(&d->mu);
    const int32_t i = find(d, key);
    const int have = i >= 0 && !d->e[i].queued;
    pthread_mutex_unlock(&d->mu);
    if (!have) return -1;
    char p[4096];
    path_of(d, key, ".kvb", p, sizeof p);
    FILE *f = fopen(p, "rb");
    kvd_head h;
    const char *bad = NULL;
    if (!f) bad = "cannot be opened";
    else if (fread(&h, sizeof h, 1, f) != 1 || fread(out, 1, d->block_bytes, f) != d->block_bytes) bad = "is short";
    else if (memcmp(h.magic, MAGIC, 8) || memcmp(h.ident, d->ident, TL_KVKEY) || h.block_bytes != d->block_bytes)
        bad = "has another header";
    else if (memcmp(h.key, key, TL_KVKEY) || memcmp(h.parent, parent, TL_KVKEY) || memcmp(h.tok, tok, sizeof h.tok))
        bad = "holds another prefix";
    else if (h.sum != checksum(out, d->block_bytes))
        bad = "fails its checksum";
    if (f) fclose(f);
    pthread_mutex_lock(&d->mu);
    const int32_t j = find(d, key); /* the writer may have evicted it meanwhile */
    if (bad) {
        if (j >= 0 && !d->e[j].queued) {
            unlink(p);
            forget(d, j);
        }
        d->st.rejected++;
    } else {
        if (j >= 0) {
            list_unlink(d, j);
            list_append(d, j);
        }
        d->st.loaded++;
    }
    pthread_mutex_unlock(&d->mu);
    if (bad) say(d, "ignored %s: it %s", p, bad);
    return bad ? -1 : 0;
}

void tl_kvdisk_flush(tl_kvdisk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->q_head || d->busy) pthread_cond_wait(&d->idle, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void tl_kvdisk_stats(tl_kvdisk *d, tl_disk_stats *out) {
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->files = (uint64_t)d->n_e;
    out->bytes = d->bytes;
    out->budget = d->budget;
    pthread_mutex_unlock(&d->mu);
}

/* ---- opening: the directory's index (keys: the headers', checked against the names) ---- */

typedef struct {
    uint8_t key[TL_KVKEY];
    struct timespec mt;
} found;

static int by_mtime(const void *a, const void *b) {
    const found *x = a, *y = b;
    if (x->mt.tv_sec != y->mt.tv_sec) return x->mt.tv_sec < y->mt.tv_sec ? -1 : 1;
    return x->mt.tv_nsec < y->mt.tv_nsec ? -1 : x->mt.tv_nsec > y->mt.tv_nsec;
}

static int hexkey(const char *name, uint8_t key[TL_KVKEY]) {
    for (int i = 0; i < TL_KVKEY; i++) {
        unsigned v;
        if (sscanf(name + 2 * i, "%2x", &v) != 1) return -1;
        key[i] = (uint8_t)v;
    }
    return 0;
}

/* The valid files, oldest first; others logged. */
static int scan(tl_kvdisk *d, tl_error *err) {
    DIR *dir = opendir(d->dir);
    if (!dir) return tl_fail(err, TL_ERR_IO, "cannot read the cache directory %s: %s", d->dir, strerror(errno));
    found *fs = NULL;
    size_t n = 0, cap = 0;
    int other = 0, broken = 0, st = TL_OK;
    struct dirent *de;
    while ((de = readdir(dir))) {
        const char *nm = de->d_name;
        const size_t len = strlen(nm);
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", d->dir, nm);
        if (len == 2 * TL_KVKEY + 4 && !strcmp(nm + 2 * TL_KVKEY, ".tmp")) { /* a write cut short */
            unlink(p);
            continue;
        }
        uint8_t name[TL_KVKEY], fid[TL_KVKEY];
        if (len != 2 * TL_KVKEY + 4 || strcmp(nm + 2 * TL_KVKEY, ".kvb") || hexkey(nm, name)) continue;
        struct stat sb;
        kvd_head h;
        FILE *f = fopen(p, "rb");
        const int ok = f && fread(&h, sizeof h, 1, f) == 1 && !fstat(fileno(f), &sb);
        if (f) fclose(f);
        if (ok) file_id(h.ident, h.key, fid);
        if (!ok || memcmp(h.magic, MAGIC, 8) || memcmp(fid, name, TL_KVKEY) ||
            ((uint64_t)sb.st_size != d->file_bytes && !memcmp(h.ident, d->ident, TL_KVKEY))) {
            if (broken++ < 3) say(d, "ignored %s: not a whole block file", p);
            continue;
        }
        if (memcmp(h.ident, d->ident, TL_KVKEY) || h.block_bytes != d->block_bytes) {
            if (other++ < 3) say(d, "ignored %s: computed by another model, numerics mode or KV type (or LongRoPE factors)", p);
            continue;
        }
        if (n == cap) {
            found *g = realloc(fs, (cap = cap ? 2 * cap : 256) * sizeof *g);
            if (!g) {
                st = tl_fail(err, TL_ERR_NOMEM, "out of memory indexing %s", d->dir);
                break;
            }
            fs = g;
        }
        memcpy(fs[n].key, h.key, TL_KVKEY);
        fs[n++].mt = sb.st_mtim;
    }
    closedir(dir);
    if (other > 3 || broken > 3)
        say(d, "ignored %d files of other models and %d broken ones in %s in all", other, broken, d->dir);
    if (!st) {
        if (n) qsort(fs, n, sizeof *fs, by_mtime);
        for (size_t i = 0; i < n; i++) {
            if (insert(d, fs[i].key, 0) < 0) {
                st = tl_fail(err, TL_ERR_NOMEM, "out of memory indexing %s", d->dir);
                break;
            }
            d->bytes += d->file_bytes;
        }
        evict(d);
    }
    d->st.rejected += (uint64_t)(other + broken);
    free(fs);
    return st;
}

int tl_kvdisk_open(const char *dir, const uint8_t identity[TL_KVKEY], size_t block_bytes, uint64_t budget,
                   tl_log_fn log, void *log_arg, tl_kvdisk **out, tl_error *err) {
    *out = NULL;
    if (!dir || !*dir) return tl_fail(err, TL_ERR_ARG, "no cache directory");
    if (mkdir(dir, 0755) && errno != EEXIST)
        return tl_fail(err, TL_ERR_IO, "cannot make the cache directory %s: %s", dir, strerror(errno));
    tl_kvdisk *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = strdup(dir))) {
        free(d);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    memcpy(d->ident, identity, TL_KVKEY);
    d->block_bytes = block_bytes;
    d->file_bytes = sizeof(kvd_head) + block_bytes;
    d->budget = budget;
    d->log = log, d->log_arg = log_arg;
    d->head = d->tail = d->free_e = -1;
    d->n_hash = 1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->idle, NULL);
    int st = grow(d) ? tl_fail(err, TL_ERR_NOMEM, "out of memory") : scan(d, err);
    if (!st && pthread_create(&d->th, NULL, writer, d))
        st = tl_fail(err, TL_ERR_NOMEM, "cannot start the cache writer thread");
    if (st) {
        tl_kvdisk_close(d);
        return st;
    }
    d->started = 1;
    *out = d;
    return TL_OK;
}

void tl_kvdisk_close(tl_kvdisk *d) {
    if (!d) return;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->th, NULL);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->idle);
    free(d->e);
    free(d->hash);
    free(d->dir);
    free(d);
}
