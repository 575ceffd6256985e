"""A model's config schema is its module's dataclass fields.

``build(cls, model_config, info)`` makes the module that ``config.model`` describes:

- every key of ``config.model`` but ``name`` must be a field of the module (or one of the
  model's ``config_presets``, keys that stand for several fields, like MNMT's ``variant``);
- a field the config leaves out takes the module's default, so each default is written once,
  in the module (config files start from :func:`config_defaults` and set what their dataset or
  paper row changes);
- the dataset fills the fields it alone knows (:data:`DATA_FIELDS`);
- each value is checked against its annotation and the model's ``field_checks`` (a field name
  -> :class:`Check`), then the model's ``check_fields(values)`` (relations between fields), and
  the first violation is one ``BadInput``: ``config field model.<f>: expected ..., got ...``.

``dtype`` fields hold a compute dtype; configs name it (``"float32"`` | ``"bfloat16"`` |
``"float16"``) and :func:`build` passes the ``jnp`` dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np

from jaxcap.errors import BadInput

# Fields the dataset fills: the vocabularies, the caption length, the global feature width.
DATA_FIELDS = ("vocab_size", "max_len", "src_vocab_size", "feature_dim")
_MODULE_FIELDS = ("parent", "name")  # flax.linen.Module's own
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtype(name):
  """``"float32"`` | ``"bfloat16"`` | ``"float16"`` (or a jnp dtype) -> the jnp dtype."""
  if not isinstance(name, str):
    try:
      found = [dt for dt in DTYPES.values() if np.dtype(name) == np.dtype(dt)]
    except TypeError:
      found = []
    if found:
      return found[0]
  try:
    return DTYPES[name]
  except (KeyError, TypeError):
    raise BadInput(f"config field dtype: expected 'float32' or 'bfloat16', got {name!r}") from None


def dtype_name(dtype) -> str:
  return np.dtype(compute_dtype(dtype)).name


@dataclasses.dataclass(frozen=True)
class Check:
  """A value constraint: ``test(value)`` and what it expects, for the error message."""

  test: Callable[[Any], bool]
  expected: str


def is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_number(v) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def at_least(low: int) -> Check:
  if low == 1:
    return Check(lambda v: is_int(v) and v >= 1, "a positive int")
  return Check(lambda v: is_int(v) and v >= low, f"an int >= {low}")


POSITIVE = at_least(1)
INT = Check(is_int, "an int")
BOOL = Check(lambda v: isinstance(v, bool), "True or False")
STRING = Check(lambda v: isinstance(v, str), "a string")
NON_NEGATIVE = Check(lambda v: is_number(v) and v >= 0, "a number >= 0")
RATE = Check(lambda v: is_number(v) and 0.0 <= v < 1.0, "a rate in [0, 1)")


def finite(low: float, strict: bool = False) -> Check:
  """A finite number ``>= low`` (``> low`` when ``strict``)."""
  return Check(lambda v: is_number(v) and math.isfinite(v) and (v > low if strict else v >= low),
               f"a finite number {'>' if strict else '>='} {low:g}")


def one_of(choices) -> Check:
  choices = tuple(choices)
  return Check(lambda v: v in choices, f"one of {choices}")


def in_interval(low: float, high: float, closed_high: bool = False, what: str = "a number") -> Check:
  if closed_high:
    return Check(lambda v: is_number(v) and low < v <= high, f"{what} in ({low:g}, {high:g}]")
  return Check(lambda v: is_number(v) and low < v < high, f"{what} in ({low:g}, {high:g})")


_TYPE_CHECKS = {
    "int": Check(is_int, "an int"),
    "float": Check(is_number, "a number"),
    "bool": Check(lambda v: isinstance(v, bool), "True or False"),
    "str": Check(lambda v: isinstance(v, str), "a string"),
    "tuple": Check(lambda v: isinstance(v, (tuple, list)), "a sequence"),
    "None": Check(lambda v: v is None, "None"),
}


def _annotation_check(field: dataclasses.Field) -> Check | None:
  """The check implied by a field's annotation (``int``, ``float | None``, ...); None: any."""
  names = [n.strip() for n in str(field.type).split("|")]
  checks = [_TYPE_CHECKS[n] for n in names if n in _TYPE_CHECKS]
  if not checks or len(checks) != len(names):
    return None
  if len(checks) == 1:
    return checks[0]
  return Check(lambda v: any(c.test(v) for c in checks), " or ".join(c.expected for c in checks))


def schema(cls) -> dict[str, dataclasses.Field]:
  """The fields a config may set: the module's dataclass fields but the data's and flax's."""
  return {f.name: f for f in dataclasses.fields(cls)
          if f.init and f.name not in _MODULE_FIELDS + DATA_FIELDS}


def _default(f: dataclasses.Field):
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
    return f.default_factory()  # type: ignore[misc]
  return dataclasses.MISSING


def config_defaults(cls) -> dict:
  """``{field: default}`` for a config file's ``model`` section (dtypes by name; fields whose
  default is None, e.g. test-time switches, are left to the API)."""
  out = {}
  for name, f in schema(cls).items():
    value = _default(f)
    if value is dataclasses.MISSING or value is None:
      continue
    out[name] = dtype_name(value) if name == "dtype" else value
  return out


def data_values(cls, info: Mapping) -> dict:
  """The data fields ``cls`` has, from a dataset's ``info`` (the global feature width is
  ``global_dim`` when the data has one, else ``feature_dim``)."""
  names = {f.name for f in dataclasses.fields(cls)}
  out = {}
  if "vocab_size" in names:
    out["vocab_size"] = int(info["vocab_size"])
  if "max_len" in names and "max_len" in info:
    out["max_len"] = int(info["max_len"])
  if "src_vocab_size" in names:
    out["src_vocab_size"] = int(info.get("src_vocab_size", 0) or 0)
  if "feature_dim" in names and (info.get("global_dim") or info.get("feature_dim")):
    out["feature_dim"] = int(info.get("global_dim") or info["feature_dim"])
  return out


def _fail(field: str, expected: str, value) -> BadInput:
  return BadInput(f"config field model.{field}: expected {expected}, got {value!r}")


def validate(cls, model_config: Mapping) -> dict:
  """The checked field values (defaults filled in) of ``config.model`` for ``cls``."""
  fields = schema(cls)
  given = {k: v for k, v in dict(model_config).items() if k != "name"}
  presets = getattr(cls, "config_presets", None)
  if presets is not None:
    given = presets(given)
  unknown = sorted(set(given) - set(fields))
  if unknown:
    model = getattr(cls, "registry_name", cls.__name__)
    raise BadInput(f"config field model.{unknown[0]}: unknown for model {model!r}; expected "
                     f"one of {sorted(fields)}")
  values = {}
  checks = getattr(cls, "field_checks", {})
  for name, f in fields.items():
    value = given[name] if name in given else _default(f)
    if value is dataclasses.MISSING:
      raise BadInput(f"config field model.{name}: missing; the model has no default for it")
    if name == "dtype":
      try:
        value = compute_dtype(value)
      except BadInput:
        raise _fail(name, "'float32' or 'bfloat16'", value) from None
    else:
      for check in (_annotation_check(f), checks.get(name)):
        if check is not None and not check.test(value):
          raise _fail(name, (checks.get(name) or check).expected, value)
      if str(f.type) == "float" and is_number(value):
        value = float(value)
      elif str(f.type) == "int" and is_int(value):
        value = int(value)
    values[name] = value
  cross = getattr(cls, "check_fields", None)
  if cross is not None:
    cross(values)
  return values


def build(cls, model_config: Mapping, info: Mapping):
  """The module ``config.model`` describes, for the dataset that ``info`` describes."""
  values = validate(cls, model_config)
  values.update(data_values(cls, info))
  check_data = getattr(cls, "check_data", None)
  if check_data is not None:
    check_data(values)
  return cls(**values)


def heads_divide_dim(values: Mapping, dim: str = "dim", heads: str = "num_heads") -> None:
  if values[dim] % values[heads]:
    raise BadInput(f"config field model.{heads}: {values[heads]} does not divide "
                     f"{dim}={values[dim]}; expected a divisor of model.{dim}")
