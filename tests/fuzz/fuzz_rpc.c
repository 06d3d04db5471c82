/* libFuzzer target: the RPC wire decoder on arbitrary bytes, as a worker
 * receives them from anyone who can reach its socket.
 *
 * The input is cut into frames: a u16 length and that many bytes of
 * description, then frames of a u32 length and their bytes until the input
 * ends. Besides not crashing, leaking or invoking undefined behaviour, the
 * decoder must keep its promises: a failure is CT_ECORRUPT or CT_ENOMEM
 * with no values, every frame left to its owner; a success describes every
 * frame, each tensor exactly the size of its frame. A broken promise
 * aborts, which libFuzzer reports as a crash. */
#include "rpc_impl.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_FUZZ_FRAMES 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_rpc: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

static int released;
static void release(void *data, void *ctx) {
    (void)data;
    (void)ctx;
    released++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ct_errclear();
    if (size < 2)
        return 0;
    size_t desc_len = (size_t)data[0] | (size_t)data[1] << 8;
    if (desc_len > size - 2)
        return 0;
    const uint8_t *desc = data + 2, *p = desc + desc_len, *end = data + size;
    rpc_frame frames[MAX_FUZZ_FRAMES];
    uint32_t n = 0;
    while (end - p >= 4 && n < MAX_FUZZ_FRAMES) {
        uint32_t len =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        p += 4;
        if (len > (size_t)(end - p))
            len = (uint32_t)(end - p);
        frames[n++] = (rpc_frame){(void *)p, len, release, NULL, false};
        p += len;
    }
    released = 0;
    char fn[RPC_NAME_MAX + 1];
    ct_rpc_args *out = (ct_rpc_args *)1;
    int rc = ct__rpc_decode_call(desc, desc_len, frames, n, fn, &out);
    if (rc) {
        if (out)
            broken("a failed decode returned values");
        if (rc != CT_ECORRUPT && rc != CT_ENOMEM)
            broken("a failed decode returned a code other than ECORRUPT or ENOMEM");
        int taken = 0;
        for (uint32_t i = 0; i < n; i++)
            taken += frames[i].taken;
        if (released != taken)
            broken("a failed decode kept a frame it had taken");
        return 0;
    }
    uint32_t tensors = 0;
    for (int i = 0; i < ct_rpc_args_count(out); i++) {
        if (ct_rpc_args_type(out, i) != CT_RPC_TENSOR)
            continue;
        ct_tensor *t = ct_rpc_args_tensor(out, i);
        if ((size_t)ct_numel(t) * ct_dtype_size(ct_tensor_dtype(t)) != frames[tensors].len)
            broken("a tensor is not the size of its frame");
        tensors++;
    }
    if (tensors != n)
        broken("a decode left frames undescribed");
    ct_rpc_args_free(out);
    if (released != (int)n)
        broken("the tensors did not give their frames back");
    return 0;
}
