"""The Image Transformer paper's analyses (section 3.2's Figure 3 and section 4.4's spread).

``figure3``: one synthetic scene's boxes with one query region (red) and its parent (green),
neighbour (blue) and child (yellow) regions under eq. 5, written as a PNG by
:func:`jaxcap.analysis.figures.plot_box_relations`. By default the first test scene with a
container is drawn, with the container as the query (its content is a child, the other objects
neighbours).

  python -m jaxcap.papers.image_transformer.analysis figure3 --out fig3.png [--split test --index 7 --query 2]

``spread``: the decoder-output spread of section 4.4 for a trained checkpoint: the trace of
the covariance matrix of c_t (the GLU output of eq. 10) over the first ``--words`` (1,000)
decoded words (greedy decoding of ``--split``, each word's c_t recomputed by teacher forcing on
the decoded caption). The paper reports 30.40 (M = 1) vs 454.57 (M = 3) on COCO at D = 1024.

  python -m jaxcap.papers.image_transformer.analysis spread --workdir runs/it_synthetic [--words 1000]
"""

from __future__ import annotations

import json

import numpy as np
from jaxcap import decoding
import jaxcap
from jaxcap.analysis import figures
from jaxcap.data import pipeline
from jaxcap.data import synthetic
from jaxcap.data.vocab import PAD
from jaxcap.errors import BadInput
from jaxcap.models.base import shift_right
from jaxcap.papers.image_transformer.model import spatial_graph



def relations_of(boxes, query: int, epsilon: float = 0.9):
  """``["parent" | "neighbour" | "child" | "query"]`` of every region relative to ``query``."""
  import jax.numpy as jnp
  n = len(boxes)
  p, nb, c = (np.asarray(x[0]) for x in spatial_graph(jnp.asarray(boxes)[None], jnp.ones((1, n), bool), epsilon))
  out = []
  for m in range(n):
    out.append("query" if m == query else "parent" if p[query, m] else "child" if c[query, m]
               else "neighbour" if nb[query, m] else "none")
  return out


def figure3(args):
  figures.check_png_out(args.out, f"--out={args.out}", args.overwrite)
  ds = synthetic.SyntheticScenes(num_train=10, num_val=10, num_test=max(args.index + 1, 200))
  index, query = args.index, args.query
  if index < 0:  # the first scene with a container
    for i in range(len(ds._data[args.split]["offsets"]) - 1):
      boxes = ds.features(args.split, i)["boxes"]
      rels = [relations_of(boxes, q) for q in range(len(boxes))]
      hits = [q for q, r in enumerate(rels) if "child" in r]
      if hits:
        index, query = i, (hits[0] if query < 0 else query)
        break
  boxes = ds.features(args.split, index)["boxes"]
  query = max(query, 0)
  rels = relations_of(boxes, query, args.epsilon)
  figures.plot_box_relations(boxes, rels, title=f"{args.split} scene {index}, query region {query}",
                             out=args.out)
  print(json.dumps({"out": args.out, "split": args.split, "index": index, "query": query,
                    "relations": rels, "boxes": np.round(boxes, 3).tolist()}))


def covariance_trace(x_NxD) -> float:
  """trace(Cov(x)) = the sum of the per-dimension variances (unbiased, as numpy.cov)."""
  x = np.asarray(x_NxD, np.float64)
  return float(np.trace(np.atleast_2d(np.cov(x, rowvar=False))))


def spread(args):
  import jax
  run = jaxcap.load(args.workdir)
  config, params, model = run.config, run.params, run.model
  if not hasattr(model, "decoder_outputs"):
    raise BadInput(f"--workdir={args.workdir}: a run of model {config.model.name!r}; expected a run "
                     "of the Image Transformer or AoANet (spread reads their decoder outputs c_t)")
  rows = []
  for batch in pipeline.eval_batches(run.dataset.split(args.split), int(config.eval_batch_size), num_threads=0):
    valid = np.asarray(batch.pop("valid"))
    batch = {k: v for k, v in batch.items() if k in ("feats", "feats_mask", "boxes", "global_feat")}
    tokens = decoding.greedy(model, params, jax.device_put(batch), max_len=int(config.decode.max_len)).tokens
    enc = model.apply(params, batch, method="encode")
    c = np.asarray(model.apply(params, enc, shift_right(tokens), method="decoder_outputs"))
    keep = (np.asarray(tokens) != PAD) & valid[:, None]
    rows.append(c[keep])
    if sum(len(r) for r in rows) >= args.words:
      break
  c_all = np.concatenate(rows)[: args.words]
  out = {"workdir": args.workdir, "model": config.model.name, "M": int(config.model.get("num_sub", 1)),
         "words": int(len(c_all)), "dim": int(c_all.shape[1]), "trace_cov_c": round(covariance_trace(c_all), 4)}
  print(json.dumps(out))
  return out


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  f = sub.add_parser("figure3")
  f.add_argument("--out", required=True)
  f.add_argument("--overwrite", action="store_true", help="Replace a PNG at --out jaxcap did not draw.")
  f.add_argument("--split", default="test")
  f.add_argument("--index", type=int, default=-1, help="scene index (-1: the first with a container)")
  f.add_argument("--query", type=int, default=-1, help="query region (-1: the container)")
  f.add_argument("--epsilon", type=float, default=0.9)
  s = sub.add_parser("spread")
  s.add_argument("--workdir", required=True)
  s.add_argument("--split", default="test")
  s.add_argument("--words", type=int, default=1000)
  args = ap.parse_args(argv)
  return figure3(args) if args.cmd == "figure3" else spread(args)


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
