/* The program each rank of test_ddp runs under ctlaunch: data-parallel
 * training (ct_ddp) of a small MLP, checked against the same training in
 * one process, which every rank computes itself from the same initial
 * weights and the same global batches. The scenario is named on the command
 * line:
 *
 *   sgd, adamw          STEPS steps on N ranks with per-rank batch BATCH / N
 *                       give the parameters of STEPS steps of one process
 *                       with batch BATCH (SGD with momentum, AdamW)
 *   checkpointed        the same with every block under ct_activation_checkpoint
 *                       (reentrant backward) and static_graph
 *   mismatched_models   rank 1 has another hidden size: CT_EMISMATCH on
 *                       every rank, naming the parameters and both shapes
 *   unused_fails        a layer outside the loss: backward fails on every
 *                       rank, naming its parameters
 *   unused_found        the same with find_unused_parameters trains, and
 *                       that layer's gradients are zero
 *   partly_unused       a layer in the loss on rank 0 only, with
 *                       find_unused_parameters and zero_grad's set_to_none:
 *                       the ranks stay bitwise equal, and the layer trains
 *   ready_twice_fails   a layer in two checkpointed segments without
 *                       static_graph: CT_ESTATE naming it on every rank
 *   ready_twice_static  the same with static_graph trains and matches
 *   no_sync             K micro-steps, sync off for the first K - 1, then
 *                       one step, equal one step on the concatenated batch
 *   bf16_hook           the bfloat16 compression hook: gradients are the
 *                       float32 average within bfloat16 rounding, and
 *                       training matches to a bfloat16-level tolerance
 *   bucket_order        buckets hold the parameters in reverse
 *                       registration order, bucket 0 the last registered
 *   uneven              with uneven_inputs, rank r runs UNEVEN_STEPS + 2 r
 *                       steps, matching a reference after each, then
 *                       ct_ddp_join returns 0 on every rank, soon, and
 *                       leaves the parameters as they were
 *   join_needs_uneven_inputs
 *                       without uneven_inputs, ct_ddp_join fails at once
 *                       with CT_ESTATE naming the option
 *
 * The buckets are made small (BUCKET_BYTES) so that the model spans
 * several. Every rank prints "pid=<pid>" first so that the driver can check
 * that none is left behind. A check that fails returns from its scenario,
 * so the ranks may fall out of step: the collective timeout (TIMEOUT) then
 * ends the others, and the driver's deadline ends the job. */
#include "ct_test.h"
#include "tt_rank.h"

#include <ct/dist.h>
#include <ct/optim.h>
#include <stdlib.h>
#include <unistd.h>

#define IN     16
#define HIDDEN 32
#define OUT    5
/* The global batch: divisible by 2 and by 3 ranks. */
#define BATCH 12
#define STEPS 20
/* no_sync's micro-steps per optimizer step, and optimizer steps. */
#define MICRO_STEPS 3
#define ROUNDS      2
/* The uneven scenario's fewest steps (rank 0's). */
#define UNEVEN_STEPS 3
/* The first bucket and the others, in bytes: the model's 2.7 k float32
 * gradients span three buckets. */
#define FIRST_BUCKET_BYTES 1024
#define BUCKET_BYTES       4096
/* Rank r builds its model from SEED + r, so that only ct_ddp_new's
 * broadcast makes the ranks agree; the reference starts from rank 0's. */
#define SEED 100
/* Seconds for rendezvous and every collective: far above what a step
 * takes, far below the driver's deadline. */
#define TIMEOUT 10.0
/* Equivalence in float32, where the only difference is the order of the
 * sums (per-rank means averaged, against one mean). */
#define RTOL_FP32 1e-5
/* Gradients that travelled as bfloat16 (8 significant bits). */
#define RTOL_BF16 1e-2

static int rank_, size_;
static ct_comm *comm_;

static bool join(void) {
    if (!(comm_ = tt_rank_join(TIMEOUT, &rank_, &size_)))
        return false;
    if (BATCH % size_) {
        tt_fail(__FILE__, __LINE__, "%d ranks do not divide the batch of %d", size_, BATCH);
        return false;
    }
    return true;
}

/* ----------------------------------------------------------------- model */

/* The model: in (IN -> hidden), mid (hidden -> hidden), [aux (hidden ->
 * OUT)], out (hidden -> OUT), registered in that order, each hidden layer
 * followed by relu. */
typedef struct net_config {
    int64_t hidden;
    bool checkpointed; /* each hidden block runs under ct_activation_checkpoint */
    bool mid_twice;    /* mid runs twice (in two checkpointed segments when checkpointed) */
    bool unused;       /* aux runs, but its output is not part of the loss */
    bool aux_rank0;    /* aux runs, and its output joins the loss on rank 0 only */
} net_config;

static int run_block(void *layer, ct_tensor *const *inputs, int ninputs, ct_tensor **outputs,
                     int noutputs) {
    (void)ninputs;
    (void)noutputs;
    outputs[0] = ct_relu(ct_module_forward(layer, inputs[0]));
    return outputs[0] ? 0 : ct_errcode();
}

static ct_tensor *block(const net_config *cfg, ct_module *layer, ct_tensor *x) {
    if (!cfg->checkpointed)
        return ct_relu(ct_module_forward(layer, x));
    ct_tensor *y = NULL;
    return ct_activation_checkpoint(run_block, layer, &x, 1, &y, 1) == 0 ? y : NULL;
}

static ct_tensor *net_forward(ct_module *m, ct_tensor *x) {
    const net_config *cfg = ct_module_state(m);
    /* A reentrant checkpoint backpropagates only when an input requires
     * grad (as PyTorch's use_reentrant=True): the batch becomes a leaf that
     * does, so that the first block's parameters get gradients too. */
    if (cfg->checkpointed)
        x = ct_requires_grad_(ct_clone(x), true);
    ct_module *mid = ct_module_child(m, "mid");
    ct_tensor *h = block(cfg, mid, block(cfg, ct_module_child(m, "in"), x));
    if (cfg->mid_twice)
        h = block(cfg, mid, h);
    ct_tensor *aux =
        cfg->unused || cfg->aux_rank0 ? ct_module_forward(ct_module_child(m, "aux"), h) : NULL;
    if ((cfg->unused || cfg->aux_rank0) && !aux)
        return NULL;
    ct_tensor *y = ct_module_forward(ct_module_child(m, "out"), h);
    return cfg->aux_rank0 && rank_ == 0 ? ct_add(y, aux) : y;
}

/* The model with weights drawn from seed; NULL (failure recorded) on
 * error. */
static int add_layers(ct_module *m, const net_config *cfg) {
    int64_t h = cfg->hidden;
    CT_TRY(ct_module_add_child(m, "in", ct_linear_new(IN, h, true)));
    CT_TRY(ct_module_add_child(m, "mid", ct_linear_new(h, h, true)));
    if (cfg->unused || cfg->aux_rank0)
        CT_TRY(ct_module_add_child(m, "aux", ct_linear_new(h, OUT, true)));
    return ct_module_add_child(m, "out", ct_linear_new(h, OUT, true));
}

static ct_module *build_net(const net_config *cfg, uint64_t seed) {
    net_config *state = malloc(sizeof *state);
    if (state)
        *state = *cfg;
    /* The module owns state from here, also when it cannot be made. */
    ct_module *m = state ? ct_module_new("ddp_test_net", net_forward, state, free) : NULL;
    if (!m) {
        tt_fail(__FILE__, __LINE__, "building the model: out of memory");
        return NULL;
    }
    ct_manual_seed(seed);
    if (add_layers(m, cfg)) {
        tt_fail(__FILE__, __LINE__, "building the model: %s", ct_errmsg());
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------------ data */

/* Global batch number step, of rows (at most MICRO_STEPS * BATCH) rows:
 * the same on every rank (a generator of its own per step), labels a
 * function of the row. */
static bool global_batch(int step, int64_t rows, ct_tensor **x, ct_tensor **y) {
    ct_generator gen = {.seed = 7000 + (uint64_t)step, .offset = 0};
    int64_t labels[MICRO_STEPS * BATCH];
    for (int64_t i = 0; i < rows; i++)
        labels[i] = (i * 3 + step) % OUT;
    *x = ct_randn(CT_SHAPE(rows, IN), CT_FLOAT32, &gen);
    *y = ct_from_data(labels, 1, &rows, CT_INT64);
    if (!*x || !*y)
        tt_fail(__FILE__, __LINE__, "batch %d: %s", step, ct_errmsg());
    return *x && *y;
}

/* Rows [first + share * rows / nshares, + rows / nshares) of t: a share of
 * rows rows starting at first. */
static ct_tensor *share_of(ct_tensor *t, int64_t first, int64_t rows, int share, int nshares) {
    return ct_narrow(t, 0, first + share * rows / nshares, rows / nshares);
}

/* Forward and backward of the mean cross-entropy over (x, y), times scale;
 * gradients accumulate. Returns backward's code. */
static int forward_backward(ct_module *net, ct_tensor *x, ct_tensor *y, double scale) {
    ct_scope_begin();
    ct_tensor *loss = ct_mul_scalar(ct_cross_entropy(ct_module_forward(net, x), y, NULL), scale);
    int rc = loss ? ct_tensor_backward(loss) : ct_errcode();
    ct_scope_end();
    return rc;
}

/* Forward and backward of share share (of nshares) of global batch step,
 * the loss times scale. */
static int scaled_backward_on_batch(ct_module *net, int step, int share, int nshares,
                                    double scale) {
    ct_scope_begin();
    ct_tensor *x, *y;
    int rc = global_batch(step, BATCH, &x, &y)
                 ? forward_backward(net, share_of(x, 0, BATCH, share, nshares),
                                    share_of(y, 0, BATCH, share, nshares), scale)
                 : ct_errcode();
    ct_scope_end();
    return rc;
}

static int backward_on_batch(ct_module *net, int step, int share, int nshares) {
    return scaled_backward_on_batch(net, step, share, nshares, 1.0);
}

/* ------------------------------------------------------------- training */

/* A data-parallel model and its one-process reference. */
typedef struct fixture {
    ct_module *net, *ref;
    ct_param_list params, ref_params; /* in registration order */
    ct_ddp *ddp;
    ct_optim *opt, *ref_opt;
} fixture;

static void fixture_free(fixture *f) {
    ct_ddp_free(f->ddp);
    ct_optim_free(f->opt);
    ct_optim_free(f->ref_opt);
    ct_param_list_free(&f->params);
    ct_param_list_free(&f->ref_params);
    ct_module_free(f->net);
    ct_module_free(f->ref);
}

/* Small buckets, so that the model spans several. */
/* Small buckets, so that there are several; DDP_TEST_PROGRESS ("thread" or
 * "end") overrides ct_ddp's AUTO choice of progress mode. */
static ct_ddp_options small_buckets(void) {
    ct_ddp_options o = ct_ddp_defaults();
    o.first_bucket_bytes = FIRST_BUCKET_BYTES;
    o.bucket_bytes = BUCKET_BYTES;
    const char *mode = getenv("DDP_TEST_PROGRESS");
    if (mode && !strcmp(mode, "thread"))
        o.progress = CT_DDP_PROGRESS_THREAD;
    else if (mode && !strcmp(mode, "end"))
        o.progress = CT_DDP_PROGRESS_END;
    return o;
}

static ct_optim *new_optim(ct_optim_kind kind, const ct_param_list *pl) {
    ct_optim_options o = ct_optim_defaults(kind, kind == CT_OPTIM_SGD ? 0.1 : 0.01);
    if (kind == CT_OPTIM_SGD)
        o.momentum = 0.9;
    ct_optim *opt = ct_optim_new(&o, pl->tensors, pl->n);
    if (!opt)
        tt_fail(__FILE__, __LINE__, "ct_optim_new: %s", ct_errmsg());
    return opt;
}

/* How far got's parameters are from want's (in the same order): the largest
 * |got - want| / (|want| + the tensor's mean |want|), whose floor keeps
 * elements near zero from dominating. Records a failure naming the first
 * element beyond rtol. */
static double compare_params(const ct_param_list *got, const ct_param_list *want, double rtol,
                             const char *what) {
    double worst = 0;
    bool reported = false;
    for (int i = 0; i < got->n && i < want->n; i++) {
        ct_tensor *g = got->tensors[i], *w = want->tensors[i];
        int64_t n = ct_numel(w);
        if (ct_numel(g) != n) {
            tt_fail(__FILE__, __LINE__, "%s: %s has %lld elements, the reference %lld", what,
                    got->names[i], (long long)ct_numel(g), (long long)n);
            return INFINITY;
        }
        double floor = 0;
        for (int64_t k = 0; k < n; k++)
            floor += fabs(tt_at(w, k)) / (double)n;
        for (int64_t k = 0; k < n; k++) {
            double gv = tt_at(g, k), wv = tt_at(w, k);
            double rel = fabs(gv - wv) / (fabs(wv) + floor + 1e-30);
            if (!(rel <= rtol) && !reported) {
                tt_fail(__FILE__, __LINE__,
                        "%s: %s element %lld is %.9g, the reference %.9g (relative difference "
                        "%.3g, tolerance %g)",
                        what, got->names[i], (long long)k, gv, wv, rel, rtol);
                reported = true;
            }
            worst = rel > worst || isnan(rel) ? rel : worst;
        }
    }
    if (got->n != want->n)
        tt_fail(__FILE__, __LINE__, "%s: %d parameters, the reference %d", what, got->n, want->n);
    return worst;
}

/* Builds the data-parallel model (weights from SEED + rank), wraps it with
 * opts, and builds the reference from rank 0's weights, checking that the
 * broadcast made the two equal; then an optimizer of kind for each. */
static bool setup(fixture *f, const net_config *cfg, const ct_ddp_options *opts,
                  ct_optim_kind kind) {
    ct_param_list_init(&f->params);
    ct_param_list_init(&f->ref_params);
    if (!(f->net = build_net(cfg, SEED + (uint64_t)rank_)))
        return false;
    if (!(f->ddp = ct_ddp_new(comm_, f->net, opts))) {
        tt_fail(__FILE__, __LINE__, "ct_ddp_new: %s: %s", ct_errname(ct_errcode()), ct_errmsg());
        return false;
    }
    if (!(f->ref = build_net(cfg, SEED)))
        return false;
    if (ct_module_named_parameters(f->net, &f->params) ||
        ct_module_named_parameters(f->ref, &f->ref_params)) {
        tt_fail(__FILE__, __LINE__, "listing parameters: %s", ct_errmsg());
        return false;
    }
    if (compare_params(&f->params, &f->ref_params, 0, "after ct_ddp_new's broadcast") != 0)
        return false;
    if (ct_ddp_num_buckets(f->ddp) < 2) {
        tt_fail(__FILE__, __LINE__, "%d bucket(s); the test needs several",
                ct_ddp_num_buckets(f->ddp));
        return false;
    }
    return (f->opt = new_optim(kind, &f->params)) && (f->ref_opt = new_optim(kind, &f->ref_params));
}

/* Optimizer steps [first, first + steps) of net on share share (of
 * nshares) of each global batch. zero_grad alternates between its two
 * kinds: in place, which keeps ct_ddp's views, and set_to_none, after which
 * ct_ddp puts the next gradients (zero for an unused parameter) back into
 * its views. */
static int train(ct_module *net, ct_optim *opt, int first, int steps, int share, int nshares) {
    for (int s = first; s < first + steps; s++) {
        CT_TRY(backward_on_batch(net, s, share, nshares));
        CT_TRY(ct_optim_step(opt));
        CT_TRY(ct_optim_zero_grad(opt, s % 2 == 1));
    }
    return 0;
}

/* Trains steps steps from step first in data parallel and in the
 * reference, then compares the parameters to rtol. */
static void train_and_compare(fixture *f, int first, int steps, double rtol) {
    int rc = train(f->net, f->opt, first, steps, rank_, size_);
    if (rc) {
        tt_fail(__FILE__, __LINE__, "data-parallel training: %s: %s", ct_errname(rc), ct_errmsg());
        return;
    }
    if ((rc = train(f->ref, f->ref_opt, first, steps, 0, 1))) {
        tt_fail(__FILE__, __LINE__, "reference training: %s: %s", ct_errname(rc), ct_errmsg());
        return;
    }
    double worst = compare_params(&f->params, &f->ref_params, rtol, "after training");
    printf("rank %d: parameters after %d steps within %.3g (relative) of the reference\n", rank_,
           first + steps, worst);
}

/* ------------------------------------------------------------- scenarios */

static const net_config plain = {.hidden = HIDDEN};

/* Sets up cfg with opts and optimizer kind, trains STEPS steps both ways
 * and compares; then ends the job. */
static void run_equivalence(const net_config *cfg, const ct_ddp_options *opts, ct_optim_kind kind) {
    if (!join())
        return;
    fixture f = {0};
    if (setup(&f, cfg, opts, kind))
        train_and_compare(&f, 0, STEPS, RTOL_FP32);
    fixture_free(&f);
    ct_dist_finalize();
}

TEST(sgd) {
    ct_ddp_options o = small_buckets();
    run_equivalence(&plain, &o, CT_OPTIM_SGD);
}

TEST(adamw) {
    ct_ddp_options o = small_buckets();
    run_equivalence(&plain, &o, CT_OPTIM_ADAMW);
}

TEST(checkpointed) {
    ct_ddp_options o = small_buckets();
    o.static_graph = true;
    run_equivalence(&(net_config){.hidden = HIDDEN, .checkpointed = true}, &o, CT_OPTIM_SGD);
}

/* The layer run in two checkpointed segments: with static_graph, the first
 * iteration learns that its parameters are ready after their second hook. */
TEST(ready_twice_static) {
    ct_ddp_options o = small_buckets();
    o.static_graph = true;
    run_equivalence(&(net_config){.hidden = HIDDEN, .checkpointed = true, .mid_twice = true}, &o,
                    CT_OPTIM_SGD);
}

/* Asserts that rc is code with a message holding each of the NULL-ended
 * subs, printing the message for the driver's log. */
static void expect_error(const char *what, int rc, int code, const char *const *subs) {
    printf("rank %d: %s: %s\n", rank_, what, ct_errmsg());
    if (rc != code) {
        tt_fail(__FILE__, __LINE__, "%s returned %s, expected %s: %s", what, ct_errname(rc),
                ct_errname(code), ct_errmsg());
        return;
    }
    for (; *subs; subs++)
        if (!strstr(ct_errmsg(), *subs))
            tt_fail(__FILE__, __LINE__, "%s: the message \"%s\" does not name \"%s\"", what,
                    ct_errmsg(), *subs);
}

/* Rank 1 has hidden size HIDDEN + 1: ct_ddp_new fails on every rank, each
 * message naming the first parameter with rank 0's shape and rank 1's, and
 * soon (the hash exchange and the diff, not a timeout). */
TEST(mismatched_models) {
    if (!join())
        return;
    net_config cfg = plain;
    if (rank_ == 1)
        cfg.hidden = HIDDEN + 1;
    ct_module *net = build_net(&cfg, SEED);
    if (net) {
        ct_ddp_options o = small_buckets();
        double t0 = tt_now();
        ct_errclear();
        ct_ddp *ddp = ct_ddp_new(comm_, net, &o);
        double took = tt_now() - t0;
        if (ddp) {
            tt_fail(__FILE__, __LINE__, "ct_ddp_new accepted models that differ");
            ct_ddp_free(ddp);
        } else {
            char rank0[64], rank1[64];
            snprintf(rank0, sizeof rank0, "rank 0 has in.weight float32[%d, %d]", HIDDEN, IN);
            snprintf(rank1, sizeof rank1, "rank 1 has in.weight float32[%d, %d]", HIDDEN + 1, IN);
            expect_error("ct_ddp_new", ct_errcode(), CT_EMISMATCH,
                         (const char *const[]){rank0, rank1, NULL});
            if (took > TIMEOUT / 2)
                tt_fail(__FILE__, __LINE__, "the mismatch was noticed after %.2f s", took);
        }
    }
    ct_module_free(net);
    ct_dist_finalize();
}

/* aux runs but is not in the loss: its parameters get no gradient, and the
 * backward fails on every rank naming them and the option that allows it. */
TEST(unused_fails) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    if (setup(&f, &(net_config){.hidden = HIDDEN, .unused = true}, &o, CT_OPTIM_SGD))
        expect_error(
            "backward with an unused parameter", backward_on_batch(f.net, 0, rank_, size_),
            CT_ESTATE,
            (const char *const[]){"aux.weight", "aux.bias", "find_unused_parameters", NULL});
    fixture_free(&f);
    ct_dist_finalize();
}

/* Whether every element of every gradient of the parameters named
 * prefix.* in pl is zero, recording a failure if not. */
static bool grads_are_zero(const ct_param_list *pl, const char *prefix) {
    for (int i = 0; i < pl->n; i++) {
        if (strncmp(pl->names[i], prefix, strlen(prefix)))
            continue;
        ct_tensor *g = ct_tensor_grad(pl->tensors[i]);
        if (!g) {
            tt_fail(__FILE__, __LINE__, "%s has no gradient", pl->names[i]);
            return false;
        }
        for (int64_t k = 0; k < ct_numel(g); k++)
            if (tt_at(g, k) != 0) {
                tt_fail(__FILE__, __LINE__, "%s's gradient element %lld is %g, not 0", pl->names[i],
                        (long long)k, tt_at(g, k));
                return false;
            }
    }
    return true;
}

/* With find_unused_parameters the same model trains: aux's gradients are
 * zero after each backward, and the parameters match the reference (where
 * aux has no gradient and its optimizer skips it). */
TEST(unused_found) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    o.find_unused_parameters = true;
    if (setup(&f, &(net_config){.hidden = HIDDEN, .unused = true}, &o, CT_OPTIM_SGD)) {
        int rc = backward_on_batch(f.net, 0, rank_, size_);
        if (rc)
            tt_fail(__FILE__, __LINE__, "backward with find_unused_parameters: %s: %s",
                    ct_errname(rc), ct_errmsg());
        else if (grads_are_zero(&f.params, "aux.") && !(rc = ct_optim_step(f.opt)) &&
                 !(rc = ct_optim_zero_grad(f.opt, false)) &&
                 !(rc = train(f.ref, f.ref_opt, 0, 1, 0, 1)))
            train_and_compare(&f, 1, STEPS - 1, RTOL_FP32);
        else if (rc)
            tt_fail(__FILE__, __LINE__, "first step: %s: %s", ct_errname(rc), ct_errmsg());
    }
    fixture_free(&f);
    ct_dist_finalize();
}

/* Rank 0's values of params, copied (into the caller's scope) and added to
 * out. */
static int rank0_params(const ct_param_list *params, ct_param_list *out) {
    for (int i = 0; i < params->n; i++) {
        ct_tensor *t = ct_clone(params->tensors[i]);
        CT_TRY(t ? ct_comm_broadcast(comm_, t, 0, NULL) : ct_errcode());
        CT_TRY(ct_param_list_add(out, params->names[i], t));
    }
    return 0;
}

/* aux joins the loss on rank 0 only: every other rank gets its average
 * gradient from rank 0, including after zero_grad with set_to_none, when
 * its own backward left aux without a gradient; the ranks' parameters stay
 * bitwise the same, and aux trains. */
TEST(partly_unused) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    o.find_unused_parameters = true;
    ct_param_list ranks0;
    ct_param_list_init(&ranks0);
    ct_scope_begin();
    if (setup(&f, &(net_config){.hidden = HIDDEN, .aux_rank0 = true}, &o, CT_OPTIM_SGD)) {
        ct_tensor *aux0 = ct_clone(ct_param_list_find(&f.params, "aux.weight"));
        int rc = aux0 ? train(f.net, f.opt, 0, 4, rank_, size_) : ct_errcode();
        if (!rc)
            rc = rank0_params(&f.params, &ranks0);
        ct_tensor *aux = ct_param_list_find(&f.params, "aux.weight");
        if (rc)
            tt_fail(__FILE__, __LINE__, "training: %s: %s", ct_errname(rc), ct_errmsg());
        else if (compare_params(&f.params, &ranks0, 0, "against rank 0's") == 0 &&
                 ct_item(ct_amax(ct_abs(ct_sub(aux0, aux)), NULL, 0, false)) == 0)
            tt_fail(__FILE__, __LINE__, "aux.weight did not train on rank %d", rank_);
    }
    ct_scope_end();
    ct_param_list_free(&ranks0);
    fixture_free(&f);
    ct_dist_finalize();
}

/* mid runs in two checkpointed segments: without static_graph its second
 * hook in one backward fails that backward on every rank, naming it. */
TEST(ready_twice_fails) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    if (setup(&f, &(net_config){.hidden = HIDDEN, .checkpointed = true, .mid_twice = true}, &o,
              CT_OPTIM_SGD))
        expect_error(
            "backward with a parameter ready twice", backward_on_batch(f.net, 0, rank_, size_),
            CT_ESTATE,
            (const char *const[]){"parameter mid.", "marked ready 2 times", "static_graph", NULL});
    fixture_free(&f);
    ct_dist_finalize();
}

/* Collectives this rank has issued so far. */
static uint64_t issued(void) {
    ct_comm_stats stats;
    ct_comm_stats_get(comm_, &stats);
    return stats.issued;
}

/* One no_sync round: MICRO_STEPS backwards on the micro-batches of global
 * batch step (MICRO_STEPS * BATCH rows), sync off for all but the last,
 * none of which may communicate. Each micro-batch loss is the mean over
 * the rank's share of its micro-batch, divided by MICRO_STEPS: the
 * micro-batches being of equal size, the reference's loss, the mean over
 * the concatenated batch, is the mean of the micro-batch losses. */
static int no_sync_round(fixture *f, int step) {
    const int64_t rows = MICRO_STEPS * BATCH;
    ct_tensor *x, *y;
    if (!global_batch(step, rows, &x, &y))
        return ct_errcode();
    uint64_t before = issued();
    int rc = 0;
    for (int m = 0; !rc && m < MICRO_STEPS; m++) {
        bool last = m == MICRO_STEPS - 1;
        rc = ct_ddp_set_sync(f->ddp, last);
        if (!rc)
            rc = forward_backward(f->net, share_of(x, m * BATCH, BATCH, rank_, size_),
                                  share_of(y, m * BATCH, BATCH, rank_, size_), 1.0 / MICRO_STEPS);
        if (!rc && !last && issued() != before) {
            tt_fail(__FILE__, __LINE__, "micro-step %d with sync off issued %llu collective(s)", m,
                    (unsigned long long)(issued() - before));
            return CT_ESTATE;
        }
    }
    if (!rc && issued() == before) {
        tt_fail(__FILE__, __LINE__, "the synchronized micro-step issued no collective");
        return CT_ESTATE;
    }
    return rc ? rc : forward_backward(f->ref, x, y, 1.0);
}

/* Compares the data-parallel gradients with the reference's, as
 * compare_params does parameters. */
static void compare_grads(fixture *f, double rtol, const char *what) {
    ct_param_list g, rg;
    ct_param_list_init(&g);
    ct_param_list_init(&rg);
    for (int i = 0; i < f->params.n; i++) {
        ct_tensor *a = ct_tensor_grad(f->params.tensors[i]),
                  *b = ct_tensor_grad(f->ref_params.tensors[i]);
        if (!a || !b) {
            tt_fail(__FILE__, __LINE__, "%s: %s has no gradient (%s)", what, f->params.names[i],
                    a ? "reference" : "data parallel");
            break;
        }
        ct_param_list_add(&g, f->params.names[i], a);
        ct_param_list_add(&rg, f->params.names[i], b);
    }
    if (!tt_failed()) {
        double worst = compare_params(&g, &rg, rtol, what);
        printf("rank %d: %s within %.3g (relative)\n", rank_, what, worst);
    }
    ct_param_list_free(&g);
    ct_param_list_free(&rg);
}

/* An optimizer step and an in-place zero_grad in both the data-parallel
 * run and the reference. */
static int step_both(fixture *f) {
    CT_TRY(ct_optim_step(f->opt));
    CT_TRY(ct_optim_step(f->ref_opt));
    CT_TRY(ct_optim_zero_grad(f->opt, false));
    return ct_optim_zero_grad(f->ref_opt, false);
}

TEST(no_sync) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    if (setup(&f, &plain, &o, CT_OPTIM_SGD)) {
        for (int s = 0; s < ROUNDS && !tt_failed(); s++) {
            ct_scope_begin();
            int rc = no_sync_round(&f, s);
            ct_scope_end();
            if (rc) {
                if (!tt_failed())
                    tt_fail(__FILE__, __LINE__, "round %d: %s: %s", s, ct_errname(rc), ct_errmsg());
                break;
            }
            compare_grads(&f, RTOL_FP32, "accumulated gradients");
            if (step_both(&f))
                tt_fail(__FILE__, __LINE__, "optimizer step: %s", ct_errmsg());
        }
        if (!tt_failed())
            compare_params(&f.params, &f.ref_params, RTOL_FP32, "after the no_sync rounds");
    }
    fixture_free(&f);
    ct_dist_finalize();
}

/* Whether v is a bfloat16 value: a float32 whose low 16 bits are zero. */
static bool is_bf16(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0xffff) == 0;
}

/* After one backward with the bf16 hook, each gradient element is a
 * bfloat16 value within bfloat16 rounding of the float32 average of every
 * rank's gradient, which each rank computes itself with the reference:
 * each rank's gradient g_r rounds to bfloat16 (8 significant bits, so a
 * relative error of at most 2^-8), the average is taken in float32 and
 * rounds once more, so the error is at most 2^-8 (mean |g_r| + |average|),
 * and 1% more for the float32 sums. */
static void check_bf16_grads(fixture *f) {
    int64_t total = 0;
    for (int i = 0; i < f->params.n; i++)
        total += ct_numel(f->params.tensors[i]);
    double *sum = calloc((size_t)total, sizeof *sum), *abs_sum = calloc((size_t)total, sizeof *sum);
    for (int r = 0; sum && abs_sum && r < size_ && !tt_failed(); r++) {
        int rc = backward_on_batch(f->ref, 0, r, size_);
        if (rc) {
            tt_fail(__FILE__, __LINE__, "rank %d's share in the reference: %s", r, ct_errmsg());
            break;
        }
        for (int i = 0, at = 0; i < f->ref_params.n; i++) {
            ct_tensor *g = ct_tensor_grad(f->ref_params.tensors[i]);
            for (int64_t k = 0; k < ct_numel(g); k++, at++) {
                sum[at] += tt_at(g, k);
                abs_sum[at] += fabs(tt_at(g, k));
            }
        }
        /* Each share's gradient alone, not their running total. */
        if ((rc = ct_optim_zero_grad(f->ref_opt, false))) {
            tt_fail(__FILE__, __LINE__, "zero_grad: %s", ct_errmsg());
            break;
        }
    }
    double worst = 0;
    for (int i = 0, at = 0; sum && abs_sum && i < f->params.n && !tt_failed(); i++) {
        ct_tensor *g = ct_tensor_grad(f->params.tensors[i]);
        for (int64_t k = 0; k < ct_numel(g); k++, at++) {
            double got = tt_at(g, k), avg = sum[at] / size_;
            double bound = 1.01 * ldexp(1, -8) * (abs_sum[at] / size_ + fabs(avg));
            if (!is_bf16((float)got) || !(fabs(got - avg) <= bound)) {
                tt_fail(__FILE__, __LINE__,
                        "%s's gradient element %lld is %.9g, the float32 average %.9g (allowed "
                        "%.3g; %s a bfloat16 value)",
                        f->params.names[i], (long long)k, got, avg, bound,
                        is_bf16((float)got) ? "is" : "not");
                break;
            }
            worst = bound > 0 && fabs(got - avg) / bound > worst ? fabs(got - avg) / bound : worst;
        }
    }
    if (!sum || !abs_sum)
        tt_fail(__FILE__, __LINE__, "out of memory");
    else if (!tt_failed())
        printf("rank %d: bf16 gradients within %.2f of the allowed error\n", rank_, worst);
    free(sum);
    free(abs_sum);
}

TEST(bf16_hook) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    if (setup(&f, &plain, &o, CT_OPTIM_SGD)) {
        ct_ddp_comm_hook hook = ct_ddp_bf16_compress_hook();
        int rc = ct_ddp_set_comm_hook(f.ddp, &hook);
        if (!rc)
            rc = backward_on_batch(f.net, 0, rank_, size_);
        if (rc)
            tt_fail(__FILE__, __LINE__, "the bf16 hook's first backward: %s: %s", ct_errname(rc),
                    ct_errmsg());
        else
            check_bf16_grads(&f);
        /* Training starts again from step 0 (the check left the
         * reference's gradients at zero). */
        if (!tt_failed() && (rc = ct_optim_zero_grad(f.opt, false)))
            tt_fail(__FILE__, __LINE__, "zero_grad: %s", ct_errmsg());
        if (!tt_failed())
            train_and_compare(&f, 0, STEPS, RTOL_BF16);
    }
    fixture_free(&f);
    ct_dist_finalize();
}

/* Before any backward, the buckets hold every parameter once, in reverse
 * registration order: bucket 0 the last-registered ones. */
TEST(bucket_order) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    if (setup(&f, &plain, &o, CT_OPTIM_SGD)) {
        int nb = ct_ddp_num_buckets(f.ddp), next = f.params.n - 1;
        for (int b = 0; b < nb && !tt_failed(); b++) {
            const char *const *names = ct_ddp_bucket_names(f.ddp, b);
            if (!names || !names[0]) {
                tt_fail(__FILE__, __LINE__, "bucket %d: no names: %s", b, ct_errmsg());
                break;
            }
            for (int k = 0; names[k]; k++, next--) {
                const char *want = next >= 0 ? f.params.names[next] : "(none: every one listed)";
                if (strcmp(names[k], want)) {
                    tt_fail(__FILE__, __LINE__, "bucket %d holds %s at %d, expected %s", b,
                            names[k], k, want);
                    break;
                }
            }
        }
        if (!tt_failed() && next != -1)
            tt_fail(__FILE__, __LINE__, "the buckets left out %d parameter(s), first %s", next + 1,
                    f.params.names[next]);
        ct_errclear();
        if (ct_ddp_bucket_names(f.ddp, nb) || ct_errcode() != CT_EINVAL)
            tt_fail(__FILE__, __LINE__, "bucket %d of %d: expected CT_EINVAL, got %s", nb, nb,
                    ct_errname(ct_errcode()));
        ct_errclear();
    }
    fixture_free(&f);
    ct_dist_finalize();
}

/* --------------------------------------------------------- uneven inputs */

/* Steps rank r runs in the uneven scenario: with 3 ranks, each joins at
 * another iteration. */
static int uneven_steps(int r) { return UNEVEN_STEPS + 2 * r; }

/* Step s of the uneven scenario in the reference. The ranks still training
 * at s are those with more than s steps; the joined ones take part in the
 * averaging with zero gradients and the average stays over all n ranks, so
 * with k of n training the gradient is the sum of the k active shares'
 * gradients divided by n (not by k): each active share's loss, the mean
 * over its BATCH / n rows, times 1 / n. */
static int uneven_reference_step(fixture *f, int s) {
    for (int r = 0; r < size_; r++)
        if (s < uneven_steps(r))
            CT_TRY(scaled_backward_on_batch(f->ref, s, r, size_, 1.0 / size_));
    CT_TRY(ct_optim_step(f->ref_opt));
    return ct_optim_zero_grad(f->ref_opt, false);
}

/* Copies of pl's tensors, detached, into copy (initialized here; the caller
 * frees it). Records a failure and returns false on error. */
static bool snapshot(const ct_param_list *pl, ct_param_list *copy) {
    ct_param_list_init(copy);
    ct_scope_begin();
    int rc = 0;
    for (int i = 0; !rc && i < pl->n; i++)
        rc = ct_param_list_add(copy, pl->names[i], ct_clone(ct_detach(pl->tensors[i])));
    ct_scope_end();
    if (rc)
        tt_fail(__FILE__, __LINE__, "copying the parameters: %s", ct_errmsg());
    return !rc;
}

/* Each rank trains uneven_steps(rank) steps, its parameters matching the
 * reference after each (so the active ranks stay in agreement however many
 * have joined), then joins. Every rank's ct_ddp_join returns 0 once the
 * last rank joins, well before the collective timeout (a rank left waiting
 * for a step that never comes would time out instead), and leaves the
 * parameters exactly as they were: a joined rank's optimizer does not
 * step. */
TEST(uneven) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    o.uneven_inputs = true;
    if (setup(&f, &plain, &o, CT_OPTIM_SGD)) {
        int steps = uneven_steps(rank_), rc = 0;
        for (int s = 0; s < steps && !rc && !tt_failed(); s++) {
            if ((rc = train(f.net, f.opt, s, 1, rank_, size_)))
                tt_fail(__FILE__, __LINE__, "data-parallel step %d: %s: %s", s, ct_errname(rc),
                        ct_errmsg());
            else if ((rc = uneven_reference_step(&f, s)))
                tt_fail(__FILE__, __LINE__, "reference step %d: %s: %s", s, ct_errname(rc),
                        ct_errmsg());
            else {
                char what[64];
                snprintf(what, sizeof what, "after step %d of %d", s + 1, steps);
                compare_params(&f.params, &f.ref_params, RTOL_FP32, what);
            }
        }
        ct_param_list before;
        if (!tt_failed() && snapshot(&f.params, &before)) {
            double t0 = tt_now();
            rc = ct_ddp_join(f.ddp);
            double took = tt_now() - t0;
            printf("rank %d: joined after %d steps; ct_ddp_join took %.3f s\n", rank_, steps, took);
            if (rc)
                tt_fail(__FILE__, __LINE__, "ct_ddp_join after %d steps: %s: %s", steps,
                        ct_errname(rc), ct_errmsg());
            else if (took > TIMEOUT / 2)
                tt_fail(__FILE__, __LINE__, "ct_ddp_join took %.2f s", took);
            else
                compare_params(&f.params, &before, 0, "after ct_ddp_join");
            ct_param_list_free(&before);
        }
    }
    fixture_free(&f);
    ct_dist_finalize();
}

/* Without uneven_inputs, ct_ddp_join fails on every rank before any
 * communication, naming the option. */
TEST(join_needs_uneven_inputs) {
    if (!join())
        return;
    fixture f = {0};
    ct_ddp_options o = small_buckets();
    if (setup(&f, &plain, &o, CT_OPTIM_SGD)) {
        uint64_t before = issued();
        expect_error("ct_ddp_join without uneven_inputs", ct_ddp_join(f.ddp), CT_ESTATE,
                     (const char *const[]){"ddp_join", "uneven_inputs", NULL});
        if (issued() != before)
            tt_fail(__FILE__, __LINE__, "the failed ct_ddp_join issued %llu collective(s)",
                    (unsigned long long)(issued() - before));
    }
    fixture_free(&f);
    ct_dist_finalize();
}
