"""Evaluates a checkpoint, or scores any captioner's predictions file.

  python evaluate.py --workdir runs/transformer_synthetic [--split test] [--step N] [--beam-size 3] [--block-trigrams]
  python evaluate.py --workdir runs/transformer_synthetic --beam-size 3 --beam-mode self_critical --tag _sc3
  python evaluate.py --workdir runs/t1 --beam-size 6 --beam-groups 3 --diversity-strength 0.5 --sample-n 6 --sample-n-method beam
  python evaluate.py --ensemble runs/a,runs/b [--ensemble-weights 1,1] [--workdir OUT] [--beam-size 3]
  python evaluate.py --predictions P.json --references R.json --out S.json
  python evaluate.py --workdir runs/mine --images photos/ --out captions.json [--weights resnet101.safetensors]
  jaxcap-evaluate --workdir runs/transformer_synthetic   # the same, once the package is installed

The first form loads the best checkpoint (or ``--step``), decodes the split, prints the metric
table and writes ``predictions_<split><tag>.json`` (COCO results format) and
``scores_<split><tag>.json`` (overall and per image) in the workdir. ``--ensemble`` decodes with
several runs together (``jaxcap.load_ensemble``: the members' step probabilities averaged), each
from its best checkpoint, with the first run's data and decode config; the files go to ``--workdir``
(default: the first run's) with the tag ``_ensemble`` unless ``--tag`` is given. The second scores a COCO
results file against references in the COCO annotation format.

``--images DIR`` captions every image file of DIR (the extensions ``jaxcap-extract`` reads) with
a run trained on ``jaxcap-extract``'s features: its recorded backbone (``features.json``; the
``--weights`` file with the recorded sha256, none for random weights) and the run's best
checkpoint, with the decoding flags above. It writes ``[{"image": "<file name>", "caption":
"..."}]`` to ``--out`` atomically; no references, no scores. An unreadable file is reported in one
line and left out.
"""

import os

from absl import app, flags


if "workdir" not in flags.FLAGS:  # train.py defines the same flag (both load in one test process)
  flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
flags.DEFINE_string("split", "test", "Split to decode: train, val or test.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the best by validation CIDEr-D).")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the config's decode settings; 1 with --beam-mode self_critical = greedy).")
flags.DEFINE_enum("beam_mode", None, ["live", "self_critical"],
                  "Beam search: 'live' keeps K live hypotheses (flax/t5x, the default); "
                  "'self_critical' takes the K best candidates, finished ones included "
                  "(self-critical.pytorch).")
flags.DEFINE_integer("beam_groups", None,
                     "Diverse beam search (Vijayakumar et al.): G groups of beam_size / G beams, "
                     "output group after group (1: ordinary beam search).")
flags.DEFINE_float("diversity_strength", None,
                   "Diverse beam search: penalty per earlier-group choice of a word at the same "
                   "step (self-critical.pytorch's diversity_lambda).")
flags.DEFINE_string("ensemble", None,
                    "Comma-separated run directories decoded together (same vocabulary; their "
                    "step probabilities averaged), e.g. runs/a,runs/b.")
flags.DEFINE_string("ensemble_weights", None, "Comma-separated member weights for --ensemble "
                    "(default: equal).")
flags.DEFINE_enum("length_penalty", None, ["none", "gnmt", "average"], "Beam length penalty.")
flags.DEFINE_float("alpha", None, "GNMT length-penalty exponent.")
flags.DEFINE_integer("min_len", None, "Minimum caption length in words.")
flags.DEFINE_bool("block_trigrams", None, "Block repeated trigrams in beam search.")
flags.DEFINE_bool("suppress_unk", None, "Never emit UNK.")
flags.DEFINE_bool("remove_bad_endings", None,
                  "Never end a caption with 'a', 'the', 'of', ... (self-critical.pytorch's list).")
flags.DEFINE_enum("attributes", None, ["oracle", "noisy", "detected", "none"],
                  "Attributes the evaluated split reads (models with attributes, e.g. ETA; default: "
                  "the run's data config): oracle = ground truth, e.g. to test ETA^oracle.")
flags.DEFINE_bool("sample", False, "Sample instead of greedy / beam search.")
flags.DEFINE_float("temperature", None, "Sampling temperature.")
flags.DEFINE_integer("top_k", None, "Sample among the k most likely words (0: all).")
flags.DEFINE_float("top_p", None, "Nucleus sampling mass (1: all).")
flags.DEFINE_integer("max_len", None, "Longest caption in words.")
flags.DEFINE_integer("sample_n", 0, "Also write N captions per image to predictions_<split><tag>_n<N>.json "
                     "(self-critical.pytorch's sample_n).")
flags.DEFINE_enum("sample_n_method", "sample", ["sample", "beam"],
                  "How the --sample-n captions are drawn: sampling with the decode options, or the "
                  "N best of a beam search of size N.")
flags.DEFINE_integer("batch_size", None, "Images per decoding batch.")
flags.DEFINE_bool("spice", False, "Also compute SPICE (needs its Stanford CoreNLP jars).")
flags.DEFINE_string("tag", "", "Suffix of the output file names, e.g. _beam3.")
flags.DEFINE_string("predictions", None, "Score this COCO results file instead of a checkpoint.")
flags.DEFINE_string("references", None, "COCO annotation file with the references (with --predictions).")
flags.DEFINE_string("out", None, "Where to write the scores JSON (with --predictions), or the "
                    "captions JSON (with --images).")
flags.DEFINE_string("images", None, "Caption every image file of this folder with the run's "
                    "recorded backbone (runs trained on jaxcap-extract's features); needs --out.")
flags.DEFINE_string("weights", None, "With --images: the backbone's .safetensors file (the one "
                    "the run's features.json records; none for random weights).")

# The spellings with dashes work too (--beam-size 3, --length-penalty gnmt, --block-trigrams).
for _name in ("beam_size", "beam_mode", "length_penalty", "min_len", "block_trigrams", "suppress_unk", "top_k",
              "top_p", "max_len", "batch_size", "remove_bad_endings", "sample_n", "sample_n_method",
              "beam_groups", "diversity_strength", "ensemble_weights"):
  flags.DEFINE_alias(_name.replace("_", "-"), _name)

FLAGS = flags.FLAGS


def decode_overrides(config):
  d = config.decode
  if FLAGS.sample:
    d.method = "sample"
  elif FLAGS.beam_size is not None:
    # One self-critical beam is greedy decoding; one live beam also keeps finished captions.
    mode = FLAGS.beam_mode or d.get("beam_mode", "live")
    d.method = "greedy" if FLAGS.beam_size == 1 and mode == "self_critical" else "beam"
    d.beam_size = FLAGS.beam_size
  if not FLAGS.sample and (FLAGS.beam_groups or 1) > 1:
    d.method = "beam"  # groups are a beam search
  for name in ("beam_mode", "length_penalty", "alpha", "min_len", "block_trigrams", "suppress_unk", "temperature",
               "top_k", "top_p", "max_len", "remove_bad_endings", "beam_groups", "diversity_strength"):
    value = getattr(FLAGS, name)
    if value is not None:
      d[name] = value
  return d


def data_overrides(config):
  """``--attributes``: the attribute mode of the evaluated split (vocabulary and attribute
  words do not depend on it, so the model's inputs keep their meaning)."""
  if FLAGS.attributes:
    config.data["test_attributes" if FLAGS.split == "test" else "attributes"] = FLAGS.attributes
  return config.data


def evaluate_workdir():
  from jaxcap import api, run_dir
  from jaxcap import data as data_lib
  from jaxcap.training import parallel
  config = run_dir.read_config(FLAGS.workdir)
  if FLAGS.batch_size is not None and FLAGS.batch_size < 1:
    raise ValueError(f"--batch_size={FLAGS.batch_size}: expected an int >= 1")
  if FLAGS.batch_size:
    config.eval_batch_size = FLAGS.batch_size
  data_overrides(config)
  dataset = data_lib.get_dataset(config.data)
  run_dir.check_workdir(FLAGS.workdir, config, dataset.vocab)
  if FLAGS.split not in dataset.splits:  # before loading (and compiling) anything
    raise ValueError(f"--split={FLAGS.split}: not a split of {dataset.name}; expected one "
                     f"of {', '.join(dataset.splits)}")
  check_inputs(config, dataset, config)
  run = api.load(FLAGS.workdir, FLAGS.step, dataset=dataset, mesh=parallel.make_mesh())
  print(f"Evaluating step {run.step} of {FLAGS.workdir} on split {FLAGS.split!r}.", flush=True)
  decode_and_write(run, decode_overrides(config), config.eval_batch_size, FLAGS.workdir, FLAGS.tag)


def check_inputs(member_config, dataset, config):
  """The evaluated split has what the model of ``member_config`` reads (before any checkpoint
  is loaded); ``config``: the evaluated run's (its data config)."""
  from jaxcap.models import registry
  from jaxcap.training import validation
  model = registry.build(member_config.model, dict(dataset.info))
  if FLAGS.attributes == "none" and "attributes" in model.required_inputs():
    raise ValueError(f"--attributes=none: {validation.model_label(model, member_config.model)} attends to "
                     "attribute words; expected --attributes oracle, noisy or detected")
  validation.check_model_inputs(model, dataset, config, [FLAGS.split], model_config=member_config.model)


def decode_and_write(run, decode_config, batch_size, out_dir, tag):
  """Decodes the split with ``run`` (:meth:`jaxcap.api.Run.predict`), scores it and writes the
  predictions and scores to ``out_dir``; ``--sample-n`` also the n captions per image."""
  import jax
  from jaxcap import atomic, run_dir
  options = decode_config.to_dict()
  preds = run.predict(FLAGS.split, batch_size=batch_size, **options)
  refs = run.dataset.references(FLAGS.split)
  run_dir.write_scores(out_dir, FLAGS.split, preds, {k: refs[k] for k in preds}, FLAGS.spice, tag,
                       translation=run.dataset.src_vocab is not None)
  if FLAGS.sample_n:
    options.pop("method", None)  # --sample-n-method decides
    preds = run.sample_n(FLAGS.split, FLAGS.sample_n, FLAGS.sample_n_method, batch_size=batch_size,
                         **options)
    path = os.path.join(out_dir, f"predictions_{FLAGS.split}{tag}_n{FLAGS.sample_n}.json")
    if jax.process_index() == 0:
      atomic.write_json(path, [{"image_id": k, "caption": c} for k, caps in preds.items() for c in caps])
    print(f"{path}: {FLAGS.sample_n} captions ({FLAGS.sample_n_method}) for each of {len(preds)} images")


def evaluate_ensemble():
  """--ensemble runs/a,runs/b: the members loaded with jaxcap.load, decoded together
  (jaxcap.load_ensemble)."""
  from jaxcap import api, ensemble, run_dir
  from jaxcap import data as data_lib
  from jaxcap.training import parallel
  workdirs = [w.strip() for w in FLAGS.ensemble.split(",") if w.strip()]
  if not workdirs:
    raise ValueError("--ensemble: expected comma-separated run directories, got none")
  if FLAGS.step is not None:
    raise ValueError("--step does not apply to --ensemble (each member uses its best checkpoint)")
  weights = None
  if FLAGS.ensemble_weights is not None:  # before any run is read
    weights = ensemble.check_weights(FLAGS.ensemble_weights, len(workdirs),
                                     f"--ensemble-weights={FLAGS.ensemble_weights}")
  runs = [(run_dir.read_config(w), run_dir.read_vocab(w)) for w in workdirs]
  # Refused before any data or checkpoint is read.
  ensemble.check_same_vocab([v for _, v in runs], workdirs)
  config = runs[0][0]
  for w, (cfg, _) in zip(workdirs[1:], runs[1:]):
    for field in ("name", "root"):
      if cfg.data.get(field) != config.data.get(field):
        raise ValueError(f"--ensemble: {w} was trained on data.{field}={cfg.data.get(field)!r}, "
                         f"{workdirs[0]} on {config.data.get(field)!r}; members must share the data")
  if FLAGS.batch_size:
    config.eval_batch_size = FLAGS.batch_size
  data_overrides(config)
  # The first run's data (with the overrides) for every member; each member's checkpoint is
  # restored with its own model, then the ensemble decodes.
  dataset = data_lib.get_dataset(config.data)
  mesh = parallel.make_mesh()
  members = []
  for i, (w, (cfg, _)) in enumerate(zip(workdirs, runs)):
    run_dir.check_workdir(w, cfg, dataset.vocab)
    check_inputs(cfg, dataset, config)
    member = api.load(w, dataset=dataset, mesh=mesh)
    print(f"Member {i}: {cfg.model.name} from {w}, step {member.step}.", flush=True)
    members.append(member)
  ens = api.load_ensemble(members, weights)
  out_dir = FLAGS.workdir or workdirs[0]
  os.makedirs(out_dir, exist_ok=True)
  print(f"Evaluating an ensemble of {len(workdirs)} on split {FLAGS.split!r}.", flush=True)
  decode_and_write(ens, decode_overrides(config), config.eval_batch_size, out_dir, FLAGS.tag or "_ensemble")


def caption_images():
  """--images DIR --out captions.json: the run's recorded backbone, then its best checkpoint."""
  import json
  import sys
  from jaxcap import api, run_dir
  from jaxcap.features import extract
  from jaxcap.features import record as record_lib
  if not FLAGS.out:
    raise ValueError("--images needs --out captions.json; expected where to write the captions")
  if os.path.isdir(FLAGS.out):
    raise ValueError(f"--out={FLAGS.out}: is a directory; expected a JSON file name")
  names = extract.list_images(FLAGS.images)
  if not names:
    raise ValueError(f"--images={FLAGS.images}: no image files ({', '.join(extract.IMAGE_EXTENSIONS)}); "
                     "expected a folder of images")
  config = run_dir.read_config(FLAGS.workdir)
  record = run_dir.read_features_record(FLAGS.workdir)
  if record is None:
    raise ValueError(f"{FLAGS.workdir}: no {run_dir.FEATURES_FILE}; this run was trained on "
                     "features jaxcap-extract did not write, so it cannot caption image files "
                     "(caption feature arrays with Run.caption)")
  # Refused before any image is read or any checkpoint restored.
  record_lib.check_weights(record, FLAGS.weights, os.path.join(FLAGS.workdir, run_dir.FEATURES_FILE))
  size, pixels, failed = int(record["size"]), [], []
  for name in names:
    path = os.path.join(FLAGS.images, name)
    try:
      pixels.append((name, extract.read_image(path, size)))
    except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
      failed.append(name)
      print(f"warning: {path}: unreadable image ({extract.unreadable_reason(e)}); skipped",
            file=sys.stderr, flush=True)
  if not pixels:
    raise ValueError(f"--images={FLAGS.images}: none of the {len(names)} images could be read; "
                     "expected image files Pillow can open")
  run = api.load(FLAGS.workdir, FLAGS.step)
  print(f"Captioning {len(pixels)} images of {FLAGS.images} with step {run.step} of "
        f"{FLAGS.workdir} ({record['backbone']} features).", flush=True)
  options = decode_overrides(config).to_dict()
  captions = run.caption_images([img for _, img in pixels], FLAGS.weights,
                                batch_size=FLAGS.batch_size or 16, **options)
  out = [{"image": name, "caption": c} for (name, _), c in zip(pixels, captions)]
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  tmp = f"{FLAGS.out}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(out, f, indent=1)
  os.replace(tmp, FLAGS.out)
  for item in out[:5]:
    print(f"  {item['image']}: {item['caption']}")
  print(f"{FLAGS.out}: {len(out)} captions" + (f"; {len(failed)} unreadable image(s) skipped"
                                              if failed else ""), flush=True)


def score_predictions():
  from jaxcap.evaluation import files
  from jaxcap.run_dir import format_table
  if not FLAGS.references or not FLAGS.out:
    raise ValueError("--predictions needs --references R.json (COCO annotation format) and --out S.json; "
                     "expected all three")
  result = files.score_files(FLAGS.predictions, FLAGS.references, FLAGS.out, spice=FLAGS.spice)
  print(format_table(result["overall"], title=f"{FLAGS.predictions} ({len(result['per_image'])} images)"))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from jaxcap.cli import run_main
  if FLAGS.ensemble_weights is not None and not FLAGS.ensemble:
    raise app.UsageError(f"--ensemble-weights={FLAGS.ensemble_weights}: weights without "
                         "--ensemble; expected --ensemble runs/a,runs/b with one weight per run")
  if FLAGS.images is not None:
    for flag in ("ensemble", "predictions"):
      if getattr(FLAGS, flag):
        raise app.UsageError(f"--images with --{flag}: expected --images with one --workdir "
                             "(captions of image files, no scores)")
    if not FLAGS.workdir:
      raise app.UsageError("--images without --workdir; expected --workdir (a run trained on "
                           "jaxcap-extract's features)")
    if not os.path.isdir(FLAGS.images):
      raise app.UsageError(f"--images={FLAGS.images}: not a directory; expected a folder of images")
  elif FLAGS.weights is not None:
    raise app.UsageError(f"--weights={FLAGS.weights} without --images; expected --images DIR "
                         "(the backbone weights of image captioning)")
  if FLAGS.predictions:
    return run_main(score_predictions)
  if FLAGS.ensemble:
    return run_main(evaluate_ensemble)
  if not FLAGS.workdir:
    raise app.UsageError("no --workdir; expected --workdir (a checkpoint to evaluate), "
                         "--ensemble or --predictions/--references/--out")
  if not os.path.isdir(FLAGS.workdir):
    raise app.UsageError(f"--workdir={FLAGS.workdir}: not a directory; expected a workdir "
                         "written by train.py")
  if FLAGS.images is not None:
    return run_main(caption_images)
  return run_main(evaluate_workdir)


def cli(argv=None):
  """The command line (``python evaluate.py ...``); ``argv`` for in-process use. Exits."""
  from jaxcap.cli import run_app
  run_app(main, argv)


def run():
  """Console-script entry point (``jaxcap-evaluate``)."""
  cli()


if __name__ == "__main__":
  run()
