"""Multimodal attention NMT (Caglayan et al., 2016): English source + image -> German.

``--config configs/mnmt.py:<dataset>,variant=<v>`` with ``v`` one of :data:`TABLE2`
(Table 2's rows in order: ``nmt``, ``imgtxt``, ``mnmt1`` ... ``mnmt8``; default ``mnmt7``,
CONCAT with encoder-dependent attention and a shared decoder projection, the paper's best).
``decoder=nmtpy`` (or ``--config.model.decoder=nmtpy``) is the authors' released code
(lium-lst/nmtpy: one recurrent state, dl4mt's GRUs and biases, its attention parameters per
row, linear CONCAT) instead of the paper's equations read literally (``decoder=paper``, the
default); ``fusion_tanh=true|false`` overrides either decoder's CONCAT activation.

* ``synthetic``: CPU-sized, the bilingual synthetic scenes (``task="translate"``, grid
  features as the visual annotations; 30% of the English sources omit a colour that the
  German references name and the image shows). E = 64, H = 96, Adam 2e-3, 600 steps of 50
  images x 5 references, greedy decoding.
* ``multi30k``: the paper's settings (section 5): E = 620, H = 1000, Adam (lr 4e-4, nmtpy's
  default), batch 32, Xavier initialisation with zero biases (the model's), L2 lambda = 1e-5 on
  the cost, validation BLEU every epoch with early stopping after 20 evaluations without
  improvement, beam 12. Preprocessing: jaxcap's tokenizer (lowercase, punctuation removed;
  not Moses' tokenizer.perl), sentences cut at 50 words (the paper drops pairs outside
  [3, 50] words and with a length ratio > 3: not implemented, cut instead), the 10,000 most
  frequent German words + UNK. Multi30k's ResNet features are not available here, so the
  data is ``text_only`` (one zero region): only ``variant=nmt`` is meaningful on it; point
  ``data.features_npy`` at ``[lines, 196, 1024]`` arrays for the multimodal rows.
* ``multi30k,size=cpu``: the CPU-sized text run (E = 128, H = 256, batch 64, 1,500 steps,
  sentences cut at 30 words, words seen twice, greedy decoding) used for the README's
  real-text NMT numbers (``evaluate.py --beam-size 12`` for beam search).
"""

import ml_collections

from jaxcap import config_common as common
from jaxcap.errors import BadInput
from jaxcap.papers.mnmt import model as mnmt

# Table 2's rows, in order.
TABLE2 = ("nmt", "imgtxt", "mnmt1", "mnmt2", "mnmt3", "mnmt4", "mnmt5", "mnmt6", "mnmt7", "mnmt8")

# Multi30k: 29,000 training pairs; at 32 pairs per step.
_M30K_STEPS_PER_EPOCH = 29000 // 32


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, variant="mnmt7", fusion_tanh=None, decoder="paper", size="")
  if a.variant not in TABLE2:
    raise BadInput(f"config argument variant: expected one of {TABLE2}, got {a.variant!r}")
  if a.decoder not in mnmt.DECODERS:
    raise BadInput(f"config argument decoder: expected one of {mnmt.DECODERS}, got {a.decoder!r}")
  size = a.size or ("paper" if a.dataset == "multi30k" else "cpu")
  if size not in ("paper", "cpu"):
    raise BadInput(f"config argument size: expected 'paper' or 'cpu', got {a.size!r}")
  c = common.base_config(a.dataset, "mnmt")
  # The Table 2 row sets the model's modalities, fusion and attention sharing.
  for field in mnmt.VARIANT_FIELDS:
    del c.model[field]
  c.model.variant = a.variant
  # None: the decoder's own CONCAT (the paper's tanh, nmtpy's linear); a bool placeholder so
  # that --config.model.fusion_tanh=false still parses.
  c.model.fusion_tanh = (ml_collections.config_dict.placeholder(bool) if a.fusion_tanh is None
                         else a.fusion_tanh)
  c.model.decoder = a.decoder
  c.data.task = "translate"

  # Paper section 5.2.
  c.batch_size = 32
  c.schedule = "constant"
  c.learning_rate = 4e-4
  c.adam_b2 = 0.999
  c.adam_eps = 1e-8
  c.warmup_steps = 0
  c.grad_clip_value = 0.0
  c.grad_clip_norm = 1.0  # nmtpy's clip_c
  c.l2 = 1e-5
  c.best_metric = "Bleu_4"
  c.early_stopping_patience = 20
  c = common.run_length(c, 100 * _M30K_STEPS_PER_EPOCH, _M30K_STEPS_PER_EPOCH)
  c.decode.method = "beam"
  c.decode.beam_size = 12
  if a.dataset == "multi30k":
    c.data.max_len = 50
    c.data.src_max_len = 50
    c.data.min_word_count = 1
    c.data.max_vocab_size = 10000  # top-10k German words + UNK
    c.data.text_only = True
  c.decode.max_len = c.data.max_len

  if a.dataset == "synthetic":
    c.data.grid = True  # grid cells as the paper's conv-feature annotations
    c.data.min_word_count = 1
  if size == "cpu":
    c = common.run_length(common.cpu_sized(c), 600, 300)
    c.decode.method = "greedy"  # validation at CPU sizes decodes greedily (the paper's: beam 12)
    c.model.embed_dim, c.model.hidden_dim = 64, 96
    c.learning_rate = 2e-3
    c.early_stopping_patience = 0
    c.decode.beam_size = 3
    if a.dataset == "multi30k":
      c.model.embed_dim, c.model.hidden_dim = 128, 256
      c.batch_size = 64
      c.num_train_steps = 1500  # ~3.3 epochs, ~10 min on 2 CPU cores
      c.eval_every_steps = 1500
      c.checkpoint_every_steps = 500
      c.eval_num_images = 1014
      c.data.max_len = 30  # 30 words keep ~99% of the German sentences whole
      c.data.src_max_len = 30
      c.decode.max_len = 30
      c.data.min_word_count = 2
  return c
