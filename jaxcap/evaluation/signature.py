"""How a score was made: the signature every ``scores_*.json`` carries.

A captioning score depends on more than the checkpoint: the metric code and its tokenizer, the
CIDEr-D variant, the decoding (beam size and mode, length penalty, maximum length, groups,
ensemble members), the vocabulary's count threshold, the features, the split and its image
count. The anchors' "I cannot reproduce the number" threads mostly end in one of them. A
signature records them all beside the scores, as a nested dict (``"signature"`` in the file)
and as one short line in the manner of sacreBLEU's (printed under the metric table)::

  jaxcap 0.1.0+1a2b3c4|pycocoevalcap 1.2,tok=ptb|CIDEr-D df=refs,sigma=6,eos=no|beam3 live,lp=none,max=16|vocab 9487,min=5,#0c1d2e3f|feats karpathy,36r,#4a5b6c7d|test 5000|step 12000|config #8e9f0a1b

:func:`differences` lists the settings two signatures differ in (``jaxcap-compare`` prints
them). Hashes are the first 8 hex digits of a sha256 of a canonical JSON (``vocab``: the word
list in id order; ``config``: the run's ``config.json`` without the fields that do not change
a score: workdir-side paths such as ``init_from`` and the loader's worker count).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import subprocess
from typing import Mapping, Sequence

from jaxcap import version

# pycocoevalcap's Cider is CIDEr-D (Vedantam et al. 2015, section 4.4, as in the coco-caption
# code): clipped n-gram counts, a Gaussian length penalty with sigma 6, x10, document
# frequencies from the references of the images being scored, no EOS token.
COCO_CIDER = {"name": "CIDEr-D", "json_key": "CIDEr", "implementation": "pycocoevalcap CiderScorer",
              "compat": "coco-caption", "n": 4, "sigma": 6.0, "clipped": True,
              "df": "references of the scored images", "eos": False}

# Fields of a run's config that cannot change a score (where the files are, how fast they load).
_NOT_SCORE_FIELDS = ("init_from", "data.num_workers", "data.prefetch", "async_checkpoints",
                     "log_every_steps", "checkpoint_every_steps", "keep_checkpoints")


def short_hash(obj) -> str:
  """The first 8 hex digits of the sha256 of ``obj`` as canonical JSON (bytes as themselves)."""
  data = obj if isinstance(obj, bytes) else json.dumps(obj, sort_keys=True, default=str).encode()
  return hashlib.sha256(data).hexdigest()[:8]


def _version(dist: str) -> str | None:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


@functools.lru_cache(maxsize=None)
def jaxcap_version() -> dict:
  """jaxcap's version and, in a git checkout, its commit (``dirty`` when tracked files changed)."""
  out = {"version": version.__version__, "commit": None}
  repo = os.path.dirname(os.path.dirname(os.path.abspath(version.__file__)))
  try:
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, timeout=10,
                            capture_output=True, text=True).stdout.strip()
    if commit:
      dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                             timeout=10, capture_output=True, text=True).stdout.strip()
      out["commit"] = commit + ("-dirty" if dirty else "")
  except (OSError, subprocess.SubprocessError):  # an installed copy without git
    pass
  return out


def metrics_part(tokenizer: str, computed: Sequence[str], *, translation: bool = False,
                 sacrebleu_signature: str = "", caption_postprocess: str = "none") -> dict:
  """The metric side: implementations and versions, the tokenizer (``ptb``: Stanford's
  PTBTokenizer as COCOEvalCap runs it; ``ptb-python``: jaxcap's approximation of it, used
  without Java; ``none``: the strings as given), the metrics computed and the CIDEr-D variant;
  ``caption_postprocess`` (what was done to the captions before they were scored,
  :data:`jaxcap.evaluation.coco_metrics.CAPTION_POSTPROCESS`) only when it is not ``"none"``, so
  a signature made without it is unchanged (and a comparison names it)."""
  out = {"implementation": "pycocoevalcap", "version": _version("pycocoevalcap"),
         "tokenizer": tokenizer, "computed": list(computed), "cider": dict(COCO_CIDER)}
  if caption_postprocess != "none":
    out["caption_postprocess"] = caption_postprocess
  if translation:
    out["sacrebleu"] = sacrebleu_signature
    out["meteor"] = "METEOR 1.5 jar, -l de -norm"
  return out


def _config_dict(config) -> dict:
  if config is None:
    return {}
  if hasattr(config, "to_json_best_effort"):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(dict(config), default=str))


def _drop(d: dict, dotted: str) -> None:
  *path, last = dotted.split(".")
  for p in path:
    d = d.get(p, {}) if isinstance(d, dict) else {}
  if isinstance(d, dict):
    d.pop(last, None)


def config_hash(config) -> str:
  d = _config_dict(config)
  for f in _NOT_SCORE_FIELDS:
    _drop(d, f)
  return short_hash(d)


def decode_part(decode: Mapping | None, members: Sequence[str] = (), weights=None) -> dict:
  """The decoding settings that change a caption (all of ``decode``, sorted), and the ensemble's
  members and weights when there are several."""
  if decode is None:
    return {"method": "unknown (a predictions file)"}
  out = {k: decode[k] for k in sorted(decode)}
  if len(members) > 1:
    out["ensemble"] = [str(m) for m in members]
    out["ensemble_weights"] = None if weights is None else [float(w) for w in weights]
  return out


def vocab_part(vocab, data_config: Mapping | None) -> dict:
  words = list(getattr(vocab, "itos", None) or [])
  data = dict(data_config or {})
  return {"size": len(words), "min_count": data.get("min_word_count"),
          "max_size": data.get("max_vocab_size"), "sha256": short_hash(words)}


def features_part(data_config: Mapping | None, info: Mapping | None, workdir: str | None = None,
                  names: Sequence[str] | None = None) -> dict:
  """Where the features came from: the dataset and its feature folders, regions per image, the
  feature size, and a hash of the run's ``features.json`` (jaxcap-extract's record of the
  backbone and its weights) or else of the split's feature file names."""
  data = dict(data_config or {})
  info = dict(info or {})
  out = {"source": data.get("name"),
         "fields": {k: v for k, v in sorted(data.items())
                    if isinstance(v, (str, int, float, bool)) and k != "num_workers"
                    and (any(s in k for s in ("dir", "root", "feature", "region", "box", "grid"))
                         # set only: a signature without the file is as it was before the field
                         or (k == "detections_hdf5" and v))},
         "regions": info.get("max_regions"), "dim": info.get("feature_dim"),
         "global_dim": info.get("global_dim")}
  record = os.path.join(workdir, "features.json") if workdir else None
  if record and os.path.exists(record):
    with open(record, "rb") as f:
      out["sha256"], out["hashed"] = short_hash(f.read()), "features.json"
  elif names is not None:
    out["sha256"], out["hashed"] = short_hash(list(names)), "feature file names"
  return out


def build(*, metrics: Mapping, config=None, vocab=None, info: Mapping | None = None,
          split: str | None = None, num_images: int | None = None, step: int | None = None,
          decode: Mapping | None = None, workdir: str | None = None,
          feature_names: Sequence[str] | None = None, members: Sequence[str] = (),
          weights=None, extra: Mapping | None = None) -> dict:
  """A signature: ``metrics`` (:func:`metrics_part`) and what is known of the run. Fields that
  are not known (a predictions file scored on its own) are None."""
  cfg = _config_dict(config)
  data = cfg.get("data")
  sig = {"jaxcap": jaxcap_version(), "metrics": dict(metrics),
         "decode": decode_part(decode, members, weights),
         "vocab": vocab_part(vocab, data) if vocab is not None else None,
         "features": features_part(data, info, workdir, feature_names) if data else None,
         "split": {"name": split, "images": num_images},
         "checkpoint": {"step": None if step is None else int(step)},
         "model": (cfg.get("model") or {}).get("name"),
         "config": config_hash(config) if config is not None else None}
  if extra:
    sig.update(extra)
  return sig


def _groups(d: Mapping) -> int | float:
  """A decode section's beam groups (1 when unset, or not a number: a damaged file's)."""
  g = d.get("beam_groups")
  return g if isinstance(g, (int, float)) and not isinstance(g, bool) else 1


def _decode_short(d: Mapping) -> str:
  d = d if isinstance(d, Mapping) else {}  # a damaged file's decode section: nothing known
  method = d.get("method", "?")
  if method == "beam":
    s = f"beam{d.get('beam_size', '?')} {d.get('beam_mode', 'live')}"
    if _groups(d) > 1:
      s += f",groups={d['beam_groups']},div={d.get('diversity_strength')}"
    s += f",lp={d.get('length_penalty', 'none')}"
    if d.get("length_penalty") == "gnmt":
      s += f",alpha={d.get('alpha')}"
  elif method == "sample":
    s = f"sample t={d.get('temperature')},k={d.get('top_k')},p={d.get('top_p')}"
  else:
    s = str(method)
  if "max_len" in d:
    s += f",max={d['max_len']}"
  if d.get("block_trigrams"):
    s += ",no-trigram-repeats"
  if "ensemble" in d:
    s += f",ensemble={len(d['ensemble']) if isinstance(d['ensemble'], (list, tuple)) else '?'}"
  return s


def line(sig: Mapping) -> str:
  """The signature as one line (see the module docstring)."""
  j, m = sig.get("jaxcap") or {}, sig.get("metrics") or {}
  parts = [f"jaxcap {j.get('version')}" + (f"+{j['commit']}" if j.get("commit") else ""),
           f"{m.get('implementation')} {m.get('version')},tok={m.get('tokenizer')}"
           + (f",captions={m['caption_postprocess']}" if m.get("caption_postprocess") else "")]
  c = m.get("cider") or {}
  if c:
    df = "refs" if str(c.get("df", "")).startswith("references") else c.get("df")
    parts.append(f"{c.get('name')} df={df},sigma={c.get('sigma'):g},eos={'yes' if c.get('eos') else 'no'}")
  if m.get("sacrebleu"):
    parts.append(f"sacreBLEU {m['sacrebleu']}")
  for name, c in (m.get("clip") or {}).items():  # jaxcap.clip.score.Scorer.signature
    parts.append(f"{name} {c.get('model')},#{c.get('sha256')},w={c.get('w')},"
                 f"prompt={c.get('prompt')!r},ref={c.get('ref')}")
  parts.append(_decode_short(sig.get("decode") or {}))
  v = sig.get("vocab")
  if v:
    parts.append(f"vocab {v['size']},min={v.get('min_count')},#{v['sha256']}")
  f = sig.get("features")
  if f:
    parts.append(f"feats {f.get('source')},{f.get('regions')}r" + (f",#{f['sha256']}" if f.get("sha256") else ""))
  s = sig.get("split") or {}
  parts.append(f"{s.get('name')} {s.get('images')}")
  if (sig.get("checkpoint") or {}).get("step") is not None:
    parts.append(f"step {sig['checkpoint']['step']}")
  if sig.get("config"):
    parts.append(f"config #{sig['config']}")
  return "|".join(parts)


def _flatten(d, prefix: str = "") -> dict:
  out = {}
  if isinstance(d, Mapping):
    for k, v in d.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: d}


# The decoding options each method reads (jaxcap.decoding.decode's dispatch): the others are
# carried in the signature (all of the config's ``decode`` section) but change no caption, so a
# comparison must not list them (greedy vs beam-2 is not "beam_size 3 -> 2").
_DECODE_OPTIONS = ("method", "beam_size", "beam_mode", "max_len", "length_penalty", "alpha",
                   "min_len", "block_trigrams", "suppress_unk", "temperature", "top_k", "top_p",
                   "num_samples", "remove_bad_endings", "beam_groups", "diversity_strength",
                   "beam_suppress_unk")
_COMMON = ("max_len", "min_len", "suppress_unk", "remove_bad_endings")
_DECODE_READS = {
    "greedy": _COMMON,
    "beam": _COMMON + ("beam_size", "beam_mode", "length_penalty", "alpha", "block_trigrams",
                       "beam_groups", "diversity_strength", "beam_suppress_unk"),
    "sample": _COMMON + ("num_samples", "temperature", "top_k", "top_p"),
}


def decode_ignored(decode: Mapping | None) -> set:
  """The options of ``decode`` (a signature's or a config's decode section) that its method
  does not read: every option but ``method`` for a model without decoding (the nearest
  neighbour's ``{"method": "nearest_neighbour"}``); ``alpha`` without the GNMT penalty;
  ``diversity_strength`` with one beam group; ``top_k`` / ``top_p`` at temperature 0 (arg-max).
  Options this module does not know (and the ensemble's members) are read."""
  d = decode if isinstance(decode, Mapping) else {}  # a damaged file's: nothing known
  method = d.get("method")
  reads = set(_DECODE_READS.get(method, ())) | {"method"}
  if method == "beam":
    if d.get("length_penalty") != "gnmt":
      reads.discard("alpha")
    if _groups(d) <= 1:
      reads.discard("diversity_strength")
  if method == "sample" and d.get("temperature") == 0:
    reads -= {"top_k", "top_p"}
  return set(_DECODE_OPTIONS) - reads


def _used(flat: Mapping, decode: Mapping | None, prefix: str) -> dict:
  ignored = {prefix + k for k in decode_ignored(decode)}
  return {k: v for k, v in flat.items() if k not in ignored}


def differences(a: Mapping | None, b: Mapping | None) -> list[tuple[str, object, object]]:
  """``(setting, value in a, value in b)`` for every setting the two signatures differ in
  (dotted names such as ``decode.beam_size``), in a stable order. A decoding option is listed
  only when both sides' methods read it (:func:`decode_ignored`; a different method is listed
  as ``decode.method``). The config hash is listed too: it differs whenever any setting of the
  runs does (:func:`config_differences` names them from the runs' ``config.json``)."""
  a, b = a or {}, b or {}
  fa = _used(_flatten(a), a.get("decode"), "decode.")
  fb = _used(_flatten(b), b.get("decode"), "decode.")
  return _diff(fa, fb)


def _diff(fa: Mapping, fb: Mapping) -> list[tuple[str, object, object]]:
  # Only the settings both sides use: an option one side ignores compares with nothing.
  both = set(fa) & set(fb)
  out = []
  for k in sorted(set(fa) | set(fb)):
    if k.startswith("decode.") and k != "decode.method" and k not in both and \
        k[len("decode."):] in _DECODE_OPTIONS:
      continue
    va, vb = fa.get(k), fb.get(k)
    if va != vb:
      out.append((k, va, vb))
  return out


def config_differences(a: Mapping, b: Mapping) -> list[tuple[str, object, object]]:
  """``(field, value in a, value in b)`` for the fields two runs' ``config.json`` differ in
  (dotted, e.g. ``scst.start_step``), without the fields the config hash leaves out (they
  change no score) and the decoding options the config's method does not read."""
  a, b = json.loads(json.dumps(a, default=str)), json.loads(json.dumps(b, default=str))
  for d in (a, b):
    for f in _NOT_SCORE_FIELDS:
      _drop(d, f)
  fa = _used(_flatten(a), a.get("decode"), "decode.")
  fb = _used(_flatten(b), b.get("decode"), "decode.")
  return _diff(fa, fb)
