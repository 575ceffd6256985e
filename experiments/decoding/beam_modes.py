"""Compares the beam-search modes of a trained run on the log-probability of their top-1.

  python experiments/decoding/beam_modes.py --workdir runs/transformer_synthetic --beam_size 3 [--split test]

Decodes the split in every ``decoding.BEAM_MODES`` (``"live"``: K live hypotheses, flax / t5x;
``"self_critical"``: self-critical.pytorch; ``"in_slots"``: the M² authors' search) and prints,
per image, how often live or self_critical finds the more probable top-1 caption, and per mode
the mean top-1 log-probability and the mean caption length. The CIDEr-D of each mode comes from
``evaluate.py --beam-mode``. (experiments/decoding/results/beam_modes.md, recorded before
``in_slots`` existed, shows the first two.)
"""

import os
import sys

from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from jaxcap.errors import BadInput  # noqa: E402

flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
flags.DEFINE_string("split", "test", "Split to decode.")
flags.DEFINE_integer("beam_size", 3, "K.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS.workdir:
    raise BadInput("--workdir: missing; expected a run directory written by train.py")
  import jax
  import numpy as np
  import jaxcap
  from jaxcap import decoding
  from jaxcap.data import pipeline
  run = jaxcap.load(FLAGS.workdir)
  config, params = run.config, run.params
  model, max_len = run.model, int(config.decode.max_len)
  fns = {mode: jax.jit(lambda p, b, mode=mode: decoding.beam_search(
      model, p, b, beam_size=FLAGS.beam_size, max_len=max_len, beam_mode=mode))
         for mode in decoding.BEAM_MODES}
  logp = {m: [] for m in fns}
  length = {m: [] for m in fns}
  for batch in pipeline.eval_batches(run.dataset.split(FLAGS.split), config.eval_batch_size,
                                     num_threads=0):
    valid = np.asarray(batch["valid"])
    for mode, fn in fns.items():
      out = fn(params, batch)
      logp[mode].append(np.asarray(out.logprobs[:, 0])[valid])
      length[mode].append(np.asarray(out.lengths[:, 0])[valid])
  live, sc = (np.concatenate(logp[m]) for m in ("live", "self_critical"))
  n = len(live)
  print(f"{FLAGS.workdir} split={FLAGS.split} K={FLAGS.beam_size}: {n} images")
  print(f"  live more probable: {int((live > sc + 1e-4).sum())}, self_critical more probable: "
        f"{int((sc > live + 1e-4).sum())}, equal: {int((abs(live - sc) <= 1e-4).sum())}")
  for m in fns:
    lp, ln = np.concatenate(logp[m]), np.concatenate(length[m])
    print(f"  {m:>13}: mean top-1 log-prob {lp.mean():.4f}, mean length {ln.mean():.2f} tokens")
  print(f"  largest gain of live: {float((live - sc).max()):.3f} nats")


if __name__ == "__main__":
  from jaxcap.cli import run_absl
  run_absl(main)  # bad input: one line, exit 2
