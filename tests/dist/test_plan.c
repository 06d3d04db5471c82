/* ct_memory_plan: a training run replayed on the meta device. In one
 * process the replay makes exactly the run's allocations, so the planned
 * peak is the measured one to the byte; over a dry communicator the stages'
 * plans follow the ZeRO accounting and each other's order. The multi-rank
 * plans are checked against real ranks in test_example_gpt (--plan). */
#include "ct_test.h"

#include <ct/dist.h>
#include <ct/optim.h>

#define BATCH 8
#define STEPS 3

typedef struct run {
    ct_gpt_config cfg;
    ct_ddp_shard shard;
    bool fail_build; /* build fails, naming itself */
    double clip;
} run;

static ct_module *build(void *ctx) {
    const run *r = ctx;
    if (r->fail_build) {
        ct_seterr(CT_ENOMEM, "build: the test's model does not fit");
        return NULL;
    }
    ct_module *m = ct_gpt_new(&r->cfg);
    if (m && r->shard != CT_DDP_SHARD_FULL && ct_module_flatten(m, true)) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

static ct_ddp *wrap(void *ctx, ct_comm *comm, ct_module *model) {
    const run *r = ctx;
    ct_ddp_options o = ct_ddp_defaults();
    o.shard = r->shard;
    ct_module *h = ct_module_child(ct_module_child(model, "transformer"), "h");
    ct_module *units[8];
    o.nunits = ct_module_num_children(h);
    for (int k = 0; k < o.nunits; k++)
        units[k] = ct_module_child_at(h, k);
    o.units = units;
    return ct_ddp_new(comm, model, &o);
}

static ct_optim *optimizer(void *ctx, ct_module *model, ct_ddp *ddp) {
    (void)ctx;
    ct_param_list pl;
    ct_param_list_init(&pl);
    ct_optim *opt = NULL;
    ct_optim_options oo = ct_optim_defaults(CT_OPTIM_ADAMW, 1e-3);
    if (!ct_module_named_parameters(model, &pl)) {
        ct_param_group all = {pl.tensors, pl.n, 0, 1};
        opt = ddp ? ct_ddp_optim_new(ddp, &oo, &all, 1) : ct_optim_new_groups(&oo, &all, 1);
    }
    ct_param_list_free(&pl);
    return opt;
}

static int step_with(const run *r, ct_module *model, ct_ddp *ddp, ct_optim *opt, ct_tensor *x,
                     ct_tensor *y) {
    ct_tensor *logits = ct_module_forward(model, x);
    ct_tensor *loss = ct_cross_entropy(ct_reshape(logits, CT_SHAPE(-1, r->cfg.vocab)),
                                       ct_reshape(y, CT_SHAPE(-1)), NULL);
    CT_TRY(loss ? ct_tensor_backward(loss) : ct_errcode());
    if (r->clip > 0 && ddp)
        CT_TRY(ct_ddp_clip_grad_norm(ddp, opt, r->clip, 2, NULL));
    CT_TRY(ct_optim_step(opt));
    return ct_optim_zero_grad(opt, ddp == NULL);
}

static int step(void *ctx, ct_module *model, ct_ddp *ddp, ct_optim *opt, ct_device device) {
    const run *r = ctx;
    ct_tensor *x = ct_empty_on(CT_SHAPE(BATCH, r->cfg.context), CT_INT64, device);
    ct_tensor *y = ct_empty_on(CT_SHAPE(BATCH, r->cfg.context), CT_INT64, device);
    return x && y ? step_with(r, model, ddp, opt, x, y) : ct_errcode();
}

static run small_gpt(bool checkpoint) {
    return (run){.cfg = {.vocab = 65,
                         .context = 32,
                         .layers = 3,
                         .heads = 4,
                         .width = 64,
                         .dropout = 0.1,
                         .checkpoint = checkpoint}};
}

static ct_memory_plan_config config(run *r, int world, int rank) {
    return (ct_memory_plan_config){.world_size = world,
                                   .rank = rank,
                                   .build = build,
                                   .wrap = wrap,
                                   .optimizer = optimizer,
                                   .step = step,
                                   .ctx = r,
                                   .steps = STEPS};
}

/* The same run for real, on the CPU: its step peak above what was held
 * before the model was built, and what it holds after the steps. */
static int measure(run *r, int64_t *peak, int64_t *resident) {
    int64_t base = ct_memory_allocated(CT_DEVICE_CPU);
    ct_module *m = build(r);
    ct_optim *opt = m ? optimizer(r, m, NULL) : NULL;
    int rc = opt ? 0 : ct_errcode();
    ct_memory_reset_peak(CT_DEVICE_CPU);
    for (int s = 0; s < STEPS && !rc; s++) {
        ct_scope_begin();
        ct_tensor *x = ct_zeros(CT_SHAPE(BATCH, r->cfg.context), CT_INT64);
        ct_tensor *y = ct_zeros(CT_SHAPE(BATCH, r->cfg.context), CT_INT64);
        /* The batch is made before the peak counts it, as the plan's is. */
        rc = x && y ? step_with(r, m, NULL, opt, x, y) : ct_errcode();
        ct_scope_end();
    }
    *peak = ct_memory_peak(CT_DEVICE_CPU) - base;
    *resident = ct_memory_allocated(CT_DEVICE_CPU) - base;
    ct_optim_free(opt);
    ct_module_free(m);
    return rc;
}

TEST(a_plan_of_one_process_is_its_run_to_the_byte) {
    for (int c = 0; c < 2; c++) {
        run r = small_gpt(c == 1);
        ct_memory_plan_config cfg = config(&r, 1, 0);
        ct_memory_estimate e;
        ASSERT_EQ(ct_memory_plan(&cfg, &e), 0);
        int64_t peak, resident;
        ASSERT_EQ(measure(&r, &peak, &resident), 0);
        ASSERT_EQ(e.peak + e.host, peak);
        ASSERT_EQ(e.resident + e.host, resident);
        ASSERT_TRUE(e.host > 0 && e.host < 1024);
        /* AdamW in float32: 4 bytes of parameters, 4 of gradients and 8 of
         * moments per parameter, which the steps leave in place, and the
         * optimizer's step counts, on the host. */
        ASSERT_EQ(e.state.grads, e.state.params);
        ASSERT_EQ(e.state.optimizer, 2 * e.state.params + e.host);
        ASSERT_TRUE(e.resident >= e.state.params * 4);
        ASSERT_TRUE(e.peak > e.resident);
    }
}

TEST(checkpointing_plans_less_than_keeping_activations) {
    run kept = small_gpt(false), recomputed = small_gpt(true);
    ct_memory_plan_config a = config(&kept, 1, 0), b = config(&recomputed, 1, 0);
    ct_memory_estimate ea, eb;
    ASSERT_EQ(ct_memory_plan(&a, &ea), 0);
    ASSERT_EQ(ct_memory_plan(&b, &eb), 0);
    ASSERT_EQ(ea.resident, eb.resident);
    ASSERT_TRUE(eb.peak - eb.resident < (ea.peak - ea.resident) * 3 / 4);
}

/* Model state per parameter on N ranks, against DDP's 16 bytes: the ZeRO
 * accounting (stage 1: 4 + 4 + 8/N, stage 2: 4 + (4 + 8)/N, stage 3:
 * 16/N), within a few percent for the shards' rounding and ZeRO-2's
 * staging. */
TEST(the_stages_plans_follow_the_zero_accounting) {
    static const double per_param[4][2] = {{16, 0}, {8, 8}, {4, 12}, {0, 16}};
    for (int world = 2; world <= 4; world += 2) {
        int64_t peaks[4];
        int64_t n = 0;
        for (int stage = 0; stage < 4; stage++) {
            run r = small_gpt(false);
            r.shard = (ct_ddp_shard)stage;
            r.clip = 1.0;
            ct_memory_plan_config cfg = config(&r, world, 0);
            ct_memory_estimate e;
            ASSERT_EQ(ct_memory_plan(&cfg, &e), 0);
            if (stage == 0)
                n = e.state.params / 4;
            double state = (double)(e.state.params + e.state.grads + e.state.optimizer);
            double want = (double)n * (per_param[stage][0] + per_param[stage][1] / world);
            ASSERT_NEAR(state / want, 1.0, 0.05);
            peaks[stage] = e.peak;
        }
        for (int stage = 1; stage < 4; stage++)
            ASSERT_TRUE(peaks[stage] < peaks[stage - 1]);
    }
}

TEST(a_plan_leaves_the_generator_and_the_meta_device_as_they_were) {
    ct_manual_seed(5);
    ct_generator before = *ct_default_generator();
    int64_t held = ct_memory_allocated(CT_DEVICE_META);
    int64_t host = ct_memory_allocated(CT_DEVICE_CPU);
    ct_memory_reset_peak(CT_DEVICE_CPU);
    run r = small_gpt(false);
    r.shard = CT_DDP_SHARD_FULL;
    ct_memory_plan_config cfg = config(&r, 2, 1);
    ct_memory_estimate e;
    ASSERT_EQ(ct_memory_plan(&cfg, &e), 0);
    ASSERT_EQ(ct_default_generator()->seed, before.seed);
    ASSERT_EQ(ct_default_generator()->offset, before.offset);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_META), held);
    /* Nothing of the model's on the host: a few small host buffers at most
     * (data parallel's agreement checks). */
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_CPU), host);
    ASSERT_TRUE(e.host > 0 && e.host < 1024);
    ASSERT_TRUE(ct_memory_peak(CT_DEVICE_CPU) - host < 64 << 10);
    ASSERT_TRUE(e.setup_peak > 0);
}

static ct_optim *no_optimizer(void *ctx, ct_module *model, ct_ddp *ddp) {
    (void)ctx, (void)model, (void)ddp;
    return NULL;
}

TEST(bad_configs_and_failing_callbacks_are_reported) {
    run r = small_gpt(false);
    ct_memory_estimate e;
    int64_t held = ct_memory_allocated(CT_DEVICE_META);
    ASSERT_RC(ct_memory_plan(NULL, &e), CT_EINVAL, "cfg is NULL");
    ct_memory_plan_config cfg = config(&r, 2, 0);
    ASSERT_RC(ct_memory_plan(&cfg, NULL), CT_EINVAL, "out is NULL");
    cfg.step = NULL;
    ASSERT_RC(ct_memory_plan(&cfg, &e), CT_EINVAL, "needs build, optimizer and step");
    cfg = config(&r, 2, 2);
    ASSERT_RC(ct_memory_plan(&cfg, &e), CT_EINVAL, "rank 2 of 2 ranks");
    cfg = config(&r, 0, 0);
    ASSERT_RC(ct_memory_plan(&cfg, &e), CT_EINVAL, "world_size >= 1");
    r.fail_build = true;
    cfg = config(&r, 2, 0);
    ASSERT_RC(ct_memory_plan(&cfg, &e), CT_ENOMEM, "the test's model does not fit");
    r.fail_build = false;
    cfg = config(&r, 2, 0);
    cfg.optimizer = no_optimizer;
    ASSERT_RC(ct_memory_plan(&cfg, &e), CT_EINVAL, "optimizer returned NULL without an error");
    /* The failed replay freed what it made. */
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_META), held);
}
