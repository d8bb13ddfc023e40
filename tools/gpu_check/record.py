"""The GPU check's permanent record: docs/gpu/<date>-<gpu>-<commit>.json (and .md).

summary.py merges the steps' results; this module picks the figures a reader
of the record needs under fixed keys, so that two runs compare key by key:

    gpu, commit, date, env
    kernel_tests   passed, failed, errors, skipped, unexpected_skips, ok
    memcheck       compute-sanitizer's verdict
    parity         per dtype: prefill/decode errors against transformers, ok
    microbench     decode/prefill attention and rms_norm against copy and SDPA
    throughput     rawpage and transformers' static batching, and their ratio
    decode_b1, decode_b256       wall_ms, gpu_ms, roofline_ms (graphs on), ...
    breakdown_b1, breakdown_b256 ncu's per-kernel-family times of one eager step
    lora, spec     multi-LoRA decode; n-gram speculative decoding at batch 1
    table_md       the summary table, ready for docs/benchmarks.md

A figure the run did not produce is null, never absent.
"""

from __future__ import annotations

import json
import os
import re

DECODE_KEYS = ("wall_ms", "gpu_ms", "roofline_ms")


def record_name(date: str, gpu: str, commit: str) -> str:
    """'2026-11-30', 'NVIDIA H200', '04f1a5f' -> '2026-11-30-nvidia-h200-04f1a5f'."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "unknown-gpu"
    return f"{date}-{slug}-{commit or 'unknown'}"


def _decode(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {**{k: d.get(k) for k in DECODE_KEYS}, **d}


def build_record(merged: dict, date: str, gpu: str, commit: str, table_md: str) -> dict:
    """merged: summary.py's merge of the parts (env, parity, microbench, throughput_rawpage,
    throughput_hf, breakdown_b*, kernel_tests, memcheck)."""
    ours, hf = merged.get("throughput_rawpage"), merged.get("throughput_hf")
    throughput = None
    if ours or hf:
        throughput = {
            "rawpage": {k: v for k, v in (ours or {}).items() if not k.startswith("decode_b")} or None,
            "transformers": hf,
            "ratio": ours["output_tok_s"] / hf["output_tok_s"] if ours and hf else None,
        }
    record = {
        "gpu": gpu,
        "commit": commit,
        "date": date,
        "env": merged.get("env"),
        "kernel_tests": merged.get("kernel_tests"),
        "memcheck": merged.get("memcheck"),
        "parity": merged.get("parity"),
        "families": merged.get("families"),  # parity per family at real shapes (families.py)
        "quant": merged.get("quant"),  # quantized-weight rows (quant.py)
        "microbench": merged.get("microbench"),
        "throughput": throughput,
        "lora": merged.get("lora"),
        "spec": merged.get("spec"),  # n-gram speculation at batch 1 (spec.py)
        "vision": merged.get("vision"),  # the tiny Gemma 3 VLM against transformers (vision.py)
    }
    for batch in (1, 256):
        record[f"decode_b{batch}"] = _decode((ours or {}).get(f"decode_b{batch}"))
    for batch in (1, 256):
        record[f"breakdown_b{batch}"] = merged.get(f"breakdown_b{batch}")
    record["table_md"] = table_md
    return record


def write_record(record: dict, folder: str) -> str:
    """Writes <folder>/<name>.json and <name>.md; returns the JSON's path."""
    os.makedirs(folder, exist_ok=True)
    base = os.path.join(folder, record_name(record["date"], record["gpu"], record["commit"]))
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    with open(base + ".md", "w") as f:
        f.write(record["table_md"] + "\n")
    return base + ".json"
