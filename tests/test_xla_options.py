"""jaxcap.xla_options: decoding's programs (the searches called at the top level, as
``Run.caption`` and ``jaxcap-serve`` call them; ``predict``'s decode_fn; the exported captioner)
are compiled without YNNPACK fusions on CPU; a user's own programs, a search inside them
included, keep XLA's defaults."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import decoding, inference, serving, xla_options
from jaxcap.training import parallel

from tests.test_export import INFO, features, tiny_run

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU backend's option")


def _ynn(compiled_text: str) -> bool:
  """Whether the compiled program holds a YNNPACK fusion (an instruction, not the option's
  name, which the program's text may print too)."""
  return re.search(r"%ynn_fusion[.\d]* = ", compiled_text) is not None


def _plain_uses_ynn() -> bool:
  """Whether this jaxlib fuses a dot into YNNPACK by default (else nothing to turn off)."""
  x = np.ones((5, 64), np.float32)
  return _ynn(jax.jit(lambda a, b: a @ b).lower(x, x.T).compile().as_text())


def test_options_are_cpu_only_and_known_to_this_jaxlib():
  options = xla_options.decode_compiler_options()
  if options is None:  # a jaxlib without the option: XLA's defaults everywhere
    assert not _plain_uses_ynn()
    return
  assert options == {"xla_cpu_experimental_ynn_fusion_type": ""}
  x = np.ones((5, 64), np.float32)
  assert not _ynn(jax.jit(lambda a, b: a @ b, compiler_options=options).lower(x, x.T).compile().as_text())


@pytest.fixture(scope="module")
def run():
  """The tiny Transformer run every test here decodes with (built once: its initialisation is
  seconds of CPU)."""
  return tiny_run("transformer")


def _lowered(run, program: str):
  """One of decoding's programs as it is compiled when called at the top level."""
  model, params, batch = run.feature_model, run.feature_params, run.batch(features(INFO))
  opts = decoding._common_opts(0, False)
  if program == "greedy":  # decoding's searches called at the top level (Run.caption, jaxcap-serve)
    return decoding._greedy_jit.lower(model, params, batch, opts, max_len=4, return_aux=False)
  if program == "beam":
    return decoding._beam_search_jit.lower(
        model, params, batch, dict(opts, penalty=decoding._penalty_coefficients("none", 0.6),
                                   diversity=np.float32(0.5)),
        beam_size=3, max_len=4, beam_mode="live", groups=1, block_trigrams=False, return_aux=False)
  # predict / evaluate.py's program.
  method = program.removeprefix("decode_fn_")
  fn = inference.decode_fn(model, run.vocab, run.decode_config(method, 3),
                           parallel.make_mesh(jax.devices()[:1]))
  return fn.lower(params, batch, jax.random.key(0))


# One program per test (each compilation is a second or two of CPU); greedy in the quick loop.
@pytest.mark.parametrize("program", [
    "greedy",
    pytest.param("beam", marks=pytest.mark.slow),
    pytest.param("decode_fn_greedy", marks=pytest.mark.slow),
    pytest.param("decode_fn_beam", marks=pytest.mark.slow)])
def test_decoding_programs_are_compiled_without_ynn_fusions(run, program):
  if not _plain_uses_ynn():
    pytest.skip("this jaxlib does not fuse dots into YNNPACK")
  assert not _ynn(_lowered(run, program).compile().as_text())


def test_a_search_inside_a_user_s_jit_keeps_xla_s_defaults(run):
  # Inside a user's own jit a search is compiled with the user's program, under its options
  # (JAX refuses options on a nested jit): the control, whose dots are fused.
  if not _plain_uses_ynn():
    pytest.skip("this jaxlib does not fuse dots into YNNPACK")
  model, params, batch = run.feature_model, run.feature_params, run.batch(features(INFO))
  plain = jax.jit(lambda p, x: decoding.greedy(model, p, x, max_len=4).tokens)
  assert _ynn(plain.lower(params, batch).compile().as_text())
  np.testing.assert_array_equal(plain(params, batch), decoding.greedy(model, params, batch, max_len=4).tokens)


@pytest.mark.slow  # an export, two compilations and a caption call: several seconds of CPU
def test_the_exported_captioner_is_compiled_without_ynn_fusions(run, tmp_path):
  if not _plain_uses_ynn():
    pytest.skip("this jaxlib does not fuse dots into YNNPACK")
  run.export(str(tmp_path / "t.jaxcap"), platforms=("cpu",))
  c = serving.load(str(tmp_path / "t.jaxcap"))
  feats = features(INFO)
  batch = {k: jnp.asarray(feats[k]) for k in c.reads}
  for method in ("greedy", "beam"):
    assert not _ynn(c._call[method].lower(c._params, batch).compile().as_text())
  # Its captions are Run.caption's (both without the fusions).
  assert [r["caption"] for r in c.caption(feats)] == run.caption(feats)


def test_a_jax_without_the_trace_check_decodes_with_the_plain_jit(run, monkeypatch):
  # The check is JAX's private trace_state_clean: a release without it gets the plain jit.
  assert xla_options._top_level() is True
  monkeypatch.setattr(xla_options, "_TRACE_STATE_CLEAN", None)
  assert xla_options._top_level() is False
  model, params, batch = run.feature_model, run.feature_params, run.batch(features(INFO))
  out = decoding.greedy(model, params, batch, max_len=4).tokens
  monkeypatch.undo()
  np.testing.assert_array_equal(out, jax.jit(lambda p, x: decoding.greedy(model, p, x, max_len=4).tokens)(params, batch))
