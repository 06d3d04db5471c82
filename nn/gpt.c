/* Transformer blocks and the GPT that stacks them (GPT-2's layout, with the
 * parameter names of nanoGPT, so that a PyTorch state dict of that model
 * loads by name). */
#include "nn_impl.h"

#include <ct/cuda.h>

#include <math.h>
#include <stdlib.h>

typedef struct block_config {
    int64_t width, heads;
    double dropout;
} block_config;

static block_config *config_new(int64_t width, int64_t heads, double dropout) {
    block_config *c = malloc(sizeof *c);
    if (c)
        *c = (block_config){width, heads, dropout};
    else
        ct__err_set(CT_ENOMEM, "transformer: out of memory");
    return c;
}

/* Adds kids[i] to m under names[i], taking each (m NULL: frees them);
 * frees m and returns NULL on the first failure. */
static ct_module *with_children(ct_module *m, const char *const *names, ct_module *const *kids,
                                int n) {
    int rc = m ? 0 : ct_errcode();
    for (int i = 0; i < n; i++) {
        if (rc)
            ct_module_free(kids[i]);
        else
            rc = ct_module_add_child(m, names[i], kids[i]);
    }
    if (rc) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* x [B, T, width] or fails with CT_ESHAPE naming the block. */
static int check_input(ct_module *m, ct_tensor *x, int64_t width) {
    if (!x)
        return ct_errcode();
    if (ct_ndim(x) == 3 && ct_size(x, 2) == width)
        return 0;
    char dx[CT__DESC_STR];
    return ct__err_set(CT_ESHAPE, "%s '%s': expected input [B, T, %lld], got %s", ct_module_type(m),
                       ct_module_path(m), (long long)width, ct__tensor_desc(dx, x));
}

/* ------------------------------------------------------------ attention */

static ct_tensor *attention_forward(ct_module *m, ct_tensor *x) {
    const block_config *c = ct_module_state(m);
    if (check_input(m, x, c->width))
        return NULL;
    ct_attention_options o = {.causal = true, .dropout_p = ct_module_training(m) ? c->dropout : 0};
    ct_tensor *y =
        ct__nn_attention_packed(ct_module_forward(ct_module_child(m, "c_attn"), x), c->heads, &o);
    y = ct_module_forward(ct_module_child(m, "c_proj"), y);
    return ct_dropout(y, c->dropout, ct_module_training(m), NULL);
}

static int check_block(const char *op, int64_t width, int64_t heads, double dropout) {
    if (width > 0 && heads > 0 && width % heads == 0 && dropout >= 0 && dropout <= 1)
        return 0;
    return ct__err_set(CT_EINVAL,
                       "%s: expected width > 0 divisible by heads > 0 and dropout in [0, 1], got "
                       "width %lld, heads %lld, dropout %g",
                       op, (long long)width, (long long)heads, dropout);
}

ct_module *ct_causal_self_attention_new(int64_t width, int64_t heads, double dropout) {
    if (check_block("causal_self_attention_new", width, heads, dropout))
        return NULL;
    block_config *c = config_new(width, heads, dropout);
    ct_module *m = c ? ct_module_new("CausalSelfAttention", attention_forward, c, free) : NULL;
    return with_children(
        m, (const char *[]){"c_attn", "c_proj"},
        (ct_module *[]){ct_linear_new(width, 3 * width, true), ct_linear_new(width, width, true)},
        2);
}

/* ------------------------------------------------------------------ MLP */

static ct_tensor *mlp_forward(ct_module *m, ct_tensor *x) {
    const block_config *c = ct_module_state(m);
    if (check_input(m, x, c->width))
        return NULL;
    ct_tensor *h = ct_gelu_tanh(ct_module_forward(ct_module_child(m, "c_fc"), x));
    ct_tensor *y = ct_module_forward(ct_module_child(m, "c_proj"), h);
    return ct_dropout(y, c->dropout, ct_module_training(m), NULL);
}

ct_module *ct_mlp_new(int64_t width, int64_t hidden, double dropout) {
    if (check_block("mlp_new", width, 1, dropout))
        return NULL;
    if (hidden <= 0) {
        ct__err_set(CT_EINVAL, "mlp_new: hidden must be > 0, got %lld", (long long)hidden);
        return NULL;
    }
    block_config *c = config_new(width, 1, dropout);
    ct_module *m = c ? ct_module_new("MLP", mlp_forward, c, free) : NULL;
    return with_children(
        m, (const char *[]){"c_fc", "c_proj"},
        (ct_module *[]){ct_linear_new(width, hidden, true), ct_linear_new(hidden, width, true)}, 2);
}

/* ---------------------------------------------------------------- block */

static ct_tensor *block_forward(ct_module *m, ct_tensor *x) {
    const block_config *c = ct_module_state(m);
    if (check_input(m, x, c->width))
        return NULL;
    ct_tensor *a = ct_module_forward(ct_module_child(m, "attn"),
                                     ct_module_forward(ct_module_child(m, "ln_1"), x));
    x = ct_add(x, a);
    ct_tensor *f = ct_module_forward(ct_module_child(m, "mlp"),
                                     ct_module_forward(ct_module_child(m, "ln_2"), x));
    return ct_add(x, f);
}

ct_module *ct_transformer_block_new(int64_t width, int64_t heads, double dropout) {
    if (check_block("transformer_block_new", width, heads, dropout))
        return NULL;
    block_config *c = config_new(width, heads, dropout);
    ct_module *m = c ? ct_module_new("Block", block_forward, c, free) : NULL;
    return with_children(m, (const char *[]){"ln_1", "attn", "ln_2", "mlp"},
                         (ct_module *[]){ct_layer_norm_new(width, 1e-5),
                                         ct_causal_self_attention_new(width, heads, dropout),
                                         ct_layer_norm_new(width, 1e-5),
                                         ct_mlp_new(width, 4 * width, dropout)},
                         4);
}

/* ------------------------------------------------------------------ GPT */

static int run_block(void *block, ct_tensor *const *in, int nin, ct_tensor **out, int nout) {
    (void)nin;
    (void)nout;
    out[0] = ct_module_forward(block, in[0]);
    return out[0] ? 0 : ct_errcode();
}

static ct_tensor *gpt_forward(ct_module *m, ct_tensor *idx) {
    const ct_gpt_config *c = ct_module_state(m);
    char di[CT__DESC_STR];
    if (!idx)
        return NULL;
    if (ct_ndim(idx) != 2 || ct_dtype_is_float(ct_tensor_dtype(idx)) ||
        ct_size(idx, 1) > c->context) {
        ct__err_set(CT_ESHAPE, "GPT: expected integer token ids [B, T] with T <= %lld, got %s",
                    (long long)c->context, ct__tensor_desc(di, idx));
        return NULL;
    }
    ct_module *tr = ct_module_child(m, "transformer"), *h = ct_module_child(tr, "h");
    ct_tensor *wte = ct_module_param(ct_module_child(tr, "wte"), "weight");
    ct_tensor *pos =
        ct_to(ct_arange(0, (double)ct_size(idx, 1), 1, CT_INT64), ct_tensor_device(idx));
    ct_tensor *x =
        ct_add(ct_embedding(idx, wte), ct_module_forward(ct_module_child(tr, "wpe"), pos));
    x = ct_dropout(x, c->dropout, ct_module_training(m), NULL);
    bool checkpoint = c->checkpoint && ct_module_training(m) && ct_grad_enabled();
    for (int i = 0; x && i < ct_module_num_children(h); i++) {
        ct_module *block = ct_module_child_at(h, i);
        if (!checkpoint) {
            /* A block's intermediates that backward does not keep (all of
             * them without a graph) are freed at its end, not the
             * caller's: inference holds one block's at a time. */
            ct_scope_begin();
            x = ct_keep(ct_module_forward(block, x));
            ct_scope_end();
            continue;
        }
        ct_tensor *y;
        x = ct_activation_checkpoint(run_block, block, &x, 1, &y, 1) ? NULL : y;
    }
    x = ct_module_forward(ct_module_child(tr, "ln_f"), x);
    /* The output head is the token embedding (weight tying). */
    return ct_linear(x, wte, NULL);
}

/* GPT-2's initialisation: N(0, 0.02) for every matrix and embedding, the
 * projections into the residual stream scaled down by sqrt(2 layers) so
 * that its variance does not grow with depth; zero biases; layer norms at
 * ones and zeros. */
static int gpt_init(ct_module *m, int64_t layers) {
    ct_param_list pl;
    ct_param_list_init(&pl);
    int rc = ct_module_named_parameters(m, &pl);
    size_t proj = strlen("c_proj.weight");
    for (int i = 0; i < pl.n && !rc; i++) {
        const char *name = pl.names[i];
        size_t len = strlen(name);
        bool is_proj = len >= proj && !strcmp(name + len - proj, "c_proj.weight");
        ct_tensor *t = pl.tensors[i];
        if (strstr(name, "ln_"))
            continue;
        if (ct_ndim(t) == 1)
            t = ct_init_zeros_(t);
        else
            t = ct_init_normal_(t, 0, is_proj ? 0.02 / sqrt(2.0 * (double)layers) : 0.02, NULL);
        rc = t ? 0 : ct_errcode();
    }
    ct_param_list_free(&pl);
    return rc;
}

ct_module *ct_gpt_new(const ct_gpt_config *cfg) {
    if (!cfg) {
        ct__err_set(CT_EINVAL, "gpt_new: the config is NULL");
        return NULL;
    }
    if (cfg->vocab <= 0 || cfg->context <= 0 || cfg->layers < 0) {
        ct__err_set(CT_EINVAL,
                    "gpt_new: expected vocab > 0, context > 0 and layers >= 0, got %lld, %lld "
                    "and %lld",
                    (long long)cfg->vocab, (long long)cfg->context, (long long)cfg->layers);
        return NULL;
    }
    if (check_block("gpt_new", cfg->width, cfg->heads, cfg->dropout))
        return NULL;
    ct_gpt_config *c = malloc(sizeof *c);
    if (!c) {
        ct__err_set(CT_ENOMEM, "gpt_new: out of memory");
        return NULL;
    }
    *c = *cfg;
    ct_module *h = ct_sequential_new();
    for (int64_t i = 0; i < cfg->layers && h; i++)
        if (ct_sequential_append(h,
                                 ct_transformer_block_new(cfg->width, cfg->heads, cfg->dropout))) {
            ct_module_free(h);
            h = NULL;
        }
    ct_module *tr = with_children(ct_module_new("ModuleDict", NULL, NULL, NULL),
                                  (const char *[]){"wte", "wpe", "h", "ln_f"},
                                  (ct_module *[]){ct_embedding_new(cfg->vocab, cfg->width),
                                                  ct_embedding_new(cfg->context, cfg->width), h,
                                                  ct_layer_norm_new(cfg->width, 1e-5)},
                                  4);
    ct_module *m = with_children(ct_module_new("GPT", gpt_forward, c, free),
                                 (const char *[]){"transformer"}, &tr, 1);
    if (m && gpt_init(m, cfg->layers)) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}
