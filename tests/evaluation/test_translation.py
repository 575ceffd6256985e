"""German-output metrics (jaxcap/evaluation/translation.py) and best-source selection."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from jaxcap.data.vocab import EOS, PAD, UNK, Vocab
from jaxcap.evaluation import translation
from jaxcap.papers.mnmt import best_source

# These tests read METEOR: the suite leaves it out elsewhere (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("with_meteor")

REFS = {1: ["ein roter kreis links von einem blauen quadrat", "ein roter kreis neben einem quadrat"],
        2: ["zwei gelbe sterne"]}


def test_sacrebleu_multi_reference_with_ragged_counts():
  pytest.importorskip("sacrebleu")
  preds = {1: REFS[1][0], 2: REFS[2][0]}
  bleu, sig = translation.sacrebleu_score(REFS, preds)
  assert bleu == pytest.approx(100.0)
  assert "tok:none" in sig and "nrefs:var" in sig
  worse, _ = translation.sacrebleu_score(REFS, {1: "ein roter kreis", 2: "zwei sterne"})
  assert 0.0 <= worse < 100.0


@pytest.mark.skipif(shutil.which("java") is None, reason="METEOR needs java")
def test_meteor_german_stems_match():
  pytest.importorskip("pycocoevalcap")
  exact = translation.meteor_de({1: ["ein roter kreis"]}, {1: "ein roter kreis"})
  stem = translation.meteor_de({1: ["ein roter kreis"]}, {1: "ein rotes kreises"})
  none = translation.meteor_de({1: ["ein roter kreis"]}, {1: "zwei blaue sterne"})
  assert exact > stem > none  # the German stemmer matches rot-er / rot-es


def test_score_reports_every_metric_or_one_line(capsys):
  pytest.importorskip("pycocoevalcap")
  out = translation.score(REFS, {1: REFS[1][1], 2: "zwei gelbe sterne"}, meteor=False)
  assert {"sacreBLEU", "CIDEr", "Bleu_4"} <= set(out["overall"])


def test_best_source_prefers_fewer_unk_then_likelihood():
  toks = np.array([[4, UNK, EOS, PAD], [4, 5, EOS, PAD], [4, 6, EOS, UNK]])
  assert best_source.choose(toks, np.array([-1.0, -3.0, -2.0])) == 2  # UNK after EOS is not counted
  assert best_source.choose(toks[:2], np.array([-1.0, -3.0])) == 1


def test_best_source_tokens_decodes_every_candidate():
  vocab = Vocab(["a", "b", "c"])
  cands = np.stack([best_source.encode_sources(vocab, [["a"], ["b", "c"]], 3),
                    best_source.encode_sources(vocab, [["c"], []], 3)])  # [2, 2, 4]
  cands[1, 1] = PAD  # a missing source

  def decode(batch):  # "translation" = the source; log-likelihood = its first id
    return batch["src"], -batch["src"][:, 0].astype(np.float64)

  toks, chosen = best_source.best_source_tokens(decode, {"src": None}, cands)
  assert chosen.tolist() == [0, 0]
  np.testing.assert_array_equal(toks[0], cands[0, 0])
