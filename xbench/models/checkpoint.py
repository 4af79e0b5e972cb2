"""The one safe reader of weights files: no code from a checkpoint ever runs.

:func:`read_checkpoint` is used by every adapter (through :func:`xbench.models.base.load_checkpoint`):

1. ``.safetensors`` → :func:`safetensors.torch.load_file` (tensors only by design); a file that is not
   safetensors raises :class:`~xbench.errors.CheckpointError` naming it.
2. torch's zip archive (``.pt``/``.pth``/``.ckpt`` since torch 1.6) is read by :class:`RestrictedUnpickler`,
   fed with the archive's tensors by torch's own storage reader — plain state dicts as well as files that
   pickle other objects (a numpy scalar, an ``argparse.Namespace``, a scheduler's state, an OmegaConf /
   Lightning config). It is used instead of ``torch.load(weights_only=True)``, whose unpickler admits
   ``bytearray(n)`` (a crafted file could ask for any amount of memory). Its ``find_class`` never imports
   anything: a pickled global name is looked up in
   :data:`allowed_globals` (torch's weights-only allowlist — tensor/storage rebuild functions, dtypes,
   ``OrderedDict``, ``Counter``, ``set`` … — plus ``argparse.Namespace``, ``collections.defaultdict``
   / ``deque``, builtin scalar and container constructors, and numpy dtypes, scalars and arrays
   through wrappers that refuse anything but plain data; no sized producer such as ``bytearray(n)``,
   ``bytes(n)`` or ``range(n)``). **Every other name becomes an inert
   placeholder** (:class:`Placeholder`): calling it, building it or filling it only records the
   pickled arguments and state, so a ``__reduce__`` payload such as ``os.system`` / ``exec`` /
   ``subprocess.Popen`` / ``functools.partial`` is stored as data and never called. The replaced names
   are reported with a :class:`CheckpointWarning` (and returned by :func:`read_checkpoint_report`).
   Placeholders never reach a network: the adapters' strict loaders require real tensors under
   string keys and raise :class:`CheckpointError` naming the file and the key otherwise. ``BUILD``
   on a class or a function (which would mutate a global) is refused with :class:`CheckpointError`.
3. A legacy (pre-1.6, non-zip) file: ``torch.load(weights_only=True)``, tensors and builtin containers only.
4. A TorchScript archive (``constants.pkl`` present, e.g. OpenAI's ``ViT-B-16.pt``) is never
   compiled or run: :func:`read_torchscript_state_dict` reads its ``data.pkl`` with the same
   restricted unpickler (the ``__torch__.*`` module classes become placeholders) and collects the
   tensors of the module tree under their dotted attribute names.
"""
from __future__ import annotations

import _compat_pickle
import argparse
import collections
import pickle
import types
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import CheckpointError, MissingFileError, XBenchWarning

__all__ = [
    "CheckpointWarning",
    "LoadReport",
    "Placeholder",
    "RestrictedUnpickler",
    "allowed_globals",
    "read_checkpoint",
    "read_checkpoint_report",
    "read_torchscript_state_dict",
    "require_tensor_state",
]


class CheckpointWarning(XBenchWarning):
    """Objects of a checkpoint were replaced by inert placeholders (their names are in the message)."""


class Placeholder:
    """Inert stand-in for a pickled global that is not on the allowlist.

    Subclasses are made per name (``qualname`` holds it). Calling the class, ``NEWOBJ``, ``BUILD``,
    item assignment and ``append``/``extend`` only record their arguments; nothing of the named
    module is imported or run (it need not be installed).
    """

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:  # noqa: PYI034
        obj = super().__new__(cls)
        obj.__dict__["pickled_args"] = args
        if kwargs:
            obj.__dict__["pickled_kwargs"] = kwargs
        return obj

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["pickled_state"] = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("pickled_items", {})[key] = value

    def append(self, value: Any) -> None:
        self.__dict__.setdefault("pickled_list", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("pickled_list", []).extend(values)

    def __repr__(self) -> str:
        return f"<placeholder for {self.qualname}>"


def _placeholder(qualified: str) -> type[Placeholder]:
    """A fresh :class:`Placeholder` subclass named like ``qualified`` (never imported)."""
    module, _, name = qualified.rpartition(".")
    return type(name or qualified, (Placeholder,), {"__module__": module or "builtins", "qualname": qualified})


# -- numpy, reconstructed from plain data only ---------------------------------------------------
def _np_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """``numpy.dtype`` for pickles: only a type string such as ``'f8'`` or ``'V16'`` is accepted."""
    if not isinstance(spec, str):
        raise pickle.UnpicklingError(f"numpy.dtype from a {type(spec).__name__} is not admitted")
    return np.dtype(spec, align=bool(align), copy=bool(copy))


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    """``numpy.core.multiarray.scalar``: a number from its raw bytes; object dtype gives back the (already safe) object."""
    if not isinstance(dtype, np.dtype):
        raise pickle.UnpicklingError(f"numpy scalar with a {type(dtype).__name__} dtype is not admitted")
    if dtype.hasobject:
        return data
    if not isinstance(data, bytes | bytearray) or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError(f"numpy scalar of dtype {dtype} needs {dtype.itemsize} raw bytes")
    return np.frombuffer(bytes(data), dtype=dtype, count=1)[0].copy()


def _np_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` for plain ``ndarray`` only (its state is then set by numpy's C code)."""
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"numpy array of subtype {subtype!r} is not admitted")
    return np.ndarray.__new__(np.ndarray, (0,), np.uint8)


def _bytearray(*args: Any) -> bytearray:
    """``bytearray`` from pickled data only (``bytearray(n)`` would allocate ``n`` bytes on request)."""
    if args and not isinstance(args[0], bytes | bytearray | str):
        raise pickle.UnpicklingError(f"bytearray from a {type(args[0]).__name__} is not admitted")
    return bytearray(*args)


def _numpy_globals() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for core in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out[f"{core}.scalar"] = _np_scalar
        out[f"{core}._reconstruct"] = _np_reconstruct
    out["numpy.dtype"] = _np_dtype
    out["numpy.ndarray"] = np.ndarray
    for code in set(np.typecodes["All"]) | {"O", "V", "S", "U"}:
        cls = type(np.dtype(code))
        out[f"numpy.dtypes.{cls.__name__}"] = cls
    return out


def allowed_globals() -> dict[str, Any]:
    """Pickled global name → the object the restricted unpickler gives for it (nothing else is admitted).

    torch's weights-only allowlist (tensor and storage rebuild functions, torch dtypes, ``Size``,
    ``device``, ``OrderedDict``, ``Counter``, ``set``, ``bytearray``, ``complex``, ``_codecs.encode``),
    plus ``argparse.Namespace``, ``collections.defaultdict`` / ``deque``, builtin constructors of
    scalars and containers, numpy dtypes, scalars and arrays (:func:`_np_scalar`, :func:`_np_reconstruct`).
    No lazy or sized producer is admitted (``range``, ``bytes(n)``), so a constructor only ever copies
    finite data that the pickle itself spelled out.
    """
    from torch import _weights_only_unpickler as wou

    out = dict(wou._get_allowed_globals())
    out.update(_numpy_globals())
    out.update({
        "argparse.Namespace": argparse.Namespace,
        "collections.defaultdict": collections.defaultdict,
        "collections.deque": collections.deque,
        "builtins.bytearray": _bytearray,
        "builtins.frozenset": frozenset,
        "builtins.slice": slice,
        "builtins.list": list,
        "builtins.dict": dict,
        "builtins.tuple": tuple,
        "builtins.int": int,
        "builtins.float": float,
        "builtins.bool": bool,
        "builtins.str": str,
        "torch._tensor._rebuild_from_type_v2": torch._tensor._rebuild_from_type_v2,
    })
    return out


_BUILD_TYPES = (Placeholder, argparse.Namespace, np.ndarray, np.dtype, collections.OrderedDict,
                collections.Counter, collections.defaultdict, torch.Tensor)


class RestrictedUnpickler(pickle._Unpickler):  # the pure-Python unpickler: every opcode is inspectable
    """Unpickler whose ``find_class`` admits only :func:`allowed_globals`; everything else → :class:`Placeholder`.

    ``replaced`` lists the names that were replaced. ``BUILD`` is admitted only on instances of
    admitted data types and placeholders (never on a class or a function, which would mutate a global).
    """

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, *, encoding: str = "utf-8", **kwargs: Any):
        # torch's archive loader may pass options of its own (torch 2.11 passes ``weights_only``): keep pickle's
        kwargs = {k: v for k, v in kwargs.items() if k in ("fix_imports", "errors", "buffers")}
        super().__init__(file, encoding=encoding, **kwargs)
        self.replaced: list[str] = []
        self._allowed = allowed_globals()
        self._made: dict[str, type[Placeholder]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle maps them (nothing is imported)
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        qualified = f"{module}.{name}"
        if qualified in self._allowed:
            return self._allowed[qualified]
        if qualified not in self._made:
            self._made[qualified] = _placeholder(qualified)
            self.replaced.append(qualified)
        return self._made[qualified]

    def load_build(self) -> None:
        inst = self.stack[-2]  # below the state
        if not isinstance(inst, _BUILD_TYPES):
            raise pickle.UnpicklingError(f"BUILD on a {type(inst).__name__} is not admitted")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def load_newobj_ex(self) -> None:
        raise pickle.UnpicklingError("NEWOBJ_EX (keyword constructor arguments) is not admitted")

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex


@dataclass
class LoadReport:
    """What :func:`read_checkpoint_report` did: ``method`` (``safetensors``, ``weights_only``,
    ``restricted``, ``torchscript``) and the pickled names it replaced by placeholders."""

    path: Path
    method: str
    replaced: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = {"safetensors": "safetensors", "weights_only": "torch.load(weights_only=True)",
                "restricted": "restricted unpickler", "torchscript": "restricted unpickler (TorchScript data.pkl, code not run)"}[self.method]
        if self.replaced:
            text += f"; {len(self.replaced)} pickled type(s) kept as inert placeholders: {', '.join(self.replaced)}"
        return text


def _restricted_load(path: Path) -> tuple[Any, list[str]]:
    """``data.pkl`` of a torch zip archive through :class:`RestrictedUnpickler`, storages by torch's reader."""
    made: list[RestrictedUnpickler] = []

    class Tracked(RestrictedUnpickler):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            made.append(self)

    try:
        reader = torch._C.PyTorchFileReader(str(path))
        obj = torch.serialization._load(reader, "cpu", types.SimpleNamespace(Unpickler=Tracked),
                                        weights_only=True, encoding="utf-8")
    except Exception as exc:
        raise CheckpointError(f"{path}: refused by the restricted unpickler ({type(exc).__name__}: {exc}); "
                              "no code from the file was run") from exc
    return obj, (made[0].replaced if made else [])


def _is_torchscript(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any(n.endswith("/constants.pkl") or n == "constants.pkl" for n in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def read_checkpoint_report(path: str | Path) -> tuple[Any, LoadReport]:
    """Read a weights file safely (module docstring) → ``(object, LoadReport)``; nothing in it runs.

    Raises :class:`MissingFileError` for an absent file and :class:`CheckpointError` naming the file
    for anything unreadable (not safetensors, truncated, a TorchScript archive, a refused payload).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(path, "checkpoint")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), LoadReport(path, "safetensors")
        except Exception as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    if _is_torchscript(path):
        raise CheckpointError(f"{path}: is a TorchScript archive (code + data), not a checkpoint; XBench never "
                              "runs TorchScript. Use the model's plain state-dict file instead.")
    if zipfile.is_zipfile(path):  # torch's archive format: the restricted unpickler reads it directly
        # (not torch.load(weights_only=True) first: its unpickler admits bytearray(n), so a crafted file could
        # ask for any amount of memory; ours admits no sized producer)
        obj, replaced = _restricted_load(path)
        return obj, LoadReport(path, "restricted", replaced)
    try:  # a legacy (non-zip) torch file
        return torch.load(path, map_location="cpu", weights_only=True), LoadReport(path, "weights_only")
    except pickle.UnpicklingError as first:
        raise CheckpointError(f"{path}: a legacy (non-zip) checkpoint with non-tensor objects cannot be read "
                              f"safely ({first})") from first
    except Exception as exc:  # not a torch file, truncated, ...
        raise CheckpointError(f"{path}: cannot be read as a checkpoint ({type(exc).__name__}: {exc})") from exc


def read_checkpoint(path: str | Path) -> Any:
    """:func:`read_checkpoint_report` without the report; replaced types are named in a :class:`CheckpointWarning`."""
    obj, report = read_checkpoint_report(path)
    if report.replaced:
        warnings.warn(f"{report.path}: read with the {report.describe()} (never called)", CheckpointWarning, stacklevel=2)
    return obj


def _module_tensors(obj: Any, prefix: str, out: dict[str, torch.Tensor], seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    state = obj.__dict__.get("pickled_state") if isinstance(obj, Placeholder) else None
    if not isinstance(state, Mapping):
        return
    for key, value in state.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, torch.Tensor):
            out[prefix + key] = value
        elif isinstance(value, Placeholder):
            _module_tensors(value, f"{prefix}{key}.", out, seen)


def read_torchscript_state_dict(path: str | Path, hint: str = "") -> tuple[dict[str, torch.Tensor], LoadReport]:
    """Tensors of a TorchScript archive's module tree, read without compiling or running its code.

    The archive's ``data.pkl`` goes through :class:`RestrictedUnpickler`: each ``__torch__.*`` module
    becomes a placeholder holding its attribute dict; tensors are collected under dotted attribute names
    (the keys ``ScriptModule.state_dict()`` would give for parameters and buffers). Names outside
    ``__torch__`` that were replaced are reported (a planted payload). No tensor found →
    :class:`CheckpointError` naming the file and ``hint`` (what to use instead).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(path, "TorchScript archive")
    if not _is_torchscript(path):
        raise CheckpointError(f"{path}: not a TorchScript archive (no constants.pkl). {hint}".strip())
    root, replaced = _restricted_load(path)
    state: dict[str, torch.Tensor] = {}
    _module_tensors(root, "", state, set())
    foreign = [n for n in replaced if not n.startswith("__torch__.")]
    report = LoadReport(path, "torchscript", foreign)
    if foreign:
        warnings.warn(f"{path}: read with the {report.describe()} (never called)", CheckpointWarning, stacklevel=2)
    if not state:
        raise CheckpointError(f"{path}: no module tensors found in the TorchScript archive's data.pkl "
                              f"(replaced: {', '.join(replaced) or 'none'}); nothing was run. {hint}".strip())
    return state, report


def require_tensor_state(state: Any, where: str) -> dict[str, torch.Tensor]:
    """``state`` as ``{str: Tensor}``, else :class:`CheckpointError` naming ``where`` and the offending key."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: expected a state dict (mapping of names to tensors), got {type(state).__name__}")
    for key, value in state.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{where}: key {key!r} is a {type(key).__name__}, not a string")
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{where}: entry {key!r} is a {type(value).__name__}, not a tensor")
    return dict(state)

