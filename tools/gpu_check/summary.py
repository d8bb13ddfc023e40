"""The GPU check's last word: merge the steps' results into one JSON and a short table.

    python -m tools.gpu_check.summary --parts DIR --out-json results.json --out-md summary.md \\
        [--kernel-log kernel_tests.log] [--memcheck-log memcheck.log]

Each step wrote DIR/<step>.json; a step that failed or was skipped left none,
and its rows say so. The table is printed (it is the last thing the check
prints) and written as Markdown, ready to paste into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections.abc import Callable

from tools.gpu_check import families, quant, vision
from tools.gpu_check import spec as spec_step

# Skips that are right on a GPU; any other skip in the kernel step is a failure. The
# second: tests of launch code on a simulated GPU of one SM (a real GPU's count is fixed).
EXPECTED_SKIPS = ("a trap on a GPU poisons the CUDA context", "the SM count is a simulator parameter")


def pytest_result(path: str | None) -> dict | None:
    """Counts from pytest's last summary line in a log, and the skips that were not
    expected (from the -ra short summary: 'SKIPPED [N] file:line: reason')."""
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", ln)]
    if not lines:
        return None
    summary = re.sub(r"^[=\s]+|[=\s]+$", "", lines[-1])
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", summary):
        counts["errors" if word.startswith("error") else word] = int(n)
    unexpected = [
        f"{n} x {reason.strip()}"
        for n, reason in re.findall(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", text, re.M)
        if not any(e in reason for e in EXPECTED_SKIPS)
    ]
    ok = counts["passed"] > 0 and not counts["failed"] and not counts["errors"] and not unexpected
    return {**counts, "unexpected_skips": unexpected, "ok": ok, "summary": summary}


def kernel_figure(k: dict | None) -> str:
    if not k:
        return "not run"
    return k["summary"] + "".join(f"; unexpected skip: {u}" for u in k["unexpected_skips"])


def memcheck_errors(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if m:
        return f"{m.group(1)} errors"
    return "skipped (compute-sanitizer not found)" if "not found" in text else "no sanitizer summary (see memcheck.log)"


# issue 11: decode step wall time over its roofline, graphs on
DECODE_TARGET = {1: 1.5, 256: 1.8}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def _fp8_and_window_decode_rows(mb: dict, verdict: Callable[[bool | None], str]) -> list[tuple[str, str, str, str]]:
    """Issue 18's FP8 KV decode (time against bfloat16 at batch 256, ctx 1024) and issue 17's
    sliding-window decode (GB/s of the window's K/V against copy bandwidth)."""
    out = []
    if "decode_fp8" in mb:
        f = mb["decode_fp8"]
        fig = f"{f['fp8']['ms']:.3f} ms vs bf16 {f['bf16']['ms']:.3f} ms ({f['time_ratio']:.2f}x)"
        out.append(("FP8 KV decode attention B=256 ctx=1024", fig, "<= 0.6x bf16", verdict(f["time_ratio"] <= 0.6)))
    if "decode_window" in mb:
        w = mb["decode_window"]
        fig = f"{w['ms']:.3f} ms, {w['gbs']:.0f} GB/s of in-window K/V = {w['fraction_of_copy']:.0%} of copy"
        name = f"sliding-window decode B=64 ctx={w['context']} W={w['window']}"
        out.append((name, fig, ">= 70% of copy", verdict(w["fraction_of_copy"] >= 0.7)))
    return out


def rows(r: dict, kernel: dict | None, memcheck: str | None) -> list[tuple[str, str, str, str]]:
    """(check, figure, target, verdict) rows; verdict is ok / MISS / — (not measured)."""

    def verdict(ok: bool | None) -> str:
        return "—" if ok is None else ("ok" if ok else "MISS")

    out = []
    env = r.get("env", {})
    out.append(
        (
            "GPU",
            f"{env.get('gpu', '?')}, CUDA {env.get('runtime_cuda', '?')} (driver {env.get('driver_cuda', '?')}), "
            f"CuPy {env.get('cupy', '?')}, torch {env.get('torch', '?')}",
            "",
            "",
        )
    )
    ok = bool(kernel and kernel["ok"])
    out.append(("kernel tests (cuda)", kernel_figure(kernel), "all pass, no unexpected skip", verdict(ok)))
    ran = memcheck and not memcheck.startswith("skipped")
    out.append(
        (
            "compute-sanitizer memcheck",
            memcheck or "not run",
            "0 errors",
            verdict(memcheck.startswith("0 errors") if ran else None),
        )
    )
    for dtype in ("bfloat16", "float32"):
        p = r.get("parity", {}).get(dtype)
        if p:
            fig = (
                f"prefill max abs {_fmt(p['prefill'].get('max_abs'), '.2e')} rel {p['prefill']['max_rel']:.2e}; "
                f"decode max abs {_fmt(p['decode'].get('max_abs'), '.2e')} rel {p['decode']['max_rel']:.2e}; "
                f"argmax agree {p['prefill']['argmax_agree']:.1%}"
            )
            out.append((f"parity vs transformers, {dtype}", fig, f"rel < {p['tolerance']:g}", verdict(p["ok"])))
        else:
            out.append((f"parity vs transformers, {dtype}", "not measured", "", "—"))
    mb = r.get("microbench", {})
    sdpa_dec = {d["context"]: d for d in mb.get("sdpa_decode", [])}
    for d in mb.get("decode", []):
        s = sdpa_dec.get(d["context"])
        fig = (
            f"{d['gbs']:.0f} GB/s = {d['fraction_of_copy']:.0%} of copy ({mb['copy_gbs']:.0f} GB/s); "
            f"SDPA {_fmt(s and s['gbs'], '.0f')} GB/s"
        )
        out.append(
            (f"decode attention B=64 ctx={d['context']}", fig, ">= 70% of copy", verdict(d["fraction_of_copy"] >= 0.7))
        )
    out += _fp8_and_window_decode_rows(mb, verdict)
    if "prefill" in mb:
        p, s = mb["prefill"], mb.get("sdpa_prefill")
        frac = p.get("fraction_of_sdpa")
        fig = f"{p['tflops']:.0f} TFLOP/s; SDPA flash {_fmt(s and s['tflops'], '.0f')} TFLOP/s"
        fig += f" ({frac:.0%})" if frac else ""
        out.append(("prefill attention 8x2048 causal", fig, ">= 50% of SDPA flash", verdict(frac and frac >= 0.5)))
    if "rms_norm" in mb:
        n = mb["rms_norm"]
        out.append(("rms_norm 16384x4096", f"{n['gbs']:.0f} GB/s ({n['gbs'] / mb['copy_gbs']:.0%} of copy)", "", ""))
    ours, hf = r.get("throughput_rawpage"), r.get("throughput_hf")
    if ours:
        ratio = ours["output_tok_s"] / hf["output_tok_s"] if hf else None
        fig = f"{ours['output_tok_s']:.0f} out tok/s, {ours['total_tok_s']:.0f} total tok/s"
        if hf:
            fig += f"; transformers static x{hf['batch']}: {hf['output_tok_s']:.0f} out tok/s ({ratio:.1f}x)"
        out.append(
            (
                f"offline throughput, {ours['num_requests']} req, Llama-3-8B shape",
                fig,
                ">= 6x transformers",
                verdict(None if ratio is None else ratio >= 6),
            )
        )
        out.append(
            (
                "CPU vs GPU per step (whole run)",
                f"step {_fmt(ours.get('step_wall_ms'))} ms wall, "
                f"build_batch {_fmt(ours.get('step_build_batch_ms'), '.2f')} ms CPU, "
                f"forward {_fmt(ours.get('step_gpu_forward_ms'), '.1f')} ms GPU",
                "",
                "",
            )
        )
        for key in sorted((k for k in ours if k.startswith("decode_b")), key=lambda k: int(k[8:])):
            d = ours[key]
            fig = (
                f"{d['wall_ms']:.2f} ms wall, {_fmt(d.get('gpu_ms'), '.2f')} ms GPU, "
                f"build_batch {_fmt(d.get('build_batch_ms'), '.2f')} ms; roofline {_fmt(d.get('roofline_ms'), '.2f')} ms "
                f"({d['weight_gb']:.1f} GB weights + {d['kv_read_gb']:.1f} GB KV)"
            )
            ratio, target = d.get("wall_over_roofline"), DECODE_TARGET.get(d["batch"], 2.0)
            graphs = "graphs" if d.get("graphs") else "eager"
            out.append(
                (
                    f"decode step B={d['batch']} ctx={d['context']}, {graphs}",
                    fig + (f" = {ratio:.2f}x" if ratio else ""),
                    f"<= {target}x roofline",
                    verdict(None if ratio is None else ratio <= target),
                )
            )
        out.append(("startup to ready, Llama-3-8B shape", f"{_fmt(ours.get('startup_s'))} s", "", ""))
    else:
        out.append(("offline throughput", "not measured", ">= 6x transformers", "—"))
    lora = r.get("lora")
    if lora:
        fig = (
            f"{lora['lora_decode_tok_s']:.0f} decode tok/s vs {lora['base_decode_tok_s']:.0f} without LoRA "
            f"= {lora['decode_ratio']:.2f}x"
        )
        check = f"multi-LoRA B={lora['batch']}, {lora['adapters']} adapters of rank {lora['rank']}, 8B shape"
        out.append((check, fig, ">= 0.8x no-LoRA decode", verdict(lora["decode_ratio"] >= 0.8)))
    out += spec_step.summary_rows(r.get("spec")) + vision.summary_rows(r.get("vision"))
    out += families.summary_rows(r.get("families")) + quant.summary_rows(r.get("quant"))
    for key in sorted((k for k in r if k.startswith("breakdown_b")), key=lambda k: int(k[11:])):
        b = r[key]
        if "families" in b:
            top = ", ".join(f"{f['name']} {f['ms']:.2f} ms ({f['share']:.0%})" for f in b["families"][:4])
            fig = f"{b['kernels']} kernels, {b['total_ms']:.2f} ms: {top}"
        else:
            fig = b.get("skipped") or f"failed: {str(b.get('error'))[:200]}"
        out.append((f"one eager decode step B={key[11:]}, ncu", fig, "", ""))
    return out


def table(rs: list[tuple[str, str, str, str]]) -> str:
    lines = ["| check | result | target | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rs]
    return "\n".join(lines)


def failures(r: dict) -> list[str]:
    """What makes the check fail (its exit status): wrong results, not slow ones."""
    out = []
    k = r.get("kernel_tests")
    if not k or not k["ok"]:
        out.append("kernel tests: " + kernel_figure(k))
    for dtype, p in (r.get("parity") or {}).items():
        if isinstance(p, dict) and not p.get("ok", True):
            out.append(f"parity {dtype}: over tolerance")
    out += families.failed(r.get("families")) + quant.failed(r.get("quant")) + spec_step.failed(r.get("spec"))
    out += vision.failed(r.get("vision"))
    m = r.get("memcheck") or ""
    if re.match(r"[1-9]\d* errors", m):
        out.append(f"memcheck: {m}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", required=True, help="folder of the steps' JSON results")
    ap.add_argument("--kernel-log")
    ap.add_argument("--memcheck-log")
    ap.add_argument("--out-json")
    ap.add_argument("--out-md")
    ap.add_argument("--header", default="", help="a line to put above the table (date, commit)")
    ap.add_argument("--record-dir", help="also write the permanent record here (docs/gpu)")
    ap.add_argument("--date", default="")
    ap.add_argument("--gpu", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args(argv)
    merged: dict = {}
    for path in sorted(glob.glob(os.path.join(args.parts, "*.json"))):
        try:
            with open(path) as f:
                merged.update(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            merged.setdefault("unreadable_parts", []).append(f"{os.path.basename(path)}: {e}")
    kernel, memcheck = pytest_result(args.kernel_log), memcheck_errors(args.memcheck_log)
    merged["kernel_tests"], merged["memcheck"] = kernel, memcheck
    table_md = table(rows(merged, kernel, memcheck))
    failed = failures(merged)
    merged["failures"] = failed
    text = (args.header + "\n\n" if args.header else "") + table_md
    text += "\n\n" + ("FAILED: " + "; ".join(failed) if failed else "all correctness checks passed")
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(merged, f, indent=1)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(text + "\n")
    if args.record_dir:
        from tools.gpu_check.record import build_record, write_record

        gpu = args.gpu or (merged.get("env") or {}).get("gpu", "unknown GPU")
        path = write_record(build_record(merged, args.date, gpu, args.commit, table_md), args.record_dir)
        text += f"\nrecord: {path}"
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
