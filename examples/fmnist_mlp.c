/* fmnist_mlp: trains a multilayer perceptron on Fashion-MNIST with ct.
 *
 *   fmnist_mlp [options]  (fmnist_mlp --help lists every flag with its default)
 *
 * The default recipe (sgd) is the reference one, the same as
 * bench/train_torch.py: 784-256-256-10 with ReLU, cross-entropy, SGD with
 * momentum 0.9 and lr 0.05, batch 64, 10 epochs, pixels / 255 as inputs.
 * The adamw recipe trains a wider net with AdamW (weight decay off for
 * biases), linear warmup, cosine decay and dropout.
 *
 * With --device cuda the model, its gradients and the optimizer's state live
 * on the GPU (under a launcher, each rank's own: local rank modulo the
 * devices), and each batch is copied there.
 *
 * Progress goes to stderr (one live line on a terminal, a line every few
 * seconds otherwise), the test accuracy after every epoch to stdout, and
 * metrics to a JSON-lines file. The last line on stdout is a JSON summary
 * in the format of ct's training benchmark. With --plot FILE.png, rank 0
 * draws the metrics file as a chart there after training, the loss above
 * and samples/s below (docs/plot.md; needs gnuplot).
 *
 * The same program trains data-parallel when a launcher starts several
 * ranks (`ctlaunch -np 2 fmnist_mlp`, `mpirun -np 2 fmnist_mlp`): each rank
 * takes batch / ranks rows of every global batch from its share of the
 * shuffled data, gradients are averaged across ranks in backward (ct_ddp),
 * and only rank 0 prints, with samples/s counted over the global batch.
 *
 * With --checkpoint-dir DIR it resumes from the newest checkpoint in DIR, if
 * there is one, trains on to --epochs (a finished run says so and exits 0;
 * docs/cli.md), and saves one there (in the background) after every epoch,
 * every --save-every steps and at the end, keeping the last three. A job
 * under `ctlaunch --max-restarts R` thus goes on where it stopped, with the
 * same result as a run that never stopped. --stop-at-step N saves and stops
 * at step N of the full run (as a job with a time limit would), so that the
 * next run resumes there.
 */
#define _POSIX_C_SOURCE 200809L

#include "example_common.h"
#include "metrics_plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct recipe {
    const char *name;
    int epochs;
    int64_t batch, hidden;
    double lr, weight_decay, dropout;
    int64_t warmup_steps;
    bool adamw;
} recipe;

static const recipe recipes[] = {
    {"sgd", 10, 64, 256, 0.05, 0, 0, 0, false},
    {"adamw", 15, 128, 1024, 1e-3, 0.05, 0.2, 500, true},
};

typedef struct options {
    example_options common; /* epochs, batch, hidden and lr: r's unless flags say otherwise */
    const recipe *r;
    int recipe; /* index into recipes */
    int warmup_steps;
    const char *metrics;
    int metrics_every; /* steps between loss lines */
    const char *plot;  /* NULL: no chart */
    example_resume resume;
    int shard; /* ct_ddp_shard */
    example_plan plan;
} options;

static const char about[] =
    "Trains a multilayer perceptron on Fashion-MNIST with ct: alone, or data-parallel\n"
    "under a launcher (ctlaunch -np 2 fmnist_mlp, mpirun -np 2 fmnist_mlp). With\n"
    "--checkpoint-dir it resumes from the newest checkpoint there and trains on to\n"
    "--epochs (docs/cli.md).";

static const char *const recipe_names[] = {"sgd", "adamw", NULL};

/* The recipe's values for the flags the command line left alone. */
static void use_recipe(options *o) {
    const recipe *r = o->r = &recipes[o->recipe];
    example_options *c = &o->common;
    c->epochs = c->given.epochs ? c->epochs : r->epochs;
    c->batch = c->given.batch ? c->batch : r->batch;
    c->hidden = c->given.hidden ? c->hidden : r->hidden;
    c->lr = c->given.lr ? c->lr : r->lr;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.common = example_options_defaults(),
                   .warmup_steps = 50,
                   .metrics = "fmnist_mlp.metrics.jsonl",
                   .metrics_every = 100};
    const ct_cli_flag mine[] = {
        CT_CLI_FLAG("--recipe", CT_CLI_CHOICE, &o->recipe, NULL,
                    "sgd: the reference (docs/bench-train.md); adamw: 1024 wide, AdamW, "
                    "cosine, dropout, and its own epochs 15, batch 128, hidden 1024, lr 0.001",
                    .choices = recipe_names),
        CT_CLI_FLAG("--metrics", CT_CLI_STRING, &o->metrics, "FILE",
                    "JSON lines of the loss and accuracy (\"\": none); a resumed run appends"),
        CT_CLI_FLAG("--metrics-every", CT_CLI_INT, &o->metrics_every, "N",
                    "write the loss of every N-th step to the metrics file", .min = 1, .max = 1e9),
        CT_CLI_FLAG("--plot", CT_CLI_STRING, &o->plot, "FILE.png",
                    "draw the metrics as a chart at the end (needs gnuplot)"),
        CT_CLI_FLAG("--warmup-steps", CT_CLI_INT, &o->warmup_steps, "N",
                    "first steps left out of samples/s", .min = 0, .max = 1e9),
        CT_CLI_FLAG("--device", CT_CLI_CUSTOM, &o->common.device, "cpu|cuda|cuda:N",
                    "where the model trains (cuda: each rank's own GPU)",
                    .parse = example_parse_device, .default_text = "cpu"),
        example_shard_flag(&o->shard),
    };
    enum { NMINE = sizeof mine / sizeof *mine };
    ct_cli_flag own[NMINE + EXAMPLE_NUM_RESUME_FLAGS + EXAMPLE_NUM_PLAN_FLAGS];
    memcpy(own, mine, sizeof mine);
    example_resume_flags(&o->resume, "also save every N steps (0: after every epoch only)",
                         own + NMINE);
    example_plan_flags(&o->plan, own + NMINE + EXAMPLE_NUM_RESUME_FLAGS);
    if (example_parse("fmnist_mlp", about, own, sizeof own / sizeof *own, &o->common, argc, argv))
        return -1;
    use_recipe(o);
    if (o->plot && !*o->metrics) {
        fprintf(stderr, "fmnist_mlp: --plot draws the metrics file: it needs --metrics FILE\n");
        return -1;
    }
    return 0;
}

/* SGD with momentum, or AdamW with weight decay on matrices only. */
static ct_optim *build_optimizer(const options *o, ct_ddp *ddp, const ct_param_list *pl) {
    if (!o->r->adamw) {
        ct_optim_options opts = ct_optim_defaults(CT_OPTIM_SGD, o->common.lr);
        opts.momentum = 0.9;
        ct_param_group all = {pl->tensors, pl->n, 0, 1};
        return ddp ? ct_ddp_optim_new(ddp, &opts, &all, 1) : ct_optim_new_groups(&opts, &all, 1);
    }
    ct_optim_options opts = ct_optim_defaults(CT_OPTIM_ADAMW, o->common.lr);
    return example_optimizer(ddp, pl, &opts, o->r->weight_decay);
}

/* Warmup takes at most a fifth of a short run (--max-steps), so that the
 * cosine decay always has steps left. */
static ct_lr_schedule schedule(const options *o, int64_t total_steps) {
    if (!o->r->adamw)
        return (ct_lr_schedule){.kind = CT_LR_CONSTANT, .base_lr = o->common.lr};
    int64_t warmup = o->r->warmup_steps < total_steps / 5 ? o->r->warmup_steps : total_steps / 5;
    return (ct_lr_schedule){.kind = CT_LR_COSINE,
                            .base_lr = o->common.lr,
                            .warmup_steps = warmup,
                            .warmup_start_factor = 0.01,
                            .total_steps = total_steps - warmup,
                            .eta_min = o->common.lr * 0.01};
}

static ct_tensor *predict(void *net, ct_tensor *images) {
    return ct_argmax(ct_module_forward(net, images), 1, false);
}

/* Test accuracy in evaluation mode (no dropout), on device. */
static int evaluate(ct_module *net, ct_device device, ct_tensor *images, ct_tensor *labels,
                    double *acc) {
    ct_module_train(net, false);
    int rc = example_evaluate(predict, net, images, labels, device, acc);
    ct_module_train(net, true);
    return rc;
}

/* What a checkpoint holds: example_ckpt's entries (parameters, optimizer
 * state, step, random streams) and the data position; the schedule's lr
 * follows from the step. The position is the epoch and the rows of its
 * shuffled order consumed by all ranks together: global batch b is rows
 * [b * batch, (b + 1) * batch) of that order whatever the ranks (each takes
 * every ranks-th), so a run resumed on another number of ranks sees the
 * same global batches. */
typedef struct resumable {
    example_ckpt ck;
    int64_t epoch, sample;
} resumable;

static int resumable_init(resumable *r, const ct_param_list *params, ct_optim *opt,
                          const ct_ddp *ddp, ct_comm *world) {
    CT_TRY(example_ckpt_init(&r->ck, params, opt, ddp, world));
    CT_TRY(ct_state_add_i64(r->ck.st, "data.epoch", &r->epoch, CT_STATE_REPLICATED));
    CT_TRY(ct_state_add_i64(r->ck.st, "data.sample", &r->sample, CT_STATE_REPLICATED));
    return 0;
}

/* Loads the newest checkpoint in dir, if any, and moves the loader there
 * (to the next epoch's start when the checkpoint ended an epoch): the step
 * to go on from, or -1 on error. rows is the data set's. */
static int64_t resume(resumable *r, const char *dir, ct_comm *world, ct_loader *loader,
                      int64_t rows, ct_optim *opt) {
    int64_t step = example_ckpt_resume(&r->ck, dir, world, opt);
    if (step <= 0)
        return step;
    int ranks = ct_comm_size(world);
    if (r->sample < rows && r->sample % ranks)
        return ct_seterr(CT_EINVAL,
                         "%s stopped at row %lld of epoch %lld, which does not divide among %d "
                         "ranks (resume where the global batch does)",
                         r->ck.path, (long long)r->sample, (long long)r->epoch, ranks),
               -1;
    int rc = r->sample >= rows ? ct_loader_set_epoch(loader, r->epoch + 1)
                               : ct_loader_set_position(loader, r->epoch, r->sample / ranks);
    return rc ? -1 : step;
}

/* Starts a background save of the state after step steps (once per step). */
static int save(resumable *r, const example_resume *res, int64_t step, ct_loader *loader,
                int ranks) {
    int64_t offset;
    ct_loader_position(loader, &r->epoch, &offset);
    r->sample = offset * ranks;
    return example_ckpt_save(&r->ck, res->dir, step, res->keep_last);
}

/* One step on the batch x, y (on the model's device): forward, loss,
 * backward, the update. */
static int step_on(ct_module *net, ct_optim *opt, ct_tensor *x, ct_tensor *y, ct_tensor **loss) {
    *loss = ct_cross_entropy(ct_module_forward(net, x), y, NULL);
    CT_TRY(*loss ? ct_tensor_backward(*loss) : ct_errcode());
    CT_TRY(ct_optim_step(opt));
    /* Under data parallel too: ct_ddp copies the next backward's gradients
     * into its buckets, which costs less than zeroing them and adding into
     * them. */
    return ct_optim_zero_grad(opt, true);
}

static ct_ddp *wrap_model(const options *o, ct_comm *comm, ct_module *net) {
    ct_ddp_options dopts = ct_ddp_defaults();
    dopts.shard = (ct_ddp_shard)o->shard;
    return ct_ddp_new(comm, net, &dopts);
}

/* Batches the loader prepares ahead of the one training. */
#define PREFETCH 2

/* --plan: the run replayed on the meta device through its own pieces. */
typedef struct plan_ctx {
    const options *o;
    int64_t rows; /* this rank's share of the batch */
    bool flat;
    /* The batches the loader holds ahead of the step's, as the run's does
     * (made at the first step, freed after the plan). */
    ct_tensor *ahead[2 * PREFETCH];
} plan_ctx;

static int plan_batch(int64_t rows, ct_device device, ct_tensor **x, ct_tensor **y) {
    *x = ct_empty_on(CT_SHAPE(rows, 784), CT_FLOAT32, device);
    *y = ct_empty_on(CT_SHAPE(rows), CT_INT64, device);
    return *x && *y ? 0 : ct_errcode();
}

static ct_module *plan_build(void *ctx) {
    const plan_ctx *p = ctx;
    example_options c = p->o->common;
    c.device = CT_DEVICE_META;
    return example_mlp_new(&c, p->o->r->dropout, p->flat);
}

static ct_ddp *plan_wrap(void *ctx, ct_comm *comm, ct_module *net) {
    return wrap_model(((const plan_ctx *)ctx)->o, comm, net);
}

static ct_optim *plan_optimizer(void *ctx, ct_module *net, ct_ddp *ddp) {
    ct_param_list pl;
    ct_param_list_init(&pl);
    ct_optim *opt = ct_module_named_parameters(net, &pl)
                        ? NULL
                        : build_optimizer(((const plan_ctx *)ctx)->o, ddp, &pl);
    ct_param_list_free(&pl);
    return opt;
}

static int plan_step(void *ctx, ct_module *net, ct_ddp *ddp, ct_optim *opt, ct_device device) {
    (void)ddp;
    plan_ctx *p = ctx;
    for (int k = 0; k < PREFETCH && !p->ahead[2 * k]; k++) {
        CT_TRY(plan_batch(p->rows, device, &p->ahead[2 * k], &p->ahead[2 * k + 1]));
        ct_tensor_retain(p->ahead[2 * k]);
        ct_tensor_retain(p->ahead[2 * k + 1]);
    }
    ct_tensor *x, *y, *loss;
    CT_TRY(plan_batch(p->rows, device, &x, &y));
    return step_on(net, opt, x, y, &loss);
}

/* *complete: the checkpoint in --checkpoint-dir had finished the run. */
static int train(const options *o, bool *complete) {
    ct_comm *world = ct_dist_comm();
    int ranks = ct_comm_size(world), rank = ct_comm_rank(world);
    if (o->common.batch % ranks) {
        fprintf(stderr, "fmnist_mlp: the batch (%lld) must divide among the %d ranks\n",
                (long long)o->common.batch, ranks);
        return 2;
    }
    example_data d;
    if (example_data_load(&d, o->common.data, true))
        return -1;
    /* Fully sharded units keep buffers of their own: no flat buffer. */
    bool fsdp = ranks > 1 && o->shard == CT_DDP_SHARD_FULL;
    plan_ctx pc = {o, o->common.batch / ranks, !fsdp, {NULL}};
    ct_memory_plan_config pcfg = {.world_size = ranks,
                                  .rank = rank,
                                  .build = plan_build,
                                  .wrap = plan_wrap,
                                  .optimizer = plan_optimizer,
                                  .step = plan_step,
                                  .ctx = &pc};
    example_plan plan = o->plan;
    int planned = example_plan_make(&plan, "fmnist_mlp", &pcfg, o->common.device);
    for (int k = 0; k < 2 * PREFETCH; k++)
        ct_tensor_free(pc.ahead[k]);
    if (planned)
        return -1;
    if (o->plan.only)
        return 0; /* the plan is all it asks for */
    ct_module *net = example_mlp_new(&o->common, o->r->dropout, !fsdp);
    ct_param_list params;
    ct_param_list_init(&params);
    if (!net || ct_module_named_parameters(net, &params))
        return -1;
    /* Rank 0's initial weights everywhere; gradients averaged in backward. */
    ct_ddp *ddp = NULL;
    if (ranks > 1 && !(ddp = wrap_model(o, world, net)))
        return -1;
    ct_optim *opt = build_optimizer(o, ddp, &params);
    ct_sampler sampler;
    ct_sampler_options so = {.size = ct_size(d.train_x, 0),
                             .shuffle = true,
                             .seed = o->common.seed,
                             .num_replicas = ranks,
                             .rank = rank};
    ct_loader_options lo = {
        .batch_size = o->common.batch / ranks, .sampler = &sampler, .prefetch = PREFETCH};
    ct_loader *loader =
        opt && !ct_sampler_init(&sampler, &so) ? ct_loader_new(d.train_x, d.train_y, &lo) : NULL;
    if (!loader)
        return -1;
    /* Row k of this rank's batch is row rank + ranks * k of the global
     * batch (the sampler's rule): dropout keyed by it draws each sample's
     * mask as one rank holding the whole batch would. */
    int64_t *batch_rows = malloc(sizeof *batch_rows * (size_t)lo.batch_size);
    if (!batch_rows) {
        ct_seterr(CT_ENOMEM, "out of memory for %lld rows", (long long)lo.batch_size);
        return -1;
    }
    for (int64_t k = 0; k < lo.batch_size; k++)
        batch_rows[k] = rank + (int64_t)ranks * k;
    int64_t steps_per_epoch = ct_loader_num_batches(loader);
    int64_t total = steps_per_epoch * o->common.epochs;
    if (o->common.max_steps > 0 && o->common.max_steps < total)
        total = o->common.max_steps;
    ct_lr_schedule sched = schedule(o, total);
    resumable ckpt = {0};
    int64_t step = 0;
    if (o->resume.dir && (resumable_init(&ckpt, &params, opt, ddp, world) ||
                          (step = resume(&ckpt, o->resume.dir, world, loader, so.size, opt)) < 0))
        return -1;
    int64_t first_epoch = 0, first_offset = 0;
    ct_loader_position(loader, &first_epoch, &first_offset);
    FILE *metrics = NULL;
    int rc = 0;
    bool stopped = false; /* by --stop-at-step */
    if ((*complete = step >= total)) {
        /* Nothing to train: the outputs of the run stay as they are. */
        if (rank == 0)
            printf("fmnist_mlp: the run in %s is complete: step %lld of %lld (%d epochs); "
                   "nothing to train (give more --epochs to go on)\n",
                   o->resume.dir, (long long)step, (long long)total, o->common.epochs);
        goto done;
    }
    if (rank == 0 && *o->metrics &&
        !(metrics = example_metrics_open(o->metrics, step, ckpt.ck.path))) {
        rc = -1;
        goto done;
    }
    char where[32] = "";
    if (!ct_device_equal(o->common.device, CT_DEVICE_CPU)) {
        char dev[CT_DEVICE_STR];
        snprintf(where, sizeof where, ", on %s", ct_device_str(o->common.device, dev));
    }
    if (rank == 0)
        printf("fmnist_mlp: recipe %s, 784-%lld-%lld-10, %lld parameters, batch %lld (%lld per "
               "rank), %d epochs, %d rank%s, %d thread%s each%s\n",
               o->r->name, (long long)o->common.hidden, (long long)o->common.hidden,
               (long long)ct_param_list_numel(&params), (long long)o->common.batch,
               (long long)lo.batch_size, o->common.epochs, ranks, ranks > 1 ? "s" : "",
               o->common.threads, o->common.threads > 1 ? "s" : "", where);
    if (rank == 0 && step > 0)
        printf("fmnist_mlp: resumed from %s at step %lld (epoch %lld, step %lld of it); "
               "training on to step %lld\n",
               ckpt.ck.path, (long long)step, (long long)first_epoch + 1,
               (long long)(first_offset / lo.batch_size), (long long)total);
    fflush(stdout);

    example_progress prog;
    example_progress_init(&prog, o->common.epochs, steps_per_epoch);
    /* Training's peak: the steps', without saves and evaluation. */
    int64_t train_peak = 0;
    ct_memory_reset_peak(o->common.device);
    int64_t timed_samples = 0, timed_steps = 0;
    double timed = 0, start = example_now(), loss_sum = 0, acc = 0, last_loss = NAN,
           epoch_loss = NAN;
    int epochs_run = 0; /* begun, the last one possibly cut short by --max-steps */
    for (int epoch = (int)first_epoch + 1;
         epoch <= o->common.epochs && step < total && !rc && !stopped; epoch++) {
        epochs_run = epoch;
        int64_t in_epoch = epoch == first_epoch + 1 ? first_offset / lo.batch_size : 0;
        int64_t epoch_count = 0;
        loss_sum = 0;
        for (; step < total && !rc; step++) {
            double t0 = example_now();
            ct_scope_begin();
            ct_tensor *x, *y;
            int got = ct_loader_next(loader, &x, &y);
            if (got == 1) {
                rc = ct_optim_set_lr(opt, ct_lr_schedule_at(&sched, step));
                if (!rc)
                    rc = ct_dropout_key_rows(batch_rows, ct_size(x, 0), ct_size(x, 0) * ranks);
                ct_device dev = o->common.device;
                ct_tensor *loss = NULL;
                if (!rc)
                    rc = step_on(net, opt, ct_to(x, dev), ct_to(y, dev), &loss);
                last_loss = rc ? NAN : ct_item(loss);
                loss_sum += last_loss;
                epoch_count++;
                in_epoch++;
            }
            int64_t rows = got == 1 ? ct_size(x, 0) * ranks : 0;
            ct_scope_end();
            if (got < 0)
                rc = got;
            if (got != 1)
                break;
            if (step >= o->warmup_steps) {
                timed += example_now() - t0;
                timed_samples += rows;
                timed_steps++;
            }
            double rate = timed > 0 ? (double)timed_samples / timed : 0;
            double eta = rate > 0 ? (double)(total - step - 1) * (double)o->common.batch / rate : 0;
            if (rank == 0)
                example_progress_show(&prog, epoch, in_epoch, last_loss, rate, eta);
            /* The global batch's loss, which does not depend on the ranks
             * (every rank takes part: *o->metrics is the same on each). */
            double global_loss = last_loss;
            char nb[32];
            if (!rc && *o->metrics && step % o->metrics_every == 0 && ranks > 1) {
                rc = example_allreduce_sum(world, &global_loss, 1);
                global_loss /= ranks;
            }
            if (metrics && step % o->metrics_every == 0)
                fprintf(metrics,
                        "{\"step\":%lld,\"epoch\":%d,\"loss\":%s,\"lr\":%.6g,\"time_s\":%.3f}\n",
                        (long long)step, epoch, example_json_number(nb, global_loss),
                        ct_optim_lr(opt), example_now() - start);
            stopped = step + 1 == o->resume.stop_at_step;
            if (!rc && o->resume.dir &&
                ((o->resume.save_every && (step + 1) % o->resume.save_every == 0) || stopped))
                rc = save(&ckpt, &o->resume, step + 1, loader, ranks);
            if (stopped) {
                step++;
                break;
            }
        }
        int64_t peak = ct_memory_peak(o->common.device);
        train_peak = peak > train_peak ? peak : train_peak;
        /* Every epoch's end, and the end of training, are saved too. */
        if (!rc && o->resume.dir)
            rc = save(&ckpt, &o->resume, step, loader, ranks);
        /* Rank 0 evaluates; fully sharded, every rank first gathers the
         * whole model, and hands it back after. */
        if (!rc && ddp)
            rc = ct_ddp_summon_params(ddp, true);
        if (!rc && rank == 0)
            rc = evaluate(net, o->common.device, d.test_x, d.test_y, &acc);
        if (!rc && ddp)
            rc = ct_ddp_summon_params(ddp, false);
        ct_memory_reset_peak(o->common.device);
        if (rc)
            break;
        if (rank != 0)
            continue;
        double rate = timed > 0 ? (double)timed_samples / timed : 0;
        example_progress_end_epoch(&prog, epoch, in_epoch, last_loss, rate);
        double mean_loss = epoch_count ? loss_sum / (double)epoch_count : NAN;
        epoch_loss = mean_loss;
        example_print_epoch(epoch, mean_loss, acc, rate, example_now() - start);
        if (metrics) {
            char nb[32];
            fprintf(metrics,
                    "{\"epoch\":%d,\"step\":%lld,\"train_loss\":%s,\"test_acc\":%.6f,"
                    "\"samples_per_s\":%.1f,\"time_s\":%.3f}\n",
                    epoch, (long long)step, example_json_number(nb, mean_loss), acc, rate,
                    example_now() - start);
            fflush(metrics);
        }
    }
    if (!rc && ddp)
        example_print_memory("fmnist_mlp", ddp, opt, rank, train_peak);
    if (!rc)
        example_plan_check(&plan, "fmnist_mlp", rank, o->common.device, train_peak);
    if (!rc && rank == 0) {
        char head[64], more[320];
        ct_ddp_memory m;
        example_model_state(ddp, opt, &params, &m);
        snprintf(head, sizeof head, "\"bench\": \"train\", \"impl\": \"ct\", \"ranks\": %d", ranks);
        snprintf(more, sizeof more,
                 "\"timed_steps\": %lld, \"shard\": %d, \"model_state_bytes\": %lld, "
                 "\"staging_bytes\": %lld, \"peak_bytes\": %lld, \"step_peak_bytes\": %lld, "
                 "\"plan_peak_bytes\": %lld, ",
                 (long long)timed_steps, ddp ? o->shard : 0,
                 (long long)(m.params + m.grads + m.optimizer), (long long)m.staging,
                 (long long)train_peak, (long long)(train_peak - plan.base),
                 (long long)example_plan_bytes(&plan, o->common.device));
        example_print_summary(head, more, &o->common, epochs_run, step,
                              timed > 0 ? (double)timed_samples / timed : 0, acc, epoch_loss);
    }
done:
    ct_dropout_key_rows(NULL, 0, 0);
    free(batch_rows);
    if (example_ckpt_finish(&ckpt.ck) && !rc)
        rc = -1;
    if (stopped && rank == 0)
        printf("fmnist_mlp: stopped at step %lld, as --stop-at-step asks; run again to resume\n",
               (long long)step);
    if (metrics && fclose(metrics) && !rc)
        rc = ct_seterr(CT_EIO, "%s: %s", o->metrics, strerror(errno));
    ct_loader_free(loader);
    ct_ddp_free(ddp);
    ct_optim_free(opt);
    ct_param_list_free(&params);
    ct_module_free(net);
    example_data_free(&d);
    return rc;
}

/* Every input and output the run will need, before its first step. */
static int check_inputs(const options *o, int rank) {
    if (o->resume.dir && example_check_dir("--checkpoint-dir", o->resume.dir))
        return -1;
    if (rank == 0 && o->plot && metrics_plot_check(o->plot))
        return -1;
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o))
        return 2;
    if (example_init("fmnist_mlp", &o.common))
        return 1;
    /* --device cuda: the device ct_dist_init chose for this rank. */
    if (o.common.device.index < 0)
        o.common.device = ct_device_current(o.common.device.type);
    int rank = ct_comm_rank(ct_dist_comm());
    bool complete = false;
    int rc = check_inputs(&o, rank);
    if (!rc)
        rc = train(&o, &complete);
    /* On stderr, as the summary ends stdout. */
    if (!rc && !complete && rank == 0 && o.plot) {
        rc = metrics_plot(o.metrics, o.plot, NULL);
        if (!rc)
            fprintf(stderr, "fmnist_mlp: wrote the chart of %s to %s\n", o.metrics, o.plot);
    }
    if (rc < 0)
        fprintf(stderr, "fmnist_mlp: %s\n", ct_errmsg());
    ct_dist_finalize();
    return rc ? (rc < 0 ? 1 : rc) : 0;
}
