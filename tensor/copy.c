/* Copies and dtype conversion, on any device and between the host and
 * one. */
#include "device_impl.h"
#include "tensor_impl.h"

#include <ct/cuda.h> /* ct_to and ct_to_async are declared with the devices */

typedef struct memcpy_job {
    char *dst;
    const char *src;
} memcpy_job;

static void memcpy_chunk(void *arg, int64_t lo, int64_t hi) {
    const memcpy_job *j = arg;
    memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo));
}

void ct__cpu_copy_into(ct_tensor *dst, ct_tensor *src) {
    if (dst->dtype == src->dtype && ct_is_contiguous(dst) && ct_is_contiguous(src) &&
        ct__same_shape(dst, src)) {
        memcpy_job j = {ct__data(dst), ct__data(src)};
        int64_t bytes = ct_numel(dst) * (int64_t)ct_dtype_size(dst->dtype);
        ct_parallel_for(0, bytes, CT__GRAIN_ELEMENTWISE * 8, memcpy_chunk, &j);
        return;
    }
    ct__iter it;
    ct__iter_init(&it, (ct_tensor *[]){dst, src}, 2, dst->ndim, dst->sizes);
    ct__iter_run(&it, ct__cpu_cast_kernel(dst->dtype, src->dtype), NULL, CT__GRAIN_ELEMENTWISE);
}

int ct__tensor_copy_any(ct_tensor *dst, ct_tensor *src) {
    /* Across the host and a device, the device's copy moves the bytes. */
    ct_device on = ct__is_host(dst->storage->device) ? src->storage->device : dst->storage->device;
    const ct__device_ops *ops = CT__DEVICE_GET("copy_", on, copy);
    return ops ? ops->copy(dst, src) : ct_errcode();
}

/* ct_to and ct_to_async: the device side's own transfer when it has one
 * (CUDA: pinned memory, streams), else a contiguous copy through its
 * copy. */
static ct_tensor *to_device(const char *fn, ct_tensor *t, ct_device device, bool async) {
    if (CT__CHECK_ANY(fn, t))
        return NULL;
    ct_device from = t->storage->device;
    if (from.type == device.type && (ct__is_host(device) || from.index == device.index))
        return ct__tensor_scope_own(ct_tensor_retain(t));
    const ct__device_ops *ops = CT__DEVICE_GET(fn, ct__is_host(device) ? from : device, copy);
    if (!ops)
        return NULL;
    /* Two device types do not know each other's memory. */
    if (!ct__is_host(device) && !ct__is_host(from) && from.type != device.type) {
        char a[32], b[32];
        ct__err_set(CT_EDEVICE, "%s: from %s to %s directly: copy through the host", fn,
                    ct__device_name(from.type, a), ct__device_name(device.type, b));
        return NULL;
    }
    if (ops->to)
        return ops->to(fn, t, device, async);
    ct_tensor *src = ct_contiguous(t);
    ct_tensor *out = src ? ct__tensor_new_on(fn, src->ndim, src->sizes, src->dtype, device) : NULL;
    int rc = out ? ct__tensor_copy_any(out, src) : ct_errcode();
    ct__tensor_release(src);
    if (rc && out) {
        ct__tensor_release(out);
        out = NULL;
    }
    return out;
}

ct_tensor *ct_to(ct_tensor *t, ct_device device) { return to_device("ct_to", t, device, false); }

ct_tensor *ct_to_async(ct_tensor *t, ct_device device) {
    return to_device("ct_to_async", t, device, true);
}

int ct__tensor_fill_any(ct_tensor *t, double value) {
    const ct__device_ops *ops = CT__DEVICE_GET("fill", t->storage->device, fill);
    return ops ? ops->fill(t, value) : ct_errcode();
}

ct_tensor *ct_copy_(ct_tensor *dst, ct_tensor *src) {
    if (CT__CHECK_ANY("copy_", dst, src) ||
        ct__tensor_check_same_device("copy_", (ct_tensor *[]){dst, src}, 2))
        return NULL;
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (ct__tensor_broadcast_shapes("copy_", dst->ndim, dst->sizes, src->ndim, src->sizes, &nd,
                                    shape))
        return NULL;
    bool fits = nd == dst->ndim;
    for (int i = 0; fits && i < nd; i++)
        fits = shape[i] == dst->sizes[i];
    if (!fits) {
        char d[CT__DESC_STR], s[CT__DESC_STR];
        ct__err_set(CT_ESHAPE, "copy_: source %s does not broadcast to destination %s",
                    ct__tensor_desc(s, src), ct__tensor_desc(d, dst));
        return NULL;
    }
    if (ct__tensor_check_inplace(CT_OP_COPY, "copy_", dst, (ct_tensor *[]){src}, 1) ||
        ct__tensor_copy_any(dst, src))
        return NULL;
    return ct__tensor_record(CT_OP_COPY, (ct_tensor *[]){dst, src}, 2, (ct_tensor *[]){dst}, 1,
                             true, NULL);
}

ct_tensor *ct_clone(ct_tensor *t) {
    if (CT__CHECK_ANY("clone", t))
        return NULL;
    ct_tensor *out = ct__tensor_new_on("clone", t->ndim, t->sizes, t->dtype, t->storage->device);
    if (!out || ct__tensor_copy_any(out, t))
        return NULL;
    return ct__tensor_record1(CT_OP_CLONE, out, (ct_tensor *[]){t}, 1, NULL);
}

ct_tensor *ct_contiguous(ct_tensor *t) {
    if (CT__CHECK_ANY("contiguous", t))
        return NULL;
    if (ct_is_contiguous(t))
        return ct__tensor_scope_own(ct_tensor_retain(t));
    return ct_clone(t);
}

ct_tensor *ct_to_dtype(ct_tensor *t, ct_dtype dtype) {
    if (CT__CHECK_ANY("to_dtype", t))
        return NULL;
    if ((unsigned)dtype >= CT_NDTYPES) {
        ct__err_set(CT_EINVAL, "to_dtype: invalid dtype %d", (int)dtype);
        return NULL;
    }
    if (t->dtype == dtype)
        return ct__tensor_scope_own(ct_tensor_retain(t));
    ct_tensor *out = ct__tensor_new_on("to_dtype", t->ndim, t->sizes, dtype, t->storage->device);
    if (!out || ct__tensor_copy_any(out, t))
        return NULL;
    return ct__tensor_record1(CT_OP_TO_DTYPE, out, (ct_tensor *[]){t}, 1, NULL);
}
