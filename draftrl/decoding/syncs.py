"""Count host syncs: the operations that make the host wait for the device.

On a GPU, reading a device tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``,
``int(t)``, ``.cpu()``, ``.numpy()``), running an op whose output size depends on the data
(``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``) and copying host memory to the
device (``torch.tensor(list, device=...)``, ``t[[1, 2]]``, ``host_tensor.to(device)``: from pageable
memory CUDA synchronises the stream first) all wait until the device's queue has drained: tens of
microseconds each, where a round of an 8B target costs a few milliseconds. A speculative round
should pay a small constant number of them, not one per draft level or per tree node.

:class:`SyncCounter` counts them in a ``with`` block. On a CPU nothing waits, so it recognises the
operations themselves (a ``torch.overrides.TorchFunctionMode`` sees every tensor method and torch
function called from Python), which makes the count a property of the code, testable without a
GPU. It tells host tensors from device tensors as a GPU would place them: a tensor made inside the
block by a factory without a ``device`` (``torch.tensor(list)``, ``torch.zeros(n)``,
``torch.from_numpy``, which the counter wraps while it is active: torch-function modes do not see
it), by ``.cpu()``, or by any op on host tensors only, is a host tensor; every
other tensor (model weights and outputs, anything made with ``device=``, tensors from before the
block) is a device tensor. Three kinds of sync:

- ``read``: a device tensor's value comes back to the host (``item``, ``tolist``,
  ``__bool__``/``__int__``/``__float__``/``__index__``, ``cpu``, ``numpy``, ``__array__``,
  formatting, ``equal``, ``.to("cpu")``);
- ``shape``: an op on a device tensor whose output size the host must read first (``nonzero``,
  ``argwhere``, ``masked_select``, ``unique``, one-argument ``where``, boolean-mask ``t[mask]``,
  ``repeat_interleave`` without ``output_size``, ``bincount``);
- ``upload``: host data copied to the device (``torch.tensor``/``as_tensor``/``asarray`` of Python
  or host data with a ``device``, indexing a device tensor with a Python list, ``.to(device)`` or
  ``.cuda()`` of a host tensor, a host tensor assigned into a device tensor).

What it cannot see on a CPU: ``.to(torch.device("cpu"))`` of a device tensor (the same call as
``.to(device)`` when the device is the CPU; the string ``"cpu"`` is recognised) and syncs inside
C++ code that Python never calls. On CUDA (``cuda=True``, the default there) it also turns on
``torch.cuda.set_sync_debug_mode("warn")`` and counts the synchronizing operations CUDA really
performed (``cuda_syncs``): the ground truth beside the recognised ones.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

#: tensor methods and functions whose result is a host value
READS = frozenset({
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "__format__", "__repr__",
    "__str__", "numpy", "__array__", "cpu", "equal", "allclose", "is_nonzero",
})
#: ops whose output size depends on the data
SHAPES = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"})
#: factories that copy their data argument
COPIES = frozenset({"tensor", "as_tensor", "asarray"})
#: results that live on the host whatever their input
TO_HOST = frozenset({"cpu"})
#: host factories that torch-function modes never see (wrapped while the counter is active)
_UNSEEN_HOST_FACTORIES = ("from_numpy", "frombuffer")

_SYNC_WARNING = "called a synchronizing CUDA operation"


def _indices(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)


def _named_device(args: tuple, kwargs: dict) -> object | None:
    """The device argument of a ``.to(...)`` call (a str or torch.device), or None (a dtype-only call)."""
    for a in (*args, kwargs.get("device")):
        if isinstance(a, torch.device):
            return a
        if isinstance(a, str):
            try:
                torch.device(a)
            except RuntimeError:
                continue
            return a
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def _is_cpu_string(device: object) -> bool:
    return isinstance(device, str) and torch.device(device).type == "cpu"


class SyncCounter(TorchFunctionMode):
    """Count the host syncs of the code run inside ``with SyncCounter() as c:``.

    ``c.reads``, ``c.shapes``, ``c.uploads``: counts per kind (module docstring);
    ``c.device_to_host`` = reads + shapes (the host waits for a device value); ``c.total``: all
    three; ``c.calls``: a ``Counter`` of ``(kind, op name)``; ``c.cuda_syncs``: what
    ``torch.cuda.set_sync_debug_mode`` reported (``cuda=True`` only; None otherwise).

    :param cuda: also count the syncs CUDA reports (default: when CUDA is available).
    """

    def __init__(self, cuda: bool | None = None):
        super().__init__()
        self.calls: Counter[tuple[str, str]] = Counter()
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.cuda_syncs: int | None = None
        self._host: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._catcher = None
        self._log: list = []
        self._debug_mode = 0

    # ------------------------------------------------------------------ host / device
    def is_host(self, t: torch.Tensor) -> bool:
        """``t`` was made on the host inside the block (see the module docstring)."""
        return t in self._host

    def _mark(self, out, host: bool) -> None:
        if not host:
            return
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._host[t] = True

    def classify(self, name: str, args: tuple, kwargs: dict) -> str | None:
        """The kind of host sync a call is (``read``, ``shape``, ``upload``), or None."""
        first = args[0] if args else None
        on_device = isinstance(first, torch.Tensor) and not self.is_host(first)
        if name in READS:
            return "read" if on_device else None
        if name in SHAPES or (name == "where" and len(args) + len(kwargs) == 1) or (
                name == "repeat_interleave" and "output_size" not in kwargs
                and isinstance(args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor)):
            return "shape" if on_device else None
        if name in ("__getitem__", "__setitem__") and len(args) >= 2 and on_device:
            index = _indices(args[1])
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                return "shape"
            if any(isinstance(i, list) for i in index) or any(
                    isinstance(i, torch.Tensor) and self.is_host(i) and i.dim() > 0 for i in index):
                return "upload"
            value = args[2] if name == "__setitem__" and len(args) > 2 else None
            if isinstance(value, torch.Tensor) and self.is_host(value) and value.dim() > 0:
                return "upload"
            return None
        if name in COPIES:
            data_on_device = isinstance(first, torch.Tensor) and not self.is_host(first)
            empty = isinstance(first, (list, tuple)) and not first  # nothing to copy
            return "upload" if kwargs.get("device") is not None and not data_on_device and not empty else None
        if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):  # dst.copy_(src)
            dst_host, src_host = self.is_host(args[0]), self.is_host(args[1])
            return "read" if dst_host and not src_host else "upload" if src_host and not dst_host else None
        if name == "to" and isinstance(first, torch.Tensor):
            device = _named_device(args[1:], kwargs)
            if device is None:
                return None
            if _is_cpu_string(device):
                return "read" if on_device else None
            return None if on_device else "upload"
        if name == "cuda" and isinstance(first, torch.Tensor):
            return None if on_device else "upload"
        return None

    def _host_result(self, name: str, args: tuple, kwargs: dict) -> bool:
        """Whether the call's tensor result lives on the host."""
        if name in TO_HOST:
            return True
        if name == "to":
            device = _named_device(args[1:], kwargs)
            if device is not None:
                return _is_cpu_string(device)
        if name == "cuda":
            return False
        if kwargs.get("device") is not None:
            return _is_cpu_string(kwargs["device"])
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in COPIES or not tensors:  # a factory without a device: the CPU
            return not tensors or all(self.is_host(t) for t in tensors)
        return all(self.is_host(t) for t in tensors)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        kind = self.classify(name, args, kwargs)
        if kind is not None:
            self.calls[kind, name] += 1
        out = func(*args, **kwargs)
        if args and out is args[0]:  # on a CPU ``x.cpu()`` and ``x.to(device)`` may return ``x`` itself:
            if kind == "upload" and name in ("to", "cuda"):  # a host tensor moved: now a device one
                del self._host[out]
            return out  # otherwise ``x`` keeps its place (never marked host: reads of it still count)
        self._mark(out, self._host_result(name, args, kwargs))
        return out

    # ------------------------------------------------------------------ the block
    def __enter__(self) -> SyncCounter:
        # torch.from_numpy and torch.frombuffer bypass torch-function modes: wrap them for the block,
        # so that their results are known as host tensors
        self._factories = {name: getattr(torch, name) for name in _UNSEEN_HOST_FACTORIES}
        for name, factory in self._factories.items():
            setattr(torch, name, self._host_factory(factory))
        if self.cuda:
            self._debug_mode = torch.cuda.get_sync_debug_mode()
            self._catcher = warnings.catch_warnings(record=True)
            self._log = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return super().__enter__()

    def _host_factory(self, factory):
        def made_on_host(*args, **kwargs):
            out = factory(*args, **kwargs)
            self._host[out] = True
            return out
        return made_on_host

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        for name, factory in self._factories.items():
            setattr(torch, name, factory)
        if self.cuda:
            torch.cuda.set_sync_debug_mode(self._debug_mode)
            self.cuda_syncs = sum(_SYNC_WARNING in str(w.message) for w in self._log)
            self._catcher.__exit__(*exc)

    # ------------------------------------------------------------------ counts
    def _kind(self, kind: str) -> int:
        return sum(n for (k, _), n in self.calls.items() if k == kind)

    @property
    def reads(self) -> int:
        return self._kind("read")

    @property
    def shapes(self) -> int:
        return self._kind("shape")

    @property
    def uploads(self) -> int:
        return self._kind("upload")

    @property
    def device_to_host(self) -> int:
        return self.reads + self.shapes

    @property
    def total(self) -> int:
        return self.reads + self.shapes + self.uploads

    def summary(self) -> str:
        """One line: the counts per kind, then each op's count."""
        ops = " ".join(f"{kind}:{name}={n}" for (kind, name), n in sorted(self.calls.items()))
        cuda = f" cuda_syncs={self.cuda_syncs}" if self.cuda_syncs is not None else ""
        return f"device_to_host={self.device_to_host} uploads={self.uploads}{cuda} ({ops})"


def round_syncs(engine, depth: int, verify_size: int | None = None, width: int = 1,
                cuda: bool | None = None) -> tuple[SyncCounter, object]:
    """The host syncs of one env step on ``engine`` (a ``decoding.engine.SpeculativeDecoder``
    with a request started): the draft features a policy reads, then ``engine.round(...)``.
    Returns the counter and the ``RoundResult``."""
    with SyncCounter(cuda=cuda) as counter:
        engine.features()
        result = engine.round(depth, verify_size, width)
    return counter, result
