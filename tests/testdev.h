/* The test device, CT_DEVICE_TEST (docs/cuda-design.md, "The test
 * device"): a dispatch table (device_impl.h) that runs the CPU's kernels
 * over a heap of its own, mapped PROT_NONE except while the device runs
 * its work. A tensor there is a device tensor as a GPU's is: host code
 * that reads it without a copy through the table faults, which is what
 * makes every device path of ct testable without a GPU.
 *
 * It keeps CUDA's stream model, strictly: a kernel entry queues its work
 * on the device's compute stream, which runs only when the host waits for
 * it (synchronize, read, a copy to the host, a scan whose answer the host
 * needs), so a missing wait shows every time, not when a GPU is slow. A
 * ct_to_async to the host returns a tensor filled with NaN bytes (0xff)
 * until the stream runs. Memory is freed in stream order, and a storage
 * freed while a side stream (testdev_stream) still has work queued that
 * uses it, unless record_stream marked it, aborts the process naming the
 * mistake: CUDA's allocator would reuse that memory under the work.
 *
 * Threads: every function and entry may be called from any thread; the
 * work queued on a stream runs in order, on whichever thread waits for it.
 * testdev_register() is called once, before tensors are made there. */
#ifndef TESTDEV_H
#define TESTDEV_H

#include "device_impl.h"

/* The table, writable, so that a test can register a broken one on
 * purpose (a kernel for the wrong op) and see the comparison catch it. */
extern ct__device_ops testdev_ops;

/* Registers testdev_ops as CT_TEST's table: 0 or a CT_E* code. */
int testdev_register(void);

/* Waits for the compute stream (the table's synchronize): 0, or the error
 * of a queued kernel that failed. */
int testdev_synchronize(void);

/* Bytes the device has mapped: its tensors' (ct_memory_allocated), and
 * those of storages freed whose memory queued work still holds. */
int64_t testdev_memory_held(void);

/* A side stream, standing in for a collective's (NCCL's) stream. */
typedef struct testdev_stream testdev_stream;

/* A new side stream; NULL with CT_ENOMEM (63 may live at once). */
testdev_stream *testdev_stream_new(void);
/* Queues fn(ctx) on s, behind the work queued on the compute stream by now
 * (as a collective's stream waits on ct's), as work that uses the memory of
 * the n tensors in uses: fn may read and write it (through pointers taken
 * with ct_data_ptr) when it runs. 0 or CT_ENOMEM. */
int testdev_stream_launch(testdev_stream *s, ct_tensor *const *uses, int n, void (*fn)(void *ctx),
                          void *ctx);
/* Runs the work queued on s: 0. */
int testdev_stream_synchronize(testdev_stream *s);
/* Runs s's work, then frees s; accepts NULL. */
void testdev_stream_free(testdev_stream *s);

#endif
