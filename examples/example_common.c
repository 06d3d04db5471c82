#define _POSIX_C_SOURCE 200809L

#include "example_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double example_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

example_options example_options_defaults(void) {
    return (example_options){
        .epochs = 10, .threads = 1, .batch = 64, .hidden = 256, .lr = 0.05, .seed = 1};
}

/* The common flags: 1 if flag is one, with its value stored in o. */
static int parse_common(example_options *o, const char *flag, const char *v) {
    if (!strcmp(flag, "--epochs"))
        o->epochs = atoi(v);
    else if (!strcmp(flag, "--batch"))
        o->batch = atoll(v);
    else if (!strcmp(flag, "--lr"))
        o->lr = atof(v);
    else if (!strcmp(flag, "--hidden"))
        o->hidden = atoll(v);
    else if (!strcmp(flag, "--threads"))
        o->threads = atoi(v);
    else if (!strcmp(flag, "--seed"))
        o->seed = strtoull(v, NULL, 10);
    else if (!strcmp(flag, "--data"))
        o->data = v;
    else if (!strcmp(flag, "--max-steps"))
        o->max_steps = atoi(v);
    else
        return 0;
    return 1;
}

int example_parse(int argc, char **argv, const example_cli *cli, example_options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(cli->usage, stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "%s: %s needs a value\n", cli->name, a);
            return -1;
        }
        i++;
        int took = parse_common(o, a, v);
        if (!took)
            took = cli->flag(cli->ctx, a, v);
        if (took < 0)
            return -1;
        if (!took) {
            fprintf(stderr, "%s: unknown option %s\n", cli->name, a);
            fputs(cli->usage, stderr);
            return -1;
        }
    }
    return 0;
}

bool example_options_valid(const example_options *o) {
    return o->epochs >= 1 && o->batch >= 1 && o->hidden >= 1 && o->lr > 0 && o->threads >= 1 &&
           o->max_steps >= 0;
}

int example_parse_device(const char *name, const char *v, ct_device *out) {
    if (!strcmp(v, "cpu"))
        *out = CT_DEVICE_CPU;
    else if (!strcmp(v, "cuda"))
        *out = (ct_device){CT_CUDA, -1};
    else if (!strncmp(v, "cuda:", 5) && v[5])
        *out = (ct_device){CT_CUDA, atoi(v + 5)};
    else {
        fprintf(stderr, "%s: unknown device '%s' (cpu, cuda, cuda:N)\n", name, v);
        return -1;
    }
    return 0;
}

int example_init(const char *name, const example_options *o) {
    if (!ct_set_num_threads(o->threads) && !ct_dist_init(NULL))
        return 0;
    fprintf(stderr, "%s: %s\n", name, ct_errmsg());
    return -1;
}

ct_module *example_mlp_new(const example_options *o, double dropout) {
    ct_manual_seed(o->seed);
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(784, o->hidden, true));
    ct_sequential_append(net, ct_relu_new());
    if (dropout > 0)
        ct_sequential_append(net, ct_dropout_new(dropout));
    ct_sequential_append(net, ct_linear_new(o->hidden, o->hidden, true));
    ct_sequential_append(net, ct_relu_new());
    if (dropout > 0)
        ct_sequential_append(net, ct_dropout_new(dropout));
    ct_sequential_append(net, ct_linear_new(o->hidden, 10, true));
    if ((o->device.type != CT_CPU && ct_module_to(net, o->device)) ||
        ct_module_flatten(net, false)) {
        ct_module_free(net);
        return NULL;
    }
    return net;
}

ct_optim *example_optimizer(const ct_param_list *pl, const ct_optim_options *opts,
                            double weight_decay) {
    ct_tensor *decay[pl->n > 0 ? pl->n : 1], *plain[pl->n > 0 ? pl->n : 1];
    int nd = 0, np = 0;
    for (int i = 0; i < pl->n; i++) {
        if (ct_ndim(pl->tensors[i]) >= 2)
            decay[nd++] = pl->tensors[i];
        else
            plain[np++] = pl->tensors[i];
    }
    ct_param_group groups[2] = {{decay, nd, weight_decay, 1}, {plain, np, 0, 1}};
    return ct_optim_new_groups(opts, groups, 2);
}

int example_data_load(example_data *d, const char *dir, bool test) {
    *d = (example_data){0};
    int rc = ct_fmnist_load(dir, true, &d->train_x, &d->train_y);
    return rc || !test ? rc : ct_fmnist_load(dir, false, &d->test_x, &d->test_y);
}

void example_data_free(example_data *d) {
    ct_tensor_free(d->train_x);
    ct_tensor_free(d->train_y);
    ct_tensor_free(d->test_x);
    ct_tensor_free(d->test_y);
}

int example_evaluate(example_predict_fn predict, void *ctx, ct_tensor *images, ct_tensor *labels,
                     ct_device device, double *acc) {
    bool prev = ct_set_grad_enabled(false);
    int64_t n = ct_size(images, 0), correct = 0;
    int rc = 0;
    for (int64_t at = 0; at < n && !rc; at += 1000) {
        ct_scope_begin();
        int64_t len = n - at < 1000 ? n - at : 1000;
        ct_tensor *pred = predict(ctx, ct_to(ct_narrow(images, 0, at, len), device));
        ct_tensor *hits =
            pred ? ct_sum(ct_eq(pred, ct_to(ct_narrow(labels, 0, at, len), device)), NULL, 0, false)
                 : NULL;
        rc = hits ? 0 : ct_errcode();
        correct += hits ? ct_item_int64(hits) : 0;
        ct_scope_end();
    }
    ct_set_grad_enabled(prev);
    *acc = (double)correct / (double)n;
    return rc;
}

void example_progress_init(example_progress *p, int epochs, int64_t steps) {
    *p = (example_progress){epochs, steps, "samples", isatty(STDERR_FILENO) != 0, 0};
}

static void show(example_progress *p, bool force, int epoch, int64_t step, double loss, double rate,
                 double eta) {
    double t = example_now();
    if (!force && t - p->last_print < (p->tty ? 0.2 : 5))
        return;
    p->last_print = t;
    int s = eta > 0 && eta < 1e6 ? (int)(eta + 0.5) : 0;
    char ep[32] = "", of[24] = "";
    if (p->epochs > 0)
        snprintf(ep, sizeof ep, "epoch %d/%d  ", epoch, p->epochs);
    if (p->steps > 0)
        snprintf(of, sizeof of, "/%lld", (long long)p->steps);
    fprintf(stderr, "%s%sstep %4lld%s  loss %.4f  %8.0f %s/s  ETA %d:%02d:%02d%s",
            p->tty ? "\r" : "", ep, (long long)step, of, loss, rate, p->unit, s / 3600, s / 60 % 60,
            s % 60, p->tty ? "   " : "\n");
    fflush(stderr);
}

void example_progress_show(example_progress *p, int epoch, int64_t step, double loss, double rate,
                           double eta) {
    show(p, false, epoch, step, loss, rate, eta);
}

void example_progress_end_epoch(example_progress *p, int epoch, int64_t step, double loss,
                                double rate) {
    show(p, true, epoch, step, loss, rate, 0);
    if (p->tty)
        fputc('\n', stderr);
}

void example_print_epoch(int epoch, double loss, double acc, double rate, double seconds) {
    printf("epoch %2d  train loss %.4f  test accuracy %.2f%%  (%.0f samples/s, %.1f s)\n", epoch,
           loss, 100 * acc, rate, seconds);
    fflush(stdout);
}

void example_print_summary(const char *head, const char *more, const example_options *o, int epochs,
                           int64_t steps, double rate, double acc, double loss) {
    printf("{%s, \"threads\": %d, \"batch\": %lld, \"epochs\": %d, \"steps\": %lld, "
           "%s\"samples_per_s\": %.1f, \"test_acc\": %.4f, \"final_loss\": %.4f}\n",
           head, o->threads, (long long)o->batch, epochs, (long long)steps, more, rate, acc, loss);
}

int example_ckpt_init(example_ckpt *r, const ct_param_list *params, ct_optim *opt, ct_comm *world) {
    *r = (example_ckpt){.st = ct_state_new(), .ck = ct_checkpointer_new(world), .last_saved = -1};
    int rc = r->st && r->ck ? 0 : ct_errcode();
    for (int i = 0; !rc && i < params->n; i++)
        rc = ct_state_add_tensor(r->st, params->names[i], params->tensors[i], CT_STATE_REPLICATED);
    int n = rc ? 0 : ct_optim_num_states(opt);
    for (int i = 0; !rc && i < n; i++) {
        const char *name;
        ct_tensor *t;
        char key[96];
        rc = ct_optim_state_at(opt, i, &name, &t);
        snprintf(key, sizeof key, "optimizer.%s", name);
        rc = rc ? rc : ct_state_add_tensor(r->st, key, t, CT_STATE_REPLICATED);
    }
    rc = rc ? rc : ct_state_add_i64(r->st, "train.step", &r->step, CT_STATE_REPLICATED);
    rc = rc ? rc : ct_state_add_generator(r->st, "rng", ct_default_generator(), CT_STATE_PER_RANK);
    return rc ? -1 : 0;
}

int64_t example_ckpt_resume(example_ckpt *r, const char *name, const char *dir, ct_comm *world,
                            ct_optim *opt) {
    char path[4096];
    if (ct_checkpointer_reserve(r->ck, r->st))
        return -1;
    int found = ct_checkpoint_latest(dir, path, sizeof path);
    if (found <= 0)
        return found < 0 ? -1 : 0;
    if (ct_checkpoint_load(path, r->st, world) || ct_optim_set_step_count(opt, r->step))
        return -1;
    r->last_saved = r->step;
    if (ct_comm_rank(world) == 0)
        printf("%s: resumed from %s at step %lld\n", name, path, (long long)r->step);
    return r->step;
}

int example_ckpt_save(example_ckpt *r, const char *dir, int64_t step) {
    if (r->last_saved == step)
        return 0;
    r->step = step;
    r->last_saved = step;
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%08lld", dir, (long long)step);
    ct_checkpoint_options co = ct_checkpoint_defaults();
    co.step = step;
    co.keep_last = 3;
    return ct_checkpointer_save(r->ck, path, r->st, &co) ? -1 : 0;
}

int example_ckpt_finish(example_ckpt *r) {
    int rc = r->ck && ct_checkpointer_wait(r->ck) ? -1 : 0;
    ct_checkpointer_free(r->ck);
    ct_state_free(r->st);
    *r = (example_ckpt){0};
    return rc;
}

static int allreduce(ct_comm *group, double *v, int n, ct_reduce_op op) {
    ct_scope_begin();
    ct_tensor *t = ct_from_data(v, CT_SHAPE(n), CT_FLOAT64);
    int rc = t ? ct_comm_allreduce(group, t, op, NULL) : ct_errcode();
    if (!rc)
        memcpy(v, ct_data_ptr(t), sizeof *v * (size_t)n);
    ct_scope_end();
    return rc;
}

int example_allreduce_sum(ct_comm *group, double *v, int n) {
    return allreduce(group, v, n, CT_REDUCE_SUM);
}

int example_allreduce_max(ct_comm *group, double *v, int n) {
    return allreduce(group, v, n, CT_REDUCE_MAX);
}

int example_train(const example_trainer *t) {
    const example_options *o = t->o;
    int trainers = t->group ? ct_comm_size(t->group) : 1;
    bool report = !t->group || ct_comm_rank(t->group) == 0;
    int64_t per_epoch = ct_loader_num_batches(t->loader), total = per_epoch * o->epochs;
    if (o->max_steps > 0 && o->max_steps < total)
        total = o->max_steps;
    example_progress prog;
    example_progress_init(&prog, o->epochs, per_epoch);
    double start = example_now(), busy = 0, acc = NAN, mean_loss = NAN, rate = 0;
    int64_t step = 0, samples = 0;
    int epoch = 0, rc = 0;
    while (!rc && step < total) {
        epoch++;
        double loss_sum = 0, loss = NAN;
        int64_t in_epoch = 0;
        for (; step < total && !rc; step++) {
            double t0 = example_now();
            ct_scope_begin();
            ct_tensor *x, *y;
            int got = ct_loader_next(t->loader, &x, &y);
            if (got == 1) {
                rc = t->step(t->ctx, x, y, &loss);
                samples += ct_size(x, 0);
            }
            ct_scope_end();
            if (got < 0)
                rc = got;
            if (rc || got == 0)
                break;
            busy += example_now() - t0;
            loss_sum += loss;
            in_epoch++;
            /* Every trainer goes at about this one's pace. */
            double mine = (double)samples / busy;
            if (report)
                example_progress_show(&prog, epoch, in_epoch, loss, mine * trainers,
                                      (double)(total - step - 1) * (double)o->batch / mine);
        }
        double sums[3] = {loss_sum, (double)in_epoch, busy > 0 ? (double)samples / busy : 0};
        if (!rc && t->group)
            rc = example_allreduce_sum(t->group, sums, 3);
        if (rc || !report)
            continue;
        mean_loss = sums[0] / sums[1];
        rate = sums[2];
        example_progress_end_epoch(&prog, epoch, in_epoch, loss, rate);
        rc = example_evaluate(t->predict, t->ctx, t->test_x, t->test_y, t->o->device, &acc);
        if (!rc)
            example_print_epoch(epoch, mean_loss, acc, rate, example_now() - start);
    }
    if (!rc && report)
        example_print_summary(t->summary_head, "", o, epoch, step, rate, acc, mean_loss);
    return rc;
}
