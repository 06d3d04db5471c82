/* The program each rank of test_shard runs under ctlaunch: ct_ddp's ZeRO
 * stages against plain data parallel. Every rank builds two twins of one
 * model from one seed, flattens both, wraps one in a replicated ct_ddp and
 * the other in a sharded one on the same communicator, and trains both on
 * the same share of the same global batches, step by step: the losses and
 * the parameters must agree. The scenario names the stage (zero1_, zero2_)
 * (and zero3_) and what is checked:
 *
 *   *_sgd, *_adamw      STEPS steps with SGD with momentum, AdamW (float32)
 *   *_adamw_clip        AdamW with the global norm clipped (it binds)
 *   *_sgd_f64           float64: agreement to RTOL_F64
 *   *_unused            a layer in the loss on rank 0 only
 *                       (find_unused_parameters)
 *   *_checkpointed      every block under reentrant activation checkpointing
 *                       (static_graph), one block run twice
 *   *_no_sync           MICRO micro-steps with sync off but the last
 *   *_memory            ct_ddp_memory_of: the ZeRO accounting of model state
 *   zero2_peer_dies,    the last rank killed as step 2 begins: the others
 *   zero3_peer_dies     fail there with CT_EPEER naming it, promptly
 *   errors              what sharding refuses, by name (ZeRO-3: a flattened
 *                       model, units listed twice or nested, a parameter
 *                       used outside its unit)
 *
 * The buckets are small (BUCKET_BYTES), so that ZeRO-2 cuts many, some
 * across parameters. Every rank prints "pid=<pid>" first (tt_rank.c). */
#include "ct_test.h"
#include "tt_rank.h"

#include <ct/dist.h>
#include <ct/optim.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>

#define FEATURES 24
#define WIDTH    40
#define CLASSES  7
/* Divisible by 2, 3 and 4 ranks, and by MICRO micro-steps of those. */
#define ROWS  24
#define STEPS 200
#define MICRO 2
#define SEED  31
/* Small buckets: the model's 3.9 k elements span several. */
#define FIRST_BUCKET_BYTES 768
#define BUCKET_BYTES       2048
#define TIMEOUT            20.0
/* The stages differ from replicated training only in the order of the
 * sums (reduce against allreduce, a norm summed in pieces). */
#define RTOL_F32 1e-6
#define RTOL_F64 1e-12
/* The parameters after STEPS steps: the losses are the criterion, and in
 * float32 a clipping norm summed in other pieces can flip the sign of a
 * near-zero gradient's rounding, which moves that element by an Adam step
 * (lr, against its size plus 1e-3). */
#define PTOL_F32 1e-4
#define PTOL_F64 1e-11

static int rank_, size_;
static ct_comm *comm_;

typedef struct net_config {
    ct_dtype dtype;
    bool checkpointed; /* reentrant checkpointing, block b twice */
    bool extra_rank0;  /* layer "extra" joins the loss on rank 0 only */
} net_config;

/* ----------------------------------------------------------------- model */

static int run_layer(void *layer, ct_tensor *const *in, int nin, ct_tensor **out, int nout) {
    (void)nin;
    (void)nout;
    out[0] = ct_gelu(ct_module_forward(layer, in[0]));
    return out[0] ? 0 : ct_errcode();
}

static ct_tensor *layer(const net_config *cfg, ct_module *m, const char *name, ct_tensor *x) {
    ct_module *l = ct_module_child(m, name);
    if (!cfg->checkpointed)
        return ct_gelu(ct_module_forward(l, x));
    ct_tensor *y = NULL;
    return ct_activation_checkpoint(run_layer, l, &x, 1, &y, 1) == 0 ? y : NULL;
}

static ct_tensor *forward(ct_module *m, ct_tensor *x) {
    const net_config *cfg = ct_module_state(m);
    if (cfg->checkpointed)
        x = ct_requires_grad_(ct_clone(x), true);
    ct_tensor *h = layer(cfg, m, "b", layer(cfg, m, "a", x));
    if (cfg->checkpointed)
        h = layer(cfg, m, "b", h);
    ct_tensor *y = ct_module_forward(ct_module_child(m, "head"), h);
    if (cfg->extra_rank0 && rank_ == 0)
        y = ct_add(y, ct_module_forward(ct_module_child(m, "extra"), h));
    return y;
}

static ct_tensor *dense_forward(ct_module *m, ct_tensor *x) {
    return ct_linear(x, ct_module_param(m, "weight"), ct_module_param(m, "bias"));
}

/* A linear layer in dtype, weights N(0, 1/in), from the default generator. */
static ct_module *dense(int64_t in, int64_t out, bool bias, ct_dtype dtype) {
    ct_module *m = ct_module_new("dense", dense_forward, NULL, NULL);
    ct_scope_begin();
    ct_tensor *w = ct_mul_scalar(ct_randn(CT_SHAPE(out, in), dtype, NULL), 1 / sqrt((double)in));
    ct_tensor *b = bias ? ct_randn(CT_SHAPE(out), dtype, NULL) : NULL;
    int rc = m && w && (b || !bias) ? 0 : ct_errcode();
    if (!rc)
        rc = ct_module_add_param(m, "weight", ct_tensor_retain(w));
    if (!rc && bias)
        rc = ct_module_add_param(m, "bias", ct_tensor_retain(b));
    ct_scope_end();
    if (rc) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* A twin: the same weights from the same seed, in cfg's dtype, flattened
 * unless flat is false (ZeRO-3 gives each unit a buffer of its own). */
static ct_module *twin(const net_config *cfg, bool flat) {
    net_config *state = malloc(sizeof *state);
    if (state)
        *state = *cfg;
    ct_module *m = state ? ct_module_new("shard_test_net", forward, state, free) : NULL;
    ct_manual_seed(SEED);
    int rc = m ? 0 : CT_ENOMEM;
    if (!rc)
        rc = ct_module_add_child(m, "a", dense(FEATURES, WIDTH, true, cfg->dtype));
    if (!rc)
        rc = ct_module_add_child(m, "b", dense(WIDTH, WIDTH, true, cfg->dtype));
    if (!rc)
        rc = ct_module_add_child(m, "head", dense(WIDTH, CLASSES, true, cfg->dtype));
    if (!rc && cfg->extra_rank0)
        rc = ct_module_add_child(m, "extra", dense(WIDTH, CLASSES, false, cfg->dtype));
    if (!rc && flat)
        rc = ct_module_flatten(m, false);
    if (rc) {
        tt_fail(__FILE__, __LINE__, "building the model: %s", ct_errmsg());
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------- training */

typedef struct side {
    ct_module *net;
    ct_ddp *ddp;
    ct_optim *opt;
    ct_param_list params;
} side;

typedef struct run {
    net_config cfg;
    ct_optim_kind kind;
    double clip;  /* 0: none */
    side rep, sh; /* replicated, sharded */
} run;

static void side_free(side *s) {
    ct_optim_free(s->opt);
    ct_ddp_free(s->ddp);
    ct_param_list_free(&s->params);
    ct_module_free(s->net);
}

/* Weights with decay, biases without: two groups, as users make them. */
static bool side_init(side *s, const run *r, ct_ddp_shard stage) {
    ct_param_list_init(&s->params);
    if (!(s->net = twin(&r->cfg, stage != CT_DDP_SHARD_FULL)))
        return false;
    ct_ddp_options o = ct_ddp_defaults();
    o.first_bucket_bytes = FIRST_BUCKET_BYTES;
    o.bucket_bytes = BUCKET_BYTES;
    o.shard = stage;
    /* SHARD_TEST_PROGRESS=thread: the communicator's progress thread
     * advances the buckets' reduces and the units' prefetches while
     * backward and forward compute (AUTO picks it on a machine with two
     * cores a rank). */
    const char *mode = getenv("SHARD_TEST_PROGRESS");
    if (mode && !strcmp(mode, "thread"))
        o.progress = CT_DDP_PROGRESS_THREAD;
    o.static_graph = r->cfg.checkpointed;
    /* ZeRO-3's units: the layers every rank runs; "extra", which only
     * rank 0 runs, stays in the root unit (a unit must run on every rank). */
    ct_module *units[] = {ct_module_child(s->net, "a"), ct_module_child(s->net, "b"),
                          ct_module_child(s->net, "head")};
    o.units = units;
    o.nunits = 3;
    o.find_unused_parameters = r->cfg.extra_rank0;
    if (!(s->ddp = ct_ddp_new(comm_, s->net, &o)) ||
        ct_module_named_parameters(s->net, &s->params)) {
        tt_fail(__FILE__, __LINE__, "ct_ddp_new (shard %d): %s", (int)stage, ct_errmsg());
        return false;
    }
    ct_tensor *decay[8], *plain[8];
    int nd = 0, np = 0;
    for (int i = 0; i < s->params.n; i++) {
        if (ct_ndim(s->params.tensors[i]) == 2)
            decay[nd++] = s->params.tensors[i];
        else
            plain[np++] = s->params.tensors[i];
    }
    ct_optim_options oo = ct_optim_defaults(r->kind, r->kind == CT_OPTIM_SGD ? 0.05 : 3e-3);
    oo.momentum = r->kind == CT_OPTIM_SGD ? 0.9 : 0;
    ct_param_group groups[] = {{decay, nd, 0.05, 1}, {plain, np, 0, 2}};
    if (!(s->opt = ct_ddp_optim_new(s->ddp, &oo, groups, 2))) {
        tt_fail(__FILE__, __LINE__, "ct_ddp_optim_new (shard %d): %s", (int)stage, ct_errmsg());
        return false;
    }
    return true;
}

/* This rank's share of global batch step: features a function of the step,
 * labels of the row. */
static bool batch(const run *r, int step, int share, int nshares, ct_tensor **x, ct_tensor **y) {
    ct_generator gen = {.seed = 900 + (uint64_t)step};
    int64_t rows = ROWS / nshares, labels[ROWS];
    for (int64_t i = 0; i < rows; i++)
        labels[i] = (i + share * rows + step) % CLASSES;
    ct_tensor *all = ct_randn(CT_SHAPE(ROWS, FEATURES), r->cfg.dtype, &gen);
    *x = all ? ct_narrow(all, 0, share * rows, rows) : NULL;
    *y = ct_from_data(labels, 1, &rows, CT_INT64);
    if (!*x || !*y)
        tt_fail(__FILE__, __LINE__, "batch %d: %s", step, ct_errmsg());
    return *x && *y;
}

/* One step of side s on micro-batches share .. of step; the loss of this
 * rank's share into *loss. */
static int train_step(run *r, side *s, int step, int micro, double *loss) {
    ct_scope_begin();
    int rc = 0;
    *loss = 0;
    for (int m = 0; m < micro && !rc; m++) {
        rc = ct_ddp_set_sync(s->ddp, m == micro - 1);
        ct_tensor *x, *y;
        if (!rc && !batch(r, step, rank_ * micro + m, size_ * micro, &x, &y))
            rc = ct_errcode();
        ct_tensor *l =
            rc ? NULL
               : ct_div_scalar(ct_cross_entropy(ct_module_forward(s->net, x), y, NULL), micro);
        rc = rc ? rc : l ? ct_tensor_backward(l) : ct_errcode();
        *loss += rc ? 0 : ct_item(l);
    }
    double norm = 0;
    if (!rc && r->clip > 0)
        rc = ct_ddp_clip_grad_norm(s->ddp, s->opt, r->clip, 2, &norm);
    if (!rc)
        rc = ct_optim_step(s->opt);
    if (!rc)
        rc = ct_optim_zero_grad(s->opt, step % 2 == 0);
    ct_scope_end();
    return rc;
}

/* The largest relative difference between the twins' parameters. */
static double params_apart(const run *r) {
    double worst = 0;
    for (int i = 0; i < r->rep.params.n; i++) {
        ct_tensor *a = r->rep.params.tensors[i], *b = r->sh.params.tensors[i];
        for (int64_t k = 0; k < ct_numel(a); k++) {
            double x = tt_at(a, k), y = tt_at(b, k);
            double rel = fabs(x - y) / (fabs(x) + 1e-3);
            worst = rel > worst || isnan(rel) ? rel : worst;
        }
    }
    return worst;
}

/* Trains both twins STEPS steps; every step's loss and the final parameters
 * must agree to tol. */
static void compare(run *r, ct_ddp_shard stage, int micro) {
    double tol = r->cfg.dtype == CT_FLOAT64 ? RTOL_F64 : RTOL_F32, worst = 0;
    bool clipped = false;
    for (int step = 0; step < STEPS; step++) {
        double a, b;
        int rc = train_step(r, &r->rep, step, micro, &a);
        if (rc || (rc = train_step(r, &r->sh, step, micro, &b))) {
            tt_fail(__FILE__, __LINE__, "step %d: %s: %s", step, ct_errname(rc), ct_errmsg());
            return;
        }
        double rel = fabs(a - b) / fabs(a);
        worst = rel > worst ? rel : worst;
        if (!(rel <= tol)) {
            tt_fail(__FILE__, __LINE__,
                    "step %d: the replicated loss is %.12g, shard %d's %.12g (relative %.3g, "
                    "tolerance %g)",
                    step, a, (int)stage, b, rel, tol);
            return;
        }
        clipped |= r->clip > 0 && step == 0;
    }
    TT_CHECK_RC("ct_ddp_summon_params", ct_ddp_summon_params(r->sh.ddp, true));
    double apart = params_apart(r);
    TT_CHECK_RC("ct_ddp_summon_params", ct_ddp_summon_params(r->sh.ddp, false));
    if (!(apart <= (r->cfg.dtype == CT_FLOAT64 ? PTOL_F64 : PTOL_F32)))
        tt_fail(__FILE__, __LINE__, "after %d steps the parameters differ by %.3g (relative)",
                STEPS, apart);
    printf("rank %d: shard %d on %d ranks: %d steps, losses within %.3g, parameters within "
           "%.3g%s\n",
           rank_, (int)stage, size_, STEPS, worst, apart, clipped ? " (clipped)" : "");
}

static void run_twins(const net_config *cfg, ct_ddp_shard stage, ct_optim_kind kind, double clip,
                      int micro) {
    int rank, size;
    if (!(comm_ = tt_rank_join(TIMEOUT, &rank, &size)))
        return;
    rank_ = rank;
    size_ = size;
    run r = {.cfg = *cfg, .kind = kind, .clip = clip};
    if (side_init(&r.rep, &r, CT_DDP_SHARD_NONE) && side_init(&r.sh, &r, stage))
        compare(&r, stage, micro);
    side_free(&r.sh);
    side_free(&r.rep);
    ct_dist_finalize();
}

static const net_config f32 = {.dtype = CT_FLOAT32};

/* The last rank dies (SIGKILL) as step 2 begins: every other rank's step
 * fails in its first collective after (ZeRO-3: the forward's allgather;
 * ZeRO-2: backward's reduces) with CT_EPEER naming it, noticed rather than
 * waited out, and freeing the ct_ddp (ZeRO-3 gathers its units back) and
 * finalizing do not hang. */
static void peer_dies(ct_ddp_shard stage) {
    /* ctlaunch SIGTERMs the others once it sees a rank die: they ignore it,
     * to report what their step said (test_shard gives ctlaunch a --grace
     * for that; coll_rank.c's peer_killed does the same). */
    signal(SIGTERM, SIG_IGN);
    int rank, size;
    if (!(comm_ = tt_rank_join(TIMEOUT, &rank, &size)))
        return;
    rank_ = rank;
    size_ = size;
    run r = {.cfg = f32, .kind = CT_OPTIM_ADAMW};
    int victim = size - 1, rc = 0, step = 0;
    double loss, took = 0;
    if (side_init(&r.sh, &r, stage)) {
        for (; step < 5 && !rc; step++) {
            if (step == 2 && rank == victim)
                raise(SIGKILL);
            double t0 = tt_now();
            rc = train_step(&r, &r.sh, step, 1, &loss);
            took = tt_now() - t0;
        }
        if (rc != CT_EPEER || step != 3)
            tt_fail(__FILE__, __LINE__, "step %d ended %s, expected CT_EPEER at step 2: %s",
                    step - 1, ct_errname(rc), ct_errmsg());
        else if (!tt_names_rank(ct_errmsg(), victim))
            tt_fail(__FILE__, __LINE__, "the error does not name rank %d: %s", victim, ct_errmsg());
        else if (took > TIMEOUT / 2)
            tt_fail(__FILE__, __LINE__, "the dead peer was noticed after %.2f s", took);
        else
            printf("rank %d: shard %d: step 2 failed after %.2f s: %s\n", rank, (int)stage, took,
                   ct_errmsg());
    }
    side_free(&r.sh);
    ct_dist_finalize();
}

TEST(zero2_peer_dies) { peer_dies(CT_DDP_SHARD_GRADIENTS); }
TEST(zero3_peer_dies) { peer_dies(CT_DDP_SHARD_FULL); }

/* A clip threshold the early gradients exceed. */
#define CLIP 0.5

#define STAGE_TESTS(prefix, stage)                                                                 \
    TEST(prefix##_sgd) { run_twins(&f32, stage, CT_OPTIM_SGD, 0, 1); }                             \
    TEST(prefix##_adamw) { run_twins(&f32, stage, CT_OPTIM_ADAMW, 0, 1); }                         \
    TEST(prefix##_adamw_clip) { run_twins(&f32, stage, CT_OPTIM_ADAMW, CLIP, 1); }                 \
    TEST(prefix##_sgd_f64) {                                                                       \
        run_twins(&(net_config){.dtype = CT_FLOAT64}, stage, CT_OPTIM_SGD, CLIP, 1);               \
    }                                                                                              \
    TEST(prefix##_adamw_f64) {                                                                     \
        run_twins(&(net_config){.dtype = CT_FLOAT64}, stage, CT_OPTIM_ADAMW, CLIP, 1);             \
    }                                                                                              \
    TEST(prefix##_unused) {                                                                        \
        run_twins(&(net_config){.dtype = CT_FLOAT32, .extra_rank0 = true}, stage, CT_OPTIM_ADAMW,  \
                  0, 1);                                                                           \
    }                                                                                              \
    TEST(prefix##_checkpointed) {                                                                  \
        run_twins(&(net_config){.dtype = CT_FLOAT32, .checkpointed = true}, stage, CT_OPTIM_ADAMW, \
                  0, 1);                                                                           \
    }                                                                                              \
    TEST(prefix##_no_sync) { run_twins(&f32, stage, CT_OPTIM_ADAMW, CLIP, MICRO); }

STAGE_TESTS(zero1, CT_DDP_SHARD_OPTIMIZER)
STAGE_TESTS(zero2, CT_DDP_SHARD_GRADIENTS)
STAGE_TESTS(zero3, CT_DDP_SHARD_FULL)

/* ---------------------------------------------------------------- memory */

/* Model-state bytes per parameter element against the ZeRO accounting
 * (fp32 AdamW: 4 + 4 + 8/N, 4 + (4 + 8)/N), the staging apart. */
static void check_memory(ct_ddp_shard stage) {
    int rank, size;
    if (!(comm_ = tt_rank_join(TIMEOUT, &rank, &size)))
        return;
    rank_ = rank;
    size_ = size;
    run r = {.cfg = f32, .kind = CT_OPTIM_ADAMW};
    if (side_init(&r.sh, &r, stage)) {
        ct_ddp_memory m;
        int64_t lo, hi;
        TT_CHECK_RC("ct_ddp_memory_of", ct_ddp_memory_of(r.sh.ddp, r.sh.opt, &m));
        lo = hi = 0;
        if (stage != CT_DDP_SHARD_FULL)
            TT_CHECK_RC("ct_ddp_shard_range", ct_ddp_shard_range(r.sh.ddp, &lo, &hi));
        double n = (double)ct_param_list_numel(&r.sh.params);
        double want_params = stage == CT_DDP_SHARD_FULL ? 4 * n / size : 4 * n;
        double want_grads = stage >= CT_DDP_SHARD_GRADIENTS ? 4 * n / size : 4 * n;
        double got = (double)(m.params + m.grads + m.optimizer);
        double want = want_params + want_grads + 8 * n / size;
        printf("rank %d: shard %d of %d: %.0f elements, share [%lld, %lld); bytes: params %lld, "
               "grads %lld, optimizer %lld, staging %lld; %.3f bytes per element, ZeRO says "
               "%.3f\n",
               rank_, (int)stage, size_, n, (long long)lo, (long long)hi, (long long)m.params,
               (long long)m.grads, (long long)m.optimizer, (long long)m.staging, got / n, want / n);
        /* The remainder and the int64 step counts sit on top; ZeRO-1 keeps
         * the usage map in its gradient buffer. */
        if (fabs(got - want) > 0.05 * want)
            tt_fail(__FILE__, __LINE__, "model state %.0f bytes, the ZeRO accounting %.0f", got,
                    want);
    }
    side_free(&r.sh);
    ct_dist_finalize();
}

TEST(zero1_memory) { check_memory(CT_DDP_SHARD_OPTIMIZER); }
TEST(zero2_memory) { check_memory(CT_DDP_SHARD_GRADIENTS); }
TEST(zero3_memory) { check_memory(CT_DDP_SHARD_FULL); }

/* ---------------------------------------------------------------- errors */

static void expect(const char *what, bool failed, int code, const char *const *subs) {
    if (!failed) {
        tt_fail(__FILE__, __LINE__, "%s succeeded", what);
        return;
    }
    if (ct_errcode() != code)
        tt_fail(__FILE__, __LINE__, "%s: %s, expected %s: %s", what, ct_errname(ct_errcode()),
                ct_errname(code), ct_errmsg());
    tt_message_holds(rank_, what, subs);
}

/* A model whose forward uses layer a's weight outside a's own forward. */
static ct_tensor *stray_forward(ct_module *m, ct_tensor *x) {
    ct_module *a = ct_module_child(m, "a");
    return ct_linear(x, ct_module_param(a, "weight"), NULL);
}

static ct_module *stray_net(void) {
    ct_module *m = ct_module_new("stray", stray_forward, NULL, NULL);
    ct_manual_seed(SEED);
    if (m && ct_module_add_child(m, "a", dense(4, 3, true, CT_FLOAT32))) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* What ZeRO-3 refuses: a flattened model, a unit listed twice or inside
 * another, and a parameter used outside its unit (at the op that uses it,
 * naming the unit). */
static void fsdp_errors(void) {
    ct_ddp_options o = ct_ddp_defaults();
    o.shard = CT_DDP_SHARD_FULL;
    ct_module *m = stray_net();
    ct_module *a = m ? ct_module_child(m, "a") : NULL;
    ct_ddp *d = NULL;
    if (m && !ct_module_flatten(m, false))
        d = ct_ddp_new(comm_, m, &o);
    expect("shard 3 of a flattened model", !d, CT_EINVAL,
           (const char *const[]){"do not flatten", NULL});
    ct_module_free(m);
    m = stray_net();
    a = m ? ct_module_child(m, "a") : NULL;
    o.units = (ct_module *const[]){a, a};
    o.nunits = 2;
    d = m ? ct_ddp_new(comm_, m, &o) : NULL;
    expect("a unit listed twice", !d, CT_EINVAL,
           (const char *const[]){"in unit 'a' and in unit 'a'", "wrapped twice", NULL});
    o.units = (ct_module *const[]){m, a};
    d = m ? ct_ddp_new(comm_, m, &o) : NULL;
    expect("a unit inside another", !d, CT_EINVAL,
           (const char *const[]){"one inside another", NULL});
    o.units = (ct_module *const[]){a};
    o.nunits = 1;
    d = m ? ct_ddp_new(comm_, m, &o) : NULL;
    TT_CHECK_RC("ct_ddp_new (shard 3)", d ? 0 : ct_errcode());
    ct_tensor *piece = NULL;
    int64_t at = -1;
    expect("ct_ddp_shard_range under shard 3", d && ct_ddp_shard_range(d, NULL, NULL) != 0,
           CT_ESTATE, (const char *const[]){"each unit is sharded on its own", NULL});
    expect("ct_ddp_param_shard of parameter 9", d && ct_ddp_param_shard(d, 9, &piece, &at) != 0,
           CT_EINVAL, (const char *const[]){"parameter 9 is outside [0, 2)", NULL});
    /* Every element of a's weight [3, 4] and bias [3] on exactly one rank. */
    int64_t mine = 0;
    for (int i = 0; d && i < 2; i++) {
        if (ct_ddp_param_shard(d, i, &piece, &at)) {
            TT_CHECK_RC("ct_ddp_param_shard", ct_errcode());
            break;
        }
        mine += piece ? ct_numel(piece) : 0;
        ct_tensor_free(piece);
    }
    ct_tensor *all = ct_full(1, (int64_t[]){1}, (double)mine, CT_FLOAT64);
    if (d && !ct_comm_allreduce(comm_, all, CT_REDUCE_SUM, NULL) && ct_item(all) != 15)
        tt_fail(__FILE__, __LINE__, "the ranks' pieces hold %g elements of 15", ct_item(all));
    ct_tensor *x = ct_zeros(CT_SHAPE(2, 4), CT_FLOAT32);
    ct_tensor *y = d ? ct_module_forward(m, x) : NULL;
    expect("a parameter used outside its unit", d && !y, CT_ESTATE,
           (const char *const[]){"fully sharded unit 'a'", "outside its unit", NULL});
    ct_ddp_free(d);
    ct_module_free(m);
    /* A unit of float64 beside one of float32: refused, naming the one that
     * differs. */
    m = stray_net();
    if (m && ct_module_add_child(m, "wide", dense(4, 3, true, CT_FLOAT64)))
        TT_CHECK_RC("add_child", ct_errcode());
    o.units = (ct_module *const[]){m ? ct_module_child(m, "a") : NULL,
                                   m ? ct_module_child(m, "wide") : NULL};
    o.nunits = 2;
    d = m ? ct_ddp_new(comm_, m, &o) : NULL;
    expect("units of float32 and float64", !d, CT_EDTYPE,
           (const char *const[]){"parameter wide.weight is float64",
                                 "every parameter must be "
                                 "float32",
                                 NULL});
    ct_module_free(m);
}

TEST(errors) {
    int rank, size;
    if (!(comm_ = tt_rank_join(TIMEOUT, &rank, &size)))
        return;
    rank_ = rank;
    size_ = size;
    ct_ddp_options o = ct_ddp_defaults();
    o.shard = CT_DDP_SHARD_GRADIENTS;
    /* A model that is not flattened. */
    ct_manual_seed(SEED);
    ct_module *loose = ct_linear_new(4, 3, true);
    ct_ddp *d = loose ? ct_ddp_new(comm_, loose, &o) : NULL;
    expect("ct_ddp_new on a model not flattened", !d, CT_EINVAL,
           (const char *const[]){"shard 2", "ct_module_flatten", NULL});
    ct_ddp_free(d);
    /* A stage ct_ddp does not have. */
    o.shard = (ct_ddp_shard)7;
    if (loose && !ct_module_flatten(loose, false))
        d = ct_ddp_new(comm_, loose, &o);
    expect("ct_ddp_new with shard 7", !d, CT_EINVAL,
           (const char *const[]){"shard 7", "ZeRO-1", "ZeRO-2", "ZeRO-3", NULL});
    ct_ddp_free(d);
    o.shard = CT_DDP_SHARD_OPTIMIZER;
    d = loose ? ct_ddp_new(comm_, loose, &o) : NULL;
    TT_CHECK_RC("ct_ddp_new", d ? 0 : ct_errcode());
    ct_tensor *stranger = ct_zeros(CT_SHAPE(3), CT_FLOAT32); /* the test's scope owns it */
    ct_optim_options oo = ct_optim_defaults(CT_OPTIM_SGD, 0.1);
    ct_optim *opt = d ? ct_ddp_optim_new(d, &oo, &(ct_param_group){&stranger, 1, 0, 1}, 1) : NULL;
    expect("ct_ddp_optim_new with a tensor not the model's", !opt, CT_EINVAL,
           (const char *const[]){"param 0 of group 0", "not a parameter", NULL});
    ct_param_list pl;
    ct_param_list_init(&pl);
    if (d && !ct_module_named_parameters(loose, &pl)) {
        ct_param_group twice[2] = {{pl.tensors, pl.n, 0, 1}, {pl.tensors + 1, 1, 0, 1}};
        opt = ct_ddp_optim_new(d, &oo, twice, 2);
        expect("a parameter in two groups", !opt, CT_EINVAL,
               (const char *const[]){"parameter bias is in groups 0 and 1", NULL});
        /* Not ZeRO-3: the parameters are whole, one range a rank. */
        ct_tensor *piece = NULL;
        int64_t at = 0, lo = -1, hi = -1;
        expect("ct_ddp_param_shard under shard 1", ct_ddp_param_shard(d, 0, &piece, &at) != 0,
               CT_ESTATE, (const char *const[]){"not fully sharded (shard 1)", NULL});
        TT_CHECK_RC("ct_ddp_shard_range", ct_ddp_shard_range(d, &lo, &hi));
        if (rank_ == size_ - 1 && hi != 4 * 3 + 3)
            tt_fail(__FILE__, __LINE__, "the last rank's range ends at %lld, not 15",
                    (long long)hi);
        opt = ct_ddp_optim_new(d, &oo, &(ct_param_group){pl.tensors, pl.n, 0, 1}, 1);
        TT_CHECK_RC("ct_ddp_optim_new", opt ? 0 : ct_errcode());
        ct_optim *second = ct_ddp_optim_new(d, &oo, &(ct_param_group){pl.tensors, pl.n, 0, 1}, 1);
        expect("a second sharded optimizer", !second, CT_ESTATE,
               (const char *const[]){"already has a sharded optimizer", NULL});
        ct_optim *plain = ct_optim_new_groups(&oo, &(ct_param_group){pl.tensors, pl.n, 0, 1}, 1);
        expect("clipping with an optimizer not the ct_ddp's",
               plain && ct_ddp_clip_grad_norm(d, plain, 1.0, 2, NULL) != 0, CT_EINVAL,
               (const char *const[]){"not this ct_ddp's sharded optimizer", NULL});
        ct_optim_free(plain);
        ct_ddp_comm_hook hook = ct_ddp_bf16_compress_hook();
        expect("a comm hook under shard 1", d && ct_ddp_set_comm_hook(d, &hook) != 0, CT_EINVAL,
               (const char *const[]){"shard", "comm hook", NULL});
        if (hook.free)
            hook.free(hook.ctx);
    }
    ct_optim_free(opt);
    ct_param_list_free(&pl);
    ct_ddp_free(d);
    ct_module_free(loose);
    fsdp_errors();
    ct_dist_finalize();
}
