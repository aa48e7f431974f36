"""Optional dependencies: import one, or raise the one-line ImportError that names the install command.

The export extra (``onnx``, ``onnxruntime``) is optional: training and decoding run without it,
and a serving process that runs a policy needs only numpy and onnxruntime.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: The extra of ``pyproject.toml`` that installs each optional module.
EXTRAS: dict[str, str] = {"onnx": "export", "onnxruntime": "export"}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError('onnx is not installed; run pip install "draftrl[export]".')``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS.get(module.split(".")[0])
        fix = f'run pip install "draftrl[{extra}]"' if extra else f"run pip install {module.split('.')[0]}"
        raise ImportError(f"{module} is not installed; {fix}.") from None
