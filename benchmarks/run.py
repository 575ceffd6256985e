"""One benchmark entry point for every registered model: training, decoding and SCST steps.

  python benchmarks/run.py                                   # every model, every kind, float32
  python benchmarks/run.py --models transformer,eta --what train --dtype float32,bfloat16 \
      --batch 50,200,800 --profile /tmp/prof
  python benchmarks/run.py --models aat --what beam --eval_batch 100 --beam 3
  python benchmarks/run.py --models mnmt --regions 196 --feat_dim 1024 --vocab 10004 \
      --src_vocab 16806 --src_words 18 --captions 1 --batch 32 --eval_batch 32 --beam 12
  python benchmarks/run.py --out benchmarks/results/h100_2026-11-23.json   # the committed record

COCO shapes by default (36 x 2048 regions with boxes, every fourth box inside the one before it,
vocabulary 9,487, 16 words + EOS, 5 captions per image; translation models get a 16-token
source of the same vocabulary size unless ``--src_words`` / ``--src_vocab`` say otherwise).
Each model is the paper-sized one: a model's field defaults are its paper's settings,
so ``{"name": model, "dtype": dtype}`` is its whole config (no ml_collections needed);
``--set`` overrides fields (e.g. ``--set modalities=text`` for the text-only NMT baseline).
Inputs are random and already on the device, so the numbers are the step itself
(``benchmarks/input_pipeline.py`` measures the loader and the whole training loop).

Rows (one per model x what x dtype x batch):
- ``train``: one cross-entropy step (``jaxcap.training.steps.train_step``: forward, backward,
  Adam) on ``--batch`` images x ``--captions`` captions; images/s = batch / step time.
- ``greedy`` / ``beam`` / ``sample``: ``jaxcap.decoding.greedy`` / ``beam_search`` (``--beam``) /
  ``sample`` (``--samples`` per image) on ``--eval_batch`` images.
- ``scst``: one self-critical step as the trainer runs it (``--samples`` samples + the greedy
  baseline on the device, the CIDEr-D reward, the gradient step on the device), one row per
  ``--reward``: ``device`` (one jitted step, reward in jax.numpy) or ``host`` (reward in NumPy
  between two jitted halves; ``reward_share`` is the host reward's share of the step), and per
  ``--fused_decode``: ``off`` (the samples and the greedy captions decoded apart, two encoder
  passes and two loops) or ``on`` (one of each: ``config.scst.fused_decode``; the row records
  ``fused_decode``).
- ``scst_sample`` / ``scst_reward`` / ``scst_grad`` (only when named; ``scst_split`` names all
  three): the device-reward SCST step's parts, each jitted and timed on its own: the samples
  and greedy captions (per ``--fused_decode``), their device CIDEr-D rewards and advantages,
  the gradient pass and the Adam update.

Each row: compile seconds (lowering + XLA compilation; for ``scst``, its first step, which
compiles the sampler and the gradient step); the median step time of ``--windows`` timed
windows of ``--steps`` steps after ``--warmup`` untimed ones, and their spread
((max - min) / median); images/s; model FLOPs per image; TFLOP/s; MFU against the device's
dense peak (a table of known accelerators: bfloat16, or TF32 for float32 at XLA's default matmul
precision; ``--peak_tflops``; none for CPUs); the compiled
program's memory (XLA's memory analysis: arguments + outputs + temporaries) and the device's
peak bytes in use so far. ``--profile DIR`` traces 3 more steps of each row under DIR and adds
``profile`` to the row: how busy the device was, the kernel count and the top kernels by time,
and the kernel time by part of the model (attention, dropout masks, layer norm, feed-forward,
embedding, output logits, loss, optimizer) and by module scope, forward and backward, read
from each kernel's HLO instruction and its name stack in the compiled program (a CPU trace has
no device plane: the row says so). ``--dropout 0`` and ``--prng rbg`` /
``unsafe_rbg`` measure what the dropout masks and their random numbers cost (train.py's
``config.prng_impl`` makes the same choice for a run), ``--dropout_bits 16`` / ``8`` masks from
fewer random bits (``config.dropout_bits``); ``--embed table`` restores flax's
embedding (the table cast before the gather) to measure ``layers.Embed`` against it.

FLOPs: the matrix-multiply FLOPs of the step's jaxpr (``dot_general`` and convolutions,
2 x M x N x K), with ``scan`` bodies counted ``length`` times. XLA's cost analysis counts a loop
body once (a scanned decoder or beam search would be undercounted 17-fold), and on GPUs it
counts the compiled module's library matmuls as 0; its lowered-HLO count (all ops, loop bodies
once) is also in the JSON as ``hlo_gflop_per_image`` for comparison.

Writes one JSON file (``--out``; default ``benchmarks/results/<device>_<date>.json``) with the
device, jax / jaxlib / CUDA versions, date, git commit, the arguments and every row; prints a
table as the rows finish. Needs only jax, flax, optax and numpy (runs on a bare GPU image).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, "benchmarks"))

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import common  # noqa: E402
from jaxcap import atomic  # noqa: E402
from jaxcap.data import batch as batch_lib  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)
from jaxcap.training.dropout import DROPOUT_BITS  # noqa: E402

WHATS = ("train", "greedy", "beam", "sample", "scst")
SCST_PARTS = ("scst_sample", "scst_reward", "scst_grad")  # rows only when --what names them


# ----------------------------------------------------------------------------------------------
# Memory


def device_peak_bytes():
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001 - CPU backends may not implement it
    stats = {}
  return stats.get("peak_bytes_in_use")


def compiled_bytes(compiled):
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001
    return None
  if m is None:
    return None
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
  return int(sum(getattr(m, f, 0) or 0 for f in fields) - (getattr(m, "alias_size_in_bytes", 0) or 0))


# ----------------------------------------------------------------------------------------------
# The benchmarked steps


def _model(name, dtype, args, info):
  from jaxcap.models import fields, registry
  cfg = common.model_config(name, dtype, args)
  schema = fields.schema(registry.get(name))
  cfg.update({k: v for k, v in common.parse_overrides(args.set).items() if k in schema})
  return registry.build(cfg, info)


def _sig(x: float, digits: int = 6) -> float:
  """``x`` to ``digits`` significant digits (tiny smoke-test sizes must not round to 0)."""
  return float(f"{x:.{digits}g}")


def _init_params(model, batch, repl):
  from jaxcap.models.base import shift_right
  return jax.jit(lambda r, bt: model.init(r, bt, shift_right(bt["captions"])),
                 out_shardings=repl)(jax.random.PRNGKey(1), batch)


def bench_train(model, batch, args, mesh) -> dict:
  """``{"run", "flops", "compiled", "compile_s"}`` of one cross-entropy step."""
  from jaxcap.training import dropout, parallel, steps
  repl = parallel.replicated(mesh)
  params = _init_params(model, batch, repl)
  tx = optax.adam(1e-4, b1=0.9, b2=0.98, eps=1e-9)
  if args.optimizer == "flat_adam":  # one vector for all parameters: a few large update kernels
    tx = optax.flatten(tx)            # instead of one or more per parameter array
  state = steps.create_state(params, tx, jax.random.PRNGKey(2))
  step = dropout.with_dropout_bits(functools.partial(steps.train_step, model=model, tx=tx),
                                   args.dropout_bits)
  t0 = time.perf_counter()
  lowered = jax.jit(step, donate_argnums=0).lower(state, batch)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  flops = common.step_flops(step, state, batch, lowered=lowered)
  holder = {"state": state}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    return metrics

  return {"run": run, "flops": flops, "compiled": compiled, "compile_s": compile_s}


def bench_decode(model, batch, args, mesh, method) -> dict:
  """``{"run", "flops", "compiled", "compile_s"}`` of one greedy / beam / sample call."""
  from jaxcap import decoding
  from jaxcap.training import parallel
  params = _init_params(model, batch, parallel.replicated(mesh))
  dec = {k: v for k, v in batch.items() if k not in ("captions",)}
  key = jax.random.PRNGKey(3)
  if method == "greedy":
    fn = lambda p, b, k: decoding.greedy(model, p, b, max_len=args.words).tokens  # noqa: E731
  elif method == "beam":
    fn = lambda p, b, k: decoding.beam_search(model, p, b, beam_size=args.beam, max_len=args.words).tokens  # noqa: E731
  else:
    fn = lambda p, b, k: decoding.sample(model, p, b, k, max_len=args.words,  # noqa: E731
                                         num_samples=args.samples).tokens
  t0 = time.perf_counter()
  lowered = jax.jit(fn).lower(params, dec, key)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  # Random weights never end a caption: the early-stopping loop runs all max_len steps.
  flops = common.step_flops(fn, params, dec, key, lowered=lowered, while_trips=args.words)
  return {"run": lambda: compiled(params, dec, key), "flops": flops, "compiled": compiled,
          "compile_s": compile_s}


def random_refs(rng: np.random.Generator, images: int, per_image: int, vocab: int, max_words: int):
  """``[images, per_image, max_words + 1]`` reference ids ending in EOS (2) and PAD (0), of
  8 to ``max_words`` words (the reward's time depends on the lengths, not on the ids)."""
  from jaxcap.data.vocab import EOS, PAD
  out = np.full((images, per_image, max_words + 1), PAD, np.int32)
  lengths = rng.integers(min(8, max_words), max_words + 1, size=(images, per_image))
  words = rng.integers(4, vocab, size=out.shape, dtype=np.int32)
  pos = np.arange(max_words + 1)
  out = np.where(pos < lengths[..., None], words, out)
  out = np.where(pos == lengths[..., None], EOS, out)
  return out


class ScstRunner:
  """One SCST step as :func:`jaxcap.training.scst.make_scst_step` runs it, timed part by part:
  (1) on the device, ``samples`` sampled captions per image plus the greedy baseline caption;
  (2) on the host, the training-mode CIDEr-D reward of every sample and of the greedy caption
  against the image's 5 references, with document frequencies of a ``train_images`` random
  reference set (the role of COCO's training references); (3) on the device, the gradient of
  the SCST loss over the ``B * samples`` samples and the Adam update. The same code as the
  trainer's (``scst.sample_with_baseline``, ``scst.advantages`` with ``CiderD.score``,
  ``scst.scst_grad_step``).

  ``runner()`` -> ``(metrics to block on, {"sample": s, "reward": s, "grad": s})``;
  ``runner.flops`` = ``(matmul FLOPs, lowered-HLO FLOPs)`` of the two device parts.
  """

  def __init__(self, model, batch, mesh, *, samples: int, max_len: int, vocab: int, train_images: int,
               baseline: str = "greedy", seed: int = 0, reward: str = "host", fused_decode: bool = False):
    from jaxcap.evaluation import cider, cider_device
    from jaxcap.training import parallel, scst, steps

    rng = np.random.default_rng(seed)
    train_refs = random_refs(rng, train_images, 5, vocab, max_len - 1)
    scorer = cider.CiderD(vocab, doc_freq=cider.build_doc_freq(train_refs, vocab, count_eos=True),
                          count_eos=True)
    refs = scorer.prepare_refs(train_refs)
    self.baseline = baseline
    b = batch["feats"].shape[0]
    repl, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
    batch = dict(batch, image_index=jnp.asarray(rng.integers(0, train_images, size=b), jnp.int32))
    self.batch = batch = jax.device_put(batch, data)
    params = _init_params(model, batch, repl)
    tx = optax.adam(1e-5)
    self.state = jax.device_put(steps.create_state(params, tx, jax.random.PRNGKey(2)), repl)
    # The trainer's jitted pieces and shardings, so the state one step returns is reused
    # without recompiling.
    sample_fn = functools.partial(scst.sample_with_baseline, model, max_len=max_len, num_samples=samples,
                                  baseline=baseline, fused_decode=fused_decode)
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
    f1 = common.step_flops(sample_fn, params, batch, key, while_trips=max_len)  # as bench_decode
    f2 = common.step_flops(grad_fn, self.state, batch, fake_samples, fake_adv)
    self.flops = (f1[0] + f2[0], f1[1] + f2[1])
    self.calls = 0
    self.device_jit = None
    if reward == "device":  # the trainer's one-jit step (scst.reward = "device")
      refs_IxRxL, nref_I = cider_device.pad_references(train_refs, max_len)
      self.reward_arrays = jax.device_put(scst.DeviceReward(
          cider_device.table_from_doc_freq(scorer.doc_freq), refs_IxRxL, nref_I), repl)
      reward_options = dict(baseline=baseline, cider_weight=1.0, vocab_size=vocab,
                            options=cider_device.Options())
      # The step's second part alone (--what scst_reward): the device reward and advantages.
      self.advantages_fn = functools.partial(scst.device_advantages, **reward_options)
      fn = functools.partial(scst.scst_device_step, model=model, max_len=max_len, num_samples=samples,
                             fused_decode=fused_decode, **reward_options)
      self.device_jit = jax.jit(fn, in_shardings=(repl, data, repl), out_shardings=(repl, repl),
                                donate_argnums=0)

  def __call__(self):
    from jaxcap.training import scst
    if self.device_jit is not None:
      t = time.perf_counter()
      self.state, metrics = self.device_jit(self.state, self.batch, self.reward_arrays)
      jax.block_until_ready(metrics)
      return metrics, {"step": time.perf_counter() - t}
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


def _scst_runner(model, batch, args, mesh, reward: str, fused_decode: bool) -> ScstRunner:
  return ScstRunner(model, batch, mesh, samples=args.samples, max_len=args.words + 1, vocab=args.vocab,
                    train_images=args.train_images, reward=reward, fused_decode=fused_decode)


def bench_scst(model, batch, args, mesh, reward: str = "host", fused_decode: bool = False) -> dict:
  """``{"run", "flops", "share"}`` of one SCST step; ``share()``: the host reward's median
  share of the timed steps (the first call, which compiles, and the warm-up are left out;
  None for the device reward, which is not timed apart from the step)."""
  runner = _scst_runner(model, batch, args, mesh, reward, fused_decode)
  parts = []

  def run():
    out, times = runner()
    parts.append(times)
    return out

  def share():
    if reward == "device":
      return None
    timed = parts[1 + args.warmup:1 + args.warmup + args.windows * args.steps]
    med = {k: float(np.median([p[k] for p in timed])) for k in timed[0]}
    return med["reward"] / max(sum(med.values()), 1e-12)

  return {"run": run, "flops": runner.flops, "compiled": None, "share": share}


def bench_scst_part(model, batch, args, mesh, part: str, fused_decode: bool = False) -> dict:
  """``{"run", "flops", "compiled", "compile_s"}`` of one part of the device-reward SCST step,
  jitted on its own (XLA compiles the whole step as one program, so the parts need not add up
  to it exactly): ``scst_sample`` the samples and the greedy captions (``--fused_decode``),
  ``scst_reward`` their device CIDEr-D rewards and advantages, ``scst_grad`` the gradient
  pass and the Adam update."""
  runner = _scst_runner(model, batch, args, mesh, "device", fused_decode)
  key = jax.random.PRNGKey(3)
  fn, inputs = runner.sample_jit, (runner.state.params, runner.batch, key)
  if part != "scst_sample":
    samples, greedy = runner.sample_jit(*inputs)
    fn, inputs = jax.jit(runner.advantages_fn), (runner.batch, samples, greedy, runner.reward_arrays)
  if part == "scst_grad":
    adv = fn(*inputs)[0]
    fn, inputs = runner.grad_jit, (runner.state, runner.batch, samples, adv)
  t0 = time.perf_counter()
  lowered = fn.lower(*inputs)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  flops = common.step_flops(fn, *inputs, lowered=lowered)
  holder = {"inputs": inputs}

  def run():
    out = compiled(*holder["inputs"])
    if part == "scst_grad":  # the state is donated: the next call updates the one returned
      holder["inputs"] = (out[0],) + holder["inputs"][1:]
    return out

  return {"run": run, "flops": flops, "compiled": compiled, "compile_s": compile_s}


def profile(run, trace_dir: str, compiled=None) -> dict:
  """Traces 3 calls of ``run`` under ``trace_dir``: :func:`common.trace_summary` of them (with
  the kernel time attributed to parts of the model when the ``compiled`` program is given)."""
  with jax.profiler.trace(trace_dir):
    out = None
    for _ in range(3):
      out = run()
    jax.block_until_ready(out)
  return common.trace_summary(trace_dir, hlo_text=compiled.as_text() if compiled is not None else None)


# ----------------------------------------------------------------------------------------------


def environment() -> dict:
  env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "device_kind": jax.devices()[0].device_kind, "platform": jax.devices()[0].platform,
         "device_count": jax.device_count(), "process_count": jax.process_count(),
         "jax": jax.__version__, "python": platform.python_version()}
  try:
    import jaxlib
    env["jaxlib"] = getattr(jaxlib, "__version__", None) or jaxlib.version.__version__
  except Exception:  # noqa: BLE001
    env["jaxlib"] = None
  try:
    import flax
    env["flax"] = flax.__version__
  except Exception:  # noqa: BLE001
    pass
  env["cuda"] = _cuda_versions()
  env.update(_host_cpu())
  try:
    env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    env["git_dirty"] = bool(dirty)
  except Exception:  # noqa: BLE001 - a copy without git
    env["git_commit"] = None
  if os.environ.get("JAXCAP_GIT_COMMIT"):  # the caller knows better (a copied tree's .git can be stale)
    env["git_commit"], env["git_dirty"] = os.environ["JAXCAP_GIT_COMMIT"], None
  # float32 rows run at XLA's default matmul precision (TF32 on Ampere and later GPUs); compile
  # seconds are a cache load where a persistent compilation cache is set.
  for key, flag in (("default_matmul_precision", "jax_default_matmul_precision"),
                    ("compilation_cache_dir", "jax_compilation_cache_dir")):
    env[key] = getattr(jax.config, flag, None) or None
  return env


def _host_cpu() -> dict:
  """The host CPU's model and its widest vector instructions (Linux's /proc/cpuinfo; {}
  elsewhere): CPU rows of two days compare only on the same kind of host (cpu_side_by_side.py
  timed PyTorch's reference 1.7-1.9x slower on 2026-12-07 than on 12-06 on the same code, with
  nothing in the records to tell the two hosts apart)."""
  try:
    with open("/proc/cpuinfo") as f:
      text = f.read()
  except OSError:
    return {}
  model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
  flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
  isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags]
  return {"cpu_model": model, "cpu_isa": isa}


def _cuda_versions():
  if jax.devices()[0].platform != "gpu":
    return None
  try:
    from jax._src.lib import cuda_versions  # private, but the only place that has them
    if cuda_versions is None:
      return None
    return {"cuda_runtime": cuda_versions.cuda_runtime_get_version(),
            "cudnn": cuda_versions.cudnn_get_version(),
            "driver": cuda_versions.cuda_driver_get_version()}
  except Exception:  # noqa: BLE001
    return None


def default_out(env) -> str:
  name = re.sub(r"[^a-z0-9]+", "_", env["device_kind"].lower()).strip("_") or env["platform"]
  return os.path.join(_REPO, "benchmarks", "results", f"{name}_{env['date'][:10]}.json")


def parse_args(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="all", help="comma-separated registered model names (all: every "
                 "trainable one)")
  p.add_argument("--what", default=",".join(WHATS), help=f"comma-separated subset of {','.join(WHATS)} "
                 f"and {','.join(SCST_PARTS)} (scst_split: all three)")
  p.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16")
  p.add_argument("--batch", default="50", help="images per train / SCST step; comma-separated to sweep")
  p.add_argument("--eval_batch", default="100", help="images per greedy / beam / sample call; "
                 "comma-separated")
  p.add_argument("--beam", type=positive_int, default=3)
  p.add_argument("--samples", type=positive_int, default=5, help="sampled captions per image (sample, scst)")
  p.add_argument("--train_images", type=positive_int, default=5000, help="images behind the SCST reward's "
                 "document frequencies")
  p.add_argument("--fused_decode", default="off", help="scst, scst_sample: comma-separated subset of "
                 "off,on (config.scst.fused_decode: the samples and the greedy baseline from one encoder "
                 "pass and one loop; one row each)")
  p.add_argument("--reward", default="host", help="scst: comma-separated subset of device,host "
                 "(where the CIDEr-D reward is computed; one row each; host keeps earlier rows comparable)")
  p.add_argument("--steps", type=positive_int, default=10, help="steps per timed window")
  p.add_argument("--windows", type=positive_int, default=3, help="timed windows; the median is reported")
  p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps after compilation")
  p.add_argument("--peak_tflops", type=float, default=None)
  p.add_argument("--prng", default=None, choices=("threefry2x32", "rbg", "unsafe_rbg"),
                 help="jax_default_prng_impl (dropout masks, sampling); default JAX's")
  p.add_argument("--dropout_bits", type=int, default=32, choices=DROPOUT_BITS,
                 help="train rows: random bits per dropout-mask element (train.py's config.dropout_bits)")
  p.add_argument("--optimizer", default="adam", choices=("adam", "flat_adam"),
                 help="train rows: optax.adam per parameter array (the trainer's) or optax.flatten(adam) "
                 "over one concatenated vector (fewer, larger kernels; same arithmetic)")
  p.add_argument("--embed", default="gather", choices=("gather", "table"),
                 help="word embeddings below float32: gather float32 rows, then cast (layers.Embed's) or "
                 "cast the whole table, then gather (flax nn.Embed's; its gradient is a low-precision "
                 "scatter-add)")
  p.add_argument("--profile", default="", help="trace 3 more steps of each row under this directory; "
                 "the row gets the device's busy share, kernel count and top kernels")
  p.add_argument("--set", default="", help="model config overrides for every model that has the field, "
                 "e.g. dim=64,num_heads=2 or modalities=text")
  p.add_argument("--out", default="", help="JSON file (default benchmarks/results/<device>_<date>.json)")
  common.add_shape_args(p)
  common.add_model_args(p)
  args = p.parse_args(argv)
  bad = [i for i in filter(None, args.set.split(",")) if "=" not in i]
  if bad:
    p.error(f"--set: expected key=value items, got {','.join(bad)}")
  bad = [r for r in args.reward.split(",") if r not in ("device", "host")]
  if bad:
    p.error(f"--reward: unknown {','.join(bad)}; expected a subset of device,host")
  bad = [f for f in args.fused_decode.split(",") if f not in ("off", "on")]
  if bad:
    p.error(f"--fused_decode: unknown {','.join(bad)}; expected a subset of off,on")
  args.what = args.what.replace("scst_split", ",".join(SCST_PARTS))
  bad = [w for w in args.what.split(",") if w not in WHATS + SCST_PARTS]
  if bad:
    p.error(f"--what: unknown {','.join(bad)}; expected a subset of {','.join(WHATS + SCST_PARTS)} "
            f"(or scst_split)")
  common.check_dtypes(p, "--dtype", args.dtype)
  args.models = ",".join(common.check_models(p, "--models", args.models))
  from jaxcap.models import fields, registry
  known = set().union(*(fields.schema(registry.get(m)) for m in args.models.split(",")))
  unknown = sorted(set(common.parse_overrides(args.set)) - known)
  if unknown:
    p.error(f"--set: {unknown[0]} is a field of none of the models {args.models}; expected one "
            f"of {','.join(sorted(known))}")
  common.positive_ints(p, "--batch", args.batch)
  common.positive_ints(p, "--eval_batch", args.eval_batch)
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.prng:
    jax.config.update("jax_default_prng_impl", args.prng)
  if args.embed == "table":  # every model's word embedding back to flax's cast-then-gather
    import flax.linen as nn
    from jaxcap.models import layers
    layers.Embed.__call__ = nn.Embed.__call__
  from jaxcap.training import parallel

  names = args.models.split(",")  # checked by parse_args: registered, trainable names
  batches = [int(b) for b in args.batch.split(",")]  # positive, checked by parse_args
  eval_batches = [int(b) for b in args.eval_batch.split(",")]
  rewards = args.reward.split(",")
  fuseds = [f == "on" for f in args.fused_decode.split(",")]
  common.check_batches(batches + eval_batches, jax.device_count())
  mesh = parallel.make_mesh()
  info = common.data_info(args)
  env = environment()
  out_path = args.out or default_out(env)
  src_words, src_vocab = args.src_words or args.words, args.src_vocab or args.vocab
  record = {"benchmark": "benchmarks/run.py", "argv": sys.argv[1:] if argv is None else list(argv),
            "environment": env, "overrides": args.set,
            "shapes": {"regions": args.regions, "feat_dim": args.feat_dim, "vocab": args.vocab,
                       "words": args.words, "captions_per_image": args.captions, "src_words": src_words,
                       "src_vocab": src_vocab},
            "rows": []}
  print(f"devices: {env['device_count']} x {env['device_kind']}; jax {env['jax']}; commit "
        f"{(env.get('git_commit') or '?')[:10]}", flush=True)
  print(f"{'model':>18} {'what':>6} {'dtype':>8} {'batch':>5} {'compile s':>9} {'step ms':>9} {'images/s':>9} "
        f"{'GFLOP/img':>9} {'TFLOP/s':>8} {'MFU':>6} {'spread':>6} {'mem MB':>8}", flush=True)
  for name in names:
    for dtype in args.dtype.split(","):
      model = _model(name, dtype, args, info)
      for what in args.what.split(","):
        for b, reward, fused in [
            (b, r, f) for b in (eval_batches if what in ("greedy", "beam", "sample") else batches)
            for r in (rewards if what == "scst" else ["device"] if what == "scst_reward" else [None])
            for f in (fuseds if what in ("scst", "scst_sample") else [False])]:
          batch = batch_lib.random(jax.random.PRNGKey(0), b, args.captions, args.regions, args.feat_dim,
                                    args.vocab, args.words + 1, src_len=src_words, src_vocab=src_vocab)
          batch = jax.device_put(batch, parallel.batch_sharding(mesh))
          # what makes this row differ from the model's paper-sized default, kept per row (records
          # of several runs are merged) and on a failed row too: a failed variant must not read as
          # the plain step failing
          ident = {"model": name, "what": what, "dtype": dtype, "batch": b,
                   "beam": args.beam if what == "beam" else None,
                   "samples": args.samples if what in ("sample", "scst", *SCST_PARTS) else None, "reward": reward,
                   "fused_decode": True if fused else None,
                   "prng": args.prng, "dropout": args.dropout,
                   "dropout_bits": args.dropout_bits if args.dropout_bits != 32 else None,
                   "optimizer": args.optimizer if args.optimizer != "adam" else None,
                   "layers": args.layers or None, "embed": args.embed if args.embed != "gather" else None,
                   "overrides": args.set or None}
          try:
            if what == "train":
              bench = bench_train(model, batch, args, mesh)
            elif what == "scst":
              bench = bench_scst(model, batch, args, mesh, reward, fused)
            elif what in SCST_PARTS:
              bench = bench_scst_part(model, batch, args, mesh, what, fused)
            else:
              bench = bench_decode(model, batch, args, mesh, what)
            first_s, dt, spread, times = common.timed_windows(bench["run"], warmup=args.warmup,
                                                              windows=args.windows, steps=args.steps)
          except Exception as e:  # noqa: BLE001 - e.g. out of memory at a large batch: the other rows go on
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            print(f"{name:>18} {what:>6} {dtype:>8} {b:>5} failed: {msg}", flush=True)
            record["rows"].append(dict(ident, error=msg))
            atomic.write_json(out_path, record)
            continue
          compile_s = bench.get("compile_s", first_s)  # scst: its first step compiles
          share = bench["share"]() if "share" in bench else None
          matmul, hlo = bench["flops"]
          tflops = matmul / dt / 1e12
          peak = common.peak_tflops(dtype, args.peak_tflops)
          mfu = tflops / (peak * jax.device_count()) if peak else None
          compiled = bench["compiled"]
          mem = compiled_bytes(compiled) if compiled is not None else None
          kernels = common.program_kernels(compiled.as_text()) if compiled is not None else {}
          peak_mem = device_peak_bytes()
          row = {**ident,
                 "compile_s": round(compile_s, 2), "step_ms": round(dt * 1e3, 3),
                 "window_ms": [round(t * 1e3, 3) for t in times], "spread": round(spread, 4),
                 "images_per_s": round(b / dt, 2), "gflop_per_image": _sig(matmul / b / 1e9),
                 "hlo_gflop_per_image": _sig(hlo / b / 1e9) if np.isfinite(hlo) else None,
                 "tflops": _sig(tflops), "mfu": round(mfu, 4) if mfu is not None else None,
                 "compiled_mb": round(mem / 2**20, 1) if mem is not None else None,
                 "device_peak_mb": round(peak_mem / 2**20, 1) if peak_mem is not None else None,
                 "reward_share": round(share, 4) if share is not None else None,
                 "program_kernels": kernels.get("kernels"), "program_converts": kernels.get("converts")}
          mfu_s = f"{100 * mfu:5.1f}%" if mfu is not None else "   n/a"
          print(f"{name:>18} {what:>6} {dtype:>8} {b:>5} {compile_s:9.1f} {dt * 1e3:9.2f} {b / dt:9.1f} "
                f"{matmul / b / 1e9:9.3f} {tflops:8.3f} {mfu_s:>6} {100 * spread:5.1f}% "
                f"{row['compiled_mb'] if mem is not None else float('nan'):8.1f}"
                + (f"  {reward} reward" if reward else "") + (", fused decode" if fused else "")
                + (f", {100 * share:.0f}% of the step" if share is not None else ""), flush=True)
          if args.profile:
            try:
              row["profile"] = profile(bench["run"], os.path.join(args.profile, f"{name}_{what}_{dtype}_{b}" + ("_fused" if fused else "")),
                                       bench["compiled"])
            except Exception as e:  # noqa: BLE001 - a profiler that cannot start must not lose the row
              row["profile"] = {"note": f"profile failed: {type(e).__name__}: {str(e)[:200]}"}
            print(common.format_trace(row["profile"]), flush=True)
          record["rows"].append(row)
          atomic.write_json(out_path, record)  # after every row: a crash keeps the rows so far
  print(f"wrote {out_path}")
  return record


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
