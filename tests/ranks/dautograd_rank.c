/* The program each rank of test_dist_autograd runs under ctlaunch. Worker
 * 0 drives; the others serve. Every worker makes the same parameters from
 * the same seeds, and worker k owns W[k]: the one its functions use, and the
 * one whose gradient it keeps. Scenarios, named on the command line:
 *
 *   exact       a model split over every worker, with a diamond (one tensor
 *               sent to two workers whose results are summed) and tensors
 *               used twice (sent and used locally; one parameter used by two
 *               calls): each worker's gradients in the context equal those
 *               of the same model run locally, .grad stays untouched, the
 *               distributed optimizer steps the owners' parameters, and
 *               ending the context releases it on every worker
 *   concurrent  workers 1.. are trainers, each in its own contexts at once
 *               on worker 0's parameter: none sees another's gradients
 *   fails       a remote backward that fails: the error names the worker
 *               and the node, and the context is released everywhere; a
 *               context that ended or expired fails clearly, never hangs
 *   dies_forward, dies_backward
 *               the last worker SIGKILLs itself inside a call, or inside
 *               its part of backward: the driver fails with CT_EPEER naming
 *               it, promptly, and its context is released
 *
 * Every rank prints "pid=<pid>" first (tt_rank.c). */
#include "ct_test.h"
#include "tt_rank.h"

#include <ct/autograd.h>
#include <ct/dist_autograd.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT 10.0
#define DIM     6
#define MAXW    4

static int rank_, size_;
static ct_tensor *W[MAXW]; /* every worker's copy; W[rank_] is the live one */

static ct_tensor *weight(int k) {
    return ct_requires_grad_(tt_rand(CT_SHAPE(DIM, DIM), CT_FLOAT64, 100 + (uint64_t)k), true);
}

static ct_optim *opt_;

/* Serves an SGD step (lr 0.5) on this worker's weight, as "sgd". */
static void serve_sgd(void) {
    ct_optim_options o = ct_optim_defaults(CT_OPTIM_SGD, 0.5);
    opt_ = ct_optim_new(&o, &W[rank_], 1);
    if (!opt_ || ct_dist_optim_serve("sgd", opt_))
        tt_fail(__FILE__, __LINE__, "serving the optimizer: %s", ct_errmsg());
}

/* Joins, with worker 1 releasing contexts unused for worker1_expiry_s (0:
 * the default) and serving its optimizer if serve. */
static bool join(double worker1_expiry_s, bool serve) {
    if (!tt_rank_join(TIMEOUT, &rank_, &size_))
        return false;
    for (int k = 0; k < size_ && k < MAXW; k++)
        W[k] = weight(k);
    if (serve)
        serve_sgd();
    if (ct_rpc_init(&(ct_rpc_options){.timeout_s = TIMEOUT,
                                      .context_timeout_s = rank_ == 1 ? worker1_expiry_s : 0})) {
        tt_fail(__FILE__, __LINE__, "ct_rpc_init: %s", ct_errmsg());
        return false;
    }
    return true;
}

/* Results of calls, kept until their tensors are no longer used. */
static ct_rpc_args *outs[64];
static int nouts;

/* The first result of out, which is kept until drop_outs(). */
static ct_tensor *kept(ct_rpc_args *out) {
    if (nouts == 64) {
        tt_fail(__FILE__, __LINE__, "more than 64 results kept");
        ct_rpc_args_free(out);
        return NULL;
    }
    outs[nouts++] = out;
    return ct_rpc_args_tensor(out, 0);
}

static void drop_outs(void) {
    while (nouts)
        ct_rpc_args_free(outs[--nouts]);
}

static void leave(void) {
    drop_outs();
    if (ct_rpc_shutdown())
        tt_fail(__FILE__, __LINE__, "ct_rpc_shutdown: %s", ct_errmsg());
    ct_optim_free(opt_);
    ct_dist_finalize();
}

/* --------------------------------------------------------------- the model */

/* The pieces, each computed with the given weight. */
static ct_tensor *stage(ct_tensor *h, ct_tensor *w) { return ct_tanh(ct_matmul(h, w)); }
/* h used twice. */
static ct_tensor *twice(ct_tensor *h, ct_tensor *w) {
    return ct_add(ct_matmul(h, w), ct_mul(h, h));
}

static int stage_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    return ct_rpc_args_add_tensor(out, stage(ct_rpc_args_tensor(in, 0), W[rank_]));
}

static int twice_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    return ct_rpc_args_add_tensor(out, twice(ct_rpc_args_tensor(in, 0), W[rank_]));
}

/* The gradient of this worker's weight in context in[0] (zeros if none). */
static int grad_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    ct_tensor *g = ct_dist_autograd_grad(ct_rpc_args_int(in, 0), W[rank_]);
    if (!g && ct_errcode())
        return ct_errcode();
    if (ct_tensor_grad(W[rank_]))
        return ct_seterr(CT_ESTATE, "worker %d: .grad was written", rank_);
    return ct_rpc_args_add_tensor(out, g ? g : ct_zeros(CT_SHAPE(DIM, DIM), CT_FLOAT64));
}

static int weight_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)in;
    return ct_rpc_args_add_tensor(out, W[rank_]);
}

static int contexts_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)in;
    return ct_rpc_args_add_int(out, ct_dist_autograd_num_contexts());
}

/* A node whose backward fails, or kills its worker. */
static int bad_backward(const ct_backward_args *a) {
    if (a->ctx)
        raise(SIGKILL);
    return ct_autograd_fail(CT_ESHAPE, "the gradient has the wrong shape, on purpose");
}

static const ct_function_def bad_def = {"BadBackward", bad_backward, NULL};

static int bad_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    ct_tensor *h = ct_rpc_args_tensor(in, 0);
    bool was = ct_set_grad_enabled(false);
    ct_tensor *y = ct_mul_scalar(h, 2);
    ct_set_grad_enabled(was);
    int rc = ct_function_record(&bad_def, ctx, &h, 1, &y, 1, NULL, 0);
    return rc ? rc : ct_rpc_args_add_tensor(out, y);
}

static int die_fn(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)in;
    (void)out;
    raise(SIGKILL);
    return 0;
}

static int kill_token;

__attribute__((constructor)) static void register_all(void) {
    ct_rpc_register("stage", stage_fn, NULL);
    ct_rpc_register("twice", twice_fn, NULL);
    ct_rpc_register("grad", grad_fn, NULL);
    ct_rpc_register("weight", weight_fn, NULL);
    ct_rpc_register("contexts", contexts_fn, NULL);
    ct_rpc_register("bad", bad_fn, NULL);
    ct_rpc_register("bad_dies", bad_fn, &kill_token);
    ct_rpc_register("die", die_fn, NULL);
}

/* ------------------------------------------------------------------ helpers */

/* Calls fn on worker w with one tensor; its one result, or NULL. */
static ct_tensor *call1(int w, const char *fn, ct_tensor *t) {
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    ct_rpc_args_add_tensor(in, t);
    int rc = ct_rpc_sync(ct_rpc_worker_name(w), fn, in, 0, &out);
    ct_rpc_args_free(in);
    if (rc)
        return NULL;
    return kept(out);
}

static ct_tensor *grad_on(int w, int64_t context) {
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    ct_rpc_args_add_int(in, context);
    int rc = ct_rpc_sync(ct_rpc_worker_name(w), "grad", in, 0, &out);
    TT_CHECK_RC("asking for a gradient", rc);
    ct_rpc_args_free(in);
    if (rc)
        return NULL;
    return kept(out);
}

typedef struct count_ask {
    int w, want;
    int64_t got;
} count_ask;

/* On a thread of its own, outside any context: a call made inside a
 * context that was released fails. */
static void *ask_contexts(void *arg) {
    count_ask *q = arg;
    q->got = -1;
    for (int tries = 0; tries < 100 && q->got != q->want; tries++) {
        ct_rpc_args *none = ct_rpc_args_new(), *out = NULL;
        if (!ct_rpc_sync(ct_rpc_worker_name(q->w), "contexts", none, 0, &out))
            q->got = ct_rpc_args_int(out, 0);
        ct_rpc_args_free(none);
        ct_rpc_args_free(out);
        if (q->got != q->want)
            nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    return NULL;
}

/* Waits (a while) until worker w holds `want` contexts. */
static void expect_contexts(int w, int want) {
    count_ask q = {w, want, -1};
    pthread_t th;
    if (pthread_create(&th, NULL, ask_contexts, &q) == 0)
        pthread_join(th, NULL);
    if (q.got != want)
        tt_fail(__FILE__, __LINE__, "worker %d holds %lld contexts, not %d", w, (long long)q.got,
                want);
}

/* The model: worker 0 computes h from x with W[0]; h goes through 'stage'
 * on worker 1; that result a goes to two workers at once ('twice' on 1,
 * 'stage' on the last) and comes back summed; the loss uses a and h again.
 * remote: through RPC, or locally with the same weights. */
static ct_tensor *model(ct_tensor *x, ct_tensor *const *w, bool remote) {
    int last = size_ - 1;
    ct_tensor *h = stage(x, w[0]);
    ct_tensor *a = remote ? call1(1, "stage", h) : stage(h, w[1]);
    ct_tensor *b1 = remote ? call1(1, "twice", a) : twice(a, w[1]);
    ct_tensor *b2 = remote ? call1(last, "stage", a) : stage(a, w[last]);
    if (!a || !b1 || !b2)
        return NULL;
    ct_tensor *c = ct_add(b1, b2);
    return ct_add(ct_sum(ct_mul(c, a), NULL, 0, false), ct_sum(ct_mul(h, h), NULL, 0, false));
}

/* ---------------------------------------------------------------- scenarios */

TEST(exact) {
    if (!join(0, true))
        return;
    if (rank_ == 0) {
        ct_tensor *x = tt_rand(CT_SHAPE(3, DIM), CT_FLOAT64, 1);
        ct_tensor *ref[MAXW];
        for (int k = 0; k < size_; k++)
            ref[k] = weight(k);
        ct_tensor *want_loss = model(x, ref, false);
        TT_CHECK_RC("local backward", ct_tensor_backward(want_loss));

        int64_t ctx = ct_dist_autograd_begin();
        ct_tensor *loss = model(x, W, true);
        if (!ctx || !loss) {
            TT_CHECK_RC("the distributed forward", ct_errcode());
            leave();
            return;
        }
        ASSERT_CLOSE(loss, want_loss, 1e-12, 0);
        expect_contexts(size_ - 1, 1);
        TT_CHECK_RC("ct_dist_backward", ct_dist_backward(ctx, &loss, 1));
        if (ct_tensor_grad(W[0]))
            tt_fail(__FILE__, __LINE__, "the backward wrote W[0].grad");
        for (int k = 0; k < size_ && !tt_failed(); k++) {
            ct_tensor *g = k ? grad_on(k, ctx) : ct_dist_autograd_grad(ctx, W[0]);
            if (g)
                ASSERT_CLOSE(g, ct_tensor_grad(ref[k]), 1e-9, 1e-12);
            printf("rank 0: the gradient of W[%d] matches the local model's\n", k);
        }

        /* Each owner steps its own weight with its gradient in ctx. */
        ct_tensor *before = ct_clone(W[1]);
        const char *workers[MAXW];
        for (int k = 0; k < size_; k++)
            workers[k] = ct_rpc_worker_name(k);
        ct_dist_optim *opt = ct_dist_optim_new("sgd", workers, size_);
        TT_CHECK_RC("ct_dist_optim_step", ct_dist_optim_step(opt, ctx));
        ct_dist_optim_free(opt);
        ct_tensor *after = call1(1, "weight", x);
        if (after)
            ASSERT_CLOSE(after, ct_sub(before, ct_mul_scalar(ct_tensor_grad(ref[1]), 0.5)), 1e-12,
                         1e-12);
        ASSERT_CLOSE(W[0], ct_sub(ref[0], ct_mul_scalar(ct_tensor_grad(ref[0]), 0.5)), 1e-12,
                     1e-12);

        TT_CHECK_RC("ct_dist_autograd_end", ct_dist_autograd_end(ctx));
        for (int k = 0; k < size_; k++)
            expect_contexts(k, 0);
        ASSERT_RC(ct_dist_backward(ctx, &loss, 1), CT_EINVAL, "released", "ended by its owner");
    }
    leave();
}

TEST(concurrent) {
    if (!join(0, false))
        return;
    if (rank_ > 0) {
        /* Each trainer's input differs, so mixed gradients would show. */
        ct_tensor *ref = weight(0);
        for (int step = 0; step < 20 && !tt_failed(); step++) {
            ct_scope_begin();
            ct_tensor *x = tt_rand(CT_SHAPE(4, DIM), CT_FLOAT64, 1000 * (uint64_t)rank_ + step);
            ct_tensor *r = tt_rand(CT_SHAPE(4, DIM), CT_FLOAT64, 7 + (uint64_t)rank_);
            TT_CHECK_RC("local backward",
                        ct_tensor_backward(ct_sum(ct_mul(stage(x, ref), r), NULL, 0, false)));
            int64_t ctx = ct_dist_autograd_begin();
            ct_tensor *y = call1(0, "stage", ct_requires_grad_(ct_clone(x), true));
            ct_tensor *loss = y ? ct_sum(ct_mul(y, r), NULL, 0, false) : NULL;
            TT_CHECK_RC("forward and backward",
                        loss ? ct_dist_backward(ctx, &loss, 1) : ct_errcode());
            ct_tensor *g = tt_failed() ? NULL : grad_on(0, ctx);
            if (g && !tt_close(__FILE__, __LINE__, g, ct_tensor_grad(ref), 1e-9, 1e-12))
                tt_fail(__FILE__, __LINE__, "trainer %d, step %d: gradients mixed", rank_, step);
            ct_tensor_set_grad(ref, NULL);
            TT_CHECK_RC("ct_dist_autograd_end", ct_dist_autograd_end(ctx));
            drop_outs();
            ct_scope_end();
        }
        printf("rank %d: 20 contexts, each with its own gradients\n", rank_);
    }
    leave();
}

TEST(fails) {
    if (!join(1.0, false))
        return;
    if (rank_ == 0) {
        ct_tensor *x = ct_requires_grad_(tt_rand(CT_SHAPE(2, DIM), CT_FLOAT64, 3), true);
        int64_t ctx = ct_dist_autograd_begin();
        ct_tensor *y = call1(1, "bad", x);
        ct_tensor *loss = y ? ct_sum(y, NULL, 0, false) : NULL;
        if (!loss) {
            TT_CHECK_RC("forward", ct_errcode());
            leave();
            return;
        }
        double t0 = tt_now();
        ASSERT_RC(ct_dist_backward(ctx, &loss, 1), CT_ESHAPE, "worker1", "on purpose",
                  "distributed backward");
        if (tt_now() - t0 > TIMEOUT / 2)
            tt_fail(__FILE__, __LINE__, "the failure took %.1f s", tt_now() - t0);
        expect_contexts(0, 0);
        expect_contexts(1, 0);
        ASSERT_RC(ct_dist_backward(ctx, &loss, 1), CT_ESHAPE, "released", "backward failed");
        /* A call that outlives its context fails at once, never hangs. */
        ASSERT_FAILS(call1(1, "stage", x), CT_ESHAPE, "released", "backward failed");
        /* Ending it keeps the error the caller is about to report. */
        ct_seterr(CT_EIO, "the error being reported");
        TT_CHECK_RC("ending a failed context", ct_dist_autograd_end(ctx));
        ASSERT_STR_CONTAINS(ct_errmsg(), "the error being reported");

        /* Worker 1 forgets a context unused for a second. */
        ctx = ct_dist_autograd_begin();
        y = call1(1, "stage", x);
        loss = y ? ct_sum(y, NULL, 0, false) : NULL;
        expect_contexts(1, 1);
        nanosleep(&(struct timespec){2, 0}, NULL);
        expect_contexts(1, 0);
        if (loss)
            ASSERT_RC(ct_dist_backward(ctx, &loss, 1), CT_ETIMEDOUT, "worker1", "released",
                      "unused for 1 s");
        TT_CHECK_RC("ct_dist_autograd_end", ct_dist_autograd_end(ctx));
        ASSERT_RC(ct_dist_autograd_end(ct_dist_autograd_begin() + 999), CT_EINVAL, "not known");
        ASSERT_RC(ct_dist_backward(ctx, &x, 1), CT_EINVAL, "elements");
    }
    leave();
}

static void dies(const char *fn) {
    signal(SIGTERM, SIG_IGN);
    if (!join(0, false))
        return;
    if (rank_ == 0) {
        char name[32];
        snprintf(name, sizeof name, "worker%d", size_ - 1);
        ct_tensor *x = ct_requires_grad_(tt_rand(CT_SHAPE(2, DIM), CT_FLOAT64, 3), true);
        int64_t ctx = ct_dist_autograd_begin();
        double t0 = tt_now();
        ct_tensor *y = call1(size_ - 1, fn, x);
        if (!strcmp(fn, "die")) {
            if (y || ct_errcode() != CT_EPEER)
                tt_fail(__FILE__, __LINE__, "a call to a dying worker gave %s",
                        ct_errname(ct_errcode()));
            else
                tt_message_holds(rank_, "a worker killed during forward",
                                 (const char *const[]){name, "'die'", NULL});
        } else {
            ct_tensor *loss = y ? ct_sum(y, NULL, 0, false) : NULL;
            ASSERT_RC(loss ? ct_dist_backward(ctx, &loss, 1) : ct_errcode(), CT_EPEER, name,
                      "went away");
        }
        if (tt_now() - t0 > TIMEOUT / 2)
            tt_fail(__FILE__, __LINE__, "the failure took %.1f s", tt_now() - t0);
        /* The context touched the dead worker: it is released here. */
        for (int tries = 0; tries < 100 && ct_dist_autograd_num_contexts(); tries++)
            nanosleep(&(struct timespec){0, 20000000}, NULL);
        if (ct_dist_autograd_num_contexts())
            tt_fail(__FILE__, __LINE__, "the dead worker's context is still held");
        TT_CHECK_RC("ending the failed context", ct_dist_autograd_end(ctx));
    } else if (rank_ != size_ - 1) {
        nanosleep(&(struct timespec){1, 0}, NULL);
    } else {
        nanosleep(&(struct timespec){TIMEOUT, 0}, NULL);
    }
    ct_dist_finalize();
}

TEST(dies_forward) { dies("die"); }
TEST(dies_backward) { dies("bad_dies"); }
