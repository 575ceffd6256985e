"""Compares two scorings of the same images: the settings they differ in, each metric's paired difference.

  jaxcap-compare runs/a runs/b                        # their scores_test.json
  jaxcap-compare runs/a/scores_test.json runs/a/scores_test_beam3.json
  jaxcap-compare runs/a runs/b --split val --tag _beam3 --intersection --json out.json
  python -m jaxcap.commands.compare A B               # the same without the console script

A and B are run directories (their ``scores_<split><tag>.json``) or scores files. Prints the
settings that differ according to the files' signatures (:mod:`jaxcap.evaluation.signature`:
decoding options the methods read, vocabulary, features, checkpoint, metrics, ...; when the
config hashes differ, the fields of the runs' ``config.json`` beside the scores files that
differ), then for each metric both files' own overall scores (their tables' numbers), the
means of the per-image scores, B - A of the means with the paired bootstrap 95 % interval and
the paired permutation test's p-value over the images both scored, and what the interval is
over (:mod:`jaxcap.evaluation.compare`; for the corpus-level BLEU and METEOR the per-image
mean, not the corpus score), x100 (sacreBLEU as computed; ``--json`` keeps the scores files'
own scale). Two different image sets are refused in one line unless ``--intersection``. Exit 0;
2 on bad input.
"""

from __future__ import annotations

import argparse

from jaxcap import atomic, cli
from jaxcap.evaluation import compare


def parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="jaxcap-compare", description=__doc__.split("\n")[0])
  add = p.add_argument
  add("a", help="Run directory or scores file (the baseline).")
  add("b", help="Run directory or scores file (compared with A).")
  add("--split", default="test", help="With run directories: the scores_<split><tag>.json to read.")
  add("--tag", default="", help="With run directories: the file's tag, e.g. _beam3.")
  add("--intersection", action="store_true", help="Compare the images both scored when the sets differ.")
  add("--resamples", type=cli.positive_int, default=10000, help="Bootstrap resamples and permutations.")
  add("--seed", type=cli.nonnegative_int, default=0, help="Seed of the resamples.")
  add("--json", default=None, help="Also write the comparison to this JSON file (the scores files' scale, not x100); "
      "a file there that jaxcap-compare did not write is refused unless --overwrite.")
  add("--overwrite", action="store_true", help="Replace a file at --json that jaxcap did not write.")
  return p


# The keys of every comparison --json holds (a file of an earlier jaxcap, before the marker).
_KEYS = {"a", "b", "images", "images_a", "images_b"}


def is_comparison(path: str) -> bool:
  """``path`` is a comparison this program wrote: its marker, or an earlier version's keys."""
  obj = atomic.read_json(path)
  return isinstance(obj, dict) and (atomic.json_marked(path) or _KEYS <= set(obj))


def main(argv=None) -> int:
  a = parser().parse_args(argv)
  if a.json:
    atomic.check_output(a.json, f"--json={a.json}", overwrite=a.overwrite, mine=is_comparison,
                        what="a comparison jaxcap-compare wrote")
  sa, path_a = compare.load(a.a, a.split, a.tag)
  sb, path_b = compare.load(a.b, a.split, a.tag)
  result = compare.compare(sa, sb, intersection=a.intersection, names=(path_a, path_b),
                           resamples=a.resamples, seed=a.seed,
                           configs=(compare.run_config(path_a), compare.run_config(path_b)))
  print(f"A: {path_a}\nB: {path_b}")
  if result["images_a"] != result["images_b"] or result["images"] != result["images_a"]:
    print(f"images: A {result['images_a']}, B {result['images_b']}; comparing the "
          f"{result['images']} both scored")
  print(compare.format_comparison(result, names=("A", "B")))
  if a.json:
    atomic.write_json(a.json, dict(result, a=path_a, b=path_b,
                                   **{atomic.JSON_MARKER: atomic.marker_value("jaxcap-compare")}))
    print(f"wrote {a.json}")
  return 0


def run():
  """The program (console script ``jaxcap-compare``)."""
  cli.run_script(main)


if __name__ == "__main__":
  run()
