"""``synthetic_scenes``: an embedded, seeded captioning / translation dataset.

The project's default dataset and a diagnostic benchmark: every scene is symbolic (a few
coloured shapes with boxes), so each mechanism of the reimplemented papers has something
to find, and nothing has to be downloaded.

Scenes
  2-6 objects, each with a ``shape`` (circle, square, triangle, star, cross, diamond), a
  ``colour`` (red, green, blue, yellow, white, black, purple, orange), a ``size`` (small,
  large: the category also sets the box side) and a ``material`` (plain, wooden, metal,
  glass; plain in ~70% of objects). Boxes are ``x1, y1, x2, y2`` in the unit square with y
  pointing down (image convention). Free objects overlap each other by at most 15% of the
  smaller box (so "neighbour" relations of the Image Transformer occur, but never
  accidental containment); in ~35% of scenes a large *container* holds a small object
  entirely inside its box (parent/child relations). 0-2 *background regions* (two textures,
  large random boxes, never named in captions) are added as distractors, and the region
  order is shuffled so that it carries no information.

Which pair a caption describes (the *primary pair* ``A rel B``)
  If the scene has a container, ``A`` is the inner object, ``B`` the container and
  ``rel = in``. Otherwise ``A``/``B`` are the two largest objects (every other object is
  generated strictly smaller), and the relation comes from their box centres ``c = (cx, cy)``:
  with ``d = c_A - c_B``, ``|dx| >= |dy|`` gives ``left`` (dx < 0) or ``right``, otherwise
  ``above`` (dy < 0) or ``below``. The generator keeps the dominant axis at least 1.5 times
  the other and at least 0.12 apart, so the relation is never a near tie.
  A scene with at least two further objects has, half of the time, a *group* of 2-3 small
  plain objects sharing shape and colour, and no other object has that shape and colour
  (so "two red circles" is always a correct count).

English grammar (5 references, each a fresh random *plan* and realisation)
  ``NP  -> a|an [size] colour [material] shape``  (size shown with p = 0.6; sizes
  small|little|tiny, large|big; shapes circle|disc, square|box, triangle, star, cross,
  diamond; plural +s/+es)
  ``REL -> left of | to the left of | on the left of | right of ... | above | over |
  below | under | beneath | in | inside | inside of``
  ``S   -> NP_A REL NP_B | NP_A is REL NP_B | there is NP_A REL NP_B``
  ``       | NP_B with NP_A inside it | NP_B with NP_A in it``        (``in`` only)
  optionally followed by a group clause ``and two|three colour shapes`` or preceded by a
  count ``two..six shapes including``. A realisation over 16 words is redrawn with the same
  plan (so English is always 6-16 words; German rarely exceeds 16).

Visually easy vs attribute-only words
  Object identity reaches the features only through fixed random embeddings (one per
  shape, colour, size and material) summed and mixed with Gaussian noise, never as word
  ids. Shape, colour and size embeddings have unit per-dimension scale, so a linear read-out
  recovers them almost perfectly; the *material* embedding is scaled by
  ``material_signal`` (default 0.05) and drowns in the noise (a nearest-class-mean probe
  is close to chance). Yet ``wooden``/``metal``/``glass`` are named in every reference that
  mentions the object, and are in the oracle attributes: the semantic-attribute pathway
  (ETA, attribute-conditioned models) is the way to get them right.
  Relations are not in the region features at all: they need the boxes (relation-aware
  attention, geometry encodings) or the grid features, which are spatial by construction.

Features (computed lazily and deterministically from ``(seed, split, i)``)
  ``feats [n, D]``: per region ``s = (E_shape + E_colour + 0.5 E_size + m E_material) / 1.5``
  (background: ``E_texture``) plus ``noise * N(0, 1)``. ``grid [G, G, D]``: every cell sums
  ``s`` of the regions weighted by the fraction of the cell each box covers, plus noise.
  ``global_feat [Dg]``: the mean of ``s`` through a fixed random projection, plus noise.
  Pixels instead: :mod:`jaxcap.data.render` draws each scene (:meth:`SyntheticScenes.scene`)
  as an image file, for ``jaxcap-extract`` and ``Run.caption_images``.

German side (``captions_de``; the translation task)
  A second grammar with grammatical gender: nouns kreis (m) | scheibe (f), quadrat |
  viereck (n), dreieck (n), stern (m), kreuz (n), raute (f); adjectives declined after the
  indefinite article in nominative, accusative (``es gibt einen kleinen roten kreis``) and
  dative (``links von einer blauen raute``), strong plural for groups (``zwei rote
  kreise``); materials follow the noun (``ein roter kreis aus holz``); relations
  ``links von | rechts von | über | oberhalb von | unter | unterhalb von | in``, plus
  ``NP_B mit NP_A darin``. ``source_en`` is one English sentence paired with every German
  reference: all of them realise the same plan (which sizes, group or count), except that in
  ``p_omit_colour`` (0.3) of the images the English source leaves out the colour of ``A`` or
  ``B``, which every German reference names and the image shows: the image helps translation.
"""

from __future__ import annotations

import random
import time

import numpy as np
from jaxcap.data import base
from jaxcap.data.base import CaptionDataset
from jaxcap.data.base import SplitData
from jaxcap.errors import BadIndex, BadInput

SPLITS = ("train", "val", "test")
_SPLIT_ID_OFFSET = 10_000_000  # image_id = split index * offset + i: unique across splits.

SHAPES = ("circle", "square", "triangle", "star", "cross", "diamond")
COLOURS = ("red", "green", "blue", "yellow", "white", "black", "purple", "orange")
SIZES = ("small", "large")
MATERIALS = ("plain", "wooden", "metal", "glass")
RELATIONS = ("left", "right", "above", "below", "in")
NUM_TEXTURES = 2  # background region kinds
MAX_OBJECTS = 6
MAX_REGIONS = MAX_OBJECTS + 2  # objects + background regions
MAX_WORDS = 16  # realisations longer than this are redrawn (see _short)

# Attribute words that the features barely show (see the module docstring).
ATTRIBUTE_ONLY_WORDS = ("wooden", "metal", "glass")

# English lexicon: shape -> ((singular, plural), ...) synonyms.
EN_SHAPE = {
    "circle": (("circle", "circles"), ("disc", "discs")),
    "square": (("square", "squares"), ("box", "boxes")),
    "triangle": (("triangle", "triangles"),),
    "star": (("star", "stars"),),
    "cross": (("cross", "crosses"),),
    "diamond": (("diamond", "diamonds"),),
}
EN_SIZE = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
EN_MATERIAL = {"wooden": "wooden", "metal": "metal", "glass": "glass"}
EN_REL = {
    "left": (("left", "of"), ("to", "the", "left", "of"), ("on", "the", "left", "of")),
    "right": (("right", "of"), ("to", "the", "right", "of"), ("on", "the", "right", "of")),
    "above": (("above",), ("over",)),
    "below": (("below",), ("under",), ("beneath",)),
    "in": (("in",), ("inside",), ("inside", "of")),
}
EN_NUMBER = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
# Function words: everything else in an English reference is a content word (attribute).
EN_STOPWORDS = frozenset(("a", "an", "is", "of", "to", "the", "on", "there", "with", "it",
                          "and", "including", "in"))

# Part of speech of every English word the grammar produces (Universal POS tags), exact because
# each word has one use in the grammar: articles DET; size, colour and material words ADJ
# (``metal``/``glass`` only ever modify a shape); shapes, ``shapes`` and the relational nouns
# ``left``/``right`` (``to the left of``; ``left of`` is its short form) NOUN; counts NUM;
# ``is`` VERB; ``there`` (existential) and ``it`` PRON; ``and`` CCONJ; every relation and
# linking word ADP (``including`` introduces a noun phrase as a preposition does here).
EN_POS = {
    **{w: "DET" for w in ("a", "an", "the")},
    **{w: "ADJ" for w in COLOURS + ("small", "little", "tiny", "large", "big", "wooden", "metal",
                                    "glass")},
    **{w: "NOUN" for syn in EN_SHAPE.values() for pair in syn for w in pair},
    "shapes": "NOUN", "left": "NOUN", "right": "NOUN",
    **{w: "NUM" for w in EN_NUMBER.values()},
    **{w: "ADP" for w in ("of", "to", "on", "above", "over", "below", "under", "beneath", "in",
                          "inside", "with", "including")},
    "is": "VERB", "there": "PRON", "it": "PRON", "and": "CCONJ",
}
# TPGN's Table 2 split of parts of speech: nominal (nouns, pronouns, articles, adjectives; numerals
# join them) vs verbal (verbs, prepositions, conjunctions, adverbs).
POS_NOMINAL = frozenset(("NOUN", "PRON", "DET", "ADJ", "NUM"))


def english_pos(word: str) -> str:
  """The part of speech of an English word of the grammar (``EN_POS``); ``"X"`` otherwise."""
  return EN_POS.get(word, "X")


# German lexicon: shape -> ((singular, plural nom/acc, plural dative, gender), ...).
DE_SHAPE = {
    "circle": (("kreis", "kreise", "kreisen", "m"), ("scheibe", "scheiben", "scheiben", "f")),
    "square": (("quadrat", "quadrate", "quadraten", "n"),
               ("viereck", "vierecke", "vierecken", "n")),
    "triangle": (("dreieck", "dreiecke", "dreiecken", "n"),),
    "star": (("stern", "sterne", "sternen", "m"),),
    "cross": (("kreuz", "kreuze", "kreuzen", "n"),),
    "diamond": (("raute", "rauten", "rauten", "f"),),
}
DE_COLOUR = {"red": "rot", "green": "grün", "blue": "blau", "yellow": "gelb",
             "white": "weiß", "black": "schwarz", "purple": "violett",
             "orange": "orangefarben"}
DE_SIZE = {"small": "klein", "large": "groß"}
DE_MATERIAL = {"wooden": "holz", "metal": "metall", "glass": "glas"}
DE_REL = {
    "left": (("links", "von"),),
    "right": (("rechts", "von"),),
    "above": (("über",), ("oberhalb", "von")),
    "below": (("unter",), ("unterhalb", "von")),
    "in": (("in",),),
}
DE_NUMBER = {2: "zwei", 3: "drei", 4: "vier", 5: "fünf", 6: "sechs"}
# Indefinite article and weak/mixed adjective ending by (case, gender).
DE_INDEF = {
    ("nom", "m"): ("ein", "er"), ("nom", "f"): ("eine", "e"), ("nom", "n"): ("ein", "es"),
    ("acc", "m"): ("einen", "en"), ("acc", "f"): ("eine", "e"), ("acc", "n"): ("ein", "es"),
    ("dat", "m"): ("einem", "en"), ("dat", "f"): ("einer", "en"), ("dat", "n"): ("einem", "en"),
}

# Geometry (box sides in unit-square coordinates).
_SMALL_SIDE = (0.12, 0.20)
_LARGE_SIDE = (0.26, 0.38)
_CONTAINER_SIDE = (0.36, 0.46)
_INNER_SIDE = (0.08, 0.14)
_EXTRA_MIN_SIDE = 0.06
_MAX_OVERLAP = 0.15  # intersection / smaller area, for boxes that are not container/inner
_P_CONTAIN = 0.35
_P_GROUP = 0.5
_P_SIZE_SHOWN = 0.6
_P_MATERIAL = 0.3
_P_BACKGROUND = (0.4, 0.35, 0.25)  # 0, 1, 2 background regions


def _short(make, tries: int = 20) -> tuple:
  """Redraws a realisation longer than ``MAX_WORDS`` (same plan), keeping the shortest.

  Bounded retries keep generation cheap; a plan that cannot fit (German with two materials
  and a group clause) keeps its shortest realisation.
  """
  best = make()
  for _ in range(tries):
    if len(best) <= MAX_WORDS:
      break
    cand = make()
    if len(cand) < len(best):
      best = cand
  return best


def _en_article(word: str) -> str:
  return "an" if word[0] in "aeiou" else "a"


class SyntheticScenes:
  """Seeded symbolic scenes with English/German references and lazily computed features.

  Dimension legend: n regions of one image (objects + background, 2..8), D ``feature_dim``,
  G ``grid_size``, Dg ``global_dim``.

  Scenes and all text are generated up front (a few seconds for the default size); features
  are computed per call from ``(seed, split, i)``, so they cost no memory and are identical
  on every host.
  """

  splits: tuple[str, ...] = SPLITS
  max_regions: int = MAX_REGIONS

  def __init__(self, num_train: int = 10000, num_val: int = 500, num_test: int = 500,
               seed: int = 0, feature_dim: int = 128, grid_size: int = 7,
               global_dim: int = 128, noise: float = 0.5, attr_noise: float = 0.0,
               num_refs: int = 5, material_signal: float = 0.05,
               p_omit_colour: float = 0.3):
    for name, v in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
      if not isinstance(v, (int, np.integer)) or not 0 <= v < _SPLIT_ID_OFFSET:
        raise BadInput(f"synthetic_scenes: {name} must be an int in [0, {_SPLIT_ID_OFFSET}),"
                         f" got {v!r}")
    for name, v in (("feature_dim", feature_dim), ("grid_size", grid_size),
                    ("global_dim", global_dim), ("num_refs", num_refs)):
      if not isinstance(v, (int, np.integer)) or v < 1:
        raise BadInput(f"synthetic_scenes: {name} must be a positive int, got {v!r}")
    for name, v in (("attr_noise", attr_noise), ("p_omit_colour", p_omit_colour)):
      if not 0.0 <= v <= 1.0:
        raise BadInput(f"synthetic_scenes: {name} must be in [0, 1], got {v!r}")
    if noise < 0 or material_signal < 0:
      raise BadInput("synthetic_scenes: noise and material_signal must be >= 0, "
                       f"got {noise!r}, {material_signal!r}")
    self.seed = int(seed)
    self.feature_dim = int(feature_dim)
    self.grid_size = int(grid_size)
    self.global_dim = int(global_dim)
    self.noise = float(noise)
    self.attr_noise = float(attr_noise)
    self.num_refs = int(num_refs)
    self.material_signal = float(material_signal)
    self.p_omit_colour = float(p_omit_colour)
    self._sizes = {"train": int(num_train), "val": int(num_val), "test": int(num_test)}
    self._make_embeddings()
    self._data = {s: self._generate_split(k, self._sizes[s]) for k, s in enumerate(SPLITS)}

  # ----------------------------------------------------------------------------- public API

  def num_images(self, split: str) -> int:
    return self._sizes[self._check_split(split)]

  def image_id(self, split: str, i: int) -> int:
    return SPLITS.index(self._check(split, i)) * _SPLIT_ID_OFFSET + int(i)

  def captions(self, split: str, i: int) -> list[list[str]]:
    """The ``num_refs`` English references, lowercase tokens."""
    return [list(c) for c in self._data[self._check(split, i)]["en"][i]]

  def captions_de(self, split: str, i: int) -> list[list[str]]:
    """The ``num_refs`` German references (translations of ``source_en`` that name every colour)."""
    return [list(c) for c in self._data[self._check(split, i)]["de"][i]]

  def source_en(self, split: str, i: int) -> list[str]:
    """The English translation source, paired with every German reference."""
    return list(self._data[self._check(split, i)]["src"][i])

  def source_omits_colour(self, split: str, i: int) -> bool:
    """True when ``source_en`` leaves out a colour that the German references name."""
    return bool(self._data[self._check(split, i)]["omitted"][i])

  def attributes(self, split: str, i: int, noisy: bool = False) -> list[str]:
    """Sorted content words of the English references (oracle attributes).

    With ``noisy=True`` each word is, with probability ``attr_noise``, dropped or (equally
    likely) replaced by a random content word of the grammar; seeded by (seed, split, i).
    """
    split = self._check(split, i)
    words = self._data[split]["attrs"][i]
    if not noisy or self.attr_noise == 0.0:
      return list(words)
    rng = random.Random(self._image_seed(split, i) ^ 0x5EED)
    vocab = self.content_words()
    out = set()
    for w in words:
      if rng.random() < self.attr_noise:
        if rng.random() < 0.5:
          continue
        w = vocab[int(rng.random() * len(vocab))]
      out.add(w)
    return sorted(out)

  def features(self, split: str, i: int) -> dict:
    """Region, grid and global features of one image.

    Returns:
      ``{"feats": float32 [n, D], "boxes": float32 [n, 4] (x1, y1, x2, y2 in [0, 1]),
      "grid": float32 [G, G, D], "global_feat": float32 [Dg]}``.
    """
    split = self._check(split, i)
    d = self._data[split]
    lo, hi = d["offsets"][i], d["offsets"][i + 1]
    boxes_nx4 = d["boxes"][lo:hi]
    signal_nxD = self._table[d["codes"][lo:hi]]
    n, dim, g = hi - lo, self.feature_dim, self.grid_size
    rng = np.random.Generator(np.random.PCG64(self._image_seed(split, i)))
    noise = rng.standard_normal(n * dim + g * g * dim + self.global_dim, dtype=np.float32)
    noise *= self.noise
    feats_nxD = signal_nxD + noise[: n * dim].reshape(n, dim)
    # Fraction of each cell's extent covered by each box, per axis; their outer product is
    # the covered fraction of the cell's area.
    cx_nxG = np.clip(np.minimum(boxes_nx4[:, 2:3], self._cell_hi)
                     - np.maximum(boxes_nx4[:, 0:1], self._cell_lo), 0.0, None) * g
    cy_nxG = np.clip(np.minimum(boxes_nx4[:, 3:4], self._cell_hi)
                     - np.maximum(boxes_nx4[:, 1:2], self._cell_lo), 0.0, None) * g
    cover_nxGG = (cy_nxG[:, :, None] * cx_nxG[:, None, :]).reshape(n, g * g)
    grid = cover_nxGG.T @ signal_nxD + noise[n * dim: n * dim + g * g * dim].reshape(g * g, dim)
    global_feat = signal_nxD.mean(0) @ self._global_proj + noise[n * dim + g * g * dim:]
    return {"feats": feats_nxD.astype(np.float32, copy=False),
            "boxes": boxes_nx4.copy(),
            "grid": grid.reshape(g, g, dim).astype(np.float32, copy=False),
            "global_feat": global_feat.astype(np.float32, copy=False)}

  # ------------------------------------------------------------------- extra, for tests/probes

  def scene(self, split: str, i: int) -> dict:
    """The symbolic scene: regions in feature order and the described relation.

    Returns ``{"regions": [{"kind": "object"|"background", "shape", "colour", "size",
    "material", "box"}], "primary": (a, rel, b)`` (region indices of ``A rel B``),
    ``"group": (count, colour, shape) | None, "num_objects": int}``.
    """
    split = self._check(split, i)
    d = self._data[split]
    lo, hi = d["offsets"][i], d["offsets"][i + 1]
    regions = []
    for code, box in zip(d["codes"][lo:hi], d["boxes"][lo:hi]):
      box = tuple(float(v) for v in box)
      if code >= self._num_object_codes:
        regions.append({"kind": "background", "texture": int(code - self._num_object_codes),
                        "box": box})
      else:
        s, c, z, m = np.unravel_index(code, self._code_shape)
        regions.append({"kind": "object", "shape": SHAPES[s], "colour": COLOURS[c],
                        "size": SIZES[z], "material": MATERIALS[m], "box": box})
    a, rel, b, group, nobj = d["meta"][i]
    return {"regions": regions, "primary": (a, RELATIONS[rel], b), "group": group,
            "num_objects": nobj}

  @staticmethod
  def content_words() -> list[str]:
    """Every English content word the grammar can produce (the attribute vocabulary), sorted."""
    words = set(COLOURS) | set(ATTRIBUTE_ONLY_WORDS) | set(EN_NUMBER.values()) | {"shapes"}
    for syn in EN_SHAPE.values():
      for pair in syn:
        words.update(pair)
    for syn in EN_SIZE.values():
      words.update(syn)
    for syn in EN_REL.values():
      for phrase in syn:
        words.update(phrase)
    return sorted(words - EN_STOPWORDS)

  # ----------------------------------------------------------------------------- internals

  def _check_split(self, split: str) -> str:
    if split not in self._sizes:
      raise BadInput(f"synthetic_scenes: unknown split {split!r}, expected one of {SPLITS}")
    return split

  def _check(self, split: str, i: int) -> str:
    self._check_split(split)
    if not 0 <= i < self._sizes[split]:
      raise BadIndex(f"synthetic_scenes: image {i} out of range for split {split!r} "
                       f"of {self._sizes[split]} images")
    return split

  def _image_seed(self, split: str, i: int) -> int:
    # A fixed mixing of (seed, split, i) into 64 bits: per-image streams independent of the
    # split sizes, so image i of a split is the same whatever the other sizes are.
    x = (self.seed * 0x9E3779B97F4A7C15 + (SPLITS.index(split) + 1) * 0xBF58476D1CE4E5B9
         + int(i) * 0x94D049BB133111EB) & (2 ** 64 - 1)
    x ^= x >> 31
    return x

  def _make_embeddings(self):
    rng = np.random.Generator(np.random.PCG64([self.seed, 0xFEA7]))
    dim = self.feature_dim
    e_shape = rng.standard_normal((len(SHAPES), dim))
    e_colour = rng.standard_normal((len(COLOURS), dim))
    e_size = 0.5 * rng.standard_normal((len(SIZES), dim))
    e_mat = self.material_signal * rng.standard_normal((len(MATERIALS), dim))
    e_tex = rng.standard_normal((NUM_TEXTURES, dim))
    # One row per (shape, colour, size, material) code, then the background textures, so
    # features() gathers a region's noiseless signal with a single take.
    table = (e_shape[:, None, None, None] + e_colour[None, :, None, None]
             + e_size[None, None, :, None] + e_mat[None, None, None, :]) / 1.5
    self._code_shape = table.shape[:4]
    self._num_object_codes = int(np.prod(self._code_shape))
    self._table = np.concatenate([table.reshape(-1, dim), e_tex]).astype(np.float32)
    self._global_proj = (rng.standard_normal((dim, self.global_dim))
                         / np.sqrt(dim)).astype(np.float32)
    edges = np.arange(self.grid_size + 1, dtype=np.float32) / self.grid_size
    self._cell_lo, self._cell_hi = edges[None, :-1], edges[None, 1:]

  # --- scene geometry

  def _sample_box(self, r: random.Random, side_lo: float, side_hi: float, inside=None):
    side = side_lo + (side_hi - side_lo) * r.random()
    aspect = 0.85 + 0.33 * r.random()
    w, h = min(side * aspect, 0.95), min(side / aspect, 0.95)
    if inside is None:
      x0, y0, x1, y1 = 0.0, 0.0, 1.0, 1.0
    else:
      x0, y0, x1, y1 = inside[0] + 0.02, inside[1] + 0.02, inside[2] - 0.02, inside[3] - 0.02
      w, h = min(w, x1 - x0), min(h, y1 - y0)
    x = x0 + (x1 - x0 - w) * r.random()
    y = y0 + (y1 - y0 - h) * r.random()
    return (x, y, x + w, y + h)

  @staticmethod
  def _overlap_ok(box, others) -> bool:
    area = (box[2] - box[0]) * (box[3] - box[1])
    for o in others:
      iw = min(box[2], o[2]) - max(box[0], o[0])
      ih = min(box[3], o[3]) - max(box[1], o[1])
      if iw > 0 and ih > 0:
        if iw * ih > _MAX_OVERLAP * min(area, (o[2] - o[0]) * (o[3] - o[1])):
          return False
    return True

  @staticmethod
  def _relation(a, b) -> int | None:
    dx = (a[0] + a[2] - b[0] - b[2]) / 2
    dy = (a[1] + a[3] - b[1] - b[3]) / 2
    ax, ay = abs(dx), abs(dy)
    if max(ax, ay) < 0.12 or max(ax, ay) < 1.5 * min(ax, ay):
      return None  # a near tie: resample rather than describe it
    if ax >= ay:
      return 0 if dx < 0 else 1
    return 2 if dy < 0 else 3

  def _generate_scene(self, r: random.Random):
    """Objects as [shape, colour, size, material, box]; primary pair is objects 0 and 1."""
    rnd = r.random
    nobj = 2 + int(rnd() * (MAX_OBJECTS - 1))
    objs = []

    def attrs(size):
      mat = 1 + int(rnd() * 3) if rnd() < _P_MATERIAL else 0
      return [int(rnd() * len(SHAPES)), int(rnd() * len(COLOURS)), size, mat]

    contain = rnd() < _P_CONTAIN
    if contain:
      cont = self._sample_box(r, *_CONTAINER_SIDE)
      inner = self._sample_box(r, *_INNER_SIDE, inside=cont)
      objs.append(attrs(0) + [inner])
      objs.append(attrs(1) + [cont])
      rel = 4
      extra_hi = 0.20
    else:
      while True:
        za, zb = int(rnd() * 2), int(rnd() * 2)
        ba = self._sample_box(r, *(_LARGE_SIDE if za else _SMALL_SIDE))
        for _ in range(20):
          bb = self._sample_box(r, *(_LARGE_SIDE if zb else _SMALL_SIDE))
          rel = self._relation(ba, bb) if self._overlap_ok(bb, (ba,)) else None
          if rel is not None:
            break
        if rel is not None:
          break
      objs.append(attrs(za) + [ba])
      objs.append(attrs(zb) + [bb])
      # Strictly smaller than both, so "the two largest objects" is the primary pair.
      extra_hi = 0.85 * min(min(b[2] - b[0], b[3] - b[1]) for b in (ba, bb))
      extra_hi = max(extra_hi, _EXTRA_MIN_SIDE + 0.01)
    # The container and its inner object are one placement unit for the overlap test.
    placed = [objs[1][4]] if contain else [objs[0][4], objs[1][4]]
    num_extra = nobj - 2
    group = None
    if num_extra >= 2 and rnd() < _P_GROUP:
      count = 2 + int(rnd() * min(2, num_extra - 1))
      pairs = {(o[0], o[1]) for o in objs}
      while True:
        gs, gc = int(rnd() * len(SHAPES)), int(rnd() * len(COLOURS))
        if (gs, gc) not in pairs:
          break
      group = (count, gs, gc)
    for k in range(num_extra):
      for _ in range(30):
        box = self._sample_box(r, _EXTRA_MIN_SIDE, extra_hi)
        if self._overlap_ok(box, placed):
          break
      else:
        box = None  # no room: the scene simply has fewer objects
      if box is None:
        if group is not None and k < group[0]:
          group = (k, group[1], group[2]) if k >= 2 else None
        continue
      placed.append(box)
      size = 0 if (box[2] - box[0] + box[3] - box[1]) / 2 < 0.23 else 1
      if group is not None and k < group[0]:
        objs.append([group[1], group[2], size, 0, box])
      else:
        taken = {(group[1], group[2])} if group is not None else set()
        while True:
          a = attrs(size)
          if (a[0], a[1]) not in taken:
            break
        objs.append(a + [box])
    return objs, rel, group

  # --- text

  def _en_np(self, r, obj, show_size, show_colour=True):
    s, c, z, m = obj[:4]
    words = []
    if show_size:
      syn = EN_SIZE[SIZES[z]]
      words.append(syn[int(r.random() * len(syn))])
    if show_colour:
      words.append(COLOURS[c])
    if m:
      words.append(EN_MATERIAL[MATERIALS[m]])
    syn = EN_SHAPE[SHAPES[s]]
    words.append(syn[int(r.random() * len(syn))][0])
    return [_en_article(words[0])] + words

  def _en_sentence(self, r, objs, rel, group, plan, omit=-1):
    rnd = r.random
    size_a, size_b, extra = plan
    np_a = self._en_np(r, objs[0], size_a, omit != 0)
    np_b = self._en_np(r, objs[1], size_b, omit != 1)
    syn = EN_REL[RELATIONS[rel]]
    relp = list(syn[int(rnd() * len(syn))])
    if extra == "count":
      words = [EN_NUMBER[len(objs)], "shapes", "including"] + np_a + relp + np_b
    else:
      t = int(rnd() * (5 if rel == 4 else 3))
      if t == 0:
        words = np_a + relp + np_b
      elif t == 1:
        words = np_a + ["is"] + relp + np_b
      elif t == 2:
        words = ["there", "is"] + np_a + relp + np_b
      else:
        words = np_b + ["with"] + np_a + (["inside", "it"] if t == 3 else ["in", "it"])
    if extra == "group":
      count, gs, gc = group
      syn = EN_SHAPE[SHAPES[gs]]
      words += ["and", EN_NUMBER[count], COLOURS[gc], syn[int(rnd() * len(syn))][1]]
    return tuple(words)

  @staticmethod
  def _de_np(r, obj, case, show_size):
    s, c, z, m = obj[:4]
    syn = DE_SHAPE[SHAPES[s]]
    noun, _, _, gender = syn[int(r.random() * len(syn))]
    article, ending = DE_INDEF[(case, gender)]
    words = [article]
    if show_size:
      words.append(DE_SIZE[SIZES[z]] + ending)
    words.append(DE_COLOUR[COLOURS[c]] + ending)
    words.append(noun)
    if m:
      words += ["aus", DE_MATERIAL[MATERIALS[m]]]
    return words

  def _de_sentence(self, r, objs, rel, group, plan):
    rnd = r.random
    size_a, size_b, extra = plan
    syn = DE_REL[RELATIONS[rel]]
    relp = list(syn[int(rnd() * len(syn))])
    np_b = self._de_np(r, objs[1], "dat", size_b)
    if extra == "count":
      words = ([DE_NUMBER[len(objs)], "formen", "darunter"] + self._de_np(r, objs[0], "nom", size_a)
               + relp + np_b)
    else:
      t = int(rnd() * (5 if rel == 4 else 4))
      if t == 0:
        words = self._de_np(r, objs[0], "nom", size_a) + relp + np_b
      elif t == 1:
        words = self._de_np(r, objs[0], "nom", size_a) + ["ist"] + relp + np_b
      elif t == 2:
        words = self._de_np(r, objs[0], "nom", size_a) + ["befindet", "sich"] + relp + np_b
      elif t == 3:
        words = ["es", "gibt"] + self._de_np(r, objs[0], "acc", size_a) + relp + np_b
      else:
        words = (self._de_np(r, objs[1], "nom", size_b) + ["mit"]
                 + self._de_np(r, objs[0], "dat", size_a) + ["darin"])
    if extra == "group":
      count, gs, gc = group
      syn = DE_SHAPE[SHAPES[gs]]
      words += ["und", DE_NUMBER[count], DE_COLOUR[COLOURS[gc]] + "e",
                syn[int(rnd() * len(syn))][1]]
    return tuple(words)

  @staticmethod
  def _plan(r, group):
    rnd = r.random
    u = rnd()
    if group is not None and u < 0.4:
      extra = "group"
    elif u > 0.8:
      extra = "count"
    else:
      extra = None
    return (rnd() < _P_SIZE_SHOWN, rnd() < _P_SIZE_SHOWN, extra)

  def _generate_split(self, split_index: int, num: int) -> dict:
    r = random.Random(self.seed * 7919 + split_index)
    rnd = r.random
    en, de, src, attrs, meta, omitted = [], [], [], [], [], []
    offsets, codes, boxes = [0], [], []
    nref = self.num_refs
    nm, nz, nc = len(MATERIALS), len(SIZES), len(COLOURS)
    for _ in range(num):
      objs, rel, group = self._generate_scene(r)
      refs = tuple(_short(lambda: self._en_sentence(r, objs, rel, group, self._plan(r, group)))
                   for _ in range(nref))
      plan = self._plan(r, group)
      omit = int(rnd() * 2) if rnd() < self.p_omit_colour else -1
      src.append(_short(lambda: self._en_sentence(r, objs, rel, group, plan, omit)))
      omitted.append(omit >= 0)
      de.append(tuple(_short(lambda: self._de_sentence(r, objs, rel, group, plan))
                      for _ in range(nref)))
      en.append(refs)
      attrs.append(tuple(sorted({w for ref in refs for w in ref} - EN_STOPWORDS)))
      # Regions: objects then background, shuffled so that order carries no information.
      region_codes = [((o[0] * nc + o[1]) * nz + o[2]) * nm + o[3] for o in objs]
      region_boxes = [o[4] for o in objs]
      u = rnd()
      nbg = 0 if u < _P_BACKGROUND[0] else (1 if u < _P_BACKGROUND[0] + _P_BACKGROUND[1] else 2)
      for _ in range(nbg):
        region_codes.append(self._num_object_codes + int(rnd() * NUM_TEXTURES))
        x1, y1 = 0.6 * rnd(), 0.6 * rnd()
        region_boxes.append((x1, y1, x1 + 0.3 + (0.7 - x1) * rnd(), y1 + 0.3 + (0.7 - y1) * rnd()))
      order = list(range(len(region_codes)))
      r.shuffle(order)
      pos = {k: j for j, k in enumerate(order)}
      codes.extend(region_codes[k] for k in order)
      boxes.extend(region_boxes[k] for k in order)
      offsets.append(offsets[-1] + len(order))
      g = None if group is None else (group[0], COLOURS[group[2]], SHAPES[group[1]])
      meta.append((pos[0], rel, pos[1], g, len(objs)))
    return {"en": en, "de": de, "src": src, "attrs": attrs, "meta": meta, "omitted": omitted,
            "offsets": np.asarray(offsets, np.int64),
            "codes": np.asarray(codes, np.int64),
            "boxes": np.asarray(boxes, np.float32).reshape(-1, 4)}


def _benchmark():  # pragma: no cover - a measurement, run by hand
  t0 = time.perf_counter()
  ds = SyntheticScenes()
  t1 = time.perf_counter()
  n = 2000
  for i in range(n):
    ds.features("train", i)
  t2 = time.perf_counter()
  print(f"construct default: {t1 - t0:.2f} s; features(): {(t2 - t1) / n * 1e3:.3f} ms/image")


if __name__ == "__main__":
  _benchmark()


# ---------------------------------------------------------------------------------------------
# The dataset reader (jaxcap.data.get_dataset, the tfds builder).


class _SyntheticFeatures:
  """Feature reader over ``SyntheticScenes.features`` (regions, or the grid as regions)."""

  has_boxes = True
  has_image = True

  def __init__(self, scenes, split: str, grid: bool):
    self.scenes, self.split, self.grid = scenes, split, grid

  def __len__(self) -> int:
    return self.scenes.num_images(self.split)

  def name(self, i: int) -> str:
    return f"synthetic_scenes {self.split}[{i}]"

  def read(self, i: int) -> dict:
    f = self.scenes.features(self.split, i)
    if self.grid:
      feats = base.grid_to_regions(f["grid"], self.name(i))
      boxes = base.grid_boxes(f["grid"].shape[0])
    else:
      feats, boxes = f["feats"], f["boxes"]
    return {"feats": feats, "boxes": boxes, "global_feat": f["global_feat"]}


def synthetic_splits(data_config) -> dict:
  """The synthetic scenes as ``{split: SplitData}`` (captioning or En -> De translation)."""
  kwargs = dict(num_train=data_config.num_train, num_val=data_config.num_val,
                num_test=data_config.num_test, seed=data_config.seed,
                feature_dim=data_config.feature_dim)
  for key in ("noise", "attr_noise", "grid_size", "global_dim", "num_refs", "material_signal",
              "p_omit_colour"):
    if key in data_config:
      kwargs[key] = data_config[key]
  scenes = SyntheticScenes(**kwargs)
  translate = data_config.task == "translate"
  grid = bool(data_config.grid)
  out = {}
  for split in scenes.splits:
    n = scenes.num_images(split)
    ids = [scenes.image_id(split, i) for i in range(n)]
    if translate:
      refs = [scenes.captions_de(split, i) for i in range(n)]
      src = [scenes.source_en(split, i) for i in range(n)]
      oracle = noisy = None
    else:
      refs = [scenes.captions(split, i) for i in range(n)]
      src = None
      mode = data_config.attributes
      if split == "test":
        mode = data_config.test_attributes or mode
      oracle = [scenes.attributes(split, i) for i in range(n)] if mode == "oracle" else None
      noisy = ([scenes.attributes(split, i, noisy=True) for i in range(n)]
               if mode == "noisy" else None)
    out[split] = SplitData(image_ids=ids, refs=refs, features=_SyntheticFeatures(scenes, split, grid),
                           src=src, attributes=noisy, oracle_attributes=oracle)
  return out


def load_synthetic(data_config):
  """The ``synthetic_scenes`` :class:`jaxcap.data.base.CaptionDataset`."""
  return CaptionDataset(synthetic_splits(data_config), data_config, name="synthetic_scenes",
                        feature_dim=data_config.feature_dim or None)


# The names of the reader protocol (jaxcap.data.reader).
read_splits = synthetic_splits
load = load_synthetic
