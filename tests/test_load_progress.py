"""The load's progress bar: tqdm only where a person watches stderr."""

import subprocess
import sys

SCRIPT = """
import sys
from models.weight_source import progress
bar = progress(range(3), "layers")
print(list(bar) == [0, 1, 2], type(bar).__name__, "tqdm" in sys.modules)
"""


def test_no_bar_and_no_tqdm_import_when_stderr_is_not_a_terminal():
    """A server's stderr is a pipe or a file: importing tqdm there cost ~1.4 MiB of resident
    memory (importlib.metadata, email, zipfile: ~40 modules) and drew nothing."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "range", "False"], out.stderr


def test_a_terminal_gets_the_bar(monkeypatch):
    from models import weight_source

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = weight_source.progress(range(3), "layers")
    assert list(bar) == [0, 1, 2] and type(bar).__name__ == "tqdm"
