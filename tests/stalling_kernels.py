"""A kernel whose build never ends in the precompile pass's processes (`--kernel-module`,
tests/test_precompile.py): `sticky` on the 3-row shape leaves a file named by its process id in
$KCOLLECT_TEST_STUCK, then sleeps for ever; in a measuring process it is right at once. With
$KCOLLECT_TEST_HOLD_KILL set, the run's own process does not deliver its SIGKILL to a process that
left such a file: a process inside the GPU driver goes only when the driver lets it, which the
CPU cannot reproduce (its SIGTERM still ends it, so that nothing outlives the test); and the pass's
watchdog reads, for such a process, a clock a day ahead from a second after it stuck (as
test_collect's watchdog clocks do), so that its hang is found at once whatever --measure-timeout.
$KCOLLECT_TEST_TAIL_MIN sets the pass's TAIL_MIN_S (the floor of a build's limit once every case has
begun) in the run's own process."""
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by path, from a fresh process

from planted_kernels import _SHAPES, _p, _spec  # noqa: E402

from kcollect.spec import Provider  # noqa: E402

STUCK = "KCOLLECT_TEST_STUCK"


def _sticky(x):
    if x.shape[0] == 3 and multiprocessing.current_process().name.startswith("kcollect-pre"):
        Path(os.environ[STUCK], str(os.getpid())).touch()
        while True:
            time.sleep(60)
    return x * 2.0


def _stuck_for(pid) -> float:
    mark = Path(os.environ[STUCK], str(pid))
    return time.time() - mark.stat().st_mtime if mark.exists() else 0.0


def _hold_kill() -> None:
    from kcollect import precompile

    kill, late = multiprocessing.process.BaseProcess.kill, precompile.late

    def held(self):
        if not _stuck_for(self.pid):
            kill(self)

    multiprocessing.process.BaseProcess.kill = held
    precompile.late = lambda slot, now, limit: late(slot, now + 86400.0 * (_stuck_for(slot["proc"].pid) >= 1), limit)
    precompile.REAP_S = 1.0  # the wait for a killed process at the pass's end: no need for all of it here


if os.environ.get("KCOLLECT_TEST_HOLD_KILL") and multiprocessing.current_process().name == "MainProcess":
    _hold_kill()
if os.environ.get("KCOLLECT_TEST_TAIL_MIN") and multiprocessing.current_process().name == "MainProcess":
    from kcollect import precompile as _precompile

    _precompile.TAIL_MIN_S = float(os.environ["KCOLLECT_TEST_TAIL_MIN"])  # the tail's floor: seconds, not minutes

SPECS = (_spec("stall", (_p("torch", lambda x: x * 2.0), Provider("sticky", _sticky)), _SHAPES[:2]),)
