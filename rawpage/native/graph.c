/* A forward pass replayed in one call: the CPU's analogue of a CUDA graph.
 *
 * Why: a decode step of the default model (30 layers) is about 300 kernel calls. From
 * Python each one costs 3-15 us before the kernel starts (checking shapes, allocating
 * the output, the ctypes call), 1-2 ms a step against 4-5 ms of kernels at batch 1.
 * A replay makes the same calls from C, back to back.
 *
 * What is recorded (rawpage/native/library.py, Recording): while the engine captures a
 * decode graph (backends/cpu.py capture_graph), every kernel call the forward pass makes
 * runs as usual and is also appended to a list of rp_call records:
 *
 *     op      which entry point (its index in `ops` below, looked up by name once)
 *     a[]     its arguments as 64-bit words, in the entry point's order: addresses,
 *             sizes and flags as integers, floats (eps, scale, soft cap) as doubles
 *
 * The recording holds every array whose address it took, so none moves or is freed;
 * the pass's temporaries live in an arena that never moves either, and a temporary's
 * bytes go to a later one of the same size only once Python holds neither it nor a view
 * of it (library.py Arena): every call that read it was recorded before that one.
 * A replay runs the list in order with the replay's thread count in place of each
 * call's last argument (nthreads: the thread policy may change it between steps;
 * no kernel's results depend on it). Everything else is fixed at capture: a replay
 * reads whatever the recorded arrays hold when it runs. The inputs that change from
 * step to step (token ids, positions, slot mapping, sequence lengths, block tables)
 * are views of the one batch buffer the runner uploads into before each replay
 * (rawpage/decode_graphs.py), and every activation is written by a recorded call
 * before a later one reads it.
 *
 * Each op has an adapter that unpacks the words into its entry point's arguments,
 * generated from the entry point's one declaration (rawpage/native/entry_points.py).
 */
#include <time.h>

#include "common.h"

typedef union {
    int64_t i;
    double f;
    void *p;
} rp_word;

typedef struct {
    int64_t op;
    rp_word a[RP_GRAPH_MAX_ARGS];
} rp_call;

/* The adapters, one per replayable entry point (op_<name>: the words, by the entry's
 * C types, into its arguments, with the replay's thread count last), and `ops`, the
 * table of them by name: generated from rawpage/native/entry_points.py. */
#define RP_GRAPH_ADAPTERS
#include "rp_entry_points.h"

#define NUM_OPS ((int)(sizeof(ops) / sizeof(ops[0])))

/* The op index of an entry point, or -1 where it cannot be recorded. */
RP_EXPORT int rp_graph_op(const char *name) {
    for (int i = 0; i < NUM_OPS; i++)
        if (strcmp(ops[i].name, name) == 0) return i;
    return -1;
}

RP_EXPORT int rp_graph_max_args(void) { return RP_GRAPH_MAX_ARGS; }

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs calls[0 .. n) in order, each on nthreads threads. Returns 0, or -1 (running
 * nothing) if a record names no op. With `seconds` (n doubles; NULL for none), adds
 * each call's wall time to its slot: tools/profile_step.py splits a replay by op. */
RP_EXPORT int rp_graph_replay(const void *records, int64_t n, int nthreads, double *seconds) {
    const rp_call *calls = records;
    for (int64_t i = 0; i < n; i++)
        if (calls[i].op < 0 || calls[i].op >= NUM_OPS) return -1;
    if (!seconds) {
        for (int64_t i = 0; i < n; i++) ops[calls[i].op].run(calls[i].a, nthreads);
        return 0;
    }
    double t = now_seconds();
    for (int64_t i = 0; i < n; i++) {
        ops[calls[i].op].run(calls[i].a, nthreads);
        double after = now_seconds();
        seconds[i] += after - t;
        t = after;
    }
    return 0;
}

/* The entry point's name of op index `op`, or NULL. */
RP_EXPORT const char *rp_graph_op_name(int op) {
    return op >= 0 && op < NUM_OPS ? ops[op].name : NULL;
}
