"""Self-critical training step time in images/s, split into its three parts.

  python benchmarks/scst_step.py [--model transformer] [--batch 50] [--samples 5] [--steps 3]

One SCST step (:mod:`jaxcap.training.scst`) at COCO shapes by default (36 x 2048 regions,
vocabulary 9,487, 16 words, the paper-sized model): (1) on the device, ``n`` sampled captions
per image plus the greedy baseline caption; (2) on the host, the training-mode CIDEr-D reward of
every sample and of the greedy caption against the image's 5 references, with document
frequencies of a 5,000-image random reference set (the role of COCO's training references);
(3) on the device, the gradient of the SCST loss over the ``B * n`` samples and the Adam update.
Inputs and references are random token ids (the time does not depend on their values, only on
the caption lengths, which are drawn uniformly from 8-16 words). The step is the same code
the trainer runs (``scst.sample_with_baseline``, ``scst.advantages`` with ``CiderD.score``,
``scst.scst_grad_step``), timed part by part.
Needs jax, flax and optax only (it runs on a bare GPU image).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, "benchmarks"))

import numpy as np
import jax
import jax.numpy as jnp
import optax

import common  # noqa: E402
from common import add_model_args, add_shape_args, check_batches, data_info, make_batch, model_config  # noqa: E402
from jaxcap.cli import positive_int  # noqa: E402  (one-line errors for bad sizes)


def random_refs(rng: np.random.Generator, images: int, per_image: int, vocab: int, max_words: int):
  """``[images, per_image, max_words + 1]`` reference ids ending in EOS (2) and PAD (0)."""
  from jaxcap.data.vocab import EOS, PAD
  out = np.full((images, per_image, max_words + 1), PAD, np.int32)
  lengths = rng.integers(min(8, max_words), max_words + 1, size=(images, per_image))
  words = rng.integers(4, vocab, size=out.shape, dtype=np.int32)
  pos = np.arange(max_words + 1)
  out = np.where(pos < lengths[..., None], words, out)
  out = np.where(pos == lengths[..., None], EOS, out)
  return out


class ScstRunner:
  """One SCST step as :func:`jaxcap.training.scst.make_scst_step` runs it, timed part by part.

  ``runner()`` -> ``(metrics to block on, {"sample": s, "reward": s, "grad": s})``;
  ``runner.flops`` = ``(matmul FLOPs, lowered-HLO FLOPs)`` of the two device parts.
  """

  def __init__(self, model, batch, mesh, *, samples: int, baseline: str, max_len: int, vocab: int,
               train_images: int, seed: int = 0):
    from jaxcap.evaluation import cider
    from jaxcap.models.base import shift_right
    from jaxcap.training import parallel, scst, steps

    rng = np.random.default_rng(seed)
    train_refs = random_refs(rng, train_images, 5, vocab, max_len - 1)
    t0 = time.perf_counter()
    table = cider.build_doc_freq(train_refs, vocab, count_eos=True)
    scorer = cider.CiderD(vocab, doc_freq=table, count_eos=True)
    refs = scorer.prepare_refs(train_refs)
    self.prep_s = time.perf_counter() - t0
    self.baseline = baseline
    b = batch["feats"].shape[0]
    repl, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
    batch = dict(batch, image_index=jnp.asarray(rng.integers(0, train_images, size=b), jnp.int32))
    self.batch = batch = jax.device_put(batch, data)
    params = jax.jit(lambda r, bt: model.init(r, bt, shift_right(bt["captions"])),
                     out_shardings=repl)(jax.random.PRNGKey(1), batch)
    self.num_params = sum(x.size for x in jax.tree.leaves(params))
    tx = optax.adam(1e-5)
    self.state = jax.device_put(steps.create_state(params, tx, jax.random.PRNGKey(2)), repl)
    # The trainer's jitted pieces and shardings, so the state one step returns is reused
    # without recompiling.
    sample_fn = functools.partial(scst.sample_with_baseline, model, max_len=max_len, num_samples=samples,
                                  baseline=baseline)
    grad_fn = functools.partial(scst.scst_grad_step, model=model, tx=tx)
    self.sample_jit = jax.jit(sample_fn, in_shardings=(repl, data, None), out_shardings=(data, data))
    self.grad_jit = jax.jit(grad_fn, in_shardings=(repl, data, data, data), out_shardings=(repl, repl),
                            donate_argnums=0)
    self.reward_fn = lambda tokens, image: scorer.score(tokens, image, refs)  # noqa: E731
    self.index_h = np.asarray(batch["image_index"])
    self.data = data
    key = jax.random.PRNGKey(3)
    samples_shape = jax.eval_shape(sample_fn, params, batch, key)[0]
    fake_samples = jnp.zeros(samples_shape.shape, jnp.int32)
    fake_adv = jnp.zeros(samples_shape.shape[:2], jnp.float32)
    f1 = common.step_flops(sample_fn, params, batch, key)
    f2 = common.step_flops(grad_fn, self.state, batch, fake_samples, fake_adv)
    self.flops = (f1[0] + f2[0], f1[1] + f2[1])
    self.calls = 0

  def __call__(self):
    from jaxcap.training import scst
    key = jax.random.PRNGKey(10 + self.calls)
    self.calls += 1
    times = {}
    t = time.perf_counter()
    samples, greedy = jax.block_until_ready(self.sample_jit(self.state.params, self.batch, key))
    times["sample"] = time.perf_counter() - t
    t = time.perf_counter()
    samples_h = np.asarray(samples)
    greedy_h = np.asarray(greedy) if greedy is not None else None
    adv, _, _ = scst.advantages(self.reward_fn, samples_h, self.index_h, greedy_h, self.baseline)
    times["reward"] = time.perf_counter() - t
    t = time.perf_counter()
    self.state, metrics = self.grad_jit(self.state, self.batch, jax.device_put(samples_h, self.data),
                                        jax.device_put(adv, self.data))
    jax.block_until_ready(metrics)
    times["grad"] = time.perf_counter() - t
    return metrics, times


def make_scst_runner(model, batch, mesh, **kw) -> ScstRunner:
  return ScstRunner(model, batch, mesh, **kw)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="transformer")
  p.add_argument("--batch", type=positive_int, default=50, help="images per step")
  p.add_argument("--samples", type=positive_int, default=5, help="sampled captions per image")
  p.add_argument("--baseline", default="greedy", choices=("greedy", "mean"))
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--steps", type=positive_int, default=3)
  add_shape_args(p)
  p.add_argument("--train_images", type=positive_int, default=5000, help="images behind the document frequencies")
  add_model_args(p)
  args = p.parse_args()
  common.check_models(p, "--model", args.model, many=False)

  from jaxcap.models import registry
  from jaxcap.training import parallel

  mesh = parallel.make_mesh()
  check_batches([args.batch], jax.device_count())
  model = registry.build(model_config(args.model, args.dtype, args), data_info(args))
  b, n = args.batch, args.samples
  batch = make_batch(jax.random.PRNGKey(0), b, 5, args.regions, args.feat_dim, args.vocab, args.words + 1)
  runner = ScstRunner(model, batch, mesh, samples=n, baseline=args.baseline, max_len=args.words + 1,
                      vocab=args.vocab, train_images=args.train_images)
  t0 = time.perf_counter()
  runner()  # compiles
  compile_s = time.perf_counter() - t0
  runs = [runner()[1] for _ in range(args.steps)]
  med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
  total = sum(med.values())
  print(f"device: {jax.devices()[0].platform} ({jax.device_count()} x {jax.devices()[0].device_kind}), "
        f"jax {jax.__version__}")
  print(f"model: {args.model} ({runner.num_params / 1e6:.1f}M parameters, {args.dtype}), batch {b} images x "
        f"{n} samples, baseline {args.baseline}, {args.regions}x{args.feat_dim} regions, V={args.vocab}, "
        f"{args.words} words; reward tables for {args.train_images} images {runner.prep_s:.1f}s; "
        f"first step (compile) {compile_s:.1f}s")
  for k, v in med.items():
    print(f"  {k:>7}: {v * 1e3:9.1f} ms  ({100 * v / total:4.1f}%)")
  print(f"  {'step':>7}: {total * 1e3:9.1f} ms  -> {b / total:.1f} images/s, "
        f"reward {b * (n + (args.baseline == 'greedy')) / med['reward']:,.0f} captions/s "
        f"(median of {args.steps})")


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
