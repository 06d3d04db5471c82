/* The test device, CT_DEVICE_TEST (docs/cuda-design.md, "The test
 * device"): a dispatch table (device_impl.h) that runs the CPU's kernels
 * over a heap of its own, mapped PROT_NONE except while one of its entries
 * runs. A tensor there is a device tensor as a GPU's is: host code that
 * reads it without a copy through the table faults, which is what makes
 * every device path of ct testable without a GPU.
 *
 * Threads: entries may run on any thread at once (the memory is open while
 * any runs). testdev_register() is called once, before tensors are made
 * there. */
#ifndef TESTDEV_H
#define TESTDEV_H

#include "device_impl.h"

/* The table, writable, so that a test can register a broken one on
 * purpose (a kernel for the wrong op) and see the comparison catch it. */
extern ct__device_ops testdev_ops;

/* Registers testdev_ops as CT_TEST's table: 0 or a CT_E* code. */
int testdev_register(void);

#endif
