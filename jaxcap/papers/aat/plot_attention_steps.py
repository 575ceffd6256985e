"""Draws AAT's attention steps for one generated caption as a PNG (the paper's Figure 3,
without the image), with :func:`jaxcap.papers.aat.figures.plot_attention_steps`.

One row per generated word: the orange box is the non-visual step (slot 0, ``h1_t``), the blue
boxes are the attention steps ``n = 1 .. N(t)``; each box shows ``confidence/weight``
(``p_{t,n}`` / normalised ``beta_{t,n}``) and is shaded by the weight. Slots beyond ``N(t)``
stay empty.

  python -m jaxcap.papers.aat.plot_attention_steps --workdir /tmp/aat_run --split test --index 0 \\
      --out attention_steps.png
  python -m jaxcap.papers.aat.plot_attention_steps --random_init --out /tmp/steps.png   # untrained demo
"""

from __future__ import annotations



from jaxcap import api
from jaxcap import data as data_lib
import jaxcap
from jaxcap.papers.aat import figures
from jaxcap.analysis.words import caption_aux, row_batch
from jaxcap.data import batch as batch_lib
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.papers.aat.configs import aat as aat_config



def untrained_run():
  """An untrained ``configs/aat.py:synthetic`` model as a :class:`jaxcap.api.Run` (the demo)."""
  import jax
  config = aat_config.get_config("synthetic")
  dataset = data_lib.get_dataset(config.data)
  info = dict(dataset.info)
  model = registry.build(config.model, info)
  batch = jax.tree.map(jax.numpy.asarray, batch_lib.dummy(info, 2))
  params = model.init(jax.random.PRNGKey(config.seed), batch, shift_right(batch["captions"]), train=False)
  return api.Run(config, dataset.vocab, info, model, params, dataset=dataset)


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", help="a training workdir (config.json, vocab.json, checkpoints)")
  ap.add_argument("--random_init", action="store_true",
                  help="no workdir: an untrained configs/aat.py:synthetic model (a demo)")
  ap.add_argument("--split", default="test")
  ap.add_argument("--index", type=int, default=0, help="row of the image in the split")
  ap.add_argument("--out", default="attention_steps.png")
  ap.add_argument("--overwrite", action="store_true", help="Replace a PNG at --out jaxcap did not draw.")
  args = ap.parse_args(argv)
  from jaxcap.analysis.figures import check_png_out
  check_png_out(args.out, f"--out={args.out}", args.overwrite)  # before a run is loaded

  if args.random_init:
    run = untrained_run()
  elif args.workdir:
    run = jaxcap.load(args.workdir)  # the best checkpoint
  else:
    raise SystemExit("give --workdir (a trained run) or --random_init")
  if getattr(run.model, "registry_name", "") != "aat":
    raise SystemExit(f"model.name={run.model.registry_name!r}: this script draws AAT's attention steps")
  source = run.dataset.split(args.split)
  if not 0 <= args.index < len(source):
    raise SystemExit(f"--index {args.index}: split {args.split!r} has {len(source)} images")
  batch = row_batch(source, args.index)
  words, aux = caption_aux(run.model, run.params, batch, run.vocab, int(run.config.decode.max_len))
  image_id = run.dataset.image_ids(args.split)[args.index]
  title = f"image {image_id}: {' '.join(w for w in words if w != '<eos>')}"
  figures.plot_attention_steps(words, aux["attention_steps"], aux["confidences"], aux["beta"],
                               title=title, out=args.out)
  print(f"{args.out}: {len(words)} words, attention steps {aux['attention_steps'].tolist()}")


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
