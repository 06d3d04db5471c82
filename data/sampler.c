/* The sampler: which rows each rank sees in each epoch (ct/data.h states the
 * rules). It lives in caller storage and holds no memory, so it can be copied
 * into a loader or a checkpoint as a plain value; each epoch's order is
 * recomputed from (seed, epoch, size) when asked for. */
#include <ct/data.h>

#include "base_impl.h"

#define SAMPLER_MAGIC 0x63745331u /* "ctS1" */

static int check(const char *fn, const ct_sampler *s) {
    if (!s || s->magic != SAMPLER_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: sampler %p is not initialised (call ct_sampler_init)",
                           fn, (const void *)s);
    return 0;
}

int ct_sampler_init(ct_sampler *s, const ct_sampler_options *opts) {
    if (!s || !opts)
        return ct__err_set(CT_EINVAL,
                           "sampler_init: sampler (%p) and options (%p) must not be NULL",
                           (void *)s, (const void *)opts);
    s->magic = 0;
    ct_sampler_options o = *opts;
    if (o.num_replicas == 0)
        o.num_replicas = 1;
    if (o.size < 0)
        return ct__err_set(CT_EINVAL, "sampler_init: size is %lld; expected >= 0",
                           (long long)o.size);
    if (o.num_replicas < 0)
        return ct__err_set(CT_EINVAL, "sampler_init: num_replicas is %d; expected >= 1 (0 means 1)",
                           o.num_replicas);
    if (o.rank < 0 || o.rank >= o.num_replicas)
        return ct__err_set(CT_EINVAL,
                           "sampler_init: rank is %d; expected 0 <= rank < num_replicas (%d)",
                           o.rank, o.num_replicas);
    int64_t r = o.num_replicas;
    s->opts = o;
    s->num_samples = o.size / r + (!o.drop_last && o.size % r != 0);
    s->epoch = 0;
    s->offset = 0;
    s->magic = SAMPLER_MAGIC;
    return 0;
}

int64_t ct_sampler_len(const ct_sampler *s) {
    return check("sampler_len", s) ? -1 : s->num_samples;
}

int ct_sampler_indices(const ct_sampler *s, int64_t epoch, int64_t *out) {
    int rc = check("sampler_indices", s);
    if (rc)
        return rc;
    if (epoch < 0)
        return ct__err_set(CT_EINVAL, "sampler_indices: epoch is %lld; expected >= 0",
                           (long long)epoch);
    if (!out)
        return ct__err_set(CT_EINVAL, "sampler_indices: out is NULL");
    const int64_t n = s->opts.size, r = s->opts.num_replicas, rank = s->opts.rank;
    /* Element k of the padded order is element k % n of the epoch's order:
     * that is DistributedSampler's wrap-around padding, and with drop_last
     * the positions never reach n. */
    if (!s->opts.shuffle) {
        for (int64_t j = 0; j < s->num_samples; j++)
            out[j] = (rank + r * j) % n;
        return 0;
    }
    /* An inner scope owns the permutation whichever scope the caller is in
     * and whichever thread this is. */
    ct_scope_begin();
    ct_tensor *perm = ct_randperm(n, &(ct_generator){s->opts.seed, (uint64_t)epoch << 32});
    if (perm) {
        const int64_t *p = ct_data_ptr(perm);
        for (int64_t j = 0; j < s->num_samples; j++)
            out[j] = p[(rank + r * j) % n];
    } else {
        rc = ct__err_set(ct_errcode(), "sampler_indices: epoch %lld of %lld rows: %s",
                         (long long)epoch, (long long)n, ct_errmsg());
    }
    ct_scope_end();
    return rc;
}

static int set_position(const char *fn, ct_sampler *s, int64_t epoch, int64_t offset) {
    int rc = check(fn, s);
    if (rc)
        return rc;
    if (epoch < 0)
        return ct__err_set(CT_EINVAL, "%s: epoch is %lld; expected >= 0", fn, (long long)epoch);
    if (offset < 0 || offset > s->num_samples)
        return ct__err_set(CT_ERANGE,
                           "%s: offset %lld is outside [0, %lld], the indices rank %d of %d gets "
                           "per epoch",
                           fn, (long long)offset, (long long)s->num_samples, s->opts.rank,
                           s->opts.num_replicas);
    s->epoch = epoch;
    s->offset = offset;
    return 0;
}

int ct_sampler_set_epoch(ct_sampler *s, int64_t epoch) {
    return set_position("sampler_set_epoch", s, epoch, 0);
}

int ct_sampler_set_position(ct_sampler *s, int64_t epoch, int64_t offset) {
    return set_position("sampler_set_position", s, epoch, offset);
}

int ct_sampler_position(const ct_sampler *s, int64_t *epoch, int64_t *offset) {
    int rc = check("sampler_position", s);
    if (rc)
        return rc;
    if (epoch)
        *epoch = s->epoch;
    if (offset)
        *offset = s->offset;
    return 0;
}
