/* The CPU kernels of softmax and log-softmax along one dim (their front
 * end: tensor/ops/softmax.c).
 *
 * A row along dim takes three passes: its max, the sum of exp(x - max), then
 * the output. log_softmax is (x - max) - log(sum): x - (max + log(sum))
 * would round the log to the spacing of x, which at large x is as coarse as
 * the log itself. Rows are either contiguous runs (dim is the input's fastest
 * dim) or are handled a tile of columns at a time, vectorised across the
 * other dims: the split of reduce_impl.h. float32 and the 16-bit floats
 * compute in float, float64 in double. A row's result depends only on that
 * row, so the thread count changes nothing. */
#include "cpu_impl.h"
#include "reduce_impl.h"
#include "vexp.h"

#include <math.h>

/* Elements converted at a time along a row, and columns per tile. */
#define SM_BLOCK 2048
#define SM_COLS  64

typedef struct sm_job {
    ct__red_plan plan; /* operands: input, marker, output */
    bool log;
    int64_t comp_size;
    bool comp_dtype;   /* input and output have the compute type */
    ct__loop_fn load;  /* input dtype -> compute type */
    ct__loop_fn store; /* compute type -> output dtype */
    int64_t ncols;     /* outer: columns per tile */
    int64_t ncb;       /* outer: tiles across kept dim 0 */
} sm_job;

/* n elements at src as contiguous compute-type values: in place when they
 * already are, otherwise converted into scratch. */
static const void *load(const sm_job *j, const char *src, int64_t stride, int64_t n,
                        void *scratch) {
    if (j->comp_dtype && stride == j->comp_size)
        return src;
    j->load(NULL, (char *[]){scratch, (char *)src}, (const int64_t[]){j->comp_size, stride}, n);
    return scratch;
}

static bool out_in_place(const sm_job *j, int64_t stride) {
    return j->comp_dtype && stride == j->comp_size;
}

/* Where n results for dst are computed: dst itself, or scratch and then
 * flush() converts them. */
static void *target(const sm_job *j, char *dst, int64_t stride, void *scratch) {
    return out_in_place(j, stride) ? dst : scratch;
}

static void flush(const sm_job *j, char *dst, int64_t stride, const void *y, int64_t n) {
    if (y != dst)
        j->store(NULL, (char *[]){dst, (char *)y}, (const int64_t[]){stride, j->comp_size}, n);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* T is the compute type; S suffixes its helpers. When the output holds
 * contiguous compute-type values, softmax keeps the exps of pass 2 there and
 * pass 3 only scales them, so each element costs one exp. */
#define DEFINE_SOFTMAX(S, T, EXP, SEL)                                                             \
    static void row_##S(const sm_job *j, const char *src, int64_t sin, char *dst, int64_t sout,    \
                        int64_t n, T *scratch) {                                                   \
        T m = -INFINITY;                                                                           \
        for (int64_t b = 0; b < n; b += SM_BLOCK) {                                                \
            T bm = ct__red_max_##S(load(j, src + b * sin, sin, min64(SM_BLOCK, n - b), scratch),   \
                                   min64(SM_BLOCK, n - b));                                        \
            m = SEL((bm > m) | (bm != bm), bm, m);                                                 \
        }                                                                                          \
        bool keep_exp = !j->log && out_in_place(j, sout);                                          \
        double s = 0;                                                                              \
        for (int64_t b = 0; b < n; b += SM_BLOCK) {                                                \
            int64_t len = min64(SM_BLOCK, n - b);                                                  \
            const T *x = load(j, src + b * sin, sin, len, scratch);                                \
            if (keep_exp) {                                                                        \
                T *e = (T *)(dst + b * sout);                                                      \
                for (int64_t i = 0; i < len; i++)                                                  \
                    e[i] = EXP(x[i] - m);                                                          \
                s += ct__red_sum_##S(e, len);                                                      \
            } else {                                                                               \
                s += ct__red_sumexp_##S(x, len, m);                                                \
            }                                                                                      \
        }                                                                                          \
        T ls = (T)log(s), inv = (T)(1 / s);                                                        \
        for (int64_t b = 0; b < n; b += SM_BLOCK) {                                                \
            int64_t len = min64(SM_BLOCK, n - b);                                                  \
            T *y = target(j, dst + b * sout, sout, scratch);                                       \
            if (keep_exp) {                                                                        \
                for (int64_t i = 0; i < len; i++)                                                  \
                    y[i] *= inv;                                                                   \
                continue;                                                                          \
            }                                                                                      \
            const T *x = load(j, src + b * sin, sin, len, scratch);                                \
            if (j->log)                                                                            \
                for (int64_t i = 0; i < len; i++)                                                  \
                    y[i] = (x[i] - m) - ls;                                                        \
            else                                                                                   \
                for (int64_t i = 0; i < len; i++)                                                  \
                    y[i] = EXP(x[i] - m) * inv;                                                    \
            flush(j, dst + b * sout, sout, y, len);                                                \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* ncols columns of kept dim 0, each a row along dim. */                                       \
    static void tile_##S(const sm_job *j, const char *src, char *dst, int64_t ncols, T *scratch) { \
        const ct__red_plan *p = &j->plan;                                                          \
        int64_t n = p->red.shape[0], rin = p->red.strides[0][0], rout = p->red.strides[0][2];      \
        int64_t cin = p->kept.strides[0][0], cout = p->kept.strides[0][2];                         \
        T m[SM_COLS], k[SM_COLS];                                                                  \
        double s[SM_COLS];                                                                         \
        for (int64_t c = 0; c < ncols; c++) {                                                      \
            m[c] = -INFINITY;                                                                      \
            s[c] = 0;                                                                              \
        }                                                                                          \
        for (int64_t r = 0; r < n; r++) {                                                          \
            const T *x = load(j, src + r * rin, cin, ncols, scratch);                              \
            for (int64_t c = 0; c < ncols; c++)                                                    \
                m[c] = SEL((x[c] > m[c]) | (x[c] != x[c]), x[c], m[c]);                            \
        }                                                                                          \
        bool keep_exp = !j->log && out_in_place(j, cout);                                          \
        for (int64_t r = 0; r < n; r++) {                                                          \
            const T *x = load(j, src + r * rin, cin, ncols, scratch);                              \
            T *e = keep_exp ? (T *)(dst + r * rout) : k;                                           \
            for (int64_t c = 0; c < ncols; c++) {                                                  \
                e[c] = EXP(x[c] - m[c]);                                                           \
                s[c] += e[c];                                                                      \
            }                                                                                      \
        }                                                                                          \
        for (int64_t c = 0; c < ncols; c++)                                                        \
            k[c] = (T)(j->log ? log(s[c]) : 1 / s[c]);                                             \
        for (int64_t r = 0; r < n; r++) {                                                          \
            T *y = target(j, dst + r * rout, cout, scratch);                                       \
            if (keep_exp) {                                                                        \
                for (int64_t c = 0; c < ncols; c++)                                                \
                    y[c] *= k[c];                                                                  \
                continue;                                                                          \
            }                                                                                      \
            const T *x = load(j, src + r * rin, cin, ncols, scratch);                              \
            if (j->log)                                                                            \
                for (int64_t c = 0; c < ncols; c++)                                                \
                    y[c] = (x[c] - m[c]) - k[c];                                                   \
            else                                                                                   \
                for (int64_t c = 0; c < ncols; c++)                                                \
                    y[c] = EXP(x[c] - m[c]) * k[c];                                                \
            flush(j, dst + r * rout, cout, y, ncols);                                              \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* An item is a row (inner) or a tile of columns (outer). */                                   \
    static void items_##S(void *ctx, int64_t lo, int64_t hi) {                                     \
        const sm_job *j = ctx;                                                                     \
        const ct__red_plan *p = &j->plan;                                                          \
        _Alignas(64) T scratch[SM_BLOCK];                                                          \
        int64_t width = p->kept.shape[0];                                                          \
        for (int64_t it = lo; it < hi; it++) {                                                     \
            int64_t col0 = p->inner ? 0 : it % j->ncb * j->ncols;                                  \
            ct__red_pos kp;                                                                        \
            ct__red_seek(&p->kept, 3, p->inner ? it : it / j->ncb * width + col0, &kp);            \
            const char *src = p->it.data[0] + kp.off[0];                                           \
            char *dst = p->it.data[2] + kp.off[2];                                                 \
            if (p->inner)                                                                          \
                row_##S(j, src, p->red.strides[0][0], dst, p->red.strides[0][2], p->red.shape[0],  \
                        scratch);                                                                  \
            else                                                                                   \
                tile_##S(j, src, dst, min64(j->ncols, width - col0), scratch);                     \
        }                                                                                          \
    }

DEFINE_SOFTMAX(f32, float, ct__vexpf, ct__f32_select)
DEFINE_SOFTMAX(f64, double, exp, ct__f64_select)

int ct__cpu_softmax(ct_tensor *out, ct_tensor *t, int d, bool log) {
    if (ct_numel(t) == 0)
        return 0;
    bool mask[CT_MAX_DIMS] = {false};
    mask[d] = t->ndim > 0;
    ct_tensor marker;
    ct__red_marker(&marker, out, t, mask, true);
    sm_job j = {.log = log};
    ct__red_plan_init(&j.plan, (ct_tensor *[]){t, &marker, out}, 3);
    ct_dtype comp = t->dtype == CT_FLOAT64 ? CT_FLOAT64 : CT_FLOAT32;
    j.comp_size = (int64_t)ct_dtype_size(comp);
    j.comp_dtype = t->dtype == comp;
    j.load = ct__cpu_cast_kernel(comp, t->dtype);
    j.store = ct__cpu_cast_kernel(t->dtype, comp);
    int64_t n = j.plan.red.shape[0], items = j.plan.kept.numel, per_item = n;
    if (!j.plan.inner) {
        j.ncols = min64(j.plan.kept.shape[0], SM_COLS);
        j.ncb = (j.plan.kept.shape[0] + j.ncols - 1) / j.ncols;
        items = items / j.plan.kept.shape[0] * j.ncb;
        per_item = n * j.ncols;
    }
    int64_t grain = CT__GRAIN_ELEMENTWISE / per_item;
    ct_parallel_for(0, items, grain > 1 ? grain : 1, comp == CT_FLOAT64 ? items_f64 : items_f32,
                    &j);
    return 0;
}
