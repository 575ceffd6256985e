"""Every reader of outside bytes, fuzzed (Hypothesis) from valid files their producers wrote.

The invariant (jaxcap/errors.py): for any bytes, a reader returns a correct result or raises
:class:`jaxcap.errors.BadInput` whose first line names the file (the HTTP server's body readers:
a :class:`jaxcap.serving.server.BadRequest` with a 4xx status), within a bounded time and
memory, and writes nothing. Any other exception is a bug and fails the test with its traceback.

Each property starts from a valid file made by the producer's own code path: the
self-critical.pytorch fixtures its own ``torch.save`` wrote (``.pth`` zip and legacy,
``.safetensors``, ``infos_<id>.pkl``), OpenAI's CLIP as ``torch.jit.save`` wrote it (TorchScript),
the region detector's ``pytorch_model.bin`` and airsplay's detectron2 pickle, the M² authors' ``vocab.pkl``, ``np.save`` / ``np.savez``
features, Pillow's PNG / JPEG, tests/data/fakes.py's Karpathy layout, jaxcap's own writers of
``vocab.json``, scores and predictions files, COCO annotations, a run's ``config.json`` /
``info.json``, an exported captioner, HDF5 files as h5py writes them (M²'s detections,
cocotalk's labels), the server's multipart bodies as aiohttp's MultipartWriter writes them, and
the config arguments the absl programs read (``--config=<file>.py:<arg>``, ``--config.<field>=``).
Mutations (:func:`mutated`): truncation, byte flips,
extreme integers (sizes that would exhaust memory), NaN / Inf floats, splices, insertions,
deletions, appended garbage, non-UTF-8 bytes; structure-aware ones where a checksum would
otherwise stop every flip at the first check (a zip's members re-zipped, a PNG's chunks with
their CRC recomputed, a safetensors header re-encoded, a pickle's classes swapped, JSON values
replaced by wrong types).

Bounds (:func:`holds`): each call within :data:`TIME_BOUND_S` and a peak of
:data:`MEMORY_BOUND` bytes allocated (tracemalloc: NumPy's arrays included, even those the
kernel would only have reserved), and the files of its folder unchanged.

Tiers: each property runs with a fixed seed and a few dozen examples in the default suite and
with many more (``JAXCAP_FUZZ_EXAMPLES``, default 200; still derandomized: a failure
reproduces) under ``-m slow`` (:func:`both_tiers`); the export artefact, which compiles, runs in
the slow tier only. A failure is reported as the :func:`splice` of the valid file that makes
it. Every failure found became an ``@example`` of its property (run first, every run) or a
plain test beside it, its comment naming the exception it raised.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import io
import json
import math
import os
import pickle
import shutil
import struct
import tempfile
import time
import tracemalloc
import warnings
import zipfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jaxcap.errors import BadInput, first_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SC = os.path.join(REPO, "tests", "importers", "fixtures", "self_critical")
M2 = os.path.join(REPO, "tests", "papers", "m2", "fixtures", "import")

# Bounds every call is held to: wall time (a loaded 2-core machine: generous), and the peak of
# the memory Python and NumPy allocate (tracemalloc sees NumPy's arrays, even those the kernel
# would only reserve), far above what these few-kilobyte files need.
TIME_BOUND_S = 20.0
MEMORY_BOUND = 256 << 20

_BASE = settings(derandomize=True, deadline=None, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much, HealthCheck.large_base_example])
# The slow tier's count can be raised for a longer hunt: JAXCAP_FUZZ_EXAMPLES=5000 pytest -m slow ...
DEFAULT_EXAMPLES, SLOW_EXAMPLES = 30, int(os.environ.get("JAXCAP_FUZZ_EXAMPLES", "200"))


def both_tiers(strategy, examples: int = DEFAULT_EXAMPLES, slow_examples: int | None = None,
               regressions=()):
  """``(default test, slow test)`` of one property ``check(value)``: ``examples`` examples of
  ``strategy`` in the default tier, ``slow_examples`` under ``-m slow``; ``regressions`` (the
  inputs that once failed) run first in both."""

  def make(check):
    def build(n):
      def test(value):
        check(value)
      test.__name__ = check.__name__
      test.__doc__ = check.__doc__
      for value in regressions:
        test = example(value)(test)
      return settings(_BASE, max_examples=n)(given(strategy)(test))

    slow = SLOW_EXAMPLES if slow_examples is None else min(slow_examples, SLOW_EXAMPLES)
    return build(examples), pytest.mark.slow(build(slow))

  return make


# ---------------------------------------------------------------------------- mutations
_EXTREME_INTS = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                 0xFFFFFFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1)
_SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 3.4e38, -3.4e38, 1e-45)
_GARBAGE = (b"\xff", b"\xfe\xff", b"\xc3(", b"\xed\xa0\x80", b"\x00", b"\x80\x02", b"PK\x03\x04",
            b"\x93NUMPY", b"]", b"}", b"{", b"NaN", b"\"", b"\\")


@st.composite
def _offset(draw, n: int, width: int = 1) -> int:
  """A position in ``n`` bytes, biased towards the first 512 (headers, where bytes matter)."""
  hi = max(n - width, 0)
  return draw(st.one_of(st.integers(0, min(hi, 511)), st.integers(0, hi)))


class Mutant(bytes):
  """Bytes derived from a base file, shown (when Hypothesis reports a failure) as the
  :func:`splice` that makes them: ``splice(base, start, end, middle)``."""

  origin = ""  # the name of its base in BASES

  def _repr_pretty_(self, p, cycle):
    del cycle
    p.text(describe(self, self.origin))


BASES: dict[str, bytes] = {}


def base(name: str, data: bytes) -> bytes:
  """Registers ``data`` (a producer's valid file) as base ``name`` of mutations."""
  BASES[name] = data
  return data


def splice(name: str, start: int, end: int, middle: bytes = b"") -> bytes:
  """Base ``name`` with bytes ``[start:end]`` replaced by ``middle`` (a regression example)."""
  data = BASES[name]
  return data[:start] + middle + data[end:]


def describe(data: bytes, name: str) -> str:
  """``data`` as the :func:`splice` of base ``name`` that makes it."""
  original = BASES.get(name)
  if original is None:
    return repr(bytes(data[:300]))
  k = 0
  while k < min(len(data), len(original)) and data[k] == original[k]:
    k += 1
  s = 0
  while s < min(len(data), len(original)) - k and data[-1 - s] == original[-1 - s]:
    s += 1
  middle = bytes(data[k:len(data) - s])
  shown = repr(middle) if len(middle) <= 600 else repr(middle[:600]) + "+..."
  return f"splice({name!r}, {k}, {len(original) - s}, {shown})"


def mutant(data: bytes, name: str) -> Mutant:
  out = Mutant(data)
  out.origin = name
  return out


@st.composite
def mutated(draw, name: str, max_ops: int = 4) -> bytes:
  """Base ``name`` (or bytes) after 1 to ``max_ops`` drawn mutations."""
  data = BASES[name] if isinstance(name, str) else name
  buf = bytearray(data)
  for _ in range(draw(st.integers(1, max_ops))):
    op = draw(st.sampled_from(("truncate", "flip", "int", "float", "splice", "insert", "delete",
                               "append", "garbage")))
    n = len(buf)
    if op == "truncate":
      del buf[draw(_offset(n)) if n else 0:]
    elif op == "flip" and n:
      buf[draw(_offset(n))] ^= draw(st.integers(1, 255))
    elif op == "int" and n:
      width = draw(st.sampled_from((1, 2, 4, 8)))
      value = draw(st.one_of(st.sampled_from(_EXTREME_INTS), st.integers(0, (1 << 64) - 1)))
      i = draw(_offset(n, width))
      buf[i:i + width] = (value % (1 << (8 * width))).to_bytes(
          width, draw(st.sampled_from(("little", "big"))))
    elif op == "float" and n:
      width = draw(st.sampled_from((2, 4, 8)))
      value = draw(st.sampled_from(_SPECIAL_FLOATS))
      i = draw(_offset(n, width))
      with np.errstate(over="ignore"):
        buf[i:i + width] = np.array([value], f"<f{width}").tobytes()
    elif op == "splice" and n:
      a, b = draw(_offset(n)), draw(_offset(n))
      k = draw(st.integers(1, 64))
      buf[b:b + k] = buf[a:a + k]
    elif op == "insert":
      i = draw(_offset(n)) if n else 0
      buf[i:i] = draw(st.binary(min_size=1, max_size=32))
    elif op == "delete" and n:
      i = draw(_offset(n))
      del buf[i:i + draw(st.integers(1, 64))]
    elif op == "append":
      buf += draw(st.binary(min_size=1, max_size=64))
    elif op == "garbage":
      i = draw(_offset(n)) if n else 0
      g = draw(st.sampled_from(_GARBAGE))
      buf[i:i + (len(g) if draw(st.booleans()) else 0)] = g
  return mutant(bytes(buf), name if isinstance(name, str) else "")


def rezipped(members) -> bytes:
  out = io.BytesIO()
  with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
    for name, blob in members:
      z.writestr(name, blob)
  return out.getvalue()


def zip_members(data: bytes) -> list[tuple[str, bytes]]:
  with zipfile.ZipFile(io.BytesIO(data)) as z:
    return [(info.filename, z.read(info)) for info in z.infolist()]


@st.composite
def zip_members_mutated(draw, name: str) -> bytes:
  """A zip's members (one drawn, or its name) mutated and the archive written again (valid CRCs,
  ZIP_STORED like torch.save and jaxcap.export): what byte flips past the CRC would reach."""
  members = zip_members(BASES[name])
  k = draw(st.integers(0, len(members) - 1))
  member, blob = members[k]
  how = draw(st.integers(0, 9))
  if how == 0:
    members[k] = (draw(st.sampled_from((member + "x", "x/" + member, member.upper(), "x"))), blob)
  elif how == 1:
    del members[k]
  else:
    members[k] = (member, draw(mutated(blob)))
  return mutant(rezipped(members), name)


# Classes a pickle may name that no reader should construct, and wrong ones it should refuse.
_WRONG_CLASSES = (b"os\nsystem\n", b"builtins\neval\n", b"posix\nsystem\n", b"subprocess\nPopen\n",
                  b"numpy\nload\n", b"__main__\nModel\n", b"collections\nCounter\n",
                  b"torch\nDoubleStorage\n", b"torch._utils\n_rebuild_parameter\n",
                  b"_codecs\ndecode\n", b"builtins\ngetattr\n", b"nonexistent.module\nThing\n",
                  b"argparse\nNamespace\n", b"collections\nOrderedDict\n", b"numpy\ndtype\n",
                  b"builtins\nslice\n", b"_codecs\nencode\n")


def _globals_in(data: bytes) -> list[tuple[int, int]]:
  """``(start, end)`` of each GLOBAL opcode's ``module\\nname\\n`` in a protocol-2 pickle."""
  import pickletools
  out = []
  try:
    for op, _, pos in pickletools.genops(data):
      if op.name == "GLOBAL":
        end = data.index(b"\n", data.index(b"\n", pos + 1) + 1) + 1
        out.append((pos + 1, end))
  except ValueError:  # the rest is not a pickle (a legacy .pth's storages follow it)
    pass
  return out


def classes_swapped(data: bytes, draw) -> bytes:
  spots = _globals_in(data)
  if not spots:
    return draw(mutated(data))
  start, end = draw(st.sampled_from(spots))
  return data[:start] + draw(st.sampled_from(_WRONG_CLASSES)) + data[end:]


@st.composite
def pickle_classes_swapped(draw, name: str) -> bytes:
  """A protocol-2 pickle (``torch.save``'s, self-critical's ``pickle_dump``) with one GLOBAL
  opcode's ``module\\nname\\n`` replaced by a wrong class."""
  return mutant(classes_swapped(BASES[name], draw), name)


@st.composite
def zip_pickle_classes_swapped(draw, name: str) -> bytes:
  """A ``torch.save`` zip whose ``data.pkl`` names a wrong class."""
  members = zip_members(BASES[name])
  k = next(i for i, (n, _) in enumerate(members) if n.endswith("data.pkl"))
  members[k] = (members[k][0], classes_swapped(members[k][1], draw))
  return mutant(rezipped(members), name)


# Wrong-typed JSON values: what a hand-edited or foreign file puts where a field should be.
_HUGE_INT = "__HUGE_INT__"  # replaced by 5000 digits (beyond Python's int-from-text limit)
_DEEP = "__DEEP__"  # replaced by arrays nested 100,000 deep (beyond the decoder's recursion)
WEIRD_JSON = st.sampled_from([None, True, False, 0, -1, 1 << 70, 1.5, math.nan, math.inf, -math.inf,
                              "", "x", "\u00e9\U0001F600", "../../etc/passwd", [], [1, "a"], {},
                              {"a": 1}, [[[]]], _HUGE_INT, _DEEP]).map(copy.deepcopy)  # later ops mutate it


def json_text(obj) -> bytes:
  """``json.dumps(obj)`` with the placeholders of :data:`WEIRD_JSON` written out."""
  return (json.dumps(obj).replace(f'"{_HUGE_INT}"', "1" * 5000)
          .replace(f'"{_DEEP}"', "[" * 100_000 + "]" * 100_000).encode())


def _json_paths(obj, path=()):
  yield path
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield from _json_paths(v, path + (k,))
  elif isinstance(obj, list):
    for i, v in enumerate(obj):
      yield from _json_paths(v, path + (i,))


@st.composite
def json_mutated(draw, name: str, max_ops: int = 3) -> bytes:
  """Base ``name`` (a producer's JSON) with values replaced by wrong types, keys removed or
  added, then perhaps byte-mutated (non-UTF-8, truncated, ...)."""
  obj = json.loads(BASES[name])
  for _ in range(draw(st.integers(1, max_ops))):
    paths = list(_json_paths(obj))
    path = draw(st.sampled_from(paths))
    op = draw(st.sampled_from(("replace", "replace", "delete", "add")))
    if not path:
      if op == "replace":
        obj = draw(WEIRD_JSON)
      continue
    parent = obj
    for k in path[:-1]:
      parent = parent[k]
    if op == "replace":
      parent[path[-1]] = draw(WEIRD_JSON)
    elif op == "delete":
      del parent[path[-1]]
    elif isinstance(parent, dict):
      parent[draw(st.sampled_from(("", "x", "image_id", "tokens", "itos")))] = draw(WEIRD_JSON)
    else:
      parent.insert(path[-1], draw(WEIRD_JSON))
  data = json_text(obj)
  if draw(st.integers(0, 3)) == 0:
    data = draw(mutated(data, max_ops=2))
  return mutant(data, name)


def json_fuzzed(name: str):
  """Byte mutations of JSON base ``name`` or structural ones (wrong types, missing keys)."""
  return st.one_of(mutated(name), json_mutated(name))


# ---------------------------------------------------------------------------- the invariant
def _listing(folder: str) -> dict:
  return {os.path.join(d, f): os.path.getsize(os.path.join(d, f))
          for d, _, files in os.walk(folder) for f in files}


@contextlib.contextmanager
def scratch():
  folder = tempfile.mkdtemp(prefix="jaxcap-fuzz-")
  try:
    yield folder
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def holds(call, folder: str, names, memory: int = MEMORY_BOUND):
  """``call()``'s result, or None when it raised :class:`BadInput` whose first line names one
  of ``names``; within :data:`TIME_BOUND_S` and ``memory`` bytes, with nothing written under
  ``folder``. Any other exception propagates (a bug: Hypothesis reports and shrinks it)."""
  names = (names,) if isinstance(names, str) else tuple(names)
  before = _listing(folder)
  started = time.perf_counter()
  tracemalloc.start()
  try:
    try:
      return call()
    except BadInput as e:
      line = first_line(e)
      assert "\n" not in line and any(n in line for n in names), \
          f"BadInput's first line names none of {names}: {line!r}"
      return None
  finally:
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    elapsed = time.perf_counter() - started
    assert _listing(folder) == before, "the reader wrote or changed a file"
    assert elapsed < TIME_BOUND_S, f"the reader took {elapsed:.1f} s"
    assert peak < memory, f"the reader allocated {peak / 2**20:.0f} MiB at its peak"


def read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def written(folder: str, name: str, data: bytes) -> str:
  path = os.path.join(folder, name)
  with open(path, "wb") as f:
    f.write(data)
  return path


# ============================================================================ (a) torch files
from jaxcap.importers import torch_files  # noqa: E402

base("PTH_ZIP", read_bytes(os.path.join(SC, "newfc", "model.pth")))  # torch.save (zip)
base("PTH_LEGACY", read_bytes(os.path.join(SC, "transformer", "model_legacy.pth")))  # (_use_new_zipfile_serialization=False)
base("SAFETENSORS", read_bytes(os.path.join(SC, "newfc", "model.safetensors")))


def _torch_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "model.pth", data)
    result = holds(lambda: torch_files.read(path, "a state_dict"), folder, path)
    if isinstance(result, dict):  # what torch.load gives, tensors as arrays
      for v in result.values():
        assert not isinstance(v, torch_files._Lazy)


test_torch_zip_bytes, test_torch_zip_bytes_slow = both_tiers(mutated("PTH_ZIP"))(_torch_read)
test_torch_zip_members, test_torch_zip_members_slow = both_tiers(
    st.one_of(zip_members_mutated("PTH_ZIP"), zip_pickle_classes_swapped("PTH_ZIP")))(_torch_read)
def _legacy_first_count() -> int:
  """Where the legacy file's first storage element count (int64) is: after its five pickles."""
  f = io.BytesIO(BASES["PTH_LEGACY"])
  for _ in range(5):
    torch_files._PthUnpickler(torch_files.check_lengths(f), "model.pth").load()
  return f.tell()


_COUNT_AT = _legacy_first_count()
test_torch_legacy, test_torch_legacy_slow = both_tiers(
    st.one_of(mutated("PTH_LEGACY"), pickle_classes_swapped("PTH_LEGACY")), regressions=[
        # A BINUNICODE length of 0x7e000010: the unpickler allocated 2 GiB before reading.
        splice("PTH_LEGACY", 31, 385428, b"~"),
        # A storage of 2**62 (or -1) elements: its byte count overflowed f.read (OverflowError),
        # found by the slow tier's 200 examples.
        splice("PTH_LEGACY", _COUNT_AT, _COUNT_AT + 8, struct.pack("<q", 2 ** 62)),
        splice("PTH_LEGACY", _COUNT_AT, _COUNT_AT + 8, struct.pack("<q", -1)),
    ])(_torch_read)


# ---------------------------------------------------------------------------- safetensors
from jaxcap.clip import weights as clip_weights  # noqa: E402
from jaxcap.features import weights as feature_weights  # noqa: E402


@st.composite
def safetensors_header_mutated(draw, name: str) -> bytes:
  """The safetensors JSON header with values replaced (dtype, shape, data_offsets, ...), its
  length prefix rewritten: what a byte flip inside the header's JSON would need luck for."""
  data = BASES[name]
  n = struct.unpack("<Q", data[:8])[0]
  header = json.loads(data[8:8 + n])
  body = data[8 + n:]
  key = draw(st.sampled_from(sorted(header)))
  field = draw(st.sampled_from(("dtype", "shape", "data_offsets", None)))
  if field is None or not isinstance(header[key], dict):
    header[key] = draw(WEIRD_JSON)
  else:
    header[key][field] = draw(st.one_of(
        WEIRD_JSON, st.sampled_from(["F64", "F16", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "C64"]),
        st.lists(st.sampled_from([0, 1, 3, 1 << 31, 1 << 40, -1]), max_size=4)))
  text = json_text(header)
  return mutant(struct.pack("<Q", len(text)) + text + body, name)


SAFETENSORS_MUTANTS = st.one_of(mutated("SAFETENSORS"), safetensors_header_mutated("SAFETENSORS"))


def _safetensors_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "model.safetensors", data)
    result = holds(lambda: feature_weights.read_safetensors(path), folder, path)
    if result is not None:
      assert all(isinstance(v, np.ndarray) for v in result.values())


def _clip_reader(name: str):
  def check(data: bytes):
    with scratch() as folder:
      path = written(folder, name, data)
      result = holds(lambda: clip_weights.read_tensors(path), folder, path)
      if result is not None:
        assert all(isinstance(v, np.ndarray) for v in result[0].values())
  check.__name__ = "clip_" + "".join(c if c.isalnum() else "_" for c in name)
  return check


_clip_read = _clip_reader("open_clip_model.safetensors")


def _clip_pth_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "clip.pth", data)
    holds(lambda: clip_weights.read_tensors(path), folder, path)


test_safetensors, test_safetensors_slow = both_tiers(SAFETENSORS_MUTANTS)(_safetensors_read)
test_clip_safetensors, test_clip_safetensors_slow = both_tiers(
    SAFETENSORS_MUTANTS, examples=15, slow_examples=300)(_clip_read)
test_clip_pth, test_clip_pth_slow = both_tiers(
    st.one_of(mutated("PTH_ZIP"), zip_members_mutated("PTH_ZIP")), examples=15,
    slow_examples=300)(_clip_pth_read)


# OpenAI's CLIP as torch.jit.save writes it (a TorchScript archive: code/, constants.pkl, data.pkl
# naming __torch__ classes), the small model tests/clip/make_fixtures.py traced.
base("TORCHSCRIPT", read_bytes(os.path.join(REPO, "tests", "clip", "fixtures", "openai_vit.pt")))


test_clip_torchscript, test_clip_torchscript_slow = both_tiers(
    st.one_of(mutated("TORCHSCRIPT"), zip_members_mutated("TORCHSCRIPT"), zip_pickle_classes_swapped("TORCHSCRIPT")),
    examples=10, slow_examples=200)(_clip_reader("ViT-B-32.pt"))


def _patched_data_pkl(old: bytes, new: bytes) -> bytes:
  members = zip_members(BASES["PTH_ZIP"])
  k = next(i for i, (n, _) in enumerate(members) if n.endswith("data.pkl"))
  assert old in members[k][1]
  members[k] = (members[k][0], members[k][1].replace(old, new, 1))
  return rezipped(members)


# embed.weight of the newfc fixture: offset 0, size (16, 14), stride (14, 1), as its pickle has them.
_EMBED = b"K\x00K\x10K\x0e\x86q\tK\x0eK\x01\x86"


@pytest.mark.parametrize("new, expected", [
    # A negative stride or offset: as_strided read memory before the storage (a segfault).
    (b"K\x00K\x10K\x0e\x86q\tJ\x00\x00\xf0\xffK\x01\x86", "expected non-negative ones"),
    (b"J\x00\x00\xf0\xffK\x10K\x0e\x86q\tK\x0eK\x01\x86", "expected non-negative ones"),
    # Zero strides over a 224-element storage: a [65536, 65536] copy (16 GiB written).
    (b"K\x00J\x00\x00\x01\x00J\x00\x00\x01\x00\x86q\tK\x00K\x00\x86", "repeats them"),
], ids=["negative_stride_segfault", "negative_offset_segfault", "zero_stride_16gib"])
def test_torch_tensor_views_outside_their_storage_are_refused(new, expected):
  with scratch() as folder:
    path = written(folder, "model.pth", _patched_data_pkl(_EMBED, new))
    with pytest.raises(BadInput, match=expected) as e:
      torch_files.read(path, "a state_dict")
    assert first_line(e.value).startswith(path)


# ============================================================================ (b) pickled infos, vocabularies
from jaxcap.importers import self_critical as sc  # noqa: E402
from jaxcap.papers.m2 import importer as m2_importer  # noqa: E402

base("INFOS", read_bytes(os.path.join(SC, "newfc", "infos_newfc.pkl")))  # its train.py's pickle_dump
base("M2_VOCAB", read_bytes(os.path.join(M2, "vocab.pkl")))  # their torchtext-style Vocab
NEWFC_STATE = sc.read_state_dict(os.path.join(SC, "newfc", "model.safetensors"))

# Wrong-typed Python values for an infos field (what another version's or a hand-made pickle holds).
WEIRD_PY = st.sampled_from([None, True, "", "x", "12", -1, 0, 10**30, 1.5, math.nan, math.inf, [],
                            {}, [1, 2], b"\xff", np.int64(7), np.float64(math.nan), "transformer",
                            "att2in2", "aoa", "updown", {"1": "a"}, {1: None}]).map(copy.deepcopy)


@st.composite
def infos_mutated(draw) -> bytes:
  """The infos dict with fields of ``opt``, ``vocab`` or the top level replaced, removed or
  wrongly typed, pickled again as self-critical's ``pickle_dump`` does (protocol 2)."""
  infos = sc.read_infos(os.path.join(SC, "newfc", "infos_newfc.pkl"))
  opt, vocab = infos["opt"], dict(infos["vocab"])
  for _ in range(draw(st.integers(1, 3))):
    where = draw(st.sampled_from(("opt", "opt", "opt", "vocab", "top")))
    if where == "opt":
      key = draw(st.sampled_from(sorted(vars(opt))))
      if draw(st.integers(0, 4)) == 0:
        delattr(opt, key)
      else:
        setattr(opt, key, draw(WEIRD_PY))
    elif where == "vocab":
      key = draw(st.sampled_from(sorted(vocab) + ["0", "x", "99", ""]))
      if draw(st.booleans()) and key in vocab:
        del vocab[key]
      else:
        vocab[key] = draw(st.one_of(WEIRD_PY, st.sampled_from(["UNK", "<pad>", "a", "man"])))
    else:
      key = draw(st.sampled_from(("iter", "epoch", "vocab", "opt", "best_val_score")))
      if draw(st.integers(0, 3)) == 0:
        infos.pop(key, None)
      else:
        infos[key] = draw(WEIRD_PY)
      if key == "vocab" and draw(st.booleans()):  # older runs: the vocabulary in opt
        opt.vocab = vocab
  if isinstance(infos.get("vocab"), dict):
    infos["vocab"] = vocab
  return mutant(pickle.dumps(infos, protocol=2), "INFOS")


def infos_pickle(vocab_in_opt: bool = False, **opt) -> bytes:
  """The fixture's infos pickled again with ``opt`` fields set (a regression example)."""
  infos = sc.read_infos(os.path.join(SC, "newfc", "infos_newfc.pkl"))
  for k, v in opt.items():
    setattr(infos["opt"], k, v)
  if vocab_in_opt:  # older self-critical runs: no top-level 'vocab', opt.vocab instead
    infos["opt"].vocab = infos.pop("vocab")
  return pickle.dumps(infos, protocol=2)


def _infos_read(data: bytes):
  """read_infos, then what import_checkpoint derives from it before building the model."""
  with scratch() as folder:
    path = written(folder, "infos_newfc.pkl", data)

    def call():
      infos = sc.read_infos(path)
      fields, vocab, _, _ = sc.convert(NEWFC_STATE, infos, "model.safetensors")
      config = sc.run_config(fields, infos["opt"], os.path.join(folder, "vocab.json"))
      return sc.run_info(infos["opt"], vocab, config)

    holds(call, folder, (path, "infos", "model.safetensors"))


def _m2_vocab_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "vocab.pkl", data)

    def call():
      itos = m2_importer.read_vocab(path)
      return m2_importer.vocabulary(itos)

    holds(call, folder, (path, "vocab"))


test_infos_bytes, test_infos_bytes_slow = both_tiers(
    st.one_of(mutated("INFOS"), pickle_classes_swapped("INFOS")), regressions=[
        splice("INFOS", 137, 3513, b"\x10"),  # a string's length read as 256 MiB, allocated first
    ])(_infos_read)
test_infos_fields, test_infos_fields_slow = both_tiers(infos_mutated(), regressions=[
    infos_pickle(vocab_in_opt=True),  # read_infos took opt.vocab, convert read infos["vocab"]: KeyError
    infos_pickle(att_feat_size=None),  # int(None) in run_info: TypeError
    infos_pickle(rnn_size="x"),  # int("x") in newfc_fields: ValueError
    infos_pickle(input_encoding_size=math.inf),  # int(inf): OverflowError
])(_infos_read)
test_m2_vocab, test_m2_vocab_slow = both_tiers(
    st.one_of(mutated("M2_VOCAB"), pickle_classes_swapped("M2_VOCAB")), regressions=[
        splice("M2_VOCAB", 3, 11, b"\0" * 7 + b"\x80"),  # a FRAME of 2^63 bytes: OverflowError
        splice("M2_VOCAB", 8, 9, b"\x01"),  # a FRAME of 2^40 bytes: MemoryError
        splice("M2_VOCAB", 7, 8, b"\x01"),  # a FRAME of 4 GiB, allocated first
    ])(_m2_vocab_read)


# ============================================================================ (c) HTTP bodies, images
from PIL import Image  # noqa: E402

from jaxcap import images as images_lib  # noqa: E402
from jaxcap.serving import artefact  # noqa: E402
from jaxcap.serving import server  # noqa: E402


def _npy_bytes(x) -> bytes:
  out = io.BytesIO()
  np.save(out, x)
  return out.getvalue()


def _image_bytes(fmt: str, mode: str = "RGB", size=(24, 16), **kwargs) -> bytes:
  rng = np.random.default_rng(0)
  pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
  img = Image.fromarray(pixels, "RGB").convert(mode)
  out = io.BytesIO()
  img.save(out, fmt, **kwargs)
  return out.getvalue()


base("NPY_BODY", _npy_bytes(np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)))
base("PNG", _image_bytes("PNG"))
base("PNG_PALETTE", _image_bytes("PNG", "P"))
base("PNG_GRAY16", _image_bytes("PNG", "I;16"))
base("JPEG", _image_bytes("JPEG", quality=90))
_EXIF = Image.Exif()
_EXIF[0x0112] = 6  # orientation: rotated 90 degrees
base("JPEG_EXIF", _image_bytes("JPEG", exif=_EXIF))


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
  out, i = [], 8
  while i + 8 <= len(data):
    n = struct.unpack(">I", data[i:i + 4])[0]
    out.append((data[i + 4:i + 8], data[i + 8:i + 8 + n]))
    i += 12 + n
  return out


def png_of(chunks) -> bytes:
  """A PNG of ``(type, data)`` chunks, each with its CRC computed (what a decoder checks first)."""
  out = [b"\x89PNG\r\n\x1a\n"]
  for kind, body in chunks:
    out.append(struct.pack(">I", len(body)) + kind + body
               + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
  return b"".join(out)


@st.composite
def png_chunks_mutated(draw, name: str) -> bytes:
  """A PNG whose chunks (one drawn: IHDR's width, height, depth, colour type; IDAT's compressed
  pixels) are mutated with CRCs recomputed, so that the mutation reaches the decoder."""
  chunks = png_chunks(BASES[name])
  k = draw(st.integers(0, len(chunks) - 1))
  kind, body = chunks[k]
  if kind == b"IHDR" and draw(st.booleans()):
    w, h = draw(st.sampled_from([(100_000, 100_000), (65_535, 65_535), (1 << 31, 1), (0, 16),
                                 (1, 1 << 30), (30_000, 30_000)]))
    body = struct.pack(">II", w, h) + body[8:]
  elif kind == b"IDAT" and draw(st.booleans()):
    raw = bytearray(zlib.decompress(body))
    body = zlib.compress(draw(mutated(bytes(raw), max_ops=2)))
  else:
    body = draw(mutated(body, max_ops=2))
  chunks[k] = (kind, body)
  return mutant(png_of(chunks), name)


IMAGE_MUTANTS = st.one_of(
    mutated("PNG"), mutated("JPEG"), mutated("JPEG_EXIF"), mutated("PNG_PALETTE"),
    png_chunks_mutated("PNG"), png_chunks_mutated("PNG_GRAY16"), png_chunks_mutated("PNG_PALETTE"))


def _body(call):
  started = time.perf_counter()
  tracemalloc.start()
  try:
    return call()
  except server.BadRequest as e:
    assert 400 <= e.status < 500 and "\n" not in str(e).strip(), (e.status, str(e))
    return None
  finally:
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.perf_counter() - started < TIME_BOUND_S
    assert peak < MEMORY_BOUND, f"the reader allocated {peak / 2**20:.0f} MiB at its peak"


def _read_npy(data: bytes):
  x = _body(lambda: server.read_npy(data))
  if x is not None:
    assert isinstance(x, np.ndarray) and x.dtype == np.float32


def _decode_image(data: bytes):
  x = _body(lambda: server.decode_image(data))
  if x is not None:
    assert x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3


def _read_image(data: bytes):
  """An image file as the exported captioner, evaluate.py --images and a run from pixels read it."""
  with scratch() as folder:
    path = written(folder, "photo.png", data)
    x = holds(lambda: artefact.read_image(path, 32), folder, path)
    if x is not None:
      assert x.shape == (32, 32, 3) and x.dtype == np.uint8
    from jaxcap.data.karpathy import ImageFiles
    holds(lambda: ImageFiles([path], 32).read(0), folder, path)


test_npy_body, test_npy_body_slow = both_tiers(mutated("NPY_BODY"))(_read_npy)
test_image_body, test_image_body_slow = both_tiers(IMAGE_MUTANTS)(_decode_image)
test_image_file, test_image_file_slow = both_tiers(IMAGE_MUTANTS)(_read_image)


# A request's query string, as aiohttp hands it over (text values): the decoding settings.
QUERY_TEXT = st.one_of(
    st.text(max_size=12), st.sampled_from(["greedy", "beam", "sample", "3", "0", "-1", "+2", " 4 ", "3_0",
                                           "1e3", "٣", "\x00", "2147483648", "9" * 5000, "nan", ""]),
    st.integers(-2 ** 70, 2 ** 70).map(str))
QUERIES = st.dictionaries(st.sampled_from(["method", "beam_size", "samples", "seed", "example", "x"]),
                          QUERY_TEXT, max_size=5)


def _query(query: dict):
  """A Settings within the server's bounds, or a 4xx line."""
  got = _body(lambda: server.settings_from(query, {"method": "greedy", "beam_size": 3}))
  if got is not None:
    assert got.method in server.METHODS and 1 <= got.beam_size <= server.MAX_BEAM
    assert 1 <= got.samples <= server.MAX_SAMPLES and (got.seed is None or 0 <= got.seed < 2 ** 31)


test_query_string, test_query_string_slow = both_tiers(QUERIES, examples=50)(_query)


def _huge_png(width: int, height: int) -> bytes:
  """A valid PNG header declaring ``width x height`` pixels, with a few bytes of pixels."""
  chunks = png_chunks(BASES["PNG"])
  ihdr = struct.pack(">II", width, height) + chunks[0][1][8:]
  return png_of([(b"IHDR", ihdr)] + [c for c in chunks[1:]])


def _huge_jpeg(width: int, height: int) -> bytes:
  data = bytearray(BASES["JPEG"])
  i = data.index(b"\xff\xc0")  # SOF0: length, precision, height, width
  data[i + 5:i + 9] = struct.pack(">HH", height, width)
  return bytes(data)


HUGE_IMAGES = [(_huge_png, 100_000, 100_000), (_huge_png, 10_000, 10_000), (_huge_jpeg, 65_535, 65_535),
               (_huge_jpeg, 12_000, 9_000)]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("make, width, height", HUGE_IMAGES,
                         ids=["png_100000x100000", "png_10000x10000", "jpeg_65535x65535", "jpeg_12000x9000"])
def test_an_image_declaring_a_huge_size_is_refused_before_its_pixels_are(make, width, height):
  """Refused from the header, in well under a second, whatever Pillow's own limit
  (``Image.MAX_IMAGE_PIXELS``: a warning up to twice it)."""
  data = make(width, height)
  with scratch() as folder:
    path = written(folder, "huge.png", data)
    for call, names in ((lambda: images_lib.read_image(path, 32), path),
                        (lambda: images_lib.read_image(path, images_lib.NATIVE), path),
                        (lambda: artefact.read_image(path, 32), path)):
      started = time.perf_counter()
      with pytest.raises(BadInput) as e:
        call()
      line = first_line(e.value)
      assert line.startswith(names) and "expected an image of at most" in line, line
      assert time.perf_counter() - started < 2
    with pytest.raises(server.BadRequest) as e:
      server.decode_image(data)
    assert e.value.status == 413 and "expected an image of at most" in str(e.value)


def _npy_header(header: str, body: bytes = b"\0" * 64) -> bytes:
  text = header.encode("latin1")
  text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
  return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


@pytest.mark.parametrize("data, expected", [
    # A header declaring 10^5 x 10^5 floats in a 64-byte body: np.load allocated 37 GiB first.
    (_npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }"), "declares"),
    # A header length cut to 1 byte: numpy's Python 2 header filter raised tokenize.TokenError (a 500).
    (splice("NPY_BODY", 9, 10, b"\x01"), "could not be read"),
    # ... and IndentationError (a SyntaxError) for lines indented unevenly.
    (_npy_header("x\n  y\n z"), "could not be read"),
], ids=["shape_37gib", "header_length_token_error", "header_indentation_error"])
def test_npy_body_regressions(data, expected):
  with pytest.raises(server.BadRequest, match=expected) as e:
    server.read_npy(data)
  assert e.value.status == 400 and "\n" not in str(e.value)


# ============================================================================ (d) feature files, (e) Karpathy JSON
from jaxcap import data as data_lib  # noqa: E402
from jaxcap.data import karpathy  # noqa: E402
from tests.data import fakes  # noqa: E402

# One Karpathy layout per feature format, written once by tests/data/fakes.py (np.savez_compressed
# / np.save, the self-critical layout); every example copies it and mutates one file.
_LAYOUTS = tempfile.mkdtemp(prefix="jaxcap-fuzz-layouts-")
atexit.register(shutil.rmtree, _LAYOUTS, True)
for _ext in (".npz", ".npy"):
  fakes.write_karpathy(os.path.join(_LAYOUTS, _ext[1:]), counts=(2, 1, 1), att_ext=_ext)
KARPATHY_FILES = {"ATT_NPZ": ("npz", "att/100.npz"), "ATT_NPY": ("npy", "att/100.npy"),
                  "FC_NPY": ("npz", "fc/100.npy"), "BOX_NPY": ("npz", "box/100.npy"),
                  "KARPATHY_JSON": ("npz", "dataset_coco.json")}
for _name, (_layout, _rel) in KARPATHY_FILES.items():
  base(_name, read_bytes(os.path.join(_LAYOUTS, _layout, _rel)))


def _read_layout(name: str, data: bytes, features: bool = True):
  """The layout with base ``name``'s file replaced by ``data``, read as train.py / evaluate.py
  read it: the dataset (JSON, vocabulary, the features' probe), then every image of every
  split, and the headers the check before training reads."""
  layout, rel = KARPATHY_FILES[name]
  with scratch() as folder:
    root = os.path.join(folder, layout)
    shutil.copytree(os.path.join(_LAYOUTS, layout), root)
    path = written(root, rel, data)

    def call():
      ds = data_lib.get_dataset(fakes.karpathy_config(root))
      for split in ds.splits:
        source = ds.split(split)
        for i in range(len(source)):
          ex = source[i]
          assert ex["feats"].dtype == np.float32 and np.isfinite(ex["feats"]).all()
          assert np.isfinite(ex["boxes"]).all() and np.isfinite(ex["global_feat"]).all()
          source.data.features.header(i)
      return ds

    # The first line names the file, or another of the layout's when the damage makes a sound
    # file disagree with it (its feature width); karpathy.image_key's line names no file.
    holds(call, folder, (path, root, "karpathy:"))


def _feature_file(name: str):
  def check(data: bytes):
    _read_layout(name, data)
  check.__name__ = f"_read_{name.lower()}"
  return check


# A .npy whose header declares 40000 x 40000 floats (6.4 GB) in a few bytes: np.load allocated
# them before reading (the kernel lends the pages; tracemalloc sees the 6 GiB).
NPY_6GB = _npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (40000, 40000), }")

test_features_npz, test_features_npz_slow = both_tiers(
    st.one_of(mutated("ATT_NPZ"), zip_members_mutated("ATT_NPZ")), examples=20, regressions=[
        rezipped([("feat.npy", b"")]),  # numpy returned the member's bytes: AttributeError 'ndim'
        rezipped([("feat.npy", NPY_6GB)]),  # np.load's 6 GiB
    ])(_feature_file("ATT_NPZ"))
test_features_npy, test_features_npy_slow = both_tiers(mutated("ATT_NPY"), examples=20, regressions=[
    NPY_6GB,  # np.load's 6 GiB
])(_feature_file("ATT_NPY"))
test_features_fc, test_features_fc_slow = both_tiers(mutated("FC_NPY"), examples=20, regressions=[
    splice("FC_NPY", 6, 7, b"\x00"),  # version 0.1: its 4-byte header length read as 632 MiB (npy_header)
])(_feature_file("FC_NPY"))
test_features_box, test_features_box_slow = both_tiers(mutated("BOX_NPY"), examples=20)(_feature_file("BOX_NPY"))
def karpathy_with(**first_image) -> bytes:
  """The Karpathy JSON with fields of its first image replaced (``images=...``: the list)."""
  data = json.loads(BASES["KARPATHY_JSON"])
  if "images" in first_image:
    data["images"] = first_image.pop("images")
  else:
    data["images"][0].update(first_image)
  return json_text(data)


test_karpathy_json, test_karpathy_json_slow = both_tiers(json_fuzzed("KARPATHY_JSON"), regressions=[
    karpathy_with(cocoid=math.inf),  # image_key's int(inf): OverflowError
    karpathy_with(cocoid=math.nan),  # int(nan): ValueError
    karpathy_with(cocoid=None),  # int(None): TypeError
    karpathy_with(images=None),  # kept_images iterated None: TypeError
    karpathy_with(images=["x"]),  # entry.get on a str: AttributeError
    karpathy_with(width="x"),  # add_image's float("x"): ValueError
])(_feature_file("KARPATHY_JSON"))


# ---------------------------------------------------------------------------- captions files
def _captions_read(data: bytes):
  """jaxcap-extract --captions: Karpathy's JSON first, then the other captions formats."""
  with scratch() as folder:
    path = written(folder, "dataset_coco.json", data)

    def call():
      karpathy.read_karpathy_captions(path)
      return karpathy.read_captions_and_splits(path)

    holds(call, folder, (path, "karpathy:"))


base("CAPTIONS_LIST", json.dumps([{"image": f"{k}.jpg", "caption": f"a dog number {k}", "split": s}
                                  for k, s in enumerate(("train", "train", "val", "test"))]).encode())
test_captions_files, test_captions_files_slow = both_tiers(
    st.one_of(json_fuzzed("KARPATHY_JSON"), json_fuzzed("CAPTIONS_LIST")))(_captions_read)


# ============================================================================ (e) scores, predictions, COCO, vocab, run files
from jaxcap import atomic, run_dir  # noqa: E402
from jaxcap.data.vocab import Vocab  # noqa: E402
from jaxcap.evaluation import compare as compare_lib  # noqa: E402
from jaxcap.evaluation import files as eval_files  # noqa: E402
from jaxcap.evaluation import signature  # noqa: E402


def _written_by(write, name: str) -> bytes:
  """The bytes a jaxcap writer ``write(path)`` leaves."""
  with scratch() as folder:
    path = os.path.join(folder, name)
    write(path)
    return read_bytes(path)


_PREDS = {391895: "a man riding a bike", 522418: "a woman with a cake", 184613: "a dog on grass"}
_SCORES = {"overall": {"Bleu_4": 0.31, "CIDEr": 1.02, "SPICE": math.nan},
           "per_image": {i: {"Bleu_4": 0.1 * k, "CIDEr": 0.5 * k, "SPICE": 0.2}
                         for k, i in enumerate(_PREDS, 1)},
           "signature": signature.build(metrics=signature.metrics_part("ptb", ["Bleu", "CIDEr", "SPICE"]),
                                        split="test", num_images=3, step=40,
                                        decode={"method": "beam", "beam_size": 3, "max_len": 16})}
# As run_dir.write_scores writes them (predictions_test.json, scores_test.json).
base("PREDICTIONS", _written_by(lambda p: atomic.write_json(
    p, [{"image_id": k, "caption": v} for k, v in _PREDS.items()]), "predictions_test.json"))
base("SCORES", _written_by(lambda p: atomic.write_json(p, eval_files.scores_json(_SCORES)), "scores_test.json"))
# COCO's own annotation layout (captions_val2014.json): images, annotations with ids.
base("COCO_ANNOTATIONS", json.dumps({
    "info": {"description": "COCO 2014"}, "images": [{"id": i, "file_name": f"{i}.jpg"} for i in _PREDS],
    "annotations": [{"image_id": i, "id": 10 * i + j, "caption": f"{c} {j}"}
                    for i, c in _PREDS.items() for j in range(2)]}).encode())
base("VOCAB", _written_by(lambda p: Vocab(["a", "man", "dog", "riding"]).save(p), "vocab.json"))


def _scores_read(data: bytes):
  """jaxcap-compare of a run's scores file and the damaged one: load, then compare (signatures
  included) and its table."""
  with scratch() as folder:
    good = written(folder, "scores_a.json", BASES["SCORES"])
    path = written(folder, "scores_test.json", data)

    def call():
      sa, pa = compare_lib.load(good)
      sb, pb = compare_lib.load(path)
      result = compare_lib.compare(sa, sb, names=(pa, pb), resamples=20, intersection=True,
                                   configs=(compare_lib.run_config(pa), compare_lib.run_config(pb)))
      compare_lib.format_comparison(result)
      return result

    holds(call, folder, (path,))


def _references_and_predictions(which: str):
  def check(data: bytes):
    with scratch() as folder:
      refs = written(folder, "captions_test.json", BASES["COCO_ANNOTATIONS"])
      preds = written(folder, "predictions_test.json", BASES["PREDICTIONS"])
      path = written(folder, os.path.basename({"refs": refs, "preds": preds}[which]), data)

      def call():  # what evaluate.py --predictions --references reads before scoring
        references = eval_files.load_coco_references(refs)
        return eval_files.load_predictions(preds, references)

      holds(call, folder, (path,))
  check.__name__ = f"_read_{which}"
  return check


def _vocab_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "vocab.json", data)
    vocab = holds(lambda: Vocab.load(path), folder, (path,))
    if vocab is not None:
      assert vocab.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
      vocab.decode(range(len(vocab) + 2))


def scores_with(signature=None, decode=None, **overall) -> bytes:
  """The scores file with ``overall`` values, its signature or the signature's decode section
  replaced (a regression example)."""
  data = json.loads(BASES["SCORES"])
  data["overall"].update(overall)
  if signature is not None:
    data["signature"] = signature
  if decode is not None:
    data["signature"]["decode"] = decode
  return json.dumps(data).encode()


test_scores_file, test_scores_file_slow = both_tiers(json_fuzzed("SCORES"), regressions=[
    scores_with(Bleu_4=[]),  # compare's float(overall value): TypeError
    scores_with(CIDEr=""),  # ... ValueError
    scores_with(signature=True),  # signature.differences: AttributeError 'bool' has no 'get'
    scores_with(decode="beam"),  # signature.decode_ignored: AttributeError 'str' has no 'get'
    scores_with(decode={"method": "beam", "beam_groups": "2"}),  # '<=' of str and int: TypeError
    scores_with(decode={"method": "x", "ensemble": 3}),  # _decode_short's len(3): TypeError
])(_scores_read)
test_coco_references, test_coco_references_slow = both_tiers(json_fuzzed("COCO_ANNOTATIONS"))(
    _references_and_predictions("refs"))
test_predictions, test_predictions_slow = both_tiers(json_fuzzed("PREDICTIONS"))(
    _references_and_predictions("preds"))
test_vocab_json, test_vocab_json_slow = both_tiers(json_fuzzed("VOCAB"))(_vocab_read)


# ---------------------------------------------------------------------------- a run's config.json, info.json
def _run_config():
  from jaxcap import config_files
  config_files.ensure_configs_importable()
  from jaxcap import config_common
  return config_common.base_config("coco", "transformer")


_INFO = {"feature_dim": 8, "global_dim": 6, "max_regions": 4, "max_len": 16, "vocab_size": 20,
         "src_vocab_size": 0, "num_attributes": 0, "grid": False, "seq_per_img": 5,
         "max_attributes": 0, "src_max_len": 0}
base("CONFIG_JSON", _written_by(lambda p: atomic.write_json(p, run_dir.saved_config_dict(_run_config())),
                                "config.json"))
base("INFO_JSON", _written_by(lambda p: run_dir.save_info(os.path.dirname(p), _INFO), "info.json"))


def _run_files(which: str):
  def check(data: bytes):
    with scratch() as workdir:
      written(workdir, "config.json", BASES["CONFIG_JSON"])
      written(workdir, "info.json", BASES["INFO_JSON"])
      written(workdir, "vocab.json", BASES["VOCAB"])
      path = written(workdir, f"{which}.json", data)

      def call():  # what jaxcap.load / evaluate.py read of a workdir before building the model
        config = run_dir.read_config(workdir)
        info = run_dir.load_info(workdir, config)
        return config, info, run_dir.read_vocab(workdir)

      holds(call, workdir, (path,))
  check.__name__ = f"_read_{which}_json"
  return check


test_run_config_json, test_run_config_json_slow = both_tiers(json_fuzzed("CONFIG_JSON"), examples=20)(
    _run_files("config"))
test_run_info_json, test_run_info_json_slow = both_tiers(json_fuzzed("INFO_JSON"), examples=20)(
    _run_files("info"))


# ============================================================================ (f) the export artefact
# A tiny transformer run exported by jaxcap.export (tests/test_export.py's tiny_run: random
# parameters, no training). Building it compiles (about 25 s here), so its properties run in the
# slow tier only.
def _ensure_artefact() -> None:
  if "ARTEFACT" in BASES:
    return
  from tests import test_export
  run = test_export.tiny_run("transformer")
  base("ARTEFACT", _written_by(lambda p: run.export(p, platforms=("cpu",)), "captioner.jaxcap"))
  base("ARTEFACT_METADATA", dict(zip_members(BASES["ARTEFACT"]))["metadata.json"])
  BASES["ARTEFACT_FEATURES"] = test_export.features(test_export.INFO, 2)["feats"]


@st.composite
def artefact_mutants(draw) -> bytes:
  """Byte mutations of the file (its CRCs then refuse most), or one member replaced: a mutated
  params.npz or metadata.json, a metadata.json with wrong-typed values, or a program
  (``*.jaxexport``) emptied, zeroed or cut inside its flatbuffer header. Not tried: programs
  whose StableHLO bytes are damaged behind a valid CRC (a crafted file): jax reports those at
  the first caption, when it deserializes and lowers them."""
  _ensure_artefact()
  how = draw(st.sampled_from(("bytes", "member", "metadata", "program")))
  if how == "bytes":
    return draw(mutated("ARTEFACT"))
  members = zip_members(BASES["ARTEFACT"])
  if how == "member":
    name = draw(st.sampled_from(["params.npz", "metadata.json"]))
    members = [(n, draw(mutated(b)) if n == name else b) for n, b in members]
  elif how == "metadata":
    members = [(n, draw(json_mutated("ARTEFACT_METADATA")) if n == "metadata.json" else b)
               for n, b in members]
  else:
    name = draw(st.sampled_from(["greedy.jaxexport", "beam.jaxexport"]))
    cut = draw(st.sampled_from([b"", b"\0" * 64, b"\xff" * 16]) | st.integers(0, 64).map(
        lambda k: dict(members)[name][:k]))
    members = [(n, cut if n == name else b) for n, b in members]
  return mutant(rezipped(members), "ARTEFACT")


def _artefact_read(data: bytes):
  """jaxcap.serving.load, then a caption of the features the run reads (what jaxcap-serve does)."""
  from jaxcap import serving
  with scratch() as folder:
    path = written(folder, "captioner.jaxcap", data)

    def call():
      captioner = serving.load(path)
      captioner.caption(list(BASES["ARTEFACT_FEATURES"]))
      server.ArtefactBackend(captioner, path).metadata()  # what jaxcap-serve's /metadata says
      return captioner

    # caption's own lines name the features it was given ("caption: ..."): a damaged
    # metadata.json that changes the expected sizes is reported as features of the wrong size.
    holds(call, folder, (path, "caption:", "method="))


@pytest.mark.slow
@given(artefact_mutants())
@settings(_BASE, max_examples=min(80, SLOW_EXAMPLES))
def test_export_artefact_slow(data):
  _artefact_read(data)


def _artefact_with(member: str, blob) -> bytes:
  """The artefact with ``member`` replaced by ``blob`` (or by ``blob(its metadata)``)."""
  _ensure_artefact()
  if callable(blob):
    blob = json.dumps(blob(json.loads(BASES["ARTEFACT_METADATA"]))).encode()
  return rezipped([(n, blob if n == member else b) for n, b in zip_members(BASES["ARTEFACT"])])


@pytest.mark.slow
@pytest.mark.parametrize("member, blob", [
    ("greedy.jaxexport", b""),  # flatbuffers: struct.error past the end
    ("beam.jaxexport", b"\x00" * 64),  # a field that reads as absent: AttributeError on None.decode
    ("params.npz", b""),  # np.load: EOFError
    ("metadata.json", b"null"),  # metadata.get: AttributeError
    ("metadata.json", lambda m: dict(m, vocab=m["vocab"][:5] + [None])),  # caption's join: TypeError
    # caption's np.pad of the features to 2^30 regions (96 GiB): MemoryError. A version-2 program
    # takes any number of regions and a request is padded to its own (the lone damaged
    # max_regions: test_a_huge_max_regions_pads_a_request_to_its_own_regions); this claims the
    # fixed 2^30 the padding would follow, which the program's symbolic axis contradicts.
    ("metadata.json", lambda m: dict(m, inputs=dict(m["inputs"], max_regions=1 << 30, symbolic_regions=False))),
    # caption blamed its caller ("method='sample': expected one of greedy, beam") for the file's
    # decode.method; now refused when loaded, naming the file.
    ("metadata.json", lambda m: dict(m, decode=dict(m["decode"], method="sample"))),
], ids=["empty_program_struct_error", "zeroed_program_attribute_error", "empty_params_eof_error",
        "null_metadata_attribute_error", "vocab_none_type_error", "max_regions_2e30", "decode_method_sample"])
def test_export_artefact_regressions(member, blob):
  _artefact_read(_artefact_with(member, blob))
  from jaxcap import serving
  with scratch() as folder:
    path = written(folder, "captioner.jaxcap", _artefact_with(member, blob))
    with pytest.raises(BadInput) as e:
      serving.load(path)
    assert first_line(e.value).startswith(path)


@pytest.mark.slow
def test_a_huge_max_regions_pads_a_request_to_its_own_regions():
  # max_regions is the limit of a request to a version-2 file, not what it is padded to.
  _artefact_read(_artefact_with("metadata.json", lambda m: dict(m, inputs=dict(m["inputs"], max_regions=1 << 30))))
  from jaxcap import serving
  with scratch() as folder:
    path = written(folder, "captioner.jaxcap", _artefact_with(
        "metadata.json", lambda m: dict(m, inputs=dict(m["inputs"], max_regions=1 << 30))))
    features = list(BASES["ARTEFACT_FEATURES"])
    batch, n = serving.load(path).batch(features)
    assert batch["feats"].shape[1] == max(len(x) for x in features) == n


# ============================================================================ every JSON reader, the same damage
_DEEP_JSON = b"[" * 100_000 + b"]" * 100_000  # the decoder's recursion limit: RecursionError
_HUGE_INT_JSON = b'{"images": ' + b"1" * 5000 + b"}"  # int-from-text limit: ValueError, no JSONDecodeError
_NOT_UTF8_JSON = b'{"images": ["\xff\xfe"]}'


@pytest.mark.parametrize("data", [_DEEP_JSON, _HUGE_INT_JSON, _NOT_UTF8_JSON],
                         ids=["nested_100000_deep", "int_of_5000_digits", "not_utf8"])
@pytest.mark.parametrize("reader", ["karpathy", "captions", "coco", "predictions", "scores", "vocab",
                                    "config", "info"])
def test_every_json_reader_refuses_the_decoders_own_failures(reader, data):
  """json.load raises more than JSONDecodeError: RecursionError (a RuntimeError) for nesting past
  the stack, a plain ValueError for an int of over 4300 digits, UnicodeDecodeError."""
  check = {"karpathy": _feature_file("KARPATHY_JSON"), "captions": _captions_read,
           "coco": _references_and_predictions("refs"), "predictions": _references_and_predictions("preds"),
           "scores": _scores_read, "vocab": _vocab_read, "config": _run_files("config"),
           "info": _run_files("info")}[reader]
  check(data)


# ============================================================================ the region detector's checkpoints
from jaxcap.detection import weights as detector_weights  # noqa: E402

DETECTOR = os.path.join(REPO, "tests", "detection", "fixtures")
base("DETECTOR_BIN", read_bytes(os.path.join(DETECTOR, "pytorch_model.bin")))  # torch.save of its state_dict
base("DETECTOR_PKL", read_bytes(os.path.join(DETECTOR, "faster_rcnn_from_caffe_attr.pkl")))  # pickle.dump
# detectron2's DetectionCheckpointer.save of MILVLG's bua-caffe model: {"model": state_dict}
base("DETECTOR_BUA", read_bytes(os.path.join(DETECTOR, "bua_caffe", "bua-caffe-tiny.pth")))


def _detector_read(name: str):
  def check(data: bytes):
    """The reader, a bua-caffe file's conversion and the shape read off the tensors (the mapping
    onto the model is the unit tests'): arrays and a DetectorConfig, or one line naming the file."""
    with scratch() as folder:
      path = written(folder, name, data)
      holds(lambda: detector_weights.read_config(path), folder, path)
  check.__name__ = f"detector_{name.replace('.', '_').replace('-', '_')}"
  return check


test_detector_bin, test_detector_bin_slow = both_tiers(
    st.one_of(mutated("DETECTOR_BIN"), zip_members_mutated("DETECTOR_BIN"), zip_pickle_classes_swapped("DETECTOR_BIN")),
    examples=10)(_detector_read("pytorch_model.bin"))
test_detector_pkl, test_detector_pkl_slow = both_tiers(
    st.one_of(mutated("DETECTOR_PKL"), pickle_classes_swapped("DETECTOR_PKL")), examples=10)(
        _detector_read("faster_rcnn_from_caffe_attr.pkl"))
test_detector_bua, test_detector_bua_slow = both_tiers(
    st.one_of(mutated("DETECTOR_BUA"), zip_members_mutated("DETECTOR_BUA"), zip_pickle_classes_swapped("DETECTOR_BUA")),
    examples=10)(_detector_read("bua-caffe-frcn-r101.pth"))


# ============================================================================ Multi30k's text files
import gzip  # noqa: E402

from jaxcap.data import multi30k  # noqa: E402

# Sentences as the WMT16 task-1 files hold them (UTF-8, one per line, "\n" ends), plain and as
# gzip (the distributed train.en.gz), written by Python's own gzip.
_M30K = "Zwei junge Männer stehen draußen.\nA man in an orange hat @@ starring at something.\n\u00e9t\u00e9\r\n"
base("M30K_TXT", _M30K.encode("utf-8"))
base("M30K_GZ", gzip.compress(_M30K.encode("utf-8"), mtime=0))


def _multi30k_read(name: str):
  def check(data: bytes):
    with scratch() as folder:
      path = written(folder, name, data)
      lines = holds(lambda: multi30k.read_lines(path), folder, path)
      if lines is not None:
        assert all(isinstance(l, str) and "\n" not in l for l in lines)
  check.__name__ = f"multi30k_{name.replace('.', '_')}"
  return check


test_multi30k_text, test_multi30k_text_slow = both_tiers(mutated("M30K_TXT"), examples=20)(_multi30k_read("train.de"))
test_multi30k_gzip, test_multi30k_gzip_slow = both_tiers(mutated("M30K_GZ"), examples=20, regressions=[
    splice("M30K_GZ", 9, 11, b"\x00~"),  # a deflate block of an invalid type: zlib.error escaped
])(_multi30k_read("train.de.gz"))


# ============================================================================ config argument strings
# What a user types after a config file and as its overrides: ``--config=configs/<file>.py:<arg>``
# (``dataset,key=value,tiny``) and ``--config.<field>=<value>``. cli.check_command_line reads them
# before anything runs (train.py, evaluate.py, every absl program); its invariant is the readers':
# None, or one BadInput line naming the argument, field or flag, quickly, writing nothing.
from jaxcap import cli, config_files  # noqa: E402

_CONFIG_FILES = ("transformer.py", "aoanet.py", "image_transformer.py", "m2.py")
_CONFIG_WORDS = ("synthetic", "flickr8k", "coco", "cocotalk", "multi30k", "tiny", "size=small", "size=paper",
                 "size=", "=small", "size=small=1", "variant=stacked_v", "dataset=coco", "steps=4", "", " ",
                 "synthetic synthetic", "tiny=1", "nan", "1e999", "\x00", "é", "coco,", ",,")
_VALUES = st.one_of(st.text(max_size=10), st.sampled_from(
    ["0", "-1", "1e309", "nan", "inf", "true", "True", "yes", "2147483648", "9" * 5000, "", "none", "None",
     "[1, 2]", "{}", "1_000", "0x10", "\x00", "\u0663", "1.5"]))


@st.composite
def command_lines(draw) -> list[str]:
  file = draw(st.sampled_from(_CONFIG_FILES))
  arg = ",".join(draw(st.lists(st.sampled_from(_CONFIG_WORDS) | st.text(max_size=8), max_size=4)))
  argv = ["train.py", f"--config=configs/{file}:{arg}" if draw(st.booleans()) else f"--config=configs/{file}"]
  fields = _config_fields(file)
  for _ in range(draw(st.integers(0, 3))):
    path = draw(st.sampled_from(fields) | st.sampled_from(fields).map(lambda p: p + ".x")
                | st.sampled_from(fields).map(lambda p: p.rpartition(".")[0] or p) | st.text(max_size=8))
    how = draw(st.sampled_from(("=", " ", "none")))
    if how == "=":
      argv.append(f"--config.{path}={draw(_VALUES)}")
    elif how == " ":
      argv += [f"--config.{path}", draw(_VALUES)]
    else:
      argv.append(f"--noconfig.{path}")
  if draw(st.booleans()):  # a second --config, or one given after its overrides
    argv.append(f"--config=configs/{draw(st.sampled_from(_CONFIG_FILES))}")
  return argv


_FIELDS: dict = {}


def _config_fields(file: str) -> list[str]:
  if file not in _FIELDS:
    config = config_files.load(f"configs/{file}:synthetic")
    _FIELDS[file] = [line.split(" = ")[0] for line in cli._dotted(config)]
  return _FIELDS[file]


def _command_line(argv: list[str]):
  with scratch() as folder:
    holds(lambda: cli.check_command_line(argv, {"config": "configs/transformer.py:synthetic"}), folder,
          ("config", "--"))


test_config_command_line, test_config_command_line_slow = both_tiers(command_lines(), examples=40)(_command_line)


# ============================================================================ the server's multipart bodies
# POST /caption with a multipart form (the page's upload, curl -F): the body as aiohttp's own
# MultipartWriter writes it (what aiohttp's client sends; browsers write the same layout), its
# bytes and its Content-Type's boundary mutated. The server's reader (server._read_body, under the
# server's own error middleware) answers the kind and size of the form's file or a one-line 4xx
# JSON error; a 500 is a bug.
import asyncio  # noqa: E402

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

_MAX_BODY = 8192


class _Sink:
  def __init__(self):
    self.data = bytearray()

  async def write(self, chunk):
    self.data += chunk


def _multipart_written() -> tuple[bytes, str]:
  async def main():
    with aiohttp.MultipartWriter("form-data", boundary="jaxcapFuzzBoundary7MA4YWxk") as writer:
      part = writer.append(BASES["PNG"], {"Content-Type": "image/png"})
      part.set_content_disposition("form-data", name="image", filename="photo.png")
      text = writer.append("greedy")
      text.set_content_disposition("form-data", name="method")
      sink = _Sink()
      await writer.write(sink)
      return bytes(sink.data), writer.headers["Content-Type"]
  return asyncio.run(main())


_MULTIPART, _MULTIPART_TYPE = _multipart_written()
base("MULTIPART", _MULTIPART)


async def _echo_body(request):
  kind, data = await server._read_body(request)
  return web.json_response({"kind": kind, "bytes": len(data)})


def _posted(body: bytes, content_type: str) -> tuple[int, str]:
  """``(status, text)`` of POST /caption with ``body``, answered by the server's body reader."""
  async def main():
    app = web.Application(client_max_size=_MAX_BODY, middlewares=[server._errors])
    app[server.MAX_BODY] = _MAX_BODY
    app.router.add_post("/caption", _echo_body)
    async with TestClient(TestServer(app)) as client:
      r = await client.post("/caption", data=body, headers={"Content-Type": content_type})
      return r.status, await r.text()
  # aiohttp warns of a damaged Content-Disposition, quoting its undecodable bytes as surrogates:
  # pytest-xdist's worker then cannot send the test's report (execnet's DumpError) and dies.
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return asyncio.run(main())


def _post_multipart(body: bytes, content_type: str):
  started = time.perf_counter()
  status, text = _posted(body, content_type)
  assert time.perf_counter() - started < TIME_BOUND_S
  answer = json.loads(text)
  if status == 200:
    assert answer["kind"] in ("image", "npy") and 0 <= answer["bytes"] <= len(body), answer
  else:
    assert 400 <= status < 500 and set(answer) == {"error"} and "\n" not in answer["error"], (status, text)


_BOUNDARIES = st.sampled_from([
    _MULTIPART_TYPE, "multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=x",
    'multipart/form-data; boundary="jaxcapFuzzBoundary7MA4YWxk"', "multipart/mixed; boundary=jaxcapFuzzBoundary7MA4YWxk",
    "multipart/form-data; boundary=" + "b" * 200, "multipart/form-data; boundary=jaxcapFuzzBoundary7MA4YWxk; x=y",
    "multipart/form-data; boundary=jaxcapFuzzBoundary7MA4YWxk; boundary=other"])
# (control characters in the header itself: aiohttp's client refuses to send them, its server's
# HTTP parser refuses them as a 400 before a handler runs)


@st.composite
def multipart_requests(draw):
  return draw(mutated("MULTIPART") | st.just(_MULTIPART)), draw(_BOUNDARIES)


def _multipart(request):
  _post_multipart(*request)


test_multipart_body, test_multipart_body_slow = both_tiers(multipart_requests(), examples=30)(_multipart)


def test_the_multipart_fixture_reads_as_its_image():
  status, text = _posted(_MULTIPART, _MULTIPART_TYPE)
  assert status == 200 and json.loads(text) == {"kind": "image", "bytes": len(BASES["PNG"])}


# ============================================================================ HDF5: detections and cocotalk labels
# Both written by h5py, as their producers write them: the M² authors' coco_detections.hdf5
# (one <image_id>_features [regions, D] float32 dataset per image) and self-critical.pytorch's
# prepro_labels.py cocotalk_label.h5 (labels uint32 [captions, 16], label_start_ix / label_end_ix
# 1-based uint32 [images], label_length). 4,000 byte mutations of the detections file on this
# machine made libhdf5 refuse, never crash (so the properties run in-process).
h5py = pytest.importorskip("h5py")
from jaxcap.data import cocotalk  # noqa: E402
from jaxcap.data.karpathy import HDF5Detections  # noqa: E402


def _h5_bytes(datasets: dict) -> bytes:
  buf = io.BytesIO()
  with h5py.File(buf, "w") as f:
    for name, value in datasets.items():
      f.create_dataset(name, data=value)
  return buf.getvalue()


_rng = np.random.default_rng(0)
base("HDF5_DETECTIONS", _h5_bytes({"123_features": _rng.standard_normal((5, 8)).astype(np.float32),
                                   "456_features": _rng.standard_normal((3, 8)).astype(np.float32)}))
base("COCOTALK_H5", _h5_bytes({"labels": _rng.integers(1, 20, (4, 16)).astype(np.uint32),
                               "label_start_ix": np.asarray([1, 3], np.uint32),
                               "label_end_ix": np.asarray([2, 4], np.uint32),
                               "label_length": np.full(4, 16, np.uint32)}))


def _hdf5_detections_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "coco_detections.hdf5", data)

    def call():
      reader = HDF5Detections(["123", "456"], path)
      out = []
      for i in range(2):
        shape, dtype, _ = reader.header(i)["feats"]
        feats = reader.read(i)["feats"]
        assert feats.shape == shape and feats.dtype == dtype
        out.append(feats)
      return out

    holds(call, folder, path)


def _cocotalk_labels_read(data: bytes):
  with scratch() as folder:
    path = written(folder, "cocotalk_label.h5", data)
    got = holds(lambda: cocotalk.read_labels(path), folder, path)
    if got is not None:
      labels, start, end = got
      assert labels.ndim == 2 and start.ndim == end.ndim == 1


test_hdf5_detections, test_hdf5_detections_slow = both_tiers(mutated("HDF5_DETECTIONS"))(_hdf5_detections_read)
test_cocotalk_labels, test_cocotalk_labels_slow = both_tiers(mutated("COCOTALK_H5"))(_cocotalk_labels_read)


def test_an_hdf5_dataset_declaring_a_huge_size_is_refused_before_it_is_read():
  with scratch() as folder:
    path = os.path.join(folder, "coco_detections.hdf5")
    with h5py.File(path, "w") as f:  # declared, never written: HDF5 stores no bytes for it
      f.create_dataset("123_features", shape=(1 << 20, 2048), dtype=np.float32)
    assert holds(lambda: HDF5Detections(["123"], path).read(0), folder, path) is None  # within the bounds
    with pytest.raises(BadInput, match="at most"):
      HDF5Detections(["123"], path).read(0)


# ============================================================================ a TFDS build
# The folder jaxcap.data.tfds_builders.build writes (TFDS's own builder and array_record writer:
# dataset_info.json, features.json, metadata.json with jaxcap's texts, one array_record shard per
# split), one file damaged at a time (the JSON files also structurally); the reader is what a
# run does with it: the dataset, every row of every split. The build costs seconds (TFDS), so
# the property runs in the slow tier only.
import functools  # noqa: E402

tfds = pytest.importorskip("tensorflow_datasets")


@functools.lru_cache(maxsize=None)
def _tfds_build() -> tuple[str, tuple[str, ...]]:
  from jaxcap.data import tfds_builders  # noqa: PLC0415
  from tests.data import fakes  # noqa: PLC0415
  folder = tempfile.mkdtemp(prefix="jaxcap-fuzz-tfds-")
  atexit.register(shutil.rmtree, folder, True)
  out = tfds_builders.build(fakes.synthetic_config(num_train=8, num_val=4, num_test=4), folder)
  names = tuple(sorted(os.listdir(out)))
  for name in names:
    base(f"TFDS/{name}", read_bytes(os.path.join(out, name)))
  return out, names


@st.composite
def tfds_damaged(draw) -> tuple[str, bytes]:
  _, names = _tfds_build()
  name = draw(st.sampled_from(names))
  if name.endswith(".json") and draw(st.booleans()):
    return name, draw(json_mutated(f"TFDS/{name}"))
  return name, draw(mutated(f"TFDS/{name}"))


def _tfds_read(damage):
  from jaxcap import data as data_lib  # noqa: PLC0415
  from tests.data import fakes  # noqa: PLC0415
  name, blob = damage
  built, _ = _tfds_build()
  with scratch() as folder:
    path = os.path.join(folder, "build")
    shutil.copytree(built, path)
    written(path, name, blob)
    config = fakes.synthetic_config(num_train=8, num_val=4, num_test=4)
    config.format, config.tfds_dir = "tfds", path

    def call():
      ds = data_lib.get_dataset(config)
      for split in ("train", "val", "test"):
        rows = ds.split_data(split)
        for i in range(len(rows.image_ids)):
          rows.features.read(i)
      return ds

    holds(call, folder, path)


@pytest.mark.slow
def test_tfds_build_slow():
  _tfds_build()  # before Hypothesis draws: TFDS's build uses the random module

  @given(tfds_damaged())
  @settings(_BASE, max_examples=min(100, SLOW_EXAMPLES))
  def damaged(damage):
    _tfds_read(damage)

  damaged()
