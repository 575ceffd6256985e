"""CLIP weights from the files users have, read without torch, tensor by tensor:

- OpenAI's ``ViT-B-32.pt`` / ``ViT-B-16.pt`` (TorchScript archives of float16 weights, read by
  :mod:`jaxcap.importers.torch_files`; cast to float32 as ``clip.load`` does on the CPU);
- PAC-S's checkpoint (``clip_ViT-B-32.pth``: ``torch.save({'state_dict': ...})`` of a fine-tuned
  OpenAI CLIP), or any ``.pth`` / ``.bin`` of an OpenAI-named ``state_dict``;
- open_clip's ``open_clip_model.safetensors`` (the same names as OpenAI's; its
  ``open_clip_config.json`` beside it, when there, gives the heads and whether the towers use
  QuickGELU; without it: OpenAI's 64-wide heads and exact GELU, open_clip's default);
- Hugging Face's ``model.safetensors`` of a ``CLIPModel`` (its names mapped to OpenAI's: q, k, v
  projections fused, ``visual_projection`` / ``text_projection`` transposed; ``config.json``
  beside it gives the heads and ``hidden_act``; without it: 64-wide heads, QuickGELU).

Every format becomes OpenAI's ``state_dict`` names (:func:`to_openai_tensors`); the sizes are
read off the tensors as ``clip.model.build_model`` reads them; then one name map fills the
linen variables (:func:`jaxcap.features.weights.from_state_dict`: a missing tensor, a tensor
nothing takes or a wrong shape is one ``ValueError`` line naming the file and the tensor).
Skipped: the TorchScript archive's ``input_resolution`` / ``context_length`` / ``vocab_size``
and its text attention masks, Hugging Face's ``position_ids`` buffers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from jaxcap.clip import model as model_lib
from jaxcap.errors import BadInput
from jaxcap.features import weights as fw
from jaxcap.importers import torch_files

EXPECTED = ("CLIP weights: OpenAI's ViT-B-32.pt, PAC-S's .pth, open_clip's "
            "open_clip_model.safetensors or Hugging Face's model.safetensors")
SKIPPED = re.compile(r"^(input_resolution|context_length|vocab_size)$|attn_mask$|position_ids$")


def _hf_to_openai(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  fused: dict[str, dict[str, np.ndarray]] = {}
  fused_from: dict[str, str] = {}  # OpenAI name -> the Hugging Face names' pattern, for errors
  tower_names = {"vision_model.": "visual.", "text_model.": ""}
  simple = {
      "vision_model.embeddings.class_embedding": "visual.class_embedding",
      "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
      "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
      "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
      "text_model.embeddings.position_embedding.weight": "positional_embedding",
      "logit_scale": "logit_scale"}
  norms = {"vision_model.pre_layrnorm": "visual.ln_pre", "vision_model.post_layernorm": "visual.ln_post",
           "text_model.final_layer_norm": "ln_final"}
  layer_parts = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc",
                 "mlp.fc2": "mlp.c_proj", "self_attn.out_proj": "attn.out_proj"}
  for name, value in tensors.items():
    if name in simple:
      out[simple[name]] = value
    elif name in ("visual_projection.weight", "text_projection.weight"):
      out["visual.proj" if name.startswith("visual") else "text_projection"] = value.T
    elif name.rsplit(".", 1)[0] in norms:
      out[f"{norms[name.rsplit('.', 1)[0]]}.{name.rsplit('.', 1)[1]}"] = value
    elif m := re.match(r"^(vision_model\.|text_model\.)encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$", name):
      tower, layer, part, kind = m.groups()
      block = f"{tower_names[tower]}transformer.resblocks.{layer}"
      if part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        fused.setdefault(f"{block}.attn.in_proj_{kind}", {})[part[-6]] = value
        fused_from[f"{block}.attn.in_proj_{kind}"] = f"{tower}encoder.layers.{layer}.self_attn.{{}}_proj.{kind}"
      elif part in layer_parts:
        out[f"{block}.{layer_parts[part]}.{kind}"] = value
      else:
        out[name] = value  # nothing takes it: the name map names it
    else:
      out[name] = value
  for name, parts in fused.items():
    if set(parts) != {"q", "k", "v"}:
      missing = sorted({"q", "k", "v"} - set(parts))[0]
      raise BadInput(f"missing tensor {fused_from[name].format(missing)}")
    try:
      out[name] = np.concatenate([parts["q"], parts["k"], parts["v"]], axis=0)
    except ValueError:  # numpy's: the q, k, v tensors' shapes do not stack
      raise BadInput(f"tensors {fused_from[name].format('{q,k,v}')}: shapes "
                     f"{[list(np.shape(parts[p])) for p in 'qkv']} do not stack; expected equal "
                     "widths") from None
  return out


def read_tensors(path: str) -> tuple[dict[str, np.ndarray], str]:
  """``(tensors with OpenAI's names, format)``; format: openai_torchscript, state_dict,
  open_clip, hf."""
  if not os.path.isfile(path):
    raise BadInput(f"{path}: no such file; expected {EXPECTED}")
  if path.endswith(".safetensors"):
    try:
      tensors = fw.read_safetensors(path)
    except (BadInput, FileNotFoundError) as e:
      raise BadInput(f"{e}; expected {EXPECTED}") from None
    if any(k.startswith(("vision_model.", "text_model.")) for k in tensors):
      try:
        return _hf_to_openai(tensors), "hf"
      except BadInput as e:
        raise BadInput(f"{path}: {e}") from None
    return tensors, "open_clip"
  raw = torch_files.read(path, EXPECTED)
  if isinstance(raw, torch_files.ScriptObject):
    return fw.check_finite(torch_files.script_tensors(raw), path), "openai_torchscript"
  state = raw.get("state_dict", raw) if isinstance(raw, dict) else None
  if not isinstance(state, dict) or not state or not all(isinstance(v, np.ndarray) for v in state.values()):
    raise BadInput(f"{path}: holds no state_dict of tensors; expected {EXPECTED}")
  fw.check_finite(state, path)
  return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}, "state_dict"


def _count(tensors, pattern: str) -> int:
  return len({m.group(1) for k in tensors if (m := re.match(pattern, k))})


def _side_config(path: str, fmt: str) -> dict:
  """Heads and activation from the config file beside the weights, where the format has one."""
  folder = os.path.dirname(os.path.abspath(path))
  name = {"hf": "config.json", "open_clip": "open_clip_config.json"}.get(fmt)
  if not name or not os.path.isfile(os.path.join(folder, name)):
    return {"activation": "gelu"} if fmt == "open_clip" else {}
  file = os.path.join(folder, name)
  try:
    with open(file, encoding="utf-8") as f:
      c = json.load(f)
    if fmt == "hf":
      v, t = c["vision_config"], c["text_config"]
      acts = {v.get("hidden_act", "quick_gelu"), t.get("hidden_act", "quick_gelu")}
      return {"vision_heads": int(v["num_attention_heads"]), "transformer_heads": int(t["num_attention_heads"]),
              "activation": acts.pop() if len(acts) == 1 else "mixed"}
    m = c["model_cfg"]
    return {"vision_heads": int(m["vision_cfg"]["width"]) // int(m["vision_cfg"].get("head_width", 64)),
            "transformer_heads": int(m["text_cfg"].get("heads", 8)),
            "activation": "quick_gelu" if m.get("quick_gelu") else "gelu"}
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise BadInput(f"{file}: not the {name} of these weights ({type(e).__name__}: {e}); expected "
                     "the config its producer saves beside them") from None


def sizes_of(tensors: dict[str, np.ndarray], source: str, **overrides) -> model_lib.ClipSizes:
  """The sizes ``clip.model.build_model`` reads off a state dict, then ``overrides``."""
  need = ("visual.conv1.weight", "visual.positional_embedding", "text_projection",
          "positional_embedding", "token_embedding.weight", "ln_final.weight")
  for name in need:
    if name not in tensors:
      kind = "ResNet image tower (RN50...): not read, only ViT towers" if "visual.layer1.0.conv1.weight" in tensors \
          else "missing tensor " + name
      raise BadInput(f"{source}: {kind}; expected {EXPECTED} of a ViT CLIP")
  try:
    conv = tensors["visual.conv1.weight"].shape
    grid = round((tensors["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    width = tensors["ln_final.weight"].shape[0]
    sizes = model_lib.ClipSizes(
        embed_dim=tensors["text_projection"].shape[1], image_resolution=conv[-1] * grid,
        vision_layers=_count(tensors, r"^visual\.transformer\.resblocks\.(\d+)\."),
        vision_width=conv[0], vision_patch_size=conv[-1],
        context_length=tensors["positional_embedding"].shape[0],
        vocab_size=tensors["token_embedding.weight"].shape[0], transformer_width=width,
        transformer_heads=width // 64, transformer_layers=_count(tensors, r"^transformer\.resblocks\.(\d+)\."),
        vision_heads=conv[0] // 64)
  except IndexError:  # a tensor with fewer dimensions than CLIP's (shape[1] of a vector)
    shapes = {n: list(np.shape(tensors[n])) for n in need}
    raise BadInput(f"{source}: tensor shapes {shapes}; expected {EXPECTED} of a ViT CLIP") from None
  sizes = dataclasses.replace(sizes, **overrides)
  if sizes.activation not in ("gelu", "quick_gelu"):
    raise BadInput(f"{source}: activation {sizes.activation!r}; expected gelu or quick_gelu in both towers")
  for tower, w, h in (("image", sizes.vision_width, sizes.vision_heads),
                      ("text", sizes.transformer_width, sizes.transformer_heads)):
    if h < 1 or w % h:
      raise BadInput(f"{source}: the {tower} tower's width {w} does not split into {h} heads")
  return sizes


def _block_targets(shapes, torch_prefix: str, path: tuple) -> dict[str, fw.Target]:
  out = {}
  for t, f in (("ln_1", "norm1"), ("ln_2", "norm2")):
    out[f"{torch_prefix}.{t}.weight"] = fw._same(shapes, path + (f, "scale"))
    out[f"{torch_prefix}.{t}.bias"] = fw._same(shapes, path + (f, "bias"))
  out[f"{torch_prefix}.attn.in_proj_weight"] = fw._qkv_weight(shapes, path + ("attn",))
  out[f"{torch_prefix}.attn.in_proj_bias"] = fw._qkv_bias(shapes, path + ("attn",))
  out[f"{torch_prefix}.attn.out_proj.weight"] = fw._proj_weight(shapes, path + ("attn", "out", "kernel"))
  out[f"{torch_prefix}.attn.out_proj.bias"] = fw._same(shapes, path + ("attn", "out", "bias"))
  for t, f in (("c_fc", "fc1"), ("c_proj", "fc2")):
    out[f"{torch_prefix}.mlp.{t}.weight"] = fw._linear(shapes, path + ("mlp", f, "kernel"))
    out[f"{torch_prefix}.mlp.{t}.bias"] = fw._same(shapes, path + ("mlp", f, "bias"))
  return out


def name_map(sizes: model_lib.ClipSizes) -> dict[str, fw.Target]:
  """OpenAI CLIP's ``state_dict`` names -> the variables of ``CLIP(sizes)``."""
  shapes = fw._leaf_shapes(model_lib.abstract_variables(sizes))
  v, t = ("params", "visual"), ("params", "text")
  out = {"visual.conv1.weight": fw._conv(shapes, v + ("conv1", "kernel")),
         "visual.class_embedding": fw._same(shapes, v + ("class_embedding",)),
         "visual.positional_embedding": fw._same(shapes, v + ("positional_embedding",)),
         "visual.proj": fw._same(shapes, v + ("proj",)),
         "token_embedding.weight": fw._same(shapes, t + ("token_embedding", "embedding")),
         "positional_embedding": fw._same(shapes, t + ("positional_embedding",)),
         "text_projection": fw._same(shapes, t + ("text_projection",)),
         "logit_scale": fw._same(shapes, ("params", "logit_scale"))}
  for torch_name, path in (("visual.ln_pre", v + ("ln_pre",)), ("visual.ln_post", v + ("ln_post",)),
                           ("ln_final", t + ("ln_final",))):
    out[f"{torch_name}.weight"] = fw._same(shapes, path + ("scale",))
    out[f"{torch_name}.bias"] = fw._same(shapes, path + ("bias",))
  for i in range(sizes.vision_layers):
    out.update(_block_targets(shapes, f"visual.transformer.resblocks.{i}", v + (f"resblocks_{i}",)))
  for i in range(sizes.transformer_layers):
    out.update(_block_targets(shapes, f"transformer.resblocks.{i}", t + (f"resblocks_{i}",)))
  return out


def load(path: str, **overrides):
  """``(sizes, variables, format)`` of the CLIP in ``path``; ``overrides``: ClipSizes fields
  (``vision_heads``, ``transformer_heads``, ``activation``) a file does not hold."""
  tensors, fmt = read_tensors(path)
  side = _side_config(path, fmt)
  if fmt in ("openai_torchscript", "state_dict"):
    side.setdefault("activation", "quick_gelu")
  sizes = sizes_of(tensors, path, **{**side, **overrides})
  variables, _ = fw.from_state_dict(model_lib.CLIP(sizes), tensors, source=path,
                                    targets=name_map(sizes), ignored=lambda n: bool(SKIPPED.search(n)))
  return sizes, variables, fmt


def to_state_dict(sizes: model_lib.ClipSizes, variables) -> dict[str, np.ndarray]:
  """The inverse of :func:`load`'s mapping: OpenAI-named float32 tensors in torch's layouts
  (trials with random weights, and a check of the name map: load(save(v)) == v)."""
  out = {}
  for name, target in name_map(sizes).items():
    arrays = []
    for path in target.paths:
      node = variables
      for key in path:
        node = node[key]
      arrays.append(np.asarray(node, np.float32))
    if len(arrays) == 3:  # fused q, k, v: kernels [D, H, Dh] -> rows [3 H Dh, D]; biases [H, Dh]
      tensor = np.concatenate([a.reshape(a.shape[0], -1).T if a.ndim == 3 else a.reshape(-1) for a in arrays])
    elif name.endswith("out_proj.weight"):  # [H, Dh, D] -> [D, H Dh]
      tensor = arrays[0].reshape(-1, arrays[0].shape[-1]).T
    elif arrays[0].ndim == 4:  # conv HWIO -> OIHW
      tensor = np.transpose(arrays[0], (3, 2, 0, 1))
    elif name.endswith((".c_fc.weight", ".c_proj.weight")):  # linear [I, O] -> [O, I]
      tensor = arrays[0].T
    else:
      tensor = arrays[0]
    out[name] = np.array(tensor.reshape(target.torch_shape), np.float32, order="C")
  return out


# What marks the files :func:`save_random` writes (the safetensors header's metadata, a key of
# the config): its program overwrites its own stand-ins, never a file it did not write (a
# reader's real CLIP weights at the same path).
STANDIN_KEY = "jaxcap_standin"
STANDIN_SIZES = {
    # CPU-friendly: CLIP's vocabulary and context (its tokenizer), small towers; the README
    # runner's commands score and train with it in seconds.
    "small": model_lib.ClipSizes(embed_dim=32, image_resolution=64, vision_layers=2, vision_width=64,
                                 vision_patch_size=16, transformer_width=64, transformer_layers=2,
                                 transformer_heads=2, vision_heads=2),
    "ViT-B-32": model_lib.VIT_B_32,  # OpenAI's sizes (~600 MB of float32): timings as a real CLIP's
}


def save_random(path: str, sizes: model_lib.ClipSizes, seed: int = 0) -> None:
  """Random weights of ``CLIP(sizes)`` as an OpenAI-named ``.safetensors`` (with an
  ``open_clip_config.json`` beside it naming the heads and the activation), for trials and the
  documented commands' stand-ins; scores made with them mean nothing. Both files are written
  atomically and marked (:data:`STANDIN_KEY`) as stand-ins."""
  from safetensors.numpy import save
  from jaxcap import atomic
  data = save(to_state_dict(sizes, model_lib.init_variables(sizes, seed)),
              metadata={STANDIN_KEY: f"random weights, seed {seed}"})
  atomic.write_with(path, lambda f: f.write(data))
  config = {"model_cfg": {"embed_dim": sizes.embed_dim, "quick_gelu": sizes.activation == "quick_gelu",
                          "vision_cfg": {"width": sizes.vision_width,
                                         "head_width": sizes.vision_width // sizes.vision_heads},
                          "text_cfg": {"heads": sizes.transformer_heads}},
            STANDIN_KEY: "random weights (python -m jaxcap.clip.weights --random)"}
  atomic.write_json(os.path.join(os.path.dirname(os.path.abspath(path)), "open_clip_config.json"), config)


def is_standin(path: str) -> bool:
  """Whether ``path`` is a file :func:`save_random` wrote (its marked safetensors header, or
  its marked ``open_clip_config.json``); any other file, readable or not, is not."""
  try:
    if path.endswith(".json"):
      with open(path, encoding="utf-8") as f:
        return STANDIN_KEY in json.load(f)
    with open(path, "rb") as f:
      size = int.from_bytes(f.read(8), "little")
      if not 0 < size < 100_000_000:
        return False
      header = json.loads(f.read(size))
    return STANDIN_KEY in (header.get("__metadata__") or {})
  except (OSError, ValueError, AttributeError, TypeError):
    return False


def main(argv=None) -> int:
  """``python -m jaxcap.clip.weights --random --out DIR/open_clip_model.safetensors``: random
  stand-in weights (and their ``open_clip_config.json``) for the documented CLIP commands."""
  from jaxcap import atomic, cli
  p = cli.ArgumentParser(
      prog="python -m jaxcap.clip.weights",
      description="Random stand-in CLIP weights, in open_clip's layout, for trying the CLIP scores "
                  "and the CLIP reward without real weights: every score made with them means "
                  "nothing (most or all CLIP-S are 0: random towers' cosines are mostly <= 0, which "
                  "max(cos, 0) clips).")
  p.add_argument("--random", action="store_true", required=True,
                 help="Random weights (the only weights this program makes; required, so that the "
                      "command says what it makes).")
  p.add_argument("--out", required=True,
                 help="The .safetensors file to write; open_clip_config.json goes beside it. A file "
                      "there that this program did not write is not overwritten without --overwrite.")
  p.add_argument("--sizes", choices=tuple(STANDIN_SIZES), default="small",
                 help="small: CPU-friendly towers (default); ViT-B-32: OpenAI's sizes.")
  p.add_argument("--seed", type=int, default=0, help="The random weights' seed.")
  p.add_argument("--overwrite", action="store_true",
                 help="Replace files at --out (and its open_clip_config.json) this program did not write.")
  args = p.parse_args(argv)
  if not args.out.endswith(".safetensors"):
    raise BadInput(f"--out={args.out}: expected a file name ending in .safetensors (the loader "
                     "reads open_clip's layout from that extension)")
  config = os.path.join(os.path.dirname(args.out), "open_clip_config.json")
  for path, flag in ((args.out, f"--out={args.out}"), (config, f"--out={args.out}: {config}")):
    # Real weights or their config are never replaced without --overwrite.
    atomic.check_output(path, flag, overwrite=args.overwrite, mine=is_standin,
                        what="one of this program's stand-ins")
  sizes = STANDIN_SIZES[args.sizes]
  save_random(args.out, sizes, args.seed)
  print(f"wrote {args.out} and {config}: random {args.sizes} CLIP weights (seed {args.seed}, "
        f"ViT-{sizes.vision_width}/{sizes.vision_patch_size}@{sizes.image_resolution}, CLIP's "
        f"{sizes.vocab_size}-token vocabulary); stand-ins: scores made with them mean nothing", flush=True)
  return 0


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
