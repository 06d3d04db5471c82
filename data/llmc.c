/* llm.c's file formats: token shards, the GPT-2 checkpoint, the tokenizer.
 *
 * The layouts are those llm.c's writers produce (dev/data/data_common.py's
 * write_datafile, train_gpt2.py's write_model and write_tokenizer) and its
 * readers accept (llmc/dataloader.h, train_gpt2.c's
 * gpt2_build_from_checkpoint and fill_in_parameter_sizes, llmc/tokenizer.h);
 * docs/llmc.md describes them. llm.c trusts its files and asserts; here
 * every header field is checked before it sizes a mapping, a read or an
 * allocation, and each body must be exactly as long as its header says, so
 * that no file can make a reader touch memory it did not map or allocate. */
#include <ct/llmc.h>

#include <ct/cuda.h>

#include "base_impl.h"
#include "file_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Headers and bodies are little-endian; they are read and written in
 * place. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "llm.c's files are little-endian; ct reads and writes them in place");

#define HEADER_WORDS 256
#define HEADER_BYTES (HEADER_WORDS * 4)

/* Tags of live objects, checked at the API (a freed or foreign pointer is
 * refused). */
#define TOKENS_LIVE    0x4c4c4d54u /* "TMLL": a live ct_llmc_tokens */
#define LOADER_LIVE    0x4c4c4d4cu
#define TOKENIZER_LIVE 0x4c4c4d4bu
/* Token ids are uint16: a vocab of 65536 lets every id through. */
#define NO_VOCAB 65536

/* ------------------------------------------------------------ files */

/* What a magic number belongs to, for a message about a file given where
 * another was expected. */
static const char *magic_owner(int32_t magic) {
    switch (magic) {
    case CT_LLMC_TOKENS_MAGIC: return " (that is llm.c's token shard magic)";
    case CT_LLMC_GPT_MAGIC: return " (that is llm.c's GPT-2 model checkpoint magic)";
    case 20240327: return " (that is llm.c's debug state magic, gpt2_124M_debug_state.bin)";
    case CT_LLMC_TOKENIZER_MAGIC: return " (that is llm.c's tokenizer magic)";
    case 20240801:
        return " (that is llm.c's LLaMA-3 token shard magic: uint32 tokens, not read here)";
    default: return "";
    }
}

/* Opens path for reading, refusing a symbolic link and anything but a
 * regular file; *size is its length. Returns the fd or a negative code
 * with the message set. */
static int open_regular(const char *fn, const char *path, int64_t *size) {
    static const ct__file_rules rules = {
        .refuse = CT_ECORRUPT,
        .link_why = "; give the path of the file itself",
    };
    int fd = ct__file_open(AT_FDCWD, path, path, &rules, size, NULL);
    return fd < 0 ? ct__err_set(fd, "%s: %s", fn, ct_errmsg()) : fd;
}

/* Reads len bytes at off; a file that ends first is corrupt. */
static int pread_all(int fd, void *buf, size_t len, int64_t off, const char *fn, const char *path) {
    int rc = ct__file_pread_all(fd, buf, len, off, path);
    return rc ? ct__err_set(rc, "%s: %s", fn, ct_errmsg()) : 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, int64_t off, const char *fn,
                      const char *path) {
    int rc = ct__file_pwrite_all(fd, buf, len, off, path);
    return rc ? ct__err_set(rc, "%s: %s", fn, ct_errmsg()) : 0;
}

/* Opens path (as open_regular) and reads its header into h; a file shorter
 * than a header is corrupt with a message that says so (rather than "ends
 * early"). Returns the fd or a negative code, the file closed. */
static int open_with_header(const char *fn, const char *path, const char *what, int32_t *h,
                            int64_t *size) {
    int fd = open_regular(fn, path, size);
    if (fd < 0)
        return fd;
    int rc =
        *size < HEADER_BYTES
            ? ct__err_set(CT_ECORRUPT, "%s: %s: %lld bytes, shorter than the %d-byte header of %s",
                          fn, path, (long long)*size, HEADER_BYTES, what)
            : pread_all(fd, h, HEADER_BYTES, 0, fn, path);
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}

/* A body of exactly want bytes after the header, or an error saying how
 * the file's length differs. */
static int check_length(int64_t size, int64_t want, const char *fn, const char *path,
                        const char *desc) {
    if (size < want)
        return ct__err_set(CT_ECORRUPT,
                           "%s: %s: the file is %lld bytes, %lld short of the %lld that %s needs "
                           "(truncated?)",
                           fn, path, (long long)size, (long long)(want - size), (long long)want,
                           desc);
    if (size > want)
        return ct__err_set(CT_ECORRUPT,
                           "%s: %s: the file is %lld bytes, %lld more than the %lld that %s needs "
                           "(trailing bytes are refused: the header or the file is wrong)",
                           fn, path, (long long)size, (long long)(size - want), (long long)want,
                           desc);
    return 0;
}

/* ------------------------------------------------------------ token shards */

typedef struct shard {
    char *path;
    void *map; /* the whole file */
    size_t map_len;
    const uint16_t *tok; /* map + HEADER_BYTES */
    int64_t n;           /* tokens */
    int64_t start;       /* offset of tok[0] in the flat sequence */
} shard;

struct ct_llmc_tokens {
    uint32_t magic;
    int n;
    shard *s;
    int64_t total;
    int vocab; /* reads fail on a token >= vocab */
};

static bool tokens_ok(const ct_llmc_tokens *ts) { return ts && ts->magic == TOKENS_LIVE; }

/* Whether h, the header of the shard at sh->path, describes a file of size
 * bytes. */
static int check_shard_header(const char *fn, const shard *sh, const int32_t *h, int64_t size) {
    ct__errctx cx;
    ct__err_ctx_init(&cx, "%s: %s: ", fn, sh->path);
    CT_REQUIRE_CTX(&cx, h[0] == CT_LLMC_TOKENS_MAGIC, CT_ECORRUPT,
                   "magic %d is not llm.c's token shard magic %d%s", h[0], CT_LLMC_TOKENS_MAGIC,
                   magic_owner(h[0]));
    CT_REQUIRE_CTX(&cx, h[1] == CT_LLMC_TOKENS_VERSION, CT_EVERSION,
                   "token shard version %d; this reader knows version %d (uint16 tokens)", h[1],
                   CT_LLMC_TOKENS_VERSION);
    CT_REQUIRE_CTX(&cx, h[2] > 0, CT_ECORRUPT,
                   "the header says %d tokens; a shard holds at least 1", h[2]);
    char desc[64];
    snprintf(desc, sizeof desc, "the header's %d tokens", h[2]);
    /* An int32 count of 2-byte tokens cannot overflow int64. */
    return check_length(size, HEADER_BYTES + 2 * (int64_t)h[2], fn, sh->path, desc);
}

static int map_shard(shard *sh, const char *fn) {
    int64_t size;
    int32_t h[HEADER_WORDS];
    int fd = open_with_header(fn, sh->path, "a token shard", h, &size);
    if (fd < 0)
        return fd;
    int rc = check_shard_header(fn, sh, h, size);
    if (rc == 0) {
        sh->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (sh->map == MAP_FAILED) {
            sh->map = NULL;
            rc = ct__err_set(CT_EIO, "%s: %s: cannot map %lld bytes: %s", fn, sh->path,
                             (long long)size, strerror(errno));
        } else {
            sh->map_len = (size_t)size;
            sh->tok = (const uint16_t *)((const char *)sh->map + HEADER_BYTES);
            sh->n = h[2];
        }
    }
    close(fd);
    return rc;
}

void ct_llmc_tokens_free(ct_llmc_tokens *ts) {
    if (!tokens_ok(ts))
        return;
    for (int i = 0; i < ts->n; i++) {
        if (ts->s[i].map)
            munmap(ts->s[i].map, ts->s[i].map_len);
        free(ts->s[i].path);
    }
    free(ts->s);
    ts->magic = 0;
    free(ts);
}

static ct_llmc_tokens *open_paths(const char *fn, const char *const *paths, int n) {
    ct_llmc_tokens *ts = calloc(1, sizeof *ts);
    shard *s = ts ? calloc((size_t)n, sizeof *s) : NULL;
    if (!s) {
        free(ts);
        ct__err_set(CT_ENOMEM, "%s: out of memory for %d shards", fn, n);
        return NULL;
    }
    *ts = (ct_llmc_tokens){.magic = TOKENS_LIVE, .n = n, .s = s, .vocab = NO_VOCAB};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!paths[i] || !paths[i][0]) {
            rc = ct__err_set(CT_EINVAL, "%s: path %d is %s", fn, i, paths[i] ? "empty" : "NULL");
        } else if (!(s[i].path = strdup(paths[i]))) {
            rc = ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
        } else if ((rc = map_shard(&s[i], fn)) == 0) {
            s[i].start = ts->total;
            ts->total += s[i].n; /* at most INT_MAX shards of < 2^31 tokens */
        }
    }
    if (rc) {
        ct_llmc_tokens_free(ts);
        return NULL;
    }
    return ts;
}

ct_llmc_tokens *ct_llmc_tokens_open_paths(const char *const *paths, int n) {
    static const char fn[] = "llmc_tokens_open_paths";
    if (!paths || n < 1) {
        ct__err_set(CT_EINVAL, "%s: expected at least one path, got %s", fn,
                    paths ? "none" : "NULL");
        return NULL;
    }
    return open_paths(fn, paths, n);
}

ct_llmc_tokens *ct_llmc_tokens_open(const char *pattern) {
    static const char fn[] = "llmc_tokens_open";
    if (!pattern || !pattern[0]) {
        ct__err_set(CT_EINVAL, "%s: the pattern is %s", fn, pattern ? "empty" : "NULL");
        return NULL;
    }
    glob_t g;
    int grc = glob(pattern, GLOB_ERR, NULL, &g);
    if (grc == GLOB_NOMATCH) {
        ct__err_set(CT_EINVAL, "%s: no file matches '%s'", fn, pattern);
        return NULL;
    }
    if (grc != 0) {
        ct__err_set(grc == GLOB_NOSPACE ? CT_ENOMEM : CT_EIO, "%s: '%s': %s", fn, pattern,
                    grc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
        return NULL;
    }
    ct_llmc_tokens *ts = NULL;
    if (g.gl_pathc > INT_MAX)
        ct__err_set(CT_EINVAL, "%s: '%s' matches %zu files, more than %d", fn, pattern,
                    (size_t)g.gl_pathc, INT_MAX);
    else
        ts = open_paths(fn, (const char *const *)g.gl_pathv, (int)g.gl_pathc);
    globfree(&g);
    return ts;
}

static int check_tokens(const char *fn, const ct_llmc_tokens *ts) {
    return tokens_ok(ts) ? 0
                         : ct__err_set(CT_EINVAL, "%s: the token set is %s", fn,
                                       ts ? "not an open ct_llmc_tokens" : "NULL");
}

/* NULL/-1 results for a bad set or shard index, with the message set. */
static const shard *shard_at(const char *fn, const ct_llmc_tokens *ts, int i) {
    if (check_tokens(fn, ts))
        return NULL;
    if (i < 0 || i >= ts->n) {
        ct__err_set(CT_ERANGE, "%s: shard %d is outside [0, %d)", fn, i, ts->n);
        return NULL;
    }
    return &ts->s[i];
}

int64_t ct_llmc_tokens_count(const ct_llmc_tokens *ts) {
    return check_tokens("llmc_tokens_count", ts) ? -1 : ts->total;
}

int ct_llmc_tokens_num_shards(const ct_llmc_tokens *ts) {
    return check_tokens("llmc_tokens_num_shards", ts) ? -1 : ts->n;
}

const char *ct_llmc_tokens_shard_path(const ct_llmc_tokens *ts, int i) {
    const shard *s = shard_at("llmc_tokens_shard_path", ts, i);
    return s ? s->path : NULL;
}

int64_t ct_llmc_tokens_shard_count(const ct_llmc_tokens *ts, int i) {
    const shard *s = shard_at("llmc_tokens_shard_count", ts, i);
    return s ? s->n : -1;
}

int64_t ct_llmc_tokens_shard_start(const ct_llmc_tokens *ts, int i) {
    const shard *s = shard_at("llmc_tokens_shard_start", ts, i);
    return s ? s->start : -1;
}

const uint16_t *ct_llmc_tokens_shard_data(const ct_llmc_tokens *ts, int i) {
    const shard *s = shard_at("llmc_tokens_shard_data", ts, i);
    return s ? s->tok : NULL;
}

int ct_llmc_tokens_set_vocab(ct_llmc_tokens *ts, int64_t vocab) {
    static const char fn[] = "llmc_tokens_set_vocab";
    if (check_tokens(fn, ts))
        return ct_errcode();
    if (vocab < 1 || vocab > NO_VOCAB)
        return ct__err_set(CT_EINVAL, "%s: vocab %lld is outside [1, %d] (shard tokens are uint16)",
                           fn, (long long)vocab, NO_VOCAB);
    ts->vocab = (int)vocab;
    return 0;
}

static int bad_token(const char *fn, const shard *s, int64_t i, int64_t vocab) {
    return ct__err_set(CT_ERANGE,
                       "%s: %s: token %d at index %lld (offset %lld of the sequence) is not below "
                       "the vocab size %lld: was the shard made with another tokenizer?",
                       fn, s->path, s->tok[i], (long long)i, (long long)(s->start + i),
                       (long long)vocab);
}

int ct_llmc_tokens_max_id(const ct_llmc_tokens *ts, int *max_id, int *shard_out, int64_t *index) {
    static const char fn[] = "llmc_tokens_max_id";
    if (check_tokens(fn, ts))
        return ct_errcode();
    if (!max_id)
        return ct__err_set(CT_EINVAL, "%s: max_id is NULL", fn);
    int best = -1, where = 0;
    int64_t at = 0;
    for (int k = 0; k < ts->n; k++) {
        const uint16_t *t = ts->s[k].tok;
        uint16_t m = 0;
        for (int64_t i = 0; i < ts->s[k].n; i++)
            m = t[i] > m ? t[i] : m;
        if (m > best) {
            int64_t i = 0;
            while (t[i] != m)
                i++;
            best = m, where = k, at = i;
        }
    }
    *max_id = best;
    if (shard_out)
        *shard_out = where;
    if (index)
        *index = at;
    return 0;
}

int ct_llmc_tokens_check_vocab(const ct_llmc_tokens *ts, int64_t vocab) {
    static const char fn[] = "llmc_tokens_check_vocab";
    if (check_tokens(fn, ts))
        return ct_errcode();
    if (vocab < 1)
        return ct__err_set(CT_EINVAL, "%s: vocab %lld is < 1", fn, (long long)vocab);
    for (int k = 0; k < ts->n; k++) {
        const uint16_t *t = ts->s[k].tok;
        uint16_t m = 0;
        for (int64_t i = 0; i < ts->s[k].n; i++)
            m = t[i] > m ? t[i] : m;
        if (m < vocab)
            continue;
        for (int64_t i = 0;; i++)
            if (t[i] >= vocab)
                return bad_token(fn, &ts->s[k], i, vocab);
    }
    return 0;
}

/* The shard that holds flat offset off (< total). */
static int locate(const ct_llmc_tokens *ts, int64_t off) {
    int lo = 0, hi = ts->n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (ts->s[mid].start <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Copies tokens [start, start + n) (inside the sequence) to dst, checking
 * each against the vocab. */
static int copy_tokens(const char *fn, const ct_llmc_tokens *ts, int64_t start, int64_t n,
                       int64_t *dst) {
    int k = n > 0 ? locate(ts, start) : 0;
    const int vocab = ts->vocab;
    while (n > 0) {
        const shard *s = &ts->s[k];
        int64_t i = start - s->start, m = s->n - i < n ? s->n - i : n;
        const uint16_t *t = s->tok + i;
        uint16_t hi = 0;
        for (int64_t j = 0; j < m; j++) {
            dst[j] = t[j];
            hi = t[j] > hi ? t[j] : hi;
        }
        if (hi >= vocab)
            for (int64_t j = 0;; j++)
                if (t[j] >= vocab)
                    return bad_token(fn, s, i + j, vocab);
        dst += m, start += m, n -= m, k++;
    }
    return 0;
}

int ct_llmc_tokens_read(const ct_llmc_tokens *ts, int64_t start, int64_t n, int64_t *dst) {
    static const char fn[] = "llmc_tokens_read";
    if (check_tokens(fn, ts))
        return ct_errcode();
    if (!dst || n < 0)
        return ct__err_set(CT_EINVAL, "%s: %s", fn, dst ? "n < 0" : "dst is NULL");
    if (start < 0 || start > ts->total || n > ts->total - start)
        return ct__err_set(CT_ERANGE, "%s: tokens [%lld, %lld + %lld) are outside [0, %lld)", fn,
                           (long long)start, (long long)start, (long long)n, (long long)ts->total);
    return copy_tokens(fn, ts, start, n, dst);
}

/* x [rows, T] and y [rows, T] for windows at flat offsets off(r). */
typedef int64_t (*offset_fn)(const void *ctx, int64_t r);

static int make_windows(const char *fn, const ct_llmc_tokens *ts, offset_fn off, const void *ctx,
                        int64_t rows, int64_t T, ct_tensor **x, ct_tensor **y) {
    *x = *y = NULL;
    ct_tensor *tx = NULL, *ty = NULL;
    int rc = 0;
    ct_scope_begin();
    tx = ct_empty(CT_SHAPE(rows, T), CT_INT64);
    ty = tx ? ct_empty(CT_SHAPE(rows, T), CT_INT64) : NULL;
    if (!ty)
        rc = ct__err_set(ct_errcode(), "%s: %s", fn, ct_errmsg());
    int64_t *px = rc ? NULL : ct_data_ptr(tx), *py = rc ? NULL : ct_data_ptr(ty);
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        int64_t s = off(ctx, r);
        /* y's row is x's moved left by one, and one token more. */
        rc = copy_tokens(fn, ts, s, T, px + r * T);
        if (rc == 0) {
            memcpy(py + r * T, px + r * T + 1, (size_t)(T - 1) * sizeof(int64_t));
            rc = copy_tokens(fn, ts, s + T, 1, py + r * T + T - 1);
        }
    }
    if (rc == 0) {
        *x = ct_keep(tx);
        *y = ct_keep(ty);
    }
    ct_scope_end();
    return rc;
}

typedef struct starts_ctx {
    const int64_t *starts;
} starts_ctx;

static int64_t start_of(const void *ctx, int64_t r) { return ((const starts_ctx *)ctx)->starts[r]; }

int ct_llmc_tokens_windows(const ct_llmc_tokens *ts, const int64_t *starts, int64_t rows, int64_t T,
                           ct_tensor **x, ct_tensor **y) {
    static const char fn[] = "llmc_tokens_windows";
    if (x)
        *x = NULL;
    if (y)
        *y = NULL;
    if (check_tokens(fn, ts))
        return ct_errcode();
    if (!starts || !x || !y)
        return ct__err_set(CT_EINVAL, "%s: %s is NULL", fn, !starts ? "starts" : !x ? "x" : "y");
    if (rows < 1 || T < 1)
        return ct__err_set(CT_EINVAL, "%s: expected rows >= 1 and T >= 1, got %lld and %lld", fn,
                           (long long)rows, (long long)T);
    if (T >= ts->total)
        return ct__err_set(CT_ERANGE,
                           "%s: a window of T = %lld needs %lld tokens; the shards hold %lld", fn,
                           (long long)T, (long long)T + 1, (long long)ts->total);
    int64_t last = ts->total - T - 1;
    for (int64_t r = 0; r < rows; r++)
        if (starts[r] < 0 || starts[r] > last)
            return ct__err_set(CT_ERANGE,
                               "%s: row %lld starts at %lld, outside [0, %lld] (count %lld - T "
                               "%lld - 1)",
                               fn, (long long)r, (long long)starts[r], (long long)last,
                               (long long)ts->total, (long long)T);
    return make_windows(fn, ts, start_of, &(starts_ctx){starts}, rows, T, x, y);
}

/* ------------------------------------------------------- streaming loader */

struct ct_llmc_loader {
    uint32_t magic;
    const ct_llmc_tokens *ts;
    int64_t B, T, global; /* global = num_ranks * B * T tokens per global batch */
    int rank, ranks;
    int64_t *batches; /* per shard */
    ct_llmc_position pos;
};

static bool loader_ok(const ct_llmc_loader *l) { return l && l->magic == LOADER_LIVE; }

static int check_loader(const char *fn, const ct_llmc_loader *l) {
    return loader_ok(l) ? 0
                        : ct__err_set(CT_EINVAL, "%s: the loader is %s", fn,
                                      l ? "not a live ct_llmc_loader" : "NULL");
}

ct_llmc_loader *ct_llmc_loader_new(const ct_llmc_tokens *ts, const ct_llmc_loader_options *o) {
    static const char fn[] = "llmc_loader_new";
    if (check_tokens(fn, ts))
        return NULL;
    if (!o) {
        ct__err_set(CT_EINVAL, "%s: opts is NULL", fn);
        return NULL;
    }
    int ranks = o->num_ranks == 0 ? 1 : o->num_ranks;
    if (o->batch < 1 || o->context < 1 || ranks < 0 || o->rank < 0 || o->rank >= ranks) {
        ct__err_set(CT_EINVAL,
                    "%s: expected batch >= 1, context >= 1 and rank in [0, num_ranks), got batch "
                    "%lld, context %lld, rank %d, num_ranks %d",
                    fn, (long long)o->batch, (long long)o->context, o->rank, o->num_ranks);
        return NULL;
    }
    int64_t bt, global;
    if (__builtin_mul_overflow(o->batch, o->context, &bt) ||
        __builtin_mul_overflow(bt, (int64_t)ranks, &global) || global == INT64_MAX) {
        ct__err_set(CT_ERANGE, "%s: %d ranks x batch %lld x context %lld overflows int64", fn,
                    ranks, (long long)o->batch, (long long)o->context);
        return NULL;
    }
    ct_llmc_loader *l = calloc(1, sizeof *l);
    int64_t *nb = l ? calloc((size_t)ts->n, sizeof *nb) : NULL;
    if (!nb) {
        free(l);
        ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
        return NULL;
    }
    int64_t any = 0, longest = 0;
    for (int i = 0; i < ts->n; i++) {
        /* llm.c's shard_num_samples: the last target must lie in the
         * shard. */
        nb[i] = (ts->s[i].n - 1) / global;
        any += nb[i] > 0;
        longest = ts->s[i].n > ts->s[longest].n ? i : longest;
    }
    if (!any) {
        ct__err_set(CT_ERANGE,
                    "%s: no shard holds one global batch of %d ranks x %lld x %lld tokens + 1 "
                    "(%lld); the longest, %s, holds %lld",
                    fn, ranks, (long long)o->batch, (long long)o->context, (long long)global + 1,
                    ts->s[longest].path, (long long)ts->s[longest].n);
        free(nb);
        free(l);
        return NULL;
    }
    *l = (ct_llmc_loader){.magic = LOADER_LIVE,
                          .ts = ts,
                          .B = o->batch,
                          .T = o->context,
                          .global = global,
                          .rank = o->rank,
                          .ranks = ranks,
                          .batches = nb};
    return l;
}

void ct_llmc_loader_free(ct_llmc_loader *l) {
    if (!loader_ok(l))
        return;
    free(l->batches);
    l->magic = 0;
    free(l);
}

int64_t ct_llmc_loader_shard_batches(const ct_llmc_loader *l, int i) {
    static const char fn[] = "llmc_loader_shard_batches";
    if (check_loader(fn, l))
        return -1;
    if (i < 0 || i >= l->ts->n) {
        ct__err_set(CT_ERANGE, "%s: shard %d is outside [0, %d)", fn, i, l->ts->n);
        return -1;
    }
    return l->batches[i];
}

int ct_llmc_loader_position(const ct_llmc_loader *l, ct_llmc_position *pos) {
    static const char fn[] = "llmc_loader_position";
    if (check_loader(fn, l))
        return ct_errcode();
    if (!pos)
        return ct__err_set(CT_EINVAL, "%s: pos is NULL", fn);
    *pos = l->pos;
    return 0;
}

int ct_llmc_loader_set_position(ct_llmc_loader *l, const ct_llmc_position *pos) {
    static const char fn[] = "llmc_loader_set_position";
    if (check_loader(fn, l))
        return ct_errcode();
    if (!pos)
        return ct__err_set(CT_EINVAL, "%s: pos is NULL", fn);
    if (pos->epoch < 0 || pos->shard < 0 || pos->shard >= l->ts->n)
        return ct__err_set(CT_ERANGE,
                           "%s: position (epoch %lld, shard %lld) needs epoch >= 0 and shard in "
                           "[0, %d)",
                           fn, (long long)pos->epoch, (long long)pos->shard, l->ts->n);
    int64_t nb = l->batches[pos->shard];
    if (pos->batch < 0 || pos->batch > nb)
        return ct__err_set(CT_ERANGE,
                           "%s: batch %lld is outside [0, %lld], the batches of shard %lld (%s) "
                           "at this batch size and rank count",
                           fn, (long long)pos->batch, (long long)nb, (long long)pos->shard,
                           l->ts->s[pos->shard].path);
    l->pos = *pos;
    return 0;
}

typedef struct batch_ctx {
    int64_t base, T; /* row r starts at base + r T */
} batch_ctx;

static int64_t row_start(const void *ctx, int64_t r) {
    const batch_ctx *c = ctx;
    return c->base + r * c->T;
}

int ct_llmc_loader_next(ct_llmc_loader *l, ct_tensor **x, ct_tensor **y) {
    static const char fn[] = "llmc_loader_next";
    if (x)
        *x = NULL;
    if (y)
        *y = NULL;
    if (check_loader(fn, l))
        return ct_errcode();
    if (!x || !y)
        return ct__err_set(CT_EINVAL, "%s: %s is NULL", fn, !x ? "x" : "y");
    /* Past the end of a shard, on to the next one that holds a batch;
     * loader_new made sure that one does. */
    ct_llmc_position p = l->pos;
    while (p.batch >= l->batches[p.shard]) {
        p.batch = 0;
        if (++p.shard == l->ts->n) {
            p.shard = 0;
            p.epoch++;
        }
    }
    /* Rank r's rows are consecutive: row i of [B, T] starts i T tokens
     * after the rank's part, and its targets run one token on, to the first
     * token of the next rank's part (or of the next batch). */
    const shard *s = &l->ts->s[p.shard];
    batch_ctx c = {s->start + p.batch * l->global + (int64_t)l->rank * l->B * l->T, l->T};
    int rc = make_windows(fn, l->ts, row_start, &c, l->B, l->T, x, y);
    if (rc == 0) {
        p.batch++;
        l->pos = p;
    }
    return rc;
}

/* -------------------------------------------------------- GPT-2 checkpoint */

/* llm.c's parameter tensors in file order (train_gpt2.c's
 * fill_in_parameter_sizes, train_gpt2.py's write_tensors), with the ct_gpt
 * parameter each maps to; per-layer ones are stored as L consecutive
 * slices, layer 0 first. Both sides store a linear layer's weight as
 * [out, in]. */
enum { D_VP, D_MAXT, D_C, D_3C, D_4C, D_NONE };

static const struct {
    const char *llmc; /* llm.c's field, for messages */
    const char *name; /* ct's, after "transformer.h.<l>." when per_layer */
    bool per_layer;
    int rows, cols; /* D_NONE cols: a vector */
} params[] = {
    {"wte", "transformer.wte.weight", false, D_VP, D_C},
    {"wpe", "transformer.wpe.weight", false, D_MAXT, D_C},
    {"ln1w", "ln_1.weight", true, D_C, D_NONE},
    {"ln1b", "ln_1.bias", true, D_C, D_NONE},
    {"qkvw", "attn.c_attn.weight", true, D_3C, D_C},
    {"qkvb", "attn.c_attn.bias", true, D_3C, D_NONE},
    {"attprojw", "attn.c_proj.weight", true, D_C, D_C},
    {"attprojb", "attn.c_proj.bias", true, D_C, D_NONE},
    {"ln2w", "ln_2.weight", true, D_C, D_NONE},
    {"ln2b", "ln_2.bias", true, D_C, D_NONE},
    {"fcw", "mlp.c_fc.weight", true, D_4C, D_C},
    {"fcb", "mlp.c_fc.bias", true, D_4C, D_NONE},
    {"fcprojw", "mlp.c_proj.weight", true, D_C, D_4C},
    {"fcprojb", "mlp.c_proj.bias", true, D_C, D_NONE},
    {"lnfw", "transformer.ln_f.weight", false, D_C, D_NONE},
    {"lnfb", "transformer.ln_f.bias", false, D_C, D_NONE},
};
#define N_PARAMS ((int)(sizeof params / sizeof *params))

typedef struct model_header {
    int version;
    int64_t maxT, V, L, NH, C, Vp;
    int64_t numel;  /* elements after the header */
    size_t esize;   /* bytes per element */
    int64_t bytes;  /* the whole file */
    char desc[160]; /* "maxT 1024, V 50257 (Vp 50304), L 12, NH 12, C 768" */
} model_header;

static int64_t dim_of(const model_header *h, int d) {
    switch (d) {
    case D_VP: return h->Vp;
    case D_MAXT: return h->maxT;
    case D_C: return h->C;
    case D_3C: return 3 * h->C;
    case D_4C: return 4 * h->C;
    default: return 1;
    }
}

/* Elements of one slice (one layer's, or the whole tensor) of params[i]. */
static int64_t slice_numel(const model_header *h, int i) {
    return dim_of(h, params[i].rows) * dim_of(h, params[i].cols);
}

static void describe(model_header *h) {
    snprintf(h->desc, sizeof h->desc, "maxT %lld, V %lld (Vp %lld), L %lld, NH %lld, C %lld",
             (long long)h->maxT, (long long)h->V, (long long)h->Vp, (long long)h->L,
             (long long)h->NH, (long long)h->C);
}

/* Checks the header's fields and sizes the body, with checked arithmetic
 * throughout (the limits keep it far from overflow, but the limits may
 * change). */
static int parse_model_header(const int32_t *w, int64_t size, model_header *h, const char *fn,
                              const char *path) {
    if (w[0] != CT_LLMC_GPT_MAGIC)
        return ct__err_set(CT_ECORRUPT,
                           "%s: %s: magic %d is not llm.c's GPT-2 checkpoint magic %d%s", fn, path,
                           w[0], CT_LLMC_GPT_MAGIC, magic_owner(w[0]));
    if (w[1] != CT_LLMC_GPT_FLOAT32 && w[1] != CT_LLMC_GPT_BFLOAT16)
        return ct__err_set(CT_EVERSION,
                           "%s: %s: checkpoint version %d; this reader knows 3 (float32) and 5 "
                           "(bfloat16), both with a padded vocab (re-export with llm.c's "
                           "train_gpt2.py)",
                           fn, path, w[1]);
    *h = (model_header){.version = w[1],
                        .maxT = w[2],
                        .V = w[3],
                        .L = w[4],
                        .NH = w[5],
                        .C = w[6],
                        .Vp = w[7],
                        .esize = w[1] == CT_LLMC_GPT_FLOAT32 ? 4 : 2};
    describe(h);
    const struct {
        const char *name;
        int64_t v, max;
    } f[] = {{"maxT (header[2])", h->maxT, CT_LLMC_GPT_MAX_CONTEXT},
             {"V (header[3])", h->V, CT_LLMC_GPT_MAX_VOCAB},
             {"L (header[4])", h->L, CT_LLMC_GPT_MAX_LAYERS},
             {"NH (header[5])", h->NH, CT_LLMC_GPT_MAX_WIDTH},
             {"C (header[6])", h->C, CT_LLMC_GPT_MAX_WIDTH},
             {"Vp (header[7])", h->Vp, CT_LLMC_GPT_MAX_VOCAB}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (f[i].v < 1 || f[i].v > f[i].max)
            return ct__err_set(CT_ECORRUPT, "%s: %s: %s is %lld, outside [1, %lld] (%s)", fn, path,
                               f[i].name, (long long)f[i].v, (long long)f[i].max, h->desc);
    if (h->C % h->NH != 0)
        return ct__err_set(CT_ECORRUPT, "%s: %s: C %lld is not divisible by NH %lld (%s)", fn, path,
                           (long long)h->C, (long long)h->NH, h->desc);
    if (h->Vp < h->V)
        return ct__err_set(CT_ECORRUPT,
                           "%s: %s: the padded vocab Vp %lld is below the vocab V %lld (%s)", fn,
                           path, (long long)h->Vp, (long long)h->V, h->desc);
    bool over = false;
    int64_t n = 0, t;
    for (int i = 0; i < N_PARAMS; i++) {
        int64_t r = dim_of(h, params[i].rows), c = dim_of(h, params[i].cols);
        over |= __builtin_mul_overflow(r, c, &t);
        if (params[i].per_layer)
            over |= __builtin_mul_overflow(t, h->L, &t);
        over |= __builtin_add_overflow(n, t, &n);
    }
    h->numel = n;
    over |= __builtin_mul_overflow(n, (int64_t)h->esize, &t);
    over |= __builtin_add_overflow(t, (int64_t)HEADER_BYTES, &h->bytes);
    if (over)
        return ct__err_set(CT_ECORRUPT, "%s: %s: the header's sizes (%s) overflow 2^63 bytes", fn,
                           path, h->desc);
    char what[220];
    snprintf(what, sizeof what, "a version %d checkpoint of %lld parameters (%s)", h->version,
             (long long)n, h->desc);
    return check_length(size, h->bytes, fn, path, what);
}

/* Opens path and checks its header; returns the fd (to read the body
 * from) or a negative code. */
static int open_model(const char *fn, const char *path, model_header *h) {
    int64_t size;
    int32_t w[HEADER_WORDS];
    int fd = open_with_header(fn, path, "an llm.c GPT-2 checkpoint", w, &size);
    if (fd < 0)
        return fd;
    int rc = parse_model_header(w, size, h, fn, path);
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}

int ct_llmc_gpt_read_config(const char *path, ct_gpt_config *cfg, ct_llmc_gpt_info *info) {
    static const char fn[] = "llmc_gpt_read_config";
    if (!path || !cfg)
        return ct__err_set(CT_EINVAL, "%s: %s is NULL", fn, !path ? "path" : "cfg");
    model_header h;
    int fd = open_model(fn, path, &h);
    if (fd < 0)
        return fd;
    close(fd);
    *cfg = (ct_gpt_config){
        .vocab = h.V, .context = h.maxT, .layers = h.L, .heads = h.NH, .width = h.C};
    if (info)
        *info =
            (ct_llmc_gpt_info){.version = h.version, .padded_vocab = h.Vp, .num_params = h.numel};
    return 0;
}

/* ct's name of params[i] for layer l. */
static void param_name(char *buf, size_t cap, int i, int64_t l) {
    if (params[i].per_layer)
        snprintf(buf, cap, "transformer.h.%lld.%s", (long long)l, params[i].name);
    else
        snprintf(buf, cap, "%s", params[i].name);
}

/* The shape ct's parameter has: wte without the padding rows. */
static int param_shape(const model_header *h, int i, int64_t *sizes) {
    sizes[0] = params[i].rows == D_VP ? h->V : dim_of(h, params[i].rows);
    sizes[1] = dim_of(h, params[i].cols);
    return params[i].cols == D_NONE ? 1 : 2;
}

/* The model's parameters in file order (L * 12 + 4 of them, each borrowed
 * from pl), after checking that gpt is a GPT of h's sizes. The GPT module
 * keeps its ct_gpt_config as its state (nn/gpt.c): the head count, which
 * no parameter's shape shows, is read from there. */
static int match_gpt(const char *fn, const char *path, ct_module *gpt, const model_header *h,
                     ct_param_list *pl, ct_tensor **out) {
    if (!gpt || strcmp(ct_module_type(gpt), "GPT") != 0)
        return ct__err_set(CT_EINVAL, "%s: %s: the module is %s, not a GPT from ct_gpt_new", fn,
                           path, gpt ? ct_module_type(gpt) : "NULL");
    const ct_gpt_config *c = ct_module_state(gpt);
    if (c->vocab != h->V || c->context != h->maxT || c->layers != h->L || c->heads != h->NH ||
        c->width != h->C)
        return ct__err_set(CT_ESHAPE,
                           "%s: %s: the file's model is %s; the GPT has vocab %lld, context %lld, "
                           "layers %lld, heads %lld, width %lld",
                           fn, path, h->desc, (long long)c->vocab, (long long)c->context,
                           (long long)c->layers, (long long)c->heads, (long long)c->width);
    int rc = ct_module_named_parameters(gpt, pl);
    if (rc)
        return rc;
    if (pl->n != 12 * h->L + 4)
        return ct__err_set(CT_ESHAPE,
                           "%s: %s: the GPT has %d parameters; a GPT-2 of %lld layers "
                           "has %lld",
                           fn, path, pl->n, (long long)h->L, (long long)(12 * h->L + 4));
    int k = 0;
    for (int i = 0; i < N_PARAMS; i++)
        for (int64_t l = 0; l < (params[i].per_layer ? h->L : 1); l++) {
            char name[96];
            param_name(name, sizeof name, i, l);
            ct_tensor *t = ct_param_list_find(pl, name);
            int64_t sizes[2];
            int nd = param_shape(h, i, sizes);
            char want[CT__SHAPE_STR], got[CT__DESC_STR];
            if (!t)
                return ct__err_set(CT_ESHAPE, "%s: %s: the GPT has no parameter '%s' (llm.c's %s)",
                                   fn, path, name, params[i].llmc);
            if (ct_ndim(t) != nd || ct_size(t, 0) != sizes[0] ||
                (nd == 2 && ct_size(t, 1) != sizes[1]))
                return ct__err_set(CT_ESHAPE, "%s: %s: the GPT's '%s' is %s; llm.c's %s needs %s",
                                   fn, path, name, ct__tensor_desc(got, t), params[i].llmc,
                                   ct__tensor_shape_str(want, nd, sizes));
            if (!ct_dtype_is_float(ct_tensor_dtype(t)))
                return ct__err_set(CT_EINVAL, "%s: %s: the GPT's '%s' is %s, not floating point",
                                   fn, path, name, ct__tensor_desc(got, t));
            out[k++] = t;
        }
    return 0;
}

int ct_llmc_gpt_load_into(ct_module *gpt, const char *path) {
    static const char fn[] = "llmc_gpt_load_into";
    if (!path)
        return ct__err_set(CT_EINVAL, "%s: path is NULL", fn);
    if (!gpt)
        return ct__err_set(CT_EINVAL, "%s: %s: the module is NULL", fn, path);
    model_header h;
    int fd = open_model(fn, path, &h);
    if (fd < 0)
        return fd;
    ct_param_list pl;
    ct_param_list_init(&pl);
    int np = (int)(12 * h.L + 4);
    ct_tensor **dst = malloc((size_t)np * sizeof *dst), **src = calloc((size_t)np, sizeof *src);
    int rc = dst && src ? match_gpt(fn, path, gpt, &h, &pl, dst)
                        : ct__err_set(CT_ENOMEM, "%s: %s: out of memory", fn, path);
    ct_dtype file_dtype = h.esize == 4 ? CT_FLOAT32 : CT_BFLOAT16;
    ct_scope_begin();
    /* Everything is read, in file order, before any parameter changes. */
    int64_t off = HEADER_BYTES;
    for (int i = 0, k = 0; i < N_PARAMS && rc == 0; i++) {
        int64_t slice = slice_numel(&h, i);
        for (int64_t l = 0; l < (params[i].per_layer ? h.L : 1) && rc == 0; l++, k++) {
            int64_t sizes[2];
            int nd = param_shape(&h, i, sizes);
            src[k] = ct_empty(nd, sizes, file_dtype);
            if (!src[k])
                rc = ct__err_set(ct_errcode(), "%s: %s: %s: %s", fn, path, params[i].llmc,
                                 ct_errmsg());
            else
                rc = pread_all(fd, ct_data_ptr(src[k]), (size_t)ct_numel(src[k]) * h.esize, off, fn,
                               path);
            /* wte's padding rows (Vp - V) are skipped. */
            off += slice * (int64_t)h.esize;
        }
    }
    if (rc == 0) {
        bool prev = ct_set_grad_enabled(false);
        for (int i = 0, k = 0; i < N_PARAMS && rc == 0; i++)
            for (int64_t l = 0; l < (params[i].per_layer ? h.L : 1) && rc == 0; l++, k++)
                if (!ct_copy_(dst[k], src[k])) {
                    char name[96];
                    param_name(name, sizeof name, i, l);
                    rc = ct__err_set(ct_errcode(), "%s: %s: copying into '%s': %s", fn, path, name,
                                     ct_errmsg());
                }
        ct_set_grad_enabled(prev);
    }
    ct_scope_end();
    free(src);
    free(dst);
    ct_param_list_free(&pl);
    close(fd);
    return rc;
}

ct_module *ct_llmc_gpt_load(const char *path, const ct_gpt_config *opts) {
    ct_gpt_config cfg;
    if (ct_llmc_gpt_read_config(path, &cfg, NULL))
        return NULL;
    if (opts) {
        cfg.dropout = opts->dropout;
        cfg.checkpoint = opts->checkpoint;
    }
    ct_module *gpt = ct_gpt_new(&cfg);
    if (gpt && ct_llmc_gpt_load_into(gpt, path)) {
        ct_module_free(gpt);
        return NULL;
    }
    return gpt;
}

/* Writes t (any device, dtype, layout) as dtype elements at *off. */
static int put_tensor(int fd, ct_tensor *t, ct_dtype dtype, int64_t *off, const char *fn,
                      const char *tmp) {
    ct_scope_begin();
    ct_tensor *c = ct_contiguous(ct_to_dtype(ct_to(t, CT_DEVICE_CPU), dtype));
    int rc = c ? 0 : ct__err_set(ct_errcode(), "%s: %s: %s", fn, tmp, ct_errmsg());
    size_t n = c ? (size_t)ct_numel(c) * ct_dtype_size(dtype) : 0;
    if (rc == 0)
        rc = pwrite_all(fd, ct_data_ptr(c), n, *off, fn, tmp);
    *off += (int64_t)n;
    ct_scope_end();
    return rc;
}

static int write_model(int fd, const char *fn, const char *tmp, const model_header *h,
                       ct_tensor *const *src) {
    int32_t w[HEADER_WORDS] = {CT_LLMC_GPT_MAGIC, h->version,     (int32_t)h->maxT, (int32_t)h->V,
                               (int32_t)h->L,     (int32_t)h->NH, (int32_t)h->C,    (int32_t)h->Vp};
    int rc = pwrite_all(fd, w, sizeof w, 0, fn, tmp);
    int64_t off = HEADER_BYTES;
    ct_dtype dtype = h->version == CT_LLMC_GPT_FLOAT32 ? CT_FLOAT32 : CT_BFLOAT16;
    for (int i = 0, k = 0; i < N_PARAMS && rc == 0; i++)
        for (int64_t l = 0; l < (params[i].per_layer ? h->L : 1) && rc == 0; l++, k++) {
            rc = put_tensor(fd, src[k], dtype, &off, fn, tmp);
            if (rc == 0 && params[i].rows == D_VP && h->Vp > h->V) {
                /* llm.c's pad_vocab: zero rows up to Vp. */
                size_t pad = (size_t)((h->Vp - h->V) * h->C) * h->esize;
                void *zeros = calloc(1, pad);
                rc = zeros ? pwrite_all(fd, zeros, pad, off, fn, tmp)
                           : ct__err_set(CT_ENOMEM, "%s: %s: out of memory", fn, tmp);
                off += (int64_t)pad;
                free(zeros);
            }
        }
    return rc;
}

int ct_llmc_gpt_save_as(const ct_module *gpt_in, const char *path, int version) {
    static const char fn[] = "llmc_gpt_save";
    if (!path || !path[0])
        return ct__err_set(CT_EINVAL, "%s: path is %s", fn, path ? "empty" : "NULL");
    if (version != CT_LLMC_GPT_FLOAT32 && version != CT_LLMC_GPT_BFLOAT16)
        return ct__err_set(CT_EVERSION,
                           "%s: %s: version %d; llm.c's are 3 (float32) and 5 "
                           "(bfloat16)",
                           fn, path, version);
    /* Listing parameters does not change the module. */
    ct_module *gpt = (ct_module *)gpt_in;
    if (!gpt || strcmp(ct_module_type(gpt), "GPT") != 0)
        return ct__err_set(CT_EINVAL, "%s: %s: the module is %s, not a GPT from ct_gpt_new", fn,
                           path, gpt ? ct_module_type(gpt) : "NULL");
    const ct_gpt_config *c = ct_module_state(gpt);
    if (c->vocab > CT_LLMC_GPT_MAX_VOCAB - 127 || c->context > CT_LLMC_GPT_MAX_CONTEXT ||
        c->layers < 1 || c->layers > CT_LLMC_GPT_MAX_LAYERS || c->width > CT_LLMC_GPT_MAX_WIDTH)
        return ct__err_set(CT_EINVAL,
                           "%s: %s: a GPT of vocab %lld, context %lld, layers %lld, width %lld is "
                           "outside what an llm.c checkpoint holds (layers >= 1; docs/llmc.md)",
                           fn, path, (long long)c->vocab, (long long)c->context,
                           (long long)c->layers, (long long)c->width);
    model_header h = {.version = version,
                      .maxT = c->context,
                      .V = c->vocab,
                      .L = c->layers,
                      .NH = c->heads,
                      .C = c->width,
                      .Vp = (c->vocab + 127) / 128 * 128,
                      .esize = version == CT_LLMC_GPT_FLOAT32 ? 4 : 2};
    describe(&h);
    ct_param_list pl;
    ct_param_list_init(&pl);
    int np = (int)(12 * h.L + 4);
    ct_tensor **src = malloc((size_t)np * sizeof *src);
    int rc = src ? match_gpt(fn, path, gpt, &h, &pl, src)
                 : ct__err_set(CT_ENOMEM, "%s: %s: out of memory", fn, path);
    size_t plen = strlen(path);
    char *tmp = rc ? NULL : malloc(plen + sizeof ".tmp.XXXXXX");
    if (rc == 0 && !tmp)
        rc = ct__err_set(CT_ENOMEM, "%s: %s: out of memory", fn, path);
    if (rc == 0) {
        memcpy(tmp, path, plen);
        memcpy(tmp + plen, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
        /* A fresh name (O_EXCL): no existing file or link is written
         * through. */
        int fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
            rc = ct__err_set(CT_EIO, "%s: cannot create %s: %s", fn, tmp, strerror(errno));
        } else {
            rc = write_model(fd, fn, tmp, &h, src);
            if (rc == 0 && fchmod(fd, 0644) != 0)
                rc = ct__err_set(CT_EIO, "%s: %s: chmod: %s", fn, tmp, strerror(errno));
            rc = ct__file_commit(AT_FDCWD, fd, tmp, path, rc, fn);
        }
    }
    free(tmp);
    free(src);
    ct_param_list_free(&pl);
    return rc;
}

int ct_llmc_gpt_save(const ct_module *gpt, const char *path) {
    return ct_llmc_gpt_save_as(gpt, path, CT_LLMC_GPT_FLOAT32);
}

/* --------------------------------------------------------------- tokenizer */

#define TOKENIZER_MAX_VOCAB (1 << 24)

struct ct_llmc_tokenizer {
    uint32_t magic;
    int64_t vocab, eot;
    int64_t *start; /* token i's bytes are text[start[i], start[i + 1] - 1) */
    char *text;     /* each token's bytes and a NUL */
};

void ct_llmc_tokenizer_free(ct_llmc_tokenizer *tok) {
    if (!tok || tok->magic != TOKENIZER_LIVE)
        return;
    free(tok->start);
    free(tok->text);
    tok->magic = 0;
    free(tok);
}

/* Splits the body (after the header) into tokens, checking lengths. */
static int parse_tokens(ct_llmc_tokenizer *t, const unsigned char *body, int64_t n, const char *fn,
                        const char *path) {
    int64_t at = 0, out = 0;
    for (int64_t i = 0; i < t->vocab; i++) {
        if (at >= n)
            return ct__err_set(CT_ECORRUPT,
                               "%s: %s: the file ends after token %lld of the header's %lld", fn,
                               path, (long long)i, (long long)t->vocab);
        int len = body[at];
        if (len == 0)
            return ct__err_set(CT_ECORRUPT,
                               "%s: %s: token %lld has length 0 (byte %lld); every token has at "
                               "least one byte",
                               fn, path, (long long)i, (long long)(HEADER_BYTES + at));
        if (len > n - at - 1)
            return ct__err_set(CT_ECORRUPT,
                               "%s: %s: token %lld's %d bytes run past the end of the file", fn,
                               path, (long long)i, len);
        t->start[i] = out;
        memcpy(t->text + out, body + at + 1, (size_t)len);
        t->text[out + len] = '\0';
        out += len + 1;
        at += 1 + len;
    }
    t->start[t->vocab] = out;
    if (at != n)
        return ct__err_set(CT_ECORRUPT,
                           "%s: %s: %lld bytes follow the last of the header's %lld tokens "
                           "(trailing bytes are refused: the header or the file is wrong)",
                           fn, path, (long long)(n - at), (long long)t->vocab);
    return 0;
}

ct_llmc_tokenizer *ct_llmc_tokenizer_load(const char *path) {
    static const char fn[] = "llmc_tokenizer_load";
    if (!path) {
        ct__err_set(CT_EINVAL, "%s: path is NULL", fn);
        return NULL;
    }
    int64_t size;
    int32_t w[HEADER_WORDS];
    int fd = open_with_header(fn, path, "an llm.c tokenizer", w, &size);
    if (fd < 0)
        return NULL;
    int rc = 0;
    uint32_t version = (uint32_t)w[1], vocab = (uint32_t)w[2];
    if (w[0] != CT_LLMC_TOKENIZER_MAGIC)
        rc = ct__err_set(CT_ECORRUPT, "%s: %s: magic %d is not llm.c's tokenizer magic %d%s", fn,
                         path, w[0], CT_LLMC_TOKENIZER_MAGIC, magic_owner(w[0]));
    if (rc == 0 && version != 1 && version != 2)
        rc = ct__err_set(CT_EVERSION, "%s: %s: tokenizer version %u; this reader knows 1 and 2", fn,
                         path, version);
    if (rc == 0 && (vocab < 1 || vocab > TOKENIZER_MAX_VOCAB))
        rc = ct__err_set(CT_ECORRUPT, "%s: %s: vocab %u (header[2]) is outside [1, %d]", fn, path,
                         vocab, TOKENIZER_MAX_VOCAB);
    /* Version 1 has no eot field; llm.c takes GPT-2's 50256 and insists on
     * GPT-2's vocab. */
    int64_t eot = version == 2 ? (int64_t)(uint32_t)w[3] : 50256;
    if (rc == 0 && version == 1 && vocab != 50257)
        rc = ct__err_set(CT_ECORRUPT,
                         "%s: %s: a version 1 tokenizer is GPT-2's, of 50257 tokens; this one "
                         "says %u",
                         fn, path, vocab);
    if (rc == 0 && eot >= vocab)
        rc = ct__err_set(CT_ECORRUPT,
                         "%s: %s: the <|endoftext|> id %lld (header[3]) is not below "
                         "the vocab %u",
                         fn, path, (long long)eot, vocab);
    /* Each token takes 2 to 256 bytes: the length bounds the vocab. */
    int64_t body = size - HEADER_BYTES;
    if (rc == 0 && (body < 2 * (int64_t)vocab || body > 256 * (int64_t)vocab))
        rc = ct__err_set(CT_ECORRUPT,
                         "%s: %s: %lld bytes after the header cannot hold %u tokens of 1 to 255 "
                         "bytes each (%lld to %lld bytes)",
                         fn, path, (long long)body, vocab, 2 * (long long)vocab,
                         256 * (long long)vocab);
    ct_llmc_tokenizer *t = NULL;
    unsigned char *buf = NULL;
    if (rc == 0) {
        t = calloc(1, sizeof *t);
        buf = malloc((size_t)body);
        if (t) {
            t->start = malloc(((size_t)vocab + 1) * sizeof *t->start);
            /* The bytes less the length bytes, plus a NUL each. */
            t->text = malloc((size_t)body);
        }
        if (!t || !buf || !t->start || !t->text)
            rc = ct__err_set(CT_ENOMEM, "%s: %s: out of memory for %u tokens", fn, path, vocab);
    }
    if (rc == 0) {
        *t = (ct_llmc_tokenizer){.magic = TOKENIZER_LIVE,
                                 .vocab = vocab,
                                 .eot = eot,
                                 .start = t->start,
                                 .text = t->text};
        rc = pread_all(fd, buf, (size_t)body, HEADER_BYTES, fn, path);
    }
    if (rc == 0)
        rc = parse_tokens(t, buf, body, fn, path);
    free(buf);
    close(fd);
    if (rc) {
        if (t) {
            free(t->start);
            free(t->text);
            free(t);
        }
        return NULL;
    }
    return t;
}

static int check_tokenizer(const char *fn, const ct_llmc_tokenizer *t) {
    return t && t->magic == TOKENIZER_LIVE
               ? 0
               : ct__err_set(CT_EINVAL, "%s: the tokenizer is %s", fn,
                             t ? "not a live ct_llmc_tokenizer" : "NULL");
}

int64_t ct_llmc_tokenizer_vocab(const ct_llmc_tokenizer *t) {
    return check_tokenizer("llmc_tokenizer_vocab", t) ? -1 : t->vocab;
}

int64_t ct_llmc_tokenizer_eot(const ct_llmc_tokenizer *t) {
    return check_tokenizer("llmc_tokenizer_eot", t) ? -1 : t->eot;
}

const char *ct_llmc_tokenizer_decode(const ct_llmc_tokenizer *t, int64_t id, size_t *len) {
    static const char fn[] = "llmc_tokenizer_decode";
    if (check_tokenizer(fn, t))
        return NULL;
    if (id < 0 || id >= t->vocab) {
        ct__err_set(CT_ERANGE, "%s: token %lld is outside [0, %lld)", fn, (long long)id,
                    (long long)t->vocab);
        return NULL;
    }
    if (len)
        *len = (size_t)(t->start[id + 1] - t->start[id] - 1);
    return t->text + t->start[id];
}
