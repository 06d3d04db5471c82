/* ct's intra-op thread pool.
 *
 * One job runs at a time. The caller of ct_parallel_for splits [begin, end)
 * into at most nthreads equal chunks, publishes the job, and claims chunks
 * alongside the workers; it returns when every chunk is done. A second
 * thread that finds the pool busy runs its job inline instead of waiting, so
 * concurrent callers can never deadlock on one another. */
#include "tensor_impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct job {
    ct_parallel_fn fn;
    void *ctx;
    int64_t begin, end, chunk;
    int nchunks;
    atomic_int next;      /* next chunk to claim */
    atomic_int remaining; /* chunks not yet finished */
} job;

typedef struct pool {
    pthread_mutex_t submit; /* held by the thread whose job is running */
    pthread_mutex_t lock;   /* guards changes to generation, job, active and stop */
    pthread_cond_t wake, done;
    atomic_uint_fast64_t generation; /* read without the lock while spinning */
    job *job;
    atomic_int active; /* workers holding a pointer to job */
    bool stop;
    int nthreads; /* including the caller */
    int nworkers;
    pthread_t *workers;
    bool started;
} pool;

static pool the_pool = {
    .submit = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int configured_threads; /* 0: not yet read from the environment */
static _Thread_local bool in_region;

static int default_threads(void) {
    const char *env = getenv("CT_NUM_THREADS");
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end == '\0' && n >= 1 && n <= 4096)
            return (int)n;
        fprintf(stderr, "ct: ignoring CT_NUM_THREADS=%s (expected an integer >= 1)\n", env);
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int ct_get_num_threads(void) {
    int n = atomic_load(&configured_threads);
    if (n == 0) {
        pthread_mutex_lock(&config_lock);
        n = atomic_load(&configured_threads);
        if (n == 0) {
            n = default_threads();
            atomic_store(&configured_threads, n);
        }
        pthread_mutex_unlock(&config_lock);
    }
    return n;
}

/* Polls spent before sleeping on a condition variable: about 0.5 ms here.
 * Waking a sleeping thread costs 100 us or more on a virtual machine, and in
 * a training step the next op usually follows within that window; a shorter
 * spin left about half of back-to-back matmuls waiting for a wake-up. */
#define SPIN_POLLS 20000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void spin_until_changed(atomic_uint_fast64_t *gen, uint64_t seen) {
    for (int i = 0; i < SPIN_POLLS && atomic_load_explicit(gen, memory_order_relaxed) == seen; i++)
        cpu_relax();
}

static void spin_until_idle(job *j) {
    for (int i = 0; i < SPIN_POLLS; i++) {
        if (atomic_load_explicit(&j->remaining, memory_order_acquire) == 0 &&
            atomic_load(&the_pool.active) == 0)
            return;
        cpu_relax();
    }
}

static void run_chunks(job *j) {
    for (;;) {
        int c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->nchunks)
            return;
        int64_t lo = j->begin + c * j->chunk;
        int64_t hi = lo + j->chunk < j->end ? lo + j->chunk : j->end;
        j->fn(j->ctx, lo, hi);
        if (atomic_fetch_sub_explicit(&j->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&the_pool.lock);
            pthread_cond_broadcast(&the_pool.done);
            pthread_mutex_unlock(&the_pool.lock);
        }
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    in_region = true;
    uint64_t seen = 0;
    pthread_mutex_lock(&the_pool.lock);
    for (;;) {
        if (!the_pool.stop && atomic_load(&the_pool.generation) == seen) {
            /* Ops come back to back in a training step: a worker that just
             * finished polls for the next job for a while before sleeping,
             * so that short jobs are not dominated by wake-up latency. */
            pthread_mutex_unlock(&the_pool.lock);
            spin_until_changed(&the_pool.generation, seen);
            pthread_mutex_lock(&the_pool.lock);
        }
        while (!the_pool.stop && atomic_load(&the_pool.generation) == seen)
            pthread_cond_wait(&the_pool.wake, &the_pool.lock);
        if (the_pool.stop)
            break;
        seen = atomic_load(&the_pool.generation);
        job *j = the_pool.job;
        if (!j)
            continue;
        atomic_fetch_add(&the_pool.active, 1);
        pthread_mutex_unlock(&the_pool.lock);
        run_chunks(j);
        pthread_mutex_lock(&the_pool.lock);
        /* The job lives on the caller's stack: it may return only once no
         * worker can touch it. */
        if (atomic_fetch_sub(&the_pool.active, 1) == 1)
            pthread_cond_broadcast(&the_pool.done);
    }
    pthread_mutex_unlock(&the_pool.lock);
    return NULL;
}

/* Called with the submit mutex held. */
static void pool_start(void) {
    int n = ct_get_num_threads();
    the_pool.nthreads = n;
    the_pool.nworkers = 0;
    the_pool.stop = false;
    the_pool.workers = n > 1 ? malloc(sizeof(pthread_t) * (size_t)(n - 1)) : NULL;
    for (int i = 0; i < n - 1 && the_pool.workers; i++) {
        if (pthread_create(&the_pool.workers[i], NULL, worker_main, NULL) != 0)
            break;
        the_pool.nworkers++;
    }
    /* With fewer workers than asked for, chunks are still all claimed: the
     * caller runs whatever the workers do not. */
    the_pool.started = true;
}

/* Called with the submit mutex held. */
static void pool_stop(void) {
    if (!the_pool.started)
        return;
    pthread_mutex_lock(&the_pool.lock);
    the_pool.stop = true;
    pthread_cond_broadcast(&the_pool.wake);
    pthread_mutex_unlock(&the_pool.lock);
    for (int i = 0; i < the_pool.nworkers; i++)
        pthread_join(the_pool.workers[i], NULL);
    free(the_pool.workers);
    the_pool.workers = NULL;
    the_pool.nworkers = 0;
    the_pool.started = false;
}

int ct_set_num_threads(int n) {
    if (n < 1)
        return ct__err_set(CT_EINVAL, "set_num_threads: %d threads requested; expected >= 1", n);
    if (in_region)
        return ct__err_set(CT_ESTATE, "set_num_threads: called from inside a parallel region; "
                                      "resize the pool outside ct_parallel_for");
    pthread_mutex_lock(&the_pool.submit);
    pool_stop();
    atomic_store(&configured_threads, n);
    pthread_mutex_unlock(&the_pool.submit);
    return 0;
}

bool ct_in_parallel_region(void) { return in_region; }

void ct_parallel_for(int64_t begin, int64_t end, int64_t grain, ct_parallel_fn fn, void *ctx) {
    if (end <= begin)
        return;
    if (grain < 1)
        grain = 1;
    int64_t n = end - begin;
    int nthreads = in_region ? 1 : ct_get_num_threads();
    int64_t max_chunks = (n + grain - 1) / grain;
    int nchunks = max_chunks < nthreads ? (int)max_chunks : nthreads;
    if (nchunks <= 1 || pthread_mutex_trylock(&the_pool.submit) != 0) {
        bool was = in_region;
        in_region = true;
        fn(ctx, begin, end);
        in_region = was;
        return;
    }
    if (!the_pool.started)
        pool_start();
    job j = {.fn = fn, .ctx = ctx, .begin = begin, .end = end, .nchunks = nchunks};
    j.chunk = (n + nchunks - 1) / nchunks;
    j.nchunks = (int)((n + j.chunk - 1) / j.chunk);
    atomic_init(&j.next, 0);
    atomic_init(&j.remaining, j.nchunks);

    pthread_mutex_lock(&the_pool.lock);
    the_pool.job = &j;
    atomic_fetch_add(&the_pool.generation, 1);
    pthread_cond_broadcast(&the_pool.wake);
    pthread_mutex_unlock(&the_pool.lock);

    in_region = true;
    run_chunks(&j);
    in_region = false;

    spin_until_idle(&j);
    pthread_mutex_lock(&the_pool.lock);
    while (atomic_load_explicit(&j.remaining, memory_order_acquire) > 0 ||
           atomic_load(&the_pool.active) > 0)
        pthread_cond_wait(&the_pool.done, &the_pool.lock);
    the_pool.job = NULL;
    pthread_mutex_unlock(&the_pool.lock);
    pthread_mutex_unlock(&the_pool.submit);
}

/* fork() copies only the calling thread. The prepare handler takes the
 * submit mutex so that no job is half-published; the child then forgets the
 * parent's workers and starts its own pool on first use. */
static void atfork_prepare(void) { pthread_mutex_lock(&the_pool.submit); }
static void atfork_parent(void) { pthread_mutex_unlock(&the_pool.submit); }
static void atfork_child(void) {
    pthread_mutex_init(&the_pool.submit, NULL);
    pthread_mutex_init(&the_pool.lock, NULL);
    pthread_cond_init(&the_pool.wake, NULL);
    pthread_cond_init(&the_pool.done, NULL);
    free(the_pool.workers);
    the_pool.workers = NULL;
    the_pool.nworkers = 0;
    the_pool.started = false;
    the_pool.stop = false;
    the_pool.job = NULL;
    atomic_store(&the_pool.active, 0);
    in_region = false;
}

__attribute__((constructor)) static void register_atfork(void) {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
