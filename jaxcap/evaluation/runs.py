"""Evaluating trained runs: a split of a run (or of an ensemble of runs), a folder of images.

The library behind ``evaluate.py`` (:mod:`jaxcap.commands.evaluate` maps its flags onto these
functions). Every input is checked before a checkpoint is restored or anything is decoded or
written: bad input is one ``BadInput`` line.
"""

from __future__ import annotations

import os
import sys

import jax
import ml_collections

from jaxcap import api, atomic, ensemble, run_dir
from jaxcap import images as images_lib
from jaxcap import progress
from jaxcap import data as data_lib
from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics, files, server
from jaxcap.features import extract
from jaxcap.features import record as record_lib
from jaxcap.models import pixels
from jaxcap.training import parallel, validation


# An empty caption is the model's EOS at the first step: printed as is, it reads as a bug.
EMPTY_CAPTION = "(empty: the model ended the caption at its first step)"


def shown_caption(caption: str | None) -> str:
  """A caption as a printed line shows it: an empty one says why (:data:`EMPTY_CAPTION`); the
  JSON files keep the caption string itself."""
  if caption is None:
    return "(none: the image was not captioned)"
  return caption if caption.strip() else EMPTY_CAPTION


def decode_options(decode: dict, *, sample: bool = False, beam_size: int | None = None,
                   **options) -> dict:
  """``decode`` (a run's ``config.decode``) with a command line's choices: ``sample``, a
  ``beam_size`` (one self-critical beam is greedy decoding; one live beam also keeps finished
  captions; diverse groups are a beam search), and any other option that is not None."""
  d = dict(decode)
  if sample:
    d["method"] = "sample"
  elif beam_size is not None:
    mode = options.get("beam_mode") or d.get("beam_mode", "live")
    d["method"] = "greedy" if beam_size == 1 and mode == "self_critical" else "beam"
    d["beam_size"] = beam_size
  if not sample and (options.get("beam_groups") or 1) > 1:
    d["method"] = "beam"
  d.update({k: v for k, v in options.items() if v is not None})
  return d


def _caption_postprocess(given: str | None, config) -> str:
  """The scoring's caption postprocessing: ``given`` (a command line's), else the run's."""
  post = run_dir.caption_postprocess(config) if given is None else given
  if post not in coco_metrics.CAPTION_POSTPROCESS:
    where = "--caption-postprocess" if given is not None else "config field caption_postprocess"
    raise BadInput(f"{where}: expected one of {', '.join(coco_metrics.CAPTION_POSTPROCESS)}, "
                   f"got {post!r}")
  return post


def _with_attributes(config, split: str, attributes: str | None):
  """The attribute mode the evaluated split reads (its words and vocabulary do not depend on
  it, so the model's inputs keep their meaning)."""
  if attributes:
    config.data["test_attributes" if split == "test" else "attributes"] = attributes
  return config


def _decode_of(decode, config) -> dict:
  """The decoding options (checked: :func:`jaxcap.training.validation.check_config`)."""
  own = config.decode.to_dict() if "decode" in config else {}
  options = dict(own) if decode is None else decode(own) if callable(decode) else dict(decode)
  validation.check_config(ml_collections.ConfigDict({"decode": options}))
  return options


def _check_inputs(member_config, dataset, config, split: str, attributes: str | None) -> None:
  model, _ = pixels.build_for_run(member_config, dict(dataset.info))  # a run from pixels: its backbone too
  if attributes == "none" and "attributes" in model.required_inputs():
    raise BadInput(f"--attributes=none: {validation.model_label(model, member_config.model)} "
                   "attends to attribute words; expected --attributes oracle, noisy or detected")
  validation.check_model_inputs(model, dataset, config, [split], model_config=member_config.model)


def _decode_and_write(run, split: str, decode: dict, batch_size: int, out_dir: str, tag: str,
                      spice: bool, sample_n: int, sample_n_method: str, members=(), weights=None,
                      caption_postprocess: str = "none", clip=None) -> dict:
  preds = run.predict(split, batch_size=batch_size, **decode)
  refs = run.dataset.references(split)
  made_by = run_dir.made_by(run.config, run.vocab, run.info, split=split, step=run.step,
                            decode=run.decode_config(**decode), workdir=run.workdir,
                            dataset=run.dataset, members=members, weights=weights)
  scores = run_dir.write_scores(out_dir, split, preds, {k: refs[k] for k in preds}, spice, tag,
                                translation=run.dataset.src_vocab is not None, made_by=made_by,
                                caption_postprocess=caption_postprocess, clip=clip)
  if sample_n:
    options = {k: v for k, v in decode.items() if k != "method"}  # sample_n_method decides
    preds = run.sample_n(split, sample_n, sample_n_method, batch_size=batch_size, **options)
    path = os.path.join(out_dir, f"predictions_{split}{tag}_n{sample_n}.json")
    if jax.process_index() == 0:
      atomic.write_json(path, [{"image_id": k, "caption": c} for k, caps in preds.items() for c in caps])
    print(f"{path}: {sample_n} captions ({sample_n_method}) for each of {len(preds)} images")
  return scores


def decode_tag(decode: dict) -> str:
  """A file-name tag for decoding options: ``_greedy``, ``_beam3`` (``_beam3_sc`` in
  self-critical mode, ``_beam3_slots`` in in_slots mode, ``_beam6_g3`` with diverse groups),
  ``_sample``."""
  method = decode.get("method", "greedy")
  if method != "beam":
    return f"_{method}"
  tag = f"_beam{decode.get('beam_size', 1)}"
  tag += {"self_critical": "_sc", "in_slots": "_slots"}.get(decode.get("beam_mode"), "")
  return tag + (f"_g{decode['beam_groups']}" if (decode.get("beam_groups") or 1) > 1 else "")


def evaluate_run(workdir: str, *, split: str = "test", step: int | None = None,
                 decode: dict | None = None, batch_size: int | None = None,
                 attributes: str | None = None, tag: str | None = None, spice: bool = False,
                 sample_n: int = 0, sample_n_method: str = "sample",
                 caption_postprocess: str | None = None, clip=None) -> dict:
  """Decodes ``split`` with the run's best checkpoint (or ``step``) and writes
  ``predictions_<split><tag>.json`` / ``scores_<split><tag>.json`` in ``workdir``.

  ``decode``: the decoding options, or a function of the run's ``config.decode`` (a dict) giving
  them (:func:`decode_options`; default: the run's); ``attributes``: the attribute mode the
  split reads (e.g. ``oracle``); ``tag`` None: none, unless training's own
  ``scores_<split>.json`` is there, which is kept: then the decoding's (:func:`decode_tag`);
  ``caption_postprocess``: what is done to the captions before they are scored
  (:data:`jaxcap.evaluation.coco_metrics.CAPTION_POSTPROCESS`; None: the run's config field);
  ``clip``: a :class:`jaxcap.clip.metrics.Request` (CLIP-S / PAC-S: weights and images, each
  checked before the checkpoint is restored). Returns the scores.
  """
  config = run_dir.read_config(workdir)
  post = _caption_postprocess(caption_postprocess, config)
  atomic.check_writable(workdir, f"--workdir={workdir}")  # where the predictions and scores go
  decode = _decode_of(decode, config)
  if batch_size is not None and batch_size < 1:
    raise BadInput(f"--batch_size={batch_size}: expected an int >= 1")
  config.eval_batch_size = batch_size or config.eval_batch_size
  dataset = data_lib.get_dataset(_with_attributes(config, split, attributes).data)
  run_dir.check_workdir(workdir, config, dataset.vocab)
  if split not in dataset.splits:  # before loading (and compiling) anything
    raise BadInput(f"--split={split}: not a split of {dataset.name}; expected one of "
                   f"{', '.join(dataset.splits)}")
  _check_inputs(config, dataset, config, split, attributes)
  prepared = _prepare_clip(clip, dataset, split)
  if tag is None:
    tag = decode_tag(decode) if os.path.exists(os.path.join(workdir, f"scores_{split}.json")) else ""
  run = api.load(workdir, step, dataset=dataset, mesh=parallel.make_mesh())
  print(f"Evaluating step {run.step} of {workdir} on split {split!r}.", flush=True)
  return _decode_and_write(run, split, decode, config.eval_batch_size, workdir, tag, spice,
                           sample_n, sample_n_method, caption_postprocess=post, clip=prepared)


def _prepare_clip(clip, dataset, split: str):
  """The CLIP scores' weights and the split's image files, checked (None when not asked)."""
  if not clip:
    return None
  if dataset.src_vocab is not None:
    raise BadInput("--clip_weights / --pac_weights: this run translates text; expected a captioning run")
  return clip.prepare(list(dataset.references(split)))


def evaluate_ensemble(workdirs, weights=None, *, out_dir: str | None = None, split: str = "test",
                      decode: dict | None = None, batch_size: int | None = None,
                      attributes: str | None = None, tag: str = "_ensemble", spice: bool = False,
                      sample_n: int = 0, sample_n_method: str = "sample",
                      caption_postprocess: str | None = None, clip=None) -> dict:
  """Decodes ``split`` with several runs together (:func:`jaxcap.api.load_ensemble`, each from
  its best checkpoint, with the first run's data and decoding); the files go to ``out_dir``
  (default: the first run's); ``decode`` as :func:`evaluate_run`'s. Everything is checked
  before any run is restored."""
  if not workdirs:
    raise BadInput("--ensemble: expected comma-separated run directories, got none")
  if weights is not None:
    weights = ensemble.check_weights(weights, len(workdirs), f"--ensemble-weights={weights}")
  runs = [(run_dir.read_config(w), run_dir.read_vocab(w)) for w in workdirs]
  out_dir = out_dir or workdirs[0]
  atomic.check_writable(out_dir, f"--workdir={out_dir}")  # where the predictions and scores go
  ensemble.check_same_vocab([v for _, v in runs], workdirs)
  config = runs[0][0]
  decode = _decode_of(decode, config)
  post = _caption_postprocess(caption_postprocess, config)
  for w, (cfg, _) in zip(workdirs[1:], runs[1:]):
    for field in ("name", "root"):
      # Roots resolved: a run's config.json names its root absolute, an older run's relative one.
      same = (run_dir.absolute_data_paths(cfg.data.to_dict()).get(field)
              == run_dir.absolute_data_paths(config.data.to_dict()).get(field))
      if not same:
        raise BadInput(f"--ensemble: {w} was trained on data.{field}={cfg.data.get(field)!r}, "
                       f"{workdirs[0]} on {config.data.get(field)!r}; members must share the data")
  config.eval_batch_size = batch_size or config.eval_batch_size
  dataset = data_lib.get_dataset(_with_attributes(config, split, attributes).data)
  for w, (cfg, _) in zip(workdirs, runs):
    run_dir.check_workdir(w, cfg, dataset.vocab)
    _check_inputs(cfg, dataset, config, split, attributes)
  prepared = _prepare_clip(clip, dataset, split)
  mesh = parallel.make_mesh()
  members = [api.load(w, dataset=dataset, mesh=mesh) for w in workdirs]
  for i, (w, m) in enumerate(zip(workdirs, members)):
    print(f"Member {i}: {m.config.model.name} from {w}, step {m.step}.", flush=True)
  os.makedirs(out_dir, exist_ok=True)
  print(f"Evaluating an ensemble of {len(workdirs)} on split {split!r}.", flush=True)
  return _decode_and_write(api.load_ensemble(members, weights), split, decode,
                           config.eval_batch_size, out_dir, tag, spice, sample_n, sample_n_method,
                           members=[f"{w}@{m.step}" for w, m in zip(workdirs, members)],
                           weights=weights, caption_postprocess=post, clip=prepared)


def is_captions_file(path: str) -> bool:
  """``path`` is what :func:`caption_folder` writes: a non-empty JSON list of ``{"image",
  "caption"}`` objects and nothing else (its known structure: a list carries no marker)."""
  items = atomic.read_json(path)
  return (isinstance(items, list) and bool(items)
          and all(isinstance(i, dict) and set(i) == {"image", "caption"} for i in items))


def is_output_folder(path: str) -> bool:
  """``path`` is a run directory (its ``config.json``) or holds a scores file jaxcap wrote (an
  ensemble's --workdir of an earlier jaxcap, before ``atomic.FOLDER_MARKER``)."""
  if os.path.isfile(os.path.join(path, run_dir.CONFIG_FILE)):
    return True
  return os.path.isdir(path) and any(
      n.startswith("scores_") and n.endswith(".json") and atomic.says(files.is_scores_file, os.path.join(path, n))
      for n in os.listdir(path))


def caption_folder(workdir: str, images: str, out: str, *, weights: str | None = None,
                   step: int | None = None, decode: dict | None = None, batch_size: int = 16) -> list:
  """Captions every image file of the folder ``images`` with the run's best checkpoint (or
  ``step``) and the backbone its features came from: the one ``features.json`` records, or for
  a run from pixels its trained backbone (:meth:`jaxcap.api.Run.caption_images`' choice); writes
  ``[{"image", "caption"}]`` to ``out`` atomically. An unreadable file is reported in one line
  and left out."""
  atomic.check_writable(out, f"--out={out}", file=True)
  names = extract.list_images(images)
  if not names:
    raise BadInput(f"--images={images}: no image files ({', '.join(extract.IMAGE_EXTENSIONS)}); "
                   "expected a folder of images")
  config = run_dir.read_config(workdir)
  section = pixels.backbone_config(config)
  regions = False  # the region detector in front of a run on region features
  if section is not None:  # a run from pixels: its backbone is in the checkpoint
    if weights is not None:
      raise BadInput(f"--weights={weights}: {workdir} trained its backbone ({section.name}); "
                     "expected no --weights (the backbone's weights are the checkpoint's)")
    size = int(run_dir.load_info(workdir, config).get("image_size") or config.data.image_size)
    source = f"its trained {section.name}"
  else:
    from jaxcap.detection.backbone import is_detector_weights  # noqa: PLC0415 (no jax)
    record = run_dir.read_features_record(workdir)
    if record is None and is_detector_weights(weights):
      # A run on region features (imported, or on jaxcap.detection.extract's files): the region
      # detector in front of it (Run.caption_images), photos read upright at their own size.
      if not os.path.isfile(weights):
        raise BadInput(f"--weights={weights}: no such file; expected the region detector's "
                       "pytorch_model.bin, faster_rcnn_from_caffe_attr.pkl or bua-caffe-frcn-r101*.pth")
      size, source = images_lib.NATIVE, f"the regions of the detector {os.path.basename(weights)}"
      regions = True
    elif record is None:
      raise BadInput(f"{workdir}: no {run_dir.FEATURES_FILE} and no backbone of its own; it was "
                     "trained on features jaxcap-extract did not write, so it cannot caption "
                     f"image files (a run on bottom-up region features: --weights=<the region "
                     f"detector's pytorch_model.bin>); {images_lib.IMAGE_RUNS}")
    else:
      # Refused before any image is read or any checkpoint restored.
      record_lib.check_weights(record, weights, os.path.join(workdir, run_dir.FEATURES_FILE))
      size = extract.parse_size(record["size"], "features.json: size")  # an int or "native"
      source = f"{record['backbone']} features"
  decode = _decode_of(decode, config)
  read, failed = [], []
  for name in progress.bar(names, f"reading {images}", unit="img"):
    path = os.path.join(images, name)
    try:
      # the detector reads photos upright at their own size (EXIF applied, as its command does)
      read.append((name, images_lib.read_image(path, size, exif=True) if regions
                   else extract.read_image(path, size)))
    except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
      failed.append(name)
      print(f"warning: {path}: unreadable image ({extract.unreadable_reason(e)}); skipped",
            file=sys.stderr, flush=True)
  if not read:
    raise BadInput(f"--images={images}: none of the {len(names)} images could be read; "
                   "expected image files Pillow can open")
  run = api.load(workdir, step)
  print(f"Captioning {len(read)} images of {images} with step {run.step} of {workdir} "
        f"({source}).", flush=True)
  captions = run.caption_images([img for _, img in read], weights, batch_size=batch_size, **decode)
  result = [{"image": name, "caption": c} for (name, _), c in zip(read, captions)]
  atomic.write_json(out, result)
  for item in result[:5]:
    print(f"  {item['image']}: {shown_caption(item['caption'])}")
  print(f"{out}: {len(result)} captions" + (f"; {len(failed)} unreadable image(s) skipped"
                                            if failed else ""), flush=True)
  return result


def server_results(workdir: str, which: str, *, att_dir: str | None = None, fc_dir: str | None = None,
                   box_dir: str | None = None, image_info: str | None = None, alg: str = "jaxcap",
                   out_dir: str | None = None, step: int | None = None, decode: dict | None = None,
                   batch_size: int = 50) -> str:
  """Captions every image of a COCO set without references (``which``: ``test2014`` or
  ``val2014``; :mod:`jaxcap.evaluation.server`) from its feature folders, with the run's best
  checkpoint (or ``step``), and writes ``captions_<which>_<alg>_results.json`` to ``out_dir``
  (default the workdir), checked against the server's format. Returns its path."""
  if which not in server.SETS:
    raise BadInput(f"--server={which}: expected one of {', '.join(server.SETS)}")
  server.check_alg(alg)
  config = run_dir.read_config(workdir)
  out_dir = out_dir or workdir
  path = os.path.join(out_dir, server.results_name(which, alg))
  atomic.check_writable(path, f"--workdir={out_dir}", file=True)  # where the results file goes
  if batch_size < 1:
    raise BadInput(f"--batch_size={batch_size}: expected an int >= 1")
  data = config.data
  needs = [(flag, d) for flag, d, field in (("--att_dir", att_dir, "att_dir"), ("--fc_dir", fc_dir, "fc_dir"),
                                            ("--box_dir", box_dir, "box_dir")) if data.get(field)]
  if not needs:
    raise BadInput(f"{workdir}: trained on data.name={data.name!r}, not on per-image feature "
                   "folders; expected a run trained on features in the community's layout "
                   "(data.att_dir / fc_dir)")
  missing = [flag for flag, d in needs if not d]
  if missing:
    raise BadInput(f"{missing[0]}: missing; this run was trained with "
                   f"{', '.join(flag[2:] for flag, _ in needs)} features, expected the set's folder of them")
  decode = _decode_of(decode, config)
  first = next(d for _, d in needs)
  ids = server.read_image_info(image_info) if image_info else server.folder_ids(first, needs[0][0])
  reader = server.features_reader(ids, att_dir if data.get("att_dir") else None,
                                  fc_dir if data.get("fc_dir") else None,
                                  box_dir if data.get("box_dir") else None, grid=bool(data.get("grid")))
  if len(ids) != server.SETS[which]:
    print(f"note: {len(ids)} images; the server's {which} has {server.SETS[which]:,} and scores a "
          "file only when it holds every one of them", flush=True)
  run = api.load(workdir, step)
  print(f"Captioning {len(ids)} {which} images with step {run.step} of {workdir}.", flush=True)
  captions = {}
  truncate = bool(data.get("truncate_regions"))
  for start in range(0, len(ids), batch_size):
    idx = list(range(start, min(start + batch_size, len(ids))))
    # Run.caption pads the last chunk to batch_size: one compiled shape.
    out = run.caption(server.chunk_features(reader, idx, run.info, truncate), batch_size=batch_size,
                      **decode)
    captions.update({ids[i]: c for i, c in zip(idx, out)})
  server.write_results(path, captions)
  print(f"wrote {path}: {len(captions)} captions, the server's format checked", flush=True)
  return path
