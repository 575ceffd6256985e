"""Multimodal attention NMT training and beam-search throughput at the paper's sizes.

Defaults are the paper's (section 5): E = 620, H = 1000, batch 32 sentence pairs, 196 x 1024
ResNet-50 grid features, 10,000 German / 16,802 English words, beam 12; sentence lengths
``--src_words`` 18 and ``--words`` 16 (Multi30k averages 11.7 English / 9.8 German words after
preprocessing; the batches are padded to these lengths). ``--variant`` picks the Table 2 row
(default MNMT7; ``nmt`` is the text-only baseline). One training sentence is one image with
one source and one target (Multi30k's lines), so sentences/s = images/s.

The training step (jax.jit + optax.adam + masked cross-entropy) runs on a fixed random batch
already on the device; beam search is ``jaxcap.decoding.beam_search`` (beam 12).

  python benchmarks/mnmt.py                              # paper sizes (slow on a CPU)
  python benchmarks/mnmt.py --hidden 256 --embed 128 --batch 16 --steps 3   # a quick CPU check

Prints one JSON line with training and beam-12 sentences (images) per second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import timed  # noqa: E402
from jaxcap.data.vocab import PAD  # noqa: E402
from jaxcap.models.base import shift_right  # noqa: E402
from jaxcap.models.mnmt import VARIANTS, MultimodalNMT  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)


def make_batch(rng, b, cells, feat_dim, src_words, words, src_vocab, vocab):
  """Random sentence pairs (EOS at random lengths, then PAD) and grid features."""
  def sentences(n, t, v):
    ids = rng.integers(4, v, size=(b, n, t + 1)).astype(np.int32)
    lengths = rng.integers(max(1, t // 2), t + 1, size=(b, n))
    pos = np.arange(t + 1)
    ids = np.where(pos == lengths[..., None], 2, ids)
    return np.where(pos > lengths[..., None], PAD, ids)
  return {"feats": rng.normal(size=(b, cells, feat_dim)).astype(np.float32),
          "feats_mask": np.ones((b, cells), bool),
          "src": sentences(1, src_words, src_vocab)[:, 0],
          "captions": sentences(1, words, vocab)}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--variant", default="mnmt7", choices=sorted(VARIANTS) + ["nmt", "imgtxt"])
  ap.add_argument("--embed", type=positive_int, default=620)
  ap.add_argument("--hidden", type=positive_int, default=1000)
  ap.add_argument("--batch", type=positive_int, default=32, help="sentence pairs per training step")
  ap.add_argument("--steps", type=nonnegative_int, default=0, help="timed steps / beam calls (0: 20 on GPU, 2 on CPU)")
  ap.add_argument("--cells", type=positive_int, default=196)
  ap.add_argument("--feat_dim", type=positive_int, default=1024)
  ap.add_argument("--vocab", type=positive_int, default=10004)
  ap.add_argument("--src_vocab", type=positive_int, default=16806)
  ap.add_argument("--src_words", type=positive_int, default=18)
  ap.add_argument("--words", type=positive_int, default=16)
  ap.add_argument("--beam", type=positive_int, default=12)
  ap.add_argument("--eval_batch", type=positive_int, default=32, help="sentences per beam-search call")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--skip_train", action="store_true")
  ap.add_argument("--skip_beam", action="store_true")
  args = ap.parse_args(argv)

  platform = jax.devices()[0].platform
  iters = args.steps or (2 if platform == "cpu" else 20)
  if args.variant in VARIANTS:
    fusion, enc_dep, dec_dep = VARIANTS[args.variant]
    kw = dict(modalities="both", fusion=fusion, encoder_dependent=enc_dep, decoder_dependent=dec_dep)
  else:
    kw = dict(modalities={"nmt": "text", "imgtxt": "image"}[args.variant])
  model = MultimodalNMT(vocab_size=args.vocab, src_vocab_size=args.src_vocab, embed_dim=args.embed,
                        hidden_dim=args.hidden, dtype=args.dtype, **kw)
  rng = np.random.default_rng(0)
  batch = jax.device_put(make_batch(rng, args.batch, args.cells, args.feat_dim, args.src_words,
                                    args.words, args.src_vocab, args.vocab))
  params = jax.jit(model.init)(jax.random.key(0), batch, shift_right(batch["captions"]))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  result = {"benchmark": "mnmt", "variant": args.variant, "device": jax.devices()[0].device_kind,
            "platform": platform, "dtype": args.dtype, "embed": args.embed, "hidden": args.hidden,
            "params_M": round(n_params / 1e6, 1), "iters": iters}

  if not args.skip_train:
    tx = optax.adam(4e-4)

    def loss_fn(params, batch):
      logits, _ = model.apply(params, batch, shift_right(batch["captions"]), train=True)
      mask = (batch["captions"] != PAD).astype(jnp.float32)
      nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["captions"])
      return jnp.sum(nll * mask) / jnp.sum(mask)

    @jax.jit
    def step(params, opt_state, batch):
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    state = {"params": params, "opt": tx.init(params)}

    def run_train():
      state["params"], state["opt"], loss = step(state["params"], state["opt"], batch)
      return loss

    sec, comp = timed(run_train, iters)
    result.update(train_sentences_per_s=round(args.batch / sec, 1), train_images_per_s=round(args.batch / sec, 1),
                  train_step_s=round(sec, 4), train_batch=args.batch, train_compile_s=round(comp, 1))
    params = state["params"]

  if not args.skip_beam:
    from jaxcap import decoding
    eb = make_batch(rng, args.eval_batch, args.cells, args.feat_dim, args.src_words, args.words,
                    args.src_vocab, args.vocab)
    eb = jax.device_put({k: eb[k] for k in ("feats", "feats_mask", "src")})

    def run_beam():
      return decoding.beam_search(model, params, eb, beam_size=args.beam, max_len=args.words).tokens

    sec, comp = timed(run_beam, iters)
    result.update(beam_sentences_per_s=round(args.eval_batch / sec, 2), beam_size=args.beam,
                  beam_batch=args.eval_batch, beam_compile_s=round(comp, 1))
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
