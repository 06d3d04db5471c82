/* Tensors on a device pass through host memory: a save reads their values
 * into a host copy, a load writes a host buffer into them. */
#include "checkpoint_impl.h"

#include <ct/cuda.h>

ct_tensor *ct__ckpt_on_host(ct_tensor *t) {
    if (ct__is_host(ct_tensor_device(t)))
        return ct_tensor_retain(t);
    return ct__tensor_own(ct_to(t, CT_DEVICE_CPU));
}

int ct__ckpt_write_from_host(ct_tensor *dst, ct_tensor *host) {
    if (ct__is_host(ct_tensor_device(dst))) {
        ct__cpu_copy_into(dst, host);
        return 0;
    }
    /* ct__tensor_copy_any copies on one device: the bytes cross first, then land
     * in dst's strides there, queued behind the work already on its
     * stream. */
    ct_tensor *on = ct__tensor_own(ct_to(host, ct_tensor_device(dst)));
    int rc = on ? ct__tensor_copy_any(dst, on) : ct_errcode();
    ct_tensor_free(on);
    return rc;
}
