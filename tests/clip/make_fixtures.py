"""Writes tests/clip/fixtures/ with the reference packages' own code (torch only here, to
regenerate; the tests read the files with NumPy):

  pip install torch==2.14.1 torchvision==0.29.1 openai-clip open-clip-torch "transformers<6" \
      safetensors ftfy regex "setuptools<81"
  python tests/clip/make_fixtures.py

- ``tokens.json``: ``clip.tokenize`` on a corpus with punctuation, non-ASCII text, HTML
  entities and captions past 77 tokens (``truncate=True``; which ones ``truncate=False`` refuses).
- ``openai_vit.pt``: a small ``clip.model.CLIP`` (random weights; ViT image tower), cast to
  float16 by ``clip.model.convert_weights`` as ``build_model`` does and saved as TorchScript by
  ``torch.jit.save`` of ``torch.jit.trace`` (OpenAI's released ``.pt`` files are TorchScript
  archives of float16 weights).
- ``pacs.pth``: ``torch.save({"state_dict": model.state_dict()})`` of another small OpenAI CLIP
  in float32 (PAC-S's checkpoint: pacscore's compute_metrics.py reads ``checkpoint['state_dict']``).
- ``open_clip/``: ``open_clip.push_to_hf_hub.save_for_hf`` of a small ``open_clip.model.CLIP``
  (``open_clip_model.safetensors`` + ``open_clip_config.json``; exact GELU, not QuickGELU).
- ``hf/``: ``transformers.CLIPModel.save_pretrained`` (``model.safetensors`` + ``config.json``).
- ``images/*.png`` (sizes and modes: RGB, L, RGBA, P) and, in ``embeddings.npz``, clip's own
  ``clip.clip._transform(n_px)`` of each (``pre_<name>_<n_px>``, channels last).
- ``grammar_head.pth``: CLIP-Caption-Reward's grammar head (``grammar_score_head``), and in
  ``embeddings.npz`` its P(grammatical) on random inputs (``grammar_x``, ``grammar_p``).
- ``embeddings.npz``: for each, the producer's ``encode_image`` / ``encode_text`` (float32, CPU;
  the float16 file's weights cast to float32 as ``clip.load`` does on CPU) on the same uint8
  images and token rows.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
VOCAB = 500

CORPUS = [
    "A man riding a horse on a beach.",
    "two dogs playing with a frisbee in the park",
    "A photo depicts a cat's toy, isn't it? Yes!!! (really) -- 100% sure...",
    "Café crème brûlée at the naïve façade; Zürich, 2024.",
    "東京の夜景 and a 😀 emoji, plus Ελληνικά words",
    "Fish &amp; chips &lt;b&gt;bold&lt;/b&gt; &amp;amp; double-escaped",
    "   lots   of\tspaces\nand\nnewlines   ",
    "numbers 1234567890 and 3.14159 and ½ and ²",
    "don't won't we're they've I'm you'll he'd",
    "<|startoftext|> special tokens inside <|endoftext|> the caption",
    "a " + "very " * 80 + "long caption past seventy-seven tokens",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    " ".join(f"word{i}" for i in range(60)),
    "Ünïcödé ÀÉÎÕÜ mixed CASE Words",
    "",
    "mojibake: â€œquotedâ€\x9d text",
    "tabs\tand\u00a0non-breaking\u2009spaces",
    "a" * 200,
    "The quick brown fox jumps over the lazy dog; " * 4,
]


def images_and_tokens(resolution: int, seed: int):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, size=(2, resolution, resolution, 3), dtype=np.uint8)
  tokens = np.zeros((3, 77), np.int64)
  for i, n in enumerate((5, 20, 76)):  # the end-of-text id (the largest) at 5, 20, 76
    tokens[i, 0] = VOCAB - 2  # a start-of-text stand-in
    tokens[i, 1:n] = rng.integers(1, VOCAB - 2, size=n - 1)
    tokens[i, n] = VOCAB - 1
  return images, tokens


def pixels(images):
  x = torch.from_numpy(images).float().permute(0, 3, 1, 2) / 255.0
  mean = torch.tensor(MEAN).view(1, 3, 1, 1)
  std = torch.tensor(STD).view(1, 3, 1, 1)
  return (x - mean) / std


def tokens_fixture():
  import clip
  out = []
  for text in CORPUS:
    ids = clip.tokenize(text, truncate=True)[0].numpy()
    try:
      clip.tokenize(text)
      refused = False
    except RuntimeError:
      refused = True
    out.append({"text": text, "ids": ids[ids != 0].tolist(), "refused_without_truncate": refused})
  with open(os.path.join(OUT, "tokens.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=0)


def openai_model(vision_width, vision_layers, width, layers, seed):
  from clip.model import CLIP
  torch.manual_seed(seed)
  model = CLIP(embed_dim=32, image_resolution=32, vision_layers=vision_layers,
               vision_width=vision_width, vision_patch_size=8, context_length=77, vocab_size=VOCAB,
               transformer_width=width, transformer_heads=width // 64, transformer_layers=layers)
  with torch.no_grad():  # their init leaves LayerNorm at 1 / 0 and biases at 0: move them
    for name, p in model.named_parameters():
      if "ln" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def encode(model, images, tokens, image_fn="encode_image", text_fn="encode_text"):
  with torch.no_grad():
    img = getattr(model, image_fn)(pixels(images))
    txt = getattr(model, text_fn)(torch.from_numpy(tokens))
  img = getattr(img, "pooler_output", img)
  txt = getattr(txt, "pooler_output", txt)
  return img.float().numpy(), txt.float().numpy()


def preprocess_fixture(arrays):
  """PNG images of several sizes and modes, and clip's own ``_transform(n_px)`` of each."""
  from PIL import Image
  from clip.clip import _transform
  rng = np.random.default_rng(8)
  folder = os.path.join(OUT, "images")
  os.makedirs(folder, exist_ok=True)
  cases = [("wide_rgb", (61, 40), "RGB"), ("tall_gray", (23, 57), "L"), ("square_rgba", (48, 48), "RGBA"),
           ("odd_palette", (35, 50), "P"), ("small_rgb", (9, 13), "RGB")]
  for name, (w, h), mode in cases:
    img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode)
    path = os.path.join(folder, f"{name}.png")
    img.save(path)
    for n_px in (16, 32):
      with Image.open(path) as im:
        arrays[f"pre_{name}_{n_px}"] = _transform(n_px)(im).permute(1, 2, 0).numpy()


def grammar_fixture(arrays):
  """CLIP-Caption-Reward's grammar head as their CLIPScore module builds it
  (``nn.Sequential(Linear(text width, projection, bias=False), ReLU, Linear(projection, 2,
  bias=False))`` named ``grammar_score_head``), its state_dict saved with ``torch.save``, and
  ``torch.softmax(head(x), -1)[:, 1]`` on random pooled text features."""
  torch.manual_seed(9)

  class WithHead(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.grammar_score_head = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU(),
                                                    torch.nn.Linear(32, 2, bias=False))

  module = WithHead()
  torch.save(module.state_dict(), os.path.join(OUT, "grammar_head.pth"))
  x = torch.randn(6, 64)
  with torch.no_grad():
    arrays["grammar_x"] = x.numpy()
    arrays["grammar_p"] = torch.softmax(module.grammar_score_head(x), dim=-1)[:, 1].numpy()


def main():
  os.makedirs(OUT, exist_ok=True)
  tokens_fixture()
  arrays = {}
  preprocess_fixture(arrays)
  grammar_fixture(arrays)

  # OpenAI TorchScript, float16 weights (2 heads per tower: width 128 = 2 x 64).
  from clip.model import convert_weights
  model = openai_model(128, 2, 128, 2, seed=0)
  convert_weights(model)
  images, tokens = images_and_tokens(32, 1)
  traced = torch.jit.trace(model, (pixels(images).half(), torch.from_numpy(tokens)), check_trace=False)
  torch.jit.save(traced, os.path.join(OUT, "openai_vit.pt"))
  model = model.float()  # clip.load on the CPU: model.float()
  arrays["openai_image"], arrays["openai_text"] = encode(model, images, tokens)
  arrays["openai_images"], arrays["openai_tokens"] = images, tokens

  # PAC-S: {'state_dict': ...} of a float32 OpenAI CLIP (one head, one layer per tower).
  model = openai_model(64, 1, 64, 1, seed=2)
  torch.save({"state_dict": model.state_dict()}, os.path.join(OUT, "pacs.pth"))
  images, tokens = images_and_tokens(32, 3)
  arrays["pacs_image"], arrays["pacs_text"] = encode(model, images, tokens)
  arrays["pacs_images"], arrays["pacs_tokens"] = images, tokens

  # open_clip (exact GELU; 2 heads of 32).
  import open_clip
  from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg
  from open_clip.push_to_hf_hub import save_for_hf
  torch.manual_seed(4)
  vision = CLIPVisionCfg(layers=2, width=64, head_width=32, patch_size=8, image_size=32)
  text = CLIPTextCfg(context_length=77, vocab_size=VOCAB, width=64, heads=2, layers=2)
  model = CLIP(embed_dim=32, vision_cfg=vision, text_cfg=text, quick_gelu=False).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "ln" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))

  class NoTokenizer:  # save_for_hf saves a tokenizer too; the weights are what is read here
    def save_pretrained(self, directory):
      pass

  import dataclasses
  config = {"embed_dim": 32, "vision_cfg": dataclasses.asdict(vision), "text_cfg": dataclasses.asdict(text),
            "quick_gelu": False}
  model.visual.image_mean, model.visual.image_std = MEAN, STD  # as open_clip.create_model sets them
  save_for_hf(model, NoTokenizer(), config, os.path.join(OUT, "open_clip"), safe_serialization=True)
  images, tokens = images_and_tokens(32, 5)
  arrays["open_clip_image"], arrays["open_clip_text"] = encode(model, images, tokens)
  arrays["open_clip_images"], arrays["open_clip_tokens"] = images, tokens
  del open_clip

  # Hugging Face (quick_gelu, 2 heads of 32; eos id the vocabulary's last, the largest).
  from transformers import CLIPConfig, CLIPModel
  torch.manual_seed(6)
  config = CLIPConfig(
      text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, max_position_embeddings=77, hidden_act="quick_gelu",
                       eos_token_id=VOCAB - 1, bos_token_id=VOCAB - 2, pad_token_id=0),
      vision_config=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                         image_size=32, patch_size=8, hidden_act="quick_gelu"),
      projection_dim=32)
  model = CLIPModel(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(os.path.join(OUT, "hf"))
  images, tokens = images_and_tokens(32, 7)
  arrays["hf_image"], arrays["hf_text"] = encode(model, images, tokens, "get_image_features",
                                                 "get_text_features")
  arrays["hf_images"], arrays["hf_tokens"] = images, tokens

  np.savez_compressed(os.path.join(OUT, "embeddings.npz"), **arrays)
  for root, _, names in os.walk(OUT):
    for n in sorted(names):
      print(os.path.join(root, n), os.path.getsize(os.path.join(root, n)))


if __name__ == "__main__":
  main()
