"""Per-device memory of a captioner trained from pixels, parameters and Adam state replicated or
split (FSDP) over the devices, from the compiled programs; images per second when ``--steps``.

  python benchmarks/sharded_memory.py [--backbone vit_b16] [--fields JSON] [--size 224]
      [--model transformer] [--set dim=512,...] [--batch 8,32] [--rules replicated,fsdp]
      [--remat 0,1] [--dtype float32] [--steps 0] [--devices 8] [--min_elements N] [--out record.json]

One model: ``--backbone`` (a jaxcap-extract backbone; ``--fields`` its overrides) feeding
``--model`` at its own (paper) sizes, from ``--size`` px images with COCO's text shapes (vocabulary
9,487, 16 words, 5 captions per image). For each rule x remat x batch the cross-entropy step is
jitted over a ``("data", "model")`` mesh of every device with the train state placed by the rule
(:mod:`jaxcap.training.sharding`) and compiled; recorded per device: the compiled program's
arguments, outputs, temporaries and donated bytes (``memory_analysis``), and the parameters and
optimiser state one device holds (their shard shapes). ``fsdp_over_replicated``: FSDP's
parameter + optimiser bytes per device over the replicated program's (the target: at most
1 / devices + 5 %). Nothing runs unless ``--steps`` > 0 (then: random weights and images, the step
timed ``--steps`` times after its compilation; images per second over all devices).

On a CPU, ``--devices 8`` forces 8 host devices (``XLA_FLAGS``, set before JAX starts): what the
compiler plans for 8 accelerators, not their speed.
"""

from __future__ import annotations

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)
BENCHMARK = "benchmarks/sharded_memory.py"


def _parse(argv):
  from jaxcap import cli
  p = cli.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--backbone", default="vit_b16")
  p.add_argument("--fields", default="", help="the backbone's field overrides (JSON, as jaxcap-extract --fields)")
  p.add_argument("--size", type=cli.positive_int, default=224)
  p.add_argument("--model", default="transformer")
  p.add_argument("--set", default="", help="the captioner's field overrides, e.g. dim=64,num_layers=1")
  p.add_argument("--vocab", type=cli.positive_int, default=9487)
  p.add_argument("--words", type=cli.positive_int, default=16)
  p.add_argument("--captions", type=cli.positive_int, default=5)
  p.add_argument("--batch", default="8,32", help="global images per step, comma-separated")
  p.add_argument("--rules", default="replicated,fsdp")
  p.add_argument("--remat", default="0,1", help="backbone remat off / on, comma-separated 0 / 1")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--steps", type=cli.nonnegative_int, default=0)
  p.add_argument("--devices", type=cli.nonnegative_int, default=0,
                 help="force this many host devices on a CPU (0: the machine's)")
  p.add_argument("--min_elements", type=cli.positive_int, default=None,
                 help="FSDP splits arrays of at least this many elements (default: the rule's, 2**14)")
  p.add_argument("--out", default=None)
  return p, p.parse_args(argv)


def _force_devices(argv) -> None:
  """``--devices N``: N host devices (``XLA_FLAGS``), set before JAX's backend starts."""
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  pre = ArgumentParser(add_help=False)
  pre.add_argument("--devices", default="0")
  known, _ = pre.parse_known_args(argv)
  if known.devices.isdigit() and int(known.devices):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={int(known.devices)}").strip()


def main(argv=None) -> dict:
  _force_devices(sys.argv[1:] if argv is None else argv)  # before anything starts JAX's backend
  p, a = _parse(argv)
  import numpy as np
  import jax
  if a.devices and jax.devices()[0].platform == "cpu" and jax.device_count() != a.devices:
    p.error(f"--devices: {a.devices} host devices asked, JAX started with {jax.device_count()} "
            "(XLA_FLAGS is read once, when JAX's backend starts); expected the flag on the "
            "command line of this script")
  import jax.numpy as jnp
  import ml_collections
  import common
  from run import environment
  from jaxcap.models import pixels
  from jaxcap.training import sharding, steps, optim
  from jaxcap.training.memory import step_memory
  from jaxcap.data import batch as batch_lib

  batches = common.positive_ints(p, "--batch", a.batch)
  rules = [r.strip() for r in a.rules.split(",")]
  if any(r not in sharding.RULES for r in rules):
    p.error(f"--rules: expected names from {','.join(sharding.RULES)}, got {a.rules!r}")
  remats = [r.strip() for r in a.remat.split(",")]
  if any(r not in ("0", "1") for r in remats):
    p.error(f"--remat: expected 0 and / or 1, got {a.remat!r}")
  n_dev = jax.device_count()
  common.check_batches(batches, n_dev)
  overrides = common.parse_overrides(a.set)

  config = ml_collections.ConfigDict({
      "model": {**common.model_config(a.model, a.dtype), **overrides},
      "backbone": {"name": a.backbone, "fields": a.fields, "weights": "", "learning_rate": 3e-5,
                   "freeze_steps": 0, "remat": False, "dtype": a.dtype},
      "schedule": "constant", "learning_rate": 1e-4, "adam_b1": 0.9, "adam_b2": 0.98, "adam_eps": 1e-9,
      "weight_decay": 0.0, "l2": 0.0, "grad_clip_value": 0.1, "grad_clip_norm": 0.0,
      "scst": {"start_step": -1, "start_epoch": -1, "learning_rate": 0.0}})
  info = {"image_size": a.size, "max_len": a.words, "vocab_size": a.vocab, "num_attributes": 1000,
          "src_vocab_size": 0, "src_max_len": 0, "grid": True, "seq_per_img": a.captions,
          "max_attributes": 20, "feature_dim": 0, "global_dim": 0, "max_regions": 0}
  mesh = sharding.make_mesh()
  data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  rows = []
  for remat in remats:
    config.backbone.remat = remat == "1"
    model, minfo = pixels.build_for_run(config, dict(info))
    tx, _ = optim.make_optimizer(config, 1000, frozen_collections=model.frozen_collections)
    one = {k: jnp.asarray(v) for k, v in batch_lib.dummy(minfo, 1).items()}
    tokens = jnp.zeros((1, a.captions, a.words + 1), jnp.int32)

    def fresh(seed=0):
      params = model.init(jax.random.PRNGKey(seed), one, tokens)
      return steps.create_state(params, tx, jax.random.PRNGKey(seed + 1))

    shapes = jax.eval_shape(fresh)
    n_params = int(sum(x.size for x in jax.tree.leaves(shapes.params)))
    for rule in rules:
      specs = sharding.shardings(shapes, mesh, rule, min_elements=a.min_elements or sharding.MIN_ELEMENTS)
      state_abs = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, specs)
      held = {k: sharding.per_device_bytes(getattr(shapes, k), getattr(specs, k)) for k in ("params", "opt_state")}
      step = jax.jit(lambda s, b: steps.train_step(s, b, model=model), in_shardings=(specs, data),
                     out_shardings=(specs, None), donate_argnums=0)
      for b in batches:
        batch_abs = {k: jax.ShapeDtypeStruct((b,) + v.shape[1:], v.dtype, sharding=data)
                     for k, v in batch_lib.zeros(minfo, 1, a.captions).items()}
        t0 = time.perf_counter()
        compiled = step.lower(state_abs, batch_abs).compile()
        compile_s = time.perf_counter() - t0
        mem = step_memory(compiled)
        batch_bytes = sum(int(np.prod(s.sharding.shard_shape(s.shape))) * np.dtype(s.dtype).itemsize
                          for s in batch_abs.values())
        row = {"rule": rule, "remat": remat == "1", "batch": b, "compile_s": round(compile_s, 2),
               "params_bytes_per_device": held["params"], "opt_state_bytes_per_device": held["opt_state"],
               "batch_bytes_per_device": batch_bytes,
               "memory": None if mem is None else dict(mem._asdict(), total=mem.total)}
        if a.steps:
          state = jax.jit(fresh, out_shardings=specs)()
          rng = np.random.default_rng(0)
          host = batch_lib.zeros(minfo, b, a.captions)
          host["pixels"] = rng.integers(0, 256, host["pixels"].shape, dtype=np.uint8)
          host["captions"] = rng.integers(4, a.vocab, host["captions"].shape, dtype=np.int32)
          host["valid"][:] = True
          dev = jax.device_put(host, data)
          state, m = compiled(state, dev)
          jax.block_until_ready(m)
          t0 = time.perf_counter()
          for _ in range(a.steps):
            state, m = compiled(state, dev)
          jax.block_until_ready(m)
          dt = (time.perf_counter() - t0) / a.steps
          row.update(step_ms=round(dt * 1e3, 2), images_per_s=round(b / dt, 1))
          del state
        rows.append(row)
        print(json.dumps(row), flush=True)
  # FSDP over replicated, per device: the parameters + optimiser state from their shard shapes,
  # and from the compiled program (its arguments less the batch's shard: the state it takes in).
  ratios, compiled_ratios = {}, {}
  for r in rows:
    if r["rule"] == "fsdp":
      ref = next((q for q in rows if q["rule"] == "replicated" and q["remat"] == r["remat"]
                  and q["batch"] == r["batch"]), None)
      if ref is not None:
        key = f"remat={int(r['remat'])},batch={r['batch']}"
        own = r["params_bytes_per_device"] + r["opt_state_bytes_per_device"]
        whole = ref["params_bytes_per_device"] + ref["opt_state_bytes_per_device"]
        ratios[key] = round(own / whole, 5)
        if r["memory"] and ref["memory"]:
          compiled_ratios[key] = round((r["memory"]["arguments"] - r["batch_bytes_per_device"])
                                       / (ref["memory"]["arguments"] - ref["batch_bytes_per_device"]), 5)
  record = {"benchmark": BENCHMARK, "environment": environment(), "argv": list(argv or sys.argv[1:]),
            "model": {"backbone": a.backbone, "fields": a.fields, "size": a.size, "captioner": a.model,
                      "overrides": overrides, "parameters": n_params, "dtype": a.dtype},
            "shapes": {"vocab": a.vocab, "words": a.words, "captions_per_image": a.captions},
            "devices": n_dev, "rows": rows, "fsdp_over_replicated": ratios,
            "fsdp_over_replicated_compiled": compiled_ratios,
            "target_fsdp_over_replicated": round(1 / n_dev * 1.05, 5)}
  common.write_record("sharded_memory", record, a.out)
  return record


if __name__ == "__main__":
  from jaxcap.cli import run_script  # imports JAX; its backend starts later, in main
  run_script(main)
