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
    double lr, timeout_s; /* timeout_s: of every call, and of worker 1's wait for worker 0 */
    uint64_t seed;
    const char *data;
} options;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: ctlaunch -np 2 two_stage [--epochs N] [--batch N] [--lr X] [--hidden N]\n"
               "                                [--threads N] [--seed N] [--data DIR]\n"
               "                                [--max-steps N] [--timeout S]\n");
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.epochs = 2,
                   .threads = 1,
                   .batch = 64,
                   .hidden = 256,
                   .lr = 0.05,
                   .timeout_s = 60,
                   .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "two_stage: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--epochs"))
            o->epochs = atoi(v);
        else if (!strcmp(a, "--batch"))
            o->batch = atoll(v);
        else if (!strcmp(a, "--lr"))
            o->lr = atof(v);
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
            fprintf(stderr, "two_stage: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
    }
    if (o->epochs < 1 || o->batch < 1 || o->hidden < 1 || !(o->lr > 0) || o->threads < 1 ||
        o->max_steps < 0 || !(o->timeout_s > 0)) {
        fprintf(stderr, "two_stage: epochs, batch, hidden, lr, threads and timeout must be "
                        "positive\n");
        return -1;
    }
    return 0;
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
    ct_manual_seed(o->seed);
    s->net = ct_sequential_new();
    ct_module *first = ct_linear_new(784, o->hidden, true);
    if (worker == 0) {
        ct_sequential_append(s->net, first);
        ct_sequential_append(s->net, ct_relu_new());
    } else {
        ct_module_free(first);
        ct_sequential_append(s->net, ct_linear_new(o->hidden, o->hidden, true));
        ct_sequential_append(s->net, ct_relu_new());
        ct_sequential_append(s->net, ct_linear_new(o->hidden, 10, true));
    }
    ct_param_list params;
    ct_param_list_init(&params);
    /* One flat parameter buffer: the optimizer updates it in one pass. */
    int rc = ct_module_flatten(s->net, false);
    rc = rc ? rc : ct_module_named_parameters(s->net, &params);
    if (!rc) {
        ct_optim_options oo = ct_optim_defaults(CT_OPTIM_SGD, o->lr);
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
    double quiet_since = now();
    while (atomic_load(&s->driving)) {
        long long calls = atomic_load(&s->calls);
        if (calls != seen) {
            seen = calls;
            quiet_since = now();
        } else if (now() - quiet_since > timeout_s) {
            return ct_seterr(CT_ETIMEDOUT, "worker1: no call from worker0 for %.0f s (--timeout)",
                             timeout_s);
        }
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    return 0;
}

static int run_stage2(const options *o) {
    stage s = {.driving = true};
    int rc = stage_init(&s, o, 1);
    rc = rc ? rc : ct_rpc_register("stage2", stage2, &s);
    rc = rc ? rc : ct_rpc_register("done", done, &s);
    bool started = !rc && !(rc = ct_rpc_init(&(ct_rpc_options){.timeout_s = o->timeout_s}));
    rc = rc ? rc : serve(&s, o->timeout_s);
    rc = rc ? rc : ct_rpc_shutdown();
    /* A running agent may still use the stage: the exit takes it all. */
    if (started && rc)
        return rc;
    stage_free(&s);
    return rc;
}

/* ------------------------------------------------------------- worker 0 */

/* One step in its own context; *loss is the batch's mean loss. */
static int train_step(ct_module *stage1, ct_dist_optim *opt, ct_tensor *x, ct_tensor *y,
                      double *loss) {
    int64_t context = ct_dist_autograd_begin();
    if (!context)
        return ct_errcode();
    ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
    ct_tensor *h = ct_module_forward(stage1, x);
    int rc = in && h ? ct_rpc_args_add_tensor(in, h) : ct_errcode();
    rc = rc ? rc : ct_rpc_sync("worker1", "stage2", in, 0, &out);
    ct_tensor *l = rc ? NULL : ct_cross_entropy(ct_rpc_args_tensor(out, 0), y, NULL);
    rc = rc ? rc : l ? ct_dist_backward(context, &l, 1) : ct_errcode();
    rc = rc ? rc : ct_dist_optim_step(opt, context);
    *loss = rc ? NAN : ct_item(l);
    int end = ct_dist_autograd_end(context);
    ct_rpc_args_free(in);
    ct_rpc_args_free(out);
    return rc ? rc : end;
}

/* Test accuracy in batches of 1000 images, without a graph. */
static int evaluate(ct_module *stage1, ct_tensor *images, ct_tensor *labels, double *acc) {
    bool prev = ct_set_grad_enabled(false);
    int64_t n = ct_size(images, 0), correct = 0;
    int rc = 0;
    for (int64_t at = 0; at < n && !rc; at += 1000) {
        ct_scope_begin();
        int64_t len = n - at < 1000 ? n - at : 1000;
        ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
        ct_tensor *h = ct_module_forward(stage1, ct_narrow(images, 0, at, len));
        rc = in && h ? ct_rpc_args_add_tensor(in, h) : ct_errcode();
        rc = rc ? rc : ct_rpc_sync("worker1", "stage2", in, 0, &out);
        ct_tensor *pred = rc ? NULL : ct_argmax(ct_rpc_args_tensor(out, 0), 1, false);
        ct_tensor *hits =
            pred ? ct_sum(ct_eq(pred, ct_narrow(labels, 0, at, len)), NULL, 0, false) : NULL;
        rc = rc ? rc : hits ? 0 : ct_errcode();
        correct += hits ? ct_item_int64(hits) : 0;
        ct_rpc_args_free(in);
        ct_rpc_args_free(out);
        ct_scope_end();
    }
    ct_set_grad_enabled(prev);
    *acc = (double)correct / (double)n;
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

static int train(const options *o, stage *s, ct_tensor *train_x, ct_tensor *train_y,
                 ct_tensor *test_x, ct_tensor *test_y) {
    ct_sampler sampler;
    ct_sampler_options so = {.size = ct_size(train_x, 0), .shuffle = true, .seed = o->seed};
    ct_loader_options lo = {.batch_size = o->batch, .sampler = &sampler};
    ct_loader *loader = NULL;
    ct_dist_optim *opt = ct_dist_optim_new("sgd", (const char *const[]){"worker0", "worker1"}, 2);
    int rc = opt ? ct_sampler_init(&sampler, &so) : ct_errcode();
    rc = rc ? rc : (loader = ct_loader_new(train_x, train_y, &lo)) ? 0 : ct_errcode();
    int64_t per_epoch = rc ? 0 : ct_loader_num_batches(loader), total = per_epoch * o->epochs;
    if (o->max_steps > 0 && o->max_steps < total)
        total = o->max_steps;
    if (!rc)
        printf("two_stage: 784-%lld | %lld-10 on worker0 | worker1, batch %lld, %d epochs, %d "
               "thread%s each\n",
               (long long)o->hidden, (long long)o->hidden, (long long)o->batch, o->epochs,
               o->threads, o->threads > 1 ? "s" : "");
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
                rc = train_step(s->net, opt, x, y, &loss);
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
            rate = (double)samples / busy;
            show(&prog, false, epoch, o->epochs, in_epoch, per_epoch, loss, rate,
                 (double)(total - step - 1) * (double)o->batch / rate);
        }
        if (rc)
            break;
        mean_loss = loss_sum / (double)in_epoch;
        show(&prog, true, epoch, o->epochs, in_epoch, per_epoch, loss, rate, 0);
        if (prog.tty)
            fputc('\n', stderr);
        rc = evaluate(s->net, test_x, test_y, &acc);
        if (!rc)
            printf("epoch %2d  train loss %.4f  test accuracy %.2f%%  (%.0f samples/s, %.1f s)\n",
                   epoch, mean_loss, 100 * acc, rate, now() - start);
        fflush(stdout);
    }
    if (!rc)
        printf("{\"example\": \"two_stage\", \"threads\": %d, \"batch\": %lld, \"epochs\": %d, "
               "\"steps\": %lld, \"samples_per_s\": %.1f, \"test_acc\": %.4f, \"final_loss\": "
               "%.4f}\n",
               o->threads, (long long)o->batch, epoch, (long long)step, rate, acc, mean_loss);
    ct_loader_free(loader);
    ct_dist_optim_free(opt);
    return rc;
}

static int run_stage1(const options *o) {
    ct_tensor *train_x = NULL, *train_y = NULL, *test_x = NULL, *test_y = NULL;
    stage s = {0};
    int rc = ct_fmnist_load(o->data, true, &train_x, &train_y);
    rc = rc ? rc : ct_fmnist_load(o->data, false, &test_x, &test_y);
    rc = rc ? rc : stage_init(&s, o, 0);
    bool started = !rc && !(rc = ct_rpc_init(&(ct_rpc_options){.timeout_s = o->timeout_s}));
    rc = rc ? rc : train(o, &s, train_x, train_y, test_x, test_y);
    ct_rpc_args *none = rc ? NULL : ct_rpc_args_new();
    rc = rc ? rc : none ? ct_rpc_sync("worker1", "done", none, 0, NULL) : ct_errcode();
    rc = rc ? rc : ct_rpc_shutdown();
    ct_rpc_args_free(none);
    if (started && rc)
        return rc; /* as run_stage2 */
    stage_free(&s);
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
        fprintf(stderr, "two_stage: %s\n", ct_errmsg());
        return 1;
    }
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
