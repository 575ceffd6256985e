"""The decoder protocol shared by every jaxcap model (see docs/DESIGN.md, section 3).

A model's dataclass fields are its config schema (:mod:`jaxcap.models.fields`): the registry
builds it from ``config.model`` with one shared validator, so a model has no ``from_config``.

Dimension legend: B batch (images, or images x captions / beams), S captions per image,
T time steps, D the output layer's input width, V vocabulary, K beams.

A model implements ``encode``, ``init_cache`` and one decoding step; ``decode_train`` (teacher
forcing), ``decode_train_grouped`` and ``__call__`` are provided here. Greedy decoding, sampling
and beam search in :mod:`jaxcap.decoding` only ever call these methods, so one search serves
Transformer key/value caches and recurrent states alike.

One step, two ways to write it:

* ``decode_step(enc, cache, tokens[B], t, train) -> (logits [B, V] float32, cache, aux)``; or
* split in two: ``step_features(enc, cache, tokens[B], t, train) -> (features, cache, aux)``,
  everything up to the output layer's input (any pytree of ``[B, ...]`` leaves, with the
  dropout that the model applies before the output layer already applied), and
  ``output_layer(features, train) -> logits float32``, which must be time-independent and act
  on each position alone (leading axes ``[B]`` or ``[B, T]``). Then ``decode_step`` is
  ``output_layer(step_features(...))`` (a split model does not override it: teacher forcing
  would not see the override).

Teacher forcing, ``decode_train(enc, tokens[B, T], train) -> (logits [B, T, V], aux)``, is by
default the step scanned over time (``nn.scan``: the variables in ``scan_broadcast`` are shared
by every step, the ``"dropout"`` stream is split per step, ``enc`` is broadcast and the time index
``t`` is a scanned int32 input); aux leaves ``[B, ...]`` are stacked to ``[B, T, ...]``. So a
recurrent model writes its recurrence once, and the cached decoding and teacher forcing cannot
drift apart. A model whose teacher forcing runs all positions in parallel (the Transformer and
ETA) overrides ``decode_train``.

Why the output layer is hoisted out of the scan: for a split step, the scan runs
``step_features`` only, and ``output_layer`` runs once on the stacked ``[B, T, ...]`` features.
The output layer (a D x V projection, V ~ 10^4) is most of a recurrent step's arithmetic; inside
the loop it would run as T small ``[B, D] x [D, V]`` matmuls forward and 2T backward, with the
backward loop carrying its D x V weight gradient and adding to it at every step; hoisted, it is
one ``[B*T, D] x [D, V]`` matmul forward and two backward, which keeps an accelerator busy and
leaves the sequential loop with the recurrence alone. The logits are the same, since the layer
is time-independent (its weight gradient is summed over the steps in another order: equal up to
float rounding). Dropout inside ``output_layer`` therefore draws one mask for all steps outside
the scan, while dropout inside ``step_features`` draws per step, as ``decode_step`` does; a
model puts each dropout where its equations (and its earlier random stream) have it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import BOS
from jaxcap.errors import BadInput


def repeat_batch(tree, n: int):
  """Repeats every leaf ``n`` times along axis 0: ``[B, ...] -> [B*n, ...]`` (image-major)."""
  if n == 1:
    return tree
  return jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), tree)


def check_fits(model, params, info: dict, what: str) -> None:
  """Traces encode + one decode step on a dummy batch (shapes only), so that parameters that do
  not fit ``model`` (e.g. a changed field of a functional ablation) fail here in one line
  (``<what>: the parameters do not fit ...``), not inside a later decode."""
  def probe(params, batch):
    enc = model.apply(params, batch, method="encode")
    cache = model.apply(params, enc, 2, method="init_cache")
    tokens = jnp.full((2,), 1, jnp.int32)
    return model.apply(params, enc, cache, tokens, jnp.int32(0), method="decode_step")[0]

  try:
    jax.eval_shape(probe, params, jax.tree.map(jnp.asarray, batch_lib.dummy(info, 2)))
  except Exception as e:  # flax scope errors, shape mismatches, the models' own ValueErrors
    # Which of these is the changed field's doing cannot be told apart here: one line, its
    # cause chained (a notebook's traceback shows it).
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise BadInput(f"{what}: the parameters do not fit the changed model: {first}") from e


def shift_right(captions):
  """Decoder inputs: BOS followed by the captions without their last position."""
  bos = jnp.full(captions.shape[:-1] + (1,), BOS, captions.dtype)
  return jnp.concatenate([bos, captions[..., :-1]], axis=-1)


class CaptionModel(nn.Module):
  """Base class: subclasses implement ``encode``, ``init_cache`` and one decoding step
  (``decode_step``, or ``step_features`` + ``output_layer``); see the module docstring."""

  trainable = True
  # True when ``decode_train(enc, tokens, train, group=S)`` accepts ``enc`` for B / S images,
  # each serving S consecutive rows of ``tokens`` (see ``decode_train_grouped``). A protocol
  # switch: the captioner that implements ``group`` sets it, not a class of sizes it inherits.
  decode_train_groups = False
  # The variable collections that the teacher-forcing scan shares across time steps (all that
  # a step reads: TPGN adds its ``constants`` and ``ablation`` collections).
  scan_broadcast = ("params",)

  # False for a model that reads only the global image feature (``batch["global_feat"]``, e.g.
  # TPGN, Show and Tell): a user's global features alone then caption it whatever the regions
  # of its dataset (jaxcap.data.batch.from_features).
  reads_regions = True
  # True for a model whose ``encode`` reads ``batch["global_feat"]`` (FC models, UpDown, TPGN):
  # features given without it then get the mean of their regions, as a dataset without global
  # features does; a model that never reads it (the Transformer) gets zeros of the run's
  # global width, so its regions need not be of that width (self-critical's Transformer
  # checkpoints record a global width they never use).
  reads_global_feat = False

  # --- Optional hooks: a model overrides what it needs; these defaults do nothing. -----------
  # Checks of single config fields, ``{field: fields.Check}`` (jaxcap.models.fields.validate).
  field_checks: ClassVar[Mapping[str, Any]] = {}
  # The model setting that reads no image features, named when the data is text-only
  # (MNMT: "model.variant='nmt' (text only)"); empty: the model has none.
  text_only_setting: ClassVar[str] = ""
  # Variable collections no optimiser update moves, weight decay included (TPGN's
  # ``constants``): jaxcap.training.optim.make_optimizer leaves them out.
  frozen_collections: ClassVar[tuple[str, ...]] = ()

  # The smallest sizes that still run every path (the ``tiny`` config argument) for the
  # shared size names; a model adds or changes its own in ``tiny_sizes``.
  TINY_SIZES: ClassVar[Mapping[str, Any]] = {
      "dim": 32, "num_heads": 4, "ff_dim": 64, "num_layers": 1, "num_dec_layers": 1,
      "embed_dim": 16, "hidden_dim": 16, "att_dim": 16, "d": 3}

  @classmethod
  def tiny_sizes(cls, model_config: Mapping[str, Any]) -> dict:
    """The ``model`` fields that ``configs/<file>.py:<arg>,tiny`` sets (``model_config``: the
    section as the config file built it): :data:`TINY_SIZES` for the fields this model has.
    A model with other sizes (memory slots, a field whose value bounds another) overrides it."""
    return {k: v for k, v in cls.TINY_SIZES.items() if k in model_config}

  @staticmethod
  def config_presets(values: dict) -> dict:
    """The config section's values with keys that stand for several fields expanded (MNMT's
    ``variant``: a row of its Table 2); called before the fields are checked."""
    return values

  @staticmethod
  def check_fields(values: dict) -> None:
    """Relations between the checked field values (a head count dividing a width): a
    one-line ``BadInput`` naming the field."""

  @staticmethod
  def check_data(values: dict) -> None:
    """The field values against the data's (``data_values``: a source vocabulary MNMT
    needs): a one-line ``BadInput`` naming the field."""

  @staticmethod
  def longest_sequence(values: dict) -> int | None:
    """The most token positions the model's tables cover, for its checked field values
    (``None``: any length). Teacher forcing takes ``data.max_len + 1`` positions and decoding
    ``decode.max_len``; both are checked against it before anything is written or compiled
    (M²'s frozen position table of their ``max_len=54``)."""
    return None

  # What ``Run.ablate`` accepts besides the model's fields: inputs its ablations read that are
  # not parameters (TPGN: "role_centroids"), each added by ``with_ablation_input``.
  ablation_inputs: ClassVar[tuple[str, ...]] = ()

  def with_ablation_input(self, variables: dict, name: str, value) -> dict:
    """``variables`` with the ablation input ``name`` (one of ``ablation_inputs``) added."""
    raise BadInput(f"ablate: {name!r} is not an input of this model's ablations")

  @staticmethod
  def word_figures(words, aux: dict, out_prefix: str, title: str = "") -> list[str]:
    """The model's own per-word figures of one caption, beside the shared region-attention
    figure (:func:`jaxcap.analysis.words.plot_word_figures`): ``words`` and its
    ``decode_step`` aux cut to them (:func:`jaxcap.analysis.words.caption_aux`), drawn to
    ``<out_prefix>_<name>.png``; returns the paths written (ETA: its gate, AAT: its steps)."""
    del words, aux, out_prefix, title
    return []

  def check_prepare(self, dataset) -> None:
    """What :meth:`prepare_variables` will read besides ``dataset`` (TPGN's GloVe file),
    checked before a fresh run writes anything: a one-line ``BadInput`` naming the file."""
    del dataset

  def prepare_variables(self, variables: dict, dataset) -> dict:
    """A fresh run's variables with its data-derived constants filled in (TPGN: v̄ of its
    eq. 9), computed once by the trainer before the first step and checkpointed with them."""
    del dataset
    return variables

  def required_inputs(self) -> tuple[str, ...]:
    """What the model reads that a dataset may lack: ``"image"`` (image features, not a
    text-only placeholder), ``"boxes"`` (region boxes), ``"attributes"`` (attribute words),
    ``"src"`` (a translation source). The trainer and ``evaluate.py`` refuse data without them
    (:func:`jaxcap.training.validation.check_model_inputs`), as :meth:`jaxcap.api.Run.caption`
    refuses features without them."""
    return ("image",)

  def encode(self, batch: dict, train: bool = False) -> Any:
    raise NotImplementedError

  def init_cache(self, enc: Any, max_len: int) -> Any:
    raise NotImplementedError

  def step_features(self, enc, cache, tokens, t, train: bool = False):
    """One step up to the output layer: ``(features, cache, aux)`` (optional; see the module
    docstring). ``features`` is any pytree of ``[B, ...]`` leaves."""
    raise NotImplementedError(f"{type(self).__name__} defines neither decode_step nor "
                              "step_features / output_layer")

  def output_layer(self, features, train: bool = False):
    """``features`` (leading axes ``[B]`` or ``[B, T]``) -> logits float32 ``[..., V]``."""
    raise NotImplementedError(f"{type(self).__name__} defines step_features but no output_layer")

  def _splits_step(self) -> bool:
    return type(self).step_features is not CaptionModel.step_features

  def decode_step(self, enc, cache, tokens, t, train: bool = False):
    """One word: ``(logits [B, V] float32, cache, aux with [B, ...] leaves)``.

    Default: ``output_layer(step_features(...))``.
    """
    features, cache, aux = self.step_features(enc, cache, tokens, t, train)
    return self.output_layer(features, train), cache, aux

  def decode_train(self, enc, tokens, train: bool = False):
    """Teacher forcing: ``(logits [B, T, V] float32, aux with [B, T, ...] leaves)``.

    Default: the step scanned over time, with the output layer hoisted out of the scan when the
    step is split (module docstring). ``tokens`` int32 ``[B, T]`` are the decoder inputs.
    """
    if self._splits_step():
      features, aux = self.teacher_forced_features(enc, tokens, train)
      return self.output_layer(features, train), aux
    return self._scan_step("decode_step", enc, tokens, train)

  def teacher_forced_features(self, enc, tokens_BxT, train: bool = False):
    """``step_features`` scanned over time: ``(features with [B, T, ...] leaves, aux)``."""
    return self._scan_step("step_features", enc, tokens_BxT, train)

  def _scan_step(self, method: str, enc, tokens_BxT, train: bool):
    """``method`` (``decode_step`` or ``step_features``) over ``t = 0 .. T-1``, from
    ``init_cache``; its first output and aux are stacked along axis 1."""

    def body(mdl, cache, enc, tokens_B, t):
      out, cache, aux = getattr(mdl, method)(enc, cache, tokens_B, t, train)
      return cache, (out, aux)

    scan = nn.scan(body, variable_broadcast=self.scan_broadcast,
                   split_rngs={"params": False, "dropout": True},
                   in_axes=(nn.broadcast, 1, 0), out_axes=1)
    steps_T = jnp.arange(tokens_BxT.shape[1], dtype=jnp.int32)
    _, (out, aux) = scan(self, self.init_cache(enc, tokens_BxT.shape[1]), enc, tokens_BxT, steps_T)
    return out, aux

  def decode_train_grouped(self, enc, tokens_BxSxT, train: bool = False):
    """Teacher-forced logits of S captions per image from the per-image encoding.

    A model whose image side enters the decoder only through attention (each query attends on
    its own) sets ``decode_train_groups``: its ``decode_train(..., group=S)`` attends the S
    captions' queries to one copy of the image keys/values, which saves the S-fold copy and its
    gradient (the Transformer and ETA do). Otherwise ``enc`` is repeated S times (image-major).

    Args:
      enc: ``encode``'s output for B images.
      tokens_BxSxT: int32 decoder inputs.

    Returns:
      ``(logits [B, S, T, V] float32, aux dict with [B*S, ...] leaves)``.
    """
    b, s, t = tokens_BxSxT.shape
    tokens = tokens_BxSxT.reshape(b * s, t)
    if self.decode_train_groups:
      logits, aux = self.decode_train(enc, tokens, train=train, group=s)
    else:
      logits, aux = self.decode_train(repeat_batch(enc, s), tokens, train=train)
    return logits.reshape(b, s, t, -1), aux

  def __call__(self, batch: dict, tokens, train: bool = False):
    """Teacher-forced logits.

    Args:
      batch: a batch dict (docs/DESIGN.md, section 2).
      tokens: int32 ``[B, S, T]`` decoder inputs (``shift_right(batch["captions"])``).
      train: enables dropout.

    Returns:
      ``(logits [B, S, T, V] float32, aux dict)``.
    """
    return self.decode_train_grouped(self.encode(batch, train=train), tokens, train=train)
