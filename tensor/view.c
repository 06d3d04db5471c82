/* Views: new tensor objects over the same storage. */
#include "tensor_impl.h"

static ct_tensor *record_view(ct_op op, ct_tensor *out, ct_tensor *in, const ct_op_args *args) {
    return out ? ct__tensor_record1(op, out, (ct_tensor *[]){in}, 1, args) : NULL;
}

static ct_op_args ints_args(int n, const int64_t *v) {
    ct_op_args a = {.nints = n};
    for (int i = 0; i < n; i++)
        a.ints[i] = v[i];
    return a;
}

/* Resolves one -1 in sizes against numel; CT_ESHAPE if the total differs. */
static int infer_sizes(const char *op, const ct_tensor *t, int ndim, const int64_t *sizes,
                       int64_t *out) {
    char have[CT__DESC_STR], want[CT__SHAPE_STR];
    if (ndim < 0 || ndim > CT_MAX_DIMS || (ndim > 0 && !sizes))
        return ct__err_set(CT_EINVAL, "%s: ndim %d is outside [0, %d]", op, ndim, CT_MAX_DIMS);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        out[i] = sizes[i];
        if (sizes[i] == -1) {
            if (infer >= 0)
                return ct__err_set(CT_EINVAL, "%s: only one dim can be -1 in %s", op,
                                   ct__tensor_shape_str(want, ndim, sizes));
            infer = i;
        } else if (sizes[i] < 0) {
            return ct__err_set(CT_EINVAL, "%s: invalid size %lld in %s", op, (long long)sizes[i],
                               ct__tensor_shape_str(want, ndim, sizes));
        } else {
            known *= sizes[i];
        }
    }
    int64_t numel = ct_numel(t);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return ct__err_set(CT_ESHAPE, "%s: cannot view %s (%lld elements) as %s", op,
                               ct__tensor_desc(have, t), (long long)numel,
                               ct__tensor_shape_str(want, ndim, sizes));
        out[infer] = numel / known;
        known *= out[infer];
    }
    if (known != numel)
        return ct__err_set(CT_ESHAPE, "%s: cannot view %s (%lld elements) as %s (%lld elements)",
                           op, ct__tensor_desc(have, t), (long long)numel,
                           ct__tensor_shape_str(want, ndim, sizes), (long long)known);
    return 0;
}

/* Strides for viewing t with new sizes, if the memory allows it. Old dims
 * are grouped into runs that are contiguous with one another; each run must
 * map onto a whole run of new dims. */
static bool view_strides(const ct_tensor *t, int ndim, const int64_t *sizes, int64_t *strides) {
    if (ct_numel(t) == 0) {
        ct__tensor_contiguous_strides(ndim, sizes, strides);
        return true;
    }
    int64_t old_sizes[CT_MAX_DIMS] = {1}, old_strides[CT_MAX_DIMS] = {1};
    int old_ndim = t->ndim ? t->ndim : 1;
    for (int i = 0; i < t->ndim; i++) {
        old_sizes[i] = t->sizes[i];
        old_strides[i] = t->strides[i];
    }
    int nd = ndim - 1;
    int64_t base = old_strides[old_ndim - 1], run = 1, covered = 1;
    for (int od = old_ndim - 1; od >= 0; od--) {
        run *= old_sizes[od];
        bool run_ends = od == 0 || (old_sizes[od - 1] != 1 && old_strides[od - 1] != run * base);
        if (!run_ends)
            continue;
        while (nd >= 0 && (covered < run || sizes[nd] == 1)) {
            strides[nd] = covered * base;
            covered *= sizes[nd];
            nd--;
        }
        if (covered != run)
            return false;
        if (od > 0) {
            base = old_strides[od - 1];
            run = 1;
            covered = 1;
        }
    }
    return nd == -1;
}

ct_tensor *ct_view(ct_tensor *t, int ndim, const int64_t *sizes) {
    if (CT__CHECK_ANY("view", t))
        return NULL;
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS];
    if (infer_sizes("view", t, ndim, sizes, sz))
        return NULL;
    if (!view_strides(t, ndim, sz, st)) {
        char have[CT__DESC_STR], want[CT__SHAPE_STR];
        ct__err_set(CT_ESHAPE,
                    "view: cannot view %s as %s: its strides do not allow it; use ct_reshape "
                    "(which copies) or ct_contiguous first",
                    ct__tensor_desc(have, t), ct__tensor_shape_str(want, ndim, sz));
        return NULL;
    }
    return record_view(CT_OP_VIEW, ct__tensor_make_view(t, ndim, sz, st, t->offset), t, NULL);
}

ct_tensor *ct_reshape(ct_tensor *t, int ndim, const int64_t *sizes) {
    if (CT__CHECK_ANY("reshape", t))
        return NULL;
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS];
    if (infer_sizes("reshape", t, ndim, sizes, sz))
        return NULL;
    if (view_strides(t, ndim, sz, st))
        return record_view(CT_OP_VIEW, ct__tensor_make_view(t, ndim, sz, st, t->offset), t, NULL);
    /* The copy is a temporary: a private scope releases it and keeps only
     * the view. */
    ct_scope_begin();
    ct_tensor *v = ct_keep(ct_view(ct_clone(t), ndim, sz));
    ct_scope_end();
    return v;
}

ct_tensor *ct_flatten(ct_tensor *t, int start_dim, int end_dim) {
    if (CT__CHECK_ANY("flatten", t))
        return NULL;
    int s = ct__tensor_wrap_dim("flatten", start_dim, t->ndim),
        e = ct__tensor_wrap_dim("flatten", end_dim, t->ndim);
    if (s < 0 || e < 0)
        return NULL;
    if (t->ndim == 0)
        return ct_reshape(t, CT_SHAPE(1));
    if (s > e) {
        ct__err_set(CT_EINVAL, "flatten: start_dim %d comes after end_dim %d", start_dim, end_dim);
        return NULL;
    }
    int64_t sizes[CT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++)
        sizes[n++] = t->sizes[i];
    sizes[n++] = ct__tensor_numel(e - s + 1, t->sizes + s);
    for (int i = e + 1; i < t->ndim; i++)
        sizes[n++] = t->sizes[i];
    return ct_reshape(t, n, sizes);
}

ct_tensor *ct_permute(ct_tensor *t, const int *dims) {
    if (CT__CHECK_ANY("permute", t))
        return NULL;
    if (!dims && t->ndim > 0) {
        ct__err_set(CT_EINVAL, "permute: dims is NULL");
        return NULL;
    }
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS], perm[CT_MAX_DIMS];
    bool seen[CT_MAX_DIMS] = {false};
    for (int i = 0; i < t->ndim; i++) {
        int d = ct__tensor_wrap_dim("permute", dims[i], t->ndim);
        if (d < 0)
            return NULL;
        if (seen[d]) {
            ct__err_set(CT_EINVAL, "permute: dim %d appears twice in the permutation", d);
            return NULL;
        }
        seen[d] = true;
        perm[i] = d;
        sz[i] = t->sizes[d];
        st[i] = t->strides[d];
    }
    ct_op_args a = ints_args(t->ndim, perm);
    return record_view(CT_OP_PERMUTE, ct__tensor_make_view(t, t->ndim, sz, st, t->offset), t, &a);
}

ct_tensor *ct_transpose(ct_tensor *t, int dim0, int dim1) {
    if (CT__CHECK_ANY("transpose", t))
        return NULL;
    int d0 = ct__tensor_wrap_dim("transpose", dim0, t->ndim),
        d1 = ct__tensor_wrap_dim("transpose", dim1, t->ndim);
    if (d0 < 0 || d1 < 0)
        return NULL;
    int perm[CT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    return ct_permute(t, perm);
}

ct_tensor *ct_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    if (CT__CHECK_ANY("slice", t))
        return NULL;
    if (t->ndim == 0) {
        ct__err_set(CT_EINVAL, "slice: cannot slice a 0-d tensor");
        return NULL;
    }
    int d = ct__tensor_wrap_dim("slice", dim, t->ndim);
    if (d < 0)
        return NULL;
    if (step <= 0) {
        ct__err_set(CT_EINVAL, "slice: step must be positive (got %lld)", (long long)step);
        return NULL;
    }
    int64_t n = t->sizes[d];
    /* Python's clamping: negative positions count from the end, then both
     * ends are clamped into [0, n]. */
    if (start < 0)
        start += n;
    if (end < 0)
        end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        sz[i] = t->sizes[i];
        st[i] = t->strides[i];
    }
    sz[d] = (end - start + step - 1) / step;
    st[d] = t->strides[d] * step;
    ct_op_args a = ints_args(4, (int64_t[]){d, start, end, step});
    return record_view(CT_OP_SLICE,
                       ct__tensor_make_view(t, t->ndim, sz, st, t->offset + start * t->strides[d]),
                       t, &a);
}

ct_tensor *ct_narrow(ct_tensor *t, int dim, int64_t start, int64_t length) {
    if (CT__CHECK_ANY("narrow", t))
        return NULL;
    int d = ct__tensor_wrap_dim("narrow", dim, t->ndim);
    if (d < 0)
        return NULL;
    int64_t n = t->ndim ? t->sizes[d] : 1;
    if (start < 0)
        start += n;
    if (start < 0 || length < 0 || start + length > n) {
        char desc[CT__DESC_STR];
        ct__err_set(CT_ERANGE, "narrow: [%lld, %lld) is outside dim %d of %s", (long long)start,
                    (long long)(start + length), d, ct__tensor_desc(desc, t));
        return NULL;
    }
    return ct_slice(t, d, start, start + length, 1);
}

ct_tensor *ct_select(ct_tensor *t, int dim, int64_t index) {
    if (CT__CHECK_ANY("select", t))
        return NULL;
    if (t->ndim == 0) {
        ct__err_set(CT_EINVAL, "select: cannot select from a 0-d tensor");
        return NULL;
    }
    int d = ct__tensor_wrap_dim("select", dim, t->ndim);
    if (d < 0)
        return NULL;
    int64_t n = t->sizes[d];
    if (index < -n || index >= n) {
        char desc[CT__DESC_STR];
        ct__err_set(CT_ERANGE, "select: index %lld is out of range for dim %d of %s",
                    (long long)index, d, ct__tensor_desc(desc, t));
        return NULL;
    }
    if (index < 0)
        index += n;
    ct_tensor v = ct__tensor_select_view(t, d, index);
    ct_op_args a = ints_args(2, (int64_t[]){d, index});
    return record_view(CT_OP_SELECT, ct__tensor_make_view(t, v.ndim, v.sizes, v.strides, v.offset),
                       t, &a);
}

ct_tensor *ct_expand(ct_tensor *t, int ndim, const int64_t *sizes) {
    if (CT__CHECK_ANY("expand", t))
        return NULL;
    char have[CT__DESC_STR], want[CT__SHAPE_STR];
    if (ndim < t->ndim || ndim > CT_MAX_DIMS || (ndim > 0 && !sizes)) {
        ct__err_set(CT_EINVAL, "expand: cannot expand %s to %d dims", ct__tensor_desc(have, t),
                    ndim);
        return NULL;
    }
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int td = i - lead;
        int64_t cur = td < 0 ? 1 : t->sizes[td];
        int64_t want_size = sizes[i] == -1 && td >= 0 ? cur : sizes[i];
        if (want_size < 0 || (cur != want_size && cur != 1)) {
            ct__err_set(CT_ESHAPE, "expand: cannot expand %s to %s (dim %d: %lld to %lld)",
                        ct__tensor_desc(have, t), ct__tensor_shape_str(want, ndim, sizes), i,
                        (long long)cur, (long long)sizes[i]);
            return NULL;
        }
        sz[i] = want_size;
        st[i] = td < 0 || cur != want_size ? 0 : t->strides[td];
    }
    return record_view(CT_OP_EXPAND, ct__tensor_make_view(t, ndim, sz, st, t->offset), t, NULL);
}

/* Removes the dims flagged in drop. */
static ct_tensor *squeeze_dims(ct_tensor *t, const bool *drop, int dim_arg) {
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (drop[i])
            continue;
        sz[n] = t->sizes[i];
        st[n++] = t->strides[i];
    }
    ct_op_args a = ints_args(1, (int64_t[]){dim_arg});
    return record_view(dim_arg >= 0 ? CT_OP_SQUEEZE : CT_OP_VIEW,
                       ct__tensor_make_view(t, n, sz, st, t->offset), t, dim_arg >= 0 ? &a : NULL);
}

ct_tensor *ct_squeeze(ct_tensor *t, int dim) {
    if (CT__CHECK_ANY("squeeze", t))
        return NULL;
    int d = ct__tensor_wrap_dim("squeeze", dim, t->ndim);
    if (d < 0)
        return NULL;
    bool drop[CT_MAX_DIMS] = {false};
    if (t->ndim > 0)
        drop[d] = t->sizes[d] == 1;
    return squeeze_dims(t, drop, d);
}

ct_tensor *ct_squeeze_all(ct_tensor *t) {
    if (CT__CHECK_ANY("squeeze_all", t))
        return NULL;
    bool drop[CT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        drop[i] = t->sizes[i] == 1;
    return squeeze_dims(t, drop, -1);
}

ct_tensor *ct_unsqueeze(ct_tensor *t, int dim) {
    if (CT__CHECK_ANY("unsqueeze", t))
        return NULL;
    if (t->ndim == CT_MAX_DIMS) {
        ct__err_set(CT_EINVAL, "unsqueeze: tensor already has the maximum of %d dims", CT_MAX_DIMS);
        return NULL;
    }
    int d = ct__tensor_wrap_dim("unsqueeze", dim, t->ndim + 1);
    if (d < 0)
        return NULL;
    int64_t sz[CT_MAX_DIMS], st[CT_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            sz[i] = 1;
            st[i] = d < t->ndim ? t->sizes[d] * t->strides[d] : 1;
        } else {
            sz[i] = t->sizes[j];
            st[i] = t->strides[j++];
        }
    }
    ct_op_args a = ints_args(1, (int64_t[]){d});
    return record_view(CT_OP_UNSQUEEZE, ct__tensor_make_view(t, t->ndim + 1, sz, st, t->offset), t,
                       &a);
}

int ct_split(ct_tensor *t, int64_t split_size, int dim, ct_tensor **out, int cap) {
    if (CT__CHECK_ANY("split", t))
        return ct_errcode();
    if (t->ndim == 0)
        return ct__err_set(CT_EINVAL, "split: cannot split a 0-d tensor");
    int d = ct__tensor_wrap_dim("split", dim, t->ndim);
    if (d < 0)
        return CT_EINVAL;
    if (split_size <= 0)
        return ct__err_set(CT_EINVAL, "split: split_size must be positive (got %lld)",
                           (long long)split_size);
    int64_t n = t->sizes[d];
    int64_t pieces = n == 0 ? 1 : (n + split_size - 1) / split_size;
    if (pieces > INT32_MAX)
        return ct__err_set(CT_EINVAL, "split: %lld pieces is too many", (long long)pieces);
    for (int64_t i = 0; i < pieces && i < cap; i++) {
        int64_t start = i * split_size;
        out[i] = ct_narrow(t, d, start, start + split_size > n ? n - start : split_size);
        if (!out[i])
            return ct_errcode();
    }
    return (int)pieces;
}
