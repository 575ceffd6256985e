"""The one config validator (jaxcap.models.fields): a model's fields are its config schema."""

import jax.numpy as jnp
import ml_collections
import pytest

from jaxcap import config_files
from jaxcap.models import fields, registry
from jaxcap.models.transformer import TransformerCaptioner

INFO = {"vocab_size": 30, "max_len": 12, "feature_dim": 8, "global_dim": 11, "src_vocab_size": 20}


def build(name, **cfg):
  return registry.build(ml_collections.ConfigDict({"name": name, **cfg}), INFO)


def test_defaults_and_data_fields_fill_what_the_config_leaves_out():
  m = build("transformer", dim=64, num_heads=4)
  assert isinstance(m, TransformerCaptioner)
  assert (m.dim, m.num_heads, m.num_layers, m.ff_dim, m.dropout) == (64, 4, 6, 2048, 0.1)
  assert (m.vocab_size, m.max_len) == (30, 12)
  assert build("tpgn").feature_dim == 11  # the global feature's width, not the regions'
  assert build("transformer", dtype="bfloat16").dtype == jnp.bfloat16


@pytest.mark.parametrize("name,field,value,expected", [
    ("transformer", "dimm", 3, "unknown for model 'transformer'"),
    ("transformer", "dim", 0, "expected a positive int, got 0"),
    ("transformer", "dim", 64.0, "expected a positive int, got 64.0"),
    ("transformer", "dim", True, "expected a positive int, got True"),
    ("transformer", "num_layers", -1, "expected an int >= 0, got -1"),
    ("transformer", "dropout", 1.0, "expected a rate in [0, 1), got 1.0"),
    ("transformer", "share_embeddings", 1, "expected True or False, got 1"),
    ("transformer", "region_activation", "gelu", "expected one of ('relu', 'linear')"),
    ("transformer", "num_heads", 5, "5 does not divide dim=512"),
    ("transformer", "dtype", "float64", "expected 'float32' or 'bfloat16'"),
    ("transformer", "dtype", 5, "expected 'float32' or 'bfloat16'"),
    ("aat", "min_steps", 5, "min_steps <= max_steps"),
    ("image_transformer", "spatial_layers", "4", "layers among 1..3"),
    ("mnmt", "variant", "mnmt9", "model.variant"),
    ("eta", "force_gate", "x", "expected a number or None"),
])
def test_one_line_errors_name_the_field(name, field, value, expected):
  with pytest.raises(ValueError, match=r"config fields? model\.") as e:
    build(name, **{field: value})
  msg = str(e.value)
  assert expected in msg and "\n" not in msg, msg
  assert f"model.{field}" in msg


def test_int_for_a_float_field_becomes_a_float():
  m = build("transformer", dropout=0)
  assert m.dropout == 0.0 and isinstance(m.dropout, float)


def test_presets_expand_and_refuse_a_conflicting_field():
  m = build("mnmt", variant="mnmt1")
  assert (m.modalities, m.fusion, m.encoder_dependent, m.decoder_dependent) == ("both", "sum", False, False)
  assert build("mnmt", variant="nmt").modalities == "text"
  with pytest.raises(ValueError, match="model.fusion: set by model.variant='mnmt1'"):
    build("mnmt", variant="mnmt1", fusion="concat")


def test_the_registry_finds_every_model_module():
  assert set(registry.names()) >= {"transformer", "eta", "aat", "image_transformer", "aoanet",
                                   "mnmt", "tpgn", "show_tell", "lstm", "nearest_neighbour"}


# Every shipped config file (the shared ones and each paper's), but the generic base.py.
CONFIGS = [n[:-3] for n in config_files.shipped_names() if n != "base.py"]


@pytest.mark.paper_gate
def test_every_shipped_config_is_checked():
  assert {"transformer", "eta", "mnmt", "lstm"} <= set(CONFIGS)


@pytest.mark.paper_gate
@pytest.mark.parametrize("config", CONFIGS)
def test_config_files_hold_every_field_and_nothing_else(config):
  """A config's model section is the module's defaults plus what the config changes: every
  field is there (so the command line can override it), no key that the model lacks; a key
  that stands for several fields (the model's ``config_presets``: MNMT's ``variant``) excuses
  the fields it sets. On each dataset the config takes (synthetic and a real one at least)."""
  loaded = 0
  for dataset in ("synthetic", "coco", "multi30k"):
    try:
      c = config_files.load(f"{config}.py:{dataset}")
    except ValueError as e:
      assert "dataset" in str(e), e
      continue
    loaded += 1
    cls = registry.get(c.model.name)
    values = {k: v for k, v in c.model.items() if k != "name"}
    expanded = getattr(cls, "config_presets", dict)(dict(values))  # NearestNeighbour: none
    presets = set(values) - set(expanded)  # keys that stand for several fields
    set_by_presets = set(expanded) - set(values)
    schema = set(fields.schema(cls))
    keys = set(values)
    assert keys - presets <= schema, keys - presets - schema
    # Every field with a default is there; a field whose default is None (decided by the model,
    # e.g. MNMT's fusion_tanh) may be there as a typed placeholder.
    expected = set(fields.config_defaults(cls)) - set_by_presets
    assert expected <= keys - presets, expected - keys
    assert all(fields.schema(cls)[k].default is None for k in keys - presets - expected)
    registry.build(c.model, INFO)
  assert loaded >= 2, f"{config}.py loads on {loaded} of synthetic / coco / multi30k"


def test_generic_config_runs_any_model_with_its_defaults():
  c = config_files.load("base.py:synthetic,model=show_tell")
  assert c.model.to_dict() == {"name": "show_tell", "hidden_dim": 512, "embed_dim": 512, "dropout": 0.5}
  with pytest.raises(ValueError, match="unknown model 'nope'"):
    config_files.load("base.py:synthetic,model=nope")
