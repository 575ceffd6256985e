"""The multimodal-attention NMT paper's Table 2 on the synthetic bilingual scenes.

Rows in the table's order: NMT, IMGTXT, MNMT1-8 (``configs/mnmt.py:synthetic,variant=...``),
each trained with ``--seeds`` seeds on the same data and tested on the test split with greedy
decoding. Columns: sacreBLEU / METEOR (``-l de``, exact+stem) / CIDEr-D of the first source (the
image's ``source_en``) and, in parentheses as in the paper, of best-source selection (the
image's ``source_en`` and its 5 English captions are each translated; the hypothesis with the
fewest UNK and then the highest log-likelihood is kept; IMGTXT has no source, so one column).
A second table scores the test images whose English source omits a colour that the German
references name (BLEU and CIDEr-D, first source; the image is the only way to get it right).

  python -m jaxcap.papers.mnmt.table2 --workdir /tmp/mnmt_table2 [--steps 400] [--seeds 0,1,2]
      [--rows nmt,mnmt7] [--num_train 2000] [--num_test 300] [--hidden 64] [--embed 48]
      [--decoder paper|nmtpy] [--val_every 100 --num_val 200]

``--decoder`` picks the decoder of every row (``paper``: eq. 7 read literally; ``nmtpy``: the
authors' released CGRU, see ``jaxcap/papers/mnmt/model.py``). With ``--val_every N`` each run greedily
translates ``--num_val`` validation images (first source) every N steps and keeps the parameters
of its best validation sacreBLEU, which are the ones tested (the paper's BLEU early stopping);
the validation curve is kept per run and the table gains the mean best step and the BLEU gained
in the run's last quarter, so that a schedule whose text-only row is still climbing shows it.

The training loop is inlined (one jit per row, reused across seeds) to keep the CPU time of
30 runs small; it is the trainer's cross-entropy step (``jaxcap.training.steps.train_step``) and
optimiser (``optim.make_optimizer``) on the config's batches. Results: ``<workdir>/table2.json`` (per run)
and ``<workdir>/table.md`` (mean ± sample std, ddof = 1, over the seeds).
"""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np


from jaxcap import data as data_lib
from jaxcap import decoding
from jaxcap.analysis import experiment
from jaxcap.data import pipeline
from jaxcap.data.synthetic import SyntheticScenes
from jaxcap.evaluation import translation
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.papers.mnmt import best_source
from jaxcap.papers.mnmt import model as mnmt_model
from jaxcap.papers.mnmt.configs import mnmt as mnmt_config
from jaxcap.training import optim, steps


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  p = ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True)
  experiment.add_overwrite(p)
  p.add_argument("--rows", default="nmt,imgtxt,mnmt1,mnmt2,mnmt3,mnmt4,mnmt5,mnmt6,mnmt7,mnmt8")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--batch", type=int, default=50)
  p.add_argument("--num_train", type=int, default=2000)
  p.add_argument("--num_test", type=int, default=300)
  p.add_argument("--hidden", type=int, default=0, help="GRU width (0: the config's)")
  p.add_argument("--embed", type=int, default=0, help="embedding width (0: the config's)")
  p.add_argument("--no_meteor", action="store_true")
  p.add_argument("--decoder", default="paper", help="paper | nmtpy (every row's decoder)")
  p.add_argument("--val_every", type=int, default=0,
                 help="validate (greedy sacreBLEU, first source) every N steps and test the best (0: off)")
  p.add_argument("--num_val", type=int, default=200, help="validation images when --val_every > 0")
  args = p.parse_args(argv)

  import jax
  import jax.numpy as jnp

  rows = experiment.parse_list(args.rows, "--rows")
  if args.decoder not in mnmt_model.DECODERS:
    raise SystemExit(f"--decoder: {args.decoder!r}, expected one of {list(mnmt_model.DECODERS)}")
  if args.val_every < 0 or (args.val_every and args.num_val < 1):
    raise SystemExit(f"--val_every {args.val_every} / --num_val {args.num_val}: expected --val_every >= 0 "
                     "and --num_val >= 1")
  num_val = args.num_val if args.val_every else 10
  seeds = experiment.parse_seeds(args.seeds)
  experiment.check_workdir(args.workdir, args.overwrite)  # before anything trains
  os.makedirs(args.workdir, exist_ok=True)
  out_path = os.path.join(args.workdir, "table2.json")
  results = json.load(open(out_path)) if os.path.exists(out_path) else {}
  other = {r.get("decoder", "paper") for r in results.values()} - {args.decoder}
  if other:
    raise SystemExit(f"--decoder {args.decoder}: {out_path} holds runs of decoder {sorted(other)[0]!r}, "
                     "expected a workdir of its own for each decoder")

  base = mnmt_config.get_config("synthetic")
  base.data.num_train, base.data.num_val, base.data.num_test = args.num_train, num_val, args.num_test
  dataset = data_lib.get_dataset(base.data)
  scenes = SyntheticScenes(num_train=args.num_train, num_val=num_val, num_test=args.num_test,
                           seed=base.data.seed, feature_dim=base.data.feature_dim)
  info = dict(dataset.info)
  test = dataset.split("test")
  ids = dataset.image_ids("test")
  refs = dataset.references("test")
  omitted = {ids[i] for i in range(len(test)) if scenes.source_omits_colour("test", i)}
  cands = np.stack([best_source.encode_sources(
      dataset.src_vocab, [scenes.source_en("test", i)] + scenes.captions("test", i), info["src_max_len"])
      for i in range(len(test))])  # [n, 6, Ls]
  test_batches = list(pipeline.eval_batches(test, 100, num_threads=0))
  val_ids, val_refs = dataset.image_ids("val"), dataset.references("val")
  val_batches = list(pipeline.eval_batches(dataset.split("val"), 100, num_threads=0)) if args.val_every else []
  print(f"data: {args.num_train} train / {len(test)} test images, {len(omitted)} test sources omit a "
        f"colour; V_de={info['vocab_size']} V_en={info['src_vocab_size']}", flush=True)

  fns = {}

  def row_fns(row):
    """Model, jitted train step, init and greedy decoding of a row (built once, reused per seed)."""
    if row in fns:
      return fns[row]
    cfg = mnmt_config.get_config(f"synthetic,variant={row},decoder={args.decoder}")
    if args.hidden:
      cfg.model.hidden_dim = args.hidden
    if args.embed:
      cfg.model.embed_dim = args.embed
    model = registry.build(cfg.model, info)
    tx, _ = optim.make_optimizer(cfg, max(1, args.num_train // args.batch))
    train_step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx), donate_argnums=0)
    greedy = jax.jit(lambda prm, b: decoding.greedy(model, prm, b, max_len=cfg.decode.max_len))

    def decode(prm, b):
      o = greedy(prm, b)
      return np.asarray(o.tokens), np.asarray(o.logprobs)

    fns[row] = (tx, train_step, jax.jit(model.init), decode)
    return fns[row]

  # Seeds outer, rows inner: an interrupted run still has every row for its first seeds.
  def run(row, seed):
    tx, train_step, init, decode = row_fns(row)
    key = f"{row}/seed{seed}"
    if key in results:
      return results[key]
    t0 = time.time()
    it = pipeline.make_train_iterator(dataset.split("train"), args.batch, seed=seed, num_threads=0)
    first = next(it)
    params = init(jax.random.PRNGKey(seed), first, shift_right(jnp.asarray(first["captions"])))
    state = steps.create_state(params, tx, jax.random.PRNGKey(seed + 1))
    batch = first
    curve, best = [], (-1.0, 0, None)  # (val BLEU, step, params)
    for step in range(1, args.steps + 1):
      state, metrics = train_step(state, batch)
      batch = next(it)
      if args.val_every and (step % args.val_every == 0 or step == args.steps):
        preds = {}
        for b in val_batches:
          toks, _ = decode(state.params, b)
          for j in np.nonzero(b["valid"])[0]:
            preds[val_ids[int(b["image_index"][j])]] = dataset.vocab.decode(toks[j])
        bleu, _ = translation.sacrebleu_score(val_refs, preds)
        curve.append([step, bleu])
        if bleu > best[0]:
          best = (bleu, step, jax.device_get(state.params))
    loss = float(metrics["loss_sum"] / metrics["token_count"])
    t_train = time.time() - t0
    params = best[2] if best[2] is not None else state.params
    first_p, best_p = {}, {}
    for b in test_batches:
      toks, _ = decode(params, b)
      valid = b["valid"]
      if row != "imgtxt":
        btoks, _ = best_source.best_source_tokens(lambda bb: decode(params, bb), b,
                                                  cands[b["image_index"]])
      for j in np.nonzero(valid)[0]:
        i = ids[int(b["image_index"][j])]
        first_p[i] = dataset.vocab.decode(toks[j])
        best_p[i] = dataset.vocab.decode(btoks[j]) if row != "imgtxt" else first_p[i]
    res = {"loss": loss, "train_s": t_train, "decoder": args.decoder}
    if curve:
      tail = [b for st, b in curve if st > 0.75 * args.steps]
      head = [b for st, b in curve if st <= 0.75 * args.steps]
      res.update(val_curve=curve, best_step=best[1], best_val_BLEU=best[0],
                 last_quarter_gain=(max(tail) - max(head)) if tail and head else None)
    for name, preds in (("first", first_p), ("best", best_p)):
      if name == "best" and row == "imgtxt":
        res["best"] = res["first"]
        continue
      s = translation.score(refs, preds, log=lambda *_: None, meteor=not args.no_meteor)["overall"]
      sub = translation.score(refs, {i: preds[i] for i in omitted}, log=lambda *_: None,
                              meteor=False)["overall"]
      res[name] = {"BLEU": s.get("sacreBLEU"), "METEOR": 100 * s["METEOR"] if "METEOR" in s else None,
                   "CIDEr": 100 * s["CIDEr"], "omit_BLEU": sub.get("sacreBLEU"),
                   "omit_CIDEr": 100 * sub["CIDEr"]}
    res["time_s"] = time.time() - t0
    results[key] = res
    print(f"{key}: loss {loss:.3f} first {res['first']} best {res['best']} ({res['time_s']:.0f} s)",
          flush=True)
    experiment.write_json(out_path, results)
    return res

  experiment.run_grid(rows, seeds, run, seed_major=True)

  def cell(row, metric):
    runs = [results[f"{row}/seed{s}"] for s in seeds if f"{row}/seed{s}" in results]
    a = experiment.pm(experiment.mean_std(r["first"][metric] for r in runs), 1.0, 2)
    b = experiment.pm(experiment.mean_std(r["best"][metric] for r in runs), 1.0, 2)
    return a if row == "imgtxt" else f"{a} ({b})"

  def val_cells(row):
    runs = [results[f"{row}/seed{s}"] for s in seeds if f"{row}/seed{s}" in results]
    return [experiment.pm(experiment.mean_std(r.get(k) for r in runs), 1.0, d)
            for k, d in (("best_val_BLEU", 2), ("best_step", 0), ("last_quarter_gain", 2))]

  def paired(row, metric):
    """Mean ± std over seeds of (row - NMT) in the same seed: the text-only baseline's gap."""
    if row == "nmt":
      return "-"
    both = [s for s in seeds if f"{row}/seed{s}" in results and f"nmt/seed{s}" in results]
    return experiment.pm(experiment.mean_std(
        results[f"{row}/seed{s}"]["first"][metric] - results[f"nmt/seed{s}"]["first"][metric]
        for s in both), 1.0, 2)

  caption = (f"Table 2 analog (synthetic bilingual scenes, test split), decoder `{args.decoder}`, "
             f"{args.steps} steps; mean ± std (ddof = 1) over seeds {','.join(map(str, seeds))}; "
             "first source (best source); − NMT: the row minus the same seed's text-only NMT, first source.")
  header = ["Model", "METEOR", "BLEU", "CIDEr-D", "BLEU, colour omitted", "CIDEr-D, colour omitted",
            "BLEU − NMT", "BLEU − NMT, colour omitted"]
  if args.val_every:
    caption += (f" Tested at the best validation sacreBLEU ({num_val} images, every {args.val_every} "
                "steps); last-quarter gain: best validation BLEU after 3/4 of the steps minus before.")
    header += ["val BLEU (best)", "at step", "last-quarter gain"]
  table = experiment.markdown_table(
      header,
      [[row.upper(), *(cell(row, m) for m in ("METEOR", "BLEU", "CIDEr", "omit_BLEU", "omit_CIDEr")),
        paired(row, "BLEU"), paired(row, "omit_BLEU"),
        *(val_cells(row) if args.val_every else [])]
       for row in rows])
  print(f"\n{caption}\n{table}")
  experiment.write_text(os.path.join(args.workdir, "table.md"), f"{caption}\n\n{table}\n")


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
