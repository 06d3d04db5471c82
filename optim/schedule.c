/* Learning-rate schedules as closed forms of the step. Each follows the
 * closed form in PyTorch 1.13's lr_scheduler.py (_get_closed_form_lr, or
 * get_lr where there is none, as for OneCycleLR), with the operations in the
 * same order so that the rates agree to the last bit or two. */
#include "optim_impl.h"

#include <math.h>

#define PI 3.14159265358979323846

static int bad(const char *what, double value, const char *expected) {
    return ct__err_set(CT_EINVAL, "lr_schedule: %s %g is invalid; expected %s", what, value,
                       expected);
}

static bool finite_pos(double x) { return x > 0 && isfinite(x); }

static int check_kind(const ct_lr_schedule *s) {
    switch (s->kind) {
    case CT_LR_CONSTANT: return 0;
    case CT_LR_STEP:
        if (s->step_size <= 0)
            return bad("step_size", (double)s->step_size, "> 0");
        return finite_pos(s->gamma) ? 0 : bad("gamma", s->gamma, "a finite value > 0");
    case CT_LR_MULTISTEP:
        if (s->nmilestones < 0 || (s->nmilestones > 0 && !s->milestones))
            return ct__err_set(CT_EINVAL, "lr_schedule: %d milestones at %p", s->nmilestones,
                               (const void *)s->milestones);
        for (int i = 1; i < s->nmilestones; i++)
            if (s->milestones[i] < s->milestones[i - 1])
                return ct__err_set(CT_EINVAL,
                                   "lr_schedule: milestones[%d] = %lld comes after %lld; expected "
                                   "nondecreasing milestones",
                                   i, (long long)s->milestones[i], (long long)s->milestones[i - 1]);
        return finite_pos(s->gamma) ? 0 : bad("gamma", s->gamma, "a finite value > 0");
    case CT_LR_EXPONENTIAL:
        return finite_pos(s->gamma) ? 0 : bad("gamma", s->gamma, "a finite value > 0");
    case CT_LR_COSINE:
        if (s->total_steps <= 0)
            return bad("total_steps", (double)s->total_steps, "> 0 (PyTorch's T_max)");
        return isfinite(s->eta_min) ? 0 : bad("eta_min", s->eta_min, "a finite rate");
    case CT_LR_ONECYCLE:
        if (s->total_steps <= 0)
            return bad("total_steps", (double)s->total_steps, "> 0");
        if (!(s->pct_start >= 0 && s->pct_start <= 1))
            return bad("pct_start", s->pct_start, "a value in [0, 1] (PyTorch's default is 0.3)");
        if (!finite_pos(s->div_factor))
            return bad("div_factor", s->div_factor, "a finite value > 0 (PyTorch's default is 25)");
        if (!finite_pos(s->final_div_factor))
            return bad("final_div_factor", s->final_div_factor,
                       "a finite value > 0 (PyTorch's default is 1e4)");
        return 0;
    }
    return ct__err_set(CT_EINVAL, "lr_schedule: kind %d is not a ct_lr_schedule_kind",
                       (int)s->kind);
}

int ct_lr_schedule_check(const ct_lr_schedule *s) {
    if (!s)
        return ct__err_set(CT_EINVAL, "lr_schedule: the schedule is NULL");
    if (!(s->base_lr >= 0 && isfinite(s->base_lr)))
        return bad("base_lr", s->base_lr, "a finite rate >= 0");
    if (s->warmup_steps < 0)
        return bad("warmup_steps", (double)s->warmup_steps, ">= 0");
    if (s->warmup_steps > 0 && !(s->warmup_start_factor >= 0 && s->warmup_start_factor <= 1))
        return bad("warmup_start_factor", s->warmup_start_factor, "a factor in [0, 1]");
    return check_kind(s);
}

/* PyTorch's _annealing_cos. */
static double anneal_cos(double start, double end, double pct) {
    double cos_out = cos(PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
}

/* OneCycleLR.get_lr with two phases. A phase that spans no steps (pct_start
 * * total_steps == 1 puts the peak at step 0) yields its end value where
 * Python would divide by zero. */
static double one_cycle(const ct_lr_schedule *s, int64_t step) {
    double max_lr = s->base_lr, initial = max_lr / s->div_factor;
    double min_lr = initial / s->final_div_factor;
    double end1 = s->pct_start * (double)s->total_steps - 1, end2 = (double)s->total_steps - 1;
    double t = (double)(step < s->total_steps ? step : s->total_steps - 1);
    if (t <= end1)
        return anneal_cos(initial, max_lr, end1 > 0 ? t / end1 : 1);
    return anneal_cos(max_lr, min_lr, (t - end1) / (end2 - end1));
}

static double main_rate(const ct_lr_schedule *s, int64_t step) {
    switch (s->kind) {
    case CT_LR_CONSTANT: break;
    case CT_LR_STEP: return s->base_lr * pow(s->gamma, (double)(step / s->step_size));
    case CT_LR_MULTISTEP: {
        int passed = 0;
        while (passed < s->nmilestones && s->milestones[passed] <= step)
            passed++;
        return s->base_lr * pow(s->gamma, passed);
    }
    case CT_LR_EXPONENTIAL: return s->base_lr * pow(s->gamma, (double)step);
    case CT_LR_COSINE: {
        /* PyTorch's closed form rises again after T_max; training scripts
         * mean to stay at eta_min. */
        int64_t t = step < s->total_steps ? step : s->total_steps;
        return s->eta_min +
               (s->base_lr - s->eta_min) * (1 + cos(PI * (double)t / (double)s->total_steps)) / 2;
    }
    case CT_LR_ONECYCLE: return one_cycle(s, step);
    }
    return s->base_lr;
}

double ct_lr_schedule_at(const ct_lr_schedule *s, int64_t step) {
    if (ct_lr_schedule_check(s))
        return NAN;
    if (step < 0) {
        ct__err_set(CT_EINVAL, "lr_schedule: step %lld is negative", (long long)step);
        return NAN;
    }
    if (step >= s->warmup_steps)
        return main_rate(s, step - s->warmup_steps);
    /* LinearLR's closed form, from start_factor to 1 over warmup_steps. */
    double f = s->warmup_start_factor;
    return main_rate(s, 0) * (f + (1 - f) * (double)step / (double)s->warmup_steps);
}
