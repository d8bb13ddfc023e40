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
 * The recording holds every array whose address it took, so none moves or is freed.
 * A replay runs the list in order with the replay's thread count in place of each
 * call's last argument (nthreads: the thread policy may change it between steps;
 * no kernel's results depend on it). Everything else is fixed at capture: a replay
 * reads whatever the recorded arrays hold when it runs. The inputs that change from
 * step to step (token ids, positions, slot mapping, sequence lengths, block tables)
 * are views of the one batch buffer the runner uploads into before each replay
 * (rawpage/decode_graphs.py), and every activation is written by a recorded call
 * before a later one reads it.
 *
 * Each op has an adapter that unpacks the words into its entry point's arguments.
 */
#include "common.h"

#define RP_GRAPH_MAX_ARGS 20

typedef union {
    int64_t i;
    double f;
    void *p;
} rp_word;

typedef struct {
    int64_t op;
    rp_word a[RP_GRAPH_MAX_ARGS];
} rp_call;

typedef void (*rp_op)(const rp_word *a, int nth);

static void op_gguf_matmul(const rp_word *a, int nth) {
    rp_gguf_matmul((int)a[0].i, a[1].p, a[2].p, a[3].p, a[4].p, a[5].i, a[6].i, a[7].i, a[8].p, nth);
}
static void op_gguf_rows(const rp_word *a, int nth) {
    rp_gguf_rows((int)a[0].i, a[1].p, a[2].p, a[3].p, a[4].i, a[5].i, a[6].i, nth);
}
static void op_bf16_matmul(const rp_word *a, int nth) {
    rp_bf16_matmul(a[0].p, a[1].p, a[2].p, a[3].p, a[4].i, a[5].i, a[6].i, (int)a[7].i, a[8].p, nth);
}
static void op_lm_head_q8_0(const rp_word *a, int nth) {
    rp_lm_head_q8_0(a[0].p, a[1].p, a[2].p, a[3].i, a[4].i, a[5].i, nth);
}
static void op_rms_norm(const rp_word *a, int nth) {
    rp_rms_norm(a[0].p, a[1].p, a[2].i, a[3].p, a[4].i, a[5].i, (float)a[6].f, nth);
}
static void op_fused_add_rms_norm(const rp_word *a, int nth) {
    rp_fused_add_rms_norm(a[0].p, a[1].p, a[2].p, a[3].i, a[4].p, a[5].i, a[6].p, a[7].i, a[8].i, (float)a[9].f, nth);
}
static void op_silu_and_mul(const rp_word *a, int nth) { rp_silu_and_mul(a[0].p, a[1].p, a[2].i, a[3].i, a[4].i, nth); }
static void op_gelu_tanh_and_mul(const rp_word *a, int nth) {
    rp_gelu_tanh_and_mul(a[0].p, a[1].p, a[2].i, a[3].i, a[4].i, nth);
}
static void op_rope(const rp_word *a, int nth) {
    rp_rope(a[0].p, a[1].p, a[2].i, a[3].p, a[4].i, a[5].p, a[6].i, (int)a[7].i, (int)a[8].i, (int)a[9].i,
            (int)a[10].i, nth);
}
static void op_write_kv(const rp_word *a, int nth) {
    rp_write_kv(a[0].p, a[1].i, a[2].p, a[3].i, a[4].p, a[5].p, (int)a[6].i, a[7].p, a[8].i, a[9].i, nth);
}
static void op_embedding_rows(const rp_word *a, int nth) {
    rp_embedding_rows(a[0].p, a[1].p, a[2].p, a[3].i, a[4].i, nth);
}
static void op_paged_attention(const rp_word *a, int nth) {
    rp_paged_attention(a[0].p, a[1].p, a[2].i, a[3].p, a[4].p, (int)a[5].i, a[6].p, (int)a[7].i, a[8].p, a[9].p,
                       (int)a[10].i, (int)a[11].i, (int)a[12].i, (int)a[13].i, (int)a[14].i, (float)a[15].f,
                       (int)a[16].i, (float)a[17].f, nth);
}

static const struct {
    const char *name;
    rp_op run;
} ops[] = {
    {"rp_gguf_matmul", op_gguf_matmul},
    {"rp_gguf_rows", op_gguf_rows},
    {"rp_bf16_matmul", op_bf16_matmul},
    {"rp_lm_head_q8_0", op_lm_head_q8_0},
    {"rp_rms_norm", op_rms_norm},
    {"rp_fused_add_rms_norm", op_fused_add_rms_norm},
    {"rp_silu_and_mul", op_silu_and_mul},
    {"rp_gelu_tanh_and_mul", op_gelu_tanh_and_mul},
    {"rp_rope", op_rope},
    {"rp_write_kv", op_write_kv},
    {"rp_embedding_rows", op_embedding_rows},
    {"rp_paged_attention", op_paged_attention},
};

#define NUM_OPS ((int)(sizeof(ops) / sizeof(ops[0])))

/* The op index of an entry point, or -1 where it cannot be recorded. */
RP_EXPORT int rp_graph_op(const char *name) {
    for (int i = 0; i < NUM_OPS; i++)
        if (strcmp(ops[i].name, name) == 0) return i;
    return -1;
}

RP_EXPORT int rp_graph_max_args(void) { return RP_GRAPH_MAX_ARGS; }

/* Runs calls[0 .. n) in order, each on nthreads threads. Returns 0, or -1 (running
 * nothing) if a record names no op. */
RP_EXPORT int rp_graph_replay(const rp_call *calls, int64_t n, int nthreads) {
    for (int64_t i = 0; i < n; i++)
        if (calls[i].op < 0 || calls[i].op >= NUM_OPS) return -1;
    for (int64_t i = 0; i < n; i++) ops[calls[i].op].run(calls[i].a, nthreads);
    return 0;
}
