"""Run rawpage straight from a source checkout, uninstalled (PYTHONPATH=., as
tools/gpu_check.sh does on a bare GPU image).

rawpage.models and rawpage.cuda live in models/ and cuda/ at the top of the
repository; pyproject's package-dir maps them when rawpage is installed. From a
checkout, the package path has to point there too. Installed (a wheel, or
editable), this changes nothing: the wheel has rawpage/models, and an editable
install maps the same folders this adds. rawpage/__init__.py adds them to its
own __path__ (this module does not import the package that imports it).
"""

from pathlib import Path


def checkout_folders() -> list[str]:
    """The folders rawpage's __path__ lacks: the checkout's root when run from one, else none."""
    package = Path(__file__).resolve().parent
    root = package.parent
    if not (package / "models").is_dir() and (root / "models" / "llama.py").is_file():
        return [str(root)]
    return []
