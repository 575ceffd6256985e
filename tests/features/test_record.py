"""The backbone's field values and a features.json record, checked before anything is built
(issue 70: a 0 patch divided by zero deep in the ViT; a record's weights without file / sha256,
its fields not an object, or att_size not a number raised AttributeError / TypeError)."""

import json

import pytest

from jaxcap.errors import BadInput
from jaxcap.features import extract, registry
from jaxcap.features import record as record_lib


@pytest.mark.parametrize("name, fields, expected", [
    ("vit_b16", {"patch": 0}, "field 'patch' = 0: expected an integer >= 1"),
    ("vit_b16", {"depth": -1}, "field 'depth' = -1: expected an integer >= 1"),
    ("vit_b16", {"dim": 8.5}, "field 'dim' = 8.5: expected an integer >= 1"),
    ("vit_b16", {"dim": True}, "field 'dim' = True: expected an integer >= 1"),
    ("vit_b16", {"dim": 10, "num_heads": 4}, "dim 10 does not split into num_heads 4"),
    ("vit_b16", {"eps": 0.0}, "field 'eps' = 0.0: expected a finite number > 0"),
    ("vit_b16", {"eps": float("nan")}, "field 'eps' = nan: expected a finite number > 0"),
    ("vit_b16", {"mean": [0.5, 0.5]}, "field 'mean' = (0.5, 0.5): expected a list of 3 finite numbers"),
    ("resnet50", {"std": [0.2, 0.0, 0.2]}, "field 'std' = (0.2, 0.0, 0.2): expected a list of 3 finite numbers"),
    ("resnet50", {"depths": [3, 0, 6, 3]}, "field 'depths' = (3, 0, 6, 3): expected a list of 4 integers >= 1"),
    ("resnet50", {"depths": "3463"}, "field 'depths' = '3463': expected a list of 4 integers >= 1"),
    ("resnet50", {"remat": 1}, "field 'remat' = 1: expected true or false"),
    ("resnet50", {"att_size": 0}, "field 'att_size' = 0: expected an integer >= 1"),
])
def test_bad_field_values_are_one_line_naming_the_flag(name, fields, expected):
  with pytest.raises(BadInput) as e:
    extract.build_backbone(name, json.dumps(fields))
  line = str(e.value)
  assert line.startswith(f"--fields: backbone {name!r}: ") and expected in line and "\n" not in line


def test_good_field_values_build():
  module = registry.build("vit_b16", patch=4, image_size=8, dim=8, depth=1, num_heads=2, mlp_dim=16,
                          eps=1e-5, mean=(0.1, 0.2, 0.3), remat=True)
  assert module.grid == 2 and module.mean == (0.1, 0.2, 0.3)
  assert registry.build("resnet50", width=4, depths=(1, 1, 1, 1), att_size=None).att_size is None


def _record(**over):
  rec = extract.make_record("resnet50", registry.build("resnet50", width=4), {"width": 4}, 64,
                            "float32", None, seed=3)
  rec.update(over)
  return rec


@pytest.mark.parametrize("over, expected", [
    ({"weights": {"file": "w.safetensors"}}, "field 'weights'"),
    ({"weights": {"file": "w.safetensors", "sha256": "abc"}}, "64 hex digits"),
    ({"weights": ["random"]}, "field 'weights'"),
    ({"weights": {"random": True, "seed": "3"}}, "N an integer >= 0"),
    ({"fields": [4]}, "field 'fields' = [4]; expected an object"),
    ({"fields": {"width": 0}}, "field 'width' = 0: expected an integer >= 1"),
    ({"fields": {"wide": 4}}, "unknown field 'wide'"),
    ({"att_size": "14"}, "field 'att_size' = '14'; expected an integer >= 1 or null"),
    ({"dtype": "float16"}, "field 'dtype' = 'float16'; expected one of float32, bfloat16"),
    ({"backbone": 50}, "field 'backbone' = 50; expected one of"),
    ({"size": -2}, "size=-2: expected an int >= 1"),
])
def test_a_damaged_features_json_is_one_line_naming_it(tmp_path, over, expected):
  path = tmp_path / "features.json"
  path.write_text(json.dumps(_record()))
  assert record_lib.read(str(path))["weights"] == {"random": True, "seed": 3}
  path.write_text(json.dumps(_record(**over)))
  with pytest.raises(BadInput) as e:
    record_lib.read(str(path))
  assert str(e.value).startswith(str(path)) and expected in str(e.value), str(e.value)
  with pytest.raises(BadInput) as e:  # a run's copy, handed to the rebuilt extractor
    record_lib.Backbone(_record(**over), where="runs/x/features.json")
  assert str(e.value).startswith("runs/x/features.json") and expected in str(e.value)
