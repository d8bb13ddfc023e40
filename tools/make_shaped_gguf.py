"""GGUF files with random weights at the real shapes of Llama 3, Qwen2.5 and Gemma 3 models (issues 40, 45).

    python tools/make_shaped_gguf.py --shape llama-3.2-1b --out-dir ../models-shaped \\
        [--types Q4_K_M,Q8_0] [--llama-quantize PATH] [--keep-f16]

Speed on a CPU depends on the shapes and the weight format, not on what the weights say,
so a file with random weights times a model without downloading it. Each file is what
llama.cpp's convert_hf_to_gguf.py would write for that model (its tensor names, its
`{arch}.*` keys, F16 matrices and F32 norms, Llama 3's rope_freqs), with the tokenizer
and chat template of the default model, SmolLM2-135M-Instruct (vocab 49152), so prompts
tokenize as they do for the default model. llama-quantize (tools/build_peers.sh builds
it) then makes each format from the F16 file: `{shape}-{TYPE}.gguf` in --out-dir.
Files that exist are skipped; the F16 file is deleted once quantized, unless --keep-f16.
It writes with the `gguf` package, llama.cpp's own writer (`pip install -e '.[tools]'`; the
test venv has it too): rawpage itself reads GGUFs without it.

The weights are N(0, 0.02) and the norms 1.0: every matmul input is RMS-normalized, so
activations stay near unit scale and the logits stay finite at any depth. A fixed seed
per tensor makes a shape's file the same on every run, so a format made later matches.
The F16 file is written tensor by tensor (an 8B model is 16 GB; one tensor at a time is
at most a few hundred MB). Tests write tiny files with write_shaped_gguf(path, Shape(...)).

A shape with a vision tower (gemma-3-4b: Gemma3ForConditionalGeneration's text model
and its SigLIP-so400m tower) also gets `mmproj-{shape}-F16.gguf`, the clip GGUF that
convert_hf_to_gguf.py --mmproj writes and llama-server --mmproj loads (matrices F16,
the patch and position embeddings, norms and biases F32). Its text file's vocabulary is
the default model's plus Gemma 3's three image tokens as control tokens, and its chat
template writes <start_of_image> for an image part, as Gemma 3's does.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_M", "IQ4_XS"]
DEFAULT_QUANTIZE = ROOT.parent / "peers" / "llama.cpp-build-vnni" / "bin" / "llama-quantize"
STD = 0.02
ROWS_PER_CHUNK = 4096  # rows drawn at once, so a tensor never needs a float32 copy of itself


@dataclass(frozen=True)
class VisionShape:
    """A SigLIP vision tower and Gemma 3's average-pool projector, as vision_config gives them."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    image: int  # pixels a side
    patch: int
    tokens: int  # soft tokens per image: the patch grid average-pooled
    eps: float = 1e-6


@dataclass(frozen=True)
class Shape:
    """One model's shape, as its config.json gives it."""

    arch: str  # GGUF architecture: "llama", "qwen2" or "gemma3"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool  # the output projection is token_embd (no output.weight)
    rope_theta: float
    rms_eps: float
    context: int
    # Llama 3.1/3.2 rope scaling (factor, low_freq_factor, high_freq_factor, original context):
    # convert_hf_to_gguf stores it as the rope_freqs tensor.
    llama3_rope: tuple[float, float, float, int] | None = None
    vocab: int = 49152  # SmolLM2's, whose tokenizer every file carries
    # Gemma 3: the sliding layers' window (5 of every 6 layers slide, as llama.cpp assumes)
    # and the global layers' linear RoPE scaling factor
    sliding_window: int = 0
    rope_linear: float = 0.0
    vision: VisionShape | None = None


SHAPES = {
    "llama-3.2-1b": Shape("llama", 2048, 16, 32, 8, 64, 8192, True, 500000.0, 1e-5, 131072, (32.0, 1.0, 4.0, 8192)),
    "llama-3.2-3b": Shape("llama", 3072, 28, 24, 8, 128, 8192, True, 500000.0, 1e-5, 131072, (32.0, 1.0, 4.0, 8192)),
    "llama-3.1-8b": Shape("llama", 4096, 32, 32, 8, 128, 14336, False, 500000.0, 1e-5, 131072, (8.0, 1.0, 4.0, 8192)),
    "qwen2.5-0.5b": Shape("qwen2", 896, 24, 14, 2, 64, 4864, True, 1000000.0, 1e-6, 32768),
    "qwen2.5-7b": Shape("qwen2", 3584, 28, 28, 4, 128, 18944, False, 1000000.0, 1e-6, 32768),
    # google/gemma-3-4b-it: its text model and SigLIP-so400m tower (896 px, patch 14: 64 x 64
    # patches, pooled 4 x 4 into 256 tokens); SmolLM2's vocabulary plus the 3 image tokens
    "gemma-3-4b": Shape(
        "gemma3",
        2560,
        34,
        8,
        4,
        256,
        10240,
        True,
        1000000.0,
        1e-6,
        131072,
        None,
        49152 + 3,
        1024,
        8.0,
        VisionShape(1152, 27, 16, 4304, 896, 14, 256),
    ),
    # The same families at a size a test or a smoke run writes in a second.
    "tiny-llama": Shape("llama", 64, 2, 4, 2, 16, 128, True, 500000.0, 1e-5, 2048, (32.0, 1.0, 4.0, 8192)),
    "tiny-qwen2": Shape("qwen2", 64, 2, 4, 2, 16, 128, False, 1000000.0, 1e-6, 2048),
    "tiny-gemma3": Shape(
        "gemma3",
        64,
        2,
        4,
        2,
        16,
        128,
        True,
        1000000.0,
        1e-6,
        2048,
        None,
        49152 + 3,
        16,
        8.0,
        VisionShape(32, 2, 2, 64, 32, 8, 4),
    ),
}
IMAGE_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")  # Gemma 3's, as control tokens
CONTROL = 3  # llama.cpp's token type of a control token
# ChatML (the default model's turns) that writes Gemma 3's <start_of_image> for an image part;
# a server that gives the template string content (llama-server's <__media__> marker) passes through
VISION_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<start_of_image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # NumPy order (rows, cols); GGUF stores it reversed
    fill: str  # "normal" (weights, biases), "ones" (norms), "rope_freqs"
    f32: bool = False  # a matrix kept F32 (an mmproj's patch and position embeddings)


def tensor_specs(s: Shape) -> list[TensorSpec]:
    """The tensors convert_hf_to_gguf writes for this shape, in its order."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [TensorSpec("rope_freqs.weight", (s.head_dim // 2,), "rope_freqs")] if s.llama3_rope else []
    out += [TensorSpec("token_embd.weight", (s.vocab, s.hidden), "normal")]
    for i in range(s.layers):
        b = f"blk.{i}"
        out += [
            TensorSpec(f"{b}.attn_norm.weight", (s.hidden,), "ones"),
            TensorSpec(f"{b}.attn_q.weight", (q, s.hidden), "normal"),  # (H*D, hidden)
            TensorSpec(f"{b}.attn_k.weight", (kv, s.hidden), "normal"),  # (Hkv*D, hidden)
            TensorSpec(f"{b}.attn_v.weight", (kv, s.hidden), "normal"),
        ]
        if s.arch == "gemma3":  # per-head RMSNorms of q and k
            out += [
                TensorSpec(f"{b}.attn_q_norm.weight", (s.head_dim,), "ones"),
                TensorSpec(f"{b}.attn_k_norm.weight", (s.head_dim,), "ones"),
            ]
        if s.arch == "qwen2":  # Qwen2 has q/k/v biases, no other
            out += [
                TensorSpec(f"{b}.attn_q.bias", (q,), "normal"),
                TensorSpec(f"{b}.attn_k.bias", (kv,), "normal"),
                TensorSpec(f"{b}.attn_v.bias", (kv,), "normal"),
            ]
        out += [TensorSpec(f"{b}.attn_output.weight", (s.hidden, q), "normal")]
        if s.arch == "gemma3":  # Gemma's norms after attention and the MLP (as stored: 1 + w, w = 0)
            out += [TensorSpec(f"{b}.post_attention_norm.weight", (s.hidden,), "ones")]
        out += [
            TensorSpec(f"{b}.ffn_norm.weight", (s.hidden,), "ones"),
            TensorSpec(f"{b}.ffn_gate.weight", (s.ffn, s.hidden), "normal"),
            TensorSpec(f"{b}.ffn_up.weight", (s.ffn, s.hidden), "normal"),
            TensorSpec(f"{b}.ffn_down.weight", (s.hidden, s.ffn), "normal"),
        ]
        if s.arch == "gemma3":
            out += [TensorSpec(f"{b}.post_ffw_norm.weight", (s.hidden,), "ones")]
    out += [TensorSpec("output_norm.weight", (s.hidden,), "ones")]
    if not s.tied:
        out += [TensorSpec("output.weight", (s.vocab, s.hidden), "normal")]
    return out


def mmproj_specs(v: VisionShape, text_dim: int) -> list[TensorSpec]:
    """The tensors convert_hf_to_gguf --mmproj writes for a SigLIP tower and Gemma 3's projector
    (gguf's MMPROJ names), each in NumPy order."""
    D = v.hidden
    out = [
        TensorSpec("v.patch_embd.weight", (D, 3, v.patch, v.patch), "normal", f32=True),
        TensorSpec("v.patch_embd.bias", (D,), "normal"),
        TensorSpec("v.position_embd.weight", ((v.image // v.patch) ** 2, D), "normal", f32=True),
    ]
    for i in range(v.layers):
        b = f"v.blk.{i}"
        for name, shape in (("attn_q", (D, D)), ("attn_k", (D, D)), ("attn_v", (D, D)), ("attn_out", (D, D))):
            out += [TensorSpec(f"{b}.{name}.weight", shape, "normal"), TensorSpec(f"{b}.{name}.bias", (D,), "normal")]
        for ln in ("ln1", "ln2"):
            out += [TensorSpec(f"{b}.{ln}.weight", (D,), "ones"), TensorSpec(f"{b}.{ln}.bias", (D,), "normal")]
        out += [
            TensorSpec(f"{b}.ffn_up.weight", (v.ffn, D), "normal"),  # SigLIP's fc1
            TensorSpec(f"{b}.ffn_up.bias", (v.ffn,), "normal"),
            TensorSpec(f"{b}.ffn_down.weight", (D, v.ffn), "normal"),  # fc2
            TensorSpec(f"{b}.ffn_down.bias", (D,), "normal"),
        ]
    return out + [
        TensorSpec("v.post_ln.weight", (D,), "ones"),
        TensorSpec("v.post_ln.bias", (D,), "normal"),
        TensorSpec("mm.input_projection.weight", (D, text_dim), "normal"),  # (in, out), as the Hub stores it
        TensorSpec("mm.soft_emb_norm.weight", (D,), "ones"),  # Gemma's RMSNorm, stored as 1 + w
    ]


def llama3_rope_freqs(s: Shape) -> np.ndarray:
    """Llama 3's per-frequency divisors, as convert_hf_to_gguf computes them. (D/2,) float32"""
    factor, low, high, old_ctx = s.llama3_rope
    freqs = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def stored_dtype(spec: TensorSpec, dtype: type) -> type:
    """A tensor's type in the file: 2-D matrices `dtype`, all else (and spec.f32 ones) float32."""
    return dtype if len(spec.shape) == 2 and not spec.f32 else np.float32


def tensor_data(spec: TensorSpec, s: Shape, index: int, seed: int, dtype: type) -> np.ndarray:
    """The values of one tensor: 2-D weights in `dtype`, 1-D tensors in float32 (as convert does)."""
    if spec.fill == "ones":
        return np.ones(spec.shape, dtype=np.float32)
    if spec.fill == "rope_freqs":
        return llama3_rope_freqs(s)
    rng = np.random.default_rng([seed, index])  # one stream per tensor: reproducible, order-free
    out = np.empty(spec.shape, dtype=stored_dtype(spec, dtype))
    for r in range(0, spec.shape[0], ROWS_PER_CHUNK):
        rows = out[r : r + ROWS_PER_CHUNK]
        rows[...] = rng.standard_normal(rows.shape, dtype=np.float32) * STD
    return out


def tokenizer_fields(source: str) -> Iterator[tuple[str, object, object, object]]:
    """(key, value, type, array element type) of every tokenizer.* key of a GGUF file."""
    from gguf import GGUFReader, GGUFValueType

    for key, field in GGUFReader(source).fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
            yield key, field.contents(), field.types[0], sub


def add_metadata(w, name: str, s: Shape, file_type: int, tokenizer: str) -> None:
    """The keys llama.cpp reads for a llama / qwen2 / gemma3 model, then the tokenizer's
    (with a vision tower: plus Gemma 3's image tokens, and a template that places images)."""
    a = s.arch
    w.add_type("model")
    w.add_name(f"{name} (random weights)")
    w.add_uint32(f"{a}.vocab_size", s.vocab)
    w.add_uint32(f"{a}.context_length", s.context)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.feed_forward_length", s.ffn)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps)
    w.add_float32(f"{a}.rope.freq_base", s.rope_theta)
    w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    if s.sliding_window:
        w.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
    if s.rope_linear:
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", s.rope_linear)
    w.add_uint32("general.file_type", file_type)
    w.add_uint32("general.quantization_version", 2)
    for key, value, vtype, sub in tokenizer_fields(tokenizer):
        if s.vision and key == "tokenizer.ggml.tokens":
            value = [*value, *IMAGE_TOKENS]
        elif s.vision and key == "tokenizer.ggml.token_type":
            value = [*value, *[CONTROL] * len(IMAGE_TOKENS)]
        elif s.vision and key == "tokenizer.chat_template":
            value = VISION_CHAT_TEMPLATE
        w.add_key_value(key, value, vtype, sub_type=sub)


def write_shaped_gguf(
    path: str | os.PathLike, shape: Shape | str, dtype: str = "F16", seed: int = 0, tokenizer: str | None = None
) -> Path:
    """Write a GGUF of `shape` (a Shape or a SHAPES name) with random weights to `path`.

    dtype: "F16" or "F32", the type of the 2-D weights (1-D tensors are always F32).
    tokenizer: the GGUF whose tokenizer.* keys to copy (default: the default model's);
    its vocabulary must have shape.vocab tokens (less Gemma 3's image tokens, with a vision tower).
    """
    from gguf import LlamaFileType

    from rawpage.loader.default_model import default_model_path

    name = shape if isinstance(shape, str) else Path(path).stem
    s = SHAPES[shape] if isinstance(shape, str) else shape
    file_type = LlamaFileType.MOSTLY_F16 if dtype == "F16" else LlamaFileType.ALL_F32

    def keys(w) -> None:
        add_metadata(w, name, s, int(file_type), tokenizer or default_model_path())

    specs = tensor_specs(s)
    return write_streamed(path, s.arch, keys, specs, lambda spec, i, t: tensor_data(spec, s, i, seed, t), dtype)


def write_mmproj(path: str | os.PathLike, shape: Shape | str, seed: int = 0) -> Path:
    """The shape's vision tower and projector as an F16 clip GGUF (llama.cpp's mmproj) at `path`."""
    import gguf

    name = shape if isinstance(shape, str) else Path(path).stem
    s = SHAPES[shape] if isinstance(shape, str) else shape
    v = s.vision

    def keys(w) -> None:  # what convert_hf_to_gguf --mmproj writes for Gemma 3
        w.add_type(gguf.GGUFType.MMPROJ)
        w.add_name(f"{name} vision tower (random weights)")
        w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16))
        w.add_clip_has_vision_encoder(True)
        w.add_clip_projector_type("gemma3")
        for what, value in {
            "projection_dim": s.hidden,
            "image_size": v.image,
            "patch_size": v.patch,
            "embedding_length": v.hidden,
            "feed_forward_length": v.ffn,
            "block_count": v.layers,
            "head_count": v.heads,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "attention_layernorm_eps": v.eps,
            "use_gelu": True,
        }.items():
            getattr(w, "add_vision_" + what)(value)
        pool = v.image // v.patch // round(v.tokens**0.5)
        if pool != 4:  # written where not clip.cpp's default, as the converter does
            w.add_vision_projector_scale_factor(pool)

    specs = mmproj_specs(v, s.hidden)
    # a stream of its own per tensor, apart from the text model's
    return write_streamed(
        path, "clip", keys, specs, lambda spec, i, t: tensor_data(spec, s, i, seed + (1 << 20), t), "F16"
    )


def write_streamed(path: str | os.PathLike, arch: str, keys, specs: list[TensorSpec], data, dtype: str) -> Path:
    """A GGUF written tensor by tensor: keys(writer) adds the metadata, data(spec, index, numpy
    dtype) gives each tensor's values; `dtype` ("F16" or "F32") is the 2-D matrices' type."""
    from gguf import GGUFWriter

    np_dtype = {"F16": np.float16, "F32": np.float32}[dtype]
    path, part = Path(path), Path(f"{path}.part")  # renamed when complete: a crash leaves no "existing" file
    w = GGUFWriter(part, arch)
    keys(w)
    # Tensor infos first (the header holds every offset), then the data one tensor at a time.
    for spec in specs:
        t = np.dtype(stored_dtype(spec, np_dtype))
        w.add_tensor_info(spec.name, spec.shape, t, math.prod(spec.shape) * t.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, spec in enumerate(specs):
        w.write_tensor_data(data(spec, i, np_dtype))
    w.close()
    part.rename(path)
    return path


def quantize(binary: Path, f16: Path, out: Path, qtype: str, threads: int) -> None:
    part = out.with_name(out.name + ".part")
    cmd = [str(binary), str(f16), str(part), qtype, str(threads)]
    print("+ " + " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama-quantize failed ({done.returncode}) for {out.name}:\n{done.stderr[-3000:]}")
    part.rename(out)


def make(name: str, args: argparse.Namespace) -> None:
    """The F16 file of one shape, then each requested format from it, and the mmproj of a shape
    with a vision tower; existing files are kept."""
    f16 = args.out_dir / f"{name}-F16.gguf"
    wanted = [t for t in args.types if not (args.out_dir / f"{name}-{t}.gguf").exists()]
    made_f16 = False
    if (wanted or args.keep_f16) and not f16.exists():
        print(f"writing {f16}", file=sys.stderr)
        write_shaped_gguf(f16, name, seed=args.seed)
        made_f16 = True
    for qtype in wanted:
        quantize(args.llama_quantize, f16, args.out_dir / f"{name}-{qtype}.gguf", qtype, args.threads)
    if wanted and made_f16 and not args.keep_f16:
        f16.unlink()
    mmproj = args.out_dir / f"mmproj-{name}-F16.gguf"  # llama.cpp ships mmproj files F16, unquantized
    if SHAPES[name].vision and not mmproj.exists():
        print(f"writing {mmproj}", file=sys.stderr)
        write_mmproj(mmproj, name, seed=args.seed)
    for path in sorted([*args.out_dir.glob(f"{name}-*.gguf"), *args.out_dir.glob(f"mmproj-{name}-*.gguf")]):
        print(f"{path}  {path.stat().st_size / 2**30:.2f} GiB")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help=f"comma-separated, of: {', '.join(SHAPES)}")
    ap.add_argument("--out-dir", type=Path, default=ROOT.parent / "models-shaped", help="default: %(default)s")
    ap.add_argument("--types", default=",".join(TYPES), help="llama-quantize types to make (default: %(default)s)")
    ap.add_argument("--f16-only", action="store_true", help="write the F16 file only, no llama-quantize")
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    ap.add_argument("--llama-quantize", type=Path, default=DEFAULT_QUANTIZE, help="default: %(default)s")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-quantize threads (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.shapes = args.shape.split(",")
    if unknown := [s for s in args.shapes if s not in SHAPES]:
        ap.error(f"unknown --shape {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    args.types = [] if args.f16_only else [t.strip() for t in args.types.split(",") if t.strip()]
    args.keep_f16 = args.keep_f16 or args.f16_only
    if args.types and not args.llama_quantize.is_file():
        ap.error(
            f"llama-quantize not found at {args.llama_quantize}: build it with tools/build_peers.sh, "
            "pass --llama-quantize PATH, or write the F16 file alone with --f16-only"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        make(name, args)


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: make `rawpage` importable from this checkout
        sys.path.insert(0, str(ROOT))
    main()
