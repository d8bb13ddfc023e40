"""Every function the CPU kernels export, declared once.

Each entry is the C signature, written as C. Everything else that must agree with it
comes from this table, so that a mismatch cannot compile or cannot be called:

    the C prototype      rp_entry_points.h, written by build.py beside each build and
                         included by common.h: a definition that differs does not compile
    the ctypes types     NativeLibrary declares restype and argtypes from here (library.py)
    the call             lib.call(name, **arguments) takes the arguments by their C names
                         and puts them in order; a missing or unknown name raises
    the replay adapter   the same header holds, for each entry marked `replay`, the
                         function graph.c runs to unpack a recorded call's 64-bit words
                         into its arguments (pointers, integers, floats), and the table
                         of them by name

A replayable entry's last parameter is `int nthreads`: a replay passes its own thread
count there (graph.c says why).

`python -m rawpage.native.entry_points` prints the generated header.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from rawpage.quantization.gguf import c_traits_header


@dataclass(frozen=True)
class Param:
    ctype: str  # as written in C: "const float *", "int64_t"
    name: str

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")


@dataclass(frozen=True)
class EntryPoint:
    name: str
    restype: str  # C return type
    params: tuple[Param, ...]
    replay: bool  # may be recorded into a decode graph (graph.c)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def prototype(self) -> str:
        args = ", ".join(f"{p.ctype}{'' if p.is_pointer else ' '}{p.name}" for p in self.params) or "void"
        return f"RP_EXPORT {self.restype} {self.name}({args});"


def entry(name: str, restype: str, signature: str, replay: bool = False) -> EntryPoint:
    """One entry from its C parameter list, e.g. "float *y, const float *x, int64_t T"."""
    params = []
    for part in filter(None, (s.strip() for s in signature.split(","))):
        star = part.rfind("*")
        ctype, pname = (part[: star + 1], part[star + 1 :]) if star >= 0 else part.rsplit(None, 1)
        params.append(Param(" ".join(ctype.split()).replace(" *", " *"), pname.strip()))
    e = EntryPoint(name, restype, tuple(params), replay)
    if replay and (not params or params[-1] != Param("int", "nthreads")):
        raise ValueError(f"{name}: a replayable entry point ends with `int nthreads`")
    return e


# fmt note: one line of C per entry where it fits; the grouping comments say what each kernel file holds.
ENTRY_POINTS = {
    e.name: e
    for e in (
        # gguf_matmul.c: linear layers and embedding rows on GGUF weights repacked in panels
        entry(
            "rp_gguf_matmul",
            "int",
            "int qtype, float *y, int64_t ldy, const float *x, const uint8_t *w, const float *bias, int64_t T, "
            "int64_t N, int64_t K, int parts, uint8_t *scratch, int nthreads",
            replay=True,
        ),
        entry(
            "rp_gguf_rows",
            "int",
            "int qtype, float *out, const uint8_t *w, const int32_t *ids, int64_t T, int64_t N, int64_t K, int nthreads",
            replay=True,
        ),
        entry(
            "rp_gguf_quantize", "int", "int qtype, const float *x, int64_t T, int64_t K, int parts, uint8_t *scratch"
        ),
        entry(
            "rp_gguf_pack",
            "int",
            "int qtype, uint8_t *out, const float *d, const float *dm, const int8_t *sc, const uint8_t *m, "
            "const uint8_t *q, int64_t N, int64_t K, int nthreads",
        ),
        entry("rp_gguf_scratch_bytes", "int64_t", "int qtype, int64_t T, int64_t K, int parts"),
        entry("rp_gguf_panel_bytes", "int64_t", "int qtype, int64_t K"),
        # half_matmul.c
        entry(
            "rp_half_matmul",
            "int",
            "int f16, float *y, const float *x, const uint16_t *w, const float *bias, int64_t T, int64_t N, "
            "int64_t K, int round_x, void *scratch, int nthreads",
            replay=True,
        ),
        entry(
            "rp_half_rows",
            "void",
            "int f16, float *out, const uint16_t *table, const int32_t *ids, int64_t T, int64_t n, int nthreads",
            replay=True,
        ),
        # bf16_gemm.c: a vision tower's GEMMs and attention in bfloat16 (vdpbf16ps)
        entry(
            "rp_bf16_gemm",
            "int",
            "float *y, int64_t y_stride, const float *x, int64_t x_stride, const uint16_t *panels, "
            "const float *bias, int64_t T, int64_t N, int64_t K, int nthreads",
        ),
        entry(
            "rp_bf16_pack",
            "void",
            "uint16_t *panels, const float *w, int64_t sn, int64_t sk, int64_t N, int64_t K, int nthreads",
        ),
        entry(
            "rp_bf16_encoder_attention",
            "int",
            "float *out, const float *q, const float *k, const float *v, int64_t row_stride, int64_t head_stride, "
            "const int64_t *bounds, int64_t nseq, int64_t H, int64_t D, float scale, int nthreads",
        ),
        # layer_ops.c
        entry(
            "rp_rms_norm",
            "void",
            "float *out, const float *x, int64_t x_stride, const float *weight, int64_t T, int64_t n, float eps, "
            "int nthreads",
            replay=True,
        ),
        entry(
            "rp_fused_add_rms_norm",
            "void",
            "float *normed, float *sum, const float *x, int64_t x_stride, const float *residual, "
            "int64_t residual_stride, const float *weight, int64_t T, int64_t n, float eps, int nthreads",
            replay=True,
        ),
        entry(
            "rp_silu_and_mul",
            "void",
            "float *out, const float *x, int64_t x_stride, int64_t T, int64_t I, int nthreads",
            replay=True,
        ),
        entry(
            "rp_gelu_tanh_and_mul",
            "void",
            "float *out, const float *x, int64_t x_stride, int64_t T, int64_t I, int nthreads",
            replay=True,
        ),
        entry(
            "rp_rope",
            "void",
            "const int32_t *positions, float *q, int64_t q_stride, float *k, int64_t k_stride, "
            "const float *cos_sin, int64_t T, int H, int Hkv, int D, int is_neox, int nthreads",
            replay=True,
        ),
        entry(
            "rp_write_kv",
            "void",
            "const float *k, int64_t k_stride, const float *v, int64_t v_stride, void *k_cache, void *v_cache, "
            "int kv_dtype, const int32_t *slot_mapping, int64_t T, int64_t row, int nthreads",
            replay=True,
        ),
        entry(
            "rp_embedding_rows",
            "void",
            "float *out, const float *table, const int32_t *ids, int64_t T, int64_t n, int nthreads",
            replay=True,
        ),
        # paged_attention.c
        entry(
            "rp_paged_attention",
            "void",
            "float *out, const float *q, int64_t q_stride, const void *k_cache, const void *v_cache, int kv_dtype, "
            "const int32_t *block_tables, int max_blocks, const int32_t *seq_lens, const int32_t *query_start_loc, "
            "int B, int H, int Hkv, int D, int BS, float scale, int sliding_window, float soft_cap, int nthreads",
            replay=True,
        ),
        # vision_ops.c: a vision tower's ops between its GEMMs (models/siglip.py)
        entry(
            "rp_fused_add_layer_norm",
            "void",
            "float *normed, float *sum, const float *x, int64_t x_stride, const float *residual, "
            "int64_t residual_stride, const float *weight, const float *bias, int64_t T, int64_t n, float eps, "
            "int nthreads",
        ),
        entry(
            "rp_gelu_tanh", "void", "float *out, const float *x, int64_t x_stride, int64_t T, int64_t n, int nthreads"
        ),
        entry(
            "rp_gelu_erf", "void", "float *out, const float *x, int64_t x_stride, int64_t T, int64_t n, int nthreads"
        ),
        entry("rp_softmax_rows", "void", "float *x, int64_t x_stride, int64_t T, int64_t n, int nthreads"),
        # pool.c, read_probe.c, graph.c
        entry("rp_pool_selftest", "int64_t", "int nth"),
        entry("rp_read_probe", "uint64_t", "const uint8_t *buf, int64_t n, int nthreads"),
        entry("rp_graph_op", "int", "const char *name"),
        entry("rp_graph_max_args", "int", ""),
        entry("rp_graph_replay", "int", "const void *records, int64_t n, int nthreads, double *seconds"),
        entry("rp_graph_op_name", "const char *", "int op"),
    )
}

RP_GRAPH_MAX_ARGS = 20  # 64-bit words a recorded call holds for its arguments

_CTYPES = {
    "void": None,
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "float": ctypes.c_float,
    "const char *": ctypes.c_char_p,
}


def ctypes_of(ctype: str) -> Any:
    """The ctypes type of a C type in the table: every other pointer is a c_void_p (an address)."""
    if ctype in _CTYPES:
        return _CTYPES[ctype]
    if ctype.endswith("*"):
        return ctypes.c_void_p
    raise ValueError(f"no ctypes type for {ctype!r}: add it to entry_points._CTYPES")


def _word(p: Param, i: int) -> str:
    """C that reads recorded word i as parameter p."""
    if p.is_pointer:
        return f"a[{i}].p"
    return {"int64_t": f"a[{i}].i", "int": f"(int)a[{i}].i", "float": f"(float)a[{i}].f"}[p.ctype]


def header() -> str:
    """rp_entry_points.h: the prototypes, the format traits, and (for graph.c, which
    defines RP_GRAPH_ADAPTERS) the replay adapters and their table."""
    lines = [
        "/* Generated by rawpage/native/entry_points.py (and the format table in",
        " * rawpage/quantization/gguf.py) for each build: edit those, not this. */",
        "#ifndef RP_ENTRY_POINTS_H",
        "#define RP_ENTRY_POINTS_H",
        f"#define RP_GRAPH_MAX_ARGS {RP_GRAPH_MAX_ARGS}",
        "",
        *(e.prototype() for e in ENTRY_POINTS.values()),
        "",
        c_traits_header(),
        "#endif",
        "",
        "/* graph.c includes this again with RP_GRAPH_ADAPTERS defined, after rp_word. */",
        "#if defined(RP_GRAPH_ADAPTERS) && !defined(RP_GRAPH_ADAPTERS_DONE)",
        "#define RP_GRAPH_ADAPTERS_DONE",
    ]
    replayed = [e for e in ENTRY_POINTS.values() if e.replay]
    for e in replayed:
        if len(e.params) > RP_GRAPH_MAX_ARGS:
            raise ValueError(f"{e.name} has {len(e.params)} arguments; a recorded call holds {RP_GRAPH_MAX_ARGS}")
        args = ", ".join([_word(p, i) for i, p in enumerate(e.params[:-1])] + ["nth"])
        lines.append(f"static void op_{e.name}(const rp_word *a, int nth) {{ {e.name}({args}); }}")
    lines.append("static const struct { const char *name; void (*run)(const rp_word *a, int nth); } ops[] = {")
    lines += [f'    {{"{e.name}", op_{e.name}}},' for e in replayed]
    lines += ["};", "#endif", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(header())
