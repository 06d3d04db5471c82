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
 * momentum: with two trainers, --momentum 0.8 trains as fmnist_mlp's 0.9
 * does (docs/examples-rpc.md).
 *
 * trainer1 prints what fmnist_mlp prints: progress to stderr, the test
 * accuracy after every epoch to stdout, and a JSON summary last. The
 * trainers meet at every epoch's end, then trainer1 evaluates through the
 * ps's "forward", outside any context.
 */
#define _POSIX_C_SOURCE 200809L

#include <ct/ct.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct options {
    int epochs, threads, max_steps;
    int64_t batch, hidden;
    double lr, momentum, timeout_s; /* timeout_s: of every call, and of the ps's wait */
    uint64_t seed;
    const char *data;
} options;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctlaunch -np 3 param_server [--epochs N] [--batch N] [--lr X] [--momentum X]\n"
            "                                   [--hidden N] [--threads N] [--seed N]\n"
            "                                   [--data DIR] [--max-steps N] [--timeout S]\n");
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.epochs = 10,
                   .threads = 1,
                   .batch = 64,
                   .hidden = 256,
                   .lr = 0.05,
                   .momentum = 0.9,
                   .timeout_s = 60,
                   .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "param_server: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--epochs"))
            o->epochs = atoi(v);
        else if (!strcmp(a, "--batch"))
            o->batch = atoll(v);
        else if (!strcmp(a, "--lr"))
            o->lr = atof(v);
        else if (!strcmp(a, "--momentum"))
            o->momentum = atof(v);
        else if (!strcmp(a, "--hidden"))
            o->hidden = atoll(v);
        else if (!strcmp(a, "--threads"))
            o->threads = atoi(v);
        else if (!strcmp(a, "--seed"))
            o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--data"))
            o->data = v;
        else if (!strcmp(a, "--max-steps"))
            o->max_steps = atoi(v);
        else if (!strcmp(a, "--timeout"))
            o->timeout_s = atof(v);
        else {
            fprintf(stderr, "param_server: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
    }
    if (o->epochs < 1 || o->batch < 1 || o->hidden < 1 || !(o->lr > 0) || o->threads < 1 ||
        o->max_steps < 0 || !(o->timeout_s > 0) || !(o->momentum >= 0 && o->momentum < 1)) {
        fprintf(stderr, "param_server: epochs, batch, hidden, lr, threads and timeout must be "
                        "positive, and momentum in [0, 1)\n");
        return -1;
    }
    return 0;
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
    double quiet_since = now();
    while (atomic_load(&s->training) > 0) {
        long long calls = atomic_load(&s->calls);
        if (calls != seen) {
            seen = calls;
            quiet_since = now();
        } else if (now() - quiet_since > timeout_s) {
            return ct_seterr(CT_ETIMEDOUT,
                             "ps: no call from the trainers for %.0f s (--timeout), with %d of "
                             "them not done",
                             timeout_s, atomic_load(&s->training));
        }
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    return 0;
}

static int run_server(const options *o, int trainers) {
    /* fmnist_mlp's model and seed, so its initial weights. */
    ct_manual_seed(o->seed);
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(784, o->hidden, true));
    ct_sequential_append(net, ct_relu_new());
    ct_sequential_append(net, ct_linear_new(o->hidden, o->hidden, true));
    ct_sequential_append(net, ct_relu_new());
    ct_sequential_append(net, ct_linear_new(o->hidden, 10, true));
    server s = {.training = trainers};
    ct_param_list_init(&s.params);
    /* One flat parameter buffer: the optimizer updates it in one pass. */
    int rc = ct_module_flatten(net, false);
    rc = rc ? rc : ct_module_named_parameters(net, &s.params);
    ct_optim *opt = NULL;
    if (!rc) {
        ct_optim_options oo = ct_optim_defaults(CT_OPTIM_SGD, o->lr);
        oo.momentum = o->momentum;
        rc = (opt = ct_optim_new(&oo, s.params.tensors, s.params.n)) ? 0 : ct_errcode();
    }
    rc = rc ? rc : ct_rpc_register("forward", forward, &s);
    rc = rc ? rc : ct_rpc_register("done", done, &s);
    rc = rc ? rc : ct_dist_optim_serve("sgd", opt);
    bool started =
        !rc && !(rc = ct_rpc_init(&(ct_rpc_options){.name = "ps", .timeout_s = o->timeout_s}));
    if (started) {
        printf("ps: 784-%lld-%lld-10, %lld parameters, serving %d trainer%s\n",
               (long long)o->hidden, (long long)o->hidden,
               (long long)ct_param_list_numel(&s.params), trainers, trainers > 1 ? "s" : "");
        fflush(stdout);
        rc = serve(&s, o->timeout_s);
        rc = rc ? rc : ct_rpc_shutdown();
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

/* One step in its own context; *loss is the batch's mean loss. */
static int train_step(ct_dist_optim *opt, ct_tensor *x, ct_tensor *y, double *loss) {
    int64_t context = ct_dist_autograd_begin();
    if (!context)
        return ct_errcode();
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    int rc = in ? ct_rpc_args_add_tensor(in, x) : ct_errcode();
    rc = rc ? rc : ct_rpc_sync("ps", "forward", in, 0, &out);
    ct_tensor *l = rc ? NULL : ct_cross_entropy(ct_rpc_args_tensor(out, 0), y, NULL);
    rc = rc ? rc : l ? ct_dist_backward(context, &l, 1) : ct_errcode();
    rc = rc ? rc : ct_dist_optim_step(opt, context);
    *loss = rc ? NAN : ct_item(l);
    int end = ct_dist_autograd_end(context);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    return rc ? rc : end;
}

/* Test accuracy through the ps's forward, in batches of 1000 images. */
static int evaluate(ct_tensor *images, ct_tensor *labels, double *acc) {
    int64_t n = ct_size(images, 0), correct = 0;
    int rc = 0;
    for (int64_t at = 0; at < n && !rc; at += 1000) {
        ct_scope_begin();
        int64_t len = n - at < 1000 ? n - at : 1000;
        ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
        rc = in ? ct_rpc_args_add_tensor(in, ct_narrow(images, 0, at, len)) : ct_errcode();
        rc = rc ? rc : ct_rpc_sync("ps", "forward", in, 0, &out);
        ct_tensor *pred = rc ? NULL : ct_argmax(ct_rpc_args_tensor(out, 0), 1, false);
        ct_tensor *hits =
            pred ? ct_sum(ct_eq(pred, ct_narrow(labels, 0, at, len)), NULL, 0, false) : NULL;
        rc = rc ? rc : hits ? 0 : ct_errcode();
        correct += hits ? ct_item_int64(hits) : 0;
        ct_rpc_args_free(in);
        ct_rpc_args_free(out);
        ct_scope_end();
    }
    *acc = (double)correct / (double)n;
    return rc;
}

/* The trainers meet at every epoch's end and sum v[0..n-1] across them. */
static int meet(ct_comm *trainers, double *v, int n) {
    ct_scope_begin();
    ct_tensor *t = ct_from_data(v, CT_SHAPE(n), CT_FLOAT64);
    int rc = t ? ct_comm_allreduce(trainers, t, CT_REDUCE_SUM, NULL) : ct_errcode();
    if (!rc)
        memcpy(v, ct_data_ptr(t), sizeof *v * (size_t)n);
    ct_scope_end();
    return rc;
}

typedef struct progress {
    bool tty;
    double last_print;
} progress;

static void show(progress *p, bool force, int epoch, int epochs, int64_t step, int64_t steps,
                 double loss, double rate, double eta) {
    double t = now();
    if (!force && t - p->last_print < (p->tty ? 0.2 : 5))
        return;
    p->last_print = t;
    int s = eta > 0 && eta < 1e6 ? (int)(eta + 0.5) : 0;
    fprintf(stderr,
            "%sepoch %d/%d  step %4lld/%lld  loss %.4f  %8.0f samples/s  ETA %d:%02d:%02d%s",
            p->tty ? "\r" : "", epoch, epochs, (long long)step, (long long)steps, loss, rate,
            s / 3600, s / 60 % 60, s % 60, p->tty ? "   " : "\n");
    fflush(stderr);
}

/* Trains trainer's share (of trainers) of the data; trainer 0 reports. */
static int train(const options *o, int trainer, int trainers, ct_comm *group, ct_tensor *train_x,
                 ct_tensor *train_y, ct_tensor *test_x, ct_tensor *test_y) {
    ct_sampler sampler;
    ct_sampler_options so = {.size = ct_size(train_x, 0),
                             .shuffle = true,
                             .seed = o->seed,
                             .num_replicas = trainers,
                             .rank = trainer};
    ct_loader_options lo = {.batch_size = o->batch, .sampler = &sampler};
    ct_loader *loader = NULL;
    ct_dist_optim *opt = ct_dist_optim_new("sgd", (const char *const[]){"ps"}, 1);
    int rc = opt ? ct_sampler_init(&sampler, &so) : ct_errcode();
    rc = rc ? rc : (loader = ct_loader_new(train_x, train_y, &lo)) ? 0 : ct_errcode();
    int64_t per_epoch = rc ? 0 : ct_loader_num_batches(loader), total = per_epoch * o->epochs;
    if (o->max_steps > 0 && o->max_steps < total)
        total = o->max_steps;
    bool report = trainer == 0;
    if (!rc && report)
        printf("param_server: 784-%lld-%lld-10 on ps, batch %lld, %d epochs, %d trainer%s, %d "
               "thread%s each\n",
               (long long)o->hidden, (long long)o->hidden, (long long)o->batch, o->epochs, trainers,
               trainers > 1 ? "s" : "", o->threads, o->threads > 1 ? "s" : "");
    fflush(stdout);

    progress prog = {isatty(STDERR_FILENO) != 0, 0};
    double start = now(), busy = 0, acc = NAN, mean_loss = NAN, rate = 0;
    int64_t step = 0, samples = 0;
    int epoch = 0;
    while (!rc && step < total) {
        epoch++;
        double loss_sum = 0, loss = NAN;
        int64_t in_epoch = 0;
        for (; step < total && !rc; step++) {
            double t0 = now();
            ct_scope_begin();
            ct_tensor *x, *y;
            int got = ct_loader_next(loader, &x, &y);
            if (got == 1) {
                rc = train_step(opt, x, y, &loss);
                samples += ct_size(x, 0);
            }
            ct_scope_end();
            if (got < 0)
                rc = got;
            if (rc || got == 0)
                break;
            busy += now() - t0;
            loss_sum += loss;
            in_epoch++;
            /* Every trainer goes at about this one's pace. */
            double mine = (double)samples / busy;
            if (report)
                show(&prog, false, epoch, o->epochs, in_epoch, per_epoch, loss, mine * trainers,
                     (double)(total - step - 1) * (double)o->batch / mine);
        }
        double sums[3] = {loss_sum, (double)in_epoch, busy > 0 ? (double)samples / busy : 0};
        rc = rc ? rc : meet(group, sums, 3);
        if (rc || !report)
            continue;
        mean_loss = sums[0] / sums[1];
        rate = sums[2];
        show(&prog, true, epoch, o->epochs, in_epoch, per_epoch, loss, rate, 0);
        if (prog.tty)
            fputc('\n', stderr);
        rc = evaluate(test_x, test_y, &acc);
        if (!rc)
            printf("epoch %2d  train loss %.4f  test accuracy %.2f%%  (%.0f samples/s, %.1f s)\n",
                   epoch, mean_loss, 100 * acc, rate, now() - start);
        fflush(stdout);
    }
    if (!rc && report)
        printf(
            "{\"example\": \"param_server\", \"trainers\": %d, \"threads\": %d, \"batch\": %lld, "
            "\"epochs\": %d, \"steps\": %lld, \"samples_per_s\": %.1f, \"test_acc\": %.4f, "
            "\"final_loss\": %.4f}\n",
            trainers, o->threads, (long long)o->batch, epoch, (long long)step, rate, acc,
            mean_loss);
    ct_loader_free(loader);
    ct_dist_optim_free(opt);
    return rc;
}

static int run_trainer(const options *o, int rank, int ranks, ct_comm *group) {
    ct_tensor *train_x = NULL, *train_y = NULL, *test_x = NULL, *test_y = NULL;
    int rc = ct_fmnist_load(o->data, true, &train_x, &train_y);
    if (!rc && rank == 1)
        rc = ct_fmnist_load(o->data, false, &test_x, &test_y);
    char name[32];
    snprintf(name, sizeof name, "trainer%d", rank);
    rc = rc ? rc : ct_rpc_init(&(ct_rpc_options){.name = name, .timeout_s = o->timeout_s});
    rc = rc ? rc : train(o, rank - 1, ranks - 1, group, train_x, train_y, test_x, test_y);
    ct_rpc_args *none = rc ? NULL : ct_rpc_args_new();
    rc = rc ? rc : none ? ct_rpc_sync("ps", "done", none, 0, NULL) : ct_errcode();
    rc = rc ? rc : ct_rpc_shutdown();
    ct_rpc_args_free(none);
    ct_tensor_free(train_x);
    ct_tensor_free(train_y);
    ct_tensor_free(test_x);
    ct_tensor_free(test_y);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o))
        return 2;
    if (ct_set_num_threads(o.threads) || ct_dist_init(NULL)) {
        fprintf(stderr, "param_server: %s\n", ct_errmsg());
        return 1;
    }
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
    rc = rc ? rc : rank == 0 ? run_server(&o, ranks - 1) : run_trainer(&o, rank, ranks, trainers);
    if (rc) {
        /* The launcher stops the other ranks; their calls fail meanwhile. */
        fprintf(stderr, "param_server: %s\n", ct_errmsg());
        return 1;
    }
    ct_comm_free(trainers);
    ct_dist_finalize();
    return 0;
}
