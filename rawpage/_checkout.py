"""Run rawpage straight from a source checkout, uninstalled (PYTHONPATH=., as
tools/gpu_check.sh does on a bare GPU image).

rawpage.models and rawpage.cuda live in models/ and cuda/ at the top of the
repository; pyproject's package-dir maps them when rawpage is installed. From a
checkout, the package path has to point there too. Installed (a wheel, or
editable), this changes nothing: the wheel has rawpage/models, and an editable
install maps the same folders this adds.
"""

from pathlib import Path

import rawpage

_package = Path(rawpage.__file__).resolve().parent
_root = _package.parent
if not (_package / "models").is_dir() and (_root / "models" / "llama.py").is_file():
    rawpage.__path__.append(str(_root))
