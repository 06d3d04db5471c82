/* Initializers, with PyTorch's fan and gain conventions. */
#include "nn_impl.h"

#include <math.h>

/* PyTorch's _calculate_fan_in_and_fan_out. */
static int fans(const char *op, const ct_tensor *t, double *fan_in, double *fan_out) {
    char desc[CT__DESC_STR];
    if (t->ndim < 2)
        return ct__err_set(CT_EINVAL, "%s: fans need a tensor with at least 2 dims, got %s", op,
                           ct__tensor_desc(desc, t));
    double field = 1;
    for (int d = 2; d < t->ndim; d++)
        field *= (double)t->sizes[d];
    *fan_in = (double)t->sizes[1] * field;
    *fan_out = (double)t->sizes[0] * field;
    return 0;
}

/* Draws into t with grad mode off: initialisation is not part of a graph. */
static ct_tensor *draw(ct_tensor *t, bool normal, double a, double b, ct_generator *gen) {
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *r = normal ? ct_normal_(t, a, b, gen) : ct_uniform_(t, a, b, gen);
    ct_set_grad_enabled(prev);
    return r;
}

static ct_tensor *kaiming(const char *op, ct_tensor *t, double a, ct_fan_mode mode, bool normal,
                          ct_generator *gen) {
    double in = 0, out = 0;
    if (CT__CHECK_ANY(op, t) || fans(op, t, &in, &out))
        return NULL;
    double fan = mode == CT_FAN_OUT ? out : in;
    double std = sqrt(2.0 / (1 + a * a)) / sqrt(fan > 0 ? fan : 1);
    double bound = sqrt(3.0) * std;
    return normal ? draw(t, true, 0, std, gen) : draw(t, false, -bound, bound, gen);
}

ct_tensor *ct_init_kaiming_uniform_(ct_tensor *t, double a, ct_fan_mode mode, ct_generator *gen) {
    return kaiming("init_kaiming_uniform_", t, a, mode, false, gen);
}

ct_tensor *ct_init_kaiming_normal_(ct_tensor *t, double a, ct_fan_mode mode, ct_generator *gen) {
    return kaiming("init_kaiming_normal_", t, a, mode, true, gen);
}

static ct_tensor *xavier(const char *op, ct_tensor *t, double gain, bool normal,
                         ct_generator *gen) {
    double in = 0, out = 0;
    if (CT__CHECK_ANY(op, t) || fans(op, t, &in, &out))
        return NULL;
    double std = gain * sqrt(2.0 / (in + out > 0 ? in + out : 1));
    double bound = sqrt(3.0) * std;
    return normal ? draw(t, true, 0, std, gen) : draw(t, false, -bound, bound, gen);
}

ct_tensor *ct_init_xavier_uniform_(ct_tensor *t, double gain, ct_generator *gen) {
    return xavier("init_xavier_uniform_", t, gain, false, gen);
}

ct_tensor *ct_init_xavier_normal_(ct_tensor *t, double gain, ct_generator *gen) {
    return xavier("init_xavier_normal_", t, gain, true, gen);
}

ct_tensor *ct_init_uniform_(ct_tensor *t, double lo, double hi, ct_generator *gen) {
    return draw(t, false, lo, hi, gen);
}

ct_tensor *ct_init_normal_(ct_tensor *t, double mean, double std, ct_generator *gen) {
    return draw(t, true, mean, std, gen);
}

ct_tensor *ct_init_constant_(ct_tensor *t, double value) {
    bool prev = ct_set_grad_enabled(false);
    ct_scope_begin();
    /* The value on t's own device: a model built there (ct_nn_set_device)
     * copies within it. */
    ct_tensor *r = ct_copy_(t, ct_full_on(0, NULL, value, CT_FLOAT64, ct_tensor_device(t)));
    ct_scope_end();
    ct_set_grad_enabled(prev);
    return r;
}

ct_tensor *ct_init_zeros_(ct_tensor *t) { return ct_init_constant_(t, 0); }
