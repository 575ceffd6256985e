"""CLIP-S / RefCLIP-S equal clipscore.py's functions and PAC-S / RefPAC-S pacscore's, given the
same embeddings (scores.npz, written by their own code: make_score_fixture.py), within 1e-6;
the Scorer runs the towers, the prefix and the tokenizer into them."""

import os

import numpy as np
import pytest
from PIL import Image

from jaxcap.clip import model as model_lib
from jaxcap.clip import score
from jaxcap.clip import tokenizer
from tests.clip import helpers

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.fixture(scope="module")
def ref():
  return np.load(os.path.join(FIXTURES, "scores.npz"))


def test_formulas_equal_their_code(ref):
  assert (ref["clip_s"] == 0).any() and (ref["clip_s"] > 0).any()  # the clip at 0 is reached
  clip_s = score.image_text(ref["images"], ref["captions"], 2.5)
  np.testing.assert_allclose(clip_s, ref["clip_s"], rtol=0, atol=1e-6)
  pac_s = score.image_text(ref["images"], ref["captions"], 2.0)
  np.testing.assert_allclose(pac_s, ref["pac_s"], rtol=0, atol=1e-6)
  theirs = np.nan_to_num(ref["refclip_s"], nan=0.0)  # 0 / 0 where CLIP-S and the best cosine are 0
  np.testing.assert_allclose(score.with_references(clip_s, ref["captions"], ref["references"], ref["owner"], 2.5),
                             theirs, rtol=0, atol=1e-6)
  np.testing.assert_allclose(score.with_references(pac_s, ref["captions"], ref["references"], ref["owner"], 2.0),
                             np.nan_to_num(ref["refpac_s"], nan=0.0), rtol=0, atol=1e-6)


def test_clip_caption_reward_variant(ref):
  clip_s = score.image_text(ref["images"], ref["captions"], 2.5)
  best = score.best_reference(ref["captions"], ref["references"], ref["owner"])
  assert (best < 0).any()  # the variants differ where the best cosine is negative or scaled
  got = score.with_references(clip_s, ref["captions"], ref["references"], ref["owner"], 2.5, "clip_caption_reward")
  b = 2.5 * np.clip(best, 0, None)
  want = np.where(clip_s + b == 0, 0, 2 * clip_s * b / np.where(clip_s + b == 0, 1, clip_s + b))
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="refclip variant 'x': expected one of clipscore, clip_caption_reward"):
    score.with_references(clip_s, ref["captions"], ref["references"], ref["owner"], 2.5, "x")


@pytest.fixture(scope="module")
def scorer_and_images(tmp_path_factory):
  """A Scorer on random weights of a small CLIP with CLIP's full vocabulary, and four images."""
  tmp = tmp_path_factory.mktemp("clip")
  path = helpers.random_weights(tmp)
  return score.Scorer(path, batch_size=3), helpers.images(tmp, 4)


@pytest.mark.slow  # several text programs (one per length): past the quick loop's CPU limit
def test_captions_cut_to_their_batch_s_length_embed_as_at_77_tokens(scorer_and_images):
  """text_embeddings embeds shortest first, each batch cut to its longest caption (rounded up to
  8 tokens): the same embeddings, in the callers' order, as the tower on all 77 positions."""
  scorer, _ = scorer_and_images
  captions = ["a dog", "a very " + "long " * 90 + "caption", "two cats on a mat by the door",
              "a bus", "x " * 20, "one two three four five six seven eight nine ten eleven", "a"]
  toks = tokenizer.tokenize([score.PREFIX + c for c in captions], truncate=True)
  lengths = toks.argmax(-1) + 1
  assert len({-(-int(n) // score.TOKEN_STEP) for n in lengths}) >= 3  # batches of several lengths
  model = model_lib.CLIP(scorer.sizes)
  for pooled, fn in ((False, model.encode_text), (True, model.encode_text_pooled)):
    full = np.asarray(model.apply(scorer.variables, toks, method=fn))
    got = scorer.text_embeddings(captions, pooled=pooled)
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-5 * np.abs(full).max())
  # A token before a caption's end of text does change its embedding (the comparison can fail).
  changed = toks[:1].copy()
  changed[0, 2] += 1
  base = np.asarray(model.apply(scorer.variables, toks[:1], method=model.encode_text))
  assert np.abs(np.asarray(model.apply(scorer.variables, changed[:, :8], method=model.encode_text)) - base).max() > 1e-4


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_scorer_end_to_end(scorer_and_images):
  scorer, files = scorer_and_images
  captions = {0: "a dog", 1: "two cats on a mat", 2: "a very " + "long " * 90 + "caption", 3: "a bus"}
  references = {0: ["a puppy", "a dog running"], 1: ["cats"], 2: ["something"], 3: ["a red bus", "a bus", "road"]}
  out = scorer.score(captions, files, references)
  assert set(out["overall"]) == {"CLIP-S", "RefCLIP-S"} and len(out["per_image"]) == 4
  # The same numbers from the parts: the prefix, truncation, preprocessing, towers, formulas.
  import jax
  from jaxcap.clip import preprocess
  model = model_lib.CLIP(scorer.sizes)
  pixels = np.stack([preprocess.load_image(files[k], 32) for k in range(4)])
  img = np.asarray(model.apply(scorer.variables, pixels, method=model.encode_image))
  toks = tokenizer.tokenize(["A photo depicts " + captions[k] for k in range(4)], truncate=True)
  cap = np.asarray(model.apply(scorer.variables, toks, method=model.encode_text))
  want = score.image_text(img, cap, 2.5)
  got = np.array([out["per_image"][k]["CLIP-S"] for k in range(4)])
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  assert out["overall"]["CLIP-S"] == pytest.approx(float(np.mean(got)))
  pac = scorer.score(captions, files, references, kind="pac")
  assert set(pac["overall"]) == {"PAC-S", "RefPAC-S"}
  np.testing.assert_allclose([pac["per_image"][k]["PAC-S"] for k in range(4)], got * 2.0 / 2.5, rtol=1e-6, atol=1e-7)
  # Each image embedded once: a second scoring finds them kept.
  before = dict(scorer._images)
  scorer.score({3: "a bus", 0: "a cat"}, files)
  assert scorer._images.keys() == before.keys()
  with pytest.raises(ValueError, match="image 9: no image file for it"):
    scorer.score({9: "x"}, files)
  with pytest.raises(ValueError, match="caption 0: no reference"):
    scorer.score({0: "x"}, files, {0: []})


def test_scorer_refuses_another_vocabulary():
  with pytest.raises(ValueError, match="a vocabulary of 500 tokens; expected CLIP's 49408"):
    score.Scorer(os.path.join(FIXTURES, "pacs.pth"))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_jaxcap_score_adds_the_clip_scores(scorer_and_images):
  import jaxcap
  from jaxcap.evaluation import signature
  scorer, files = scorer_and_images
  refs = {0: ["a puppy"], 1: ["cats", "two cats"], 2: ["a thing"], 3: ["a bus"]}
  preds = {0: "a dog", 1: "two cats", 2: "a thing", 3: "a car"}
  out = jaxcap.score(refs, preds, metrics=["Bleu"], tokenize=False, images=files,
                     clip_weights=scorer.weights_file, pac_weights=scorer.weights_file, log=lambda _: None)
  assert {"Bleu_4", "CLIP-S", "RefCLIP-S", "PAC-S", "RefPAC-S"} <= set(out["overall"])
  alone = scorer.score(preds, files, refs)
  for k in preds:
    assert out["per_image"][k]["CLIP-S"] == pytest.approx(alone["per_image"][k]["CLIP-S"], abs=1e-6)
    assert "Bleu_4" in out["per_image"][k]
  text = signature.line({"metrics": out["signature"]})
  assert "CLIP-S ViT-64/16@32,quick_gelu,#" in text and "prompt='A photo depicts '" in text and "ref=clipscore" in text
  with pytest.raises(ValueError, match="images: the CLIP scores need"):
    jaxcap.score(refs, preds, metrics=["Bleu"], clip_weights=scorer.weights_file)
  with pytest.raises(ValueError, match="refclip_variant 'both': expected one of"):
    jaxcap.score(refs, preds, metrics=["Bleu"], images=files, clip_weights=scorer.weights_file,
                 refclip_variant="both")
