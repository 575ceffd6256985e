"""Which of TPGN's two big contractions its training step's time goes to.

Per generated word and caption the two big products of TPGN (d = 25: Ŝ 25 x 25, u_t and f_t
625-d) are the S subnet's ``U_1 Ŝ_{t-1}`` (4 gates x d^4 = 1.56 M multiply-adds) and the
lexical layer ``W_x f_t`` (V x d^2 = 5.93 M at V = 9,487). Each is timed alone, forward +
backward, at the training step's shapes (``--batch`` images x ``--captions`` captions, all
``--words`` + 1 steps at once), with its analytic multiply-adds and its matrix-multiply FLOPs;
``dominant`` names the slower one. The whole TPGN step (training, greedy, beam) is
``benchmarks/run.py --models tpgn``; this is the part run.py cannot show: the split inside it.

  python benchmarks/tpgn.py                         # the paper's d = 25 at COCO shapes
  python benchmarks/tpgn.py --dtype bfloat16 --steps 20

Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import common  # noqa: E402
from jaxcap.cli import positive_int  # noqa: E402  (one-line errors for bad sizes)
from jaxcap.models.fields import compute_dtype  # noqa: E402


def contraction_report(d: int, vocab: int, rows: int, steps: int, dtype, iters: int) -> dict:
  """The U_1 contraction and the lexical layer alone, forward + backward, at ``rows`` captions
  per step for ``steps`` steps: analytic multiply-adds, matmul GFLOPs and measured seconds."""
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
    grad = jax.grad(loss, argnums=(0, 1))
    g = jax.jit(grad)
    _, sec, _, _ = common.timed_windows(lambda: g(*args), warmup=1, windows=1, steps=iters)
    report[name] = {"macs_per_word": macs, "gflop_fwd_bwd": round(common.step_flops(grad, *args)[0] / 1e9, 3),
                    "seconds_fwd_bwd": round(sec, 5)}
  a, b = report["U1_contraction"], report["output_layer"]
  report["dominant"] = "U1_contraction" if a["seconds_fwd_bwd"] > b["seconds_fwd_bwd"] else "output_layer"
  report["time_ratio_output_over_U1"] = round(b["seconds_fwd_bwd"] / max(a["seconds_fwd_bwd"], 1e-12), 2)
  return report


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--d", type=positive_int, default=25)
  ap.add_argument("--vocab", type=positive_int, default=9487)
  ap.add_argument("--words", type=positive_int, default=16)
  ap.add_argument("--batch", type=positive_int, default=50, help="images per training step")
  ap.add_argument("--captions", type=positive_int, default=5, help="captions per image")
  ap.add_argument("--steps", type=positive_int, default=5, help="timed calls of each part (after a warm-up)")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = ap.parse_args(argv)
  result = {"benchmark": "tpgn_parts", "device": jax.devices()[0].device_kind, "dtype": args.dtype,
            "d": args.d, "vocab": args.vocab, "captions_per_step": args.batch * args.captions,
            "steps": args.steps}
  result.update(contraction_report(args.d, args.vocab, args.batch * args.captions, args.words + 1,
                                   compute_dtype(args.dtype), args.steps))
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
