/* The caching allocator (tensor/cuda/caching_allocator.c) over a memory
 * backend on host memory that stands in for a GPU: segments are malloc'd
 * under a capacity, and events complete when the test says so. The same
 * allocator runs over the CUDA runtime on a GPU (ci/gpu-check.sh). */
#include "caching_allocator.h"
#include "ct_test.h"

#include <stdlib.h>

#define MiB ((size_t)1 << 20)

/* The stand-in device. */
typedef struct fake {
    size_t capacity, used;
    int live;    /* segments not freed */
    int mallocs; /* calls */
    int events_live;
    bool fail_events;
    struct {
        void *p;
        size_t n;
    } segs[256];
} fake;

typedef struct fake_event {
    bool done;
} fake_event;

static int fake_malloc(void *ctx, size_t bytes, void **ptr) {
    fake *f = ctx;
    f->mallocs++;
    if (f->used + bytes > f->capacity)
        return CT_ENOMEM;
    *ptr = malloc(bytes);
    if (!*ptr)
        return ct_seterr(CT_ENOMEM, "host");
    for (int i = 0; i < 256; i++)
        if (!f->segs[i].p) {
            f->segs[i].p = *ptr;
            f->segs[i].n = bytes;
            break;
        }
    f->used += bytes;
    f->live++;
    return 0;
}

static void fake_free(void *ctx, void *ptr) {
    fake *f = ctx;
    for (int i = 0; i < 256; i++)
        if (f->segs[i].p == ptr) {
            f->used -= f->segs[i].n;
            f->segs[i].p = NULL;
        }
    f->live--;
    free(ptr);
}

static fake_event *last_event;

static int fake_record(void *ctx, void *stream, void **event) {
    (void)stream;
    fake *f = ctx;
    if (f->fail_events)
        return ct_seterr(CT_EFOREIGN, "the fake device records no event");
    last_event = calloc(1, sizeof *last_event);
    *event = last_event;
    f->events_live++;
    return 0;
}

static int fake_query(void *ctx, void *event) {
    (void)ctx;
    return ((fake_event *)event)->done;
}

static void fake_event_free(void *ctx, void *event) {
    ((fake *)ctx)->events_live--;
    free(event);
}

static int fake_info(void *ctx, size_t *fr, size_t *total) {
    fake *f = ctx;
    *fr = f->capacity - f->used;
    *total = f->capacity;
    return 0;
}

static fake dev;

static ct__calloc *new_allocator(size_t capacity) {
    dev = (fake){.capacity = capacity};
    ct__devmem mem = {&dev,       fake_malloc,     fake_free, fake_record,
                      fake_query, fake_event_free, fake_info};
    return ct__cuda_calloc_new(&mem, 0);
}

static ct__calloc_stats stats(ct__calloc *a) {
    ct__calloc_stats s;
    ct__cuda_calloc_get_stats(a, &s);
    return s;
}

static void *alloc(ct__calloc *a, size_t bytes, void *stream) {
    void *p = NULL;
    int rc = ct__cuda_calloc_alloc(a, bytes, stream, &p);
    if (rc)
        tt_fail(__FILE__, __LINE__, "alloc %zu: %s", bytes, ct_errmsg());
    return p;
}

#define STREAM_A ((void *)0x10)
#define STREAM_B ((void *)0x20)

TEST(small_blocks_share_a_segment_and_come_back_from_the_cache) {
    ct__calloc *a = new_allocator(1 << 30);
    char *p = alloc(a, 1000, STREAM_A), *q = alloc(a, 1, STREAM_A);
    ASSERT_EQ(dev.mallocs, 1);
    ASSERT_EQ(stats(a).reserved, (int64_t)(2 * MiB));
    ASSERT_EQ(stats(a).allocated, 1024 + 512); /* rounded to 512 bytes */
    ASSERT_EQ(stats(a).requested, 1001);
    ASSERT_TRUE(q == p + 1024);
    ASSERT_EQ(ct__cuda_calloc_release(a, p), 0);
    ASSERT_EQ(ct__cuda_calloc_release(a, q), 0);
    ASSERT_EQ(stats(a).allocated, 0);
    ASSERT_EQ(stats(a).reserved, (int64_t)(2 * MiB));
    /* The hot path: no device call. */
    void *r = alloc(a, 700, STREAM_A);
    ASSERT_TRUE(r == p);
    ASSERT_EQ(dev.mallocs, 1);
    ASSERT_EQ(stats(a).cache_hits, 2); /* q came from the first segment's rest, too */
    ASSERT_EQ(ct__cuda_calloc_release(a, r), 0);
    ct__cuda_calloc_free(a);
    ASSERT_EQ(dev.live, 0);
}

TEST(freed_neighbours_merge_and_serve_a_larger_block) {
    ct__calloc *a = new_allocator(1 << 30);
    char *b[4];
    for (int i = 0; i < 4; i++)
        b[i] = alloc(a, MiB / 2, STREAM_A);
    ASSERT_EQ(dev.mallocs, 1);
    ASSERT_TRUE(b[1] == b[0] + MiB / 2 && b[3] == b[0] + 3 * MiB / 2);
    ASSERT_EQ(ct__cuda_calloc_release(a, b[2]), 0);
    ASSERT_EQ(ct__cuda_calloc_release(a, b[1]), 0);
    char *m = alloc(a, MiB, STREAM_A);
    ASSERT_TRUE(m == b[1]);
    ASSERT_EQ(dev.mallocs, 1);
    ASSERT_EQ(ct__cuda_calloc_release(a, b[0]), 0);
    ASSERT_EQ(ct__cuda_calloc_release(a, m), 0);
    ASSERT_EQ(ct__cuda_calloc_release(a, b[3]), 0);
    /* All merged back into one segment, which empty_cache returns. */
    ASSERT_EQ(ct__cuda_calloc_empty_cache(a), 0);
    ASSERT_EQ(stats(a).reserved, 0);
    ASSERT_EQ(dev.live, 0);
    ct__cuda_calloc_free(a);
}

TEST(large_blocks_come_from_large_segments_split_only_in_big_pieces) {
    ct__calloc *a = new_allocator(1 << 30);
    char *x = alloc(a, 3 * MiB, STREAM_A);
    ASSERT_EQ(stats(a).reserved, (int64_t)(20 * MiB));
    char *y = alloc(a, 5 * MiB, STREAM_A);
    ASSERT_TRUE(y == x + 3 * MiB); /* from the 17 MiB left */
    ASSERT_EQ(dev.mallocs, 1);
    /* 12 MiB left: a 11.5 MiB request takes it whole (0.5 MiB is no
     * large block's worth). */
    char *z = alloc(a, 11 * MiB + MiB / 2, STREAM_A);
    ASSERT_TRUE(z == x + 8 * MiB);
    ASSERT_EQ(stats(a).allocated, (int64_t)(20 * MiB));
    /* 10 MiB and up: a segment of its own, rounded to 2 MiB. */
    alloc(a, 13 * MiB, STREAM_A);
    ASSERT_EQ(stats(a).reserved, (int64_t)(34 * MiB));
    ct__cuda_calloc_free(a);
    ASSERT_EQ(dev.live, 0);
}

TEST(a_block_is_reused_only_on_its_own_stream) {
    ct__calloc *a = new_allocator(1 << 30);
    void *p = alloc(a, 4096, STREAM_A);
    ASSERT_EQ(ct__cuda_calloc_release(a, p), 0);
    void *q = alloc(a, 4096, STREAM_B);
    ASSERT_TRUE(q != p);
    ASSERT_EQ(dev.mallocs, 2);
    void *r = alloc(a, 4096, STREAM_A);
    ASSERT_TRUE(r == p);
    ASSERT_EQ(dev.mallocs, 2);
    ct__cuda_calloc_free(a);
}

TEST(a_block_used_by_another_stream_waits_for_its_event) {
    ct__calloc *a = new_allocator(1 << 30);
    void *p = alloc(a, 4096, STREAM_A);
    ASSERT_EQ(ct__cuda_calloc_record_stream(a, p, STREAM_B), 0);
    ASSERT_EQ(ct__cuda_calloc_record_stream(a, p, STREAM_B), 0); /* once is enough */
    ASSERT_EQ(ct__cuda_calloc_record_stream(a, p, STREAM_A), 0); /* its own: nothing */
    ASSERT_EQ(ct__cuda_calloc_release(a, p), 0);
    ASSERT_EQ(dev.events_live, 1);
    fake_event *e = last_event;
    void *q = alloc(a, 4096, STREAM_A);
    ASSERT_TRUE(q != p); /* stream B may still be using p */
    e->done = true;
    void *r = alloc(a, 4096, STREAM_A);
    ASSERT_TRUE(r == p);
    ASSERT_EQ(dev.events_live, 0);
    ASSERT_EQ(ct__cuda_calloc_release(a, q), 0);
    /* A block whose event cannot be recorded is never reused. */
    ASSERT_EQ(ct__cuda_calloc_record_stream(a, r, STREAM_B), 0);
    dev.fail_events = true;
    ASSERT_RC(ct__cuda_calloc_release(a, r), CT_EFOREIGN, "records no event");
    dev.fail_events = false;
    void *s = alloc(a, 4096, STREAM_A);
    ASSERT_TRUE(s != r);
    ASSERT_RC(ct__cuda_calloc_record_stream(a, (char *)s + 512, STREAM_B), CT_EINVAL,
              "not a live block");
    ct__cuda_calloc_free(a);
    ASSERT_EQ(dev.live, 0);
    ASSERT_EQ(dev.events_live, 0);
}

TEST(out_of_memory_returns_the_cache_first_then_says_what_is_held) {
    ct__calloc *a = new_allocator(64 * MiB);
    void *big = alloc(a, 40 * MiB, STREAM_A);
    ASSERT_EQ(ct__cuda_calloc_release(a, big), 0);
    /* 40 MiB cached + 50 MiB does not fit; the cached segment goes. */
    void *p = alloc(a, 50 * MiB, STREAM_A);
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ(stats(a).reserved, (int64_t)(50 * MiB));
    void *q = NULL;
    ASSERT_RC(ct__cuda_calloc_alloc(a, 30 * MiB, STREAM_A, &q), CT_ENOMEM,
              "CUDA out of memory on device 0", "tried to allocate 30.00 MiB",
              "50.00 MiB allocated", "50.00 MiB reserved", "14.00 MiB free of 64.00 MiB");
    ASSERT_TRUE(q == NULL);
    ASSERT_EQ(stats(a).ooms, 1);
    ASSERT_RC(ct__cuda_calloc_alloc(a, SIZE_MAX, STREAM_A, &q), CT_ENOMEM, "out of memory");
    ct__cuda_calloc_free(a);
    ASSERT_EQ(dev.live, 0);
}

TEST(bad_pointers_and_double_frees_are_refused) {
    ct__calloc *a = new_allocator(1 << 30);
    int x;
    ASSERT_RC(ct__cuda_calloc_release(a, &x), CT_EINVAL, "was not allocated here");
    void *p = alloc(a, 100, STREAM_A);
    ASSERT_EQ(ct__cuda_calloc_release(a, p), 0);
    ASSERT_RC(ct__cuda_calloc_release(a, p), CT_EINVAL, "freed already");
    ASSERT_EQ(ct__cuda_calloc_release(a, NULL), 0);
    void *z = &x;
    ASSERT_EQ(ct__cuda_calloc_alloc(a, 0, STREAM_A, &z), 0);
    ASSERT_TRUE(z == NULL);
    ct__cuda_calloc_free(a);
}

TEST(peaks_follow_the_high_water_mark_until_reset) {
    ct__calloc *a = new_allocator(1 << 30);
    void *p = alloc(a, 3 * MiB, STREAM_A);
    ASSERT_EQ(ct__cuda_calloc_release(a, p), 0);
    ASSERT_EQ(stats(a).peak_allocated, (int64_t)(3 * MiB));
    ct__cuda_calloc_reset_peak(a);
    ASSERT_EQ(stats(a).peak_allocated, 0);
    ASSERT_EQ(stats(a).peak_reserved, (int64_t)(20 * MiB));
    ct__cuda_calloc_free(a);
}

/* Random allocations and frees on two streams: live blocks never overlap,
 * the counts add up, and everything goes back. */
TEST(random_traffic_keeps_blocks_apart_and_counts_exact) {
    ct__calloc *a = new_allocator((size_t)4 << 30);
    enum { N = 200 };
    struct {
        char *p;
        size_t n;
    } live[N] = {{0}};
    uint64_t s = 12345;
    for (int step = 0; step < 20000 && !tt_failed(); step++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((s >> 33) % N);
        if (live[i].p) {
            ASSERT_EQ(ct__cuda_calloc_release(a, live[i].p), 0);
            live[i].p = NULL;
            continue;
        }
        size_t shift = (s >> 20) % 24;
        size_t n = 1 + (size_t)((s >> 40) % ((size_t)1 << shift));
        live[i].p = alloc(a, n, (s >> 13) & 1 ? STREAM_A : STREAM_B);
        live[i].n = n;
        memset(live[i].p, i, n); /* ASan: inside its segment */
        for (int j = 0; j < N; j++)
            if (j != i && live[j].p && live[j].p < live[i].p + n &&
                live[i].p < live[j].p + live[j].n)
                tt_fail(__FILE__, __LINE__, "blocks %d and %d overlap", i, j);
    }
    int64_t want = 0;
    for (int i = 0; i < N; i++)
        want += live[i].p ? (int64_t)live[i].n : 0;
    ASSERT_EQ(stats(a).requested, want);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(ct__cuda_calloc_release(a, live[i].p), 0);
    ASSERT_EQ(stats(a).allocated, 0);
    ASSERT_EQ(ct__cuda_calloc_empty_cache(a), 0);
    ASSERT_EQ(stats(a).reserved, 0);
    ASSERT_EQ(dev.live, 0);
    ct__cuda_calloc_free(a);
}
