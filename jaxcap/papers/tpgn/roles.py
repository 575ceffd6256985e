"""Interpretation of TPGN's unbinding vectors (section 5.3 of Huang et al., 2018).

Dimension legend: N generated words (over all captions of a split), d^2 the unbinding-vector
width, K clusters (the paper's N_u).

The paper runs the trained model on the training images, clusters every ``u_t`` (one per
generated word) with k-means into N_u clusters, then assigns the ``u_t`` of the test captions to
their nearest centroid and reads off each cluster's parts of speech: Table 2 (N_u = 2, the
share of each category in its "nominal" / "verbal" cluster) and Table 3 (N_u = 10, the dominant
categories and positional clusters). Figure 3 is a 2-D linear projection of ``u_t`` coloured by
part of speech.

* :func:`collect` greedy-decodes a split through the shared decoder (``return_aux=True``) and
  returns every generated word (EOS excluded) with its ``u_t``, position and image.
* :func:`kmeans` / :func:`assign`: k-means++ then Lloyd iterations (NumPy, seeded).
* :func:`purity_table` (Table 3 analogue: per cluster, size, tag shares and the share of words at
  positions 1 and 2), :func:`nv_table` (Table 2 analogue).
* :func:`project_2d` (PCA) and :func:`plot_projection` (a PNG with matplotlib when it is
  installed; otherwise ``None`` and the caller says so).
* Parts of speech: on ``synthetic_scenes`` exactly from the grammar
  (``jaxcap.data.synthetic.english_pos``); on real text from NLTK's tagger when NLTK and its
  model are installed (:func:`nltk_tagger`), else ``None``.

The centroids also drive TPGN's functional ablation (``model.zero_role_cluster`` with
``jaxcap.papers.tpgn.model.with_role_centroids``): :func:`ablation_scores` zeroes one cluster at a
time and re-scores the split.

The command line (:func:`main`):

  python -m jaxcap.papers.tpgn.roles --workdir runs/tpgn_synthetic [--clusters 2,10] [--fit-split train]
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

import collections
import os
from typing import Callable, Sequence

import numpy as np

from jaxcap import atomic, decoding
import jaxcap
from jaxcap.data import pipeline
from jaxcap.data.synthetic import POS_NOMINAL
from jaxcap.data.synthetic import english_pos
from jaxcap.data.vocab import EOS, PAD
from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics
from jaxcap.papers.tpgn.model import with_role_centroids


# ------------------------------------------------------------------------------------ collect
def collect(model, variables, dataset, split: str, *, max_len: int = 16, batch_size: int = 100,
            num_images: int = -1) -> dict:
  """Greedy captions of ``split`` and the unbinding vector of every generated word.

  Returns:
    ``{"u": float32 [N, d^2], "words": [N] str, "position": int [N] (1-based), "image": int [N]
    (row in the split), "captions": {row: caption string}}``.
  """
  import jax
  source = dataset.split(split)
  n_images = len(source) if num_images is None or num_images < 0 else min(num_images, len(source))
  us, words, pos, img, caps = [], [], [], [], {}
  for batch in pipeline.eval_batches(source, batch_size, num_threads=0):
    valid = np.asarray(batch["valid"], bool)
    rows = np.asarray(batch["image_index"])
    inputs = {k: batch[k] for k in ("feats", "feats_mask", "boxes", "global_feat") if k in batch}
    out = decoding.greedy(model, variables, jax.device_put(inputs), max_len=max_len, return_aux=True)
    tokens = np.asarray(out.tokens)
    u = np.asarray(out.aux["unbinding"], np.float32)
    for r in range(tokens.shape[0]):
      if not valid[r] or rows[r] >= n_images:
        continue
      caps[int(rows[r])] = dataset.vocab.decode(tokens[r])
      for t, tok in enumerate(tokens[r]):
        if tok in (EOS, PAD):
          break
        us.append(u[r, t])
        words.append(dataset.vocab.itos[int(tok)])
        pos.append(t + 1)
        img.append(int(rows[r]))
    if rows[valid].size and rows[valid].max() >= n_images - 1:
      break
  d2 = getattr(model, "d", 1) ** 2
  return {"u": np.asarray(us, np.float32).reshape(-1, d2), "words": words,
          "position": np.asarray(pos, np.int32), "image": np.asarray(img, np.int32), "captions": caps}


# ------------------------------------------------------------------------------------ k-means
def kmeans(x_NxD, k: int, *, seed: int = 0, iters: int = 50, restarts: int = 3) -> np.ndarray:
  """Centroids ``[k, D]`` minimising the within-cluster squared distance (best of ``restarts``
  k-means++ starts, each refined by Lloyd iterations until the assignment stops changing)."""
  x = np.asarray(x_NxD, np.float64)
  if not 1 <= k <= len(x):
    raise BadInput(f"kmeans: need 1 <= k <= {len(x)} points, got k={k}")
  rng = np.random.default_rng(seed)
  best, best_cost = None, np.inf
  for _ in range(restarts):
    mu = [x[rng.integers(len(x))]]
    for _ in range(1, k):  # k-means++: next centre with probability ~ squared distance
      d2 = np.min(((x[:, None, :] - np.asarray(mu)[None]) ** 2).sum(-1), 1)
      mu.append(x[rng.choice(len(x), p=d2 / d2.sum())] if d2.sum() > 0 else x[rng.integers(len(x))])
    mu = np.asarray(mu)
    labels = None
    for _ in range(iters):
      new = assign(x, mu)
      if labels is not None and np.array_equal(new, labels):
        break
      labels = new
      for j in range(k):
        if np.any(labels == j):
          mu[j] = x[labels == j].mean(0)
    cost = float(((x - mu[assign(x, mu)]) ** 2).sum())
    if cost < best_cost:
      best, best_cost = mu.copy(), cost
  return best.astype(np.float32)


def assign(x_NxD, mu_KxD) -> np.ndarray:
  """Nearest-centroid labels ``[N]`` (the paper's nearest-neighbour rule)."""
  x, mu = np.asarray(x_NxD, np.float64), np.asarray(mu_KxD, np.float64)
  d2 = (x * x).sum(1)[:, None] - 2 * x @ mu.T + (mu * mu).sum(1)[None]
  return np.argmin(d2, 1)


# ------------------------------------------------------------------------------------ tables
def purity_table(labels, tags: Sequence[str], positions=None, k: int | None = None) -> list[dict]:
  """Per cluster: ``{"cluster", "n", "purity" (share of its top tag), "tags": [(tag, share)]
  (descending), "pos1", "pos2"}`` (shares of its words at caption positions 1 and 2)."""
  labels = np.asarray(labels)
  k = int(labels.max()) + 1 if k is None else k
  tags = np.asarray(tags)
  rows = []
  for j in range(k):
    sel = labels == j
    n = int(sel.sum())
    counts = collections.Counter(tags[sel].tolist())
    shares = [(t, c / n) for t, c in counts.most_common()] if n else []
    row = {"cluster": j, "n": n, "purity": shares[0][1] if shares else 0.0, "tags": shares}
    if positions is not None:
      p = np.asarray(positions)[sel]
      row["pos1"] = float(np.mean(p == 1)) if n else 0.0
      row["pos2"] = float(np.mean(p == 2)) if n else 0.0
    rows.append(row)
  return rows


def weighted_purity(table: list[dict]) -> float:
  """Share of all words whose cluster's majority tag is their own tag."""
  total = sum(r["n"] for r in table)
  return sum(r["n"] * r["purity"] for r in table) / max(total, 1)


def nv_table(labels, tags: Sequence[str], nominal: Callable[[str], bool]) -> dict:
  """Table 2 analogue for two clusters.

  The *nominal* cluster is the one holding most nominal-tag words; a word conforms when a
  nominal tag lies in the nominal cluster or a verbal tag in the other.

  Returns:
    ``{"nominal_cluster": int, "rows": [{"tag", "N_w", "N_r", "P_c"}], "overall": P_c}``.
  """
  labels, tags = np.asarray(labels), np.asarray(tags)
  is_nom = np.array([nominal(t) for t in tags], bool)
  nom_cluster = int(np.argmax([np.sum(is_nom & (labels == j)) for j in (0, 1)]))
  conform = np.where(is_nom, labels == nom_cluster, labels != nom_cluster)
  rows = []
  for tag, _ in collections.Counter(tags.tolist()).most_common():
    sel = tags == tag
    n_w, n_r = int(sel.sum()), int(conform[sel].sum())
    rows.append({"tag": tag, "N_w": n_w, "N_r": n_r, "P_c": n_r / n_w})
  return {"nominal_cluster": nom_cluster, "rows": rows, "overall": float(conform.mean()) if len(tags) else 0.0}


def format_purity(table: list[dict], top: int = 3) -> str:
  lines = ["cluster |     n | pos1 | pos2 | parts of speech (share)"]
  for r in table:
    tags = ", ".join(f"{t} ({s:.2f})" for t, s in r["tags"][:top])
    lines.append(f"{r['cluster']:>7} | {r['n']:>5} | {r.get('pos1', 0):.2f} | {r.get('pos2', 0):.2f} | {tags}")
  lines.append(f"weighted purity {weighted_purity(table):.3f}")
  return "\n".join(lines)


def format_nv(nv: dict) -> str:
  lines = [f"nominal cluster: {nv['nominal_cluster']}", "category |   N_w |   N_r |  P_c"]
  for r in nv["rows"]:
    lines.append(f"{r['tag']:>8} | {r['N_w']:>5} | {r['N_r']:>5} | {r['P_c']:.3f}")
  lines.append(f"all words P_c {nv['overall']:.3f}")
  return "\n".join(lines)


# ------------------------------------------------------------------------------------ tagging
def nltk_tagger():
  """A ``words -> tags`` function from NLTK's perceptron tagger (universal tags), or None when
  NLTK or its tagger model is not installed (nothing is downloaded)."""
  try:
    import nltk
    nltk.pos_tag(["a", "dog"], tagset="universal")
  except Exception:  # pylint: disable=broad-except  (not installed, or its model missing)
    return None
  return lambda words: [t for _, t in nltk.pos_tag(list(words), tagset="universal")]


def tag_words(words: Sequence[str], images, positions, dataset_name: str):
  """Parts of speech for the collected words, or None when no tagger is available.

  ``synthetic_scenes``: exact, from the grammar. Real text: NLTK, caption by caption."""
  if dataset_name == "synthetic_scenes":
    return [english_pos(w) for w in words]
  tagger = nltk_tagger()
  if tagger is None:
    return None
  tags = [None] * len(words)
  start = 0
  for i in range(1, len(words) + 1):  # captions are contiguous runs with positions 1..L
    if i == len(words) or positions[i] == 1:
      tags[start:i] = tagger(words[start:i])
      start = i
  return tags


# ------------------------------------------------------------------------------------ figure
def project_2d(x_NxD) -> np.ndarray:
  """The first two principal components ``[N, 2]`` (a linear projection, as the paper's)."""
  x = np.asarray(x_NxD, np.float64)
  x = x - x.mean(0)
  _, _, vt = np.linalg.svd(x, full_matrices=False)
  return (x @ vt[:2].T).astype(np.float32)


def plot_projection(xy_Nx2, tags: Sequence[str], path: str, title: str = "") -> str | None:
  """Writes a scatter PNG coloured by part of speech; None when matplotlib is not installed."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  fig, ax = plt.subplots(figsize=(6, 5), dpi=120)
  for tag in sorted(set(tags)):
    sel = np.asarray([t == tag for t in tags])
    ax.scatter(xy_Nx2[sel, 0], xy_Nx2[sel, 1], s=6, label=f"{tag} ({int(sel.sum())})")
  ax.legend(fontsize=7, markerscale=2)
  ax.set_title(title or "unbinding vectors u_t (PCA), by part of speech")
  fig.tight_layout()
  from jaxcap.analysis import figures
  fig.savefig(path, metadata=figures.png_metadata())  # marked: a later run may replace it
  plt.close(fig)
  return path


# ------------------------------------------------------------------------------------ ablation
def ablation_scores(model, variables, dataset, split: str, centroids, *, max_len: int = 16,
                    batch_size: int = 100) -> list[dict]:
  """CIDEr-D of greedy captions with each role cluster's ``u_t`` zeroed in turn (row -1: none)."""
  refs_all = dataset.references(split)
  ids = dataset.image_ids(split)
  av = with_role_centroids(variables, centroids)
  rows = []
  for k in range(-1, len(centroids)):
    mdl = model.clone(zero_role_cluster=k)
    got = collect(mdl, av, dataset, split, max_len=max_len, batch_size=batch_size)
    preds = {ids[r]: c for r, c in got["captions"].items()}
    refs = {i: refs_all[i] for i in preds}
    s = coco_metrics.score(refs, preds, metrics=("CIDEr",), tokenize=False, log=lambda *_: None)
    rows.append({"zeroed_cluster": k, "CIDEr": s["overall"]["CIDEr"], "words": len(got["words"])})
  return rows


def analyse(model, variables, dataset, *, clusters=(2, 10), fit_split="train", fit_images=2000,
            split="test", max_len=16, png="", ablate=False, seed=0, log=print) -> dict:
  fit = collect(model, variables, dataset, fit_split, max_len=max_len, num_images=fit_images)
  test = collect(model, variables, dataset, split, max_len=max_len)
  tags = tag_words(test["words"], test["image"], test["position"], getattr(dataset, "name", ""))
  out = {"fit_split": fit_split, "fit_words": len(fit["words"]), "split": split,
         "words": len(test["words"]), "tables": {}}
  if tags is None:
    log("parts of speech: no tagger installed for real text (NLTK); purity tables skipped")
  centroids = {}
  for k in clusters:
    if not 1 <= k <= len(fit["u"]):
      raise BadInput(f"--clusters: {k} clusters of the {len(fit['u'])} words generated for "
                       f"{fit_split}; expected between 1 and {len(fit['u'])} (or more --fit-images)")
    mu = kmeans(fit["u"], k, seed=seed)
    centroids[k] = mu
    labels = assign(test["u"], mu)
    entry = {"sizes": np.bincount(labels, minlength=k).tolist()}
    if tags is not None:
      table = purity_table(labels, tags, test["position"], k)
      entry["purity"] = table
      entry["weighted_purity"] = weighted_purity(table)
      log(f"\nN_u = {k}: clusters fitted on {len(fit['words'])} words of {fit_split}, "
          f"{len(test['words'])} words of {split}")
      log(format_purity(table))
      if k == 2:
        nv = nv_table(labels, tags, lambda t: t in POS_NOMINAL)
        entry["nv"] = nv
        log(format_nv(nv))
    out["tables"][str(k)] = entry
  if png:
    xy = project_2d(test["u"])
    written = plot_projection(xy, tags or ["?"] * len(xy), png)
    if written is None:
      log(f"matplotlib is not installed: no PNG; 2-D coordinates written to {png}.json")
      atomic.write_json(png + ".json", {"xy": xy.round(4).tolist(), "tags": tags, "words": test["words"],
                                        atomic.JSON_MARKER: atomic.marker_value("jaxcap.papers.tpgn.roles")})
    out["png"] = written
  if ablate:
    out["ablation"] = {}
    for k, mu in centroids.items():
      rows = ablation_scores(model, variables, dataset, split, mu, max_len=max_len)
      out["ablation"][str(k)] = rows
      log(f"\nN_u = {k}, CIDEr-D x100 with one cluster's u_t zeroed (as the tables print it): " +
          ", ".join(("none" if r["zeroed_cluster"] < 0 else str(r["zeroed_cluster"])) +
                    f": {100 * r['CIDEr']:.2f}" for r in rows))
  return out, centroids


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--step", type=int, default=None)
  ap.add_argument("--clusters", default="2,10")
  ap.add_argument("--fit-split", dest="fit_split", default="train")
  ap.add_argument("--fit-images", dest="fit_images", type=int, default=2000)
  ap.add_argument("--split", default="test")
  ap.add_argument("--png", default="")
  ap.add_argument("--overwrite", action="store_true", help="Replace a file at --png jaxcap did not write.")
  ap.add_argument("--ablate", action="store_true")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  try:
    clusters = tuple(int(k) for k in args.clusters.split(","))
  except ValueError:
    clusters = (0,)
  if min(clusters) < 1:
    raise BadInput(f"--clusters={args.clusters}: expected comma-separated positive numbers of "
                     "clusters (the paper's N_u, e.g. 2,10)")
  if args.png:  # the PNG, or its coordinates when matplotlib is missing: before the run loads
    from jaxcap.analysis import figures
    figures.check_png_out(args.png, f"--png={args.png}", args.overwrite)
    atomic.check_output(args.png + ".json", f"--png={args.png}: {args.png}.json",
                        overwrite=args.overwrite, mine=atomic.json_marked, what="one this program wrote")
  run = jaxcap.load(args.workdir, args.step)
  if run.config.model.name != "tpgn":
    raise SystemExit(f"{args.workdir}: model.name is {run.config.model.name!r}, not 'tpgn'")
  out, centroids = analyse(run.model, run.params, run.dataset,
                           clusters=clusters,
                           fit_split=args.fit_split, fit_images=args.fit_images, split=args.split,
                           max_len=int(run.config.decode.max_len), png=args.png,
                           ablate=args.ablate, seed=args.seed)
  for k, mu in centroids.items():
    atomic.write_with(os.path.join(args.workdir, f"roles_k{k}.npy"), lambda f, mu=mu: np.save(f, mu))
  atomic.write_json(os.path.join(args.workdir, "roles.json"), out)
  return out


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
