/* The thread pool every CPU kernel splits its rows over.
 *
 * Why our own: a decode step is a few hundred kernel calls of 10-200 us each. Handing
 * each one to Python threads costs 0.1-0.2 ms (measured on the 2-core development
 * machine), more than the kernels; here a call is handed over through one shared
 * counter that the workers watch.
 *
 * How: rp_parallel(fn, arg, nth) writes (fn, arg), then publishes one 64-bit word,
 * `state` = generation << 16 | nth. Worker w sees a new generation; if w < nth it runs
 * fn(arg, w, nth) and bumps `done`. The caller runs part 0 itself, then waits until
 * done == nth - 1. Generation and nth travel in one word so that a worker never pairs
 * one call's generation with another call's part count: a worker that takes part in a
 * call holds that call open, so (fn, arg) cannot change under it. Workers
 * spin on the generation for a short while after each call they take part in (the
 * next kernel of the same forward pass follows within microseconds), then sleep, each
 * on a condition variable of its own, so an idle engine holds no core. A call wakes
 * the workers it needs and no others, and a call that leaves a worker out (nth at or
 * below its id) does not renew its spin: workers once started for a wider call (the
 * pool test's 7 parts, a larger batch's threads) would otherwise spin or wake through
 * every narrower call and take the cores from the threads that run it (measured: a test
 * of three ranks' kernel calls took 7 s alone and 58 s after the pool tests had started
 * 6 workers). RAWPAGE_CPU_SPIN sets the spin in iterations of a pause instruction
 * (default 20000, about 0.1-0.5 ms).
 *
 * One caller at a time: the engine runs one forward pass at once. A second thread
 * that calls in while a call runs waits for the lock. Workers are started on first
 * use, up to the largest nth asked for, and live until the process exits.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common.h"

#define RP_MAX_THREADS 256

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;  /* one rp_parallel at a time */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the conditions below */
static pthread_cond_t wake[RP_MAX_THREADS];                     /* worker w sleeps on wake[w] */

static rp_task task_fn;
static void *task_arg;
static _Atomic uint64_t state; /* generation << 16 | nth of the latest call */
static atomic_int done;
static int num_workers; /* started so far (thread ids 1..num_workers) */
static long spin_limit = -1;
static uint64_t born[RP_MAX_THREADS];

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* Whether the call in state s has a part for worker me (a generation not yet seen, and me < nth). */
static inline int mine(uint64_t s, uint64_t seen, int me) { return (s >> 16) != seen && me < (int)(s & 0xffff); }

static void *worker_main(void *p) {
    int me = (int)(intptr_t)p;
    uint64_t seen = born[me]; /* the generation before the call that started it */
    long spins = 0;           /* spun since this worker last ran a part */
    for (;;) {
        uint64_t s = atomic_load_explicit(&state, memory_order_acquire);
        if (!mine(s, seen, me)) {
            seen = s >> 16; /* a call without this worker: passed, and no new spin */
            if (++spins < spin_limit) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&sleep_lock);
            while (!mine(s = atomic_load(&state), seen, me)) {
                seen = s >> 16;
                pthread_cond_wait(&wake[me], &sleep_lock);
            }
            pthread_mutex_unlock(&sleep_lock);
        }
        seen = s >> 16;
        task_fn(task_arg, me, (int)(s & 0xffff));
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
        spins = 0;
    }
    return NULL;
}

static void start_workers(int nth) {
    if (spin_limit < 0) {
        const char *s = getenv("RAWPAGE_CPU_SPIN");
        spin_limit = s ? atol(s) : 20000;
    }
    for (; num_workers < nth - 1; num_workers++) {
        pthread_t t;
        pthread_attr_t attr;
        born[num_workers + 1] = atomic_load(&state) >> 16;
        pthread_cond_init(&wake[num_workers + 1], NULL);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, worker_main, (void *)(intptr_t)(num_workers + 1)) != 0) break;
        pthread_attr_destroy(&attr);
    }
}

void rp_parallel(rp_task fn, void *arg, int nth) {
    if (nth > RP_MAX_THREADS) nth = RP_MAX_THREADS;
    if (nth <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&call_lock);
    start_workers(nth);
    if (nth > num_workers + 1) nth = num_workers + 1; /* pthread_create failed: fewer parts */
    task_fn = fn;
    task_arg = arg;
    atomic_store_explicit(&done, 0, memory_order_relaxed);
    uint64_t next = ((atomic_load(&state) >> 16) + 1) << 16 | (uint64_t)nth;
    pthread_mutex_lock(&sleep_lock); /* a worker between its last check and its wait sees this */
    atomic_store_explicit(&state, next, memory_order_release);
    for (int w = 1; w < nth; w++) pthread_cond_signal(&wake[w]); /* only the call's workers */
    pthread_mutex_unlock(&sleep_lock);
    fn(arg, 0, nth);
    while (atomic_load_explicit(&done, memory_order_acquire) < nth - 1) cpu_relax();
    pthread_mutex_unlock(&call_lock);
}

/* For the tests: sum of ith over the parts, each part writing its own slot. */
static void count_task(void *arg, int ith, int nth) {
    (void)nth;
    ((int64_t *)arg)[ith] = ith + 1;
}

RP_EXPORT int64_t rp_pool_selftest(int nth) {
    int64_t slots[RP_MAX_THREADS] = {0}, sum = 0;
    rp_parallel(count_task, slots, nth);
    for (int i = 0; i < RP_MAX_THREADS; i++) sum += slots[i];
    return sum;
}
