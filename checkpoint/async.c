/* ct_checkpointer: saves that write in the background while training goes
 * on. The foreground plans (one exchange) and copies this rank's chunks into
 * staging memory; a thread writes and commits over the checkpointer's own
 * communicator, so that its exchanges never interleave with the training
 * loop's collectives. */
#include "checkpoint_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CHECKPOINTER_MAGIC 0x63744173u /* "ctAs" */
#define HUGE_PAGE          ((uintptr_t)2 << 20)

struct ct_checkpointer {
    uint32_t magic;
    ct_comm *comm; /* owned: split from the caller's; NULL for one process */
    ct_storage *staging;
    /* The save in flight. */
    bool running;
    pthread_t thread;
    char *path;
    ck_plan plan;
    ct_checkpoint_options opts;
    int result;
    char *message; /* the background thread's error message */
};

static int check(const ct_checkpointer *ck, const char *fn) {
    if (!ck)
        return ct__err_set(CT_EINVAL, "%s: the checkpointer is NULL", fn);
    if (ck->magic != CHECKPOINTER_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live ct_checkpointer (freed or foreign)", fn,
                           (const void *)ck);
    return 0;
}

ct_checkpointer *ct_checkpointer_new(ct_comm *comm) {
    ct_checkpointer *ck = calloc(1, sizeof *ck);
    if (!ck) {
        ct__err_set(CT_ENOMEM, "ct_checkpointer_new: out of memory");
        return NULL;
    }
    if (comm && ct_comm_split(comm, 0, ct_comm_rank(comm), &ck->comm) != 0) {
        free(ck);
        return NULL;
    }
    ck->magic = CHECKPOINTER_MAGIC;
    ck->plan.file = -1;
    return ck;
}

static void *background(void *arg) {
    ct_checkpointer *ck = arg;
    ck->result = ct__ckpt_save_write(ck->path, &ck->plan, ck->comm, &ck->opts);
    /* Messages are per thread: carry this one over to whoever waits. */
    if (ck->result)
        ck->message = strdup(ct_errmsg());
    return NULL;
}

int ct_checkpointer_wait(ct_checkpointer *ck) {
    int rc = check(ck, "ct_checkpointer_wait");
    if (rc || !ck->running)
        return rc;
    pthread_join(ck->thread, NULL);
    ck->running = false;
    ct__ckpt_plan_free(&ck->plan);
    free(ck->path);
    ck->path = NULL;
    rc = ck->result;
    if (rc)
        ct__err_set(rc, "%s", ck->message ? ck->message : "checkpoint save failed");
    free(ck->message);
    ck->message = NULL;
    return rc;
}

void ct_checkpointer_free(ct_checkpointer *ck) {
    if (!ck)
        return;
    CT_ASSERT(ck->magic == CHECKPOINTER_MAGIC && "ct_checkpointer_free: not a live checkpointer");
    ct_checkpointer_wait(ck);
    ct_storage_free(ck->staging);
    ct_comm_free(ck->comm);
    ck->magic = 0;
    free(ck);
}

int64_t ct_checkpointer_staging_bytes(const ct_checkpointer *ck) {
    int rc = check(ck, "ct_checkpointer_staging_bytes");
    return rc ? rc : ck->staging ? (int64_t)ct_storage_nbytes(ck->staging) : 0;
}

/* Bytes of staging the plan's chunks take. */
static int64_t staging_need(const ck_plan *plan) {
    int64_t need = 0;
    for (int i = 0; i < plan->nsources; i++)
        need += (ct_numel(plan->sources[i].t) *
                     (int64_t)ct__esize(ct_tensor_dtype(plan->sources[i].t)) +
                 CK_ALIGN - 1) /
                CK_ALIGN * CK_ALIGN;
    return need;
}

/* Makes the staging hold at least need bytes (it grows, never shrinks);
 * touch faults its pages in now. */
static int grow_staging(ct_checkpointer *ck, int64_t need, bool touch) {
    if (ck->staging && (int64_t)ct_storage_nbytes(ck->staging) >= need)
        return 0;
    ct_storage_free(ck->staging);
    ck->staging = ct_storage_new((size_t)need, CT_DEVICE_CPU);
    if (!ck->staging)
        return ct_errcode();
    /* The first write to fresh memory takes a page fault per 4 KiB page, a
     * quarter million per GiB; huge pages take 512 times fewer. Only a
     * hint: without them everything is as correct. */
    char *data = ct_storage_data(ck->staging);
    uintptr_t lo = ((uintptr_t)data + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)data + (size_t)need) & ~(HUGE_PAGE - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    if (touch)
        memset(data, 0, (size_t)need);
    return 0;
}

int ct_checkpointer_reserve(ct_checkpointer *ck, ct_state *st) {
    const char *fn = "ct_checkpointer_reserve";
    int rc = check(ck, fn);
    if (rc)
        return rc;
    rc = ct_checkpointer_wait(ck);
    if (!rc)
        rc = ct__ckpt_state_check(st, fn);
    if (rc)
        return rc;
    ck_plan plan;
    ct_checkpoint_options o = ct_checkpoint_defaults();
    rc = ct__ckpt_save_plan(st, ck->comm, &o, &plan);
    if (rc)
        return rc;
    rc = ct__ckpt_agree(ck->comm, grow_staging(ck, staging_need(&plan), true), NULL, 0, NULL);
    ct__ckpt_plan_free(&plan);
    return rc;
}

/* Copies each chunk this rank writes into the staging memory and points the
 * plan at the copies. */
static int stage(ct_checkpointer *ck) {
    ck_plan *plan = &ck->plan;
    int rc = grow_staging(ck, staging_need(plan), false);
    if (rc)
        return rc;
    int64_t at = 0;
    for (int i = 0; i < plan->nsources; i++) {
        ct_tensor *src = plan->sources[i].t;
        int64_t strides[CT_MAX_DIMS];
        ct__tensor_contiguous_strides(ct_ndim(src), ct_sizes(src), strides);
        ct_tensor *copy = ct__tensor_own(
            ct_tensor_from_storage(ck->staging, at / (int64_t)ct__esize(ct_tensor_dtype(src)),
                                   ct_ndim(src), ct_sizes(src), strides, ct_tensor_dtype(src)));
        /* A device's chunk comes to the host now, at the call: the
         * snapshot holds the values of every op issued before it. */
        ct_tensor *host = copy ? ct__ckpt_on_host(src) : NULL;
        if (!host) {
            ct_tensor_free(copy);
            return ct_errcode();
        }
        ct__cpu_copy_into(copy, host);
        ct_tensor_free(host);
        ct_tensor_free(src);
        plan->sources[i].t = copy;
        at += (ct_numel(copy) * (int64_t)ct__esize(ct_tensor_dtype(copy)) + CK_ALIGN - 1) /
              CK_ALIGN * CK_ALIGN;
    }
    return 0;
}

int ct_checkpointer_save(ct_checkpointer *ck, const char *path, ct_state *st,
                         const ct_checkpoint_options *opts) {
    const char *fn = "ct_checkpointer_save";
    int rc = check(ck, fn);
    if (rc)
        return rc;
    rc = ct_checkpointer_wait(ck);
    ck->opts = opts ? *opts : ct_checkpoint_defaults();
    if (!rc)
        rc = ct__ckpt_state_check(st, fn);
    if (!rc)
        rc = ct__ckpt_check_options(fn, &ck->opts);
    if (rc)
        return rc;
    ck->path = ct__ckpt_clean_path(fn, path);
    if (!ck->path)
        return ct_errcode();
    rc = ct__ckpt_save_plan(st, ck->comm, &ck->opts, &ck->plan);
    /* Staging can fail on one rank alone: agree before any rank starts
     * writing. */
    if (!rc)
        rc = ct__ckpt_agree(ck->comm, stage(ck), NULL, 0, NULL);
    if (!rc && pthread_create(&ck->thread, NULL, background, ck) != 0)
        rc = ct__err_set(CT_ENOMEM, "%s: could not start the writer thread", fn);
    if (rc) {
        ct__ckpt_plan_free(&ck->plan);
        free(ck->path);
        ck->path = NULL;
        return rc;
    }
    ck->running = true;
    return 0;
}
