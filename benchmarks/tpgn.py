"""TPGN training and beam-search throughput, and which contraction dominates.

Defaults are the paper's TPGN on COCO shapes: d = 25 (Ŝ 25 x 25, u_t and f_t 625-d), 2048-d
global image features, a vocabulary of 9,487 words, 16-word captions (17 decoder steps with
EOS), 50 images per training step with 5 captions each, beam 3 over 100 images.

Per generated word and caption the two big products are the S subnet's ``U_1 Ŝ_{t-1}``
(4 gates x d^4 = 1.56 M multiply-adds at d = 25) and the lexical layer ``W_x f_t``
(V x d^2 = 5.93 M at V = 9,487). The script reports (1) their analytic multiply-adds, (2) XLA's
FLOP count of each one lowered alone and of the whole training step (``cost_analysis`` of the
compiled HLO), and (3) the measured time of each alone, forward + backward, at the training
step's shapes over all T steps, so the ``dominant`` field says which one the step's time goes to.
(XLA's cost analysis counts a ``lax.scan`` body once, so the whole step's FLOP count,
``train_step_xla_gflops_loop_body_once``, is per time step, not per training step; the two parts
are lowered without a loop and are counted in full.)

The training step (jax.jit + optax.adam + masked cross-entropy, as benchmarks/aat.py) runs on a
fixed random batch already on the device; beam search is ``jaxcap.decoding.beam_search``.

  python benchmarks/tpgn.py                          # paper sizes
  python benchmarks/tpgn.py --batch 10 --steps 2     # a quicker CPU check
  python benchmarks/tpgn.py --model show_tell        # the CNN-LSTM baseline (LSTM 512)

Prints one JSON line.
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import add_shape_args, build_train_step, timed  # noqa: E402

from jaxcap.data.vocab import PAD  # noqa: E402
from jaxcap.models.base import shift_right  # noqa: E402
from jaxcap.models.show_tell import ShowTell  # noqa: E402
from jaxcap.models.tpgn import TPGN  # noqa: E402
from jaxcap.models.fields import compute_dtype  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)


def make_batch(rng, images, feat_dim, seq_per_img, words, vocab):
  """Global features and captions of random lengths (docs/DESIGN.md section 2 layout)."""
  caps = rng.integers(4, vocab, size=(images, seq_per_img, words + 1)).astype(np.int32)
  lengths = rng.integers(min(8, words), words + 1, size=(images, seq_per_img))
  pos = np.arange(words + 1)
  caps = np.where(pos == lengths[..., None], 2, caps)
  caps = np.where(pos > lengths[..., None], PAD, caps)
  return {"global_feat": rng.normal(size=(images, feat_dim)).astype(np.float32), "captions": caps}


def flops_of(fn, *args) -> float:
  """XLA's FLOP count of ``jit(fn)(*args)`` from the compiled HLO's cost analysis."""
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get("flops", float("nan")))


def contraction_report(d, vocab, rows, steps, dtype, iters):
  """The U_1 contraction and the lexical layer alone, forward + backward, at ``rows`` captions
  per step for ``steps`` steps: analytic multiply-adds, XLA FLOPs and measured seconds."""
  key = jax.random.split(jax.random.key(0), 4)
  u1 = jax.random.normal(key[0], (4, d, d, d, d), dtype)
  s = jax.random.normal(key[1], (steps, rows, d, d), dtype)
  wx = jax.random.normal(key[2], (vocab, d * d), dtype)
  f = jax.random.normal(key[3], (steps, rows, d * d), dtype)

  def u1_loss(u1, s):  # eqs. 3-6: U_{1,g} Ŝ_{t-1}, all gates, all steps
    return jnp.sum(jnp.einsum("gijkl,tbkl->tbgij", u1, s).astype(jnp.float32) ** 2)

  def out_loss(wx, f):  # eq. 18: W_x f_t, all steps
    return jnp.sum(jnp.einsum("vu,tbu->tbv", wx, f).astype(jnp.float32) ** 2)

  report = {}
  for name, loss, args, macs in (("U1_contraction", u1_loss, (u1, s), 4 * d ** 4),
                                 ("output_layer", out_loss, (wx, f), vocab * d * d)):
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    sec, _ = timed(lambda: g(*args), iters)
    report[name] = {"macs_per_word": macs, "xla_gflops_fwd_bwd": round(flops_of(jax.grad(loss, argnums=(0, 1)), *args) / 1e9, 2),
                    "seconds_fwd_bwd": round(sec, 4)}
  a, b = report["U1_contraction"], report["output_layer"]
  report["dominant"] = "U1_contraction" if a["seconds_fwd_bwd"] > b["seconds_fwd_bwd"] else "output_layer"
  report["time_ratio_output_over_U1"] = round(b["seconds_fwd_bwd"] / max(a["seconds_fwd_bwd"], 1e-12), 2)
  return report


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="tpgn", choices=("tpgn", "show_tell"))
  ap.add_argument("--d", type=positive_int, default=25)
  ap.add_argument("--hidden", type=positive_int, default=512, help="show_tell LSTM width")
  ap.add_argument("--batch", type=positive_int, default=50, help="images per training step")
  ap.add_argument("--seq_per_img", type=positive_int, default=5)
  add_shape_args(ap)
  ap.add_argument("--beam", type=positive_int, default=3)
  ap.add_argument("--eval_batch", type=positive_int, default=100, help="images per beam-search call")
  ap.add_argument("--steps", type=nonnegative_int, default=0, help="timed iterations (0: 20 on GPU/TPU, 2 on CPU)")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--skip_train", action="store_true")
  ap.add_argument("--skip_beam", action="store_true")
  ap.add_argument("--skip_parts", action="store_true", help="skip the U_1 / output-layer comparison")
  args = ap.parse_args(argv)

  platform = jax.devices()[0].platform
  iters = args.steps or (2 if platform == "cpu" else 20)
  if args.model == "tpgn":
    model = TPGN(vocab_size=args.vocab, feature_dim=args.feat_dim, d=args.d, dtype=compute_dtype(args.dtype))
  else:
    model = ShowTell(vocab_size=args.vocab, hidden_dim=args.hidden, embed_dim=args.hidden)
  rng = np.random.default_rng(0)
  batch = jax.device_put(make_batch(rng, args.batch, args.feat_dim, args.seq_per_img, args.words, args.vocab))
  params = jax.jit(model.init)(jax.random.key(0), batch, shift_right(batch["captions"]))
  n_params = sum(x.size for x in jax.tree.leaves(params.get("params", params)))
  result = {"benchmark": args.model, "device": jax.devices()[0].device_kind, "platform": platform,
            "dtype": args.dtype, "vocab": args.vocab, "feat_dim": args.feat_dim, "words": args.words,
            "params_M": round(n_params / 1e6, 2), "iters": iters}
  if args.model == "tpgn":
    result["d"] = args.d

  if not args.skip_train:
    tx = optax.adam(1e-4)
    step = build_train_step(model, tx)
    state = {"params": params, "opt": tx.init(params), "rng": jax.random.key(1)}

    def run_train():
      state["params"], state["opt"], loss, state["rng"] = step(state["params"], state["opt"], batch, state["rng"])
      return loss

    sec, comp = timed(run_train, iters)
    gflops = flops_of(lambda p, o, b, r: step(p, o, b, r), state["params"], state["opt"], batch, state["rng"]) / 1e9
    result.update(train_images_per_s=round(args.batch / sec, 2), train_step_s=round(sec, 4),
                  train_batch=args.batch, train_compile_s=round(comp, 1),
                  train_step_xla_gflops_loop_body_once=round(gflops, 1))
    params = state["params"]

  if not args.skip_beam:
    from jaxcap import decoding
    eval_batch = jax.device_put({"global_feat": rng.normal(size=(args.eval_batch, args.feat_dim)).astype(np.float32)})

    def run_beam():
      return decoding.beam_search(model, params, eval_batch, beam_size=args.beam, max_len=args.words).tokens

    sec, comp = timed(run_beam, iters)
    result.update(beam_images_per_s=round(args.eval_batch / sec, 2), beam_size=args.beam,
                  beam_batch=args.eval_batch, beam_compile_s=round(comp, 1))

  if args.model == "tpgn" and not args.skip_parts:
    result["parts"] = contraction_report(args.d, args.vocab, args.batch * args.seq_per_img, args.words + 1,
                                         compute_dtype(args.dtype), iters)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
