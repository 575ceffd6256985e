"""How much the CIDEr-D reward changes between ``compat="jaxcap"`` and ``"self_critical"``.

  python experiments/decoding/cider_compat_diff.py --config configs/transformer.py:flickr8k [--images 2000]

Candidates are human captions (reference 0 of each training image, cut to ``max_len`` words,
EOS when shorter, as a decoder writes them), scored against the image's other references in
both modes; prints the mean and largest absolute difference.
"""

import os
import sys

from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from jaxcap.errors import BadInput  # noqa: E402

flags.DEFINE_integer("images", 2000, "Training images scored.")
flags.DEFINE_string("cache_dir", "/tmp/cider_compat_cache", "Document-frequency cache.")


def main(argv):
  del argv
  if flags.FLAGS.images < 1:  # before the data set is read
    raise BadInput(f"--images={flags.FLAGS.images}: expected a positive number of training images")
  import numpy as np
  from jaxcap import data as data_lib
  from jaxcap.data.vocab import EOS
  from jaxcap.evaluation import cider
  ds = data_lib.get_dataset(flags.FLAGS.config.data)
  t = ds.max_len
  full = ds.train_references_ids(full=True)
  keep = [i for i, refs in enumerate(full) if len(refs) >= 2][:flags.FLAGS.images]
  cands = np.zeros((len(keep), t), np.int64)
  for row, i in enumerate(keep):
    words = full[i][0][:t]
    cands[row, :len(words)] = words
    if len(words) < t:
      cands[row, len(words)] = EOS
  scores = {}
  for compat in cider.COMPAT_MODES:
    refs = full if compat == "self_critical" else ds.train_references_ids()
    scorer = cider.CiderD.for_training(refs, flags.FLAGS.cache_dir, ds.vocab, compat=compat,
                                       max_len=t, log=lambda s: None)
    prepared = scorer.prepare_refs([refs[i][1:] for i in keep])
    scores[compat] = scorer.score(cands, np.arange(len(keep)), prepared)
  d = np.abs(scores["jaxcap"] - scores["self_critical"])
  long_refs = np.mean([len(r) >= t for i in keep for r in full[i]])
  print(f"{ds.name}: {len(keep)} training images, max_len={t}, {100 * long_refs:.1f}% of "
        f"references at or over the limit")
  for m, s in scores.items():
    print(f"  {m:>13}: mean reward {s.mean():.4f}")
  print(f"  |difference|: mean {d.mean():.4f}, max {d.max():.4f}")


if __name__ == "__main__":
  from jaxcap.cli import run_absl
  run_absl(main, configs={"config": "configs/transformer.py:flickr8k"})
