/* The batch loader. A background thread gathers rows in the sampler's order
 * into fresh storages; the caller's thread wraps each as tensors.
 *
 * Order. One producer builds items strictly in sequence and a ring queue
 * hands them over in sequence, so the batches never depend on thread timing.
 * A restart (set_position) bumps a generation and empties the queue under
 * the lock; the producer drops whatever it built for an older generation.
 * The end of an epoch travels through the queue as an item of its own, so
 * the producer runs on into the next epoch without waiting for the caller.
 *
 * Buffers. Every batch gets its own storage. The caller may keep a batch
 * (ct_keep) for as long as it likes, so reusing a buffer would need proof
 * that every tensor on it is gone; a fresh storage makes each batch an
 * ordinary tensor with nothing shared. ct_storage_new is thread-safe, and
 * ct's allocator caches large blocks, so a steady stream of same-sized
 * batches does not go back to the kernel.
 *
 * Scopes. The producer makes tensors only for the transform, inside a scope
 * it opens and closes on its own thread; the caller's tensors are made on
 * the caller's thread, in the caller's scope. */
#include <ct/data.h>

#include "base_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOADER_MAGIC     0x63744c31u /* "ctL1" */
#define LOADER_DEAD      0xdeadc7c8u
#define DEFAULT_PREFETCH 2
#define MAX_PREFETCH     64
#define MSG_MAX          1024

/* One of the tensors batches are cut from. */
typedef struct source {
    ct_tensor *t;       /* the loader's reference; rows contiguous */
    const char *row0;   /* element [0, ..., 0] */
    int64_t row_stride; /* bytes from one row to the next (0 for an expanded dim 0) */
    size_t row_bytes;
} source;

typedef enum item_kind { ITEM_BATCH, ITEM_END, ITEM_ERROR } item_kind;

typedef struct item {
    item_kind kind;
    ct_storage *data[2]; /* ITEM_BATCH: one per source */
    int64_t rows;
    int64_t epoch, offset; /* the position after this item */
    int err;               /* ITEM_ERROR */
} item;

struct ct_loader {
    uint32_t magic;
    source src[2];
    int nsrc;
    int64_t batch_size;
    bool drop_last;
    int depth;
    ct_loader_transform_fn transform;
    void *transform_ctx;
    /* The order; its position is what the caller has consumed (caller's
     * thread only). The producer reads only the fields that never change. */
    ct_sampler sampler;
    int64_t *indices; /* the producer's: one epoch's indices */

    /* The caller's: a failure repeated until a restart. */
    int failed;
    char failmsg[MSG_MAX];

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* an item pushed or popped, a restart, stop */
    /* Under lock. */
    item *ring;
    int head, count;
    uint64_t gen; /* bumped by every restart */
    int64_t start_epoch, start_offset;
    bool stop;
    char bgmsg[MSG_MAX]; /* the message of the ITEM_ERROR in the queue */
};

static void item_release(item *it) {
    for (int k = 0; k < 2; k++)
        ct_storage_free(it->data[k]);
    *it = (item){0};
}

/* Empties the queue; the lock is held. */
static void drain(ct_loader *l) {
    for (; l->count > 0; l->count--, l->head = (l->head + 1) % l->depth)
        item_release(&l->ring[l->head]);
}

/* ------------------------------------------------------------- producer */

/* State only the producer thread touches. */
typedef struct producer {
    int64_t indices_epoch; /* whose indices l->indices holds, -1: none */
    char msg[MSG_MAX];
} producer;

/* Turns *it into the error item for the batch at (epoch, offset), with this
 * thread's message. */
static void fail_item(const ct_loader *l, producer *p, item *it, int64_t epoch, int64_t offset,
                      int code) {
    snprintf(p->msg, sizeof p->msg, "loader: epoch %lld, batch %lld (rows from %lld): %s",
             (long long)epoch, (long long)(offset / l->batch_size), (long long)offset, ct_errmsg());
    *it = (item){.kind = ITEM_ERROR, .epoch = epoch, .offset = offset, .err = code};
}

/* The batch's tensors on storages st, for the transform (scope-owned). */
static ct_tensor *wrap_source(const source *s, ct_storage *st, int64_t rows) {
    int64_t sizes[CT_MAX_DIMS];
    int nd = ct_ndim(s->t);
    memcpy(sizes, ct_sizes(s->t), sizeof(int64_t) * (size_t)nd);
    sizes[0] = rows;
    return ct_tensor_from_storage(st, 0, nd, sizes, NULL, ct_tensor_dtype(s->t));
}

static int run_transform(ct_loader *l, item *it, int64_t epoch, int64_t offset) {
    ct_scope_begin();
    ct_tensor *t[2] = {NULL, NULL};
    bool ok = true;
    for (int k = 0; k < l->nsrc; k++)
        ok &= (t[k] = wrap_source(&l->src[k], it->data[k], it->rows)) != NULL;
    int rc = ok ? 0 : ct_errcode();
    if (ok) {
        ct_errclear();
        rc = l->transform(l->transform_ctx, t[0], t[1], epoch, offset / l->batch_size);
        if (rc < 0)
            ct__err_set(rc, "the transform returned %s%s%s", ct_errname(rc),
                        *ct_errmsg() ? ": " : "", ct_errmsg());
        else
            rc = 0;
    }
    ct_scope_end();
    return rc;
}

/* Builds the item at (epoch, offset): a batch, or the end of the epoch. */
static void make_item(ct_loader *l, producer *p, int64_t epoch, int64_t offset, item *it) {
    int64_t len = l->sampler.num_samples;
    int64_t rows = len - offset < l->batch_size ? len - offset : l->batch_size;
    if (rows == 0 || (l->drop_last && rows < l->batch_size)) {
        *it = (item){.kind = ITEM_END, .epoch = epoch + 1, .offset = 0};
        return;
    }
    if (p->indices_epoch != epoch) {
        p->indices_epoch = -1;
        int rc = ct_sampler_indices(&l->sampler, epoch, l->indices);
        if (rc) {
            fail_item(l, p, it, epoch, offset, rc);
            return;
        }
        p->indices_epoch = epoch;
    }
    *it = (item){.kind = ITEM_BATCH, .rows = rows, .epoch = epoch, .offset = offset + rows};
    const int64_t *idx = l->indices + offset;
    for (int k = 0; k < l->nsrc; k++) {
        const source *s = &l->src[k];
        it->data[k] = ct_storage_new((size_t)rows * s->row_bytes, CT_DEVICE_CPU);
        if (!it->data[k]) {
            item_release(it);
            fail_item(l, p, it, epoch, offset, ct_errcode());
            return;
        }
        char *dst = ct_storage_data(it->data[k]);
        for (int64_t i = 0; i < rows; i++)
            memcpy(dst + (size_t)i * s->row_bytes, s->row0 + idx[i] * s->row_stride, s->row_bytes);
    }
    if (l->transform) {
        int rc = run_transform(l, it, epoch, offset);
        if (rc) {
            item_release(it);
            fail_item(l, p, it, epoch, offset, rc);
        }
    }
}

static void *produce(void *arg) {
    ct_loader *l = arg;
    producer p = {.indices_epoch = -1};
    uint64_t gen = 0;
    int64_t epoch = 0, offset = 0;
    bool parked = false; /* after an error, until a restart */
    pthread_mutex_lock(&l->lock);
    while (!l->stop) {
        if (gen != l->gen) {
            gen = l->gen;
            epoch = l->start_epoch;
            offset = l->start_offset;
            parked = false;
        }
        if (parked || l->count == l->depth) {
            pthread_cond_wait(&l->changed, &l->lock);
            continue;
        }
        pthread_mutex_unlock(&l->lock);
        item it;
        make_item(l, &p, epoch, offset, &it);
        pthread_mutex_lock(&l->lock);
        if (gen != l->gen || l->stop) {
            item_release(&it);
            continue;
        }
        if (it.kind == ITEM_ERROR) {
            memcpy(l->bgmsg, p.msg, sizeof p.msg);
            parked = true;
        }
        l->ring[(l->head + l->count) % l->depth] = it;
        l->count++;
        pthread_cond_broadcast(&l->changed);
        epoch = it.epoch;
        offset = it.offset;
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

/* ------------------------------------------------------------- the API */

static int check(const char *fn, const ct_loader *l) {
    if (!l)
        return ct__err_set(CT_EINVAL, "%s: loader is NULL", fn);
    if (l->magic != LOADER_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live loader (freed or foreign)", fn,
                           (const void *)l);
    return 0;
}

static bool rows_contiguous(const ct_tensor *t) {
    int64_t expect = 1;
    for (int d = ct_ndim(t) - 1; d >= 1; d--) {
        if (ct_size(t, d) != 1 && ct_stride(t, d) != expect)
            return false;
        expect *= ct_size(t, d);
    }
    return true;
}

/* Takes the loader's reference to t, copying it first if its rows are not
 * contiguous. */
static int source_init(source *s, ct_tensor *t) {
    ct_scope_begin();
    ct_tensor *c = rows_contiguous(t) ? t : ct_contiguous(t);
    s->t = c ? ct_tensor_retain(c) : NULL;
    ct_scope_end();
    if (!s->t)
        return ct__err_set(ct_errcode(), "loader_new: copying rows: %s", ct_errmsg());
    size_t esize = ct_dtype_size(ct_tensor_dtype(s->t));
    s->row0 = ct_data_ptr(s->t);
    s->row_stride = ct_stride(s->t, 0) * (int64_t)esize;
    s->row_bytes = esize;
    for (int d = 1; d < ct_ndim(s->t); d++)
        s->row_bytes *= (size_t)ct_size(s->t, d);
    return 0;
}

/* Checks everything ct_loader_new is given; fills *order. */
static int check_new(ct_tensor *inputs, ct_tensor *targets, const ct_loader_options *opts,
                     ct_sampler *order) {
    int rc = targets ? CT__CHECK("loader_new", inputs, targets) : CT__CHECK("loader_new", inputs);
    if (rc)
        return rc;
    if (!opts)
        return ct__err_set(CT_EINVAL, "loader_new: options are NULL");
    if (opts->batch_size < 1)
        return ct__err_set(CT_EINVAL, "loader_new: batch_size is %lld; expected >= 1",
                           (long long)opts->batch_size);
    if (opts->prefetch < 0 || opts->prefetch > MAX_PREFETCH)
        return ct__err_set(CT_EINVAL, "loader_new: prefetch is %d; expected 1 to %d (0 means %d)",
                           opts->prefetch, MAX_PREFETCH, DEFAULT_PREFETCH);
    char a[CT__DESC_STR], b[CT__DESC_STR];
    if (ct_ndim(inputs) < 1 || (targets && ct_ndim(targets) < 1))
        return ct__err_set(
            CT_ESHAPE, "loader_new: inputs %s and targets %s must have a first dim of rows",
            ct__tensor_desc(a, inputs), targets ? ct__tensor_desc(b, targets) : "(none)");
    int64_t n = ct_size(inputs, 0);
    if (targets && ct_size(targets, 0) != n)
        return ct__err_set(CT_ESHAPE,
                           "loader_new: inputs %s and targets %s differ in their number of rows "
                           "(%lld vs %lld)",
                           ct__tensor_desc(a, inputs), ct__tensor_desc(b, targets), (long long)n,
                           (long long)ct_size(targets, 0));
    if (!opts->sampler)
        return ct_sampler_init(order, &(ct_sampler_options){.size = n});
    if (ct_sampler_len(opts->sampler) < 0)
        return ct__err_set(CT_EINVAL, "loader_new: %s", ct_errmsg());
    if (opts->sampler->opts.size != n)
        return ct__err_set(
            CT_ESHAPE, "loader_new: the sampler covers %lld rows but inputs %s have %lld",
            (long long)opts->sampler->opts.size, ct__tensor_desc(a, inputs), (long long)n);
    *order = *opts->sampler;
    return 0;
}

ct_loader *ct_loader_new(ct_tensor *inputs, ct_tensor *targets, const ct_loader_options *opts) {
    ct_sampler order;
    if (check_new(inputs, targets, opts, &order))
        return NULL;
    ct_loader *l = calloc(1, sizeof *l);
    int depth = opts->prefetch ? opts->prefetch : DEFAULT_PREFETCH;
    size_t nidx = order.num_samples > 0 ? (size_t)order.num_samples : 1;
    if (l) {
        l->ring = calloc((size_t)depth, sizeof *l->ring);
        l->indices = (uint64_t)order.num_samples < SIZE_MAX / sizeof(int64_t)
                         ? malloc(nidx * sizeof(int64_t))
                         : NULL;
    }
    if (!l || !l->ring || !l->indices) {
        ct__err_set(CT_ENOMEM, "loader_new: out of memory for %lld indices and %d queue slots",
                    (long long)order.num_samples, depth);
        goto fail;
    }
    l->sampler = order;
    l->batch_size = opts->batch_size;
    l->drop_last = opts->drop_last;
    l->depth = depth;
    l->transform = opts->transform;
    l->transform_ctx = opts->transform_ctx;
    l->nsrc = targets ? 2 : 1;
    if (source_init(&l->src[0], inputs) || (targets && source_init(&l->src[1], targets)))
        goto fail;
    l->gen = 1;
    l->start_epoch = order.epoch;
    l->start_offset = order.offset;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->changed, NULL);
    int err = pthread_create(&l->thread, NULL, produce, l);
    if (err) {
        ct__err_set(CT_ENOMEM, "loader_new: cannot start the background thread: %s", strerror(err));
        pthread_cond_destroy(&l->changed);
        pthread_mutex_destroy(&l->lock);
        goto fail;
    }
    l->magic = LOADER_MAGIC;
    return l;
fail:
    if (l) {
        ct_tensor_free(l->src[0].t);
        ct_tensor_free(l->src[1].t);
        free(l->indices);
        free(l->ring);
        free(l);
    }
    return NULL;
}

void ct_loader_free(ct_loader *l) {
    if (!l)
        return;
    CT_ASSERT(l->magic == LOADER_MAGIC);
    pthread_mutex_lock(&l->lock);
    l->stop = true;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    drain(l);
    pthread_cond_destroy(&l->changed);
    pthread_mutex_destroy(&l->lock);
    for (int k = 0; k < l->nsrc; k++)
        ct_tensor_free(l->src[k].t);
    free(l->indices);
    free(l->ring);
    l->magic = LOADER_DEAD;
    free(l);
}

/* Wraps a batch's storages as tensors owned like op results. */
static int hand_out(ct_loader *l, item *it, ct_tensor **x, ct_tensor **y) {
    ct_tensor *t[2] = {NULL, NULL};
    ct_scope_begin();
    bool ok = true;
    for (int k = 0; k < l->nsrc; k++)
        ok &= (t[k] = wrap_source(&l->src[k], it->data[k], it->rows)) != NULL;
    int rc = ok ? 0 : ct__err_set(ct_errcode(), "loader_next: %s", ct_errmsg());
    for (int k = 0; ok && k < l->nsrc; k++)
        t[k] = ct_keep(t[k]);
    ct_scope_end();
    if (ok) {
        *x = t[0];
        if (y)
            *y = t[1];
    }
    return rc;
}

int ct_loader_next(ct_loader *l, ct_tensor **x, ct_tensor **y) {
    int rc = check("loader_next", l);
    if (rc)
        return rc;
    if (!x)
        return ct__err_set(CT_EINVAL, "loader_next: x is NULL");
    if (l->nsrc == 2 && !y)
        return ct__err_set(CT_EINVAL, "loader_next: y is NULL but the loader has targets");
    *x = NULL;
    if (y)
        *y = NULL;
    if (l->failed)
        return ct__err_set(l->failed, "%s", l->failmsg);
    pthread_mutex_lock(&l->lock);
    while (l->count == 0)
        pthread_cond_wait(&l->changed, &l->lock);
    item it = l->ring[l->head];
    l->ring[l->head] = (item){0};
    l->head = (l->head + 1) % l->depth;
    l->count--;
    if (it.kind == ITEM_ERROR)
        memcpy(l->failmsg, l->bgmsg, sizeof l->failmsg);
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);

    switch (it.kind) {
    case ITEM_ERROR: l->failed = it.err; return ct__err_set(it.err, "%s", l->failmsg);
    case ITEM_END:
        l->sampler.epoch = it.epoch;
        l->sampler.offset = it.offset;
        return 0;
    case ITEM_BATCH: break;
    }
    /* A batch that cannot be handed out is lost to the queue; failing until
     * a restart keeps the position before it, so none is skipped. */
    rc = hand_out(l, &it, x, y);
    if (rc) {
        l->failed = rc;
        snprintf(l->failmsg, sizeof l->failmsg, "%s", ct_errmsg());
    } else {
        l->sampler.epoch = it.epoch;
        l->sampler.offset = it.offset;
    }
    item_release(&it);
    return rc ? rc : 1;
}

int64_t ct_loader_num_batches(const ct_loader *l) {
    if (check("loader_num_batches", l))
        return -1;
    int64_t len = l->sampler.num_samples;
    return len / l->batch_size + (!l->drop_last && len % l->batch_size != 0);
}

int ct_loader_set_epoch(ct_loader *l, int64_t epoch) { return ct_loader_set_position(l, epoch, 0); }

int ct_loader_set_position(ct_loader *l, int64_t epoch, int64_t offset) {
    int rc = check("loader_set_position", l);
    if (rc)
        return rc;
    ct_sampler moved = l->sampler;
    if ((rc = ct_sampler_set_position(&moved, epoch, offset)))
        return ct__err_set(rc, "loader_set_position: %s", ct_errmsg());
    pthread_mutex_lock(&l->lock);
    drain(l);
    l->gen++;
    l->start_epoch = epoch;
    l->start_offset = offset;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    /* Only the position: the producer reads the rest of the sampler. */
    l->sampler.epoch = epoch;
    l->sampler.offset = offset;
    l->failed = 0;
    return 0;
}

int ct_loader_position(const ct_loader *l, int64_t *epoch, int64_t *offset) {
    int rc = check("loader_position", l);
    return rc ? rc : ct_sampler_position(&l->sampler, epoch, offset);
}
