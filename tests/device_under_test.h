/* The device that the test_cuda*.c programs run their cases on: the first
 * CUDA device or, compiled with DUT_TESTDEV (the test_cuda*_testdev
 * programs), the test device (testdev.h), so that every case also runs
 * without a GPU, with the same assertions. Cases of CUDA's own API (its
 * caching allocator, pinned memory, TF32, the current device per thread)
 * sit in #if DUT_CUDA blocks. Without a CUDA device the CUDA programs exit
 * 77 (skipped). */
#ifndef DEVICE_UNDER_TEST_H
#define DEVICE_UNDER_TEST_H

#include <ct/cuda.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef DUT_TESTDEV
#include "testdev.h"

#define DUT_CUDA 0
#define DUT_TYPE CT_TEST
/* The device's type, and the device, as messages name them
 * (ct_device_str). */
#define DUT_TYPE_NAME "test"

static inline int dut_synchronize(void) { return testdev_synchronize(); }

__attribute__((constructor)) static void dut_open(void) {
    if (testdev_register()) {
        fprintf(stderr, "cannot register the test device: %s\n", ct_errmsg());
        abort();
    }
}
#else
#define DUT_CUDA      1
#define DUT_TYPE      CT_CUDA
#define DUT_TYPE_NAME "cuda"

static inline int dut_synchronize(void) { return ct_cuda_synchronize(0); }

__attribute__((constructor)) static void dut_open(void) {
    if (ct_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n", ct_cuda_unavailable_reason());
        exit(77);
    }
}
#endif

#define DUT_NAME DUT_TYPE_NAME ":0"

static const ct_device dut = {DUT_TYPE, 0};

#endif
