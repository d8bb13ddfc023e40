"""The native kernels' logits against llama.cpp's own, on the same GGUF (an optional
live test: it runs where llama-cpp-python is installed, and skips elsewhere).

Both engines read the default model's Q4_1 layers with int8 activations rounded per 32
values, so their logits should be close; they differ in the LM head (ours keeps float
activations against the Q8_0 blocks, llama.cpp rounds them to Q8_0 too) and in the
order of float sums. llama.cpp runs in the Python that has it: this one, the one
RAWPAGE_LLAMA_CPP_PYTHON names, or ../peers/llamacpp-venv (tools/build_peers.sh).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.model_harness import SingleSequence
from tests.native.test_engine_native import PROMPTS

# Measured on the 2-core development machine (llama-cpp-python 0.3.36 built with
# AVX512-VNNI, the 8 prompts of test_engine_native, 81 positions): top-1 80/81, largest
# logit difference 1.62, mean 0.19 (logits span about 30). The float32 NumPy path is as
# far from llama.cpp (81/81, 1.80, mean 0.22): llama.cpp also keeps its KV cache in f16
# and rounds the LM head's activations. Held with the margin of the NumPy-path test.
MAX_LOGIT_DIFF, MIN_TOP1_AGREEMENT = 2.5, 0.95

_PEER = Path(__file__).resolve().parents[3] / "peers" / "llamacpp-venv" / "bin" / "python"

# Runs in llama.cpp's Python: the logits of every position of each token list.
_SCRIPT = """
import json, sys
import numpy as np
from llama_cpp import Llama
path, prompts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2, logits_all=True, verbose=False)
logits = {}
for i, ids in enumerate(prompts):
    llm.reset()
    llm.eval(ids)
    logits[str(i)] = np.array(llm.scores[: len(ids)], dtype=np.float32)
np.savez(out, **logits)
"""


def _llama_cpp_python() -> str | None:
    named = os.environ.get("RAWPAGE_LLAMA_CPP_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("llama_cpp") is not None:
        return sys.executable
    has_it = (
        _PEER.exists() and subprocess.run([str(_PEER), "-c", "import llama_cpp"], capture_output=True).returncode == 0
    )
    return str(_PEER) if has_it else None


def test_default_model_logits_against_llama_cpp(request, tmp_path):
    python = _llama_cpp_python()
    if python is None:
        pytest.skip("llama-cpp-python is not installed (tools/build_peers.sh builds it into ../peers)")
    # (the model loads only where the test runs)
    native_default_model = request.getfixturevalue("native_default_model")
    default_checkpoint = request.getfixturevalue("default_checkpoint")
    token_lists = [default_checkpoint.tokenizer.encode(p) for p in PROMPTS]
    out = tmp_path / "llama_cpp_logits.npz"
    args = [python, "-c", _SCRIPT, default_checkpoint.path, json.dumps(token_lists), str(out)]
    subprocess.run(args, check=True, timeout=600, capture_output=True)
    theirs = np.load(out)
    worst, agree, total = 0.0, 0, 0
    for i, ids in enumerate(token_lists):
        want = theirs[str(i)]
        got = SingleSequence(native_default_model).feed(ids, all_logits=True)
        assert got.shape == want.shape
        diff = np.abs(got - want).max(axis=1)
        worst = max(worst, float(diff.max()))
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * diff  # not a near-tie at either engine's error
        np.testing.assert_array_equal(got.argmax(1)[clear], want.argmax(1)[clear])
        agree += int((got.argmax(1) == want.argmax(1)).sum())
        total += len(ids)
    print(f"against llama.cpp: top-1 {agree}/{total}, largest logit difference {worst:.3f}")
    assert worst < MAX_LOGIT_DIFF, f"largest logit difference {worst:.3f}"
    assert agree / total >= MIN_TOP1_AGREEMENT, f"top-1 agreement {agree}/{total}"


@pytest.mark.parametrize(
    "arch,mix", [("llama", "Q4_K_M"), ("llama", "Q3_K_M"), ("qwen2", "IQ4_XS"), ("qwen2", "Q4_K_M")]
)
def test_mixed_files_against_llama_cpp(tmp_path, arch, mix):
    """The tiny files of test_gguf_files (every K-quant, IQ4 and the fallbacks, mixed as
    llama-quantize mixes them) in llama.cpp and here: both engines round activations to
    int8 blocks, so the logits stay close wherever the top token is not a near-tie."""
    python = _llama_cpp_python()
    if python is None:
        pytest.skip("llama-cpp-python is not installed (tools/build_peers.sh builds it into ../peers)")
    from rawpage.backends import get_backend
    from rawpage.loader import load_checkpoint
    from rawpage.models.registry import build_model
    from tests.native.test_gguf_files import write_mixed
    from tests.tiny_models import train_tokenizer

    path = write_mixed(str(tmp_path / f"{arch}-{mix}.gguf"), arch, mix, train_tokenizer())
    ckpt = load_checkpoint(path)
    ids = [np.random.default_rng(i).integers(3, ckpt.config.vocab_size, 64).tolist() for i in range(2)]
    out = tmp_path / "llama_cpp_logits.npz"
    subprocess.run(
        [python, "-c", _SCRIPT, path, json.dumps(ids), str(out)], check=True, timeout=600, capture_output=True
    )
    theirs = np.load(out)
    native = build_model(ckpt.config, get_backend("cpu", cpu_kernels="native"), ckpt.tensors)
    got = np.concatenate([SingleSequence(native).feed(x, all_logits=True) for x in ids])
    want = np.concatenate([theirs[str(i)] for i in range(len(ids))])
    top = np.sort(want, axis=1)
    clear = top[:, -1] - top[:, -2] > 0.02 * (top[:, -1] - top[:, 0])
    agree = float((got.argmax(1) == want.argmax(1))[clear].mean())
    rms = float(np.sqrt(((got - want) ** 2).mean() / (want**2).mean()))
    print(f"{arch} {mix} against llama.cpp: top-1 {agree:.3f} of {clear.sum()} clear positions, rms {rms:.2%}")
    assert agree >= 0.97 and rms < 0.05, (agree, rms)
