/* Printing tensors readably: nested brackets, abbreviated when large. */
#include "device_impl.h"
#include "tensor_impl.h"

#include <ct/cuda.h>

#include <math.h>

#define EDGE         3    /* items shown at each end of an abbreviated dim */
#define SUMMARIZE_AT 1000 /* numel above which dims are abbreviated */

typedef struct printer {
    FILE *f;
    const ct_tensor *t;
    bool summarize;
    bool sci;  /* floats in scientific notation */
    int width; /* every element padded to this width */
    bool failed;
} printer;

static double elem(const ct_tensor *t, int64_t off) {
    return ct__tensor_load_double(t->dtype, ct__data(t) + off * (int64_t)ct_dtype_size(t->dtype));
}

static int format_elem(const printer *p, char *buf, size_t cap, double v) {
    if (p->t->dtype == CT_BOOL)
        return snprintf(buf, cap, "%s", v != 0 ? "true" : "false");
    if (!ct_dtype_is_float(p->t->dtype))
        return snprintf(buf, cap, "%lld", (long long)v);
    if (isnan(v))
        return snprintf(buf, cap, "nan");
    if (isinf(v))
        return snprintf(buf, cap, v > 0 ? "inf" : "-inf");
    return snprintf(buf, cap, p->sci ? "%.4e" : "%.4f", v);
}

/* Visits every element that will be shown, so that the width and the
 * notation can be chosen before printing. */
static void scan(printer *p, int dim, int64_t off, double *maxabs, double *minabs, int *width) {
    const ct_tensor *t = p->t;
    if (dim == t->ndim) {
        double v = elem(t, off);
        if (isfinite(v)) {
            if (fabs(v) > *maxabs)
                *maxabs = fabs(v);
            if (v != 0 && fabs(v) < *minabs)
                *minabs = fabs(v);
        }
        char buf[64];
        int w = format_elem(p, buf, sizeof buf, v);
        if (w > *width)
            *width = w;
        return;
    }
    int64_t n = t->sizes[dim];
    for (int64_t i = 0; i < n; i++) {
        if (p->summarize && n > 2 * EDGE && i == EDGE)
            i = n - EDGE;
        scan(p, dim + 1, off + i * t->strides[dim], maxabs, minabs, width);
    }
}

static void put(printer *p, const char *s) {
    if (fputs(s, p->f) < 0)
        p->failed = true;
}

static void emit(printer *p, int dim, int64_t off, int indent) {
    const ct_tensor *t = p->t;
    char buf[64];
    if (dim == t->ndim) {
        format_elem(p, buf, sizeof buf, elem(t, off));
        if (fprintf(p->f, "%*s", p->width, buf) < 0)
            p->failed = true;
        return;
    }
    put(p, "[");
    int64_t n = t->sizes[dim];
    for (int64_t i = 0; i < n; i++) {
        if (i > 0) {
            put(p, ",");
            if (dim == t->ndim - 1) {
                put(p, " ");
            } else {
                /* A blank line between blocks of 3-d and higher. */
                for (int k = dim; k < t->ndim - 2; k++)
                    put(p, "\n");
                fprintf(p->f, "\n%*s", indent + dim + 1, "");
            }
        }
        if (p->summarize && n > 2 * EDGE && i == EDGE) {
            put(p, "...");
            i = n - EDGE - 1;
            continue;
        }
        emit(p, dim + 1, off + i * t->strides[dim], indent);
    }
    put(p, "]");
}

static int fprint_host(FILE *f, const ct_tensor *t, ct_device device);

int ct_tensor_fprint(FILE *f, const ct_tensor *t) {
    if (!f)
        return ct__err_set(CT_EINVAL, "tensor_fprint: FILE is NULL");
    if (CT__CHECK_ANY("tensor_fprint", (ct_tensor *)t))
        return ct_errcode();
    if (ct__is_host(t->storage->device))
        return fprint_host(f, t, CT_DEVICE_CPU);
    /* A device tensor prints from a host copy, which its strides then
     * describe. */
    ct_scope_begin();
    ct_tensor *host = ct_to((ct_tensor *)t, CT_DEVICE_CPU);
    int rc = host ? fprint_host(f, host, t->storage->device) : ct_errcode();
    ct_scope_end();
    return rc;
}

static int fprint_host(FILE *f, const ct_tensor *t, ct_device device) {
    printer p = {.f = f, .t = t, .summarize = ct_numel(t) > SUMMARIZE_AT};
    static const char prefix[] = "tensor(";
    put(&p, prefix);
    if (ct_numel(t) > 0) {
        double maxabs = 0, minabs = INFINITY;
        int width = 0;
        scan(&p, 0, 0, &maxabs, &minabs, &width);
        if (ct_dtype_is_float(t->dtype) && (maxabs >= 1e8 || (minabs < 1e-4 && minabs > 0))) {
            p.sci = true;
            width = 0;
            scan(&p, 0, 0, &maxabs, &minabs, &width);
        }
        p.width = width;
        emit(&p, 0, 0, (int)sizeof prefix - 1);
    } else {
        put(&p, "[]");
    }
    char shape[CT__SHAPE_STR], strides[CT__SHAPE_STR];
    char where[CT_DEVICE_STR + 16] = "", dev[CT_DEVICE_STR];
    if (!ct__is_host(device))
        snprintf(where, sizeof where, ", device=%s", ct_device_str(device, dev));
    if (fprintf(f, ", shape=%s, dtype=%s, strides=%s%s)\n",
                ct__tensor_shape_str(shape, t->ndim, t->sizes), ct_dtype_name(t->dtype),
                ct__tensor_shape_str(strides, t->ndim, t->strides), where) < 0)
        p.failed = true;
    return p.failed ? ct__err_set(CT_EIO, "tensor_fprint: write failed") : 0;
}

void ct_print(const ct_tensor *t) {
    if (ct_tensor_fprint(stdout, t) != 0)
        fprintf(stdout, "tensor(<error: %s>)\n", ct_errmsg());
}
