"""The linen CLIP against the producers' own code: every weights format (fixtures written by
openai-clip, pacscore's save, open_clip and transformers: make_fixtures.py) loads tensor by
tensor and gives their image and text embeddings within 1e-5 (float32, CPU); a wrong file is one
line naming it."""

import os
import re
import shutil

import numpy as np
import pytest

from jaxcap.clip import model as model_lib
from jaxcap.clip import weights
from jaxcap.features import weights as fw

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FILES = {"openai": ("openai_vit.pt", "openai_torchscript", "quick_gelu", 2),
         "pacs": ("pacs.pth", "state_dict", "quick_gelu", 1),
         "open_clip": ("open_clip/open_clip_model.safetensors", "open_clip", "gelu", 2),
         "hf": ("hf/model.safetensors", "hf", "quick_gelu", 2)}


@pytest.fixture(scope="module")
def reference():
  return np.load(os.path.join(FIXTURES, "embeddings.npz"))


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_embeddings_equal_the_producers(name, reference):
  file, fmt, activation, heads = FILES[name]
  sizes, variables, got_fmt = weights.load(os.path.join(FIXTURES, file))
  assert (got_fmt, sizes.activation, sizes.vision_heads, sizes.transformer_heads) == (fmt, activation, heads, heads)
  model = model_lib.CLIP(sizes)
  image = model.apply(variables, reference[f"{name}_images"], method=model.encode_image)
  text = model.apply(variables, reference[f"{name}_tokens"].astype(np.int32), method=model.encode_text)
  np.testing.assert_allclose(np.asarray(image), reference[f"{name}_image"], rtol=0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(text), reference[f"{name}_text"], rtol=0, atol=1e-5)
  # The towers are not trivially equal: another activation moves the embeddings.
  other = "gelu" if activation == "quick_gelu" else "quick_gelu"
  sizes2, variables2, _ = weights.load(os.path.join(FIXTURES, file), activation=other)
  model2 = model_lib.CLIP(sizes2)
  moved = model2.apply(variables2, reference[f"{name}_tokens"].astype(np.int32), method=model2.encode_text)
  assert np.abs(np.asarray(moved) - reference[f"{name}_text"]).max() > 1e-3


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_text_pooling_reads_the_end_of_text_position(reference):
  """The pooled token is the one with the largest id: changing a token after it changes nothing,
  changing one before it changes the embedding (the causal mask)."""
  sizes, variables, _ = weights.load(os.path.join(FIXTURES, "openai_vit.pt"))
  model = model_lib.CLIP(sizes)
  tokens = reference["openai_tokens"].astype(np.int32)[:2]  # end of text at 5 and 20
  base = np.asarray(model.apply(variables, tokens, method=model.encode_text))
  after, before = tokens.copy(), tokens.copy()
  after[0, 10] = 7
  before[0, 3] = 7
  np.testing.assert_array_equal(np.asarray(model.apply(variables, after, method=model.encode_text))[0], base[0])
  assert np.abs(np.asarray(model.apply(variables, before, method=model.encode_text))[0] - base[0]).max() > 1e-4


def test_a_text_tower_without_blocks_pools_the_end_of_text_embedding():
  """With zero text blocks the pooled row is ln_final of the end-of-text position's embedding
  (token + position), not position 0's: the block loop's one-row return is not there to read."""
  import jax
  sizes = model_lib.ClipSizes(embed_dim=8, image_resolution=32, vision_layers=1, vision_width=64,
                              vision_patch_size=16, context_length=10, vocab_size=20,
                              transformer_width=16, transformer_heads=1, transformer_layers=0,
                              vision_heads=1)
  tower = model_lib.TextTower(sizes)
  tokens = np.array([[3, 19, 0, 0, 0, 0], [5, 6, 7, 8, 19, 0]], np.int32)  # end of text (19) at 1 and 4
  variables = tower.init(jax.random.PRNGKey(0), tokens)
  p = variables["params"]
  eot = tokens.argmax(-1)
  x = np.asarray(p["token_embedding"]["embedding"])[tokens[np.arange(2), eot]] + np.asarray(p["positional_embedding"])[eot]
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + model_lib.EPS)
  x = x * np.asarray(p["ln_final"]["scale"]) + np.asarray(p["ln_final"]["bias"])
  np.testing.assert_allclose(np.asarray(tower.apply(variables, tokens, project=False)), x, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(tower.apply(variables, tokens)), x @ np.asarray(p["text_projection"]),
                             rtol=1e-5, atol=1e-5)


def _copy(tmp_path, name):
  src = os.path.join(FIXTURES, name)
  dst = tmp_path / os.path.basename(name)
  shutil.copy(src, dst)
  return str(dst)


def test_wrong_files_are_one_line(tmp_path):
  from safetensors.numpy import save_file
  text = tmp_path / "notes.pt"
  text.write_text("not weights")
  truncated = tmp_path / "cut.pt"
  truncated.write_bytes(open(os.path.join(FIXTURES, "openai_vit.pt"), "rb").read()[:5000])
  tensors = fw.read_safetensors(os.path.join(FIXTURES, "open_clip", "open_clip_model.safetensors"))
  missing = dict(tensors)
  del missing["visual.transformer.resblocks.1.mlp.c_fc.bias"]
  extra = {**tensors, "visual.head.weight": np.zeros((3, 3), np.float32)}
  resnet = {k: v for k, v in tensors.items() if not k.startswith("visual.")}
  resnet["visual.layer1.0.conv1.weight"] = np.zeros((4, 4, 1, 1), np.float32)
  hf = fw.read_safetensors(os.path.join(FIXTURES, "hf", "model.safetensors"))
  hf_missing = {k: v for k, v in hf.items() if k != "text_model.encoder.layers.0.self_attn.k_proj.weight"}
  for name, t in (("missing", missing), ("extra", extra), ("resnet", resnet), ("hfmissing", hf_missing)):
    save_file(t, str(tmp_path / f"{name}.safetensors"))
  cases = [
      (text, r"notes\.pt: not a PyTorch checkpoint .*; expected CLIP weights"),
      (truncated, r"cut\.pt: not a PyTorch checkpoint .*; expected CLIP weights"),
      (tmp_path / "absent.pt", r"absent\.pt: no such file; expected CLIP weights"),
      (tmp_path / "missing.safetensors", r"missing\.safetensors: missing tensor visual\.transformer\.resblocks\.1\.mlp\.c_fc\.bias \(expected shape \[256\]\)"),
      (tmp_path / "extra.safetensors", r"extra\.safetensors: unexpected tensor visual\.head\.weight \[3, 3\]"),
      (tmp_path / "resnet.safetensors", r"resnet\.safetensors: ResNet image tower .*only ViT towers"),
      (tmp_path / "hfmissing.safetensors", r"hfmissing\.safetensors: missing tensor text_model\.encoder\.layers\.0\.self_attn\.k_proj\.weight"),
  ]
  for path, match in cases:
    with pytest.raises(ValueError, match=match) as e:
      weights.load(str(path))
    assert "\n" not in str(e.value)


def test_sizes_read_off_the_tensors():
  tensors, _ = weights.read_tensors(os.path.join(FIXTURES, "openai_vit.pt"))
  s = weights.sizes_of(tensors, "openai_vit.pt")
  assert (s.embed_dim, s.image_resolution, s.vision_patch_size, s.vision_layers, s.vision_width,
          s.context_length, s.vocab_size, s.transformer_width, s.transformer_layers) == (32, 32, 8, 2, 128, 77, 500, 128, 2)
  with pytest.raises(ValueError, match="width 128 does not split into 3 heads"):
    weights.sizes_of(tensors, "x", vision_heads=3)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_round_trip_through_torch_names(tmp_path):
  """save_random's file loads back to the same variables (the name map both ways), with the
  heads and activation its open_clip_config.json names."""
  import jax
  sizes = model_lib.ClipSizes(embed_dim=8, image_resolution=32, vision_layers=2, vision_width=64,
                              vision_patch_size=16, transformer_width=32, transformer_layers=2,
                              transformer_heads=2, vision_heads=4, context_length=10, vocab_size=50)
  weights.save_random(str(tmp_path / "w.safetensors"), sizes, seed=1)
  got_sizes, got, fmt = weights.load(str(tmp_path / "w.safetensors"))
  assert got_sizes == sizes and fmt == "open_clip"
  want = model_lib.init_variables(sizes, seed=1)
  for (p1, a), (p2, b) in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves_with_path(got)):
    assert p1 == p2
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _standin_cli(argv, capsys):
  """``python -m jaxcap.clip.weights`` in-process (``run_script`` exits): ``(code, out, err)``."""
  import sys
  from jaxcap import cli
  saved = sys.argv
  sys.argv = ["python -m jaxcap.clip.weights", *map(str, argv)]
  try:
    with pytest.raises(SystemExit) as e:
      cli.run_script(weights.main)
  finally:
    sys.argv = saved
  out = capsys.readouterr()
  return e.value.code, out.out, out.err


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_standin_program_writes_loadable_weights_and_keeps_other_files(tmp_path, capsys, monkeypatch):
  """The documented stand-in command: weights the loader reads (open_clip_config.json beside
  them), rewritten over its own stand-ins, and a file it did not write (real weights, their
  config) refused in one line, exit 2, nothing written."""
  from safetensors.numpy import save_file
  from tests.clip import helpers
  monkeypatch.setitem(weights.STANDIN_SIZES, "small", helpers.SIZES)  # the test's smaller towers
  out = tmp_path / "standin" / "open_clip_model.safetensors"
  code, printed, err = _standin_cli(["--random", "--out", out], capsys)
  assert code == 0, err
  assert f"wrote {out} and {out.parent / 'open_clip_config.json'}: random small CLIP" in printed
  sizes, _, fmt = weights.load(str(out))
  assert fmt == "open_clip" and sizes == helpers.SIZES
  assert weights.is_standin(str(out)) and weights.is_standin(str(out.parent / "open_clip_config.json"))
  first = out.read_bytes()
  code, _, err = _standin_cli(["--random", "--out", out, "--seed", "1"], capsys)  # its own: rewritten
  assert code == 0 and out.read_bytes() != first, err
  # Another's weights, another's config beside the path, a wrong name, no --random: refused.
  (tmp_path / "real").mkdir()
  real = tmp_path / "real" / "open_clip_model.safetensors"
  save_file({"x": np.zeros(2, np.float32)}, str(real))
  (tmp_path / "theirs").mkdir()
  shutil.copy(os.path.join(FIXTURES, "open_clip", "open_clip_config.json"), tmp_path / "theirs")
  cases = [(["--random", "--out", real], r"real/open_clip_model\.safetensors: a file jaxcap did not write "
            r"is there; expected a new path or one of this program's stand-ins \(--overwrite replaces it\)"),
           (["--random", "--out", tmp_path / "theirs" / "w.safetensors"],
            r"theirs/open_clip_config\.json: a file jaxcap did not write"),
           (["--random", "--out", tmp_path / "w.pt"], r"--out=.*w\.pt: expected a file name ending in \.safetensors"),
           (["--out", tmp_path / "w.safetensors"], r"--random"),
           (["--random", "--out", tmp_path / "w.safetensors", "--sizes", "huge"], r"--sizes: invalid choice: 'huge'")]
  for argv, match in cases:
    code, _, err = _standin_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and re.search(match, lines[0]), err
  assert not weights.is_standin(str(real)) and not (tmp_path / "real" / "open_clip_config.json").exists()
  assert not (tmp_path / "theirs" / "w.safetensors").exists() and not (tmp_path / "w.safetensors").exists()
  assert not weights.is_standin(str(tmp_path / "theirs" / "open_clip_config.json"))
  real_bytes = real.read_bytes()
  code, _, err = _standin_cli(["--random", "--out", real], capsys)
  assert code == 2 and real.read_bytes() == real_bytes, err  # byte-identical
  code, _, err = _standin_cli(["--random", "--out", real, "--overwrite"], capsys)  # said: replaced
  assert code == 0 and weights.is_standin(str(real)), err
