/* Random draws on the Philox4x32-10 streams that philox.h defines: the
 * front ends and the generators.
 *
 * A draw reserves its blocks of counters from the generator first, then
 * the device's draw entry fills blocks in parallel (tensor/cpu/random.c,
 * tensor/cuda/index.cu): block b writes only its own elements, and its
 * values depend only on (seed, offset, b), so any split of the blocks over
 * threads gives the same tensor. The generator lives on the host either
 * way and advances by the same blocks. */
#include "device_impl.h"
#include "philox.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* PyTorch's default seed: an unseeded program is still reproducible. */
#define DEFAULT_SEED 67280421310721ull

/* Philox blocks per parallel chunk; each costs about as much as a few dozen
 * elementwise operations. */
#define GRAIN_BLOCKS 2048

static ct_generator default_gen = {DEFAULT_SEED, 0};
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;

void ct_manual_seed(uint64_t seed) {
    pthread_mutex_lock(&default_lock);
    default_gen.seed = seed;
    default_gen.offset = 0;
    pthread_mutex_unlock(&default_lock);
}

ct_generator *ct_default_generator(void) { return &default_gen; }

/* A child forked while another thread held the lock would inherit it held
 * forever. */
static void atfork_child(void) { pthread_mutex_init(&default_lock, NULL); }

__attribute__((constructor)) static void register_atfork(void) {
    pthread_atfork(NULL, NULL, atfork_child);
}

/* Every thread shares the default generator, so its reservation is
 * locked. */
void ct__tensor_generator_claim(ct_generator *gen, uint64_t nblocks, uint64_t *seed,
                                uint64_t *offset) {
    bool shared = !gen || gen == &default_gen;
    if (shared) {
        gen = &default_gen;
        pthread_mutex_lock(&default_lock);
    }
    *seed = gen->seed;
    *offset = gen->offset;
    gen->offset += nblocks;
    if (shared)
        pthread_mutex_unlock(&default_lock);
}

static int run_draw(ct__draw *d, ct_tensor *out, ct_generator *gen) {
    const ct__device_ops *dev = CT__DEVICE_GET("random", out->storage->device, draw);
    if (!dev)
        return ct_errcode();
    d->n = ct_numel(out);
    d->out = ct__data(out);
    d->dtype = (int)out->dtype;
    int64_t nblocks = (d->n + d->per_block - 1) / d->per_block;
    ct__tensor_generator_claim(gen, (uint64_t)nblocks, &d->seed, &d->offset);
    return dev->draw(out, d);
}

static ct_op_args draw_args(const ct__draw *d, double a, double b) {
    return (ct_op_args){
        .scalars = {a, b}, .ints = {(int64_t)d->seed, (int64_t)d->offset}, .nints = 2};
}

/* Uniform and normal draws of float dtypes follow the dtype's layout. */
static ct__draw float_draw(int kind, ct_dtype dtype, double a, double b) {
    static const int significand[] = {
        [CT_FLOAT32] = 24, [CT_FLOAT64] = 53, [CT_BFLOAT16] = 8, [CT_FLOAT16] = 11};
    ct__draw d = {.kind = kind, .a = a, .b = b, .per_block = dtype == CT_FLOAT64 ? 2 : 4};
    d.bits = kind == CT__DRAW_UNIFORM ? significand[dtype] : dtype == CT_FLOAT64 ? 53 : 24;
    return d;
}

static ct__draw bernoulli_draw(double p, bool p_in_out) {
    return (ct__draw){
        .kind = CT__DRAW_BERNOULLI, .per_block = 2, .bits = 53, .a = p, .p_in_out = p_in_out};
}

static int check_float(const char *op, ct_dtype dtype) {
    if (ct_dtype_is_float(dtype))
        return 0;
    return ct__err_set(CT_EDTYPE, "%s: needs a floating-point dtype, got %s", op,
                       ct_dtype_name(dtype));
}

/* Fills t in place. A strided t is drawn into a contiguous temporary first,
 * so that element i is always the i-th in row-major order. */
static ct_tensor *fill_(const char *op, ct_tensor *t, ct__draw *d, ct_generator *gen, double a,
                        double b) {
    if (ct__tensor_check_inplace(CT_OP_RANDOM, op, t, NULL, 0))
        return NULL;
    int rc;
    if (ct_is_contiguous(t)) {
        rc = run_draw(d, t, gen);
    } else {
        ct_tensor *tmp = ct__tensor_new_on(op, t->ndim, t->sizes, t->dtype, t->storage->device);
        if (!tmp)
            return NULL;
        rc = run_draw(d, tmp, gen);
        if (!rc)
            rc = ct__tensor_copy_any(t, tmp);
        ct__tensor_release(tmp);
    }
    if (rc)
        return NULL;
    ct_op_args args = draw_args(d, a, b);
    return ct__tensor_record(CT_OP_RANDOM, &t, 1, &t, 1, true, &args);
}

static ct_tensor *draw_new(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype, int kind,
                           ct_generator *gen) {
    if (check_float(op, dtype))
        return NULL;
    ct_tensor *t = ct__tensor_new(op, ndim, sizes, dtype);
    if (!t)
        return NULL;
    ct__draw d = float_draw(kind, dtype, 0.0, 1.0);
    run_draw(&d, t, gen);
    ct_op_args args = draw_args(&d, 0.0, 1.0);
    return ct__tensor_record1(CT_OP_RANDOM, t, NULL, 0, &args);
}

ct_tensor *ct_rand(int ndim, const int64_t *sizes, ct_dtype dtype, ct_generator *gen) {
    return draw_new("rand", ndim, sizes, dtype, CT__DRAW_UNIFORM, gen);
}

ct_tensor *ct_randn(int ndim, const int64_t *sizes, ct_dtype dtype, ct_generator *gen) {
    return draw_new("randn", ndim, sizes, dtype, CT__DRAW_NORMAL, gen);
}

/* The uniform is exact and below 1, but lo + (hi - lo) * u is rounded to the
 * dtype and may land on hi itself when the dtype is coarse for the range, as
 * in PyTorch. */
ct_tensor *ct_uniform_(ct_tensor *t, double lo, double hi, ct_generator *gen) {
    if (CT__CHECK_ANY("uniform_", t) || check_float("uniform_", t->dtype))
        return NULL;
    if (!(lo <= hi) || !isfinite(hi - lo)) {
        ct__err_set(CT_EINVAL, "uniform_: expected a finite range lo <= hi, got [%g, %g)", lo, hi);
        return NULL;
    }
    ct__draw d = float_draw(CT__DRAW_UNIFORM, t->dtype, lo, hi - lo);
    return fill_("uniform_", t, &d, gen, lo, hi);
}

ct_tensor *ct_normal_(ct_tensor *t, double mean, double std, ct_generator *gen) {
    if (CT__CHECK_ANY("normal_", t) || check_float("normal_", t->dtype))
        return NULL;
    if (!(std >= 0) || !isfinite(std) || !isfinite(mean)) {
        ct__err_set(CT_EINVAL, "normal_: expected a finite mean and std >= 0, got mean %g, std %g",
                    mean, std);
        return NULL;
    }
    ct__draw d = float_draw(CT__DRAW_NORMAL, t->dtype, mean, std);
    return fill_("normal_", t, &d, gen, mean, std);
}

ct_tensor *ct_bernoulli_(ct_tensor *t, double p, ct_generator *gen) {
    if (CT__CHECK_ANY("bernoulli_", t))
        return NULL;
    if (!(p >= 0 && p <= 1)) {
        ct__err_set(CT_EINVAL, "bernoulli_: p is %g; expected a probability in [0, 1]", p);
        return NULL;
    }
    ct__draw d = bernoulli_draw(p, false);
    return fill_("bernoulli_", t, &d, gen, p, 0.0);
}

/* Each row takes whole blocks of its own, at the draw's offset plus its
 * index times the blocks of a row, so that its values do not depend on
 * which rows are drawn beside it. */
ct_tensor *ct_bernoulli_rows_(ct_tensor *t, double p, const int64_t *rows, int64_t global_rows,
                              ct_generator *gen) {
    static const char op[] = "bernoulli_rows_";
    if (CT__CHECK_ANY(op, t))
        return NULL;
    if (!(p >= 0 && p <= 1)) {
        ct__err_set(CT_EINVAL, "%s: p is %g; expected a probability in [0, 1]", op, p);
        return NULL;
    }
    if (t->ndim < 1) {
        ct__err_set(CT_EINVAL, "%s: needs a tensor of rows (1 dim or more), got a scalar", op);
        return NULL;
    }
    const int64_t n = t->sizes[0];
    if (n > 0 && !rows) {
        ct__err_set(CT_EINVAL, "%s: rows is NULL for %lld rows", op, (long long)n);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= global_rows) {
            ct__err_set(CT_ERANGE, "%s: rows[%lld] is %lld; expected a row in [0, %lld)", op,
                        (long long)i, (long long)rows[i], (long long)global_rows);
            return NULL;
        }
    /* Checked before the claim, so that a failed draw consumes nothing. */
    if (ct__tensor_check_inplace(CT_OP_RANDOM, op, t, NULL, 0))
        return NULL;
    ct__draw d = bernoulli_draw(p, false);
    const int64_t per_row = n > 0 ? ct_numel(t) / n : 0;
    const int64_t blocks = (per_row + d.per_block - 1) / d.per_block;
    if (blocks > 0 && global_rows > INT64_MAX / blocks) {
        ct__err_set(CT_ERANGE, "%s: %lld rows of %lld blocks overflow the generator", op,
                    (long long)global_rows, (long long)blocks);
        return NULL;
    }
    uint64_t seed, base;
    ct__tensor_generator_claim(gen, (uint64_t)(global_rows * blocks), &seed, &base);
    int rc = 0;
    ct_scope_begin();
    for (int64_t i = 0; i < n && !rc; i++) {
        ct_generator row_gen = {seed, base + (uint64_t)(rows[i] * blocks)};
        ct_tensor *row = ct_select(t, 0, i);
        if (!row || !fill_(op, row, &d, &row_gen, p, 0.0))
            rc = ct_errcode();
    }
    ct_scope_end();
    return rc ? NULL : t;
}

/* Whether p holds a value outside [0, 1] (NaN too), and the first such in
 * iteration order, from the device's scan, which the host waits for. */
static int scan_probabilities(ct_tensor *p, bool *found, double *bad) {
    const ct__device_ops *dev = CT__DEVICE_GET("bernoulli", p->storage->device, scan_probabilities);
    return dev ? dev->scan_probabilities(p, found, bad) : ct_errcode();
}

ct_tensor *ct_bernoulli(ct_tensor *p, ct_generator *gen) {
    if (CT__CHECK_ANY("bernoulli", p) || check_float("bernoulli", p->dtype))
        return NULL;
    bool found = false;
    double bad = 0;
    if (scan_probabilities(p, &found, &bad))
        return NULL;
    if (found) {
        char desc[CT__DESC_STR];
        ct__err_set(CT_EINVAL, "bernoulli: p %s holds %g; expected probabilities in [0, 1]",
                    ct__tensor_desc(desc, p), bad);
        return NULL;
    }
    ct_tensor *out =
        ct__tensor_new_on("bernoulli", p->ndim, p->sizes, p->dtype, p->storage->device);
    if (!out)
        return NULL;
    /* The probabilities are copied into out, and each is replaced by its
     * draw. */
    ct__draw d = bernoulli_draw(0.0, true);
    if (ct__tensor_copy_any(out, p) || run_draw(&d, out, gen)) {
        ct__tensor_release(out);
        return NULL;
    }
    ct_op_args args = draw_args(&d, NAN, 0.0);
    return ct__tensor_record1(CT_OP_RANDOM, out, &p, 1, &args);
}

typedef struct perm_key {
    uint64_t key;
    int64_t index;
} perm_key;

typedef struct perm_job {
    perm_key *keys;
    int64_t n;
    uint64_t seed, offset;
} perm_job;

static void perm_blocks(void *arg, int64_t lo, int64_t hi) {
    const perm_job *j = arg;
    for (int64_t b = lo; b < hi; b++) {
        uint64_t v[4];
        ct__philox_values(j->seed, j->offset, (uint64_t)b, 2, v);
        for (int64_t i = 2 * b; i < 2 * b + 2 && i < j->n; i++)
            j->keys[i] = (perm_key){v[i - 2 * b], i};
    }
}

static int perm_cmp(const void *pa, const void *pb) {
    const perm_key *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

ct_tensor *ct_randperm(int64_t n, ct_generator *gen) {
    if (n < 0) {
        ct__err_set(CT_EINVAL, "randperm: n is %lld; expected n >= 0", (long long)n);
        return NULL;
    }
    perm_key *keys = (uint64_t)n < SIZE_MAX / sizeof(perm_key)
                         ? malloc(sizeof(perm_key) * (size_t)(n > 0 ? n : 1))
                         : NULL;
    if (!keys) {
        ct__err_set(CT_ENOMEM, "randperm: out of memory sorting %lld keys", (long long)n);
        return NULL;
    }
    ct_tensor *out = ct__tensor_new("randperm", 1, &n, CT_INT64);
    if (!out) {
        free(keys);
        return NULL;
    }
    perm_job j = {keys, n, 0, 0};
    int64_t nblocks = (n + 1) / 2;
    ct__tensor_generator_claim(gen, (uint64_t)nblocks, &j.seed, &j.offset);
    ct_parallel_for(0, nblocks, GRAIN_BLOCKS, perm_blocks, &j);
    qsort(keys, (size_t)n, sizeof *keys, perm_cmp);
    int64_t *data = (int64_t *)ct__data(out);
    for (int64_t i = 0; i < n; i++)
        data[i] = keys[i].index;
    free(keys);
    ct_op_args args = {.ints = {(int64_t)j.seed, (int64_t)j.offset}, .nints = 2};
    return ct__tensor_record1(CT_OP_RANDOM, out, NULL, 0, &args);
}
