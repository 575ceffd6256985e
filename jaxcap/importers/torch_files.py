"""PyTorch files read without torch: ``torch.save`` pickles (the zip format of PyTorch >= 1.6
and the older sequential one) and TorchScript archives (``torch.jit.save``: OpenAI's CLIP
``ViT-B-32.pt``), with a restricted unpickler that builds NumPy arrays.

Only tensors, state-dict containers and NumPy arrays are constructed; a TorchScript module's
objects (``__torch__.*`` classes) become :class:`ScriptObject` holders of their attributes, which
:func:`script_tensors` flattens to state-dict names. Anything else is refused, naming it.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import struct
import zipfile

import numpy as np

from jaxcap.errors import BadInput

# torch's storage classes -> the NumPy dtype of their bytes (little-endian, as torch saves).
_STORAGES = {"FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2",
             "BFloat16Storage": "<u2", "LongStorage": "<i8", "IntStorage": "<i4",
             "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1", "BoolStorage": "?"}
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c


class _Lazy:
  """A tensor of the pickle: its storage key, dtype, offset, size and stride (elements); the
  bytes are read after the pickle (the old format stores them after it)."""

  def __init__(self, storage, offset, size, stride):
    self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

  def numpy(self, data: bytes) -> np.ndarray:
    key, dtype = self.storage
    flat = np.frombuffer(data, dtype=np.dtype(dtype))
    if dtype == "<u2":  # bfloat16: the high half of a float32
      flat = (flat.astype(np.uint32) << 16).view(np.float32)
    # as_strided reads whatever memory a negative offset or stride points at (a crash), and a
    # zero stride repeats elements without bound: both refused before any array is made.
    if (self.offset < 0 or len(self.size) != len(self.stride) or min(self.size, default=0) < 0
        or min(self.stride, default=0) < 0):
      raise BadInput(f"storage {key}: a tensor at offset {self.offset} of size {list(self.size)}, "
                     f"stride {list(self.stride)}; expected non-negative ones, a stride per dimension")
    if not self.size:
      return flat[self.offset:self.offset + 1].reshape(()).copy()
    span = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1
    if min(self.size) > 0 and span > flat.size:
      raise BadInput(f"storage {key}: {flat.size} elements, a tensor reads up to {span}")
    if int(np.prod(self.size, dtype=object)) > flat.size:
      raise BadInput(f"storage {key}: {flat.size} elements, a tensor of size {list(self.size)} "
                     "repeats them; expected at most as many elements as its storage holds")
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[self.offset:], self.size,
                                           [s * item for s in self.stride]).copy()


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
  del requires_grad, hooks, metadata
  return _Lazy(storage, offset, size, stride)


def _storage_class(name):
  def make(*_):  # never called: the storage class is only a tag in the persistent id
    raise pickle.UnpicklingError(f"torch.{name} constructed")
  make.dtype = _STORAGES[name]
  return make


# (module, name) pairs their train.py's dict needs: tensors, OrderedDicts (state dicts and
# their hooks), NumPy's rng state (an ndarray), the plain containers of the rest.
_PTH_GLOBALS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): _storage_class(name) for name in _STORAGES},
}
_PTH_NUMPY = {("numpy", "dtype"), ("numpy", "ndarray"), ("numpy.core.multiarray", "_reconstruct"),
              ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
              ("numpy._core.multiarray", "scalar"), ("_codecs", "encode"), ("builtins", "set")}


def check_lengths(f: io.BytesIO) -> io.BytesIO:
  """``f`` back at its position after walking the pickle there without building it: a length
  field (of bytes, a string, a frame) beyond the bytes left raises ``ValueError`` here, where the
  C unpickler would first allocate what the length says (one flipped byte: gigabytes) or raise
  ``MemoryError`` / ``OverflowError``."""
  start = f.tell()
  end = f.seek(0, io.SEEK_END)
  f.seek(start)
  for op, arg, _ in pickletools.genops(f):
    if op.name == "FRAME" and arg > end - f.tell():
      raise ValueError(f"a pickle frame of {arg} bytes where {end - f.tell()} are left")
  f.seek(start)
  return f


class _PthUnpickler(pickle.Unpickler):

  def __init__(self, f, path):
    super().__init__(f, encoding="latin1")
    self.path = path
    self.storages = {}  # key -> dtype, as the persistent ids name them

  def find_class(self, module, name):
    if (module, name) in _PTH_GLOBALS:
      return _PTH_GLOBALS[(module, name)]
    if (module, name) in _PTH_NUMPY:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"refused to construct {module}.{name} (not part of a saved "
                                 "state_dict / optimiser state)")

  def persistent_load(self, pid):
    # zip: ('storage', class, key, location, numel); old: (..., numel, view_metadata).
    if not (isinstance(pid, tuple) and pid and pid[0] == "storage" and hasattr(pid[1], "dtype")):
      raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
    view = pid[5] if len(pid) > 5 else None
    if view is not None:  # a view of a root storage: (view key, element offset, size)
      raise pickle.UnpicklingError("storage views (PyTorch < 1.0 saves) are not read")
    self.storages[str(pid[2])] = pid[1].dtype
    return (str(pid[2]), pid[1].dtype)


def _resolve(obj, read):
  """``obj`` with every tensor read (``read(key) -> bytes``)."""
  if isinstance(obj, _Lazy):
    return obj.numpy(read(obj.storage[0]))
  if isinstance(obj, dict):
    return type(obj)((k, _resolve(v, read)) for k, v in obj.items()) if isinstance(obj, collections.OrderedDict) \
        else {k: _resolve(v, read) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return type(obj)(_resolve(v, read) for v in obj)
  if isinstance(obj, ScriptObject):
    obj.attributes = {k: _resolve(v, read) for k, v in obj.attributes.items()}
  return obj


def _read_legacy(path: str):
  with open(path, "rb") as file:  # in memory: each pickle's lengths are checked before it is read
    raw = file.read()
  f = io.BytesIO(raw)
  magic = _PthUnpickler(check_lengths(f), path).load()
  if magic != _LEGACY_MAGIC:
    raise BadInput("neither a zip nor PyTorch's older format")
  _PthUnpickler(check_lengths(f), path).load(), _PthUnpickler(check_lengths(f), path).load()  # protocol version, sys_info
  u = _PthUnpickler(check_lengths(f), path)
  obj = u.load()
  keys = _PthUnpickler(check_lengths(f), path).load()
  data = {}
  for key in map(str, keys):  # each: its element count (int64), then its bytes
    if key not in u.storages:
      raise BadInput(f"storage {key}: not named by the pickle")
    numel = struct.unpack("<q", f.read(8))[0]
    size = numel * np.dtype(u.storages[key]).itemsize
    left = len(raw) - f.tell()
    if not 0 <= size <= left:  # a count past the file (or negative) is a damaged file, not a read
      raise BadInput(f"storage {key}: {numel} elements ({size} bytes), {left} bytes left in the file")
    data[key] = f.read(size)
    if len(data[key]) != size:
      raise BadInput(f"storage {key}: the file ends inside it")
  return _resolve(obj, lambda key: data[key])


class ScriptObject:
  """A TorchScript module object of the archive: its attributes (submodules, parameters,
  buffers, plain values) as the pickle's ``__setstate__`` / BUILD gives them."""

  type_name = ""

  def __init__(self, *args):
    self.attributes = {}

  def __setstate__(self, state):
    self.attributes = dict(state) if isinstance(state, dict) else {}


def _script_class(module, name):
  # pickle's NEWOBJ wants a type: one ScriptObject subclass per TorchScript class name.
  return type(name, (ScriptObject,), {"type_name": f"{module}.{name}"})


def _int_list(values):  # torch.jit._pickle.build_intlist and friends: plain lists
  return list(values)


_SCRIPT_GLOBALS = {("torch.jit._pickle", n): _int_list for n in (
    "build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "build_list")}


class _Unpickler(_PthUnpickler):

  def find_class(self, module, name):
    if module.startswith("__torch__"):
      return _script_class(module, name)
    if (module, name) in _SCRIPT_GLOBALS:
      return _SCRIPT_GLOBALS[(module, name)]
    return super().find_class(module, name)


def _read_zip_any(path: str):
  with zipfile.ZipFile(path) as z:
    names = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if not names:
      raise BadInput("no <archive>/data.pkl")
    prefix = names[0][:-len("data.pkl")]
    obj = _Unpickler(check_lengths(io.BytesIO(z.read(names[0]))), path).load()
    return _resolve(obj, lambda key: z.read(f"{prefix}data/{key}"))


def read(path: str, expected: str):
  """What ``torch.load(path)`` returns (or, for a TorchScript archive, its top
  :class:`ScriptObject`), tensors as NumPy arrays; ``expected`` names the file wanted in errors."""
  if not os.path.isfile(path):
    raise BadInput(f"{path}: no such file; expected {expected}")
  try:
    if zipfile.is_zipfile(path):
      return _read_zip_any(path)
    with open(path, "rb") as f:
      if f.read(4) == b"PK\x03\x04":  # a zip's first entry, without its central directory
        raise BadInput("a zip archive without its end (truncated?)")
    return _read_legacy(path)
  except OSError as e:
    raise BadInput(f"{path}: cannot read ({e.strerror or e})") from None
  except (pickle.UnpicklingError, EOFError, ValueError, KeyError, struct.error, zipfile.BadZipFile,
          AttributeError, TypeError, IndexError) as e:
    first = " ".join(str(e).split())[:200] or type(e).__name__
    raise BadInput(f"{path}: not a PyTorch checkpoint this importer reads ({first}); expected "
                     f"{expected}") from None


def script_tensors(obj: ScriptObject, prefix: str = "") -> dict[str, np.ndarray]:
  """Every array attribute under ``obj``, named as ``state_dict`` names them (``visual.conv1.weight``)."""
  out = {}
  for name, value in obj.attributes.items():
    if isinstance(value, ScriptObject):
      out.update(script_tensors(value, f"{prefix}{name}."))
    elif isinstance(value, np.ndarray):
      out[prefix + name] = value
  return out


# (module, name) pairs the unpickler of self-critical's infos (and of detectron2's weight pickles)
# may construct. ``_codecs.encode``: a protocol-2
# pickle written by Python 3 (self-critical's ``misc.pickle_dump``) stores every ``bytes``
# object, such as a numpy scalar's raw value (its ``best_val_score``, pycocoevalcap's CIDEr),
# as ``_codecs.encode(str, "latin1")``; it turns a string into bytes and can do nothing else.
INFOS_GLOBALS = {
    ("_codecs", "encode"),
    ("argparse", "Namespace"), ("collections", "OrderedDict"), ("collections", "defaultdict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("__builtin__", "set"),
}


class InfosUnpickler(pickle.Unpickler):
  """A pickle of plain data (dicts, Namespaces, NumPy arrays and scalars): nothing else is built."""

  def find_class(self, module, name):
    if (module, name) in INFOS_GLOBALS:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"refused to construct {module}.{name}")
