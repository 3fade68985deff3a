"""``tools/heartbeat.py``, which ``make install`` runs pip through: every line of the command comes
through as it is printed, a silence longer than ``--every`` gets a ``... still`` line, and the exit
status is the command's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEARTBEAT = Path(__file__).resolve().parents[3] / "tools" / "heartbeat.py"
#: a command that says one line, is silent for 2.5 s, says another and exits 3
QUIET_THEN_FAIL = "import sys, time; print('first', flush=True); time.sleep(2.5); print('second'); sys.exit(3)"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HEARTBEAT), *args], capture_output=True, text=True, timeout=60)


def test_a_silence_gets_a_heartbeat_line_between_the_commands_own_lines():
    done = _run("--every", "0.5", "--label", "working", "--", sys.executable, "-c", QUIET_THEN_FAIL)
    lines = done.stdout.splitlines()
    own = [line for line in lines if not line.startswith("  ... still working (")]
    assert own == ["first", "second"], lines  # (a slow start of the command may get a beat before "first")
    between = lines[lines.index("first") + 1 : lines.index("second")]
    assert len(between) >= 2 and all(line.startswith("  ... still working (") for line in between), lines


def test_the_exit_status_is_the_commands():
    assert _run("--every", "5", "--", sys.executable, "-c", QUIET_THEN_FAIL).returncode == 3
    assert _run("--", sys.executable, "-c", "print('ok')").returncode == 0


def test_a_chatty_command_gets_no_heartbeat():
    chatty = "import time\nfor i in range(8):\n    print(i, flush=True); time.sleep(0.2)"
    done = _run("--every", "1", "--", sys.executable, "-c", chatty)
    assert done.stdout.splitlines() == [str(i) for i in range(8)], done.stdout


def test_no_command_is_refused_saying_what_to_give():
    done = _run("--every", "1")
    assert done.returncode == 2 and "give the command to run after --" in done.stderr
