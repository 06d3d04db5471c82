/* Reductions on the CPU: sum, mean, prod, amax/amin, var/std, logsumexp,
 * norm, max/min along a dim and argmax/argmin. On a CUDA device the same
 * front end plans them and tensor/cuda/reduce.cu computes them.
 *
 * An op is a kind: a family, which says how partial results merge and
 * finish, plus kernels for each compute type (float for float32 and the
 * 16-bit floats, double for float64, int64 for integers and bool). Input of
 * another dtype, or with a gap between elements, is converted block by block
 * into a scratch buffer of the compute type, so kernels only see contiguous
 * values.
 *
 * Determinism: the reduced elements of every output are cut into chunks
 * whose size depends on the shape alone; a chunk is reduced in a fixed order,
 * and chunks merge in index order. Threads take whole chunks, so the thread
 * count never changes a result. */
#include "cpu_impl.h"
#include "ops_impl.h"
#include "reduce_impl.h"
#include "vexp.h"

#include <math.h>
#include <stdlib.h>

/* Two gcc loop transformations hurt these kernels: unroll-and-jam pairs up
 * the rows of the column loops and then reads the second row of each pair by
 * gathers, and pattern distribution turns the loops that set up lane
 * accumulators into memset/memcpy calls, whose results go through memory
 * before the accumulators can load them back. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-loop-unroll-and-jam", "no-tree-loop-distribute-patterns")
#endif

/* ------------------------------------------------------------- the layer */

void ct__red_marker(ct_tensor *m, const ct_tensor *out, const ct_tensor *in, const bool *reduced,
                    bool keepdim) {
    memset(m, 0, sizeof *m);
    m->magic = CT__TENSOR_MAGIC;
    m->storage = out->storage;
    m->offset = out->offset;
    m->dtype = out->dtype;
    m->ndim = in->ndim;
    for (int d = 0, od = 0; d < in->ndim; d++) {
        if (reduced[d]) {
            m->sizes[d] = 1;
            od += keepdim;
        } else {
            m->sizes[d] = in->sizes[d];
            m->strides[d] = out->strides[od++];
        }
    }
}

static void space_push(ct__red_space *s, const ct__iter *it, int d) {
    s->shape[s->ndim] = it->shape[d];
    for (int k = 0; k < it->ntensors; k++)
        s->strides[s->ndim][k] = it->strides[d][k];
    s->numel *= it->shape[d];
    s->ndim++;
}

static void space_close(ct__red_space *s, int nops) {
    if (s->ndim > 0)
        return;
    s->ndim = 1;
    s->shape[0] = 1;
    for (int k = 0; k < nops; k++)
        s->strides[0][k] = 0;
}

void ct__red_plan_init(ct__red_plan *p, ct_tensor *const *ts, int n) {
    ct__iter_init(&p->it, ts, n, ts[0]->ndim, ts[0]->sizes);
    p->kept = p->red = (ct__red_space){.numel = 1};
    /* Dims of size 1 are gone, so a zero marker stride means reduced. */
    for (int d = 0; d < p->it.ndim; d++)
        space_push(p->it.strides[d][1] == 0 ? &p->red : &p->kept, &p->it, d);
    bool reduce_first = p->it.strides[0][1] == 0;
    p->inner = p->kept.ndim == 0 ||
               (reduce_first && p->red.ndim > 0 && p->red.shape[0] >= CT__RED_MIN_RUN);
    space_close(&p->kept, n);
    space_close(&p->red, n);
}

void ct__red_seek(const ct__red_space *s, int nops, int64_t linear, ct__red_pos *pos) {
    for (int k = 0; k < nops; k++)
        pos->off[k] = 0;
    if (linear == 0) {
        /* The common case (a single chunk) skips the divisions. */
        memset(pos->idx, 0, sizeof pos->idx);
        return;
    }
    for (int d = 0; d < s->ndim; d++) {
        /* The outermost dim keeps the rest, so seeking to numel is valid. */
        int64_t i = d + 1 < s->ndim ? linear % s->shape[d] : linear;
        linear /= s->shape[d];
        pos->idx[d] = i;
        for (int k = 0; k < nops; k++)
            pos->off[k] += i * s->strides[d][k];
    }
}

void ct__red_advance(const ct__red_space *s, int nops, ct__red_pos *pos, int64_t len) {
    pos->idx[0] += len;
    for (int k = 0; k < nops; k++)
        pos->off[k] += len * s->strides[0][k];
    for (int d = 0; d + 1 < s->ndim && pos->idx[d] == s->shape[d]; d++) {
        pos->idx[d] = 0;
        pos->idx[d + 1]++;
        for (int k = 0; k < nops; k++)
            pos->off[k] += s->strides[d + 1][k] - s->shape[d] * s->strides[d][k];
    }
}

/* ------------------------------------------------------ compute types */

enum { COMP_F, COMP_D, COMP_I, NCOMP };

typedef float comp_f;
typedef double comp_d;
typedef int64_t comp_i;

/* Lane accumulators within a block. Float sums stay in float for speed and
 * fold into double every RED_BLOCK elements; integers wrap in uint64, as
 * PyTorch's int64 sums do, without signed overflow. */
#define PART_f  float
#define PART_d  double
#define PART_i  uint64_t
#define TOTAL_f double
#define TOTAL_d double
#define TOTAL_i uint64_t
/* Independent accumulators: eight vector registers keep enough loads in
 * flight to stream from L3 at twice the rate four do. gcc vectorises a lane
 * loop of 32 or more iterations as a loop; shorter ones it unrolls first and
 * then often fails to vectorise (max over doubles, for one). */
#define LANES(S)   ((int)(256 / sizeof(comp_##S)))

#define LOWEST_f   (-INFINITY)
#define LOWEST_d   (-INFINITY)
#define LOWEST_i   INT64_MIN
#define HIGHEST_f  INFINITY
#define HIGHEST_d  INFINITY
#define HIGHEST_i  INT64_MAX
#define ISNAN_f(x) ((x) != (x))
#define ISNAN_d(x) ((x) != (x))
#define ISNAN_i(x) 0
#define NAN_f      NAN
#define NAN_d      NAN
#define NAN_i      0 /* integers have no NaN */
/* Row numbers within an outer chunk (< RED_OUTER_CHUNK), as wide as the
 * values so that index and value selects vectorise together. */
#define ROW_f          int32_t
#define ROW_d          int64_t
#define ROW_i          int64_t
#define SEL_f          ct__f32_select
#define SEL_d          ct__f64_select
#define SEL_i(c, a, b) ((c) ? (a) : (b))
#define EXP_f          ct__vexpf
#define EXP_d          exp
#define POW_f          powf
#define POW_d          pow
#define ABS_f          fabsf
#define ABS_d          fabs

/* Elements per float block: 16 to 32 per lane keeps float rounding
 * negligible. */
#define RED_BLOCK 1024
/* Runs at least this long are summed with LANES lanes, shorter with half. */
#define RED_LONG_RUN 4096
/* Outputs per kernel call when each is one contiguous run. */
#define RED_BATCH 32
/* Scratch elements for converting an inner run. */
#define RED_SCRATCH 2048
/* Outer reductions: columns per tile and rows per kernel call. */
#define RED_COLS 256
#define RED_SUB  32
/* Reduced elements per chunk (inner) and elements per tile (outer). */
#define RED_CHUNK       16384
#define RED_OUTER_CHUNK 65536

/* ---------------------------------------------------------- accumulators */

/* A partial result. sum/prod/max/min: f[0] or i[0] (integer compute); var:
 * i[0] count, f[0] mean, f[1] sum of squared deviations; logsumexp: f[0] max,
 * f[1] sum of exp(x - max); arg: f[0] or i[0] value, i[1] index. */
typedef struct red_acc {
    double f[2];
    int64_t i[2];
} red_acc;

#define SETV_f(a, v) ((a)->f[0] = (double)(v))
#define SETV_d(a, v) ((a)->f[0] = (double)(v))
#define SETV_i(a, v) ((a)->i[0] = (int64_t)(v))

/* Reduces nruns runs, each of n contiguous values (reduced elements pos,
 * pos + 1, ...) and run_stride bytes after the last, into a[0..nruns-1].
 * Taking several short runs per call lets one run's tail overlap the next
 * run's loads. */
typedef void (*red_inner_fn)(red_acc *a, const char *x, int64_t n, int64_t pos, int64_t nruns,
                             int64_t run_stride, double c);
/* The rows of one outer tile (ncols columns of kept dim 0, reduced elements
 * next to end), handed out RED_SUB at a time: in place when they hold
 * contiguous compute-type values, otherwise converted into scratch. */
typedef struct red_rows {
    const ct__red_space *red;
    ct__red_pos pos;  /* of row next in red */
    const char *base; /* the tile's first column in reduced element 0 */
    int64_t next, end;
    int64_t ncols, col_stride, comp_size;
    bool direct;
    ct__loop_fn load;
    char *scratch; /* RED_SUB rows of RED_COLS values */
} red_rows;

/* Points rows[] at the next rows; returns how many, 0 at the end. */
static int64_t next_rows(red_rows *t, const void **rows) {
    int64_t n = t->end - t->next < RED_SUB ? t->end - t->next : RED_SUB;
    for (int64_t s = 0; s < n; s++) {
        const char *src = t->base + t->pos.off[0];
        rows[s] = src;
        if (!t->direct) {
            char *dst = t->scratch + s * RED_COLS * t->comp_size;
            t->load(NULL, (char *[]){dst, (char *)src},
                    (const int64_t[]){t->comp_size, t->col_stride}, t->ncols);
            rows[s] = dst;
        }
        ct__red_advance(t->red, 1, &t->pos, 1);
    }
    t->next += n;
    return n;
}

/* Reduces a tile's rows into one partial per column, a[0..ncols-1]. */
typedef void (*red_outer_fn)(red_acc *a, red_rows *t, double c);

/* ------------------------------------------------------------- helpers */

/* What a sum adds up; c is the map's parameter (p, or the mean for DEV). */
#define MAP_ID(S, x, c)  (x)
#define MAP_ABS(S, x, c) ABS_##S(x)
#define MAP_NZ(S, x, c)  ((x) != 0 ? (comp_##S)1 : (comp_##S)0)
#define MAP_POW(S, x, c) POW_##S(ABS_##S(x), c)
#define MAP_SQR(S, x, c) ((x) * (x))
#define MAP_DEV(S, x, c) (((x) - (c)) * ((x) - (c)))
#define MAP_EXP(S, x, c) EXP_##S((x) - (c))

#define ABOVE(v, m)      ((v) > (m))
#define BELOW(v, m)      ((v) < (m))
/* Does v replace m? NaN always wins, so it propagates. */
#define PICK_MAX(S, v, m) (((v) > (m)) | ISNAN_##S(v))
#define PICK_MIN(S, v, m) (((v) < (m)) | ISNAN_##S(v))

/* A block's float lanes fold to eight in float, then add into eight double
 * lanes (one vector of each). The last few elements fill a partial lane
 * group: summed one by one they would make a long dependency chain. */
#define DEFINE_SUM_LANES(S, MAP, NAME, L)                                                          \
    static TOTAL_##S NAME(const comp_##S *x, int64_t n, comp_##S c) {                              \
        TOTAL_##S total[8];                                                                        \
        for (int j = 0; j < 8; j++)                                                                \
            total[j] = 0;                                                                          \
        for (int64_t b = 0; b < n; b += RED_BLOCK) {                                               \
            int64_t end = n - b > RED_BLOCK ? b + RED_BLOCK : n, i = b;                            \
            PART_##S part[L];                                                                      \
            for (int j = 0; j < (L); j++)                                                          \
                part[j] = 0;                                                                       \
            for (; end - i >= (L); i += (L))                                                       \
                for (int j = 0; j < (L); j++)                                                      \
                    part[j] += MAP_##MAP(S, x[i + j], c);                                          \
            for (int j = 0; j < (L) && i < end; j++)                                               \
                part[j] += i + j < end ? MAP_##MAP(S, x[i + j], c) : 0;                            \
            for (int k = 1; k < (L) / 8; k++)                                                      \
                for (int j = 0; j < 8; j++)                                                        \
                    part[j] += part[j + 8 * k];                                                    \
            for (int j = 0; j < 8; j++)                                                            \
                total[j] += part[j];                                                               \
        }                                                                                          \
        /* A loop, not one expression: an explicit tree here stops gcc from                        \
         * vectorising the folds above. */                                                         \
        for (int w = 4; w > 0; w /= 2)                                                             \
            for (int j = 0; j < w; j++)                                                            \
                total[j] += total[j + w];                                                          \
        return total[0];                                                                           \
    }

/* Short runs take 32 lanes (half of them for floats): less to set up and
 * fold per run, which dominates rows of a few thousand elements; long runs
 * stream faster with more loads in flight. */
#define DEFINE_SUM(S, MAP)                                                                         \
    DEFINE_SUM_LANES(S, MAP, sum_##MAP##_##S##_short, 32)                                          \
    DEFINE_SUM_LANES(S, MAP, sum_##MAP##_##S##_long, LANES(S))                                     \
    static TOTAL_##S sum_##MAP##_##S(const comp_##S *x, int64_t n, comp_##S c) {                   \
        return n < RED_LONG_RUN ? sum_##MAP##_##S##_short(x, n, c)                                 \
                                : sum_##MAP##_##S##_long(x, n, c);                                 \
    }

/* The running extreme takes a plain comparison (one max instruction), and
 * NaNs are tracked in separate flag lanes: a NaN-propagating select per
 * element is a longer dependency chain. */
#define DEFINE_EXTREME(S, MAP, NAME, BETTER, INIT)                                                 \
    static comp_##S NAME##_##MAP##_##S(const comp_##S *x, int64_t n) {                             \
        comp_##S m[LANES(S)];                                                                      \
        ROW_##S nan[LANES(S)];                                                                     \
        for (int j = 0; j < LANES(S); j++) {                                                       \
            m[j] = INIT##_##S;                                                                     \
            nan[j] = 0;                                                                            \
        }                                                                                          \
        int64_t i = 0;                                                                             \
        for (; n - i >= LANES(S); i += LANES(S))                                                   \
            for (int j = 0; j < LANES(S); j++) {                                                   \
                comp_##S v = MAP_##MAP(S, x[i + j], 0);                                            \
                m[j] = BETTER(v, m[j]) ? v : m[j];                                                 \
                nan[j] |= ISNAN_##S(v);                                                            \
            }                                                                                      \
        for (int j = 0; j < LANES(S) && i < n; j++) {                                              \
            comp_##S v = i + j < n ? MAP_##MAP(S, x[i + j], 0) : INIT##_##S;                       \
            m[j] = BETTER(v, m[j]) ? v : m[j];                                                     \
            nan[j] |= ISNAN_##S(v);                                                                \
        }                                                                                          \
        /* The lanes fold as a tree: one by one they would make a dependency                       \
         * chain longer than a short run. */                                                       \
        for (int w = LANES(S) / 2; w > 0; w /= 2)                                                  \
            for (int j = 0; j < w; j++) {                                                          \
                m[j] = BETTER(m[j + w], m[j]) ? m[j + w] : m[j];                                   \
                nan[j] |= nan[j + w];                                                              \
            }                                                                                      \
        return nan[0] ? NAN_##S : m[0];                                                            \
    }

/* ------------------------------------------------------------- families */

/* A family of the registry (ops_impl.h): CT__RED_SUM, ... */
typedef int red_family;

/* Merges b, the partial of later reduced elements, into a. */
static void merge(red_family fam, bool is_int, red_acc *a, const red_acc *b) {
    switch (fam) {
    case CT__RED_SUM:
        a->f[0] += b->f[0];
        a->i[0] = (int64_t)((uint64_t)a->i[0] + (uint64_t)b->i[0]);
        return;
    case CT__RED_PROD:
        a->f[0] *= b->f[0];
        a->i[0] = (int64_t)((uint64_t)a->i[0] * (uint64_t)b->i[0]);
        return;
    case CT__RED_MAX:
        a->f[0] = PICK_MAX(d, b->f[0], a->f[0]) ? b->f[0] : a->f[0];
        a->i[0] = b->i[0] > a->i[0] ? b->i[0] : a->i[0];
        return;
    case CT__RED_MIN:
        a->f[0] = PICK_MIN(d, b->f[0], a->f[0]) ? b->f[0] : a->f[0];
        a->i[0] = b->i[0] < a->i[0] ? b->i[0] : a->i[0];
        return;
    case CT__RED_VAR: {
        double na = (double)a->i[0], nb = (double)b->i[0], n = na + nb;
        if (nb == 0)
            return;
        /* Into an empty a, b as it is: delta * delta can overflow there, and
         * times na == 0 it would be NaN. */
        if (na == 0) {
            *a = *b;
            return;
        }
        double delta = b->f[0] - a->f[0];
        a->f[0] += delta * (nb / n);
        /* With na * nb / n >= 1/2, this order overflows only when the term
         * itself does. */
        a->f[1] += b->f[1] + delta * (delta * (na * nb / n));
        a->i[0] += b->i[0];
        return;
    }
    case CT__RED_LSE: {
        double m = PICK_MAX(d, b->f[0], a->f[0]) ? b->f[0] : a->f[0];
        if (isfinite(m))
            a->f[1] = a->f[1] * exp(a->f[0] - m) + b->f[1] * exp(b->f[0] - m);
        a->f[0] = m;
        return;
    }
    case CT__RED_ARGMAX:
    case CT__RED_ARGMIN: {
        bool take;
        if (a->i[1] < 0)
            take = true;
        else if (is_int)
            take = fam == CT__RED_ARGMAX ? b->i[0] > a->i[0] : b->i[0] < a->i[0];
        else
            take = !isnan(a->f[0]) && (fam == CT__RED_ARGMAX ? PICK_MAX(d, b->f[0], a->f[0])
                                                             : PICK_MIN(d, b->f[0], a->f[0]));
        if (take)
            *a = *b;
        return;
    }
    }
}

static red_acc identity(red_family fam) {
    switch (fam) {
    case CT__RED_PROD: return (red_acc){{1, 0}, {1, 0}};
    case CT__RED_MAX: return (red_acc){{-INFINITY, 0}, {INT64_MIN, 0}};
    case CT__RED_MIN: return (red_acc){{INFINITY, 0}, {INT64_MAX, 0}};
    case CT__RED_LSE: return (red_acc){{-INFINITY, 0}, {0, 0}};
    case CT__RED_ARGMAX:
    case CT__RED_ARGMIN: return (red_acc){{0, 0}, {0, -1}};
    case CT__RED_SUM:
    case CT__RED_VAR: break;
    }
    return (red_acc){{0, 0}, {0, 0}};
}

/* Folds n rows into per-column state st[0..ncols): STEP(S, s, v, j, ...)
 * updates state s with the value v in column j. Columns go LANES at a time
 * with their state in registers across the rows, one load per vector; the
 * leftover columns go a row at a time. */
#define FOLD_COLUMNS(S, ST, st, rows, n, ncols, STEP, ...)                                         \
    do {                                                                                           \
        int64_t j0_ = 0;                                                                           \
        for (; j0_ + LANES(S) <= (ncols); j0_ += LANES(S)) {                                       \
            ST s_[LANES(S)];                                                                       \
            for (int k_ = 0; k_ < LANES(S); k_++)                                                  \
                s_[k_] = (st)[j0_ + k_];                                                           \
            for (int64_t r_ = 0; r_ < (n); r_++) {                                                 \
                const comp_##S *x_ = (const comp_##S *)(rows)[r_] + j0_;                           \
                for (int k_ = 0; k_ < LANES(S); k_++)                                              \
                    STEP(S, s_[k_], x_[k_], j0_ + k_, __VA_ARGS__);                                \
            }                                                                                      \
            for (int k_ = 0; k_ < LANES(S); k_++)                                                  \
                (st)[j0_ + k_] = s_[k_];                                                           \
        }                                                                                          \
        for (int64_t r_ = 0; r_ < (n); r_++) {                                                     \
            const comp_##S *x_ = (rows)[r_];                                                       \
            for (int64_t j_ = j0_; j_ < (ncols); j_++)                                             \
                STEP(S, (st)[j_], x_[j_], j_, __VA_ARGS__);                                        \
        }                                                                                          \
    } while (0)

#define STEP_SUM(S, s, v, j, MAP, c)  ((s) += MAP_##MAP(S, v, c))
#define STEP_PROD(S, s, v, j, unused) ((s) *= (TOTAL_##S)(v))
#define STEP_PICK(S, s, v, j, MAP, PICK)                                                           \
    ((s) = SEL_##S(PICK(S, MAP_##MAP(S, v, 0), s), MAP_##MAP(S, v, 0), s))
#define STEP_DEV(S, s, v, j, mean) ((s) += ((double)(v) - (mean)[j]) * ((double)(v) - (mean)[j]))
#define STEP_EXP(S, s, v, j, m)    ((s) += EXP_##S((v) - (m)[j]))

/* The batched entry point around a kernel's one-run body, NAME_run_S. */
#define DEFINE_INNER(NAME, S)                                                                      \
    static void NAME##_inner_##S(red_acc *a, const char *x, int64_t n, int64_t pos, int64_t nruns, \
                                 int64_t run_stride, double c) {                                   \
        for (int64_t r = 0; r < nruns; r++)                                                        \
            NAME##_run_##S(&a[r], x + r * run_stride, n, pos, c);                                  \
    }

/* ------------------------------------------------------------- kernels */

#define DEFINE_SUM_KERNELS(S, MAP)                                                                 \
    static void sum_##MAP##_run_##S(red_acc *a, const void *x, int64_t n, int64_t pos, double c) { \
        SETV_##S(a, sum_##MAP##_##S(x, n, (comp_##S)c));                                           \
    }                                                                                              \
    static void sum_##MAP##_outer_##S(red_acc *a, red_rows *t, double c) {                         \
        const void *rows[RED_SUB];                                                                 \
        TOTAL_##S total[RED_COLS];                                                                 \
        PART_##S part[RED_COLS];                                                                   \
        for (int64_t j = 0; j < t->ncols; j++)                                                     \
            total[j] = 0;                                                                          \
        for (int64_t n; (n = next_rows(t, rows)) > 0;) {                                           \
            for (int64_t j = 0; j < t->ncols; j++)                                                 \
                part[j] = 0;                                                                       \
            FOLD_COLUMNS(S, PART_##S, part, rows, n, t->ncols, STEP_SUM, MAP, (comp_##S)c);        \
            for (int64_t j = 0; j < t->ncols; j++)                                                 \
                total[j] += part[j];                                                               \
        }                                                                                          \
        for (int64_t j = 0; j < t->ncols; j++)                                                     \
            SETV_##S(&a[j], total[j]);                                                             \
    }                                                                                              \
    DEFINE_INNER(sum_##MAP, S)

#define DEFINE_PROD_KERNELS(S)                                                                     \
    static void prod_run_##S(red_acc *a, const void *vx, int64_t n, int64_t pos, double c) {       \
        const comp_##S *x = vx;                                                                    \
        TOTAL_##S p[LANES(S)];                                                                     \
        for (int j = 0; j < LANES(S); j++)                                                         \
            p[j] = 1;                                                                              \
        int64_t i = 0;                                                                             \
        for (; n - i >= LANES(S); i += LANES(S))                                                   \
            for (int j = 0; j < LANES(S); j++)                                                     \
                p[j] *= (TOTAL_##S)x[i + j];                                                       \
        for (int j = 0; j < LANES(S) && i < n; j++)                                                \
            p[j] *= i + j < n ? (TOTAL_##S)x[i + j] : 1;                                           \
        for (int w = LANES(S) / 2; w > 0; w /= 2)                                                  \
            for (int j = 0; j < w; j++)                                                            \
                p[j] *= p[j + w];                                                                  \
        SETV_##S(a, p[0]);                                                                         \
    }                                                                                              \
    static void prod_outer_##S(red_acc *a, red_rows *t, double c) {                                \
        const void *rows[RED_SUB];                                                                 \
        TOTAL_##S p[RED_COLS];                                                                     \
        for (int64_t j = 0; j < t->ncols; j++)                                                     \
            p[j] = 1;                                                                              \
        for (int64_t n; (n = next_rows(t, rows)) > 0;)                                             \
            FOLD_COLUMNS(S, TOTAL_##S, p, rows, n, t->ncols, STEP_PROD, 0);                        \
        for (int64_t j = 0; j < t->ncols; j++)                                                     \
            SETV_##S(&a[j], p[j]);                                                                 \
    }                                                                                              \
    DEFINE_INNER(prod, S)

#define DEFINE_EXTREME_KERNELS(S, MAP, NAME, BETTER, PICK, INIT)                                   \
    DEFINE_EXTREME(S, MAP, NAME, BETTER, INIT)                                                     \
    static void NAME##_##MAP##_run_##S(red_acc *a, const void *x, int64_t n, int64_t pos,          \
                                       double c) {                                                 \
        SETV_##S(a, NAME##_##MAP##_##S(x, n));                                                     \
    }                                                                                              \
    static void NAME##_##MAP##_outer_##S(red_acc *a, red_rows *t, double c) {                      \
        const void *rows[RED_SUB];                                                                 \
        comp_##S m[RED_COLS];                                                                      \
        for (int64_t j = 0; j < t->ncols; j++)                                                     \
            m[j] = INIT##_##S;                                                                     \
        for (int64_t n; (n = next_rows(t, rows)) > 0;)                                             \
            FOLD_COLUMNS(S, comp_##S, m, rows, n, t->ncols, STEP_PICK, MAP, PICK);                 \
        for (int64_t j = 0; j < t->ncols; j++)                                                     \
            SETV_##S(&a[j], m[j]);                                                                 \
    }                                                                                              \
    DEFINE_INNER(NAME##_##MAP, S)

/* The squared deviations of float input from mean: in float lanes, fast
 * but with float's range, where a square underflows below deviations of
 * about 1e-19 and overflows above 2e19 though the std is still a normal
 * float. A sum small enough for underflow to matter, or not finite, is
 * redone in double lanes, as PyTorch accumulates var in double. */
static double sum_DEV_f(const float *x, int64_t n, float c);
static double sum_DEV_d(const double *x, int64_t n, double c);

static double dev_f(const float *x, int64_t n, double mean) {
    double m2 = sum_DEV_f(x, n, (float)mean);
    if (isfinite(m2) && m2 >= (double)n * 0x1p-100)
        return m2;
    double part[32] = {0};
    int64_t i = 0;
    for (; n - i >= 32; i += 32)
        for (int j = 0; j < 32; j++)
            part[j] += ((double)x[i + j] - mean) * ((double)x[i + j] - mean);
    for (int j = 0; j < 32 && i + j < n; j++)
        part[j] += ((double)x[i + j] - mean) * ((double)x[i + j] - mean);
    for (int w = 16; w > 0; w /= 2)
        for (int j = 0; j < w; j++)
            part[j] += part[j + w];
    return part[0];
}

static double dev_d(const double *x, int64_t n, double mean) { return sum_DEV_d(x, n, mean); }

/* Variance: two passes over data that is in cache, mean then squared
 * deviations; partials merge with Chan's formula. */
#define DEFINE_VAR_KERNELS(S)                                                                      \
    static void var_run_##S(red_acc *a, const void *x, int64_t n, int64_t pos, double c) {         \
        double mean = (double)sum_ID_##S(x, n, 0) / (double)n;                                     \
        a->i[0] = n;                                                                               \
        a->f[0] = mean;                                                                            \
        a->f[1] = dev_##S(x, n, mean);                                                             \
    }                                                                                              \
    static void var_outer_##S(red_acc *a, red_rows *t, double c) {                                 \
        const void *rows[RED_SUB];                                                                 \
        double mean[RED_COLS], m2[RED_COLS];                                                       \
        for (int64_t n; (n = next_rows(t, rows)) > 0;) {                                           \
            for (int64_t j = 0; j < t->ncols; j++)                                                 \
                mean[j] = m2[j] = 0;                                                               \
            FOLD_COLUMNS(S, double, mean, rows, n, t->ncols, STEP_SUM, ID, 0);                     \
            for (int64_t j = 0; j < t->ncols; j++)                                                 \
                mean[j] /= (double)n;                                                              \
            FOLD_COLUMNS(S, double, m2, rows, n, t->ncols, STEP_DEV, mean);                        \
            for (int64_t j = 0; j < t->ncols; j++)                                                 \
                merge(CT__RED_VAR, false, &a[j], &(red_acc){{mean[j], m2[j]}, {n, 0}});            \
        }                                                                                          \
    }                                                                                              \
    DEFINE_INNER(var, S)

/* logsumexp: the max, then the sum of exp(x - max). A non-finite max decides
 * the result alone, and exp(-inf - -inf) would be NaN, so its sum is 0. */
#define DEFINE_LSE_KERNELS(S)                                                                      \
    static void lse_run_##S(red_acc *a, const void *x, int64_t n, int64_t pos, double c) {         \
        comp_##S m = max_ID_##S(x, n);                                                             \
        a->f[0] = m;                                                                               \
        a->f[1] = isfinite(m) ? sum_EXP_##S(x, n, m) : 0;                                          \
    }                                                                                              \
    static void lse_outer_##S(red_acc *a, red_rows *t, double c) {                                 \
        const void *rows[RED_SUB];                                                                 \
        comp_##S m[RED_COLS];                                                                      \
        TOTAL_##S s[RED_COLS];                                                                     \
        for (int64_t n; (n = next_rows(t, rows)) > 0;) {                                           \
            for (int64_t j = 0; j < t->ncols; j++) {                                               \
                m[j] = LOWEST_##S;                                                                 \
                s[j] = 0;                                                                          \
            }                                                                                      \
            FOLD_COLUMNS(S, comp_##S, m, rows, n, t->ncols, STEP_PICK, ID, PICK_MAX);              \
            FOLD_COLUMNS(S, TOTAL_##S, s, rows, n, t->ncols, STEP_EXP, m);                         \
            for (int64_t j = 0; j < t->ncols; j++)                                                 \
                merge(CT__RED_LSE, false, &a[j],                                                   \
                      &(red_acc){{m[j], isfinite(m[j]) ? s[j] : 0}, {0, 0}});                      \
        }                                                                                          \
    }                                                                                              \
    DEFINE_INNER(lse, S)

/* The first index of the extreme. A run finds the value vectorised, then
 * scans for its first occurrence (the first NaN when it is NaN); rows only
 * replace on a strictly better value, and never replace a NaN. */
#define DEFINE_ARG_KERNELS(S, NAME, PICK, INIT)                                                    \
    static void arg##NAME##_run_##S(red_acc *a, const void *vx, int64_t n, int64_t pos,            \
                                    double c) {                                                    \
        const comp_##S *x = vx;                                                                    \
        comp_##S m = NAME##_ID_##S(x, n);                                                          \
        int64_t i = 0;                                                                             \
        while (i < n && !(x[i] == m || (ISNAN_##S(m) && ISNAN_##S(x[i]))))                         \
            i++;                                                                                   \
        SETV_##S(a, m);                                                                            \
        a->i[1] = pos + i;                                                                         \
    }                                                                                              \
    static void arg##NAME##_outer_##S(red_acc *a, red_rows *t, double c) {                         \
        const void *rows[RED_SUB];                                                                 \
        int64_t row0 = t->next;                                                                    \
        comp_##S best[RED_COLS];                                                                   \
        ROW_##S idx[RED_COLS];                                                                     \
        for (int64_t j = 0; j < t->ncols; j++) {                                                   \
            best[j] = INIT##_##S;                                                                  \
            idx[j] = 0;                                                                            \
        }                                                                                          \
        for (int64_t n; (n = next_rows(t, rows)) > 0;)                                             \
            for (int64_t r = 0; r < n; r++) {                                                      \
                const comp_##S *x = rows[r];                                                       \
                ROW_##S row = (ROW_##S)(t->next - n + r - row0);                                   \
                for (int64_t j = 0; j < t->ncols; j++) {                                           \
                    int take = (!ISNAN_##S(best[j])) & PICK(S, x[j], best[j]);                     \
                    best[j] = SEL_##S(take, x[j], best[j]);                                        \
                    idx[j] = take ? row : idx[j];                                                  \
                }                                                                                  \
            }                                                                                      \
        for (int64_t j = 0; j < t->ncols; j++) {                                                   \
            SETV_##S(&a[j], best[j]);                                                              \
            a[j].i[1] = row0 + idx[j];                                                             \
        }                                                                                          \
    }                                                                                              \
    DEFINE_INNER(arg##NAME, S)

#define DEFINE_FLOAT_KERNELS(S)                                                                    \
    DEFINE_SUM(S, ID)                                                                              \
    DEFINE_SUM(S, ABS)                                                                             \
    DEFINE_SUM(S, NZ)                                                                              \
    DEFINE_SUM(S, POW)                                                                             \
    DEFINE_SUM(S, SQR)                                                                             \
    DEFINE_SUM(S, DEV)                                                                             \
    DEFINE_SUM(S, EXP)                                                                             \
    DEFINE_SUM_KERNELS(S, ID)                                                                      \
    DEFINE_SUM_KERNELS(S, ABS)                                                                     \
    DEFINE_SUM_KERNELS(S, NZ)                                                                      \
    DEFINE_SUM_KERNELS(S, POW)                                                                     \
    DEFINE_SUM_KERNELS(S, SQR)                                                                     \
    DEFINE_PROD_KERNELS(S)                                                                         \
    DEFINE_EXTREME_KERNELS(S, ID, max, ABOVE, PICK_MAX, LOWEST)                                    \
    DEFINE_EXTREME_KERNELS(S, ID, min, BELOW, PICK_MIN, HIGHEST)                                   \
    DEFINE_EXTREME_KERNELS(S, ABS, max, ABOVE, PICK_MAX, LOWEST)                                   \
    DEFINE_EXTREME_KERNELS(S, ABS, min, BELOW, PICK_MIN, HIGHEST)                                  \
    DEFINE_VAR_KERNELS(S)                                                                          \
    DEFINE_LSE_KERNELS(S)                                                                          \
    DEFINE_ARG_KERNELS(S, max, PICK_MAX, LOWEST)                                                   \
    DEFINE_ARG_KERNELS(S, min, PICK_MIN, HIGHEST)

DEFINE_FLOAT_KERNELS(f)
DEFINE_FLOAT_KERNELS(d)
DEFINE_SUM(i, ID)
DEFINE_SUM_KERNELS(i, ID)
DEFINE_PROD_KERNELS(i)
DEFINE_EXTREME_KERNELS(i, ID, max, ABOVE, PICK_MAX, LOWEST)
DEFINE_EXTREME_KERNELS(i, ID, min, BELOW, PICK_MIN, HIGHEST)
DEFINE_ARG_KERNELS(i, max, PICK_MAX, LOWEST)
DEFINE_ARG_KERNELS(i, min, PICK_MIN, HIGHEST)

float ct__red_max_f32(const float *x, int64_t n) { return max_ID_f(x, n); }
double ct__red_max_f64(const double *x, int64_t n) { return max_ID_d(x, n); }
double ct__red_sum_f32(const float *x, int64_t n) { return sum_ID_f(x, n, 0); }
double ct__red_sum_f64(const double *x, int64_t n) { return sum_ID_d(x, n, 0); }
double ct__red_sumexp_f32(const float *x, int64_t n, float c) { return sum_EXP_f(x, n, c); }
double ct__red_sumexp_f64(const double *x, int64_t n, double c) { return sum_EXP_d(x, n, c); }

/* ---------------------------------------------------------------- kinds */

typedef struct red_kernels {
    red_family fam;
    red_inner_fn inner[NCOMP];
    red_outer_fn outer[NCOMP];
} red_kernels;

#define KERNELS_FLOAT(fam, name)                                                                   \
    {                                                                                              \
        fam, {name##_inner_f, name##_inner_d, NULL}, { name##_outer_f, name##_outer_d, NULL }      \
    }
#define KERNELS_ALL(fam, name)                                                                     \
    {                                                                                              \
        fam, {name##_inner_f, name##_inner_d, name##_inner_i}, {                                   \
            name##_outer_f, name##_outer_d, name##_outer_i                                         \
        }                                                                                          \
    }

static const red_kernels kinds[] = {
    [CT__KIND_SUM] = KERNELS_ALL(CT__RED_SUM, sum_ID),
    [CT__KIND_SUM_ABS] = KERNELS_FLOAT(CT__RED_SUM, sum_ABS),
    [CT__KIND_SUM_NZ] = KERNELS_FLOAT(CT__RED_SUM, sum_NZ),
    [CT__KIND_SUM_POW] = KERNELS_FLOAT(CT__RED_SUM, sum_POW),
    [CT__KIND_SUM_SQR] = KERNELS_FLOAT(CT__RED_SUM, sum_SQR),
    [CT__KIND_PROD] = KERNELS_ALL(CT__RED_PROD, prod),
    [CT__KIND_MAX] = KERNELS_ALL(CT__RED_MAX, max_ID),
    [CT__KIND_MIN] = KERNELS_ALL(CT__RED_MIN, min_ID),
    [CT__KIND_MAX_ABS] = KERNELS_FLOAT(CT__RED_MAX, max_ABS),
    [CT__KIND_MIN_ABS] = KERNELS_FLOAT(CT__RED_MIN, min_ABS),
    [CT__KIND_VAR] = KERNELS_FLOAT(CT__RED_VAR, var),
    [CT__KIND_LSE] = KERNELS_FLOAT(CT__RED_LSE, lse),
    [CT__KIND_ARGMAX] = KERNELS_ALL(CT__RED_ARGMAX, argmax),
    [CT__KIND_ARGMIN] = KERNELS_ALL(CT__RED_ARGMIN, argmin),
};

/* ---------------------------------------------------------------- driver */

typedef struct red_job {
    ct__red_plan plan;
    const red_kernels *k;
    int comp;
    ct_dtype comp_dtype;
    int64_t comp_size;
    ct__loop_fn load; /* input dtype -> compute type */
    bool direct;      /* the input already has the compute type */
    bool int_result;  /* store i[0] rather than a finished double */
    bool index_only;  /* argmax: the output holds the index */
    char *out;        /* element 0 of the output */
    char *indices;    /* max_dim's indices (same layout as out), or NULL */
    ct_dtype out_dtype;
    int64_t out_size;
    int post;         /* CT__POST_* */
    double scalar;    /* correction (var, std) or p (norm, and the pow map) */
    int64_t nred;     /* reduced elements per output */
    int64_t chunk;    /* per chunk: elements (inner) or rows (outer) */
    int64_t nchunk;   /* chunks per output */
    int64_t ncols;    /* outer: columns per tile */
    int64_t ncb;      /* outer: column tiles per row of kept dim 0 */
    red_acc *partial; /* [output][chunk] when nchunk > 1 */
    red_acc ident;    /* the family's identity */
    bool plain;       /* f[0] is the output value as it stands */
} red_job;

static double finish(const red_job *j, const red_acc *a) {
    double v = a->f[0];
    switch (j->k->fam) {
    case CT__RED_VAR: {
        double dof = (double)a->i[0] - j->scalar;
        v = a->f[1] / (dof > 0 ? dof : 0);
        break;
    }
    case CT__RED_LSE: v = isfinite(v) ? v + log(a->f[1]) : v; break;
    default: break;
    }
    switch (j->post) {
    case CT__POST_NONE: return v;
    case CT__POST_MEAN: return v / (double)j->nred;
    case CT__POST_SQRT: return sqrt(v);
    case CT__POST_ROOT: return pow(v, 1.0 / j->scalar);
    }
    return v;
}

static void store_int(ct_dtype dtype, char *p, int64_t v) {
    switch (dtype) {
    case CT_INT64: *(int64_t *)p = v; return;
    case CT_INT32: *(int32_t *)p = (int32_t)v; return;
    case CT_UINT8: *(uint8_t *)p = (uint8_t)v; return;
    case CT_BOOL: *(uint8_t *)p = v != 0; return;
    default: ct__tensor_store_double(dtype, p, (double)v); return;
    }
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Writes the output at byte offset off (and max_dim's index beside it). */
static void emit(const red_job *j, const red_acc *a, int64_t off) {
    if (j->indices)
        *(int64_t *)(j->indices + off / j->out_size * 8) = a->i[1];
    if (j->index_only)
        *(int64_t *)(j->out + off) = a->i[1];
    else if (j->int_result)
        store_int(j->out_dtype, j->out + off, a->i[0]);
    else if (j->plain && j->out_dtype == CT_FLOAT32)
        *(float *)(j->out + off) = (float)a->f[0];
    else
        ct__tensor_store_double(j->out_dtype, j->out + off, finish(j, a));
}

/* Either keeps the finished chunk's partial for the merge pass, or, with a
 * single chunk, writes the output. */
static void chunk_done(const red_job *j, const red_acc *a, int64_t o, int64_t c, int64_t off) {
    if (j->nchunk > 1)
        j->partial[o * j->nchunk + c] = *a;
    else
        emit(j, a, off);
}

/* Folds n elements at src (byte stride) into acc, converting through scratch
 * unless they are already contiguous values of the compute type. The first
 * piece of a chunk goes straight into acc (*fresh): a kernel's partial of
 * the whole chunk needs no merge. */
static void fold_run(const red_job *j, red_acc *acc, bool *fresh, const char *src, int64_t stride,
                     int64_t n, int64_t pos, char *scratch) {
    bool direct = j->direct && stride == j->comp_size;
    for (int64_t b = 0, len; b < n; b += len) {
        len = direct ? n : min64(n - b, RED_SCRATCH);
        const char *x = src + b * stride;
        if (!direct) {
            j->load(NULL, (char *[]){scratch, (char *)x}, (const int64_t[]){j->comp_size, stride},
                    len);
            x = scratch;
        }
        if (*fresh) {
            j->k->inner[j->comp](acc, x, len, pos + b, 1, 0, j->scalar);
            *fresh = false;
        } else {
            red_acc part = j->ident;
            j->k->inner[j->comp](&part, x, len, pos + b, 1, 0, j->scalar);
            merge(j->k->fam, j->comp == COMP_I, acc, &part);
        }
    }
}

/* Outputs [lo, hi) when each is one contiguous run of compute-type values:
 * RED_BATCH of them per kernel call. */
static void whole_runs(const red_job *j, int64_t lo, int64_t hi) {
    const ct__red_plan *p = &j->plan;
    red_acc acc[RED_BATCH];
    ct__red_pos kp;
    ct__red_seek(&p->kept, 2, lo, &kp);
    for (int64_t o = lo, nb; o < hi; o += nb) {
        nb = min64(min64(RED_BATCH, hi - o), p->kept.shape[0] - kp.idx[0]);
        for (int64_t b = 0; b < nb; b++)
            acc[b] = j->ident;
        j->k->inner[j->comp](acc, p->it.data[0] + kp.off[0], p->red.shape[0], 0, nb,
                             p->kept.strides[0][0], j->scalar);
        for (int64_t b = 0; b < nb; b++)
            emit(j, &acc[b], kp.off[1] + b * p->kept.strides[0][1]);
        ct__red_advance(&p->kept, 2, &kp, nb);
    }
}

/* Items are (output, chunk) pairs; a chunk is a range of reduced elements,
 * walked as runs along red's dim 0. */
static void inner_items(void *ctx, int64_t lo, int64_t hi) {
    const red_job *j = ctx;
    const ct__red_plan *p = &j->plan;
    if (j->nchunk == 1 && p->red.ndim == 1 && j->direct && p->red.strides[0][0] == j->comp_size) {
        whole_runs(j, lo, hi);
        return;
    }
    _Alignas(64) char scratch[RED_SCRATCH * 8];
    int64_t o = lo / j->nchunk, c = lo % j->nchunk;
    ct__red_pos kp;
    ct__red_seek(&p->kept, 2, o, &kp);
    for (int64_t it = lo; it < hi; it++) {
        red_acc acc = j->ident;
        bool fresh = true;
        int64_t r = c * j->chunk, end = min64(r + j->chunk, j->nred);
        ct__red_pos rp;
        ct__red_seek(&p->red, 1, r, &rp);
        while (r < end) {
            int64_t len = min64(p->red.shape[0] - rp.idx[0], end - r);
            fold_run(j, &acc, &fresh, p->it.data[0] + kp.off[0] + rp.off[0], p->red.strides[0][0],
                     len, r, scratch);
            r += len;
            ct__red_advance(&p->red, 1, &rp, len);
        }
        chunk_done(j, &acc, o, c, kp.off[1]);
        if (++c == j->nchunk) {
            c = 0;
            o++;
            ct__red_advance(&p->kept, 2, &kp, 1);
        }
    }
}

/* Items are (tile of kept-dim-0 columns, chunk of rows) pairs. */
static void outer_items(void *ctx, int64_t lo, int64_t hi) {
    const red_job *j = ctx;
    const ct__red_plan *p = &j->plan;
    _Alignas(64) char scratch[RED_SUB * RED_COLS * 8];
    red_acc part[RED_COLS];
    int64_t width = p->kept.shape[0];
    red_rows t = {.red = &p->red,
                  .col_stride = p->kept.strides[0][0],
                  .comp_size = j->comp_size,
                  .load = j->load,
                  .scratch = scratch};
    t.direct = j->direct && t.col_stride == j->comp_size;
    for (int64_t it = lo; it < hi; it++) {
        int64_t c = it % j->nchunk, tile = it / j->nchunk;
        int64_t col0 = tile % j->ncb * j->ncols;
        int64_t o0 = tile / j->ncb * width + col0;
        ct__red_pos kp;
        ct__red_seek(&p->kept, 2, o0, &kp);
        t.base = p->it.data[0] + kp.off[0];
        t.ncols = min64(width - col0, j->ncols);
        t.next = c * j->chunk;
        t.end = min64(t.next + j->chunk, j->nred);
        ct__red_seek(&p->red, 1, t.next, &t.pos);
        for (int64_t k = 0; k < t.ncols; k++)
            part[k] = j->ident;
        j->k->outer[j->comp](part, &t, j->scalar);
        for (int64_t k = 0; k < t.ncols; k++)
            chunk_done(j, &part[k], o0 + k, c, kp.off[1] + k * p->kept.strides[0][1]);
    }
}

/* Merges each output's chunks in order. */
static void merge_items(void *ctx, int64_t lo, int64_t hi) {
    const red_job *j = ctx;
    ct__red_pos kp;
    ct__red_seek(&j->plan.kept, 2, lo, &kp);
    for (int64_t o = lo; o < hi; o++) {
        const red_acc *part = j->partial + o * j->nchunk;
        red_acc acc = part[0];
        for (int64_t c = 1; c < j->nchunk; c++)
            merge(j->k->fam, j->comp == COMP_I, &acc, &part[c]);
        emit(j, &acc, kp.off[1]);
        ct__red_advance(&j->plan.kept, 2, &kp, 1);
    }
}

static int64_t grain_for(int64_t work_per_item) {
    int64_t g = CT__GRAIN_REDUCE / (work_per_item > 0 ? work_per_item : 1);
    return g > 1 ? g : 1;
}

/* Reduces in (with the dims in mask) into the contiguous out. */
static int run(const char *op, red_job *j, ct_tensor *in, ct_tensor *out, const bool *mask,
               bool keepdim) {
    int64_t nout = ct_numel(out);
    j->nred = 1;
    for (int d = 0; d < in->ndim; d++)
        j->nred *= mask[d] ? in->sizes[d] : 1;
    if (nout == 0)
        return 0;
    if (j->nred == 0) {
        for (int64_t o = 0; o < nout; o++)
            emit(j, &j->ident, o * j->out_size);
        return 0;
    }
    ct_tensor marker;
    ct__red_marker(&marker, out, in, mask, keepdim);
    ct__red_plan_init(&j->plan, (ct_tensor *[]){in, &marker}, 2);
    const ct__red_plan *p = &j->plan;
    int64_t nitems, work;
    ct_parallel_fn items;
    if (p->inner) {
        j->chunk = RED_CHUNK;
        j->nchunk = (j->nred + j->chunk - 1) / j->chunk;
        nitems = nout * j->nchunk;
        work = min64(j->nred, j->chunk);
        items = inner_items;
    } else {
        j->ncols = min64(p->kept.shape[0], RED_COLS);
        j->ncb = (p->kept.shape[0] + j->ncols - 1) / j->ncols;
        j->chunk = RED_OUTER_CHUNK / j->ncols;
        j->nchunk = (j->nred + j->chunk - 1) / j->chunk;
        nitems = nout / p->kept.shape[0] * j->ncb * j->nchunk;
        work = j->ncols * min64(j->nred, j->chunk);
        items = outer_items;
    }
    if (j->nchunk > 1) {
        j->partial = malloc(sizeof(red_acc) * (size_t)(nout * j->nchunk));
        if (!j->partial)
            return ct__err_set(CT_ENOMEM, "%s: out of memory for %lld partial results", op,
                               (long long)(nout * j->nchunk));
    }
    ct_parallel_for(0, nitems, grain_for(work), items, j);
    if (j->nchunk > 1) {
        ct_parallel_for(0, nout, grain_for(j->nchunk), merge_items, j);
        free(j->partial);
    }
    return 0;
}

/* ------------------------------------------------------------ front end */

int ct__cpu_reduce(const ct__reduction *r, ct_tensor *t, ct_tensor *out, ct_tensor *idx,
                   const bool *mask, bool keepdim) {
    const red_kernels *k = &kinds[r->kind];
    red_job j = {.k = k, .post = r->post, .scalar = r->scalar, .ident = identity(k->fam)};
    j.comp = t->dtype == CT_FLOAT64                        ? COMP_D
             : ct_dtype_is_float(t->dtype) || r->float_out ? COMP_F
                                                           : COMP_I;
    j.comp_dtype = (ct_dtype[]){CT_FLOAT32, CT_FLOAT64, CT_INT64}[j.comp];
    j.comp_size = (int64_t)ct_dtype_size(j.comp_dtype);
    j.load = ct__cpu_cast_kernel(j.comp_dtype, t->dtype);
    j.direct = t->dtype == j.comp_dtype;
    j.int_result = j.comp == COMP_I;
    j.index_only = r->index_only;
    j.out_dtype = out->dtype;
    j.out_size = (int64_t)ct_dtype_size(j.out_dtype);
    j.plain = k->fam != CT__RED_VAR && k->fam != CT__RED_LSE && r->post == CT__POST_NONE;
    j.out = ct__data(out);
    j.indices = idx ? ct__data(idx) : NULL;
    return run(r->name, &j, t, out, mask, keepdim);
}
