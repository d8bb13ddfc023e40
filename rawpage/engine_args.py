"""EngineArgs: every engine setting, as `LLM(...)` keywords and as vLLM-named CLI flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rawpage.flags import add_flags, flag, given_flags, log_inert_flags
from rawpage.loader.gguf_file import SUPPORTED_TENSOR_TYPES
from rawpage.loader.hub import looks_like_hub_id
from rawpage.memory import DEFAULT_CPU_KV_CACHE, GiB
from rawpage.quantization.select import QUANTIZATION_FLAG_CHOICES
from rawpage.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    from rawpage.backends.base import Backend
    from rawpage.loader import Checkpoint

logger = logging.getLogger("rawpage")

DEVICES = ["auto", "cpu", "sim", "cuda"]
DTYPES = ["auto", "float32", "float16", "bfloat16", "half"]
LOAD_FORMATS = ["auto", "safetensors", "gguf", "dummy"]  # vLLM's others (pt, npcache, ...) read formats we do not
BLOCK_SIZES = [8, 16, 32]
PREEMPTION_MODES = ["recompute", "swap"]
SCHEDULING_POLICIES = ["fcfs", "priority"]
FP8_KV_CACHE_DTYPES = ["fp8", "fp8_e4m3"]  # two spellings of one cache: e4m3 codes with per-tensor scales
KV_CACHE_DTYPES = ["auto", *FP8_KV_CACHE_DTYPES, "float16"]
CPU_KERNELS = ["auto", "native", "numpy"]
RUNNERS = ["generate", "pooling"]
POOLING_TYPES = ["auto", "last", "mean", "cls"]
# --max-num-batched-tokens when it is not given, per device: a GPU step spends less time per
# token on a longer prefill chunk, a CPU step's time grows with its tokens (and its activations).
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cpu": 2048, "sim": 2048, "cuda": 8192}

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_kv_cache_scales(text: str) -> np.ndarray | None:
    """'calculate' -> None (compute at load); 'S' or 'K,V' -> (2,) float32 (k_scale, v_scale)."""
    if text == "calculate":
        return None
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or not all(np.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"kv_cache_scales must be 'calculate', one positive number, or 'K,V' (two), got {text!r}")
    return np.array(values * (3 - len(values)), np.float32)[:2]


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            return min(total, int(f.read()))
    except (OSError, ValueError):  # no cgroup v2 limit ("max")
        return total


def output_memory_bound(given: str | int | None) -> int:
    """--max-request-output-memory in bytes: as given, else sized to the machine (issue 44)."""
    return machine_memory() // 8 if given is None else parse_bytes(given)


def parse_bytes(text: str | int | float) -> int:
    """'2GiB', '512MiB', '1.5GB' or a plain number of bytes -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 512MiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def json_object(value: dict | str | None, name: str) -> dict | None:
    """A dict flag given as a dict (LLM keywords) or as JSON text (the CLI)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"--{name.replace('_', '-')} is not valid JSON: {e}") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"--{name.replace('_', '-')} must be a JSON object, got {type(value).__name__}")
    return value


def _mm_limits(text: str) -> dict[str, int]:
    """--limit-mm-per-prompt '{"image": N}' (vLLM's JSON form)."""
    try:
        limits = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected JSON such as '{{\"image\": 4}}', got {text!r}") from None
    if not isinstance(limits, dict) or set(limits) - {"image"}:
        raise argparse.ArgumentTypeError("rawpage takes images only: '{\"image\": N}'")
    if not all(isinstance(n, int) and n >= 0 for n in limits.values()):
        raise argparse.ArgumentTypeError("--limit-mm-per-prompt counts must be integers >= 0")
    return limits


@dataclass
class EngineArgs:
    """Every engine setting. Each `flag(...)` field is also a CLI flag (rawpage/flags.py)."""

    model: str | None = flag(
        None, "Hugging Face model folder or .gguf file", default_text="the embedded SmolLM2-135M-Instruct"
    )
    served_model_name: str | list[str] | None = flag(
        None,
        "model name reported by the API; several names: the first is reported, every one is accepted as 'model'",
        default_text="derived from --model",
        nargs="+",
    )
    device: str = flag(
        "auto",
        "cpu: NumPy; sim: our CUDA kernels run on the CPU (slow, for testing); cuda: CuPy "
        "and our kernels; auto: cuda if a GPU is present",
        choices=DEVICES,
    )
    dtype: str = flag(
        "auto",
        "dtype; auto = float32 on cpu (its vision towers bf16 on AVX512-BF16), the checkpoint's on cuda",
        choices=DTYPES,
    )
    load_format: str = flag(
        "auto",
        "auto: a model folder's safetensors or a .gguf file; safetensors, gguf: the same, refused if --model holds "
        "the other; dummy: random weights of the shapes in --model's config.json, for benchmarks",
        choices=LOAD_FORMATS,
    )
    max_model_len: int | None = flag(None, "longest prompt + output, in tokens", default_text="the model's")
    max_num_seqs: int = flag(256, "most sequences in one batch")
    max_num_batched_tokens: int | None = flag(
        None,
        "most tokens in one forward pass; longer prompts are prefilled in chunks",
        default_text="{cpu} on cpu and sim, {cuda} on cuda".format(**DEFAULT_MAX_NUM_BATCHED_TOKENS),
    )
    block_size: int = flag(16, "tokens per KV block", choices=BLOCK_SIZES)
    kv_cache_memory: int | str | None = flag(
        None,
        "memory for the KV cache, e.g. 2GiB (vLLM's --kv-cache-memory-bytes)",
        type=parse_bytes,
        aliases=("--kv-cache-memory-bytes",),
        default_text=f"{DEFAULT_CPU_KV_CACHE // GiB}GiB on cpu, less if --max-num-seqs x --max-model-len need "
        "less; on cuda from --gpu-memory-utilization",
    )
    kv_cache_dtype: str = flag(
        "auto",
        "KV cache element type: auto = the model dtype (on cpu float16 for a float16 checkpoint or a GGUF, as "
        "llama.cpp's, unless --dtype float32; else float32); fp8 (or fp8_e4m3) = e4m3 with per-tensor scales, "
        "1 byte an element, so about twice the blocks of a 16-bit cache fit; float16 = 2 bytes an element "
        "(--device cpu only: twice the blocks of its float32 cache)",
        choices=KV_CACHE_DTYPES,
    )
    kv_cache_scales: str = flag(
        "calculate",
        "FP8 KV cache scales (value = scale x e4m3 code): calculate = from a calibration prefill at load; "
        "one number for K and V, or 'K,V' (vLLM's default is 1.0)",
    )
    gpu_memory_utilization: float = flag(0.9, "fraction of GPU memory for weights, activations and KV cache")
    num_gpu_blocks_override: int | None = flag(None, "use exactly this many KV blocks (tests, experiments)")
    swap_space: float = flag(4.0, "GiB of CPU memory for swapped-out KV blocks")
    preemption_mode: str = flag(
        "recompute", "what happens to a preempted sequence's KV cache", choices=PREEMPTION_MODES
    )
    enable_prefix_caching: bool = flag(True, "reuse KV blocks of identical prompt prefixes across requests")
    enforce_eager: bool = flag(
        False, "do not replay decode steps from graphs (CUDA graphs; cpu: recorded kernel calls)"
    )
    chat_template: str | None = flag(None, "Jinja chat template, or a file holding one", default_text="the model's")
    max_logprobs: int = flag(20, "most logprobs (and prompt logprobs) one request may ask for")
    max_request_output_memory: int | str | None = flag(
        None,
        "most memory one request's outputs may hold until its reply is sent (text, token ids, logprobs), "
        "estimated at admission from n, max_tokens, logprobs and prompt_logprobs; a request over it is "
        "refused with a 400, e.g. 2GiB",
        type=parse_bytes,
        default_text="1/8 of this machine's memory",
    )
    scheduling_policy: str = flag(
        "fcfs",
        "fcfs: first come, first served; priority: a request's 'priority' field orders the queue (lower first)",
        choices=SCHEDULING_POLICIES,
    )
    seed: int = flag(0, "seed for requests that do not bring their own")
    cpu_threads: int | None = flag(
        None,
        "cpu: BLAS threads per forward pass, at most the cores this process may use, measured every 0.25 s",
        default_text="the usable cores other processes leave idle",
    )
    cpu_kernels: str = flag(
        "auto",
        "cpu: native = our C kernels (GGUF blocks kept quantized with int8 dot products, paged attention read "
        "in place, the small ops fused; built at first use with the system compiler); numpy = the float32 "
        "NumPy reference path; auto = native where it builds, else numpy (the log says which runs)",
        choices=CPU_KERNELS,
    )
    limit_mm_per_prompt: dict[str, int] | None = flag(
        None,
        "images one prompt may carry, as vLLM spells it: '{\"image\": N}' (a vision-language model)",
        type=_mm_limits,
        default_text='{"image": 8}',
    )
    mm_processor_kwargs: dict | str | None = flag(
        None,
        "the image processor's values over the model's, as vLLM spells it: Qwen2.5-VL takes "
        '\'{"min_pixels": N, "max_pixels": M}\' (the area each image is resized within, so its tokens); '
        "any key the model's processor does not take is refused",
        default_text="none",
    )
    mmproj: str | None = flag(
        None,
        "a GGUF model's vision tower and projector: llama.cpp's mmproj-*.gguf file, as llama-server's --mmproj "
        "(Gemma 3); without it a GGUF model takes text only",
        default_text="none",
    )
    allowed_local_media_path: str | None = flag(
        None, "file:// image URLs in requests are read from under this folder only (off: no file:// URLs)"
    )
    allowed_media_domains: list[str] = flag(
        help="http(s) image URLs are fetched from these domains (and their subdomains) only, never from a "
        "non-public address (off: no http(s) URLs)",
        nargs="+",
        factory=list,
    )
    enable_lora: bool = flag(False, "serve LoRA adapters (PEFT format) on top of the model, many in one batch")
    max_loras: int = flag(1, "LoRA adapters resident on the device at once (slots); more wait their turn")
    max_lora_rank: int = flag(16, "largest LoRA rank an adapter may have (every slot is this size)")
    max_cpu_loras: int | None = flag(
        None,
        "LoRA adapters kept in host memory (known by name); loading one more forgets the least recently used "
        "one that no request is using",
        default_text="max(8, --max-loras)",
    )
    lora_modules: list[str] = flag(
        help="LoRA adapters to load at startup, as name=path pairs (PEFT folders); needs --enable-lora",
        nargs="+",
        factory=list,
    )
    # Structured-output grammars are gated before llguidance compiles them: it overflows its
    # stack (killing the process) on long rule chains. Measured with llguidance 1.9.1 on an
    # 8 MiB stack (the validator child's): a $defs chain linked by $refs through
    # `properties` crashes between 900 and 950 refs, a chain of Lark rules between 2,500
    # and 2,800 rules (about 8.5 KiB and 3 KiB of stack a link). The defaults leave 3.5x and
    # 2.5x of that stack unused, and the parent compiles on 32 MiB threads. Real schemas and
    # grammars sit far below (an OpenAPI tool's schema: tens of $refs; a SQL grammar: ~200
    # rules). A 4,096-item choice compiles in ~0.05 s, a 50,000-item one in ~3.6 s.
    max_grammar_bytes: int | str = flag(
        "256KiB", "largest structured-output grammar (JSON schema, regex, choice or Lark text)", type=parse_bytes
    )
    max_grammar_rules: int = flag(1000, "most rule and terminal definitions in a Lark grammar")
    max_grammar_refs: int = flag(256, "most $ref references in a JSON schema (its $defs chain is no longer)")
    max_grammar_choices: int = flag(4096, "most items in a choice list, and enum / anyOf / oneOf items in a schema")
    grammar_compile_timeout: float = flag(
        10.0, "seconds a grammar may take to validate (in a child process) before it is refused as too complex"
    )
    # vLLM's flags, accepted so that a vLLM command line runs (or says why it cannot).
    revision: str | None = flag(None, "hub model revision: branch, tag or commit", default_text="main")
    tokenizer: str | None = flag(None, "the tokenizer; rawpage reads it from the model", default_text="--model")
    trust_remote_code: bool = flag(
        False,
        "accepted for vLLM compatibility: rawpage never runs code from a model repository, so this changes nothing",
    )
    quantization: str = flag(
        "auto",
        "Linear weights: auto = as the checkpoint packs them (GGUF, AWQ, GPTQ, FP8); fp8 = "
        "quantize a float checkpoint to FP8 e4m3 at load; q8_0 = quantize a float checkpoint to GGUF Q8_0 "
        "blocks at load (1.06 bytes a weight); none = dequantize at load; gguf, awq, gptq = auto, checked "
        "against the checkpoint",
    )
    tensor_parallel_size: int = flag(
        1,
        "split each layer's heads and FFN columns over this many ranks, one process (and on cuda one GPU) each; "
        "llama and qwen2 families",
        aliases=("-tp",),
    )
    pipeline_parallel_size: int = flag(1, "only 1: rawpage splits a model by tensor parallelism", aliases=("-pp",))
    enable_chunked_prefill: bool | None = flag(
        None, "accepted for vLLM compatibility: always on (prompts over --max-num-batched-tokens prefill in chunks)"
    )
    download_dir: str | None = flag(
        None, "where hub ids are downloaded and looked up", default_text="the Hugging Face cache"
    )
    generation_config: str = flag(
        "auto",
        "the sampling defaults for fields a request leaves out: auto = the model's generation_config.json "
        "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens); vllm = the API's neutral "
        "defaults; or a folder holding a generation_config.json",
    )
    override_generation_config: dict | str | None = flag(
        None,
        'sampling defaults laid over --generation-config\'s, as JSON: {"temperature": 0.5, "max_new_tokens": 256}',
        default_text="none",
    )
    disable_log_stats: bool = flag(False, "no periodic stats line in the log")
    hf_overrides: dict | str | None = flag(
        None,
        'keys laid over the model\'s config.json, as JSON: {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, '
        '"max_position_embeddings": 131072}; on a GGUF only rope_scaling, rope_theta, max_position_embeddings and (Gemma) query_pre_attn_scalar',
        default_text="none",
    )
    rope_scaling: dict | str | None = flag(
        None,
        'RoPE scaling, as JSON: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}; '
        "also linear, dynamic and llama3 (the same as --hf-overrides '{\"rope_scaling\": ...}')",
        default_text="the model's",
    )
    rope_theta: float | None = flag(None, "the RoPE base, in place of the model's", default_text="the model's")
    speculative_config: dict | str | None = flag(
        None,
        'speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, '
        '"prompt_lookup_max": 4} or {"model": PATH, "num_speculative_tokens": 4}',
        default_text="off",
    )
    runner: str = flag(
        "generate",
        "generate: text out (chat, completions); pooling: one vector per input (embeddings), prefill only",
        choices=RUNNERS,
    )
    pooling_type: str = flag(
        "auto",
        "--runner pooling: how the last layer's hidden states become one vector (last, mean or cls); auto = "
        "the checkpoint's sentence-transformers pooling config (1_Pooling/config.json), else last",
        choices=POOLING_TYPES,
        type=str.lower,
    )
    log_stats_interval: float = 5.0  # seconds between stats lines while busy; 0 = off
    # The flags the user gave (from_cli_args): a flag with no effect here is logged only if given.
    given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_bytes(self.kv_cache_memory)
        self.max_grammar_bytes = parse_bytes(self.max_grammar_bytes)
        self.max_request_output_memory = output_memory_bound(self.max_request_output_memory)
        if self.disable_log_stats:
            self.log_stats_interval = 0
        self._check_vllm_flags()
        self.pooling_type = self.pooling_type.lower()  # vLLM spells them LAST, MEAN, CLS
        parse_kv_cache_scales(self.kv_cache_scales)  # a bad value fails here, before anything loads
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self.hf_overrides = json_object(self.hf_overrides, "hf_overrides")
        self.mm_processor_kwargs = json_object(self.mm_processor_kwargs, "mm_processor_kwargs")
        self.rope_scaling = json_object(self.rope_scaling, "rope_scaling")
        self.override_generation_config = json_object(self.override_generation_config, "override_generation_config")
        for f in dataclasses.fields(self):
            choices, value = f.metadata.get("choices"), getattr(self, f.name)
            if choices and value not in choices:
                raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        checks = [
            (self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1"),
            (
                self.generation_config in ("auto", "vllm") or os.path.isdir(self.generation_config),
                "generation_config",
                "must be auto, vllm or a folder that holds a generation_config.json",
            ),
            (self.max_model_len is None or self.max_model_len >= 1, "max_model_len", "must be >= 1"),
            (
                self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
                "max_num_batched_tokens",
                "must be >= 1",
            ),
            (0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]"),
            (self.swap_space >= 0, "swap_space", "must be >= 0"),
            (self.max_logprobs >= 0, "max_logprobs", "must be >= 0"),
            (self.grammar_compile_timeout > 0, "grammar_compile_timeout", "must be > 0"),
            (self.max_loras >= 1 and self.max_lora_rank >= 1, "max_loras", "and max_lora_rank must be >= 1"),
            (self.enable_lora or not self.lora_modules, "lora_modules", "needs --enable-lora"),
            (
                self.max_cpu_loras is None or self.max_cpu_loras >= max(self.max_loras, len(self.lora_modules)),
                "max_cpu_loras",
                "must be at least --max-loras and the number of --lora-modules",
            ),
            (
                not (self.enable_lora and self.tensor_parallel_size > 1),
                "enable_lora",
                "does not work with --tensor-parallel-size > 1 yet (adapter slots are not sharded)",
            ),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

    def _check_vllm_flags(self) -> None:
        """vLLM flags whose other values rawpage cannot honour: refuse them before anything loads."""
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"--tensor-parallel-size {self.tensor_parallel_size}: must be >= 1 (ranks: processes, one GPU each)"
            )
        if self.quantization not in QUANTIZATION_FLAG_CHOICES:
            raise ValueError(
                f"--quantization {self.quantization}: not supported; choose one of "
                f"{', '.join(QUANTIZATION_FLAG_CHOICES)} (GGUF tensor types: {', '.join(sorted(SUPPORTED_TENSOR_TYPES))})"
            )
        if self.tokenizer not in (None, self.model):
            raise ValueError(
                f"--tokenizer {self.tokenizer}: rawpage reads the tokenizer from the model itself; "
                "a separate tokenizer is not supported, so leave --tokenizer out"
            )
        if self.trust_remote_code:
            logger.info("--trust-remote-code: accepted; rawpage never runs code from a model repository")
        if self.pipeline_parallel_size != 1:
            raise ValueError(
                f"--pipeline-parallel-size {self.pipeline_parallel_size}: rawpage has no pipeline parallelism; "
                "leave it at 1 and split the model with --tensor-parallel-size"
            )
        if isinstance(self.served_model_name, list) and len(self.served_model_name) == 1:
            self.served_model_name = self.served_model_name[0]

    def load_checkpoint(self) -> Checkpoint:
        """The checkpoint an engine (or a tensor-parallel rank) serves, as these flags name it."""
        from rawpage.loader import load_checkpoint

        return load_checkpoint(
            self.model,
            self.load_format,
            self.seed,
            self.revision,
            self.download_dir,
            self.config_overrides(),
            mmproj=self.mmproj,
        )

    def sampling_defaults(self, ckpt: Checkpoint) -> dict[str, Any]:
        """SamplingParams keywords for what a request leaves out (--generation-config), logged."""
        from rawpage.generation_config import sampling_defaults

        return sampling_defaults(
            self.generation_config, ckpt.path, ckpt.generation_config, self.override_generation_config
        )

    def config_overrides(self) -> dict[str, Any]:
        """What is laid over the model's config: --hf-overrides, then --rope-scaling and --rope-theta."""
        out = dict(self.hf_overrides or {})
        if self.rope_scaling is not None:
            out["rope_scaling"] = self.rope_scaling
        if self.rope_theta is not None:
            out["rope_theta"] = self.rope_theta
        return out

    def batched_tokens(self, device: str) -> int:
        """--max-num-batched-tokens, or its default on `device` (a backend's name)."""
        return self.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS[device]

    @property
    def fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype in FP8_KV_CACHE_DTYPES

    def log_inert_flags(self, backend: Backend) -> None:
        """One line for each flag the user set that cannot apply on `backend` or beside the other flags."""
        on_gpu = backend.memory is not None
        rules = {
            "gpu_memory_utilization": (not on_gpu and f"on {backend.name} the KV cache pool is --kv-cache-memory")
            or (self.kv_cache_memory is not None and "--kv-cache-memory sets the KV cache pool"),
            "enforce_eager": not backend.supports_graphs and f"the {backend.name} backend captures no graphs",
            "swap_space": self.preemption_mode != "swap"
            and "preempted sequences are recomputed, not swapped (--preemption-mode swap uses it)",
            "max_loras": not self.enable_lora and "LoRA is off (--enable-lora)",
            "max_lora_rank": not self.enable_lora and "LoRA is off (--enable-lora)",
            "kv_cache_scales": not self.fp8_kv_cache and "the KV cache is not fp8 (--kv-cache-dtype fp8)",
            "revision": not (self.model and looks_like_hub_id(self.model)) and "the model is local, not a hub id",
            "download_dir": not (self.model and looks_like_hub_id(self.model)) and "the model is not a hub id",
            "enable_chunked_prefill": "chunked prefill is always on",
        }
        log_inert_flags(self.given | self._changed(), rules)

    def _changed(self) -> set[str]:
        """Fields set away from their defaults (LLM(...) keywords, where nothing records what was given)."""
        fields = [f for f in dataclasses.fields(self) if "help" in f.metadata and f.default is not dataclasses.MISSING]
        return {f.name for f in fields if getattr(self, f.name) != f.default}

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
        add_flags(parser.add_argument_group("engine"), EngineArgs, skip)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        given = given_flags(cls, args)
        return cls(**given, given=frozenset(given))

    def replace(self, **kw: Any) -> EngineArgs:
        return dataclasses.replace(self, **kw)
