/* libFuzzer target: the safetensors parser on arbitrary bytes.
 *
 * Besides not crashing, leaking or invoking undefined behaviour (ASan,
 * LeakSanitizer and UBSan watch), the parser must keep its promises: a
 * failure is CT_ECORRUPT, CT_ENOTSUP or CT_ENOMEM with no dict and a
 * message that names the input; a success is a dict of contiguous tensors
 * with unique non-empty names whose bytes add up to exactly the data after
 * the header. A broken promise aborts, which libFuzzer reports as a crash. */
#include "safetensors_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHAT "fuzz-input"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_safetensors: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ct_errclear();
    ct_tensor_dict *d = NULL;
    int rc = ct__safetensors_parse(data, size, WHAT, &d);
    if (rc != 0) {
        if (d)
            broken("a failed parse returned a dict");
        if (rc != CT_ECORRUPT && rc != CT_ENOTSUP && rc != CT_ENOMEM)
            broken("a failed parse returned a code other than ECORRUPT, ENOTSUP or ENOMEM");
        if (rc != ct_errcode() || !strstr(ct_errmsg(), "safetensors: " WHAT ": "))
            broken("the error message does not name the input");
        return 0;
    }
    if (!d || size < 8)
        broken("a successful parse returned no dict");
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--)
        header = header << 8 | data[i];
    uint64_t bytes = 0;
    for (int i = 0; i < ct_tensor_dict_count(d); i++) {
        const char *name = ct_tensor_dict_name(d, i);
        ct_tensor *t = ct_tensor_dict_tensor(d, i);
        if (!name || !name[0] || !t || ct_tensor_dict_find(d, name) != t)
            broken("a tensor's name is empty or does not find it");
        if (!ct_is_contiguous(t))
            broken("a loaded tensor is not contiguous");
        bytes += (uint64_t)ct_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    }
    if (bytes != size - 8 - header)
        broken("the tensors do not add up to the data after the header");
    for (int i = 0; i < ct_tensor_dict_num_meta(d); i++) {
        const char *k, *v;
        if (ct_tensor_dict_meta_at(d, i, &k, &v) != 0 || ct_tensor_dict_meta(d, k) != v)
            broken("a metadata key does not find its value");
    }
    ct_tensor_dict_free(d);
    return 0;
}
