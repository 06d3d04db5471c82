/* data/ llmc: llm.c's token shards, GPT-2 checkpoints and tokenizer, from
 * files written here byte by byte from the published layouts (llm.c's
 * dev/data/data_common.py, train_gpt2.py's write_model and
 * write_tokenizer): a token set over three shards, its windows, the
 * streaming loader across shard boundaries and ranks and its resume; a
 * ct_gpt saved and loaded back bit for bit, known values landing in the
 * right parameters, bfloat16 checkpoints; and every way a header can lie. */
#include "ct_test.h"

#include <ct/llmc.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ----------------------------------------------------------- file builders */

/* A growing byte buffer, little-endian writes. */
typedef struct buf {
    unsigned char *b;
    size_t n, cap;
} buf;

static void put_bytes(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 1024;
        o->b = realloc(o->b, o->cap);
        if (!o->b)
            abort();
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_le(buf *o, uint64_t v, int width) {
    unsigned char b[8];
    for (int i = 0; i < width; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    put_bytes(o, b, (size_t)width);
}

/* A 256-word header whose first words are w[0..n). */
static void put_header(buf *o, const int32_t *w, int n) {
    for (int i = 0; i < 256; i++)
        put_le(o, (uint32_t)(i < n ? w[i] : 0), 4);
}

static const char *write_buf(char path[static 256], const char *name, buf *o) {
    tt_tmp_path(path, name);
    FILE *f = fopen(path, "wb");
    if (!f || (o->n && fwrite(o->b, 1, o->n, f) != o->n) || fclose(f) != 0)
        abort();
    free(o->b);
    *o = (buf){0};
    return path;
}

/* The token at flat offset g of the test's stream: every value differs
 * from its neighbours, so a window off by one shows. */
static uint16_t tok_at(int64_t g) { return (uint16_t)((g * 7 + 3) % 1000); }

/* A shard of n tokens tok_at(first ...), with header fields as given. */
static const char *shard_file(char path[static 256], const char *name, int32_t magic,
                              int32_t version, int32_t declared, int64_t first, int64_t n) {
    buf o = {0};
    put_header(&o, (int32_t[]){magic, version, declared}, 3);
    for (int64_t i = 0; i < n; i++)
        put_le(&o, tok_at(first + i), 2);
    return write_buf(path, name, &o);
}

static const char *good_shard(char path[static 256], const char *name, int64_t first, int64_t n) {
    return shard_file(path, name, 20240520, 1, (int32_t)n, first, n);
}

/* Three shards, shard_000.bin .. shard_002.bin, of 100, 50 and 120 tokens
 * of one stream, in their own directory; *pattern globs them. */
static const int64_t sizes3[3] = {100, 50, 120};

static void three_shards(char pattern[static 256], char paths[3][256]) {
    char dir[256];
    tt_tmp_path(dir, "three");
    mkdir(dir, 0755);
    int64_t first = 0;
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "three/shard_%03d.bin", i);
        good_shard(paths[i], name, first, sizes3[i]);
        first += sizes3[i];
    }
    tt_tmp_path(pattern, "three/shard_*.bin");
}

/* ------------------------------------------------------------ token sets */

TEST(tokens_three_shards_as_one_sequence) {
    char pattern[256], paths[3][256];
    three_shards(pattern, paths);
    ct_llmc_tokens *ts = ct_llmc_tokens_open(pattern);
    ASSERT_TRUE(ts);
    ASSERT_EQ(ct_llmc_tokens_count(ts), 270);
    ASSERT_EQ(ct_llmc_tokens_num_shards(ts), 3);
    int64_t start = 0;
    for (int i = 0; i < 3; i++) {
        ASSERT_STR_CONTAINS(ct_llmc_tokens_shard_path(ts, i), paths[i]);
        ASSERT_EQ(ct_llmc_tokens_shard_count(ts, i), sizes3[i]);
        ASSERT_EQ(ct_llmc_tokens_shard_start(ts, i), start);
        const uint16_t *d = ct_llmc_tokens_shard_data(ts, i);
        ASSERT_TRUE(d);
        for (int64_t j = 0; j < sizes3[i]; j++)
            ASSERT_EQ(d[j], tok_at(start + j));
        start += sizes3[i];
    }
    ASSERT_FAILS(ct_llmc_tokens_shard_path(ts, 3), CT_ERANGE, "shard 3", "[0, 3)");
    ASSERT_EQ(ct_llmc_tokens_shard_count(ts, -1), -1);

    int64_t all[270];
    ASSERT_EQ(ct_llmc_tokens_read(ts, 0, 270, all), 0);
    for (int64_t g = 0; g < 270; g++)
        ASSERT_EQ(all[g], tok_at(g));
    int64_t mid[60];
    ASSERT_EQ(ct_llmc_tokens_read(ts, 95, 60, mid), 0); /* 0 -> 1 -> 2 */
    for (int64_t g = 0; g < 60; g++)
        ASSERT_EQ(mid[g], tok_at(95 + g));
    ASSERT_EQ(ct_llmc_tokens_read(ts, 270, 0, mid), 0);
    ASSERT_RC(ct_llmc_tokens_read(ts, 250, 21, mid), CT_ERANGE, "[250, 250 + 21)", "[0, 270)");
    ct_llmc_tokens_free(ts);

    /* Explicit paths keep their order. */
    const char *rev[3] = {paths[2], paths[1], paths[0]};
    ts = ct_llmc_tokens_open_paths(rev, 3);
    ASSERT_TRUE(ts);
    ASSERT_EQ(ct_llmc_tokens_shard_start(ts, 1), 120);
    ASSERT_EQ(ct_llmc_tokens_read(ts, 120, 1, mid), 0);
    ASSERT_EQ(mid[0], tok_at(100));
    ct_llmc_tokens_free(ts);

    /* A pattern without wildcards is one file. */
    ts = ct_llmc_tokens_open(paths[1]);
    ASSERT_TRUE(ts);
    ASSERT_EQ(ct_llmc_tokens_count(ts), 50);
    ct_llmc_tokens_free(ts);
}

TEST(tokens_windows_cross_shard_boundaries) {
    char pattern[256], paths[3][256];
    three_shards(pattern, paths);
    ct_llmc_tokens *ts = ct_llmc_tokens_open(pattern);
    ASSERT_TRUE(ts);
    const int64_t T = 10, starts[4] = {0, 95, 145, 270 - 10 - 1};
    ct_tensor *x, *y;
    ASSERT_EQ(ct_llmc_tokens_windows(ts, starts, 4, T, &x, &y), 0);
    ASSERT_EQ(ct_tensor_dtype(x), CT_INT64);
    ASSERT_EQ(ct_ndim(x), 2);
    ASSERT_EQ(ct_size(x, 0), 4);
    ASSERT_EQ(ct_size(y, 1), T);
    const int64_t *px = ct_data_ptr(x), *py = ct_data_ptr(y);
    for (int r = 0; r < 4; r++)
        for (int64_t i = 0; i < T; i++) {
            ASSERT_EQ(px[r * T + i], tok_at(starts[r] + i));
            ASSERT_EQ(py[r * T + i], tok_at(starts[r] + i + 1));
        }
    /* T = 1: y is the single next token. */
    ASSERT_EQ(ct_llmc_tokens_windows(ts, (int64_t[]){99}, 1, 1, &x, &y), 0);
    ASSERT_EQ(((int64_t *)ct_data_ptr(x))[0], tok_at(99));
    ASSERT_EQ(((int64_t *)ct_data_ptr(y))[0], tok_at(100));

    ASSERT_RC(ct_llmc_tokens_windows(ts, (int64_t[]){0, 260}, 2, T, &x, &y), CT_ERANGE, "row 1",
              "260", "[0, 259]");
    ASSERT_TRUE(!x && !y);
    ASSERT_RC(ct_llmc_tokens_windows(ts, (int64_t[]){-1}, 1, T, &x, &y), CT_ERANGE, "row 0");
    ASSERT_RC(ct_llmc_tokens_windows(ts, (int64_t[]){0}, 1, 270, &x, &y), CT_ERANGE, "271 tokens",
              "270");
    ASSERT_RC(ct_llmc_tokens_windows(ts, starts, 0, T, &x, &y), CT_EINVAL, "rows >= 1");
    ASSERT_RC(ct_llmc_tokens_windows(ts, NULL, 1, T, &x, &y), CT_EINVAL, "starts");
    ASSERT_RC(ct_llmc_tokens_windows(NULL, starts, 1, T, &x, &y), CT_EINVAL, "NULL");
    ct_llmc_tokens_free(ts);
}

/* ---------------------------------------------------------------- loader */

/* Checks that x, y are rank r's part of global batch k of the shard that
 * starts at flat offset base, for B, T, R. */
static bool is_batch(ct_tensor *x, ct_tensor *y, int64_t base, int64_t k, int r, int64_t B,
                     int64_t T, int R) {
    if (!x || !y || ct_size(x, 0) != B || ct_size(x, 1) != T || ct_size(y, 0) != B)
        return false;
    const int64_t *px = ct_data_ptr(x), *py = ct_data_ptr(y);
    int64_t first = base + k * R * B * T + r * B * T;
    for (int64_t i = 0; i < B * T; i++)
        if (px[i] != tok_at(first + i) || py[i] != tok_at(first + i + 1))
            return false;
    return true;
}

TEST(loader_walks_shards_in_order_and_wraps) {
    char pattern[256], paths[3][256];
    three_shards(pattern, paths);
    ct_llmc_tokens *ts = ct_llmc_tokens_open(pattern);
    ct_llmc_loader *l =
        ts ? ct_llmc_loader_new(ts, &(ct_llmc_loader_options){.batch = 2, .context = 4}) : NULL;
    ASSERT_TRUE(l);
    /* 8 tokens a batch: (n - 1) / 8 batches per shard. */
    const int64_t nb[3] = {12, 6, 14}, base[3] = {0, 100, 150};
    for (int s = 0; s < 3; s++)
        ASSERT_EQ(ct_llmc_loader_shard_batches(l, s), nb[s]);
    for (int epoch = 0; epoch < 2; epoch++)
        for (int s = 0; s < 3; s++)
            for (int64_t k = 0; k < nb[s]; k++) {
                ct_tensor *x, *y;
                ASSERT_EQ(ct_llmc_loader_next(l, &x, &y), 0);
                ASSERT_TRUE(is_batch(x, y, base[s], k, 0, 2, 4, 1));
                ct_llmc_position p;
                ASSERT_EQ(ct_llmc_loader_position(l, &p), 0);
                ASSERT_EQ(p.epoch, epoch);
                ASSERT_EQ(p.shard, s);
                ASSERT_EQ(p.batch, k + 1);
            }
    ct_llmc_loader_free(l);
    ct_llmc_tokens_free(ts);
}

TEST(loader_shards_ranks_over_consecutive_chunks) {
    char pattern[256], paths[3][256];
    three_shards(pattern, paths);
    ct_llmc_tokens *ts = ct_llmc_tokens_open(pattern);
    ASSERT_TRUE(ts);
    enum { R = 3 };
    ct_llmc_loader *l[R];
    for (int r = 0; r < R; r++) {
        l[r] = ct_llmc_loader_new(
            ts, &(ct_llmc_loader_options){.batch = 2, .context = 4, .rank = r, .num_ranks = R});
        ASSERT_TRUE(l[r]);
    }
    /* 24 tokens a global batch: 99 / 24, 49 / 24, 119 / 24. */
    const int64_t nb[3] = {4, 2, 4}, base[3] = {0, 100, 150};
    for (int s = 0; s < 3; s++)
        for (int64_t k = 0; k < nb[s]; k++)
            for (int r = 0; r < R; r++) {
                ct_tensor *x, *y;
                ASSERT_EQ(ct_llmc_loader_next(l[r], &x, &y), 0);
                ASSERT_TRUE(is_batch(x, y, base[s], k, r, 2, 4, R));
            }
    for (int r = 0; r < R; r++) {
        ct_tensor *x, *y;
        ASSERT_EQ(ct_llmc_loader_next(l[r], &x, &y), 0);
        ASSERT_TRUE(is_batch(x, y, 0, 0, r, 2, 4, R));
        ct_llmc_loader_free(l[r]);
    }
    ASSERT_FAILS(
        ct_llmc_loader_new(
            ts, &(ct_llmc_loader_options){.batch = 1, .context = 1, .rank = 3, .num_ranks = 3}),
        CT_EINVAL, "rank 3", "num_ranks 3");
    ASSERT_FAILS(ct_llmc_loader_new(ts, &(ct_llmc_loader_options){.batch = 0, .context = 4}),
                 CT_EINVAL, "batch 0");
    ASSERT_FAILS(
        ct_llmc_loader_new(ts, &(ct_llmc_loader_options){.batch = INT64_MAX / 2, .context = 4}),
        CT_ERANGE, "overflows");
    ct_llmc_tokens_free(ts);
}

TEST(loader_skips_short_shards_and_refuses_when_none_fits) {
    char pattern[256], paths[3][256];
    three_shards(pattern, paths);
    ct_llmc_tokens *ts = ct_llmc_tokens_open(pattern);
    ASSERT_TRUE(ts);
    /* 64 tokens a batch: shard 1 (50 tokens) holds none. */
    ct_llmc_loader *l = ct_llmc_loader_new(ts, &(ct_llmc_loader_options){.batch = 8, .context = 8});
    ASSERT_TRUE(l);
    ASSERT_EQ(ct_llmc_loader_shard_batches(l, 1), 0);
    const int64_t want_base[3] = {0, 150, 0};
    for (int i = 0; i < 3; i++) {
        ct_tensor *x, *y;
        ASSERT_EQ(ct_llmc_loader_next(l, &x, &y), 0);
        ASSERT_TRUE(is_batch(x, y, want_base[i], 0, 0, 8, 8, 1));
    }
    ct_llmc_position p;
    ASSERT_EQ(ct_llmc_loader_position(l, &p), 0);
    ASSERT_EQ(p.epoch, 1);
    ASSERT_EQ(p.shard, 0);
    ASSERT_EQ(p.batch, 1);
    ct_llmc_loader_free(l);
    /* 120 tokens + 1 is more than the longest shard has. */
    ASSERT_FAILS(ct_llmc_loader_new(ts, &(ct_llmc_loader_options){.batch = 1, .context = 120}),
                 CT_ERANGE, "no shard holds", "121", "shard_002.bin", "holds 120");
    ct_llmc_tokens_free(ts);
}

TEST(loader_position_restores_the_stream) {
    char pattern[256], paths[3][256];
    three_shards(pattern, paths);
    ct_llmc_tokens *ts = ct_llmc_tokens_open(pattern);
    ASSERT_TRUE(ts);
    ct_llmc_loader_options o = {.batch = 2, .context = 4, .rank = 1, .num_ranks = 2};
    ct_llmc_loader *a = ct_llmc_loader_new(ts, &o), *b = ct_llmc_loader_new(ts, &o);
    ASSERT_TRUE(a && b);
    ct_tensor *x, *y, *x2, *y2;
    /* 16 tokens a batch: 6, 3 and 7 batches; stop at the end of shard 0. */
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(ct_llmc_loader_next(a, &x, &y), 0);
    ct_llmc_position saved;
    ASSERT_EQ(ct_llmc_loader_position(a, &saved), 0);
    ASSERT_EQ(saved.shard, 0);
    ASSERT_EQ(saved.batch, 6);
    ASSERT_EQ(ct_llmc_loader_set_position(b, &saved), 0);
    for (int i = 0; i < 20; i++) {
        ASSERT_EQ(ct_llmc_loader_next(a, &x, &y), 0);
        ASSERT_EQ(ct_llmc_loader_next(b, &x2, &y2), 0);
        ASSERT_EQ(memcmp(ct_data_ptr(x), ct_data_ptr(x2), 8 * sizeof(int64_t)), 0);
        ASSERT_EQ(memcmp(ct_data_ptr(y), ct_data_ptr(y2), 8 * sizeof(int64_t)), 0);
    }
    ASSERT_EQ(ct_llmc_loader_position(a, &saved), 0);
    ct_llmc_position pb;
    ASSERT_EQ(ct_llmc_loader_position(b, &pb), 0);
    ASSERT_EQ(pb.epoch, saved.epoch);
    ASSERT_EQ(pb.shard, saved.shard);
    ASSERT_EQ(pb.batch, saved.batch);
    ASSERT_EQ(saved.epoch, 1);
    /* A resume mid-shard, in a later epoch. */
    ASSERT_EQ(ct_llmc_loader_set_position(b, &(ct_llmc_position){3, 2, 5}), 0);
    ASSERT_EQ(ct_llmc_loader_next(b, &x, &y), 0);
    ASSERT_TRUE(is_batch(x, y, 150, 5, 1, 2, 4, 2));
    ASSERT_RC(ct_llmc_loader_set_position(b, &(ct_llmc_position){0, 1, 4}), CT_ERANGE, "batch 4",
              "[0, 3]", "shard_001.bin");
    ASSERT_RC(ct_llmc_loader_set_position(b, &(ct_llmc_position){0, 3, 0}), CT_ERANGE, "shard 3");
    ASSERT_RC(ct_llmc_loader_set_position(b, &(ct_llmc_position){-1, 0, 0}), CT_ERANGE, "epoch -1");
    ASSERT_RC(ct_llmc_loader_next(NULL, &x, &y), CT_EINVAL, "loader is NULL");
    ct_llmc_loader_free(a);
    ct_llmc_loader_free(b);
    ct_llmc_tokens_free(ts);
}

/* ----------------------------------------------------------------- vocab */

TEST(tokens_at_or_above_the_vocab_are_errors) {
    char dir[256], p0[256], p1[256];
    tt_tmp_path(dir, "vocab");
    mkdir(dir, 0755);
    good_shard(p0, "vocab/a.bin", 0, 40);
    /* Shard b: tokens below 65 but 70 at index 5 and 65535 at index 9. */
    buf o = {0};
    put_header(&o, (int32_t[]){20240520, 1, 30}, 3);
    for (int i = 0; i < 30; i++)
        put_le(&o, i == 5 ? 70 : i == 9 ? 65535 : (uint16_t)(i % 60), 2);
    write_buf(p1, "vocab/b.bin", &o);
    ct_llmc_tokens *ts = ct_llmc_tokens_open_paths((const char *[]){p1, p0}, 2);
    ASSERT_TRUE(ts);
    int max, shard;
    int64_t index;
    ASSERT_EQ(ct_llmc_tokens_max_id(ts, &max, &shard, &index), 0);
    ASSERT_EQ(max, 65535);
    ASSERT_EQ(shard, 0);
    ASSERT_EQ(index, 9);
    ASSERT_RC(ct_llmc_tokens_check_vocab(ts, 65), CT_ERANGE, "b.bin", "token 70", "index 5",
              "vocab size 65");
    ASSERT_EQ(ct_llmc_tokens_check_vocab(ts, 65536), 0);
    ASSERT_RC(ct_llmc_tokens_set_vocab(ts, 65537), CT_EINVAL, "65537");
    ASSERT_RC(ct_llmc_tokens_set_vocab(ts, 0), CT_EINVAL, "[1, 65536]");

    ct_tensor *x, *y;
    ASSERT_EQ(ct_llmc_tokens_windows(ts, (int64_t[]){0}, 1, 4, &x, &y), 0); /* unchecked */
    ASSERT_EQ(ct_llmc_tokens_set_vocab(ts, 1000), 0);
    ASSERT_RC(ct_llmc_tokens_windows(ts, (int64_t[]){0}, 1, 9, &x, &y), CT_ERANGE, "b.bin",
              "token 65535", "index 9");
    ASSERT_EQ(ct_llmc_tokens_set_vocab(ts, 65), 0);
    ASSERT_RC(ct_llmc_tokens_windows(ts, (int64_t[]){0}, 1, 6, &x, &y), CT_ERANGE, "b.bin",
              "token 70", "index 5");
    /* The target alone may be the bad one. */
    ASSERT_RC(ct_llmc_tokens_windows(ts, (int64_t[]){1}, 1, 4, &x, &y), CT_ERANGE, "index 5");
    ASSERT_EQ(ct_llmc_tokens_windows(ts, (int64_t[]){10}, 1, 4, &x, &y), 0);
    int64_t t[4];
    ASSERT_RC(ct_llmc_tokens_read(ts, 3, 4, t), CT_ERANGE, "token 70");

    /* The loader's first batch holds index 5: an error, the position kept. */
    ct_llmc_loader *l = ct_llmc_loader_new(ts, &(ct_llmc_loader_options){.batch = 2, .context = 4});
    ASSERT_TRUE(l);
    ASSERT_RC(ct_llmc_loader_next(l, &x, &y), CT_ERANGE, "b.bin", "token 70");
    ASSERT_TRUE(!x && !y);
    ct_llmc_position p;
    ASSERT_EQ(ct_llmc_loader_position(l, &p), 0);
    ASSERT_EQ(p.batch, 0);
    /* Batch 1 holds 65535 (index 9); batch 2 (indices 16 to 24) is clean. */
    ASSERT_EQ(ct_llmc_loader_set_position(l, &(ct_llmc_position){0, 0, 1}), 0);
    ASSERT_RC(ct_llmc_loader_next(l, &x, &y), CT_ERANGE, "token 65535", "index 9");
    ASSERT_EQ(ct_llmc_loader_set_position(l, &(ct_llmc_position){0, 0, 2}), 0);
    ASSERT_EQ(ct_llmc_loader_next(l, &x, &y), 0);
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ(((int64_t *)ct_data_ptr(x))[i], 16 + i);
        ASSERT_EQ(((int64_t *)ct_data_ptr(y))[i], 17 + i);
    }
    ct_llmc_loader_free(l);
    ct_llmc_tokens_free(ts);
}

/* ------------------------------------------------------- malformed shards */

TEST(malformed_shards_are_refused_naming_the_file) {
    char p[256], good[256];
    good_shard(good, "ok.bin", 0, 10);
    const char *one[1] = {p};
#define OPEN_FAILS(code, ...) ASSERT_FAILS(ct_llmc_tokens_open_paths(one, 1), code, p, __VA_ARGS__)
    shard_file(p, "magic.bin", 20240326, 1, 10, 0, 10);
    OPEN_FAILS(CT_ECORRUPT, "magic 20240326", "GPT-2 model checkpoint");
    shard_file(p, "llama.bin", 20240801, 7, 10, 0, 10);
    OPEN_FAILS(CT_ECORRUPT, "magic 20240801", "LLaMA-3");
    shard_file(p, "magic2.bin", 12345, 1, 10, 0, 10);
    OPEN_FAILS(CT_ECORRUPT, "magic 12345", "20240520");
    shard_file(p, "version.bin", 20240520, 2, 10, 0, 10);
    OPEN_FAILS(CT_EVERSION, "version 2");
    shard_file(p, "zero.bin", 20240520, 1, 0, 0, 0);
    OPEN_FAILS(CT_ECORRUPT, "0 tokens");
    shard_file(p, "negative.bin", 20240520, 1, -5, 0, 0);
    OPEN_FAILS(CT_ECORRUPT, "-5 tokens");
    shard_file(p, "short.bin", 20240520, 1, 11, 0, 10);
    OPEN_FAILS(CT_ECORRUPT, "2 short", "11 tokens", "truncated");
    shard_file(p, "long.bin", 20240520, 1, 9, 0, 10);
    OPEN_FAILS(CT_ECORRUPT, "2 more", "9 tokens", "trailing");
    shard_file(p, "huge.bin", 20240520, 1, INT32_MAX, 0, 10);
    OPEN_FAILS(CT_ECORRUPT, "2147483647 tokens");
    buf o = {0};
    put_le(&o, 20240520, 4);
    write_buf(p, "tiny.bin", &o);
    OPEN_FAILS(CT_ECORRUPT, "4 bytes", "1024-byte header");
    tt_tmp_path(p, "fifo.bin");
    ASSERT_EQ(mkfifo(p, 0600), 0);
    OPEN_FAILS(CT_ECORRUPT, "not a regular file", "FIFO");
    tt_tmp_path(p, "link.bin");
    ASSERT_EQ(symlink(good, p), 0);
    OPEN_FAILS(CT_ECORRUPT, "symbolic link");
    tt_tmp_path(p, "three");
    mkdir(p, 0755);
    OPEN_FAILS(CT_ECORRUPT, "a directory");
    tt_tmp_path(p, "missing.bin");
    OPEN_FAILS(CT_EIO, "cannot open");
#undef OPEN_FAILS
    /* The bad one among good ones is named. */
    char bad[256];
    shard_file(bad, "bad2.bin", 20240520, 1, 12, 0, 10);
    ASSERT_FAILS(ct_llmc_tokens_open_paths((const char *[]){good, bad, good}, 3), CT_ECORRUPT,
                 "bad2.bin");
    tt_tmp_path(p, "nothing_*.bin");
    ASSERT_FAILS(ct_llmc_tokens_open(p), CT_EINVAL, "no file matches", "nothing_*.bin");
    ASSERT_FAILS(ct_llmc_tokens_open(NULL), CT_EINVAL, "NULL");
    ASSERT_FAILS(ct_llmc_tokens_open(""), CT_EINVAL, "empty");
    ASSERT_FAILS(ct_llmc_tokens_open_paths(NULL, 1), CT_EINVAL, "NULL");
    ASSERT_FAILS(ct_llmc_tokens_open_paths((const char *[]){good, NULL}, 2), CT_EINVAL,
                 "path 1 is NULL");
    ASSERT_EQ(ct_llmc_tokens_count(NULL), -1);
}

/* ----------------------------------------------------------- GPT-2 model */

static const ct_gpt_config small = {
    .vocab = 65, .context = 64, .layers = 2, .heads = 4, .width = 32};

/* Gives every parameter of gpt distinct values from seed (biases and layer
 * norms included, which ct_gpt_new sets to constants). */
static int randomize(ct_module *gpt, uint64_t seed) {
    ct_param_list pl;
    ct_param_list_init(&pl);
    int rc = ct_module_named_parameters(gpt, &pl);
    bool prev = ct_set_grad_enabled(false);
    for (int i = 0; i < pl.n && !rc; i++) {
        ct_tensor *t = pl.tensors[i];
        if (!ct_copy_(t, tt_rand(ct_ndim(t), ct_sizes(t), CT_FLOAT32, seed + (uint64_t)i)))
            rc = ct_errcode();
    }
    ct_set_grad_enabled(prev);
    ct_param_list_free(&pl);
    return rc;
}

/* Whether every parameter of a equals b's, bit for bit. */
static bool same_params(ct_module *a, ct_module *b, bool report) {
    ct_param_list pa, pb;
    ct_param_list_init(&pa);
    ct_param_list_init(&pb);
    bool same =
        !ct_module_named_parameters(a, &pa) && !ct_module_named_parameters(b, &pb) && pa.n == pb.n;
    for (int i = 0; same && i < pa.n; i++) {
        ct_tensor *x = pa.tensors[i], *y = pb.tensors[i];
        same = !strcmp(pa.names[i], pb.names[i]) && ct_numel(x) == ct_numel(y) &&
               !memcmp(ct_data_ptr(x), ct_data_ptr(y), (size_t)ct_numel(x) * 4);
        if (!same && report)
            fprintf(stderr, "parameter %s differs\n", pa.names[i]);
    }
    ct_param_list_free(&pa);
    ct_param_list_free(&pb);
    return same;
}

static ct_tensor *logits_of(ct_module *gpt) {
    ct_module_train(gpt, false);
    ct_tensor *ids = ct_empty(CT_SHAPE(2, 16), CT_INT64);
    int64_t *p = ct_data_ptr(ids);
    for (int i = 0; i < 32; i++)
        p[i] = (i * 11) % 65;
    return ct_module_forward(gpt, ids);
}

static int64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

TEST(gpt_save_then_load_is_bit_exact) {
    char path[256];
    tt_tmp_path(path, "small.bin");
    ct_module *a = ct_gpt_new(&small), *b = ct_gpt_new(&small);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(randomize(a, 1), 0);
    ASSERT_EQ(randomize(b, 99), 0);
    ASSERT_EQ(ct_llmc_gpt_save(a, path), 0);
    /* Vp = 128: wte 128 x 32, wpe 64 x 32, per layer 12 C^2 + 13 C, ln_f. */
    const int64_t C = 32, numel = 128 * C + 64 * C + 2 * (12 * C * C + 13 * C) + 2 * C;
    ASSERT_EQ(file_size(path), 1024 + 4 * numel);
    ct_gpt_config cfg;
    ct_llmc_gpt_info info;
    ASSERT_EQ(ct_llmc_gpt_read_config(path, &cfg, &info), 0);
    ASSERT_EQ(cfg.vocab, 65);
    ASSERT_EQ(cfg.context, 64);
    ASSERT_EQ(cfg.layers, 2);
    ASSERT_EQ(cfg.heads, 4);
    ASSERT_EQ(cfg.width, 32);
    ASSERT_EQ(info.version, 3);
    ASSERT_EQ(info.padded_vocab, 128);
    ASSERT_EQ(info.num_params, numel);
    /* The header as llm.c writes it, and the padding rows zero. */
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f);
    int32_t h[256];
    float *body = malloc((size_t)numel * 4);
    ASSERT_EQ(fread(h, 4, 256, f), 256);
    ASSERT_EQ(fread(body, 4, (size_t)numel, f), numel);
    fclose(f);
    const int32_t want[8] = {20240326, 3, 64, 65, 2, 4, 32, 128};
    for (int i = 0; i < 256; i++)
        ASSERT_EQ(h[i], i < 8 ? want[i] : 0);
    bool zeros = true;
    for (int64_t i = 65 * C; i < 128 * C; i++)
        zeros &= body[i] == 0;
    ASSERT_TRUE(zeros);
    /* llm.c's lnfb is the file's last C floats. */
    ct_tensor *lnfb =
        ct_module_param(ct_module_child(ct_module_child(a, "transformer"), "ln_f"), "bias");
    ASSERT_EQ(memcmp(body + numel - C, ct_data_ptr(lnfb), (size_t)C * 4), 0);
    free(body);

    ASSERT_TRUE(!same_params(a, b, false));
    ASSERT_EQ(ct_llmc_gpt_load_into(b, path), 0);
    ASSERT_TRUE(same_params(a, b, true));
    ct_tensor *la = logits_of(a), *lb = logits_of(b);
    ASSERT_TRUE(la && lb);
    ASSERT_EQ(memcmp(ct_data_ptr(la), ct_data_ptr(lb), (size_t)ct_numel(la) * 4), 0);
    ct_module *c = ct_llmc_gpt_load(path, &(ct_gpt_config){.dropout = 0.1});
    ASSERT_TRUE(c);
    ASSERT_TRUE(same_params(a, c, true));
    /* Saving over an existing file replaces it whole and leaves no temp. */
    ASSERT_EQ(randomize(a, 7), 0);
    ASSERT_EQ(ct_llmc_gpt_save(a, path), 0);
    ASSERT_EQ(ct_llmc_gpt_load_into(c, path), 0);
    ASSERT_TRUE(same_params(a, c, true));
    char dir[256];
    tt_tmp_path(dir, "");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q 'small.bin.tmp'", dir);
    ASSERT_TRUE(system(cmd) != 0);
    ct_module_free(a);
    ct_module_free(b);
    ct_module_free(c);
}

/* float32 to bfloat16, round to nearest even (no NaNs here). */
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float f32_of_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value the hand-made checkpoints hold at element j of file tensor i
 * (0 = wte ... 15 = lnfb), per-layer tensors counting j across layers; the
 * padding rows of wte hold -1, which a loader must drop. */
static float known(int i, int64_t j) { return (float)(i * 1000 + j % 1000) / 4; }

/* llm.c's tensors in file order for L, C, maxT, Vp: (elements of one
 * slice, per layer). */
static void model_file(buf *o, int version, int32_t maxT, int32_t V, int32_t L, int32_t NH,
                       int32_t C, int32_t Vp) {
    put_header(o, (int32_t[]){20240326, version, maxT, V, L, NH, C, Vp}, 8);
    const int64_t slice[16] = {
        (int64_t)Vp * C, (int64_t)maxT * C, C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C,
        4 * C,           4 * C * C,         C, C, C};
    for (int i = 0; i < 16; i++) {
        int64_t n = slice[i] * (i >= 2 && i < 14 ? L : 1);
        for (int64_t j = 0; j < n; j++) {
            float v = i == 0 && j >= (int64_t)V * C ? -1.0f : known(i, j);
            if (version == 5)
                put_le(o, bf16_of(v), 2);
            else {
                uint32_t u;
                memcpy(&u, &v, 4);
                put_le(o, u, 4);
            }
        }
    }
}

static float param_at(ct_module *gpt, const char *name, int64_t i) {
    ct_param_list pl;
    ct_param_list_init(&pl);
    float v = NAN;
    if (!ct_module_named_parameters(gpt, &pl)) {
        ct_tensor *t = ct_param_list_find(&pl, name);
        if (t && i < ct_numel(t))
            v = ((const float *)ct_data_ptr(t))[i];
    }
    ct_param_list_free(&pl);
    return v;
}

/* Checks the hand-made file's values in gpt: L = 2, C = 8, V = 5, maxT = 4. */
static bool holds_known(ct_module *gpt, bool bf16) {
    const int64_t C = 8;
    const struct {
        const char *name;
        int64_t i; /* index in the parameter */
        int file;  /* file tensor */
        int64_t j; /* index in it */
    } checks[] = {
        {"transformer.wte.weight", 4 * C + 7, 0, 4 * C + 7}, /* last real row */
        {"transformer.wpe.weight", 1 * C + 2, 1, 1 * C + 2},
        {"transformer.h.0.ln_1.weight", 3, 2, 3},
        {"transformer.h.1.ln_1.weight", 3, 2, C + 3},
        {"transformer.h.1.ln_1.bias", 0, 3, C},
        {"transformer.h.0.attn.c_attn.weight", 2 * C + 5, 4, 2 * C + 5},
        {"transformer.h.1.attn.c_attn.weight", 23 * C + 7, 4, 3 * C * C + 23 * C + 7},
        {"transformer.h.1.attn.c_attn.bias", 13, 5, 3 * C + 13},
        {"transformer.h.1.attn.c_proj.weight", 9, 6, C * C + 9},
        {"transformer.h.0.attn.c_proj.bias", 6, 7, 6},
        {"transformer.h.1.ln_2.weight", 1, 8, C + 1},
        {"transformer.h.0.ln_2.bias", 7, 9, 7},
        {"transformer.h.1.mlp.c_fc.weight", 31 * C, 10, 4 * C * C + 31 * C},
        {"transformer.h.1.mlp.c_fc.bias", 30, 11, 4 * C + 30},
        {"transformer.h.0.mlp.c_proj.weight", 3 * 4 * C + 17, 12, 3 * 4 * C + 17},
        {"transformer.h.1.mlp.c_proj.bias", 2, 13, C + 2},
        {"transformer.ln_f.weight", 5, 14, 5},
        {"transformer.ln_f.bias", 7, 15, 7},
    };
    for (size_t k = 0; k < sizeof checks / sizeof *checks; k++) {
        float want = known(checks[k].file, checks[k].j);
        if (bf16)
            want = f32_of_bf16(bf16_of(want));
        float got = param_at(gpt, checks[k].name, checks[k].i);
        if (got != want) {
            fprintf(stderr, "%s[%lld] = %g, expected %g\n", checks[k].name, (long long)checks[k].i,
                    got, want);
            return false;
        }
    }
    /* No -1 from the padding rows anywhere in wte. */
    for (int64_t i = 0; i < 5 * C; i++)
        if (param_at(gpt, "transformer.wte.weight", i) < 0)
            return false;
    return true;
}

TEST(gpt_file_made_by_hand_lands_in_the_right_parameters) {
    char path[256];
    buf o = {0};
    model_file(&o, 3, 4, 5, 2, 2, 8, 8);
    write_buf(path, "hand.bin", &o);
    ct_module *gpt = ct_llmc_gpt_load(path, NULL);
    ASSERT_TRUE(gpt);
    ASSERT_EQ(ct_size(ct_module_param(ct_module_child(ct_module_child(gpt, "transformer"), "wte"),
                                      "weight"),
                      0),
              5);
    ASSERT_TRUE(holds_known(gpt, false));
    ct_module_free(gpt);
}

TEST(gpt_bfloat16_version_5) {
    char path[256], back[256];
    buf o = {0};
    model_file(&o, 5, 4, 5, 2, 2, 8, 8);
    write_buf(path, "hand5.bin", &o);
    ct_gpt_config cfg;
    ct_llmc_gpt_info info;
    ASSERT_EQ(ct_llmc_gpt_read_config(path, &cfg, &info), 0);
    ASSERT_EQ(info.version, 5);
    ct_module *gpt = ct_llmc_gpt_load(path, NULL);
    ASSERT_TRUE(gpt);
    ASSERT_TRUE(holds_known(gpt, true));
    ct_module_free(gpt);

    /* Written as bfloat16, read back: the float32 values rounded. */
    ct_module *a = ct_gpt_new(&small);
    ASSERT_TRUE(a);
    ASSERT_EQ(randomize(a, 5), 0);
    tt_tmp_path(back, "small5.bin");
    ASSERT_EQ(ct_llmc_gpt_save_as(a, back, CT_LLMC_GPT_BFLOAT16), 0);
    ct_module *b = ct_llmc_gpt_load(back, NULL);
    ASSERT_TRUE(b);
    ct_param_list pa, pb;
    ct_param_list_init(&pa);
    ct_param_list_init(&pb);
    ASSERT_EQ(ct_module_named_parameters(a, &pa), 0);
    ASSERT_EQ(ct_module_named_parameters(b, &pb), 0);
    for (int i = 0; i < pa.n; i++) {
        const float *x = ct_data_ptr(pa.tensors[i]), *y = ct_data_ptr(pb.tensors[i]);
        for (int64_t k = 0; k < ct_numel(pa.tensors[i]); k++)
            ASSERT_EQ(bf16_of(x[k]), bf16_of(y[k]));
        for (int64_t k = 0; k < ct_numel(pa.tensors[i]); k++)
            ASSERT_TRUE(y[k] == f32_of_bf16(bf16_of(x[k])));
    }
    ct_param_list_free(&pa);
    ct_param_list_free(&pb);
    ASSERT_RC(ct_llmc_gpt_save_as(a, back, 4), CT_EVERSION, "version 4");
    ct_module_free(a);
    ct_module_free(b);
}

/* A header with words w (8 of them) and body_bytes of zeros after it. */
static const char *header_file(char path[static 256], const char *name, const int32_t *w,
                               int64_t body_bytes) {
    buf o = {0};
    put_header(&o, w, 8);
    for (int64_t i = 0; i < body_bytes; i++)
        put_le(&o, 0, 1);
    return write_buf(path, name, &o);
}

TEST(malformed_gpt_checkpoints_are_refused) {
    char p[256];
    ct_gpt_config cfg;
    /* The small model's body: 1 layer, C 8, maxT 4, V 5 = Vp 8. */
    const int64_t numel = 8 * 8 + 4 * 8 + (12 * 64 + 13 * 8) + 2 * 8;
    header_file(p, "ok.bin", (int32_t[]){20240326, 3, 4, 5, 1, 2, 8, 8}, numel * 4);
    ASSERT_EQ(ct_llmc_gpt_read_config(p, &cfg, NULL), 0);

    header_file(p, "m1.bin", (int32_t[]){20240520, 3, 4, 5, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, p, "magic 20240520",
              "token shard");
    header_file(p, "m2.bin", (int32_t[]){20240328, 3, 4, 5, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "tokenizer magic");
    header_file(p, "v1.bin", (int32_t[]){20240326, 1, 4, 5, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_EVERSION, p, "version 1", "train_gpt2.py");
    header_file(p, "v4.bin", (int32_t[]){20240326, 4, 4, 5, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_EVERSION, "version 4");
    header_file(p, "l0.bin", (int32_t[]){20240326, 3, 4, 5, 0, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, p, "L (header[4]) is 0");
    header_file(p, "cneg.bin", (int32_t[]){20240326, 3, 4, 5, 1, 2, -8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "C (header[6]) is -8");
    header_file(p, "v0.bin", (int32_t[]){20240326, 3, 4, 0, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "V (header[3]) is 0");
    header_file(p, "nh.bin", (int32_t[]){20240326, 3, 4, 5, 1, 3, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "C 8 is not divisible by NH 3");
    header_file(p, "vp.bin", (int32_t[]){20240326, 3, 4, 9, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "Vp 8 is below the vocab V 9");
    header_file(p, "maxt.bin", (int32_t[]){20240326, 3, (1 << 20) + 1, 5, 1, 2, 8, 8}, 0);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "maxT (header[2])",
              "[1, 1048576]");
    header_file(p, "vbig.bin", (int32_t[]){20240326, 3, 4, INT32_MAX, 1, 2, 8, INT32_MAX}, 0);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "V (header[3]) is 2147483647");
    header_file(p, "lbig.bin", (int32_t[]){20240326, 3, 4, 5, INT32_MAX, 2, 65536, 8}, 0);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "L (header[4]) is 2147483647");
    /* The largest sizes the limits allow: a file far too short for them. */
    header_file(p, "max.bin",
                (int32_t[]){20240326, 3, 1 << 20, 1 << 24, 4096, 65536, 65536, 1 << 24}, 0);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "short", "truncated", "L 4096");
    header_file(p, "short.bin", (int32_t[]){20240326, 3, 4, 5, 1, 2, 8, 8}, numel * 4 - 1);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "1 short");
    header_file(p, "long.bin", (int32_t[]){20240326, 3, 4, 5, 1, 2, 8, 8}, numel * 4 + 1);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "1 more", "trailing");
    header_file(p, "bf16len.bin", (int32_t[]){20240326, 5, 4, 5, 1, 2, 8, 8}, numel * 4);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "more", "version 5");
    buf o = {0};
    put_le(&o, 20240326, 4);
    write_buf(p, "tiny.bin", &o);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "4 bytes", "header");
    tt_tmp_path(p, "model.fifo");
    ASSERT_EQ(mkfifo(p, 0600), 0);
    ASSERT_RC(ct_llmc_gpt_read_config(p, &cfg, NULL), CT_ECORRUPT, "FIFO");
    ASSERT_FAILS(ct_llmc_gpt_load(p, NULL), CT_ECORRUPT, "FIFO");
    ASSERT_RC(ct_llmc_gpt_read_config(NULL, &cfg, NULL), CT_EINVAL, "path is NULL");
}

TEST(gpt_load_and_save_check_the_model) {
    char path[256];
    tt_tmp_path(path, "check.bin");
    ct_module *a = ct_gpt_new(&small);
    ASSERT_TRUE(a);
    ASSERT_EQ(randomize(a, 3), 0);
    ASSERT_EQ(ct_llmc_gpt_save(a, path), 0);
    ct_gpt_config wide = small, heads = small, deep = small;
    wide.width = 64;
    heads.heads = 8;
    deep.layers = 3;
    ct_module *w = ct_gpt_new(&wide), *h = ct_gpt_new(&heads), *d = ct_gpt_new(&deep);
    ASSERT_TRUE(w && h && d);
    ASSERT_RC(ct_llmc_gpt_load_into(w, path), CT_ESHAPE, path, "C 32", "width 64");
    ASSERT_RC(ct_llmc_gpt_load_into(h, path), CT_ESHAPE, "NH 4", "heads 8");
    ASSERT_RC(ct_llmc_gpt_load_into(d, path), CT_ESHAPE, "L 2", "layers 3");
    ct_module *lin = ct_linear_new(4, 4, true);
    ASSERT_RC(ct_llmc_gpt_load_into(lin, path), CT_EINVAL, "not a GPT");
    ASSERT_RC(ct_llmc_gpt_save(lin, path), CT_EINVAL, "not a GPT");
    ASSERT_RC(ct_llmc_gpt_load_into(NULL, path), CT_EINVAL, "NULL");
    ASSERT_RC(ct_llmc_gpt_save(a, NULL), CT_EINVAL, "NULL");
    char nodir[256];
    tt_tmp_path(nodir, "no/such/dir.bin");
    ASSERT_RC(ct_llmc_gpt_save(a, nodir), CT_EIO, "cannot create");
    /* A failed load leaves the model as it was. */
    ct_module *b = ct_gpt_new(&small), *b0 = ct_gpt_new(&small);
    ASSERT_TRUE(b && b0);
    ASSERT_EQ(randomize(b, 11), 0);
    ASSERT_EQ(randomize(b0, 11), 0);
    char bad[256];
    header_file(bad, "bad.bin", (int32_t[]){20240326, 3, 64, 65, 2, 4, 32, 128}, 12);
    ASSERT_RC(ct_llmc_gpt_load_into(b, bad), CT_ECORRUPT, "short");
    ASSERT_TRUE(same_params(b, b0, true));
    ct_module_free(lin);
    ct_module_free(w);
    ct_module_free(h);
    ct_module_free(d);
    ct_module_free(b);
    ct_module_free(b0);
    ct_module_free(a);
}

/* ------------------------------------------------------------- tokenizer */

static void tokenizer_file(buf *o, int32_t version, int32_t vocab, int32_t eot,
                           const char *const *toks, const int *lens, int n) {
    put_header(o, (int32_t[]){20240328, version, vocab, eot}, 4);
    for (int i = 0; i < n; i++) {
        put_le(o, (uint64_t)lens[i], 1);
        put_bytes(o, toks[i], (size_t)lens[i]);
    }
}

TEST(tokenizer_decodes_and_refuses_bad_files) {
    const char *toks[4] = {"a", "bc", "\0x", "<|endoftext|>"};
    const int lens[4] = {1, 2, 2, 13};
    char p[256];
    buf o = {0};
    tokenizer_file(&o, 2, 4, 3, toks, lens, 4);
    write_buf(p, "tok.bin", &o);
    ct_llmc_tokenizer *t = ct_llmc_tokenizer_load(p);
    ASSERT_TRUE(t);
    ASSERT_EQ(ct_llmc_tokenizer_vocab(t), 4);
    ASSERT_EQ(ct_llmc_tokenizer_eot(t), 3);
    size_t len;
    for (int i = 0; i < 4; i++) {
        const char *s = ct_llmc_tokenizer_decode(t, i, &len);
        ASSERT_TRUE(s);
        ASSERT_EQ(len, lens[i]);
        ASSERT_EQ(memcmp(s, toks[i], len), 0);
        ASSERT_EQ(s[len], 0);
    }
    ASSERT_FAILS(ct_llmc_tokenizer_decode(t, 4, &len), CT_ERANGE, "token 4", "[0, 4)");
    ASSERT_FAILS(ct_llmc_tokenizer_decode(t, -1, NULL), CT_ERANGE, "token -1");
    ct_llmc_tokenizer_free(t);

#define TOK_FAILS(code, ...)                                                                       \
    do {                                                                                           \
        write_buf(p, "badtok.bin", &o);                                                            \
        ASSERT_FAILS(ct_llmc_tokenizer_load(p), code, p, __VA_ARGS__);                             \
    } while (0)
    tokenizer_file(&o, 1, 4, 0, toks, lens, 4);
    TOK_FAILS(CT_ECORRUPT, "version 1", "50257");
    tokenizer_file(&o, 3, 4, 3, toks, lens, 4);
    TOK_FAILS(CT_EVERSION, "version 3");
    tokenizer_file(&o, 2, 4, 4, toks, lens, 4);
    TOK_FAILS(CT_ECORRUPT, "<|endoftext|> id 4");
    tokenizer_file(&o, 2, 0, 0, toks, lens, 0);
    TOK_FAILS(CT_ECORRUPT, "vocab 0");
    tokenizer_file(&o, 2, 5, 3, toks, lens, 4);
    TOK_FAILS(CT_ECORRUPT, "ends after token 4", "header's 5");
    tokenizer_file(&o, 2, 3, 1, toks, lens, 4);
    TOK_FAILS(CT_ECORRUPT, "14 bytes follow", "trailing");
    tokenizer_file(&o, 2, 4, 3, toks, (const int[]){1, 0, 2, 13}, 4);
    TOK_FAILS(CT_ECORRUPT, "token 1 has length 0");
    tokenizer_file(&o, 2, 4, 3, toks, lens, 4);
    o.n -= 5; /* inside the last token */
    TOK_FAILS(CT_ECORRUPT, "token 3's 13 bytes");
    tokenizer_file(&o, 2, 4, 3, toks, lens, 4);
    o.b[0] = 0;
    TOK_FAILS(CT_ECORRUPT, "tokenizer magic");
#undef TOK_FAILS
    ASSERT_FAILS(ct_llmc_tokenizer_load(NULL), CT_EINVAL, "NULL");
    ASSERT_EQ(ct_llmc_tokenizer_vocab(NULL), -1);
}
