/* The test device (testdev.h): the CPU's kernels over memory that host code
 * cannot read, run in stream order when the host waits. Each storage is its
 * own anonymous mapping, PROT_NONE except while the device runs queued work
 * or a copy to the host; an op that reaches device memory without going
 * through the table faults.
 *
 * A kernel entry copies its arguments into a call and queues it on the
 * compute stream: the tensors' headers (the caller may free them as soon as
 * the entry returns, as a GPU's launch copies its arguments), a host
 * storage's reference (it is the host's memory, not the stream's), and what
 * its pointers point to. A device storage's memory is not referenced: its
 * free is stream-ordered instead, a marker queued behind the work that may
 * use it, as CUDA's caching allocator reuses a block only in stream order.
 * The queue runs on the thread that waits for it, so every run of a test
 * sees the same order, and TSan sees the hand-over through one lock. */
#include "testdev.h"

#include "cpu_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The most tensors one entry takes (a layer norm's backward has 8). */
#define MAX_OPERANDS 12
/* The most pointers to other objects one entry takes. */
#define MAX_OBJECTS 4
/* How far the host runs ahead of the compute stream, in queued calls,
 * before a launch waits: a GPU's launch queue fills up too. */
#define MAX_QUEUED 1024
/* Streams, by bit: 0 the compute stream, the others side streams. */
#define MAX_STREAMS 64

typedef struct region {
    void *p;
    size_t len, nbytes;
    int holds;         /* markers queued that must run before it is unmapped */
    uint64_t recorded; /* the side streams record_stream named, by bit */
    struct region *next;
} region;

typedef struct call call;

struct testdev_stream {
    pthread_mutex_t run;  /* held by the thread that runs its work */
    call *head, *tail;    /* the queue, under lock */
    int64_t queued, done; /* the last call queued and run, under lock */
    int bit;
    int error; /* the first queued kernel that failed, for the next wait */
    char message[256];
};

/* Work on a stream: an entry's kernel (run), a side stream's work (fn), or
 * a marker that drops a hold on release once what came before has run. */
struct call {
    call *next;
    int64_t seq;
    int (*run)(call *c);
    void (*fn)(void *ctx);
    void *ctx;
    testdev_stream *after; /* side work waits for this stream's work up to after_seq */
    int64_t after_seq;
    region *release;
    region *uses[MAX_OPERANDS]; /* side work's memory */
    int nuses;
    /* The operands, copied: orig[i]'s header is t[i]; a device storage's
     * header sorig[j] is s[j]; held are host storages' references. */
    int nt, ns, nheld, nobj;
    ct_tensor *orig[MAX_OPERANDS];
    ct_tensor t[MAX_OPERANDS];
    const ct_storage *sorig[MAX_OPERANDS];
    ct_storage s[MAX_OPERANDS];
    ct_storage *held[MAX_OPERANDS];
    void *obj[MAX_OBJECTS];
};

/* The live mappings, the queues and the side streams; open counts the
 * threads running the device's work. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static region *regions;
static int open_count;
static testdev_stream compute = {.run = PTHREAD_MUTEX_INITIALIZER};
static testdev_stream *sides[MAX_STREAMS];
static atomic_llong allocated, peak;
/* Whether this thread is running queued work: an entry called from there
 * runs at once, in the order it is reached. */
static _Thread_local bool running;

static void protect_all(int prot) {
    for (region *r = regions; r; r = r->next)
        if (mprotect(r->p, r->len, prot))
            abort();
}

/* The device's memory is readable from here to leave(). */
static void enter(void) {
    pthread_mutex_lock(&lock);
    if (open_count++ == 0)
        protect_all(PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&lock);
}

static void leave(void) {
    pthread_mutex_lock(&lock);
    if (--open_count == 0)
        protect_all(PROT_NONE);
    pthread_mutex_unlock(&lock);
}

static void unmap_locked(region *r) {
    for (region **at = &regions; *at; at = &(*at)->next)
        if (*at == r) {
            *at = r->next;
            break;
        }
    munmap(r->p, r->len);
    free(r);
}

static void push_locked(testdev_stream *s, call *c) {
    c->seq = ++s->queued;
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
}

/* Queues on s a marker that releases r once s's work so far has run. */
static void hold_locked(testdev_stream *s, region *r) {
    call *m = calloc(1, sizeof *m);
    if (!m) {
        fprintf(stderr, "test device: out of memory queueing a free\n");
        abort();
    }
    m->release = r;
    r->holds++;
    push_locked(s, m);
}

static bool uses_locked(const testdev_stream *s, const region *r) {
    for (const call *c = s->head; c; c = c->next)
        for (int i = 0; i < c->nuses; i++)
            if (c->uses[i] == r)
                return true;
    return false;
}

static void call_free(call *c) {
    for (int i = 0; i < c->nheld; i++)
        ct_storage_free(c->held[i]);
    for (int i = 0; i < c->nobj; i++)
        free(c->obj[i]);
    free(c);
}

/* Runs s's calls up to seq upto, in order, on this thread. */
static void run_queue(testdev_stream *s, int64_t upto) {
    pthread_mutex_lock(&s->run);
    bool was = running;
    running = true;
    enter();
    for (;;) {
        pthread_mutex_lock(&lock);
        call *c = s->head && s->head->seq <= upto ? s->head : NULL;
        if (c && !(s->head = c->next))
            s->tail = NULL;
        pthread_mutex_unlock(&lock);
        if (!c)
            break;
        if (c->after)
            run_queue(c->after, c->after_seq);
        if (c->fn)
            c->fn(c->ctx);
        int rc = c->run ? c->run(c) : 0;
        pthread_mutex_lock(&lock);
        if (rc && !s->error) {
            s->error = rc;
            snprintf(s->message, sizeof s->message, "%s", ct_errmsg());
        }
        if (c->release && --c->release->holds == 0)
            unmap_locked(c->release);
        s->done = c->seq;
        pthread_mutex_unlock(&lock);
        call_free(c);
    }
    leave();
    running = was;
    pthread_mutex_unlock(&s->run);
}

/* Waits for the work queued on s so far: 0, or the first queued kernel's
 * failure since the last wait (as CUDA reports a kernel's error at a later
 * call). */
static int stream_wait(testdev_stream *s) {
    if (!running) {
        pthread_mutex_lock(&lock);
        int64_t upto = s->queued;
        pthread_mutex_unlock(&lock);
        run_queue(s, upto);
    }
    char message[sizeof s->message];
    pthread_mutex_lock(&lock);
    int rc = s->error;
    memcpy(message, s->message, sizeof message);
    s->error = 0;
    pthread_mutex_unlock(&lock);
    return rc ? ct__err_set(rc, "test device: a kernel queued earlier failed: %s", message) : 0;
}

/* Queues c on the compute stream, or runs it now on a thread that is
 * running the stream's work. */
static int launch(call *c) {
    if (running) {
        int rc = c->run(c);
        call_free(c);
        return rc;
    }
    pthread_mutex_lock(&lock);
    push_locked(&compute, c);
    bool full = compute.queued - compute.done > MAX_QUEUED;
    int64_t upto = compute.queued;
    pthread_mutex_unlock(&lock);
    if (full)
        run_queue(&compute, upto);
    return 0;
}

static void *call_new(size_t size, int (*run)(call *)) {
    call *c = calloc(1, size);
    if (!c) {
        ct__err_set(CT_ENOMEM, "test device: out of memory queueing a kernel");
        return NULL;
    }
    c->run = run;
    return c;
}

/* t's header as the call keeps it. One tensor, or one storage, given twice
 * is copied once, so that kernels that compare them (in place, overlaps)
 * see what they were given. */
static ct_tensor *operand(call *c, ct_tensor *t) {
    if (!t)
        return NULL;
    for (int i = 0; i < c->nt; i++)
        if (c->orig[i] == t)
            return &c->t[i];
    CT_ASSERT(c->nt < MAX_OPERANDS);
    ct_storage *s = t->storage;
    if (ct__is_host(s->device)) {
        int i = 0;
        while (i < c->nheld && c->held[i] != s)
            i++;
        if (i == c->nheld)
            c->held[c->nheld++] = ct_storage_retain(s);
    } else {
        int j = 0;
        while (j < c->ns && c->sorig[j] != s)
            j++;
        if (j == c->ns) {
            c->sorig[c->ns++] = s;
            c->s[j].data = s->data;
            c->s[j].nbytes = s->nbytes;
            c->s[j].device = s->device;
        }
        s = &c->s[j];
    }
    c->orig[c->nt] = t;
    ct_tensor *v = &c->t[c->nt++];
    *v = ct__layout_view(t, t->ndim, t->sizes, t->strides, t->offset);
    v->storage = s;
    return v;
}

/* Copies an entry's argument at arg into its field of the call (fsize
 * bytes): a tensor as operand() does; an array parameter (array, an array
 * field) as its elements; a pointer to one object of objsize bytes as a
 * copy of the object; anything else as its value. */
static void capture(call *c, void *field, size_t fsize, const void *arg, bool tensor, bool array,
                    size_t objsize) {
    if (tensor) {
        ct_tensor *v = operand(c, *(ct_tensor *const *)arg);
        memcpy(field, &v, sizeof v);
        return;
    }
    if (!objsize) {
        memcpy(field, arg, fsize);
        return;
    }
    const void *src = *(const void *const *)arg;
    if (array) {
        CT_ASSERT(src);
        memcpy(field, src, fsize);
        return;
    }
    void *copy = NULL;
    if (src) {
        CT_ASSERT(c->nobj < MAX_OBJECTS);
        copy = malloc(objsize);
        CT_ASSERT(copy);
        memcpy(copy, src, objsize);
        c->obj[c->nobj++] = copy;
    }
    memcpy(field, &copy, sizeof copy);
}

/* The pointer types entries take besides tensors, by the size of what they
 * point to. A pointer of a type not listed here is kept as it is: list it
 * when an entry takes one. */
#define TD_OBJSIZE(x)                                                                              \
    _Generic((x),                                                                                  \
        const ct__reduction *: sizeof(ct__reduction),                                              \
        const ct__mm_plan *: sizeof(ct__mm_plan),                                                  \
        const ct__draw *: sizeof(ct__draw),                                                        \
        const ct__attention *: sizeof(ct__attention),                                              \
        const uint64_t *: sizeof(uint64_t),                                                        \
        const int64_t *: sizeof(int64_t),                                                          \
        const double *: sizeof(double),                                                            \
        const bool *: sizeof(bool),                                                                \
        default: (size_t)0)

/* The 13th argument: the count, when TD_N appends 12 down to 1. */
#define TD_N_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, n, ...) n
/* TD_N(...): how many arguments, up to 12. */
#define TD_N(...) TD_N_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
/* TD_EACH(m, sep, a, b, ...): m(a) sep() m(b) ..., for up to 12. */
#define TD_CAT(a, b)    TD_CAT_(a, b)
#define TD_CAT_(a, b)   a##b
#define TD_UNPAREN(...) __VA_ARGS__
#define TD_COMMA()      ,
#define TD_NONE()
#define TD_EACH(m, sep, ...)       TD_CAT(TD_EACH_, TD_N(__VA_ARGS__))(m, sep, __VA_ARGS__)
#define TD_EACH_1(m, sep, x)       m(x)
#define TD_EACH_2(m, sep, x, ...)  m(x) sep() TD_EACH_1(m, sep, __VA_ARGS__)
#define TD_EACH_3(m, sep, x, ...)  m(x) sep() TD_EACH_2(m, sep, __VA_ARGS__)
#define TD_EACH_4(m, sep, x, ...)  m(x) sep() TD_EACH_3(m, sep, __VA_ARGS__)
#define TD_EACH_5(m, sep, x, ...)  m(x) sep() TD_EACH_4(m, sep, __VA_ARGS__)
#define TD_EACH_6(m, sep, x, ...)  m(x) sep() TD_EACH_5(m, sep, __VA_ARGS__)
#define TD_EACH_7(m, sep, x, ...)  m(x) sep() TD_EACH_6(m, sep, __VA_ARGS__)
#define TD_EACH_8(m, sep, x, ...)  m(x) sep() TD_EACH_7(m, sep, __VA_ARGS__)
#define TD_EACH_9(m, sep, x, ...)  m(x) sep() TD_EACH_8(m, sep, __VA_ARGS__)
#define TD_EACH_10(m, sep, x, ...) m(x) sep() TD_EACH_9(m, sep, __VA_ARGS__)
#define TD_EACH_11(m, sep, x, ...) m(x) sep() TD_EACH_10(m, sep, __VA_ARGS__)
#define TD_EACH_12(m, sep, x, ...) m(x) sep() TD_EACH_11(m, sep, __VA_ARGS__)
#define TD_FIELD(decl)             decl;
#define TD_ARG(name)               c->name
#define TD_CAPTURE(name)                                                                           \
    capture(&c->head, (void *)&c->name, sizeof c->name, &name,                                     \
            _Generic((name), ct_tensor *                                                           \
                     : true, default                                                               \
                     : false),                                                                     \
            !__builtin_types_compatible_p(__typeof__(c->name), __typeof__(name)),                  \
            TD_OBJSIZE(name));

/* dev_NAME, with params: queues kernel(args) on the compute stream, its
 * arguments copied into a call (capture). Array parameters are declared
 * with their length, so that the copy knows it. */
#define QUEUED(name, kernel, params, args)                                                         \
    typedef struct name##_call {                                                                   \
        call head;                                                                                 \
        TD_EACH(TD_FIELD, TD_NONE, TD_UNPAREN params)                                              \
    } name##_call;                                                                                 \
    static int name##_run(call *head) {                                                            \
        name##_call *c = (name##_call *)head;                                                      \
        return kernel(TD_EACH(TD_ARG, TD_COMMA, TD_UNPAREN args));                                 \
    }                                                                                              \
    static int dev_##name params {                                                                 \
        name##_call *c = call_new(sizeof *c, name##_run);                                          \
        if (!c)                                                                                    \
            return ct_errcode();                                                                   \
        TD_EACH(TD_CAPTURE, TD_NONE, TD_UNPAREN args)                                              \
        return launch(&c->head);                                                                   \
    }

/* Each kernel entry: the CPU's, queued. */
#define ENTRY(name, params, args) QUEUED(name, ct__cpu_##name, params, args)

/* An entry whose answer the host waits for: the CPU's, after the queue. */
#define WAITED(name, params, args)                                                                 \
    static int dev_##name params {                                                                 \
        int rc = stream_wait(&compute);                                                            \
        if (rc)                                                                                    \
            return rc;                                                                             \
        enter();                                                                                   \
        rc = ct__cpu_##name args;                                                                  \
        leave();                                                                                   \
        return rc;                                                                                 \
    }

/* ------------------------------------------------------------- memory */

/* The storage's last reference is gone: its bytes leave the statistics
 * now; its memory is unmapped once the work queued before has run. */
static void release(void *data, void *ctx) {
    (void)data;
    region *r = ctx;
    atomic_fetch_sub(&allocated, (long long)r->nbytes);
    pthread_mutex_lock(&lock);
    for (int b = 1; b < MAX_STREAMS; b++) {
        if (!sides[b])
            continue;
        if (!(r->recorded >> b & 1) && uses_locked(sides[b], r)) {
            fprintf(stderr,
                    "test device: a storage of %zu bytes is freed while side stream %d still has "
                    "work queued that uses it, and no record_stream marked it for that stream: "
                    "CUDA's caching allocator would reuse the memory under that work\n",
                    r->nbytes, b);
            abort();
        }
        if (r->recorded >> b & 1)
            hold_locked(sides[b], r);
    }
    if (compute.head)
        hold_locked(&compute, r);
    if (r->holds == 0)
        unmap_locked(r);
    pthread_mutex_unlock(&lock);
}

static region *region_of(const ct_storage *s) { return s->free_fn == release ? s->free_ctx : NULL; }

static ct_storage *dev_storage_new(const char *op, size_t nbytes, int index) {
    if (index != 0) {
        ct__err_set(CT_EDEVICE, "%s: test:%d: no such device (the test device is test:0)", op,
                    index);
        return NULL;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (nbytes + page - 1) / page * page;
    region *r = malloc(sizeof *r);
    void *p = r ? mmap(NULL, len ? len : page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                : MAP_FAILED;
    if (p == MAP_FAILED) {
        free(r);
        ct__err_set(CT_ENOMEM, "%s: the test device is out of memory for %zu bytes", op, nbytes);
        return NULL;
    }
    *r = (region){.p = p, .len = len ? len : page, .nbytes = nbytes};
    pthread_mutex_lock(&lock);
    r->next = regions;
    regions = r;
    if (open_count > 0 && mprotect(p, r->len, PROT_READ | PROT_WRITE))
        abort();
    pthread_mutex_unlock(&lock);
    long long now = atomic_fetch_add(&allocated, (long long)nbytes) + (long long)nbytes;
    for (long long was = atomic_load(&peak);
         now > was && !atomic_compare_exchange_weak(&peak, &was, now);)
        ;
    ct_storage *s = ct_storage_from_blob(p, nbytes, CT_DEVICE_TEST, release, r);
    if (!s)
        release(p, r);
    return s;
}

static int64_t dev_allocated(int index) {
    (void)index;
    return atomic_load(&allocated);
}

static int64_t dev_peak(int index) {
    (void)index;
    return atomic_load(&peak);
}

static void dev_reset_peak(int index) {
    (void)index;
    atomic_store(&peak, atomic_load(&allocated));
}

int64_t testdev_memory_held(void) {
    int64_t n = 0;
    pthread_mutex_lock(&lock);
    for (region *r = regions; r; r = r->next)
        n += (int64_t)r->nbytes;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ---------------------------------------------------- waits and copies */

static int dev_synchronize(int index) {
    (void)index;
    return stream_wait(&compute);
}

int testdev_synchronize(void) { return dev_synchronize(0); }

static int dev_read(int index, void *dst, const void *src, size_t n) {
    (void)index;
    int rc = stream_wait(&compute);
    if (rc)
        return rc;
    enter();
    memcpy(dst, src, n);
    leave();
    return 0;
}

static int copy_kernel(ct_tensor *dst, ct_tensor *src) {
    ct__cpu_copy_into(dst, src);
    return 0;
}
QUEUED(copy_queued, copy_kernel, (ct_tensor * dst, ct_tensor *src), (dst, src))

static int dev_copy(ct_tensor *dst, ct_tensor *src) {
    /* To the host: the host waits for the bytes. */
    if (ct__is_host(dst->storage->device)) {
        int rc = stream_wait(&compute);
        if (rc)
            return rc;
        enter();
        ct__cpu_copy_into(dst, src);
        leave();
        return 0;
    }
    if (!ct__is_host(src->storage->device))
        return dev_copy_queued(dst, src);
    /* From pageable host memory, read before the call returns (the host may
     * write it next), as cudaMemcpy stages it. */
    ct_tensor *staged = ct__tensor_own(ct__tensor_new("copy_", src->ndim, src->sizes, src->dtype));
    if (!staged)
        return ct_errcode();
    ct__cpu_copy_into(staged, src);
    int rc = dev_copy_queued(dst, staged);
    ct_tensor_free(staged);
    return rc;
}

/* ct_to and ct_to_async: a copy through the queue, which ct_to_async to
 * the host does not wait for. Its result holds 0xff bytes (NaN in every
 * float dtype) until the compute stream has run, so that a read before the
 * synchronize its documentation asks for sees them. */
static ct_tensor *dev_to(const char *fn, ct_tensor *t, ct_device device, bool async) {
    bool to_host = ct__is_host(device);
    if (!to_host && device.index != 0) {
        ct__err_set(CT_EDEVICE, "%s: test:%d: no such device (the test device is test:0)", fn,
                    device.index);
        return NULL;
    }
    ct_tensor *src = ct_contiguous(t);
    ct_tensor *out = src ? ct__tensor_new_on(fn, src->ndim, src->sizes, src->dtype, device) : NULL;
    int rc = ct_errcode();
    if (out && to_host && async) {
        memset(ct__data(out), 0xff, (size_t)ct_numel(out) * ct__esize(out->dtype));
        rc = dev_copy_queued(out, src);
    } else if (out) {
        rc = ct__tensor_copy_any(out, src);
    }
    ct__tensor_release(src);
    if (rc && out) {
        ct__tensor_release(out);
        out = NULL;
    }
    return out;
}

/* ------------------------------------------------------------- streams */

static int dev_count(void) { return 1; }

static int dev_current(void) { return 0; }

static int dev_stream(int index, void **stream) {
    (void)index;
    *stream = &compute;
    return 0;
}

static int dev_record_stream(ct_tensor *t, void *stream) {
    region *r = region_of(t->storage);
    testdev_stream *s = stream;
    if (r && s != &compute) {
        pthread_mutex_lock(&lock);
        r->recorded |= 1ull << s->bit;
        pthread_mutex_unlock(&lock);
    }
    return 0;
}

testdev_stream *testdev_stream_new(void) {
    testdev_stream *s = calloc(1, sizeof *s);
    if (!s) {
        ct__err_set(CT_ENOMEM, "testdev_stream_new: out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->run, NULL);
    pthread_mutex_lock(&lock);
    for (int b = 1; b < MAX_STREAMS && !s->bit; b++)
        if (!sides[b]) {
            sides[b] = s;
            s->bit = b;
        }
    pthread_mutex_unlock(&lock);
    if (!s->bit) {
        pthread_mutex_destroy(&s->run);
        free(s);
        ct__err_set(CT_ENOMEM, "testdev_stream_new: %d side streams live already", MAX_STREAMS - 1);
        return NULL;
    }
    return s;
}

int testdev_stream_launch(testdev_stream *s, ct_tensor *const *uses, int n, void (*fn)(void *ctx),
                          void *ctx) {
    call *c = call_new(sizeof *c, NULL);
    if (!c)
        return ct_errcode();
    CT_ASSERT(n <= MAX_OPERANDS);
    c->fn = fn;
    c->ctx = ctx;
    c->after = &compute;
    for (int i = 0; i < n; i++)
        if ((c->uses[c->nuses] = region_of(uses[i]->storage)))
            c->nuses++;
    pthread_mutex_lock(&lock);
    c->after_seq = compute.queued;
    push_locked(s, c);
    pthread_mutex_unlock(&lock);
    return 0;
}

int testdev_stream_synchronize(testdev_stream *s) { return stream_wait(s); }

void testdev_stream_free(testdev_stream *s) {
    if (!s)
        return;
    /* A free that queues a marker here meanwhile is run before s goes. */
    for (bool idle = false; !idle;) {
        stream_wait(s);
        pthread_mutex_lock(&lock);
        idle = !s->head;
        if (idle) {
            sides[s->bit] = NULL;
            for (region *r = regions; r; r = r->next)
                r->recorded &= ~(1ull << s->bit);
        }
        pthread_mutex_unlock(&lock);
    }
    pthread_mutex_destroy(&s->run);
    free(s);
}

/* ------------------------------------------------------------- kernels */

ENTRY(fill, (ct_tensor * t, double v), (t, v))
ENTRY(unary, (int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]),
      (op, out, src, p, ip))
ENTRY(binary,
      (int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double s, ct_dtype dt, int nd,
       const int64_t shape[CT_MAX_DIMS]),
      (op, dst, x, y, s, dt, nd, shape))
ENTRY(where,
      (ct_tensor * out, ct_tensor *cond, ct_tensor *a, ct_tensor *b, const uint64_t *bits, int nd,
       const int64_t shape[CT_MAX_DIMS]),
      (out, cond, a, b, bits, nd, shape))
ENTRY(reduce,
      (const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *idx,
       const bool mask[CT_MAX_DIMS], bool keepdim),
      (r, in, out, idx, mask, keepdim))
ENTRY(softmax, (ct_tensor * out, ct_tensor *in, int dim, bool log), (out, in, dim, log))
ENTRY(layer_norm,
      (ct_tensor * y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w, ct_tensor *b,
       double eps),
      (y, mean, rstd, x, w, b, eps))
ENTRY(layer_norm_backward,
      (ct_tensor * dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy, ct_tensor *x, ct_tensor *w,
       ct_tensor *mean, ct_tensor *rstd),
      (dx, dw, db, dy, x, w, mean, rstd))
ENTRY(cross_entropy,
      (ct_tensor * loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t, int64_t ignore, double e),
      (loss, lse, x, t, ignore, e))
ENTRY(cross_entropy_backward,
      (ct_tensor * grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse, ct_tensor *scale,
       int64_t ignore, double e),
      (grad, x, t, lse, scale, ignore, e))
ENTRY(attention, (const ct__attention *a), (a))
WAITED(scan_index, (ct_tensor * index, int64_t bound, bool *found, int64_t *bad, int64_t *max),
       (index, bound, found, bad, max))
ENTRY(gather, (ct_tensor * out, ct_tensor *t, int dim, ct_tensor *index), (out, t, dim, index))
ENTRY(scatter_add, (ct_tensor * self, int dim, ct_tensor *index, ct_tensor *src),
      (self, dim, index, src))
ENTRY(one_hot, (ct_tensor * out, ct_tensor *labels, int64_t classes), (out, labels, classes))
ENTRY(band, (ct_tensor * out, ct_tensor *t, int64_t k, bool upper), (out, t, k, upper))
ENTRY(draw, (ct_tensor * out, const ct__draw *d), (out, d))
ENTRY(matmul, (const ct__mm_plan *p, int index), (p, index))
WAITED(scan_probabilities, (ct_tensor * p, bool *found, double *bad), (p, found, bad))

/* The optimizer's step: its segments are the optimizer's plan, which the
 * next step overwrites, so the call keeps its own copy of them, as a CUDA
 * launch keeps its arguments. */
typedef struct optim_call {
    call head;
    ct__optim_step st;
    int index;
    ct__optim_segment segs[];
} optim_call;

static int optim_run(call *head) {
    optim_call *c = (optim_call *)head;
    c->st.segs = c->segs;
    return ct__cpu_optim_step(&c->st, c->index);
}

static int dev_optim_step(const ct__optim_step *s, int index) {
    size_t nbytes = sizeof(ct__optim_segment) * (size_t)s->nsegs;
    optim_call *c = call_new(sizeof *c + nbytes, optim_run);
    if (!c)
        return ct_errcode();
    c->st = *s;
    c->index = index;
    if (nbytes)
        memcpy(c->segs, s->segs, nbytes);
    return launch(&c->head);
}

ct__device_ops testdev_ops = {
    .name = "test",
    .storage_new = dev_storage_new,
    .memory_allocated = dev_allocated,
    .memory_peak = dev_peak,
    .memory_reset_peak = dev_reset_peak,
    .synchronize = dev_synchronize,
    .read = dev_read,
    .to = dev_to,
    .count = dev_count,
    .current = dev_current,
    .stream = dev_stream,
    .record_stream = dev_record_stream,
    .copy = dev_copy,
    .fill = dev_fill,
    .unary = dev_unary,
    .binary = dev_binary,
    .where = dev_where,
    .reduce = dev_reduce,
    .softmax = dev_softmax,
    .layer_norm = dev_layer_norm,
    .layer_norm_backward = dev_layer_norm_backward,
    .cross_entropy = dev_cross_entropy,
    .cross_entropy_backward = dev_cross_entropy_backward,
    .attention = dev_attention,
    .optim_step = dev_optim_step,
    .scan_index = dev_scan_index,
    .gather = dev_gather,
    .scatter_add = dev_scatter_add,
    .one_hot = dev_one_hot,
    .band = dev_band,
    .matmul = dev_matmul,
    .mm_limit = CT__CPU_MM_LIMIT,
    .draw = dev_draw,
    .scan_probabilities = dev_scan_probabilities,
};

int testdev_register(void) { return ct__device_register(CT_TEST, &testdev_ops); }
