"""Tests run on the CPU through Triton's interpreter; it must be switched on before any Triton
kernel is defined, i.e. before the kernel package is imported.

Random draws come from one seed: KCOLLECT_TEST_SEED (a fresh one each session unless set; the
header prints it, as does every failure). Each test's Python and torch generators are seeded from
it and the test's id, so `KCOLLECT_TEST_SEED=S pytest 'tests/x.py::test_y'` draws again what the
failing run drew (draws at a module's import come from the session's seed alone).

Markers: `network` (reaches the internet), `e2e` (whole `kcollect` processes end to end) and
`browser` (a real Chromium). The README's test command runs them all; a quick local run can leave
them out: `pytest -m "not network and not e2e and not browser"`."""
import hashlib
import os
import random

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

SEED_VAR = "KCOLLECT_TEST_SEED"


def pytest_configure(config):
    # set here, before xdist starts its workers, so that every worker draws from the same seed
    os.environ.setdefault(SEED_VAR, str(random.SystemRandom().randrange(2**31)))
    random.seed(session_seed())
    torch.manual_seed(session_seed())


def session_seed() -> int:
    return int(os.environ[SEED_VAR])


def seed_of(nodeid: str) -> int:
    """A test's seed: from the session's and its id, so that it is the same when run alone."""
    return int(hashlib.sha256(f"{session_seed()}:{nodeid}".encode()).hexdigest()[:8], 16) % 2**31


def pytest_report_header(config):
    return f"random draws: {SEED_VAR}={session_seed()}"


@pytest.fixture(autouse=True)
def seeded(request) -> int:
    """This test's seed, with which `random` and torch's default generator are seeded."""
    s = seed_of(request.node.nodeid)
    random.seed(s)
    torch.manual_seed(s)
    return s


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("seed", f"seed {seed_of(item.nodeid)}; to draw the same again: "
                                        f"{SEED_VAR}={session_seed()} pytest '{item.nodeid}'"))
