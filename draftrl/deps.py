"""Optional dependencies: import one, or raise the one-line ImportError that names the install command.

The export extra (``onnx``, ``onnxruntime``) is optional: training and decoding run without it,
and a serving process that runs a policy needs only numpy and onnxruntime.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

#: The extra of ``pyproject.toml`` that installs each optional module.
EXTRAS: dict[str, str] = {"onnx": "export", "onnxruntime": "export", "ray": "ray"}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError('onnx is not installed; run pip install "draftrl[export]".')``."""
    try:
        imported = importlib.import_module(module)
        if getattr(imported, "__file__", None) is None:  # a namespace package: a stray folder, not the library
            raise ImportError(module)
        return imported
    except ImportError:
        extra = EXTRAS.get(module.split(".")[0])
        fix = f'run pip install "draftrl[{extra}]"' if extra else f"run pip install {module.split('.')[0]}"
        raise ImportError(f"{module} is not installed; {fix}.") from None


#: A file or folder only the real distribution ships, for each package draftrl checks for without
#: importing it. A folder of the same name on ``sys.path`` (a test folder, say) is a namespace
#: package that ``importlib.util.find_spec`` also finds; it has none of these.
MARKERS: dict[str, str] = {"vllm": "platforms"}


def installed(package: str) -> bool:
    """Whether the real ``package`` is importable, judged without importing it (vLLM takes seconds).

    A regular package with its marker (:data:`MARKERS`) counts; a namespace package does not, so a
    folder named ``vllm`` that happens to be on ``sys.path`` never passes for vLLM.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None or not spec.has_location:
        return False
    return (Path(spec.origin).parent / MARKERS[package]).exists()
