"""TPGN's section 5.3 on a trained run: k-means of the unbinding vectors u_t and their parts of speech.

  python experiments/tpgn/roles.py --workdir runs/tpgn_synthetic [--clusters 2,10] [--fit-split train]
      [--fit-images 2000] [--split test] [--png roles.png] [--ablate]

As the paper: u_t of every greedily generated word of ``--fit-images`` images of ``--fit-split``
are clustered (k-means, N_u = each of ``--clusters``); the u_t of ``--split`` are assigned to the
nearest centroid; then, per N_u, the per-cluster part-of-speech table (Table 3 analogue, with the
share of caption positions 1 and 2) and, for N_u = 2, the nominal/verbal conformity table
(Table 2 analogue). Parts of speech: exact from the grammar on ``synthetic_scenes``; on real text
NLTK's tagger when it is installed, otherwise the tables are skipped with one line. ``--png``
writes the 2-D PCA projection of the split's u_t coloured by part of speech (needs matplotlib;
else one line says so and ``<png>.json`` holds the coordinates). ``--ablate`` re-scores the split
(CIDEr-D, greedy) with each N_u = 2 and N_u = 10 cluster's u_t zeroed in turn
(``model.zero_role_cluster``). Everything is written to ``<workdir>/roles.json`` and the
centroids to ``<workdir>/roles_k<N_u>.npy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

# The checkout's root (two folders up), so that its jaxcap and configs/ are the ones imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def analyse(model, variables, dataset, *, clusters=(2, 10), fit_split="train", fit_images=2000,
            split="test", max_len=16, png="", ablate=False, seed=0, log=print) -> dict:
  from jaxcap.analysis import tpgn_roles as roles
  from jaxcap.data.synthetic import POS_NOMINAL
  fit = roles.collect(model, variables, dataset, fit_split, max_len=max_len, num_images=fit_images)
  test = roles.collect(model, variables, dataset, split, max_len=max_len)
  tags = roles.tag_words(test["words"], test["image"], test["position"], getattr(dataset, "name", ""))
  out = {"fit_split": fit_split, "fit_words": len(fit["words"]), "split": split,
         "words": len(test["words"]), "tables": {}}
  if tags is None:
    log("parts of speech: no tagger installed for real text (NLTK); purity tables skipped")
  centroids = {}
  for k in clusters:
    mu = roles.kmeans(fit["u"], k, seed=seed)
    centroids[k] = mu
    labels = roles.assign(test["u"], mu)
    entry = {"sizes": np.bincount(labels, minlength=k).tolist()}
    if tags is not None:
      table = roles.purity_table(labels, tags, test["position"], k)
      entry["purity"] = table
      entry["weighted_purity"] = roles.weighted_purity(table)
      log(f"\nN_u = {k}: clusters fitted on {len(fit['words'])} words of {fit_split}, "
          f"{len(test['words'])} words of {split}")
      log(roles.format_purity(table))
      if k == 2:
        nv = roles.nv_table(labels, tags, lambda t: t in POS_NOMINAL)
        entry["nv"] = nv
        log(roles.format_nv(nv))
    out["tables"][str(k)] = entry
  if png:
    xy = roles.project_2d(test["u"])
    written = roles.plot_projection(xy, tags or ["?"] * len(xy), png)
    if written is None:
      log(f"matplotlib is not installed: no PNG; 2-D coordinates written to {png}.json")
      with open(png + ".json", "w") as f:
        json.dump({"xy": xy.round(4).tolist(), "tags": tags, "words": test["words"]}, f)
    out["png"] = written
  if ablate:
    out["ablation"] = {}
    for k, mu in centroids.items():
      rows = roles.ablation_scores(model, variables, dataset, split, mu, max_len=max_len)
      out["ablation"][str(k)] = rows
      log(f"\nN_u = {k}, CIDEr-D with one cluster's u_t zeroed: " +
          ", ".join(("none" if r["zeroed_cluster"] < 0 else str(r["zeroed_cluster"])) +
                    f": {r['CIDEr']:.3f}" for r in rows))
  return out, centroids


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--step", type=int, default=None)
  ap.add_argument("--clusters", default="2,10")
  ap.add_argument("--fit-split", dest="fit_split", default="train")
  ap.add_argument("--fit-images", dest="fit_images", type=int, default=2000)
  ap.add_argument("--split", default="test")
  ap.add_argument("--png", default="")
  ap.add_argument("--ablate", action="store_true")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  import jaxcap
  run = jaxcap.load(args.workdir, args.step)
  if run.config.model.name != "tpgn":
    raise SystemExit(f"{args.workdir}: model.name is {run.config.model.name!r}, not 'tpgn'")
  out, centroids = analyse(run.model, run.params, run.dataset,
                           clusters=tuple(int(k) for k in args.clusters.split(",")),
                           fit_split=args.fit_split, fit_images=args.fit_images, split=args.split,
                           max_len=int(run.config.decode.max_len), png=args.png,
                           ablate=args.ablate, seed=args.seed)
  for k, mu in centroids.items():
    np.save(os.path.join(args.workdir, f"roles_k{k}.npy"), mu)
  with open(os.path.join(args.workdir, "roles.json"), "w") as f:
    json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
