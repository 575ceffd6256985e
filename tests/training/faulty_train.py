"""``train.py`` that SIGKILLs itself at a checkpoint-writing moment (test helper, not a test).

  python tests/training/faulty_train.py MOMENT:STEP train.py-flags...

MOMENT:
  ``during``: every item of the step is written into orbax's temporary directory, which is
    about to be renamed to ``checkpoints/STEP`` (a kill in the middle of the write);
  ``after``: ``checkpoints/STEP`` is complete and renamed, orbax has not yet deleted the
    steps beyond ``keep_checkpoints`` (a kill right after a save).

Only ``checkpoints/`` (latest) saves are matched, not ``best/``.
"""

import os
import runpy
import signal
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _die():
  sys.stdout.flush()
  os.kill(os.getpid(), signal.SIGKILL)


def main():
  moment, step = sys.argv[1].split(":")
  step = int(step)
  import orbax.checkpoint as ocp
  from orbax.checkpoint._src.path import atomicity

  def is_target(path) -> bool:
    path = str(path)
    return os.path.basename(path) == str(step) and os.path.basename(os.path.dirname(path)) == "checkpoints"

  if moment == "during":
    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self, *args, **kwargs):
      if is_target(self._final_path):
        _die()
      return await original(self, *args, **kwargs)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize
  elif moment == "after":
    original = ocp.CheckpointManager._finalize_checkpoint

    def _finalize_checkpoint(self, s):
      out = original(self, s)  # committed (renamed); the older steps are deleted next
      if s == step and is_target(os.path.join(str(self.directory), str(s))):
        assert os.path.isdir(os.path.join(str(self.directory), str(s)))
        _die()
      return out

    ocp.CheckpointManager._finalize_checkpoint = _finalize_checkpoint
  else:
    raise SystemExit(f"unknown moment {moment!r}")
  sys.argv = [os.path.join(_REPO, "train.py")] + sys.argv[2:]
  sys.path.insert(0, _REPO)
  runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
  main()
