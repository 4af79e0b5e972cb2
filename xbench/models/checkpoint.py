"""The one safe reader of weights files: no code from a checkpoint ever runs.

:func:`read_checkpoint` is used by every adapter (through :func:`xbench.models.base.load_checkpoint`):

1. ``.safetensors`` → :func:`safetensors.torch.load_file` (tensors only by design); a file that is not
   safetensors raises :class:`~xbench.core.errors.CheckpointError` naming it.
2. torch's zip archive (``.pt``/``.pth``/``.ckpt`` since torch 1.6) is opened with Python's ``zipfile``
   (:func:`_read_zip_archive`): members must be stored uncompressed and fit in the file, and each tensor
   storage's declared size must equal its member's size before the bytes are read. ``data.pkl`` goes
   through :func:`load_pickle` — **the one pickle reader of XBench** (checkpoints, TorchScript data and
   cheXlocalize maps alike): :class:`RestrictedUnpickler`, whose ``find_class`` never imports anything.
   A pickled global name is looked up in the explicit :func:`allowed_globals` (tensor rebuilds, storage
   types and ``numpy.ndarray`` as non-callable markers, torch dtypes, builtin scalars and containers,
   ``argparse.Namespace``, numpy dtypes / scalars / arrays of plain numeric kinds made from their own
   bytes). No constructor sized by a number in the file is admitted (``bytearray(n)``, ``range(n)``,
   ``torch.ByteTensor(n)``, ``numpy.ndarray(shape)``), and no numpy object, structured or string array is
   ever built (:data:`PLAIN_KINDS`). **Every other name becomes an inert placeholder**
   (:class:`Placeholder`): calling it, building it or filling it only records the pickled arguments and
   state, so a ``__reduce__`` payload such as ``os.system`` / ``exec`` / ``subprocess.Popen`` is stored as
   data and never called. The replaced names are reported with a :class:`CheckpointWarning` (and returned
   by :func:`read_checkpoint_report`). Placeholders never reach a network: the adapters' strict loaders
   require real tensors under string keys and raise :class:`CheckpointError` naming the file and the key
   otherwise. ``BUILD`` on a class or a function (which would mutate a global) is refused. The result's
   nesting depth is bounded (:data:`MAX_DEPTH`, checked iteratively).
3. A legacy (pre-1.6, non-zip) file is read from its bytes by :func:`_read_legacy` with the same
   unpickler; a storage is allocated only while the storages declared so far fit in the bytes left in the
   file, and each storage's recorded element count must match its declaration.
4. A TorchScript archive (``constants.pkl`` present, e.g. OpenAI's ``ViT-B-16.pt``) is never
   compiled or run: :func:`read_torchscript_state_dict` reads its ``data.pkl`` with the same
   restricted unpickler (the ``__torch__.*`` module classes become placeholders) and collects the
   tensors of the module tree under their dotted attribute names.
"""
from __future__ import annotations

import _compat_pickle
import argparse
import collections
import functools
import io
import os
import pickle
import struct
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..core.errors import CheckpointError, MissingFileError, XBenchWarning
from ..core.safe_arrays import array_from_bytes, plain_dtype
from ..core.summary import brief, visible

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


# -- limits that hold for every pickle XBench opens ------------------------------------------------------
#: Deepest nesting of containers / objects a pickle may build (deeper → :class:`CheckpointError`).
MAX_DEPTH = 100
#: Bytes of objects a pickle may build, per byte of the pickle (:data:`BUILD_MIN` more): every object made by a
#: call (``REDUCE`` / ``NEWOBJ`` / ``BUILD``) is charged its size (text and byte length, 8 bytes a container slot,
#: an array's or a storage's bytes) and every memo reference 8 bytes. A pickle that reuses one memoised value to
#: build many copies of it (``_codecs.encode`` / ``bytearray`` / ``list`` applied K times) is refused by the name
#: of the call that went over, before its memory grows past the budget.
BUILD_FACTOR = 8
BUILD_MIN = 16 * 2**20
#: Parts of one dict key / set member (a tuple's items, counted without sharing): hashing walks them all, so a
#: key of shared nested tuples (2**60 leaves in 850 bytes) is refused rather than hashed.
MAX_KEY_PARTS = 256
#: Tensor dtypes a pickle may name: plain bool / int / uint / float / complex. Quantized, bit-packed, sub-byte and
#: float8 dtypes are refused when named (not later, when a network is loaded).
PLAIN_TORCH_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128})


class _Budget:
    """Bytes a pickle may still build (:data:`BUILD_FACTOR`); :meth:`charge` refuses naming what went over."""

    def __init__(self, size: int):
        self.size, self.limit, self.used = size, BUILD_FACTOR * size + BUILD_MIN, 0

    def charge(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise pickle.UnpicklingError(
                f"{what} would make the objects built exceed {self.limit:,} bytes ({BUILD_FACTOR} × the "
                f"pickle's {self.size:,} bytes + {BUILD_MIN // 2**20} MiB): a pickle reusing memoised data "
                "to build more than it holds is refused")


def _cost(obj: Any) -> int:
    """Bytes charged for a newly built object (its own memory, not what it shares)."""
    if isinstance(obj, str | bytes | bytearray):
        return len(obj) + 64
    if isinstance(obj, np.ndarray):
        return obj.nbytes + 128 if obj.base is None else 128
    if isinstance(obj, torch.Tensor):
        return 128  # a view of a storage charged (or read from the archive) already
    if isinstance(obj, torch.storage.TypedStorage):
        return obj._untyped_storage.nbytes() + 128
    if isinstance(obj, torch.UntypedStorage):
        return obj.nbytes() + 128
    if isinstance(obj, list | tuple | set | frozenset | dict | collections.deque):
        return 8 * len(obj) + 64
    return 64


def _check_key(key: Any, what: str = "key") -> None:
    """Refuse a dict key / set member whose hash would walk more than :data:`MAX_KEY_PARTS` parts."""
    if not isinstance(key, tuple | frozenset):
        return
    todo, parts = [key], 0
    while todo:
        item = todo.pop()
        parts += 1
        if parts > MAX_KEY_PARTS:
            raise pickle.UnpicklingError(f"a {what} made of more than {MAX_KEY_PARTS} nested parts is not admitted "
                                         "(hashing it would walk every shared part)")
        if isinstance(item, tuple | frozenset):
            todo.extend(item)


def _keyed(ctor: Any, pairs: bool) -> Any:
    """``ctor`` (a set / dict type) admitted on members / keys that :func:`_check_key` accepts."""
    def build(*args: Any) -> Any:
        if args:
            items = args[0].keys() if isinstance(args[0], Mapping) else args[0]
            if not isinstance(items, list | tuple | set | frozenset | str | bytes | type({}.keys())):
                raise pickle.UnpicklingError(f"{ctor.__name__} from a {type(items).__name__} is not admitted")
            for item in items:
                if pairs and not isinstance(args[0], Mapping):
                    if not (isinstance(item, tuple | list) and len(item) == 2):
                        raise pickle.UnpicklingError(f"{ctor.__name__} needs (key, value) pairs")
                    item = item[0]
                _check_key(item)
        return ctor(*args)

    build.__name__ = ctor.__name__
    return build


def _str(*args: Any) -> str:
    """``str`` of text, bytes (with an encoding) or a number only: ``str`` of a container would walk all of it."""
    if args and not isinstance(args[0], str | bytes | bytearray | int | float | bool):
        raise pickle.UnpicklingError(f"str() of a {type(args[0]).__name__} is not admitted")
    return str(*args)


def _storage_elements(storage: Any, dtype: torch.dtype) -> int:
    if isinstance(storage, torch.storage.TypedStorage):
        return storage._untyped_storage.nbytes() // _element_size(dtype)
    if isinstance(storage, torch.UntypedStorage):
        return storage.nbytes() // _element_size(dtype)
    raise pickle.UnpicklingError(f"a tensor over a {type(storage).__name__} (not a storage) is not admitted")


def _checked_view(storage: Any, offset: Any, size: Any, stride: Any, dtype: torch.dtype) -> None:
    """A tensor view (offset, sizes, strides) must lie in its storage's bytes and hold at most as many elements as
    the storage has (a zero-stride 1×1×20000×20000 view of 4 bytes is refused before anything is allocated)."""
    if dtype not in PLAIN_TORCH_DTYPES:
        raise pickle.UnpicklingError(f"tensor dtype {dtype} is not admitted (plain bool/int/float/complex only)")
    if not (type(offset) is int and offset >= 0 and isinstance(size, tuple) and isinstance(stride, tuple)
            and len(size) == len(stride) <= 32 and all(type(n) is int and n >= 0 for n in (*size, *stride))):
        raise pickle.UnpicklingError(f"tensor view offset {brief(offset, 20)}, size {brief(size, 60)}, stride "
                                     f"{brief(stride, 60)} is malformed (non-negative ints, one stride per dimension)")
    elements = _storage_elements(storage, dtype)
    numel = 1
    for n in size:
        numel *= n
    if numel == 0:
        return
    extent = offset + 1 + sum((n - 1) * st for n, st in zip(size, stride))
    if numel > elements or extent > elements:
        raise pickle.UnpicklingError(f"tensor view of size {tuple(size)}, stride {tuple(stride)} at offset {offset} "
                                     f"needs {max(numel, extent):,} elements; its storage holds {elements:,}")


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> torch.Tensor:
    dtype = getattr(storage, "dtype", torch.uint8)
    _checked_view(storage, storage_offset, size, stride, dtype)
    return torch._utils._rebuild_tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, *rest: Any) -> torch.Tensor:
    dtype = getattr(storage, "dtype", torch.uint8)
    _checked_view(storage, storage_offset, size, stride, dtype)
    return torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, *rest)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, dtype: Any, *rest: Any) -> torch.Tensor:
    if not isinstance(dtype, torch.dtype):
        raise pickle.UnpicklingError(f"tensor dtype {brief(dtype, 40)} is not a torch dtype")
    _checked_view(storage, storage_offset, size, stride, dtype)
    return torch._utils._rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                                           dtype, *rest)


class _Refused:
    """A pickled name XBench knows and refuses with a reason (quantized / bit-packed tensor types)."""

    def __init__(self, name: str, why: str):
        self.name, self.why = name, why


class _Pending:
    """A numpy dtype or array under reconstruction; it becomes the real object at its ``BUILD`` (stack and memo).

    A pending object that never got its ``BUILD`` is refused when the result is checked."""

    def __init__(self, what: str, finish: Any):
        self.what, self.finish, self.memo_keys = what, finish, []

    def __repr__(self) -> str:
        return f"<incomplete {self.what}>"


def _np_dtype(spec: Any, align: Any = False, copy: Any = False) -> _Pending:
    """``numpy.dtype('f8', False, True)`` + ``BUILD (3, '<', None, None, None, -1, -1, 0)``: plain kinds only."""
    if not isinstance(spec, str):
        raise pickle.UnpicklingError(f"numpy.dtype from a {type(spec).__name__} is not admitted")
    base = plain_dtype(spec)

    def finish(state: Any) -> np.dtype:
        if not (isinstance(state, tuple) and len(state) >= 2 and isinstance(state[1], str) and state[1] in "<>|="
                and all(x is None for x in state[2:5])):
            raise pickle.UnpicklingError(f"numpy dtype state {brief(state)} is not a plain dtype's")
        return base.newbyteorder(state[1]) if state[1] in "<>" and base.itemsize > 1 else base

    return _Pending(f"numpy dtype {spec}", finish)


def _np_reconstruct(subtype: Any, shape: Any, typecode: Any) -> _Pending:
    """``numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')``; the array itself is made from its ``BUILD``
    state ``(version, shape, dtype, is_fortran, raw bytes)`` by :func:`array_from_bytes` (never numpy's
    ``__setstate__``, which would accept object arrays)."""
    if subtype is not _NDARRAY:
        raise pickle.UnpicklingError(f"numpy array of subtype {brief(subtype)} is not admitted")

    def finish(state: Any) -> np.ndarray:
        if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[2], np.dtype)):
            raise pickle.UnpicklingError("numpy array state is not (version, shape, dtype, is_fortran, bytes)")
        _, shape, dtype, fortran, raw = state
        return array_from_bytes(raw, plain_dtype(dtype), shape, bool(fortran))

    return _Pending("numpy array", finish)


def _np_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """``numpy.core.numeric._frombuffer`` (pickle protocol 5 arrays), plain dtypes and exact sizes only."""
    if not isinstance(dtype, np.dtype):
        raise pickle.UnpicklingError(f"numpy array with a {type(dtype).__name__} dtype is not admitted")
    return array_from_bytes(buf, plain_dtype(dtype), shape, order == "F")


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    """``numpy.core.multiarray.scalar``: a plain number from exactly its raw bytes."""
    if not isinstance(dtype, np.dtype):
        raise pickle.UnpicklingError(f"numpy scalar with a {type(dtype).__name__} dtype is not admitted")
    dtype = plain_dtype(dtype)
    if not isinstance(data, bytes | bytearray) or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError(f"numpy scalar of dtype {dtype} needs {dtype.itemsize} raw bytes")
    return np.frombuffer(bytes(data), dtype=dtype, count=1)[0].copy()


class _Marker:
    """A pickled class name admitted only as a reference (a storage type, ``numpy.ndarray``, ``torch.Tensor``):
    calling it is refused, so no constructor sized by the file (``torch.ByteTensor(n)``, ``numpy.ndarray(shape)``)
    can run."""

    def __init__(self, name: str, dtype: torch.dtype | None = None):
        self.name, self.dtype = name, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError(f"calling {self.name} is not admitted")

    def __repr__(self) -> str:
        return self.name


_NDARRAY = _Marker("numpy.ndarray")
_TENSOR = _Marker("torch.Tensor")
_PARAMETER = _Marker("torch.nn.parameter.Parameter")


def _bytearray(*args: Any) -> bytearray:
    """``bytearray`` from pickled data only (``bytearray(n)`` would allocate ``n`` bytes on request)."""
    if not args or not isinstance(args[0], bytes | bytearray | str):
        raise pickle.UnpicklingError(f"bytearray from a {type(args[0]).__name__ if args else 'nothing'} is not admitted")
    return bytearray(*args)


def _codecs_encode(text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it: text to bytes (latin-1 / utf-8) only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise pickle.UnpicklingError("_codecs.encode is admitted for str → latin1/utf-8 only")
    return text.encode(encoding, errors if errors in ("strict",) else "strict")


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> torch.Tensor:
    """torch's ``_rebuild_from_type_v2`` for a plain tensor or a ``Parameter`` made by an admitted rebuild function."""
    if func not in _TENSOR_REBUILDS.values() or new_type not in (_TENSOR, _PARAMETER) or not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 is admitted for torch tensor rebuilds only")
    ret = func(*args)
    if new_type is _PARAMETER:
        ret = torch.nn.Parameter(ret, requires_grad=ret.requires_grad)
    if state:
        raise pickle.UnpicklingError("tensor attributes (_rebuild_from_type_v2 state) are not admitted")
    return ret


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any, *rest: Any) -> torch.nn.Parameter:
    if not isinstance(data, torch.Tensor):
        raise pickle.UnpicklingError(f"a Parameter from a {type(data).__name__} is not admitted")
    return torch.nn.Parameter(data, requires_grad=bool(requires_grad))


_TENSOR_REBUILDS = {  # torch's rebuilds behind a check of the view against its storage (:func:`_checked_view`)
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
}


def _storage_types() -> dict[str, _Marker]:
    dtypes = {"Untyped": torch.uint8, "Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16,
              "Int": torch.int32, "Long": torch.int64, "Half": torch.float16, "Float": torch.float32,
              "Double": torch.float64, "Bool": torch.bool, "BFloat16": torch.bfloat16,
              "ComplexFloat": torch.complex64, "ComplexDouble": torch.complex128}
    return {f"torch.{k}Storage": _Marker(f"torch.{k}Storage", v) for k, v in dtypes.items()}


def allowed_globals() -> dict[str, Any]:
    """A copy of the explicit allowlist of pickled names (documented at :func:`_allowed_globals`)."""
    return dict(_allowed_globals())


@functools.cache
def _allowed_globals() -> dict[str, Any]:
    """Pickled global name → what the restricted unpickler gives for it (an explicit list; nothing else is admitted).

    Tensor rebuilds (``_rebuild_tensor[_v2|_v3]``, ``_rebuild_parameter[_with_state]``,
    ``_rebuild_from_type_v2`` for plain tensors and parameters); storage type names, ``numpy.ndarray``
    and ``torch.Tensor`` as non-callable markers; torch dtypes, ``Size``, ``device``; ``OrderedDict``,
    ``Counter``, ``defaultdict``, ``deque``, ``argparse.Namespace``, builtin scalar and container
    constructors; numpy dtypes, scalars and arrays of plain kinds (:data:`PLAIN_KINDS`) made from their
    bytes. No sized producer (``bytearray(n)``, ``bytes(n)``, ``range(n)``, ``torch.ByteTensor(n)``,
    ``numpy.ndarray(shape)``) is admitted: every allocation copies bytes the pickle itself holds.
    """
    out: dict[str, Any] = dict(_TENSOR_REBUILDS)
    out.update(_storage_types())
    out.update({
        "torch._utils._rebuild_parameter": _rebuild_parameter,
        "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
        "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
        "torch.Tensor": _TENSOR,
        "torch.nn.parameter.Parameter": _PARAMETER,
        "torch.Size": torch.Size,
        "torch.device": torch.device,
        "collections.OrderedDict": _keyed(collections.OrderedDict, pairs=True),
        "collections.Counter": _keyed(collections.Counter, pairs=False),
        "collections.defaultdict": collections.defaultdict,
        "collections.deque": collections.deque,
        "argparse.Namespace": argparse.Namespace,
        "builtins.set": _keyed(set, pairs=False),
        "builtins.frozenset": _keyed(frozenset, pairs=False),
        "builtins.slice": slice,
        "builtins.list": list,
        "builtins.dict": _keyed(dict, pairs=True),
        "builtins.tuple": tuple,
        "builtins.int": int,
        "builtins.float": float,
        "builtins.complex": complex,
        "builtins.bool": bool,
        "builtins.str": _str,
        "builtins.bytearray": _bytearray,
        "_codecs.encode": _codecs_encode,
        "numpy.dtype": _np_dtype,
        "numpy.ndarray": _NDARRAY,
    })
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            out[f"torch.{name}"] = value if value in PLAIN_TORCH_DTYPES else _Refused(
                f"torch.{name}", f"tensor dtype torch.{name} (quantized, bit-packed, sub-byte or float8) is not "
                "supported: XBench reads plain bool/int/float/complex tensors only")
        elif name.startswith("Q") and name.endswith("Storage"):
            out[f"torch.{name}"] = _Refused(f"torch.{name}", f"torch.{name} holds a quantized tensor, which is not "
                                            "supported: XBench reads plain bool/int/float/complex tensors only")
    out["torch._utils._rebuild_qtensor"] = _Refused("torch._utils._rebuild_qtensor", "quantized tensors are not "
                                                    "supported: XBench reads plain bool/int/float/complex tensors only")
    for core in ("numpy.core", "numpy._core"):
        out[f"{core}.multiarray.scalar"] = _np_scalar
        out[f"{core}.multiarray._reconstruct"] = _np_reconstruct
        out[f"{core}.numeric._frombuffer"] = _np_frombuffer
    return out


_BUILD_TYPES = (Placeholder, argparse.Namespace, collections.OrderedDict, collections.Counter, collections.defaultdict)


class RestrictedUnpickler(pickle._Unpickler):  # the pure-Python unpickler: every opcode is inspectable
    """Unpickler whose ``find_class`` admits only :func:`allowed_globals`; everything else → :class:`Placeholder`.

    ``replaced`` lists the names that were replaced. ``BUILD`` is admitted only on instances of
    admitted data types and placeholders (never on a class or a function, which would mutate a global);
    numpy dtypes and arrays are finished at their ``BUILD`` from validated plain data. ``extra`` adds
    admitted names (the cheXlocalize reader's nested-storage reader). Use :func:`load_pickle`, which also
    bounds the nesting depth of the result.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, *, encoding: str = "utf-8", extra: Mapping[str, Any] | None = None,
                 size: int | None = None, **kwargs: Any):
        kwargs = {k: v for k, v in kwargs.items() if k in ("fix_imports", "errors")}
        size = _bytes_left(file) if size is None else size
        file = _BoundedReader(file, size)
        super().__init__(file, encoding=encoding, **kwargs)
        self.replaced: list[str] = []
        self._allowed = {**allowed_globals(), **(extra or {})}
        self._names = {id(v): k for k, v in self._allowed.items()}
        self._made: dict[str, type[Placeholder]] = {}
        self.budget = _Budget(size)

    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle maps them (nothing is imported)
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        qualified = f"{module}.{name}"
        if qualified in self._allowed:
            value = self._allowed[qualified]
            if isinstance(value, _Refused):
                raise pickle.UnpicklingError(value.why)
            return value
        if qualified not in self._made:
            self._made[qualified] = _placeholder(qualified)
            self.replaced.append(qualified)
        return self._made[qualified]

    def _name(self, func: Any) -> str:
        return self._names.get(id(func)) or getattr(func, "qualname", None) or type(func).__name__

    def load_reduce(self) -> None:
        func = self.stack[-2]
        super().load_reduce()
        self.budget.charge(_cost(self.stack[-1]), f"calling {self._name(func)}")

    def load_newobj(self) -> None:
        cls = self.stack[-2]
        super().load_newobj()
        self.budget.charge(_cost(self.stack[-1]), f"building {self._name(cls)}")

    def load_get(self) -> None:
        super().load_get()
        self.budget.charge(8, "a memo reference")

    def load_binget(self) -> None:
        super().load_binget()
        self.budget.charge(8, "a memo reference")

    def load_long_binget(self) -> None:
        super().load_long_binget()
        self.budget.charge(8, "a memo reference")

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.GET[0]] = load_get
    dispatch[pickle.BINGET[0]] = load_binget
    dispatch[pickle.LONG_BINGET[0]] = load_long_binget

    def load_setitem(self) -> None:
        _check_key(self.stack[-2])
        super().load_setitem()

    def load_setitems(self) -> None:
        for key in self._marked()[::2]:
            _check_key(key)
        super().load_setitems()

    def load_dict(self) -> None:
        for key in self._marked()[::2]:
            _check_key(key)
        super().load_dict()

    def load_additems(self) -> None:
        for item in self._marked():
            _check_key(item, "set member")
        super().load_additems()

    def load_frozenset(self) -> None:
        for item in self._marked():
            _check_key(item, "set member")
        super().load_frozenset()

    def _marked(self) -> list[Any]:
        """The items pushed since the last MARK: the pure-Python unpickler starts a fresh ``stack`` at each MARK."""
        return self.stack

    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.DICT[0]] = load_dict
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.FROZENSET[0]] = load_frozenset

    def load_build(self) -> None:
        inst = self.stack[-2]  # below the state
        if isinstance(inst, _Pending):
            state = self.stack.pop()
            try:
                real = inst.finish(state)
            except ValueError as exc:
                raise pickle.UnpicklingError(str(exc)) from None
            self.budget.charge(_cost(real), f"building {inst.what}")
            self.stack[-1] = real
            for key in inst.memo_keys:
                if self.memo.get(key) is inst:
                    self.memo[key] = real
            return
        if not isinstance(inst, _BUILD_TYPES):
            raise pickle.UnpicklingError(f"BUILD on a {type(inst).__name__} is not admitted")
        state = self.stack[-1]
        for part in (state if isinstance(state, tuple) else (state,)):
            if isinstance(part, Mapping):
                for key in part:
                    _check_key(key, "state key")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def _memo_put(self, key: int) -> None:
        if key < 0:
            raise ValueError("negative memo index")
        value = self.stack[-1]
        self.memo[key] = value
        if isinstance(value, _Pending):
            value.memo_keys.append(key)

    def load_put(self) -> None:
        self._memo_put(int(self.readline()[:-1]))

    def load_binput(self) -> None:
        self._memo_put(self.read(1)[0])

    def load_long_binput(self) -> None:
        self._memo_put(int.from_bytes(self.read(4), "little"))

    def load_memoize(self) -> None:
        self._memo_put(len(self.memo))

    dispatch[pickle.PUT[0]] = load_put
    dispatch[pickle.BINPUT[0]] = load_binput
    dispatch[pickle.LONG_BINPUT[0]] = load_long_binput
    dispatch[pickle.MEMOIZE[0]] = load_memoize

    def load_newobj_ex(self) -> None:
        raise pickle.UnpicklingError("NEWOBJ_EX (keyword constructor arguments) is not admitted")

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex


def check_tree(obj: Any, where: str, max_depth: int = MAX_DEPTH) -> None:
    """Walk what a pickle built (iteratively): nesting deeper than ``max_depth`` or a numpy object left without its
    ``BUILD`` → :class:`CheckpointError` naming ``where``. Cycles are visited once."""
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(obj, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, _Pending):
            raise CheckpointError(f"{where}: holds an {item!r} (a numpy object without its state); refused")
        if isinstance(item, str | bytes | bytearray | int | float | complex | bool | torch.Tensor | np.ndarray
                      | np.generic | torch.dtype | torch.Size | torch.device) or item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if depth >= max_depth:
            raise CheckpointError(f"{where}: nesting deeper than {max_depth} levels; refused")
        if isinstance(item, Mapping):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple | set | frozenset | collections.deque):
            children = list(item)
        elif isinstance(item, slice):
            children = [item.start, item.stop, item.step]
        else:
            children = []
        if hasattr(item, "__dict__") and not isinstance(item, type):
            children += list(vars(item).values())
        todo.extend((c, depth + 1) for c in children)


def _bytes_left(file: Any) -> int:
    """Bytes from ``file``'s position to its end (an in-memory buffer or a regular file)."""
    if isinstance(file, io.BytesIO):
        return file.getbuffer().nbytes - file.tell()
    try:
        return os.fstat(file.fileno()).st_size - file.tell()
    except (AttributeError, OSError, io.UnsupportedOperation):
        raise CheckpointError(f"{brief(file)}: a pickle is read from a buffer or a regular file only") from None


class _BoundedReader:
    """``file`` seen through the pickle's own length: a length read from the pickle (``FRAME``, ``BINUNICODE8``,
    ``BINBYTES8``, ...) longer than the bytes left is refused before anything of that length is allocated."""

    def __init__(self, file: Any, size: int):
        self.file, self.end = file, file.tell() + size

    def read(self, n: int = -1) -> bytes:
        left = self.end - self.file.tell()
        if n < 0:
            n = left
        if n > left:
            raise pickle.UnpicklingError(f"a length of {n:,} bytes at offset {self.file.tell():,} passes the end "
                                         f"of the pickle ({left:,} bytes left)")
        return self.file.read(n)

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        return self.file.readline(max(0, self.end - self.file.tell()))

    def peek(self, n: int = 0) -> bytes:  # pickle's _Unframer does not need it; kept for a file-like surface
        return b""


def load_pickle(file: Any, where: str, *, persistent_load: Any = None,
                extra: Mapping[str, Any] | None = None) -> tuple[Any, list[str]]:
    """THE pickle reader of XBench (checkpoints, TorchScript data, cheXlocalize maps): :class:`RestrictedUnpickler`
    on ``file`` → ``(object, replaced names)``, then :func:`check_tree`. Anything refused →
    :class:`CheckpointError` naming ``where``; no code from the file runs."""
    unpickler = RestrictedUnpickler(file, extra=extra)
    if persistent_load is not None:
        unpickler.persistent_load = persistent_load
    try:
        obj = unpickler.load()
    except CheckpointError:
        raise
    except RecursionError:
        raise CheckpointError(f"{where}: nesting too deep; refused") from None
    except Exception as exc:
        raise CheckpointError(f"{where}: refused by the restricted unpickler ({type(exc).__name__}: "
                              f"{visible(str(exc), 400)}); no code from the file was run") from None
    check_tree(obj, where)
    return obj, unpickler.replaced


# -- torch containers, read by XBench itself (bytes counted before anything is allocated) ---------------
def _element_size(dtype: torch.dtype) -> int:
    return torch._utils._element_size(dtype)


def _typed_storage(raw: bytearray | np.ndarray, dtype: torch.dtype) -> Any:
    untyped = torch.frombuffer(raw, dtype=torch.uint8).untyped_storage() if len(raw) else torch.UntypedStorage(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation notice
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def _storage_pid(pid: Any, size: int) -> tuple[_Marker, str, int]:
    if not (isinstance(pid, tuple) and len(pid) == size and pid[0] in ("storage", b"storage")):
        raise pickle.UnpicklingError(f"persistent id {brief(pid)} is not a torch storage reference")
    stype, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(stype, _Marker) or stype.dtype is None:
        raise pickle.UnpicklingError(f"storage type {brief(stype)} is not admitted")
    if not isinstance(key, str) or type(numel) is not int or numel < 0:
        raise pickle.UnpicklingError("storage key / size is malformed")
    return stype, key, numel


_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # zip local file header (30 bytes): ..., name length, extra length


def _stored_member(fh: Any, info: zipfile.ZipInfo, size: int) -> np.ndarray:
    """The bytes of an uncompressed member (``uint8`` array): its local header checked (signature, name), then
    ``file_size`` bytes from the data offset read into a new buffer, then the CRC-32. A damaged or truncated member
    raises ``ValueError``. The buffer is not zero-filled first: every byte of it is read from the file before it is
    returned (a short read raises), which saves a pass over the checkpoint's size."""
    fh.seek(info.header_offset)
    head = fh.read(_LOCAL_HEADER.size)
    if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise ValueError("its local header is missing or damaged")
    name_len, extra_len = _LOCAL_HEADER.unpack(head)[-2:]
    if fh.read(name_len) != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
        raise ValueError("its local header names another member")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if start + info.file_size > size:
        raise ValueError(f"its {info.file_size} bytes from offset {start} pass the end of the file ({size} bytes)")
    fh.seek(start)
    raw = np.empty(info.file_size, dtype=np.uint8)
    view, got = memoryview(raw), 0
    while got < info.file_size:
        n = fh.readinto(view[got:])
        if not n:
            raise ValueError(f"truncated ({got} of {info.file_size} bytes)")
        got += n
    view.release()
    if zlib.crc32(raw) != info.CRC:
        raise ValueError("its CRC-32 does not match (a damaged file)")
    return raw


def _read_zip_archive(fh: Any, size: int, where: str) -> tuple[Any, list[str]]:
    """A torch zip archive (``torch.save`` since 1.6, TorchScript ``data.pkl``), read with Python's ``zipfile``.

    Every member used must be stored uncompressed (torch never compresses; a compressed member could expand
    beyond the file) and fit in the file; a storage's declared size must equal its member's size, checked
    before its bytes are read. The members read add up to the file's size at most (members of a valid archive do
    not overlap). Each member is read straight into its buffer from its local header's data offset (one copy, no
    lock held while the disk is read) and checked against its CRC-32, as ``zipfile`` would."""
    try:
        archive = zipfile.ZipFile(fh)
        infos = {info.filename: info for info in archive.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"{where}: not a readable zip archive ({exc})") from None
    pkls = [n for n in infos if n == "data.pkl" or (n.endswith("/data.pkl") and n.count("/") == 1)]
    if len(pkls) != 1:
        raise CheckpointError(f"{where}: a torch archive has exactly one <name>/data.pkl; found {len(pkls)}")
    prefix = pkls[0][: -len("data.pkl")]

    total = 0  # bytes of the members read so far

    def member(name: str) -> np.ndarray:
        nonlocal total
        info = infos.get(name)
        if info is None:
            raise CheckpointError(f"{where}: archive member {name} is missing")
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"{where}: archive member {name} is compressed; torch archives are stored "
                                  "uncompressed, so this is refused (it could expand beyond the file)")
        if info.file_size > size or info.compress_size != info.file_size:
            raise CheckpointError(f"{where}: archive member {name} declares {info.file_size} bytes; the file has {size}")
        total += info.file_size
        if total > size:
            raise CheckpointError(f"{where}: archive members overlap: {total} bytes read from a file of {size}")
        try:
            return _stored_member(fh, info, size)
        except (OSError, ValueError, EOFError) as exc:
            raise CheckpointError(f"{where}: archive member {name} is unreadable ({exc})") from None

    order = bytes(member(prefix + "byteorder")) if prefix + "byteorder" in infos else b"little"
    if order != b"little":
        raise CheckpointError(f"{where}: byte order {order[:16]!r} is not supported (little-endian archives only)")
    storages: dict[str, Any] = {}

    def persistent_load(pid: Any) -> Any:
        stype, key, numel = _storage_pid(pid, 5)
        if key not in storages:
            name = f"{prefix}data/{key}"
            info = infos.get(name)
            nbytes = numel * _element_size(stype.dtype)
            if info is None or info.file_size != nbytes:
                raise pickle.UnpicklingError(f"storage {key} declares {nbytes} bytes; the archive holds "
                                             f"{'no member' if info is None else info.file_size}")
            storages[key] = _typed_storage(member(name), stype.dtype)
        return storages[key]

    return load_pickle(io.BytesIO(member(prefix + "data.pkl")), f"{where} (member {prefix}data.pkl)",
                       persistent_load=persistent_load)


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _read_legacy(data: bytes, where: str) -> tuple[Any, list[str]]:
    """A legacy (pre-1.6, non-zip) torch file, from its bytes: header pickles, the object pickle (storages
    declared there are allocated only while their total fits in the bytes left), the storage keys, then each
    storage's element count and bytes (the count must match the declaration)."""
    fh = io.BytesIO(data)
    if load_pickle(fh, where)[0] != _LEGACY_MAGIC:
        raise CheckpointError(f"{where}: not a torch checkpoint (no legacy magic number, not a zip archive)")
    if load_pickle(fh, where)[0] != 1001:
        raise CheckpointError(f"{where}: unknown legacy torch protocol version")
    info = load_pickle(fh, where)[0]
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise CheckpointError(f"{where}: legacy checkpoint is not little-endian; not supported")
    storages: dict[str, Any] = {}
    committed = 0

    def persistent_load(pid: Any) -> Any:
        nonlocal committed
        stype, key, numel = _storage_pid(pid, 6)
        if pid[5] is not None:
            raise pickle.UnpicklingError("legacy storage views are not supported")
        if key not in storages:
            nbytes = numel * _element_size(stype.dtype)
            if committed + nbytes > len(data) - fh.tell():
                raise pickle.UnpicklingError(f"storage {key} declares {nbytes} bytes; only "
                                             f"{len(data) - fh.tell() - committed} bytes are left in the file")
            committed += nbytes
            storages[key] = (_typed_storage(bytearray(nbytes), stype.dtype), numel)  # ≤ the bytes left in the file
        return storages[key][0]

    obj, replaced = load_pickle(fh, where, persistent_load=persistent_load)
    keys = load_pickle(fh, where)[0]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or sorted(keys) != sorted(storages):
        raise CheckpointError(f"{where}: legacy storage list does not match the storages the pickle uses")
    for key in keys:
        storage, numel = storages[key]
        count = int.from_bytes(fh.read(8), "little", signed=True)
        nbytes = numel * _element_size(storage.dtype)
        raw = fh.read(nbytes) if count == numel else b""
        if count != numel or len(raw) != nbytes:
            raise CheckpointError(f"{where}: storage {key} is truncated or its size ({count}) differs from {numel}")
        if nbytes:
            storage._untyped_storage.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8).untyped_storage())
    return obj, replaced
@dataclass
class LoadReport:
    """What :func:`read_checkpoint_report` did: ``method`` (``safetensors``, ``legacy``,
    ``restricted``, ``torchscript``) and the pickled names it replaced by placeholders."""

    path: Path
    method: str
    replaced: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = {"safetensors": "safetensors", "legacy": "restricted unpickler (legacy torch format)",
                "restricted": "restricted unpickler", "torchscript": "restricted unpickler (TorchScript data.pkl, code not run)"}[self.method]
        if self.replaced:
            text += f"; {len(self.replaced)} pickled type(s) kept as inert placeholders: {', '.join(self.replaced)}"
        return text


def _restricted_load(path: Path) -> tuple[Any, list[str]]:
    """A torch zip archive (checkpoint or TorchScript) through :func:`_read_zip_archive`."""
    with open(path, "rb") as fh:
        return _read_zip_archive(fh, path.stat().st_size, str(path))


def read_torch_bytes(data: bytes, where: str) -> Any:
    """A ``torch.save`` payload held in memory (zip archive or legacy format), read like a checkpoint file: the
    reader of the storages nested in cheXlocalize map pickles (``torch.storage._load_from_bytes``)."""
    if not isinstance(data, bytes | bytearray):
        raise pickle.UnpicklingError(f"nested torch data must be bytes, got {type(data).__name__}")
    if data[:4] == b"PK\x03\x04":
        obj, replaced = _read_zip_archive(io.BytesIO(data), len(data), where)
    else:
        obj, replaced = _read_legacy(bytes(data), where)
    if replaced:
        raise CheckpointError(f"{where}: nested torch data pickles other objects ({', '.join(replaced)}); refused")
    return obj


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
        obj, replaced = _restricted_load(path)
        return obj, LoadReport(path, "restricted", replaced)
    obj, replaced = _read_legacy(path.read_bytes(), str(path))  # a legacy (non-zip) torch file, bytes read first
    return obj, LoadReport(path, "legacy", replaced)


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
            raise CheckpointError(f"{where}: key {brief(key)} is a {type(key).__name__}, not a string")
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{where}: entry {brief(key)} is a {type(value).__name__}, not a tensor")
    return dict(state)

