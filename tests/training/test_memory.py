"""Will it fit? ``train.py --dry_run`` / ``jaxcap.dry_run`` and the memory check at start.

The refusals use batches no machine holds (hundreds of GiB per device on the CPU backend, whose
limit is the host's memory), so they hold on any test machine. Mutants tried (each made a test
here fail, then was restored): ``Trainer._start`` without ``check_memory`` (the too-large run
writes its workdir and dies later); ``StepMemory.total`` without the temporaries (the
too-large batch passes); ``dry_run`` without ``check_memory`` (exit 0 on the too-large batch).
"""

import os

import pytest

import jaxcap
from jaxcap.training import memory
from tests.programs import Programs, one_device_env

_TINY = "--config=configs/transformer.py:synthetic,tiny"


@pytest.fixture(scope="module")
def programs():
  with Programs(one_device_env()) as p:  # the sizes below are for one device
    yield p


def test_step_memory_is_arguments_outputs_and_temporaries_less_the_donated():
  class Analysis:
    argument_size_in_bytes, output_size_in_bytes, temp_size_in_bytes = 100, 40, 1000
    alias_size_in_bytes, generated_code_size_in_bytes = 40, 7

  class Compiled:
    def memory_analysis(self):
      return Analysis()

  m = memory.step_memory(Compiled())
  assert m.total == 100 + 40 + 1000 - 40 + 7
  assert memory.step_memory(type("NoAnalysis", (), {"memory_analysis": lambda self: None})()) is None


def test_check_fits_names_the_fields_only_when_the_step_needs_more(monkeypatch):
  m = memory.StepMemory(arguments=2**30, outputs=0, temporaries=3 * 2**30, aliased=0, code=0)
  monkeypatch.setattr(memory, "device_limit", lambda device=None: (8 * 2**30, "a test device"))
  memory.check_fits("training", m, "batch_size", "50")  # 4 GiB of 8: fits
  monkeypatch.setattr(memory, "device_limit", lambda device=None: (2 * 2**30, "a test device"))
  with pytest.raises(ValueError) as e:
    memory.check_fits("training", m, "batch_size", "50")
  assert str(e.value).startswith("config field batch_size: the training step needs 4.00 GiB per device")
  assert "a test device" in str(e.value) and "now 50" in str(e.value) and "\n" not in str(e.value)
  monkeypatch.setattr(memory, "device_limit", lambda device=None: (None, "unknown"))
  memory.check_fits("training", m, "batch_size", "50")  # an unknown limit refuses nothing


def test_a_cpu_device_limit_is_the_host_memory_shared_by_its_devices():
  import jax
  limit, what = memory.device_limit(jax.devices("cpu")[0])
  host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  n = len(jax.local_devices())
  assert limit == host // n and (f"shared by {n} cpu devices" in what if n > 1 else "host" in what)


@pytest.mark.slow
def test_dry_run_of_the_default_config_prints_the_figures_and_writes_nothing(programs, tmp_path):
  code, out, err = programs.run(["train.py", "--dry_run", f"--workdir={tmp_path / 'run'}"], cwd=tmp_path)
  assert code == 0 and "Traceback" not in err, err[-3000:]
  lines = out.splitlines()
  assert any(l.startswith("model transformer: ") and " parameters; train state " in l for l in lines), out
  step = [l for l in lines if l.startswith("train step: ")]
  assert len(step) == 1 and " GFLOP per step" in step[0] and " per device (arguments " in step[0], out
  assert lines[-1] == "it fits: nothing written (dry run)"
  assert sorted(os.listdir(tmp_path)) == []  # no workdir, no runs/


@pytest.mark.slow
def test_the_api_dry_run_returns_the_figures_and_the_state_is_among_the_arguments():
  report = jaxcap.dry_run("transformer.py:synthetic,tiny", num_train_steps=4, **{"scst.start_step": 2})
  assert set(report["steps"]) == {"train", "scst"}
  for phase in ("train", "scst"):
    s = report["steps"][phase]
    assert s["gflop"] > 0 and s["memory"]["temporaries"] > 0
    # Every device holds the replicated train state as an argument of the step.
    assert s["memory"]["arguments"] >= report["state_bytes"] > 0
  assert report["steps"]["scst"]["gflop"] != report["steps"]["train"]["gflop"]
  assert 20_000 < report["parameters"] < 100_000  # the tiny Transformer


@pytest.mark.parametrize("extra, field", [
    (["--config.batch_size=1048576"], "config field batch_size: the training step needs "),
    (["--config.scst.start_step=0", "--config.scst.num_samples=200000"],
     "config field scst.num_samples / batch_size: the SCST step needs "),
])
@pytest.mark.slow
@pytest.mark.parametrize("dry", [True, False])
def test_a_step_that_does_not_fit_is_one_line_before_anything_is_written(programs, tmp_path, extra, field, dry):
  workdir = tmp_path / "run"
  code, out, err = programs.run(["train.py", _TINY, f"--workdir={workdir}", *extra]
                                + (["--dry_run"] if dry else []), cwd=tmp_path)
  assert code == 2, (code, err[-3000:])
  assert err.startswith("error: " + field) and len(err.strip().splitlines()) == 1, err
  assert "expected a smaller" in err and not workdir.exists()


@pytest.mark.slow
def test_dry_run_of_a_paper_sized_transformer(programs, tmp_path):
  """The ETA paper's Transformer sizes (d=512, 6 + 6 layers, 8 heads, FFN 2048) at batch 50."""
  sizes = ["--config.model.dim=512", "--config.model.num_layers=6", "--config.model.num_dec_layers=6",
           "--config.model.num_heads=8", "--config.model.ff_dim=2048", "--config.batch_size=50"]
  code, out, err = programs.run(["train.py", "--config=configs/transformer.py:synthetic", *sizes,
                                 "--dry_run"], cwd=tmp_path)
  assert code == 0 and "Traceback" not in err, err[-3000:]
  params = int(next(l for l in out.splitlines() if l.startswith("model ")).split(": ")[1].split(" ")[0].replace(",", ""))
  assert params > 40_000_000, out  # 6 + 6 layers of d=512 (the synthetic vocabulary is small)
  assert out.splitlines()[-1] == "it fits: nothing written (dry run)" and sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_dry_run_says_how_many_arrays_fsdp_splits():
  """At tiny sizes fsdp splits no array (each is under sharding.MIN_ELEMENTS): the dry run says
  so rather than leaving a reader to infer it from bytes; at the CPU-sized config it splits some."""
  from jaxcap.training import train_lib  # noqa: PLC0415
  lines = []
  tiny = train_lib.dry_run(jaxcap.get_config("transformer.py:synthetic,tiny", sharding="fsdp"), log=lines.append)
  assert tiny["arrays_split"][0] == 0 < tiny["arrays_split"][1]
  said = [l for l in lines if l.startswith("sharding 'fsdp'")]
  assert len(said) == 1 and f"0 of {tiny['arrays_split'][1]} parameter arrays split" in said[0], lines
  cpu = train_lib.dry_run(jaxcap.get_config("transformer.py:synthetic", sharding="fsdp", batch_size=8),
                          log=lambda *a: None)
  assert 0 < cpu["arrays_split"][0] < cpu["arrays_split"][1]
  assert cpu["params_bytes_per_device"] < cpu["state_bytes"] / 3 / 2  # the split arrays are most of the bytes
