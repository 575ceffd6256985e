"""XLA's slow-operation alarms are dropped from the CPU console, everything else is kept.

The alarm texts below are XLA's (xla/service/slow_operation_alarm.cc and
hlo_constant_folding.cc) as this jaxlib prints them. The subprocess test writes them to file
descriptor 2 as XLA's C++ logging does, and checks what reaches the real stderr.

Mutants tried: ending a skipped block at the first ``****`` separator (the slow-compile
message leaks) fails ``test_filter_drops_alarm_records_only``; not pointing ``sys.stderr`` at
the original stream (a Python write without a newline, like a progress bar's, is held back
until exit) fails ``test_install_filters_fd2_and_keeps_python_stderr_live``.
"""

import os
import subprocess
import sys
import textwrap

from jaxcap import xla_logs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SLOW_COMPILE = (
    "E1123 18:40:01.123456   4242 slow_operation_alarm.cc:73] \n"
    "********************************\n"
    "[Compiling module jit_run] Very slow compile? If you want to file a bug, run with envvar "
    "XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n"
    "********************************\n")
TOOK = (
    "E1123 18:42:11.000001   4242 slow_operation_alarm.cc:140] The operation took 2m10.5s\n"
    "\n"
    "********************************\n"
    "[Compiling module jit_run] Very slow compile? If you want to file a bug, run with envvar "
    "XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n"
    "********************************\n")
CONSTANT_FOLDING = (
    "E1123 18:43:00.5   4242 slow_operation_alarm.cc:73] Constant folding an instruction is "
    "taking > 1s:\n"
    "\n"
    "  %convert.5 = bf16[1024,1024]{1,0} convert(f32[1024,1024]{1,0} %constant.3)\n"
    "\n"
    "This isn't necessarily a bug; constant-folding is inherently a trade-off between "
    "compilation time and speed at runtime.\n"
    "\n"
    "If you'd like to file a bug, run with envvar XLA_FLAGS=--xla_dump_to=/tmp/foo and attach "
    "the results.\n")
OTHER = "W1123 18:44:00.000000   4242 cpu_client.cc:12] something else worth seeing\n"


def test_filter_drops_alarm_records_only():
  text = ("before\n" + SLOW_COMPILE + "between\n" + TOOK + OTHER + CONSTANT_FOLDING
          + "after ****\n" + CONSTANT_FOLDING + OTHER)
  assert xla_logs.filter_text(text) == "before\nbetween\n" + OTHER + "after ****\n" + OTHER


def test_a_new_log_record_ends_an_unrecognised_block():
  text = "E1123 18:00:00.1 1 slow_operation_alarm.cc:9] something new\ndetail\n" + OTHER
  assert xla_logs.filter_text(text) == OTHER


def test_install_filters_fd2_and_keeps_python_stderr_live():
  script = textwrap.dedent(f"""
      import os, sys, time
      sys.path.insert(0, {REPO!r})
      from jaxcap import xla_logs
      assert xla_logs.install(force=True)
      sys.stderr.write("bar 1/2\\r")  # no newline: must not wait for one
      sys.stderr.flush()
      time.sleep(1.0)
      os.write(2, {(SLOW_COMPILE + OTHER + CONSTANT_FOLDING).encode()!r})
      print("python line", file=sys.stderr)
  """)
  proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE,
                          cwd=REPO)
  first = os.read(proc.stderr.fileno(), 100)  # arrives while the child sleeps
  rest = proc.stderr.read()
  assert proc.wait(timeout=60) == 0, rest
  assert first == b"bar 1/2\r"
  out = rest.decode()
  assert OTHER in out and "python line" in out
  assert "slow compile" not in out.lower() and "Constant folding" not in out
