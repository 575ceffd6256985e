"""The CLIP reward of self-critical training: caption word ids become ``clip.tokenize``'s ids on
the device (equal to decoding and tokenising on the host, long captions cut at 77), the device
CLIP-S equals the host computation within 1e-5, and the jitted SCST step with the CLIP reward
equals the host-reward step, with no host callback."""

import os

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.clip import reward, score, tokenizer
from jaxcap.data.vocab import Vocab
from tests.clip import helpers

WORDS = ["a", "man", "riding", "horse", "on", "the", "beach", "don't", "3.5", "café", "x-ray",
         "supercalifragilistic", "naïve", "dog's", "1990s", "&amp;", "t-shirt", "ünïcödé"]


def test_clip_tokens_equal_decode_and_tokenize():
  vocab = Vocab(WORDS)
  ids, lens = reward.word_table(vocab)
  assert lens[:3].tolist() == [0, 0, 0] and lens[3] == len(tokenizer.default().encode("<unk>"))
  prompt = jnp.asarray(tokenizer.default().encode(score.PREFIX), jnp.int32)
  rng = np.random.default_rng(0)
  for t in (1, 6, 20, 70):  # 70 words: past 77 CLIP tokens, cut with <|endoftext|> last
    words = rng.integers(0, len(vocab), size=(40, t))
    got = np.asarray(jax.jit(reward.clip_tokens)(jnp.asarray(words), jnp.asarray(ids), jnp.asarray(lens), prompt))
    want = tokenizer.tokenize([score.PREFIX + vocab.decode(r) for r in words], truncate=True)
    np.testing.assert_array_equal(got, want)
  assert (want[:, -1] == tokenizer.VOCAB_SIZE - 1).any()  # some were cut


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("reward")
  scorer = score.Scorer(helpers.random_weights(tmp), batch_size=4)
  files = helpers.images(tmp, 5)
  images = reward.image_embeddings(scorer, list(files), files, str(tmp / "cache"), log=lambda _: None)
  return scorer, files, images, tmp


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
GRAMMAR = os.path.join(FIXTURES, "grammar_head.pth")


def test_grammar_head_equals_theirs(tmp_path):
  """P(grammatical) of CLIP-Caption-Reward's head (fixture: their Sequential saved by torch) on
  the same inputs; wrong files are one line."""
  ref = np.load(os.path.join(FIXTURES, "embeddings.npz"))
  head = reward.load_grammar_head(GRAMMAR, 64)
  np.testing.assert_allclose(np.asarray(reward.grammar_prob(jnp.asarray(ref["grammar_x"]), head)),
                             ref["grammar_p"], rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match=r"grammar head shapes \[32, 64\], \[2, 32\]; expected \[P, 128\]"):
    reward.load_grammar_head(GRAMMAR, 128)
  with pytest.raises(ValueError, match=r"pacs\.pth: 0 tensors named \*grammar_score_head\.0\.weight"):
    reward.load_grammar_head(os.path.join(FIXTURES, "pacs.pth"), 64)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_device_clip_s_equals_the_host(parts):
  scorer, files, images, tmp = parts
  vocab = Vocab(WORDS)
  head = reward.load_grammar_head(GRAMMAR, scorer.sizes.transformer_width)
  arrays = reward.build(scorer, vocab, images, head)
  rng = np.random.default_rng(1)
  words = rng.integers(0, len(vocab), size=(12, 16))
  words[0, 0] = 2  # an empty caption (EOS first)
  index = rng.integers(0, len(files), size=12)
  dev, dev_grammar = jax.jit(reward.device_scores, static_argnums=1)(arrays, scorer.sizes, jnp.asarray(words), jnp.asarray(index))
  host = reward.host_clip_s(scorer, vocab, words, images[index])
  np.testing.assert_allclose(np.asarray(dev), host, rtol=0, atol=1e-5)
  assert (host > 0).any()
  host_grammar = reward.host_grammar(scorer, vocab, words, head)
  np.testing.assert_allclose(np.asarray(dev_grammar), host_grammar, rtol=0, atol=1e-5)
  assert host_grammar.std() > 0
  # The image embeddings were cached and are read back, not recomputed.
  again = reward.image_embeddings(scorer, list(files), files, str(tmp / "cache"),
                                  log=lambda _: pytest.fail("recomputed"))
  np.testing.assert_array_equal(again, images)


def _clip_trainer(tmp_path, baseline="greedy"):
  """The tiny SCST trainer with CIDEr-D, CLIP-S and the grammar head in its reward; its training
  images drawn as PNGs named by image id."""
  from jaxcap.data import render
  from jaxcap.data.synthetic import SyntheticScenes
  from tests.training.test_scst import _device_step_setup
  from tests.training.test_train import tiny_config
  d = tiny_config().data
  scenes = SyntheticScenes(num_train=d.num_train, num_val=0, num_test=0, seed=d.seed)
  render.write_dataset(str(tmp_path / "scenes"), scenes, 32, log=lambda _: None, names="image_id")
  return _device_step_setup(tmp_path, baseline, cider_weight=0.5, clip_weight=2.0,
                            clip_model=helpers.random_weights(tmp_path),
                            clip_images=str(tmp_path / "scenes" / "images"), grammar_weight=0.3,
                            grammar_head=GRAMMAR)


@pytest.mark.slow
def test_scst_step_with_clip_reward_equals_the_host_step(tmp_path):
  from jaxcap.training import scst
  from tests.training.test_scst import _primitives
  trainer, batch = _clip_trainer(tmp_path)
  dev_step = scst.make_scst_step(trainer)
  prims = _primitives(jax.make_jaxpr(dev_step.jitted)(trainer.initial_state(), batch, dev_step.reward_arrays).jaxpr)
  assert not {p for p in prims if "callback" in p}, prims
  s_dev, m_dev = dev_step(trainer.initial_state(), batch, 0)
  trainer.config.scst.reward = "host"
  s_host, m_host = scst.make_scst_step(trainer)(trainer.initial_state(), batch, 0)
  for k in ("reward", "baseline", "scst_loss", "greedy_reward"):
    np.testing.assert_allclose(float(m_dev[k]), float(m_host[k]), rtol=1e-5, atol=1e-5)
  # CLIP-S and the grammar head moved the reward: CIDEr-D alone gives another.
  trainer.config.scst.reward = "device"
  trainer.config.scst.clip_weight = trainer.config.scst.grammar_weight = 0.0
  _, m_cider = scst.make_scst_step(trainer)(trainer.initial_state(), batch, 0)
  assert abs(float(m_cider["reward"]) - float(m_dev["reward"])) > 1e-4
  cached = list((tmp_path / "cache").glob("clip_images_*.npy"))
  assert len(cached) == 1 and np.load(cached[0]).shape == (trainer.config.data.num_train, helpers.SIZES.embed_dim)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_clip_reward_config_errors(tmp_path):
  from jaxcap.training import validation
  from tests.training.test_train import tiny_config
  config = tiny_config()
  config.scst.clip_weight = 2.0
  with pytest.raises(ValueError, match=r"^config field scst.clip_model: scst.clip_weight=2.0 needs a CLIP weights file"):
    validation.check_config(config)
  config.scst.clip_model = str(tmp_path / "absent.pt")
  with pytest.raises(ValueError, match=r"^config field scst.clip_images: .*needs the training images"):
    validation.check_config(config)
  config.scst.clip_images = str(tmp_path / "nowhere")
  validation.check_config(config)
  # The files are read when the step is built (the start of the run): each named.
  from jaxcap.training import scst, train_lib
  trainer = train_lib.Trainer(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match=r"^config field scst.clip_model: .*absent\.pt: no such file; expected CLIP weights"):
    scst.make_scst_step(trainer)
  trainer.config.scst.clip_model = helpers.random_weights(tmp_path)
  with pytest.raises(ValueError, match=r"^config field scst.clip_images: --clip_images=.*nowhere: no such folder"):
    scst.make_scst_step(trainer)
  assert not (tmp_path / "run").exists()
  config.scst.clip_model = trainer.config.scst.clip_model
  config.scst.clip_weight = -1.0
  with pytest.raises(ValueError, match=r"config field scst.clip_weight: expected"):
    validation.check_config(config)
  config.scst.clip_weight = 0.0
  config.scst.grammar_weight = 0.5
  with pytest.raises(ValueError, match=r"^config field scst.grammar_head: scst.grammar_weight=0.5 needs"):
    validation.check_config(config)
