/* param_server: trains fmnist_mlp's MLP on Fashion-MNIST with a parameter
 * server and trainers, over RPC and distributed autograd.
 *
 *   ctlaunch -np 3 param_server [--epochs N] [--batch N] [--lr X] [--momentum X]
 *                               [--hidden N] [--threads N] [--seed N]
 *                               [--data DIR] [--max-steps N] [--timeout S]
 *
 * Rank 0 is the parameter server, "ps". It holds the model (784-H-H-10 with
 * ReLU, with fmnist_mlp's initial weights), serves "forward" (images in,
 * logits out), and serves its local SGD to the trainers through
 * ct_dist_optim_serve(). Every other rank is a trainer ("trainer1",
 * "trainer2", ...) with its share of the shuffled training set. Each step of
 * a trainer is a distributed autograd context: the logits come from the ps,
 * the loss is computed here, ct_dist_backward() carries its gradient into
 * the ps's graph, and ct_dist_optim_step() has the ps apply the gradients
 * that context left there.
 *
 * The defaults are fmnist_mlp's recipe: batch 64, SGD with momentum 0.9 and
 * lr 0.05, 10 epochs. The trainers step asynchronously, each with a batch of
 * --batch images, so an epoch makes as many updates as fmnist_mlp's. Each
 * gradient is a step or so stale when it lands, which acts as extra
 * momentum (Mitliagkas et al., "Asynchrony begets momentum", 2016), so with
 * more than one trainer the default momentum is 0.8: measured here, it
 * trains as fmnist_mlp's 0.9 does (docs/examples-rpc.md).
 *
 * trainer1 prints what fmnist_mlp prints: progress to stderr, the test
 * accuracy after every epoch to stdout, and a JSON summary last. The
 * trainers meet at every epoch's end, then trainer1 evaluates through the
 * ps's "forward", outside any context.
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
    double momentum, timeout_s; /* timeout_s: of every call, and of the ps's wait */
} options;

static int parse(int argc, char **argv, options *o) {
    /* momentum -1: the default, which depends on the trainers. */
    *o = (options){.common = example_options_defaults(), .momentum = -1, .timeout_s = 60};
    const ct_cli_flag own[] = {
        CT_CLI_FLAG("--momentum", CT_CLI_DOUBLE, &o->momentum, "X", "SGD's momentum, in [0, 1)",
                    .min = 0, .max = 0.999999,
                    .default_text = "0.9 with one trainer, 0.8 with more"),
        CT_CLI_FLAG("--timeout", CT_CLI_DOUBLE, &o->timeout_s, "S",
                    "seconds each call, and the server's wait, may take", .min = 1e-3, .max = 1e6),
    };
    return example_parse("param_server",
                         "A parameter server and its trainers over ct's RPC: run as\n"
                         "ctlaunch -np 3 param_server (rank 0 serves, the others train).",
                         own, sizeof own / sizeof *own, &o->common, argc, argv);
}

/* ------------------------------------------------------------ the server */

typedef struct server {
    ct_param_list params; /* a weight and a bias per Linear, in layer order */
    atomic_int training;  /* trainers not done yet */
    atomic_llong calls;   /* served so far: tells a quiet trainer from a busy one */
} server;

static int pull_backward(const ct_backward_args *a) {
    for (int i = 0; i < a->ninputs; i++)
        a->grad_inputs[i] = a->grad_outputs[i];
    return 0;
}

static const ct_function_def pull_def = {"PullBackward", pull_backward, NULL};

/* Each forward runs on its own copy of the parameters, taken as it starts
 * (a parameter server's pull), and the copies pass their gradients on to
 * the parameters. Without copies, another trainer's step between this
 * forward and its backward would change tensors the backward needs, and
 * the backward would fail its version check. A copy may catch a step
 * half-applied, which asynchronous SGD tolerates. */
static int pull(const ct_param_list *p, ct_tensor **copies) {
    bool prev = ct_set_grad_enabled(false);
    int rc = 0;
    for (int i = 0; i < p->n && !rc; i++)
        rc = (copies[i] = ct_clone(p->tensors[i])) ? 0 : ct_errcode();
    ct_set_grad_enabled(prev);
    return rc ? rc : ct_function_record(&pull_def, NULL, p->tensors, p->n, copies, p->n, NULL, 0);
}

/* images [b, 784] -> logits [b, 10]. */
static int forward(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    server *s = ctx;
    atomic_fetch_add(&s->calls, 1);
    /* Outside a context (an evaluation) no backward follows: record nothing. */
    bool prev = ct_set_grad_enabled(ct_dist_autograd_current() != 0);
    ct_tensor *w[s->params.n];
    int rc = pull(&s->params, w);
    ct_tensor *x = rc ? NULL : ct_rpc_args_tensor(in, 0);
    for (int l = 0; x && l < s->params.n; l += 2) {
        x = ct_linear(x, w[l], w[l + 1]);
        if (l + 2 < s->params.n)
            x = ct_relu(x);
    }
    ct_set_grad_enabled(prev);
    return rc ? rc : x ? ct_rpc_args_add_tensor(out, x) : ct_errcode();
}

static int done(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)in;
    (void)out;
    server *s = ctx;
    atomic_fetch_add(&s->calls, 1);
    atomic_fetch_sub(&s->training, 1);
    return 0;
}

/* The agent's threads do the ps's work; its own thread waits until every
 * trainer is done. A trainer silent for timeout_s is taken for lost, so
 * that the ps never waits forever. */
static int serve(server *s, double timeout_s) {
    long long seen = -1;
    double quiet_since = example_now();
    while (atomic_load(&s->training) > 0) {
        long long calls = atomic_load(&s->calls);
        if (calls != seen) {
            seen = calls;
            quiet_since = example_now();
        } else if (example_now() - quiet_since > timeout_s) {
            return ct_seterr(CT_ETIMEDOUT,
                             "ps: no call from the trainers for %.0f s (--timeout), with %d of "
                             "them not done",
                             timeout_s, atomic_load(&s->training));
        }
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    return 0;
}

/* The ps's optimizer over net's parameters (into s->params), and the
 * functions it serves; run_server frees what this made. */
static int server_setup(server *s, const options *o, int trainers, ct_module *net, ct_optim **opt) {
    if (!net)
        return ct_errcode();
    CT_TRY(ct_module_named_parameters(net, &s->params));
    ct_optim_options oo = ct_optim_defaults(CT_OPTIM_SGD, o->common.lr);
    oo.momentum = o->momentum >= 0 ? o->momentum : trainers > 1 ? 0.8 : 0.9;
    if (!(*opt = ct_optim_new(&oo, s->params.tensors, s->params.n)))
        return ct_errcode();
    CT_TRY(ct_rpc_register("forward", forward, s));
    CT_TRY(ct_rpc_register("done", done, s));
    return ct_dist_optim_serve("sgd", *opt);
}

static int run_server(const options *o, int trainers) {
    ct_module *net = example_mlp_new(&o->common, 0, true);
    server s = {.training = trainers};
    ct_param_list_init(&s.params);
    ct_optim *opt = NULL;
    int rc = server_setup(&s, o, trainers, net, &opt);
    bool started =
        !rc && !(rc = ct_rpc_init(&(ct_rpc_options){.name = "ps", .timeout_s = o->timeout_s}));
    if (started) {
        printf("ps: 784-%lld-%lld-10, %lld parameters, serving %d trainer%s\n",
               (long long)o->common.hidden, (long long)o->common.hidden,
               (long long)ct_param_list_numel(&s.params), trainers, trainers > 1 ? "s" : "");
        fflush(stdout);
        rc = serve(&s, o->timeout_s);
        if (!rc)
            rc = ct_rpc_shutdown();
    }
    /* A running agent may still step opt: the exit takes it all. */
    if (started && rc)
        return rc;
    ct_optim_free(opt);
    ct_param_list_free(&s.params);
    ct_module_free(net);
    return rc;
}

/* ----------------------------------------------------------- the trainers */

/* The step's work in its context, over in and *out, which train_step
 * makes and frees. */
static int step_in(int64_t context, ct_dist_optim *opt, ct_rpc_args *in, ct_rpc_args **out,
                   ct_tensor *x, ct_tensor *y, double *loss) {
    CT_TRY(in ? ct_rpc_args_add_tensor(in, x) : ct_errcode());
    CT_TRY(ct_rpc_sync("ps", "forward", in, 0, out));
    ct_tensor *l = ct_cross_entropy(ct_rpc_args_tensor(*out, 0), y, NULL);
    CT_TRY(l ? ct_dist_backward(context, &l, 1) : ct_errcode());
    CT_TRY(ct_dist_optim_step(opt, context));
    *loss = ct_item(l);
    return 0;
}

/* One step in its own context; *loss is the batch's mean loss. */
static int train_step(void *opt, ct_tensor *x, ct_tensor *y, double *loss) {
    int64_t context = ct_dist_autograd_begin();
    if (!context)
        return ct_errcode();
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    *loss = NAN;
    int rc = step_in(context, opt, in, &out, x, y, loss);
    int end = ct_dist_autograd_end(context);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    return rc ? rc : end;
}

/* The classes the ps's forward gives, outside any context. */
static ct_tensor *predict(void *ctx, ct_tensor *images) {
    (void)ctx;
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    int rc = in ? ct_rpc_args_add_tensor(in, images) : ct_errcode();
    if (!rc)
        rc = ct_rpc_sync("ps", "forward", in, 0, &out);
    ct_tensor *pred = rc ? NULL : ct_argmax(ct_rpc_args_tensor(out, 0), 1, false);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    return pred;
}

/* Trains trainer's share (of trainers) of the data; trainer 0 reports. */
static int train(const options *o, int trainer, int trainers, ct_comm *group,
                 const example_data *d) {
    ct_sampler sampler;
    ct_sampler_options so = {.size = ct_size(d->train_x, 0),
                             .shuffle = true,
                             .seed = o->common.seed,
                             .num_replicas = trainers,
                             .rank = trainer};
    ct_loader_options lo = {.batch_size = o->common.batch, .sampler = &sampler};
    ct_loader *loader = NULL;
    ct_dist_optim *opt = ct_dist_optim_new("sgd", (const char *const[]){"ps"}, 1);
    int rc = opt ? ct_sampler_init(&sampler, &so) : ct_errcode();
    if (!rc && !(loader = ct_loader_new(d->train_x, d->train_y, &lo)))
        rc = ct_errcode();
    if (!rc && trainer == 0)
        printf("param_server: 784-%lld-%lld-10 on ps, batch %lld, %d epochs, %d trainer%s, %d "
               "thread%s each\n",
               (long long)o->common.hidden, (long long)o->common.hidden, (long long)o->common.batch,
               o->common.epochs, trainers, trainers > 1 ? "s" : "", o->common.threads,
               o->common.threads > 1 ? "s" : "");
    fflush(stdout);
    char head[64];
    snprintf(head, sizeof head, "\"example\": \"param_server\", \"trainers\": %d", trainers);
    example_trainer t = {.o = &o->common,
                         .loader = loader,
                         .step = train_step,
                         .predict = predict,
                         .ctx = opt,
                         .group = group,
                         .summary_head = head,
                         .test_x = d->test_x,
                         .test_y = d->test_y};
    if (!rc)
        rc = example_train(&t);
    ct_loader_free(loader);
    ct_dist_optim_free(opt);
    return rc;
}

/* Trains over RPC, then tells the ps that this trainer is done. */
static int train_rpc(const options *o, int rank, int ranks, ct_comm *group, const example_data *d) {
    char name[32];
    snprintf(name, sizeof name, "trainer%d", rank);
    CT_TRY(ct_rpc_init(&(ct_rpc_options){.name = name, .timeout_s = o->timeout_s}));
    CT_TRY(train(o, rank - 1, ranks - 1, group, d));
    ct_rpc_args *none = ct_rpc_args_new();
    int rc = none ? ct_rpc_sync("ps", "done", none, 0, NULL) : ct_errcode();
    ct_rpc_args_free(none);
    return rc ? rc : ct_rpc_shutdown();
}

static int run_trainer(const options *o, int rank, int ranks, ct_comm *group) {
    example_data d;
    int rc = example_data_load(&d, o->common.data, rank == 1);
    if (!rc)
        rc = train_rpc(o, rank, ranks, group, &d);
    example_data_free(&d);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o))
        return 2;
    if (example_init("param_server", &o.common))
        return 1;
    int rank = ct_comm_rank(ct_dist_comm()), ranks = ct_comm_size(ct_dist_comm());
    if (ranks < 2) {
        fprintf(stderr, "param_server: needs a parameter server and trainers: run it as "
                        "`ctlaunch -np 3 param_server`\n");
        ct_dist_finalize();
        return 2;
    }
    int trainer_ranks[ranks - 1];
    for (int i = 1; i < ranks; i++)
        trainer_ranks[i - 1] = i;
    ct_comm *trainers = NULL;
    int rc = ct_dist_new_group(trainer_ranks, ranks - 1, &trainers);
    if (!rc)
        rc = rank == 0 ? run_server(&o, ranks - 1) : run_trainer(&o, rank, ranks, trainers);
    if (rc) {
        /* The launcher stops the other ranks; their calls fail meanwhile. */
        fprintf(stderr, "param_server: %s\n", ct_errmsg());
        return 1;
    }
    ct_comm_free(trainers);
    ct_dist_finalize();
    return 0;
}
