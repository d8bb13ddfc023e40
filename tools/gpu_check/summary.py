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


def pytest_counts(path: str | None) -> str | None:
    """'12 passed, 1 failed' from pytest's last summary line in a log, if any."""
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if re.search(r"\d+ (passed|failed|error)", ln)]
    return re.sub(r"[=\s]+$", "", re.sub(r"^[=\s]+", "", lines[-1])) if lines else None


def memcheck_errors(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if m:
        return f"{m.group(1)} errors"
    return "skipped (compute-sanitizer not found)" if "not found" in text else "no sanitizer summary (see memcheck.log)"


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def rows(r: dict, kernel: str | None, memcheck: str | None) -> list[tuple[str, str, str, str]]:
    """(check, figure, target, verdict) rows; verdict is ok / MISS / — (not measured)."""

    def verdict(ok: bool | None) -> str:
        return "—" if ok is None else ("ok" if ok else "MISS")

    out = []
    env = r.get("env", {})
    out.append(("GPU", f"{env.get('gpu', '?')}, CUDA {env.get('runtime_cuda', '?')} (driver {env.get('driver_cuda', '?')}), "
                f"CuPy {env.get('cupy', '?')}, torch {env.get('torch', '?')}", "", ""))  # fmt: skip
    out.append(("kernel tests (cuda)", kernel or "not run", "all pass",
                verdict(None if not kernel else ("failed" not in kernel and "error" not in kernel))))  # fmt: skip
    ran = memcheck and not memcheck.startswith("skipped")
    out.append(("compute-sanitizer memcheck", memcheck or "not run", "0 errors",
                verdict(memcheck.startswith("0 errors") if ran else None)))  # fmt: skip
    for dtype in ("bfloat16", "float32"):
        p = r.get("parity", {}).get(dtype)
        if p:
            fig = (f"prefill max abs {p['prefill']['max_abs']:.2e} rel {p['prefill']['max_rel']:.2e}; "
                   f"decode max abs {p['decode']['max_abs']:.2e} rel {p['decode']['max_rel']:.2e}; "
                   f"argmax agree {p['prefill']['argmax_agree']:.1%}")  # fmt: skip
            out.append((f"parity vs transformers, {dtype}", fig, f"rel < {p['tolerance']:g}", verdict(p["ok"])))
        else:
            out.append((f"parity vs transformers, {dtype}", "not measured", "", "—"))
    mb = r.get("microbench", {})
    sdpa_dec = {d["context"]: d for d in mb.get("sdpa_decode", [])}
    for d in mb.get("decode", []):
        s = sdpa_dec.get(d["context"])
        fig = (f"{d['gbs']:.0f} GB/s = {d['fraction_of_copy']:.0%} of copy ({mb['copy_gbs']:.0f} GB/s); "
               f"SDPA {_fmt(s and s['gbs'], '.0f')} GB/s")  # fmt: skip
        out.append((f"decode attention B=64 ctx={d['context']}", fig, ">= 70% of copy",
                    verdict(d["fraction_of_copy"] >= 0.7)))  # fmt: skip
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
        out.append((f"offline throughput, {ours['num_requests']} req, Llama-3-8B shape", fig, ">= 5x transformers",
                    verdict(None if ratio is None else ratio >= 5)))  # fmt: skip
        out.append(("CPU vs GPU per step (whole run)",
                    f"step {ours['step_wall_ms']:.1f} ms wall, build_batch {ours['step_build_batch_ms']:.2f} ms CPU, "
                    f"forward {_fmt(ours.get('step_gpu_forward_ms'), '.1f')} ms GPU", "", ""))  # fmt: skip
        d = ours.get("decode")
        if d:
            fig = (f"{d['step_wall_ms']:.1f} ms wall, {_fmt(d.get('step_gpu_forward_ms'))} ms GPU, "
                   f"build_batch {d['step_build_batch_ms']:.2f} ms; roofline {_fmt(d.get('roofline_ms'))} ms "
                   f"({d['weight_gb']:.1f} GB weights + {d['kv_read_gb']:.1f} GB KV)")  # fmt: skip
            ok = d.get("wall_over_roofline")
            out.append((f"decode step B={d['batch']} ctx={d['context']}", fig + (f" = {ok:.2f}x" if ok else ""),
                        "<= 2x roofline", verdict(None if ok is None else ok <= 2)))  # fmt: skip
        out.append(("startup to ready, Llama-3-8B shape", f"{ours['startup_s']:.1f} s", "", ""))
    else:
        out.append(("offline throughput", "not measured", ">= 5x transformers", "—"))
    return out


def table(rs: list[tuple[str, str, str, str]]) -> str:
    lines = ["| check | result | target | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rs]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", required=True, help="folder of the steps' JSON results")
    ap.add_argument("--kernel-log")
    ap.add_argument("--memcheck-log")
    ap.add_argument("--out-json")
    ap.add_argument("--out-md")
    ap.add_argument("--header", default="", help="a line to put above the table (date, commit)")
    args = ap.parse_args(argv)
    merged: dict = {}
    for path in sorted(glob.glob(os.path.join(args.parts, "*.json"))):
        try:
            with open(path) as f:
                merged.update(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            merged.setdefault("unreadable_parts", []).append(f"{os.path.basename(path)}: {e}")
    kernel, memcheck = pytest_counts(args.kernel_log), memcheck_errors(args.memcheck_log)
    merged["kernel_tests"], merged["memcheck"] = kernel, memcheck
    text = (args.header + "\n\n" if args.header else "") + table(rows(merged, kernel, memcheck))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(merged, f, indent=1)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(text + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
