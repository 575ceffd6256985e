"""Evaluates a checkpoint, or scores any captioner's predictions file.

  python evaluate.py --workdir runs/transformer_synthetic [--split test] [--step N] [--beam-size 3] [--block-trigrams]
  python evaluate.py --workdir runs/t1 --beam-size 6 --beam-groups 3 --diversity-strength 0.5 --sample-n 6 --sample-n-method beam
  python evaluate.py --ensemble runs/a,runs/b [--ensemble-weights 1,1] [--workdir OUT] [--beam-size 3]
  python evaluate.py --predictions P.json --references R.json --out S.json
  python evaluate.py --workdir runs/mine --clip_weights ViT-B-32.pt --pac_weights clip_ViT-B-32.pth --clip_images val2014/
  python evaluate.py --workdir runs/mine --images photos/ --out captions.json [--weights resnet101.safetensors]
  python evaluate.py --workdir runs/bu --server test2014 --att_dir data/cocotest_bu_att --fc_dir data/cocotest_bu_fc --alg mine
  jaxcap-evaluate --workdir runs/transformer_synthetic   # the same, once the package is installed

The first form decodes the split with the best checkpoint (or ``--step``), prints the metric
table and the scores' signature (:mod:`jaxcap.evaluation.signature`) and writes
``predictions_<split><tag>.json`` / ``scores_<split><tag>.json`` in the workdir; ``--ensemble``
decodes several runs together (tag ``_ensemble`` unless ``--tag``); ``--predictions`` scores a
COCO results file; ``--images`` captions image files; ``--server`` writes the COCO evaluation
server's file (:mod:`jaxcap.evaluation.server`). The work is :mod:`jaxcap.evaluation.runs`.
"""

import os

from absl import flags
import ml_collections

from jaxcap import atomic, cli, ensemble, run_dir
from jaxcap.errors import BadInput
from jaxcap.evaluation import files, runs, server
from jaxcap.training import validation

_D = {}  # decoding flags: name -> holder; None means "the run's own setting"
for _name, _define, _args in [
    ("beam_size", flags.DEFINE_integer, ("Beam size (1 with --beam-mode self_critical: greedy).",)),
    ("beam_mode", flags.DEFINE_enum, (["live", "self_critical", "in_slots"],
                                      "'live': K live hypotheses (flax / t5x); 'self_critical': "
                                      "self-critical.pytorch's; 'in_slots': the M² authors' "
                                      "(finished captions stay among the K until pushed out).")),
    ("beam_groups", flags.DEFINE_integer, ("Diverse beam search: G groups of beam_size / G beams.",)),
    ("diversity_strength", flags.DEFINE_float, ("Diverse beam search's penalty (diversity_lambda).",)),
    ("length_penalty", flags.DEFINE_enum, (["none", "gnmt", "average"], "Beam length penalty.")),
    ("alpha", flags.DEFINE_float, ("GNMT length-penalty exponent.",)),
    ("min_len", flags.DEFINE_integer, ("Minimum caption length in words.",)),
    ("block_trigrams", flags.DEFINE_bool, ("Block repeated trigrams in beam search.",)),
    ("suppress_unk", flags.DEFINE_bool, ("Never emit UNK.",)),
    ("remove_bad_endings", flags.DEFINE_bool, ("Never end on 'a', 'the', 'of', ... (self-critical's list).",)),
    ("temperature", flags.DEFINE_float, ("Sampling temperature.",)),
    ("top_k", flags.DEFINE_integer, ("Sample among the k most likely words (0: all).",)),
    ("top_p", flags.DEFINE_float, ("Nucleus sampling mass (1: all).",)),
    ("max_len", flags.DEFINE_integer, ("Longest caption in words.",))]:
  _D[_name] = _define(_name, None, *_args)
  if "_" in _name:  # the spellings with dashes work too (--beam-size 3)
    flags.DEFINE_alias(_name.replace("_", "-"), _name)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
_SPLIT = flags.DEFINE_string("split", "test", "Split to decode: train, val or test.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the best by validation).")
_SAMPLE = flags.DEFINE_bool("sample", False, "Sample instead of greedy / beam search.")
_ATTRIBUTES = flags.DEFINE_enum("attributes", None, ["oracle", "noisy", "detected", "none"],
                                "Attributes the split reads (ETA; default: the run's data config).")
_BATCH = flags.DEFINE_integer("batch_size", None, "Images per decoding batch.")
_SAMPLE_N = flags.DEFINE_integer("sample_n", 0, "Also write N captions per image to "
                                 "predictions_<split><tag>_n<N>.json (self-critical's sample_n).")
_SAMPLE_N_METHOD = flags.DEFINE_enum("sample_n_method", "sample", ["sample", "beam"],
                                     "--sample-n: sampling, or the N best of a beam of N.")
_ENSEMBLE = flags.DEFINE_string("ensemble", None, "Comma-separated run directories decoded together.")
_WEIGHTS = flags.DEFINE_string("ensemble_weights", None, "Comma-separated member weights (default equal).")
_SPICE = flags.DEFINE_bool("spice", False, "Also compute SPICE (needs its Stanford CoreNLP jars).")
_POST = flags.DEFINE_enum("caption_postprocess", None, ["none", "dedupe_repeats"],
                          "Done to the captions before they are scored (recorded in the signature): "
                          "'dedupe_repeats' keeps a run of one word once, as the M² authors' scoring "
                          "(default: the run's config field caption_postprocess; 'none' for --predictions).")
_TAG = flags.DEFINE_string("tag", None, "Suffix of the output file names, e.g. _beam3 (default: none, or "
                           "the decoding's, e.g. _beam3, where training's scores_<split>.json is kept; '' "
                           "replaces it).")
_PREDICTIONS = flags.DEFINE_string("predictions", None, "Score this COCO results file.")
_REFERENCES = flags.DEFINE_string("references", None, "COCO annotation file (with --predictions).")
_OUT = flags.DEFINE_string("out", None, "The scores JSON (--predictions) or captions JSON (--images).")
_IMAGES = flags.DEFINE_string("images", None, "Caption every image file of this folder (needs --out).")
_IMAGE_WEIGHTS = flags.DEFINE_string("weights", None, "With --images: the backbone's .safetensors, or for a run on "
                                      "bottom-up region features the region detector's pytorch_model.bin / .pkl.")
_SERVER = flags.DEFINE_enum("server", None, ["test2014", "val2014"], "Write the COCO evaluation "
                            "server's results file for this set (needs its feature folders).")
_S = {n: flags.DEFINE_string(n, None, f"--server: {h}") for n, h in [
    ("att_dir", "the set's region features (<image_id>.npz/.npy)."), ("fc_dir", "its global features."),
    ("box_dir", "its boxes."), ("image_info", "COCO's image_info_test2014.json / captions_val2014.json.")]}
_ALG = flags.DEFINE_string("alg", "jaxcap", "--server: the algorithm's name in the file name.")
_CLIP_WEIGHTS = flags.DEFINE_string("clip_weights", None, "Also CLIP-S and RefCLIP-S with these CLIP "
                                    "weights (OpenAI's ViT-B-32.pt, open_clip's or Hugging Face's .safetensors).")
_PAC_WEIGHTS = flags.DEFINE_string("pac_weights", None, "Also PAC-S and RefPAC-S with PAC-S's checkpoint "
                                   "(clip_ViT-B-32.pth).")
_CLIP_IMAGES = flags.DEFINE_string("clip_images", None, "The scored images for --clip_weights / "
                                   "--pac_weights: a folder (subfolders searched) or {image_id: path} JSON.")
_REFCLIP = flags.DEFINE_enum("refclip_variant", "clipscore", ["clipscore", "clip_caption_reward"],
                             "RefCLIP-S's reference term: clipscore.py's raw cosine, or "
                             "CLIP-Caption-Reward's 2.5 max(cos, 0).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a file at --out (or write into an --ensemble's "
                                "--workdir) that jaxcap did not write.")
_CLIP_BATCH = flags.DEFINE_integer("clip_batch_size", 64, "Images / captions per CLIP batch.")
for _name in ("sample_n", "sample_n_method", "ensemble_weights", "batch_size", "caption_postprocess",
              "clip_weights", "pac_weights", "clip_images", "refclip_variant", "clip_batch_size"):
  flags.DEFINE_alias(_name.replace("_", "-"), _name)


def _clip_request():
  """The CLIP scores asked for; without --clip_images, the images jaxcap-extract read for the run
  (or the first ensemble member)."""
  from jaxcap.clip import metrics as clip_metrics
  request = clip_metrics.Request(_CLIP_WEIGHTS.value, _PAC_WEIGHTS.value, _CLIP_IMAGES.value,
                                 _REFCLIP.value, _CLIP_BATCH.value)
  members = [w.strip() for w in (_ENSEMBLE.value or "").split(",") if w.strip()]
  return request.with_default_images(members[0] if members else _WORKDIR.value)


def _typed_decode_flags() -> dict[str, str]:
  """``{"decode.<field>": flag as typed}`` of the decoding flags given (``--sample`` sets
  ``decode.method``)."""
  out = {f"decode.{name}": cli.typed_flag(name) for name, holder in _D.items() if holder.value is not None}
  if _SAMPLE.value:
    out["decode.method"] = "--sample"
  return {path: flag for path, flag in out.items() if flag}


def _decode(config_decode: dict) -> dict:
  options = {k: h.value for k, h in _D.items() if k != "beam_size"}
  return runs.decode_options(config_decode, sample=_SAMPLE.value, beam_size=_D["beam_size"].value,
                             **options)


# The program's other forms (each named by its flag), the flags each needs, and the flags that
# only it takes.
_FORMS = {"images": (("workdir", "out"), ("weights",)), "server": (("workdir",), tuple(_S)),
          "predictions": (("references", "out"), ()), "ensemble": ((), ("ensemble-weights",))}


def _check_flags() -> None:
  """The combinations of flags, before anything is read."""
  given = [f for f in _FORMS if flags.FLAGS[f].value]
  for form, (needs, own) in _FORMS.items():
    other = [f"--{f}" for f in given if f != form]
    lacking = [f"--{n}" for n in needs if not flags.FLAGS[n].value]
    if form in given and (other or lacking):
      raise BadInput(f"--{form} with {(other or ['no ' + '/'.join(lacking)])[0]}: expected --{form} with "
                       f"{' and '.join('--' + n for n in needs) or 'its runs'} and no other form")
    stray = [n for n in own if flags.FLAGS[n].value is not None]
    if stray and form not in given:
      raise BadInput(f"--{stray[0]}={flags.FLAGS[stray[0]].value} without --{form}; expected --{form} "
                       f"(--{stray[0]} belongs to it)")
  if not (given or _WORKDIR.value):
    raise BadInput("no --workdir; expected --workdir (a checkpoint to evaluate), --ensemble or "
                     "--predictions/--references/--out")
  if _POST.value is not None and (_IMAGES.value is not None or _SERVER.value is not None):
    raise BadInput(f"--caption-postprocess={_POST.value} with --{'images' if _IMAGES.value else 'server'}: "
                     "nothing is scored there; expected it with a split to score or --predictions")
  if _STEP.value is not None and _ENSEMBLE.value:
    raise BadInput("--step does not apply to --ensemble (each member uses its best checkpoint)")
  _check_outputs()
  clip = _clip_request()
  if clip and (_IMAGES.value is not None or _SERVER.value is not None):
    raise BadInput(f"--{'clip_weights' if _CLIP_WEIGHTS.value else 'pac_weights'} with "
                     f"--{'images' if _IMAGES.value else 'server'}: nothing is scored there; expected "
                     "it with a split to score or --predictions")
  clip.check()


def _check_outputs() -> None:
  """The paths the user named for the outputs hold nothing jaxcap did not write (or
  --overwrite): the scores JSON (--predictions), the captions JSON (--images), an ensemble's
  --workdir folder. A run's own --workdir is a run directory: its files are jaxcap's."""
  if _OUT.value and (_PREDICTIONS.value or _IMAGES.value):
    mine, what = ((files.is_scores_file, "a scores file jaxcap wrote") if _PREDICTIONS.value else
                  (runs.is_captions_file, "a captions file evaluate.py --images wrote"))
    atomic.check_output(_OUT.value, f"--out={_OUT.value}", overwrite=_OVERWRITE.value, mine=mine, what=what)
  if _ENSEMBLE.value and _WORKDIR.value:
    atomic.check_output(_WORKDIR.value, f"--workdir={_WORKDIR.value}", folder=True,
                        overwrite=_OVERWRITE.value, mine=runs.is_output_folder,
                        what="a run directory or one jaxcap's evaluations wrote")


def check() -> None:
  """The checks the program makes before it reads any data or checkpoint (``--only_check_args``
  runs them alone): the combinations of flags, and for a run to decode (the first of an
  ensemble) its decoding options and a beam no wider than its vocabulary (a wider one decodes
  for minutes and scores zeros)."""
  _check_flags()
  if _PREDICTIONS.value:
    return
  members = [w.strip() for w in (_ENSEMBLE.value or "").split(",") if w.strip()]
  if _ENSEMBLE.value is not None and not members:
    raise BadInput("--ensemble: expected comma-separated run directories, got none")
  if members and _WEIGHTS.value is not None:
    ensemble.check_weights(_WEIGHTS.value, len(members), f"--ensemble-weights={_WEIGHTS.value}")
  if _BATCH.value is not None and _BATCH.value < 1:
    raise BadInput(f"--batch_size={_BATCH.value}: expected an int >= 1")
  if _SERVER.value is not None:
    server.check_alg(_ALG.value)
  workdir = members[0] if members else _WORKDIR.value
  # A run not written yet (a command checked before the train.py that writes it): the flags'
  # decoding values alone; the run itself names what is missing when it starts.
  there = workdir is not None and os.path.isfile(os.path.join(workdir, run_dir.CONFIG_FILE))
  config = run_dir.read_config(workdir) if there else ml_collections.ConfigDict()
  options = _decode(config.decode.to_dict() if "decode" in config else {})
  try:
    validation.check_config(ml_collections.ConfigDict({"decode": options}))
  except BadInput as e:  # a decoding flag's value: refused by the flag the user typed
    raise cli.as_typed(e, _typed_decode_flags()) from None
  beam = options.get("beam_size")
  if there and options.get("method") == "beam" and isinstance(beam, int):
    words = len(run_dir.read_vocab(workdir))
    if beam > words:
      field = (f"--beam-size={beam}" if _D["beam_size"].value is not None else
               f"config field decode.beam_size ({beam}, {workdir}/config.json)")
      raise BadInput(f"{field}: wider than the vocabulary of {workdir} ({words} words); "
                       f"expected a beam size of at most {words}")


def main(argv):
  del argv
  check()
  if _PREDICTIONS.value:
    result = files.score_files(_PREDICTIONS.value, _REFERENCES.value, _OUT.value, spice=_SPICE.value,
                               caption_postprocess=_POST.value or "none", clip=_clip_request())
    run_dir.print_scores(result, f"{_PREDICTIONS.value} ({len(result['per_image'])} images)", _OUT.value)
    return
  common = dict(split=_SPLIT.value, batch_size=_BATCH.value, attributes=_ATTRIBUTES.value,
                spice=_SPICE.value, sample_n=_SAMPLE_N.value, sample_n_method=_SAMPLE_N_METHOD.value,
                caption_postprocess=_POST.value, clip=_clip_request())
  if _ENSEMBLE.value:
    workdirs = [w.strip() for w in _ENSEMBLE.value.split(",") if w.strip()]
    if _WORKDIR.value and not runs.is_output_folder(_WORKDIR.value):
      atomic.mark_folder(_WORKDIR.value, "evaluate.py --ensemble")  # checked: new, empty or --overwrite
    runs.evaluate_ensemble(workdirs, _WEIGHTS.value, out_dir=_WORKDIR.value, decode=_decode,
                           tag=_TAG.value or "_ensemble", **common)
    return
  if _SERVER.value is not None:
    runs.server_results(_WORKDIR.value, _SERVER.value, alg=_ALG.value, step=_STEP.value, decode=_decode,
                        batch_size=_BATCH.value or 50, **{n: h.value for n, h in _S.items()})
  elif _IMAGES.value is not None:
    runs.caption_folder(_WORKDIR.value, _IMAGES.value, _OUT.value, weights=_IMAGE_WEIGHTS.value,
                        step=_STEP.value, decode=_decode, batch_size=_BATCH.value or 16)
  else:
    runs.evaluate_run(_WORKDIR.value, step=_STEP.value, decode=_decode, tag=_TAG.value, **common)


def run():
  """The program (``python evaluate.py``, console script ``jaxcap-evaluate``)."""
  cli.run_absl(main, check=check)
