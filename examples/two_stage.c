/* two_stage: trains fmnist_mlp's MLP on Fashion-MNIST split across two
 * workers (model parallel), over RPC and distributed autograd.
 *
 *   ctlaunch -np 2 two_stage [--epochs N] [--batch N] [--lr X] [--hidden N]
 *                            [--threads N] [--seed N] [--data DIR]
 *                            [--max-steps N] [--timeout S]
 *
 * Worker 0 holds stage 1 (Linear 784-H, ReLU) and drives training; worker 1
 * holds stage 2 (Linear H-H, ReLU, Linear H-10) and serves it as "stage2".
 * Each step is a distributed autograd context: h = stage1(images) here,
 * logits = stage2(h) on worker 1, the loss here; ct_dist_backward() sends
 * h's gradient back from worker 1, and ct_dist_optim_step() steps the SGD
 * that each worker serves as "sgd" with the gradients the context left
 * there.
 *
 * The recipe is fmnist_mlp's (batch 64, SGD with momentum 0.9 and lr 0.05)
 * over 2 epochs. Both stages start from fmnist_mlp's initial weights and see
 * its batches in its order, so `fmnist_mlp --epochs 2` should print the same
 * losses and accuracies.
 *
 * Worker 0 prints what fmnist_mlp prints: progress to stderr, the test
 * accuracy after every epoch to stdout (stage 2 called outside any
 * context), and a JSON summary last.
 */
#define _POSIX_C_SOURCE 200809L

#include "example_common.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct options {
    example_options common;
    double timeout_s; /* of every call, and of worker 1's wait for worker 0 */
} options;

static int parse(int argc, char **argv, options *o) {
    *o = (options){.common = example_options_defaults(), .timeout_s = 60};
    o->common.epochs = 2;
    const ct_cli_flag own[] = {
        CT_CLI_FLAG("--timeout", CT_CLI_DOUBLE, &o->timeout_s, "S",
                    "seconds each call, and worker 1's wait for worker 0, may take", .min = 1e-3,
                    .max = 1e6),
    };
    return example_parse("two_stage",
                         "fmnist_mlp's MLP split across two workers with distributed autograd:\n"
                         "run as ctlaunch -np 2 two_stage.",
                         own, sizeof own / sizeof *own, &o->common, argc, argv);
}

/* A stage and the SGD over its parameters, which this worker serves as
 * "sgd". fmnist_mlp's layers, from its seed: worker 1 makes stage 1's draws
 * first and drops them, so that both stages start from fmnist_mlp's
 * weights. */
typedef struct stage {
    ct_module *net;
    ct_optim *opt;
    atomic_bool driving; /* worker 1: until worker 0 is done */
    atomic_llong calls;  /* worker 1: served so far, to tell a quiet driver from a busy one */
} stage;

static int stage_init(stage *s, const options *o, int worker) {
    ct_manual_seed(o->common.seed);
    s->net = ct_sequential_new();
    ct_module *first = ct_linear_new(784, o->common.hidden, true);
    if (worker == 0) {
        ct_sequential_append(s->net, first);
        ct_sequential_append(s->net, ct_relu_new());
    } else {
        ct_module_free(first);
        ct_sequential_append(s->net, ct_linear_new(o->common.hidden, o->common.hidden, true));
        ct_sequential_append(s->net, ct_relu_new());
        ct_sequential_append(s->net, ct_linear_new(o->common.hidden, 10, true));
    }
    ct_param_list params;
    ct_param_list_init(&params);
    /* One flat parameter buffer: the optimizer updates it in one pass. */
    int rc = ct_module_flatten(s->net, false);
    if (!rc)
        rc = ct_module_named_parameters(s->net, &params);
    if (!rc) {
        ct_optim_options oo = ct_optim_defaults(CT_OPTIM_SGD, o->common.lr);
        oo.momentum = 0.9;
        rc = (s->opt = ct_optim_new(&oo, params.tensors, params.n)) ? 0 : ct_errcode();
    }
    ct_param_list_free(&params);
    return rc ? rc : ct_dist_optim_serve("sgd", s->opt);
}

static void stage_free(stage *s) {
    ct_optim_free(s->opt);
    ct_module_free(s->net);
}

/* ------------------------------------------------------------- worker 1 */

/* h [b, H] -> logits [b, 10]. */
static int stage2(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    stage *s = ctx;
    atomic_fetch_add(&s->calls, 1);
    /* Outside a context (an evaluation) no backward follows: record nothing. */
    bool prev = ct_set_grad_enabled(ct_dist_autograd_current() != 0);
    ct_tensor *logits = ct_module_forward(s->net, ct_rpc_args_tensor(in, 0));
    ct_set_grad_enabled(prev);
    return logits ? ct_rpc_args_add_tensor(out, logits) : ct_errcode();
}

static int done(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)in;
    (void)out;
    stage *s = ctx;
    atomic_fetch_add(&s->calls, 1);
    atomic_store(&s->driving, false);
    return 0;
}

/* The agent's threads do worker 1's work; its own thread waits until
 * worker 0 is done. A driver silent for timeout_s is taken for lost, so
 * that worker 1 never waits forever. */
static int serve(stage *s, double timeout_s) {
    long long seen = -1;
    double quiet_since = example_now();
    while (atomic_load(&s->driving)) {
        long long calls = atomic_load(&s->calls);
        if (calls != seen) {
            seen = calls;
            quiet_since = example_now();
        } else if (example_now() - quiet_since > timeout_s) {
            return ct_seterr(CT_ETIMEDOUT, "worker1: no call from worker0 for %.0f s (--timeout)",
                             timeout_s);
        }
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    return 0;
}

/* Serves the built stage until worker 0 is done; *started: the agent ran,
 * and may still use the stage. */
static int serve_stage2(stage *s, const options *o, bool *started) {
    CT_TRY(ct_rpc_register("stage2", stage2, s));
    CT_TRY(ct_rpc_register("done", done, s));
    CT_TRY(ct_rpc_init(&(ct_rpc_options){.timeout_s = o->timeout_s}));
    *started = true;
    CT_TRY(serve(s, o->timeout_s));
    return ct_rpc_shutdown();
}

static int run_stage2(const options *o) {
    stage s = {.driving = true};
    bool started = false;
    int rc = stage_init(&s, o, 1);
    if (!rc)
        rc = serve_stage2(&s, o, &started);
    /* A running agent may still use the stage: the exit takes it all. */
    if (started && rc)
        return rc;
    stage_free(&s);
    return rc;
}

/* ------------------------------------------------------------- worker 0 */

typedef struct driver {
    ct_module *stage1;
    ct_dist_optim *opt; /* steps both workers' "sgd" */
} driver;

/* The step's work in its context, over in and *out, which train_step
 * makes and frees. */
static int step_in(int64_t context, driver *dr, ct_rpc_args *in, ct_rpc_args **out, ct_tensor *x,
                   ct_tensor *y, double *loss) {
    ct_tensor *h = ct_module_forward(dr->stage1, x);
    CT_TRY(in && h ? ct_rpc_args_add_tensor(in, h) : ct_errcode());
    CT_TRY(ct_rpc_sync("worker1", "stage2", in, 0, out));
    ct_tensor *l = ct_cross_entropy(ct_rpc_args_tensor(*out, 0), y, NULL);
    CT_TRY(l ? ct_dist_backward(context, &l, 1) : ct_errcode());
    CT_TRY(ct_dist_optim_step(dr->opt, context));
    *loss = ct_item(l);
    return 0;
}

/* One step in its own context; *loss is the batch's mean loss. */
static int train_step(void *ctx, ct_tensor *x, ct_tensor *y, double *loss) {
    int64_t context = ct_dist_autograd_begin();
    if (!context)
        return ct_errcode();
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    *loss = NAN;
    int rc = step_in(context, ctx, in, &out, x, y, loss);
    int end = ct_dist_autograd_end(context);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    return rc ? rc : end;
}

/* The classes stage 2 gives for stage 1's output, outside any context. */
static ct_tensor *predict(void *ctx, ct_tensor *images) {
    driver *dr = ctx;
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    ct_tensor *h = ct_module_forward(dr->stage1, images);
    int rc = in && h ? ct_rpc_args_add_tensor(in, h) : ct_errcode();
    if (!rc)
        rc = ct_rpc_sync("worker1", "stage2", in, 0, &out);
    ct_tensor *pred = rc ? NULL : ct_argmax(ct_rpc_args_tensor(out, 0), 1, false);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    return pred;
}

static int train(const options *o, ct_module *stage1, const example_data *d) {
    ct_sampler sampler;
    ct_sampler_options so = {
        .size = ct_size(d->train_x, 0), .shuffle = true, .seed = o->common.seed};
    ct_loader_options lo = {.batch_size = o->common.batch, .sampler = &sampler};
    ct_loader *loader = NULL;
    driver dr = {stage1, ct_dist_optim_new("sgd", (const char *const[]){"worker0", "worker1"}, 2)};
    int rc = dr.opt ? ct_sampler_init(&sampler, &so) : ct_errcode();
    if (!rc && !(loader = ct_loader_new(d->train_x, d->train_y, &lo)))
        rc = ct_errcode();
    if (!rc)
        printf("two_stage: 784-%lld | %lld-10 on worker0 | worker1, batch %lld, %d epochs, %d "
               "thread%s each\n",
               (long long)o->common.hidden, (long long)o->common.hidden, (long long)o->common.batch,
               o->common.epochs, o->common.threads, o->common.threads > 1 ? "s" : "");
    fflush(stdout);
    example_trainer t = {.o = &o->common,
                         .loader = loader,
                         .step = train_step,
                         .predict = predict,
                         .ctx = &dr,
                         .summary_head = "\"example\": \"two_stage\"",
                         .test_x = d->test_x,
                         .test_y = d->test_y};
    if (!rc)
        rc = example_train(&t);
    ct_loader_free(loader);
    ct_dist_optim_free(dr.opt);
    return rc;
}

/* Trains over RPC with the built stage, then tells worker 1 it is done;
 * *started as serve_stage2's. */
static int drive(stage *s, const options *o, const example_data *d, bool *started) {
    CT_TRY(ct_rpc_init(&(ct_rpc_options){.timeout_s = o->timeout_s}));
    *started = true;
    CT_TRY(train(o, s->net, d));
    ct_rpc_args *none = ct_rpc_args_new();
    int rc = none ? ct_rpc_sync("worker1", "done", none, 0, NULL) : ct_errcode();
    ct_rpc_args_free(none);
    return rc ? rc : ct_rpc_shutdown();
}

static int run_stage1(const options *o) {
    example_data d;
    stage s = {0};
    bool started = false;
    int rc = example_data_load(&d, o->common.data, true);
    if (!rc)
        rc = stage_init(&s, o, 0);
    if (!rc)
        rc = drive(&s, o, &d, &started);
    if (started && rc)
        return rc; /* as run_stage2 */
    stage_free(&s);
    example_data_free(&d);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o))
        return 2;
    if (example_init("two_stage", &o.common))
        return 1;
    int rank = ct_comm_rank(ct_dist_comm()), ranks = ct_comm_size(ct_dist_comm());
    if (ranks != 2) {
        fprintf(stderr,
                "two_stage: needs two workers, got %d: run it as `ctlaunch -np 2 "
                "two_stage`\n",
                ranks);
        ct_dist_finalize();
        return 2;
    }
    int rc = rank == 0 ? run_stage1(&o) : run_stage2(&o);
    if (rc) {
        /* The launcher stops the other worker; its calls fail meanwhile. */
        fprintf(stderr, "two_stage: %s\n", ct_errmsg());
        return 1;
    }
    ct_dist_finalize();
    return 0;
}
