/* The test device (testdev.h): the CPU's kernels over memory that host code
 * cannot read. Each storage is its own anonymous mapping, PROT_NONE except
 * while one of the device's own entries runs; an op that reaches device
 * memory without going through the table faults. */
#include "testdev.h"

#include "cpu_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct region {
    void *p;
    size_t len, nbytes;
    struct region *next;
} region;

/* The live mappings; open counts the entries running, on any thread. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static region *regions;
static int open_count;
static atomic_llong allocated, peak;

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

static void release(void *data, void *ctx) {
    region *r = ctx;
    pthread_mutex_lock(&lock);
    for (region **at = &regions; *at; at = &(*at)->next)
        if (*at == r) {
            *at = r->next;
            break;
        }
    pthread_mutex_unlock(&lock);
    atomic_fetch_sub(&allocated, (long long)r->nbytes);
    munmap(data, r->len);
    free(r);
}

static ct_storage *dev_storage_new(const char *op, size_t nbytes, int index) {
    (void)index;
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
    *r = (region){p, len ? len : page, nbytes, NULL};
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

static int dev_synchronize(int index) {
    (void)index;
    return 0;
}

static int dev_read(int index, void *dst, const void *src, size_t n) {
    (void)index;
    enter();
    memcpy(dst, src, n);
    leave();
    return 0;
}

static int dev_copy(ct_tensor *dst, ct_tensor *src) {
    enter();
    ct__cpu_copy_into(dst, src);
    leave();
    return 0;
}

/* Each kernel entry: the CPU's, with the device's memory open. */
#define ENTRY(name, params, args)                                                                  \
    static int dev_##name params {                                                                 \
        enter();                                                                                   \
        int rc = ct__cpu_##name args;                                                              \
        leave();                                                                                   \
        return rc;                                                                                 \
    }
ENTRY(fill, (ct_tensor * t, double v), (t, v))
ENTRY(unary, (int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]),
      (op, out, src, p, ip))
ENTRY(binary,
      (int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double s, ct_dtype dt, int nd,
       const int64_t *shape),
      (op, dst, x, y, s, dt, nd, shape))
ENTRY(where,
      (ct_tensor * out, ct_tensor *cond, ct_tensor *a, ct_tensor *b, const uint64_t *bits, int nd,
       const int64_t *shape),
      (out, cond, a, b, bits, nd, shape))
ENTRY(reduce,
      (const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *idx, const bool *mask,
       bool keepdim),
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
ENTRY(scan_index, (ct_tensor * index, int64_t bound, bool *found, int64_t *bad, int64_t *max),
      (index, bound, found, bad, max))
ENTRY(gather, (ct_tensor * out, ct_tensor *t, int dim, ct_tensor *index), (out, t, dim, index))
ENTRY(scatter_add, (ct_tensor * self, int dim, ct_tensor *index, ct_tensor *src),
      (self, dim, index, src))
ENTRY(one_hot, (ct_tensor * out, ct_tensor *labels, int64_t classes), (out, labels, classes))
ENTRY(band, (ct_tensor * out, ct_tensor *t, int64_t k, bool upper), (out, t, k, upper))
ENTRY(attention, (const ct__attention *a), (a))
ENTRY(optim_step, (const ct__optim_step *s, int index), (s, index))
ENTRY(draw, (ct_tensor * out, const ct__draw *d), (out, d))
ENTRY(matmul, (const ct__mm_plan *p, int index), (p, index))
ENTRY(scan_probabilities, (ct_tensor * p, bool *found, double *bad), (p, found, bad))

ct__device_ops testdev_ops = {
    .name = "test",
    .storage_new = dev_storage_new,
    .memory_allocated = dev_allocated,
    .memory_peak = dev_peak,
    .memory_reset_peak = dev_reset_peak,
    .synchronize = dev_synchronize,
    .read = dev_read,
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
