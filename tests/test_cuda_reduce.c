/* Placeholder, replaced by the reduce family's device tests. */
#include "ct_test.h"

#include <ct/cuda.h>
#include <stdlib.h>

TEST(a_device_is_present) { ASSERT_TRUE(ct_cuda_device_count() > 0); }

__attribute__((constructor)) static void require_device(void) {
    if (ct_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n", ct_cuda_unavailable_reason());
        exit(77);
    }
}
