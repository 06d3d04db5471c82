/* Optimizers against double-precision restatements of PyTorch 1.13's update
 * rules and against figures from PyTorch itself; the flat path against the
 * per-parameter path bit for bit; zero_grad, clipping, schedules, state
 * access and bad input. */
#include "ct_test.h"

#include <ct/autograd.h>
#include <ct/optim.h>

#include <stdlib.h>

/* Element i of a contiguous float tensor. */
static double val(ct_tensor *t, int64_t i) {
    if (ct_tensor_dtype(t) == CT_FLOAT32)
        return ((const float *)ct_data_ptr(t))[i];
    return ((const double *)ct_data_ptr(t))[i];
}

/* The n elements of a contiguous float tensor, as doubles. */
static void read_doubles(ct_tensor *t, double *out, int64_t n) {
    if (ct_tensor_dtype(t) == CT_FLOAT32) {
        const float *p = ct_data_ptr(t);
        for (int64_t i = 0; i < n; i++)
            out[i] = p[i];
    } else {
        memcpy(out, ct_data_ptr(t), (size_t)n * sizeof *out);
    }
}

static ct_tensor *doubles(int n, const double *v) {
    return ct_from_data(v, 1, (int64_t[]){n}, CT_FLOAT64);
}

/* ------------------------------------------------------------ the model */

/* Parameter shapes: a large one so that a step splits across threads, and
 * odd sizes for the vector loops' remainders. */
#define NP 6
static const int64_t shapes[NP][2] = {{5, 7}, {1, 13}, {64, 600}, {3, 1}, {1, 1}, {17, 33}};

typedef struct model {
    ct_dtype dtype;
    ct_tensor *p[NP];
    ct_tensor *g[NP]; /* flat: views of gbuf, the parameters' gradients */
    ct_tensor *pbuf, *gbuf;
    int64_t offset[NP + 1];
} model;

static int64_t numel_of(int i) { return shapes[i][0] * shapes[i][1]; }

/* The same initial values either as views tiling one flat buffer (with a
 * flat gradient buffer) or as separate tensors. */
static bool model_init(model *m, ct_dtype dtype, bool flat, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    for (int i = 0; i < NP; i++)
        m->offset[i + 1] = m->offset[i] + numel_of(i);
    int64_t total = m->offset[NP];
    ct_tensor *init = tt_rand(CT_SHAPE(total), dtype, seed);
    if (flat) {
        m->pbuf = ct_clone(init);
        m->gbuf = ct_zeros(CT_SHAPE(total), dtype);
    }
    for (int i = 0; i < NP; i++) {
        int64_t n = numel_of(i);
        if (flat) {
            m->p[i] = ct_view(ct_narrow(m->pbuf, 0, m->offset[i], n), 2, shapes[i]);
            m->g[i] = ct_view(ct_narrow(m->gbuf, 0, m->offset[i], n), 2, shapes[i]);
        } else {
            m->p[i] = ct_clone(ct_view(ct_narrow(init, 0, m->offset[i], n), 2, shapes[i]));
        }
        if (!ct_requires_grad_(m->p[i], true))
            return false;
    }
    return true;
}

/* Gives every parameter not in skip a fresh gradient for step; those in
 * skip get none. */
static bool model_grads(model *m, int step, unsigned skip) {
    for (int i = 0; i < NP; i++) {
        if (skip & (1u << i)) {
            if (ct_tensor_set_grad(m->p[i], NULL))
                return false;
            continue;
        }
        ct_tensor *v = tt_rand(2, shapes[i], m->dtype, 1000 + (uint64_t)step * 16 + (uint64_t)i);
        if (m->gbuf && !ct_copy_(m->g[i], v))
            return false;
        if (ct_tensor_set_grad(m->p[i], m->gbuf ? m->g[i] : v))
            return false;
    }
    return true;
}

/* ------------------------------------------------------------ reference */

/* PyTorch's _single_tensor_sgd / _adam / _adamw in double precision, one
 * parameter at a time with its own step count. */
typedef struct ref {
    int64_t total;
    double *p, *buf, *m, *v, *vmax;
    int64_t step[NP];
} ref;

static void ref_init(ref *r, const model *m) {
    r->total = m->offset[NP];
    double *all = calloc((size_t)r->total * 5, sizeof(double));
    r->p = all;
    r->buf = all + r->total;
    r->m = all + 2 * r->total;
    r->v = all + 3 * r->total;
    r->vmax = all + 4 * r->total;
    memset(r->step, 0, sizeof r->step);
    for (int i = 0; i < NP; i++)
        read_doubles(m->p[i], r->p + m->offset[i], numel_of(i));
}

static void ref_free(ref *r) { free(r->p); }

static void ref_update(const ct_optim_options *o, double lr, double wd, int64_t step, double *p,
                       const double *g, double *buf, double *m, double *v, double *vmax,
                       int64_t n) {
    double bc1 = 1 - pow(o->beta1, (double)step), bc2 = sqrt(1 - pow(o->beta2, (double)step));
    for (int64_t j = 0; j < n; j++) {
        if (o->kind == CT_OPTIM_SGD) {
            double d = g[j] + wd * p[j];
            if (o->momentum != 0) {
                buf[j] = step == 1 ? d : o->momentum * buf[j] + (1 - o->dampening) * d;
                d = o->nesterov ? d + o->momentum * buf[j] : buf[j];
            }
            p[j] -= lr * d;
            continue;
        }
        double x = p[j], d = g[j];
        if (o->kind == CT_OPTIM_ADAMW)
            x *= 1 - lr * wd;
        else
            d += wd * x;
        m[j] = o->beta1 * m[j] + (1 - o->beta1) * d;
        v[j] = o->beta2 * v[j] + (1 - o->beta2) * d * d;
        double s = v[j];
        if (o->amsgrad)
            s = vmax[j] = fmax(vmax[j], v[j]);
        double denom = sqrt(s) / bc2 + o->eps;
        p[j] = x - lr / bc1 * (m[j] / denom);
    }
}

/* One step of the reference with the model's current gradients; wd and
 * lr_scale per parameter. */
static void ref_step(ref *r, const model *md, const ct_optim_options *o, const double *wd,
                     const double *lr_scale) {
    for (int i = 0; i < NP; i++) {
        ct_tensor *g = ct_tensor_grad(md->p[i]);
        if (!g)
            continue;
        int64_t off = md->offset[i], n = numel_of(i);
        double *gd = malloc((size_t)n * sizeof *gd);
        read_doubles(g, gd, n);
        r->step[i]++;
        ref_update(o, o->lr * lr_scale[i], wd[i], r->step[i], r->p + off, gd, r->buf + off,
                   r->m + off, r->v + off, r->vmax + off, n);
        free(gd);
    }
}

static bool model_matches_ref(const model *m, const ref *r, double tol, const char *what) {
    double *got = malloc((size_t)r->total * sizeof *got);
    bool ok = true;
    for (int i = 0; i < NP && ok; i++) {
        read_doubles(m->p[i], got, numel_of(i));
        for (int64_t j = 0; j < numel_of(i) && ok; j++) {
            double want = r->p[m->offset[i] + j];
            if (!(fabs(got[j] - want) <= tol * (1 + fabs(want)))) {
                tt_fail(__FILE__, __LINE__, "%s: param %d [%lld]: %.17g vs reference %.17g", what,
                        i, (long long)j, got[j], want);
                ok = false;
            }
        }
    }
    free(got);
    return ok;
}

static bool models_identical(const model *a, const model *b, const char *what) {
    for (int i = 0; i < NP; i++) {
        size_t bytes = (size_t)numel_of(i) * ct_dtype_size(a->dtype);
        if (memcmp(ct_data_ptr(a->p[i]), ct_data_ptr(b->p[i]), bytes) != 0) {
            for (int64_t j = 0; j < numel_of(i); j++)
                if (val(a->p[i], j) != val(b->p[i], j)) {
                    tt_fail(__FILE__, __LINE__, "%s: param %d [%lld]: flat %.17g, separate %.17g",
                            what, i, (long long)j, val(a->p[i], j), val(b->p[i], j));
                    break;
                }
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ configs */

static ct_optim_options sgd(double lr, double momentum, double dampening, bool nesterov,
                            double wd) {
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, lr);
    o.momentum = momentum;
    o.dampening = dampening;
    o.nesterov = nesterov;
    o.weight_decay = wd;
    return o;
}

static ct_optim_options adam(ct_optim_kind kind, double lr, double b1, double b2, double eps,
                             double wd, bool amsgrad) {
    ct_optim_options o = ct_optim_defaults(kind, lr);
    o.beta1 = b1;
    o.beta2 = b2;
    o.eps = eps;
    o.weight_decay = wd;
    o.amsgrad = amsgrad;
    return o;
}

#define NCONFIGS 10
static ct_optim_options config(int i) {
    switch (i) {
    case 0: return sgd(0.1, 0, 0, false, 0);
    case 1: return sgd(0.1, 0.9, 0, false, 0);
    case 2: return sgd(0.05, 0.8, 0.3, false, 1e-2);
    case 3: return sgd(0.1, 0.9, 0, true, 1e-2);
    case 4: return adam(CT_OPTIM_ADAM, 1e-2, 0.9, 0.999, 1e-8, 0, false);
    case 5: return adam(CT_OPTIM_ADAM, 1e-2, 0.9, 0.999, 1e-8, 0.1, false);
    case 6: return adam(CT_OPTIM_ADAM, 1e-2, 0.8, 0.95, 1e-6, 0.1, true);
    case 7: return adam(CT_OPTIM_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 1e-2, false);
    case 8: return adam(CT_OPTIM_ADAMW, 3e-2, 0.5, 0.9, 1e-8, 0.05, true);
    default: return adam(CT_OPTIM_ADAM, 1e-3, 0, 0, 0, 0, false);
    }
}

static const char *config_name(int i) {
    static const char *const names[NCONFIGS] = {
        "sgd",           "sgd momentum",      "sgd dampening wd", "sgd nesterov wd",
        "adam",          "adam wd",           "adam amsgrad wd",  "adamw",
        "adamw amsgrad", "adam betas 0 eps 0"};
    return names[i];
}

/* Runs nsteps of config c on a fresh model (skip: parameters without a
 * gradient at step 2) and checks every step against the reference. The
 * model is left in *m for bitwise comparisons. */
static bool run_config(int c, ct_dtype dtype, bool flat, unsigned skip, int nsteps, model *m) {
    ct_optim_options o = config(c);
    char what[96];
    snprintf(what, sizeof what, "%s, %s, %s", config_name(c), ct_dtype_name(dtype),
             flat ? "flat" : "separate");
    if (!model_init(m, dtype, flat, 7)) {
        tt_fail(__FILE__, __LINE__, "%s: model: %s", what, ct_errmsg());
        return false;
    }
    ct_optim *opt = ct_optim_new(&o, m->p, NP);
    if (!opt) {
        tt_fail(__FILE__, __LINE__, "%s: optim_new: %s", what, ct_errmsg());
        return false;
    }
    ref r;
    ref_init(&r, m);
    double wd[NP], scale[NP];
    for (int i = 0; i < NP; i++) {
        wd[i] = o.weight_decay;
        scale[i] = 1;
    }
    /* float32 rounds each of ~10 operations per step; float64 only the
     * order of operations differs from the reference. */
    double tol = dtype == CT_FLOAT32 ? 2e-6 * nsteps : 1e-13;
    bool ok = true;
    for (int s = 0; s < nsteps && ok; s++) {
        ct_scope_begin();
        ok = model_grads(m, s, s == 2 ? skip : 0);
        ok = ok && ct_optim_step(opt) == 0;
        if (!ok)
            tt_fail(__FILE__, __LINE__, "%s: step %d: %s", what, s, ct_errmsg());
        ref_step(&r, m, &o, wd, scale);
        ok = ok && model_matches_ref(m, &r, tol, what);
        ct_scope_end();
    }
    ref_free(&r);
    ct_optim_free(opt);
    return ok;
}

/* ------------------------------------------------------------ optimizers */

TEST(each_optimizer_matches_the_reference_rule) {
    const ct_dtype dtypes[] = {CT_FLOAT32, CT_FLOAT64};
    for (int c = 0; c < NCONFIGS; c++)
        for (int d = 0; d < 2; d++) {
            model m;
            ASSERT_TRUE(run_config(c, dtypes[d], false, 0, 4, &m));
        }
}

/* Figures from PyTorch 1.13 in float64: p = [0.5, -1.25, 2] and, at step k,
 * grad = [0.1 (k + 1), -0.3 + 0.05 k, 0.7 - 0.2 k], three steps. */
static bool three_steps(const ct_optim_options *o, const double *want) {
    ct_tensor *p = doubles(3, (double[]){0.5, -1.25, 2.0});
    ct_optim *opt = ct_optim_new(o, &p, 1);
    bool ok = opt != NULL;
    for (int k = 0; k < 3 && ok; k++) {
        double g[3] = {0.1 * (k + 1), -0.3 + 0.05 * k, 0.7 - 0.2 * k};
        ok = ct_tensor_set_grad(p, doubles(3, g)) == 0 && ct_optim_step(opt) == 0;
    }
    if (!ok)
        tt_fail(__FILE__, __LINE__, "%s", ct_errmsg());
    for (int i = 0; i < 3 && ok; i++)
        if (!(fabs(val(p, i) - want[i]) <= 1e-14 * (1 + fabs(want[i])))) {
            tt_fail(__FILE__, __LINE__, "[%d]: %.17g, PyTorch %.17g", i, val(p, i), want[i]);
            ok = false;
        }
    ct_optim_free(opt);
    return ok;
}

TEST(optimizers_match_pytorch_figures) {
    ct_optim_options o = sgd(0.1, 0.9, 0, true, 0.01);
    ASSERT_TRUE(
        three_steps(&o, (double[]){0.35056756198049993, -1.03143511065625, 1.5516006821520001}));
    o = sgd(0.05, 0.8, 0.3, false, 0);
    ASSERT_TRUE(three_steps(&o, (double[]){0.4647, -1.19065, 1.8726}));
    o = adam(CT_OPTIM_ADAM, 0.01, 0.8, 0.95, 1e-6, 0.1, true);
    ASSERT_TRUE(
        three_steps(&o, (double[]){0.47013857181862728, -1.220291195875556, 1.9707752556294558}));
    o = adam(CT_OPTIM_ADAMW, 0.01, 0.9, 0.999, 1e-8, 0.1, false);
    ASSERT_TRUE(
        three_steps(&o, (double[]){0.46929931087213311, -1.2166397711388375, 1.9650160531477183}));
    o = ct_optim_defaults(CT_OPTIM_ADAM, 0.01);
    ASSERT_TRUE(
        three_steps(&o, (double[]){0.47076816955448425, -1.2203561206611169, 1.9709802869414528}));
}

TEST(defaults_are_pytorchs) {
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_ADAMW, 1e-3);
    ASSERT_EQ(o.kind, CT_OPTIM_ADAMW);
    ASSERT_NEAR(o.lr, 1e-3, 0);
    ASSERT_NEAR(o.beta1, 0.9, 0);
    ASSERT_NEAR(o.beta2, 0.999, 0);
    ASSERT_NEAR(o.eps, 1e-8, 0);
    ASSERT_NEAR(o.weight_decay, 1e-2, 0);
    ASSERT_TRUE(!o.amsgrad);
    o = ct_optim_defaults(CT_OPTIM_ADAM, 1e-3);
    ASSERT_NEAR(o.weight_decay, 0, 0);
    o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ASSERT_NEAR(o.momentum, 0, 0);
    ASSERT_NEAR(o.dampening, 0, 0);
    ASSERT_TRUE(!o.nesterov);
}

/* The flat buffers run as one fused range split across threads, the
 * separate tensors as one range each on one thread: same bits, and both
 * follow the reference, with parameters skipped on one step. */
TEST(flat_path_equals_per_parameter_path_bit_for_bit) {
    const ct_dtype dtypes[] = {CT_FLOAT32, CT_FLOAT64};
    int threads = ct_get_num_threads();
    for (int c = 0; c < NCONFIGS; c++) {
        for (int d = 0; d < 2; d++) {
            model flat, sep;
            ASSERT_EQ(ct_set_num_threads(2), 0);
            bool ok = run_config(c, dtypes[d], true, 0x0a, 4, &flat);
            ASSERT_EQ(ct_set_num_threads(1), 0);
            ok = ok && run_config(c, dtypes[d], false, 0x0a, 4, &sep);
            ASSERT_EQ(ct_set_num_threads(threads), 0);
            ASSERT_TRUE(ok);
            ASSERT_TRUE(models_identical(&flat, &sep, config_name(c)));
        }
    }
}

TEST(skipped_parameters_keep_their_state) {
    ct_tensor *a = ct_requires_grad_(tt_rand(CT_SHAPE(4), CT_FLOAT32, 1), true);
    ct_tensor *b = ct_requires_grad_(tt_rand(CT_SHAPE(4), CT_FLOAT32, 2), true);
    ct_tensor *params[] = {a, b};
    ct_optim_options o = sgd(0.1, 0.9, 0.5, false, 0);
    ct_optim *opt = ct_optim_new(&o, params, 2);
    ASSERT_TRUE(opt);
    ct_tensor *b0 = ct_clone(b);
    ct_tensor *ga = tt_rand(CT_SHAPE(4), CT_FLOAT32, 3), *gb = tt_rand(CT_SHAPE(4), CT_FLOAT32, 4);
    ASSERT_EQ(ct_tensor_set_grad(a, ga), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_CLOSE(b, b0, 0, 0);
    ASSERT_EQ(ct_item_int64(ct_optim_param_state(opt, "step", 0)), 2);
    ASSERT_EQ(ct_item_int64(ct_optim_param_state(opt, "step", 1)), 0);
    ASSERT_EQ(ct_optim_step_count(opt), 2);
    /* b's first gradient starts its buffer as the gradient itself, even with
     * dampening, as PyTorch's None buffer does. */
    ASSERT_EQ(ct_tensor_set_grad(b, gb), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_CLOSE(ct_optim_param_state(opt, "momentum_buffer", 1), gb, 0, 0);
    ASSERT_CLOSE(b, ct_sub(b0, ct_mul_scalar(gb, 0.1)), 1e-6, 1e-7);
    ASSERT_EQ(ct_item_int64(ct_optim_param_state(opt, "step", 1)), 1);
    ct_optim_free(opt);
}

TEST(no_gradients_at_all_changes_nothing) {
    ct_tensor *p = tt_rand(CT_SHAPE(3, 3), CT_FLOAT64, 1);
    ct_tensor *p0 = ct_clone(p);
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_ADAM, 0.1);
    ct_optim *opt = ct_optim_new(&o, &p, 1);
    ASSERT_TRUE(opt);
    uint64_t version = ct_tensor_version(p);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_CLOSE(p, p0, 0, 0);
    ASSERT_EQ(ct_tensor_version(p), version);
    ASSERT_EQ(ct_optim_step_count(opt), 1);
    ASSERT_CLOSE(ct_optim_state(opt, "exp_avg"), ct_zeros(CT_SHAPE(9), CT_FLOAT64), 0, 0);
    ct_optim_free(opt);
}

/* Two groups, weights with decay at the full rate and biases without decay
 * at half the rate, each against the reference. */
static bool check_groups(const ct_optim_options *o) {
    model m;
    if (!model_init(&m, CT_FLOAT64, true, 3))
        return false;
    ct_param_group groups[] = {{m.p, 3, 0.1, 1}, {m.p + 3, NP - 3, 0, 0.5}};
    ct_optim *opt = ct_optim_new_groups(o, groups, 2);
    if (!opt) {
        tt_fail(__FILE__, __LINE__, "%s", ct_errmsg());
        return false;
    }
    ref r;
    ref_init(&r, &m);
    double wd[NP] = {0.1, 0.1, 0.1, 0, 0, 0}, scale[NP] = {1, 1, 1, 0.5, 0.5, 0.5};
    bool ok = true;
    for (int s = 0; s < 3 && ok; s++) {
        ok = model_grads(&m, s, 0) && ct_optim_step(opt) == 0;
        ref_step(&r, &m, o, wd, scale);
        ok = ok && model_matches_ref(&m, &r, 1e-13, "groups");
    }
    ref_free(&r);
    ct_optim_free(opt);
    return ok;
}

TEST(param_groups_have_their_own_decay_and_rate) {
    for (int c = 0; c < NCONFIGS; c++) {
        ct_optim_options o = config(c);
        ASSERT_TRUE(check_groups(&o));
    }
}

TEST(strided_gradient_gives_the_same_update) {
    ct_tensor *p1 = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 1), *p2 = ct_clone(p1);
    ct_tensor *g = ct_transpose(tt_rand(CT_SHAPE(4, 3), CT_FLOAT32, 2), 0, 1);
    ASSERT_TRUE(!ct_is_contiguous(g));
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_ADAMW, 0.1);
    ct_optim *a = ct_optim_new(&o, &p1, 1), *b = ct_optim_new(&o, &p2, 1);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(ct_tensor_set_grad(p1, g), 0);
    ASSERT_EQ(ct_tensor_set_grad(p2, ct_contiguous(g)), 0);
    ASSERT_EQ(ct_optim_step(a), 0);
    ASSERT_EQ(ct_optim_step(b), 0);
    ASSERT_CLOSE(p1, p2, 0, 0);
    ct_optim_free(a);
    ct_optim_free(b);
}

TEST(step_bumps_parameter_versions) {
    ct_tensor *p = tt_rand(CT_SHAPE(5), CT_FLOAT32, 1);
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ct_optim *opt = ct_optim_new(&o, &p, 1);
    ASSERT_TRUE(opt);
    ASSERT_EQ(ct_tensor_set_grad(p, ct_ones(CT_SHAPE(5), CT_FLOAT32)), 0);
    uint64_t version = ct_tensor_version(p);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_TRUE(ct_tensor_version(p) > version);
    ct_optim_free(opt);
}

/* ------------------------------------------------------------ zero_grad */

TEST(zero_grad_zeroes_in_place_or_drops) {
    model m;
    ASSERT_TRUE(model_init(&m, CT_FLOAT32, true, 1));
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ct_optim *opt = ct_optim_new(&o, m.p, NP);
    ASSERT_TRUE(opt);
    ASSERT_TRUE(model_grads(&m, 0, 0x04));
    uint64_t version = ct_tensor_version(m.gbuf);
    ASSERT_EQ(ct_optim_zero_grad(opt, false), 0);
    ASSERT_CLOSE(m.gbuf, ct_zeros(CT_SHAPE(m.offset[NP]), CT_FLOAT32), 0, 0);
    ASSERT_TRUE(ct_tensor_version(m.gbuf) > version);
    for (int i = 0; i < NP; i++)
        ASSERT_TRUE(ct_tensor_grad(m.p[i]) == (i == 2 ? NULL : m.g[i]));
    ASSERT_EQ(ct_optim_zero_grad(opt, true), 0);
    for (int i = 0; i < NP; i++)
        ASSERT_TRUE(ct_tensor_grad(m.p[i]) == NULL);
    ASSERT_EQ(ct_optim_zero_grad(opt, false), 0);
    ct_optim_free(opt);
}

TEST(zero_grad_handles_separate_and_strided_gradients) {
    ct_tensor *a = tt_rand(CT_SHAPE(3, 4), CT_FLOAT64, 1), *b = tt_rand(CT_SHAPE(6), CT_FLOAT64, 2);
    ct_tensor *params[] = {a, b};
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ct_optim *opt = ct_optim_new(&o, params, 2);
    ASSERT_TRUE(opt);
    ct_tensor *ga = ct_transpose(tt_rand(CT_SHAPE(4, 3), CT_FLOAT64, 3), 0, 1);
    ct_tensor *gb = tt_rand(CT_SHAPE(6), CT_FLOAT64, 4);
    ASSERT_EQ(ct_tensor_set_grad(a, ga), 0);
    ASSERT_EQ(ct_tensor_set_grad(b, gb), 0);
    ASSERT_EQ(ct_optim_zero_grad(opt, false), 0);
    ASSERT_CLOSE(ga, ct_zeros(CT_SHAPE(3, 4), CT_FLOAT64), 0, 0);
    ASSERT_CLOSE(gb, ct_zeros(CT_SHAPE(6), CT_FLOAT64), 0, 0);
    ASSERT_TRUE(ct_tensor_grad(a) == ga);
    ct_optim_free(opt);
}

/* ------------------------------------------------------------ clipping */

static double norm2(ct_tensor *const *ts, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < ct_numel(ts[i]); j++)
            s += val(ts[i], j) * val(ts[i], j);
    return sqrt(s);
}

TEST(clip_scales_above_the_threshold) {
    ct_tensor *a = ct_zeros(CT_SHAPE(2), CT_FLOAT32), *b = ct_zeros(CT_SHAPE(1), CT_FLOAT32);
    ct_tensor *c = ct_zeros(CT_SHAPE(3), CT_FLOAT32);
    ct_tensor *params[] = {a, b, c};
    ct_tensor *ga = ct_from_data((float[]){3, 0}, CT_SHAPE(2), CT_FLOAT32);
    ct_tensor *gb = ct_from_data((float[]){-4}, CT_SHAPE(1), CT_FLOAT32);
    ASSERT_EQ(ct_tensor_set_grad(a, ga), 0);
    ASSERT_EQ(ct_tensor_set_grad(b, gb), 0);
    double total = -1;
    ASSERT_EQ(ct_clip_grad_norm(params, 3, 1.0, &total), 0);
    ASSERT_NEAR(total, 5, 1e-6);
    double coef = 1.0 / (5 + 1e-6);
    ASSERT_NEAR(val(ga, 0), 3 * coef, 1e-7);
    ASSERT_NEAR(val(gb, 0), -4 * coef, 1e-7);
    ct_tensor *grads[] = {ga, gb};
    ASSERT_NEAR(norm2(grads, 2), 1, 1e-6);
    ASSERT_TRUE(ct_tensor_grad(c) == NULL);
}

TEST(clip_leaves_gradients_below_the_threshold) {
    ct_tensor *p = ct_zeros(CT_SHAPE(64, 65), CT_FLOAT32);
    ct_tensor *g = tt_rand(CT_SHAPE(64, 65), CT_FLOAT32, 5), *g0 = ct_clone(g);
    ASSERT_EQ(ct_tensor_set_grad(p, g), 0);
    double total = 0;
    ASSERT_EQ(ct_clip_grad_norm(&p, 1, 1e3, &total), 0);
    ASSERT_NEAR(total, norm2(&g0, 1), 1e-4);
    ASSERT_CLOSE(g, g0, 0, 0);
    ASSERT_EQ(ct_clip_grad_norm(&p, 1, INFINITY, &total), 0);
    ASSERT_CLOSE(g, g0, 0, 0);
}

TEST(clip_exactly_at_the_threshold_still_scales_as_pytorch) {
    ct_tensor *p = ct_zeros(CT_SHAPE(2), CT_FLOAT64);
    ct_tensor *g = ct_from_data((double[]){0.6, 0.8}, CT_SHAPE(2), CT_FLOAT64);
    ASSERT_EQ(ct_tensor_set_grad(p, g), 0);
    double total = 0;
    ASSERT_EQ(ct_clip_grad_norm(&p, 1, 1.0, &total), 0);
    ASSERT_NEAR(total, 1, 1e-15);
    ASSERT_NEAR(val(g, 0), 0.6 / (1 + 1e-6), 1e-15);
    ASSERT_NEAR(val(g, 1), 0.8 / (1 + 1e-6), 1e-15);
}

TEST(clip_max_norm_and_zero) {
    ct_tensor *a = ct_zeros(CT_SHAPE(3), CT_FLOAT32), *b = ct_zeros(CT_SHAPE(2), CT_FLOAT32);
    ct_tensor *params[] = {a, b};
    ct_tensor *ga = ct_from_data((float[]){1, -7, 2}, CT_SHAPE(3), CT_FLOAT32);
    ct_tensor *gb = ct_from_data((float[]){5, 6}, CT_SHAPE(2), CT_FLOAT32);
    ASSERT_EQ(ct_tensor_set_grad(a, ga), 0);
    ASSERT_EQ(ct_tensor_set_grad(b, gb), 0);
    double total = 0;
    ASSERT_EQ(ct_clip_grad_norm_p(params, 2, 3.5, INFINITY, &total), 0);
    ASSERT_NEAR(total, 7, 0);
    ASSERT_NEAR(val(ga, 1), -7 * (3.5 / (7 + 1e-6)), 1e-6);
    ASSERT_NEAR(val(gb, 1), 6 * (3.5 / (7 + 1e-6)), 1e-6);
    ASSERT_EQ(ct_clip_grad_norm_p(params, 2, 100, 1, &total), 0);
    ASSERT_NEAR(total, 3.5 * (1 + 7 + 2 + 5 + 6) / (7 + 1e-6), 1e-5);
    ASSERT_EQ(ct_clip_grad_norm(params, 2, 0, &total), 0);
    ASSERT_CLOSE(ga, ct_zeros(CT_SHAPE(3), CT_FLOAT32), 0, 0);
    ASSERT_EQ(ct_clip_grad_norm(params, 0, 1, &total), 0);
    ASSERT_NEAR(total, 0, 0);
}

TEST(clip_reports_a_non_finite_norm_and_leaves_gradients) {
    ct_tensor *a = ct_zeros(CT_SHAPE(2), CT_FLOAT32), *b = ct_zeros(CT_SHAPE(2), CT_FLOAT32);
    ct_tensor *params[] = {a, b};
    ct_tensor *ga = ct_from_data((float[]){1, INFINITY}, CT_SHAPE(2), CT_FLOAT32);
    ct_tensor *gb = ct_from_data((float[]){3, 4}, CT_SHAPE(2), CT_FLOAT32);
    ct_tensor *gb0 = ct_clone(gb);
    ASSERT_EQ(ct_tensor_set_grad(a, ga), 0);
    ASSERT_EQ(ct_tensor_set_grad(b, gb), 0);
    double total = 0;
    ASSERT_EQ(ct_clip_grad_norm(params, 2, 1, &total), 0);
    ASSERT_TRUE(isinf(total));
    ASSERT_CLOSE(gb, gb0, 0, 0);
    ASSERT_TRUE(isinf(val(ga, 1)));
    ((float *)ct_data_ptr(ga))[1] = NAN;
    ASSERT_EQ(ct_clip_grad_norm(params, 2, 1, &total), 0);
    ASSERT_TRUE(isnan(total));
    ASSERT_EQ(ct_clip_grad_norm_p(params, 2, 1, INFINITY, &total), 0);
    ASSERT_TRUE(isnan(total));
    ASSERT_CLOSE(gb, gb0, 0, 0);
}

TEST(clip_is_deterministic_across_thread_counts) {
    ct_tensor *p = ct_zeros(CT_SHAPE(300, 1000), CT_FLOAT32);
    ct_tensor *g = tt_rand(CT_SHAPE(300, 1000), CT_FLOAT32, 9);
    ASSERT_EQ(ct_tensor_set_grad(p, g), 0);
    int threads = ct_get_num_threads();
    double t1 = 0, t2 = 0;
    ASSERT_EQ(ct_set_num_threads(1), 0);
    ASSERT_EQ(ct_clip_grad_norm(&p, 1, INFINITY, &t1), 0);
    ASSERT_EQ(ct_set_num_threads(3), 0);
    ASSERT_EQ(ct_clip_grad_norm(&p, 1, INFINITY, &t2), 0);
    ASSERT_EQ(ct_set_num_threads(threads), 0);
    ASSERT_TRUE(t1 == t2);
}

TEST(clip_rejects_bad_input) {
    ct_tensor *p = ct_zeros(CT_SHAPE(2), CT_FLOAT32);
    ASSERT_EQ(ct_tensor_set_grad(p, ct_ones(CT_SHAPE(2), CT_FLOAT32)), 0);
    ASSERT_RC(ct_clip_grad_norm(&p, 1, -1, NULL), CT_EINVAL, "max_norm -1");
    ASSERT_RC(ct_clip_grad_norm(&p, 1, NAN, NULL), CT_EINVAL, "max_norm nan");
    ASSERT_RC(ct_clip_grad_norm_p(&p, 1, 1, 0, NULL), CT_EINVAL, "norm_type 0");
    ASSERT_RC(ct_clip_grad_norm_p(&p, 1, 1, -INFINITY, NULL), CT_EINVAL, "norm_type -inf");
    ASSERT_RC(ct_clip_grad_norm(NULL, 2, 1, NULL), CT_EINVAL, "2 parameters");
    ASSERT_RC(ct_clip_grad_norm((ct_tensor *[]){p, NULL}, 2, 1, NULL), CT_EINVAL,
              "param 1 is NULL");
    ASSERT_CLOSE(ct_tensor_grad(p), ct_ones(CT_SHAPE(2), CT_FLOAT32), 0, 0);
}

/* ------------------------------------------------------------ schedules */

typedef struct at {
    int64_t step;
    double lr;
} at;

/* Rates printed by PyTorch 1.13's schedulers stepped one by one, on an SGD
 * optimizer with lr 0.1. */
static bool check_rates(const ct_lr_schedule *s, const at *want, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        double got = ct_lr_schedule_at(s, want[i].step);
        if (!(fabs(got - want[i].lr) <= 1e-14 * want[i].lr)) {
            tt_fail(__FILE__, __LINE__, "%s at step %lld: %.17g, PyTorch %.17g (%s)", what,
                    (long long)want[i].step, got, want[i].lr, ct_errmsg());
            return false;
        }
    }
    return true;
}

#define CHECK_RATES(s, what, ...)                                                                  \
    ASSERT_TRUE(                                                                                   \
        check_rates(&(s), (at[]){__VA_ARGS__}, sizeof((at[]){__VA_ARGS__}) / sizeof(at), what))

TEST(schedules_match_pytorch) {
    ct_lr_schedule s = {.kind = CT_LR_CONSTANT, .base_lr = 0.1};
    CHECK_RATES(s, "constant", {0, 0.1}, {1000000, 0.1});
    s = (ct_lr_schedule){.kind = CT_LR_STEP, .base_lr = 0.1, .step_size = 3, .gamma = 0.5};
    CHECK_RATES(s, "step", {0, 0.10000000000000001}, {2, 0.10000000000000001},
                {3, 0.050000000000000003}, {5, 0.050000000000000003}, {6, 0.025000000000000001},
                {9, 0.012500000000000001});
    s = (ct_lr_schedule){.kind = CT_LR_MULTISTEP,
                         .base_lr = 0.1,
                         .gamma = 0.1,
                         .milestones = (int64_t[]){2, 5, 5, 9},
                         .nmilestones = 4};
    CHECK_RATES(s, "multistep", {0, 0.10000000000000001}, {1, 0.10000000000000001},
                {2, 0.010000000000000002}, {4, 0.010000000000000002}, {5, 0.00010000000000000005},
                {8, 0.00010000000000000005}, {9, 1.0000000000000006e-05},
                {10, 1.0000000000000006e-05});
    s = (ct_lr_schedule){.kind = CT_LR_EXPONENTIAL, .base_lr = 0.1, .gamma = 0.9};
    CHECK_RATES(s, "exponential", {0, 0.10000000000000001}, {1, 0.090000000000000011},
                {2, 0.081000000000000016}, {11, 0.031381059609000013});
    s = (ct_lr_schedule){.kind = CT_LR_COSINE, .base_lr = 0.1, .total_steps = 10, .eta_min = 1e-3};
    CHECK_RATES(s, "cosine", {0, 0.10000000000000001}, {1, 0.097577297556610113},
                {5, 0.050500000000000003}, {9, 0.0034227024433899004}, {10, 0.001});
    s = (ct_lr_schedule){.kind = CT_LR_ONECYCLE,
                         .base_lr = 0.1,
                         .total_steps = 20,
                         .pct_start = 0.3,
                         .div_factor = 25,
                         .final_div_factor = 1e4};
    CHECK_RATES(s, "one-cycle", {0, 0.0040000000000000036}, {1, 0.013167184270002533},
                {3, 0.066832815729997469}, {5, 0.10000000000000001}, {6, 0.098746400623508743},
                {10, 0.071694300179130088}, {18, 0.0012539993764912555},
                {19, 3.9999999999999998e-07});
    /* SequentialLR([LinearLR(start_factor, total_iters=W), main], [W]). */
    s = (ct_lr_schedule){.kind = CT_LR_COSINE,
                         .base_lr = 0.1,
                         .total_steps = 10,
                         .eta_min = 1e-3,
                         .warmup_steps = 4,
                         .warmup_start_factor = 0.25};
    CHECK_RATES(s, "warmup + cosine", {0, 0.025000000000000001}, {1, 0.043750000000000004},
                {3, 0.081250000000000017}, {4, 0.10000000000000001}, {5, 0.097577297556610113},
                {9, 0.050500000000000003}, {14, 0.001});
    s = (ct_lr_schedule){.kind = CT_LR_STEP,
                         .base_lr = 0.1,
                         .step_size = 3,
                         .gamma = 0.5,
                         .warmup_steps = 2,
                         .warmup_start_factor = 0.5};
    CHECK_RATES(s, "warmup + step", {0, 0.050000000000000003}, {1, 0.075000000000000011},
                {2, 0.10000000000000001}, {4, 0.10000000000000001}, {5, 0.050000000000000003},
                {8, 0.025000000000000001});
}

TEST(schedule_ends_and_edges) {
    /* Past T_max the cosine holds eta_min (PyTorch's closed form rises). */
    ct_lr_schedule s = {.kind = CT_LR_COSINE, .base_lr = 0.1, .total_steps = 10, .eta_min = 1e-3};
    ASSERT_NEAR(ct_lr_schedule_at(&s, 10), 1e-3, 1e-18);
    ASSERT_NEAR(ct_lr_schedule_at(&s, 25), 1e-3, 1e-18);
    /* One-cycle holds its final rate past the last step. */
    s = (ct_lr_schedule){.kind = CT_LR_ONECYCLE,
                         .base_lr = 0.1,
                         .total_steps = 20,
                         .pct_start = 0.3,
                         .div_factor = 25,
                         .final_div_factor = 1e4};
    ASSERT_NEAR(ct_lr_schedule_at(&s, 19), 0.1 / 25 / 1e4, 1e-18);
    ASSERT_NEAR(ct_lr_schedule_at(&s, 500), 0.1 / 25 / 1e4, 1e-18);
    /* pct_start * total_steps == 1: the peak comes at step 0. */
    s.pct_start = 0.05;
    ASSERT_NEAR(ct_lr_schedule_at(&s, 0), 0.1, 1e-17);
    /* pct_start 0: PyTorch's second phase starts at step -1. */
    s.pct_start = 0;
    double min_lr = 0.1 / 25 / 1e4;
    ASSERT_NEAR(ct_lr_schedule_at(&s, 0), min_lr + (0.1 - min_lr) / 2 * (cos(M_PI / 20) + 1),
                1e-17);
    /* Warmup from zero, and warmup before one-cycle ramps to its first rate. */
    s.pct_start = 0.3;
    s.warmup_steps = 4;
    ASSERT_NEAR(ct_lr_schedule_at(&s, 0), 0, 0);
    ASSERT_NEAR(ct_lr_schedule_at(&s, 2), 0.5 * 0.1 / 25, 1e-16);
    ASSERT_NEAR(ct_lr_schedule_at(&s, 4), 0.1 / 25, 1e-16);
    s = (ct_lr_schedule){.kind = CT_LR_MULTISTEP, .base_lr = 1, .gamma = 0.5};
    ASSERT_NEAR(ct_lr_schedule_at(&s, 100), 1, 0);
    s = (ct_lr_schedule){.kind = CT_LR_STEP, .base_lr = 0.1, .step_size = 1, .gamma = 0.5};
    ASSERT_NEAR(ct_lr_schedule_at(&s, INT64_MAX), 0, 0);
}

TEST(schedule_rejects_bad_options) {
    ct_lr_schedule ok = {.kind = CT_LR_STEP, .base_lr = 0.1, .step_size = 3, .gamma = 0.5};
    ASSERT_EQ(ct_lr_schedule_check(&ok), 0);
    ct_errclear();
    ASSERT_TRUE(isnan(ct_lr_schedule_at(&ok, -1)));
    ASSERT_EQ(ct_errcode(), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "step -1 is negative");
    ASSERT_RC(ct_lr_schedule_check(NULL), CT_EINVAL, "NULL");
    struct {
        ct_lr_schedule s;
        const char *msg;
    } cases[] = {
        {{.kind = CT_LR_STEP, .base_lr = 0.1, .gamma = 0.5}, "step_size 0"},
        {{.kind = CT_LR_STEP, .base_lr = 0.1, .step_size = 2}, "gamma 0"},
        {{.kind = CT_LR_STEP, .base_lr = -0.1, .step_size = 2, .gamma = 1}, "base_lr -0.1"},
        {{.kind = CT_LR_EXPONENTIAL, .base_lr = 0.1, .gamma = NAN}, "gamma nan"},
        {{.kind = CT_LR_CONSTANT, .base_lr = 1, .warmup_steps = -1}, "warmup_steps -1"},
        {{.kind = CT_LR_CONSTANT, .base_lr = 1, .warmup_steps = 5, .warmup_start_factor = 1.5},
         "warmup_start_factor 1.5"},
        {{.kind = CT_LR_MULTISTEP, .base_lr = 1, .gamma = 0.1, .nmilestones = 2}, "2 milestones"},
        {{.kind = CT_LR_MULTISTEP,
          .base_lr = 1,
          .gamma = 0.1,
          .milestones = (int64_t[]){5, 3},
          .nmilestones = 2},
         "milestones[1] = 3 comes after 5"},
        {{.kind = CT_LR_COSINE, .base_lr = 1}, "total_steps 0"},
        {{.kind = CT_LR_COSINE, .base_lr = 1, .total_steps = 5, .eta_min = INFINITY},
         "eta_min inf"},
        {{.kind = CT_LR_ONECYCLE,
          .base_lr = 1,
          .total_steps = 5,
          .div_factor = 25,
          .final_div_factor = 1e4,
          .pct_start = 1.5},
         "pct_start 1.5"},
        {{.kind = CT_LR_ONECYCLE,
          .base_lr = 1,
          .total_steps = 5,
          .pct_start = 0.3,
          .final_div_factor = 1e4},
         "div_factor 0 is invalid; expected a finite value > 0 (PyTorch's default is 25)"},
        {{.kind = CT_LR_ONECYCLE,
          .base_lr = 1,
          .total_steps = 5,
          .pct_start = 0.3,
          .div_factor = 25},
         "final_div_factor 0"},
        {{.kind = (ct_lr_schedule_kind)42, .base_lr = 1}, "kind 42"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ASSERT_RC(ct_lr_schedule_check(&cases[i].s), CT_EINVAL, cases[i].msg);
        ASSERT_TRUE(isnan(ct_lr_schedule_at(&cases[i].s, 0)));
    }
}

TEST(schedule_drives_the_optimizer_rate) {
    ct_tensor *p = ct_zeros(CT_SHAPE(2), CT_FLOAT32);
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ct_optim *opt = ct_optim_new(&o, &p, 1);
    ASSERT_TRUE(opt);
    ct_lr_schedule s = {.kind = CT_LR_EXPONENTIAL, .base_lr = 0.1, .gamma = 0.5};
    ASSERT_EQ(ct_optim_set_step_count(opt, 3), 0);
    ASSERT_EQ(ct_optim_set_lr(opt, ct_lr_schedule_at(&s, ct_optim_step_count(opt))), 0);
    ASSERT_NEAR(ct_optim_lr(opt), 0.0125, 0);
    s.gamma = -1;
    ASSERT_RC(ct_optim_set_lr(opt, ct_lr_schedule_at(&s, 0)), CT_EINVAL, "gamma -1");
    ASSERT_NEAR(ct_optim_lr(opt), 0.0125, 0);
    ASSERT_RC(ct_optim_set_lr(opt, -1), CT_EINVAL, "lr -1");
    ASSERT_RC(ct_optim_set_lr(opt, INFINITY), CT_EINVAL, "lr inf");
    ASSERT_EQ(ct_optim_set_lr(opt, 0), 0);
    ct_optim_free(opt);
}

/* ------------------------------------------------------------ state */

TEST(state_names_shapes_and_views) {
    model m;
    ASSERT_TRUE(model_init(&m, CT_FLOAT32, false, 1));
    struct {
        ct_optim_options o;
        int n;
        const char *names[4];
    } cases[] = {
        {sgd(0.1, 0, 0, false, 0), 1, {"step"}},
        {sgd(0.1, 0.9, 0, false, 0), 2, {"step", "momentum_buffer"}},
        {adam(CT_OPTIM_ADAM, 0.1, 0.9, 0.999, 1e-8, 0, false),
         3,
         {"step", "exp_avg", "exp_avg_sq"}},
        {adam(CT_OPTIM_ADAMW, 0.1, 0.9, 0.999, 1e-8, 0, true),
         4,
         {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ct_optim *opt = ct_optim_new(&cases[c].o, m.p, NP);
        ASSERT_TRUE(opt);
        ASSERT_EQ(ct_optim_num_states(opt), cases[c].n);
        ASSERT_EQ(ct_optim_num_params(opt), NP);
        for (int i = 0; i < cases[c].n; i++) {
            const char *name = NULL;
            ct_tensor *t = NULL;
            ASSERT_EQ(ct_optim_state_at(opt, i, &name, &t), 0);
            ASSERT_TRUE(strcmp(name, cases[c].names[i]) == 0);
            ASSERT_TRUE(ct_optim_state(opt, name) == t);
            ASSERT_EQ(ct_ndim(t), 1);
            ASSERT_EQ(ct_size(t, 0), i == 0 ? NP : m.offset[NP]);
            ASSERT_EQ(ct_tensor_dtype(t), i == 0 ? CT_INT64 : CT_FLOAT32);
        }
        for (int i = 0; i < NP; i++) {
            ASSERT_TRUE(ct_optim_param(opt, i) == m.p[i]);
            ASSERT_EQ(ct_optim_param_offset(opt, i), m.offset[i]);
            ct_tensor *step = ct_optim_param_state(opt, "step", i);
            ASSERT_EQ(ct_ndim(step), 0);
            ASSERT_TRUE(ct_optim_param_state(opt, "step", i) == step);
            if (cases[c].n > 1) {
                ct_tensor *flat = ct_optim_state(opt, cases[c].names[1]);
                ct_tensor *v = ct_optim_param_state(opt, cases[c].names[1], i);
                ASSERT_EQ(ct_ndim(v), 2);
                ASSERT_EQ(ct_size(v, 0), shapes[i][0]);
                ASSERT_EQ(ct_size(v, 1), shapes[i][1]);
                ASSERT_TRUE((char *)ct_data_ptr(v) ==
                            (char *)ct_data_ptr(flat) + m.offset[i] * (int64_t)sizeof(float));
            }
        }
        ASSERT_RC(ct_optim_state_at(opt, cases[c].n, NULL, NULL), CT_EINVAL, "out of range");
        ASSERT_FAILS(ct_optim_param(opt, NP), CT_EINVAL, "param index 6 is out of range [0, 6)");
        ASSERT_EQ(ct_optim_param_offset(opt, -1), -1);
        ASSERT_FAILS(ct_optim_state(opt, "nope"), CT_EINVAL, "no state \"nope\"", "\"step\"");
        ASSERT_FAILS(ct_optim_param_state(opt, "step", NP), CT_EINVAL, "out of range");
        ct_optim_free(opt);
    }
}

/* A checkpoint in miniature: copy the state of a run into a fresh optimizer
 * and both continue with the same bits. */
TEST(restored_state_continues_the_run) {
    for (int c = 0; c < NCONFIGS; c++) {
        ct_optim_options o = config(c);
        model a, b;
        ASSERT_TRUE(model_init(&a, CT_FLOAT32, true, 2));
        ASSERT_TRUE(model_init(&b, CT_FLOAT32, true, 99));
        ct_optim *oa = ct_optim_new(&o, a.p, NP), *ob = ct_optim_new(&o, b.p, NP);
        ASSERT_TRUE(oa && ob);
        for (int s = 0; s < 3; s++) {
            ASSERT_TRUE(model_grads(&a, s, s == 1 ? 0x21 : 0));
            ASSERT_EQ(ct_optim_step(oa), 0);
        }
        ASSERT_TRUE(ct_copy_(b.pbuf, a.pbuf));
        ASSERT_EQ(ct_optim_set_step_count(ob, ct_optim_step_count(oa)), 0);
        for (int i = 0; i < ct_optim_num_states(oa); i++) {
            const char *name;
            ct_tensor *sa, *sb;
            ASSERT_EQ(ct_optim_state_at(oa, i, &name, &sa), 0);
            ASSERT_TRUE((sb = ct_optim_state(ob, name)) != NULL);
            ASSERT_TRUE(ct_copy_(sb, sa));
        }
        ASSERT_EQ(ct_optim_step_count(ob), 3);
        for (int s = 3; s < 5; s++) {
            ASSERT_TRUE(model_grads(&a, s, 0));
            ASSERT_TRUE(model_grads(&b, s, 0));
            ASSERT_EQ(ct_optim_step(oa), 0);
            ASSERT_EQ(ct_optim_step(ob), 0);
        }
        ASSERT_TRUE(models_identical(&a, &b, config_name(c)));
        ct_optim_free(oa);
        ct_optim_free(ob);
    }
}

TEST(step_count_and_its_reset) {
    ct_tensor *p = ct_zeros(CT_SHAPE(3), CT_FLOAT64);
    ct_optim_options o = sgd(1, 0.5, 0, false, 0);
    ct_optim *opt = ct_optim_new(&o, &p, 1);
    ASSERT_TRUE(opt);
    ASSERT_EQ(ct_optim_step_count(opt), 0);
    ct_tensor *g = ct_ones(CT_SHAPE(3), CT_FLOAT64);
    ASSERT_EQ(ct_tensor_set_grad(p, g), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_EQ(ct_optim_step_count(opt), 2);
    ASSERT_NEAR(val(ct_optim_state(opt, "momentum_buffer"), 0), 1.5, 0);
    /* Count 0: the next step starts the buffer afresh from the gradient. */
    ASSERT_EQ(ct_optim_set_step_count(opt, 0), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_NEAR(val(ct_optim_state(opt, "momentum_buffer"), 0), 1, 0);
    ASSERT_NEAR(val(p, 0), -3.5, 0);
    ASSERT_RC(ct_optim_set_step_count(opt, -2), CT_EINVAL, "step -2 is negative");
    /* A corrupt restored count is caught before anything changes. */
    ((int64_t *)ct_data_ptr(ct_optim_state(opt, "step")))[0] = -5;
    ASSERT_RC(ct_optim_step(opt), CT_ESTATE, "\"step\" state is -5");
    ASSERT_NEAR(val(p, 0), -3.5, 0);
    ct_optim_free(opt);
}

/* ------------------------------------------------------------ bad input */

TEST(bad_options_are_rejected) {
    ct_tensor *p = ct_zeros(CT_SHAPE(2), CT_FLOAT32);
    struct {
        ct_optim_options o;
        const char *msg;
    } cases[] = {
        {sgd(-0.1, 0, 0, false, 0), "SGD lr -0.1 is invalid"},
        {sgd(NAN, 0, 0, false, 0), "lr nan"},
        {sgd(0.1, -0.9, 0, false, 0), "momentum -0.9"},
        {sgd(0.1, 0, 0, true, 0), "nesterov momentum requires momentum > 0 and dampening 0"},
        {sgd(0.1, 0.9, 0.1, true, 0), "(got momentum 0.9, dampening 0.1)"},
        {sgd(0.1, 0.9, INFINITY, false, 0), "dampening inf"},
        {sgd(0.1, 0, 0, false, -1e-4), "weight_decay -0.0001"},
        {adam(CT_OPTIM_ADAM, 1e-3, 1, 0.999, 1e-8, 0, false), "Adam beta1 1 is outside [0, 1)"},
        {adam(CT_OPTIM_ADAMW, 1e-3, 0.9, -0.1, 1e-8, 0, false), "AdamW beta2 -0.1 is outside"},
        {adam(CT_OPTIM_ADAM, 1e-3, NAN, 0.9, 1e-8, 0, false), "beta1 nan"},
        {adam(CT_OPTIM_ADAM, 1e-3, 0.9, 0.999, -1e-8, 0, false), "eps -1e-08"},
        {adam(CT_OPTIM_ADAMW, -1, 0.9, 0.999, 1e-8, 0, false), "AdamW lr -1"},
        {{.kind = (ct_optim_kind)7, .lr = 0.1}, "kind 7 is not"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ASSERT_FAILS(ct_optim_new(&cases[i].o, &p, 1), CT_EINVAL, "optim_new: ", cases[i].msg);
    ASSERT_FAILS(ct_optim_new(NULL, &p, 1), CT_EINVAL, "options are NULL");
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ct_param_group bad_wd = {&p, 1, -0.5, 1}, bad_scale = {&p, 1, 0, 0};
    ASSERT_FAILS(ct_optim_new_groups(&o, &bad_wd, 1), CT_EINVAL, "group 0 weight_decay -0.5");
    ASSERT_FAILS(ct_optim_new_groups(&o, &bad_scale, 1), CT_EINVAL, "group 0 lr_scale 0");
    ASSERT_FAILS(ct_optim_new_groups(&o, NULL, 2), CT_EINVAL, "2 groups");
    ASSERT_FAILS(ct_optim_new_groups(&o, &(ct_param_group){NULL, 3, 0, 1}, 1), CT_EINVAL,
                 "group 0 has 3 parameters");
}

TEST(bad_parameters_are_rejected) {
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_ADAM, 1e-3);
    ct_tensor *f32 = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32), *f64 = ct_zeros(CT_SHAPE(2), CT_FLOAT64);
    ct_tensor *i64 = ct_zeros(CT_SHAPE(2), CT_INT64), *f16 = ct_zeros(CT_SHAPE(2), CT_FLOAT16);
    ASSERT_FAILS(ct_optim_new(&o, &i64, 1), CT_EDTYPE, "param 0 (group 0) is int64[2]",
                 "float32 or float64");
    ASSERT_FAILS(ct_optim_new(&o, &f16, 1), CT_EDTYPE, "float16[2]");
    ASSERT_FAILS(ct_optim_new(&o, (ct_tensor *[]){f32, f64}, 2), CT_EDTYPE,
                 "param 1 (group 0) is float64[2] but param 0 is float32[2, 3]");
    ct_tensor *t = ct_transpose(f32, 0, 1);
    ASSERT_FAILS(ct_optim_new(&o, &t, 1), CT_EINVAL, "param 0 (group 0) float32[3, 2]",
                 "not contiguous");
    ct_param_group groups[] = {{(ct_tensor *[]){f64}, 1, 0, 1},
                               {(ct_tensor *[]){ct_zeros(CT_SHAPE(1), CT_FLOAT64), f64}, 2, 0, 1}};
    ASSERT_FAILS(ct_optim_new_groups(&o, groups, 2), CT_EINVAL,
                 "param 0 float64[2] is listed again as param 2");
    ASSERT_FAILS(ct_optim_new(&o, NULL, 0), CT_EINVAL, "empty parameter list");
    ASSERT_FAILS(ct_optim_new_groups(&o, (ct_param_group[]){{NULL, 0, 0, 1}}, 1), CT_EINVAL,
                 "empty parameter list");
    ASSERT_FAILS(ct_optim_new(&o, (ct_tensor *[]){f32, NULL}, 2), CT_EINVAL,
                 "param 1 (group 0) is NULL");
    /* A NULL parameter from a failed op keeps that op's message. */
    ct_errclear();
    ct_tensor *failed = ct_view(f32, CT_SHAPE(7));
    ASSERT_TRUE(failed == NULL);
    ASSERT_TRUE(ct_optim_new(&o, &failed, 1) == NULL);
    ASSERT_EQ(ct_errcode(), CT_ESHAPE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "view");
    ct_errclear();
    /* A dead tensor: a fake object with the wrong magic. */
    int64_t fake[64] = {0};
    ASSERT_FAILS(ct_optim_new(&o, (ct_tensor *[]){(ct_tensor *)fake}, 1), CT_EINVAL,
                 "not a live tensor");
}

TEST(handles_are_checked_and_free_accepts_null) {
    ct_optim_free(NULL);
    int64_t fake[16] = {0};
    ct_optim *bad = (ct_optim *)fake;
    ASSERT_RC(ct_optim_step(bad), CT_EINVAL, "is not a live optimizer");
    ASSERT_RC(ct_optim_step(NULL), CT_EINVAL, "optim_step: the optimizer is NULL");
    ASSERT_RC(ct_optim_zero_grad(NULL, true), CT_EINVAL, "optimizer is NULL");
    ASSERT_RC(ct_optim_set_lr(bad, 0.1), CT_EINVAL, "not a live optimizer");
    ASSERT_RC(ct_optim_set_step_count(NULL, 1), CT_EINVAL, "NULL");
    ASSERT_RC(ct_optim_num_states(NULL), CT_EINVAL, "NULL");
    ASSERT_RC(ct_optim_num_params(NULL), CT_EINVAL, "NULL");
    ASSERT_RC((int)ct_optim_step_count(bad), CT_EINVAL, "not a live optimizer");
    ASSERT_TRUE(isnan(ct_optim_lr(NULL)));
    ASSERT_FAILS(ct_optim_state(NULL, "step"), CT_EINVAL, "NULL");
    ASSERT_FAILS(ct_optim_param(bad, 0), CT_EINVAL, "not a live optimizer");
}

TEST(works_inside_and_outside_scopes) {
    /* Made inside a scope that then ends, the optimizer's state and its
     * references must survive; the harness runs this body in a scope. */
    ct_tensor *p = ct_tensor_retain(ct_zeros(CT_SHAPE(4), CT_FLOAT32));
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_ADAM, 0.1);
    ct_scope_begin();
    ct_optim *opt = ct_optim_new(&o, &p, 1);
    ct_tensor *view = ct_optim_param_state(opt, "exp_avg", 0);
    ct_scope_end();
    ASSERT_TRUE(opt && view);
    ASSERT_EQ(ct_tensor_set_grad(p, ct_ones(CT_SHAPE(4), CT_FLOAT32)), 0);
    ASSERT_EQ(ct_optim_step(opt), 0);
    ASSERT_NEAR(val(view, 3), 0.1, 1e-7);
    ASSERT_NEAR(val(p, 0), -0.1, 1e-6);
    ct_optim_free(opt);
    ct_tensor_free(p);
}
