"""The set-up: what scripts/setup.sh installs on each kind of machine (run against a stub Python,
so no network is needed), that the pinned sets agree with pyproject.toml, and, where PyPI can be
reached, that pip resolves them against plain PyPI (no local wheels, no configuration)."""
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import pypi  # noqa: E402

CPU = ROOT / "requirements" / "cpu.txt"
GPU = ROOT / "requirements" / "gpu.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# -- scripts/setup.sh, against a stub .venv/bin/python that logs its arguments -----------------

STUB = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$LOG"
if [ "$1" = "-" ]; then exit "${REACHABLE_RC:-0}"; fi   # the reachability probe reads a script on stdin
exit 0
"""


APT = """#!/usr/bin/env bash
printf 'apt-get %s\\n' "$*" >> "$LOG"
"""


def run_setup(tmp_path, gpu=False, chromium=True, root=False, **env):
    """setup.sh in a copy of the repository layout; returns (the stub's calls, stderr). Without
    `chromium` on PATH there is an apt-get stub (logged like the Python's), and `id -u` says 0 when
    `root`."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    bins = tmp_path / "bin"
    bins.mkdir()
    stubs = [(".venv/bin/python", STUB)] + ([("bin/chromium", "#!/bin/sh\n")] if chromium else
                                            [("bin/apt-get", APT), ("bin/id", f"#!/bin/sh\necho {0 if root else 1000}\n")])
    for name, body in stubs + ([("bin/nvidia-smi", "#!/bin/sh\n")] if gpu else []):
        path = (repo if name.startswith(".venv") else tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        path.chmod(0o755)
    log = tmp_path / "calls.log"
    # only the stubs and the basic tools on PATH: this machine's own nvidia-smi must not count
    basic = tmp_path / "basic"
    basic.mkdir()
    for tool in ("bash", "dirname", "id", "printf", "cat", "env"):
        found = shutil.which(tool)
        if found:
            (basic / tool).symlink_to(found)
    out = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{bins}:{basic}", "LOG": str(log), "HOME": str(tmp_path), **env})
    assert out.returncode == 0, out.stderr
    return log.read_text().splitlines(), out.stderr


PIP = "-m pip install -q --disable-pip-version-check"


def test_without_a_gpu_torch_comes_from_the_cpu_index_with_the_pins(tmp_path):
    calls, err = run_setup(tmp_path)
    assert calls[0] == f"- {CPU_INDEX}"  # the probe
    assert calls[1] == f"{PIP} -c requirements/cpu.txt --index-url {CPU_INDEX} torch"
    assert calls[2] == f"{PIP} -c requirements/cpu.txt -e .[test]"  # Triton's pin holds here
    assert len(calls) == 4 and calls[3].startswith("-c ") and err == ""


def test_without_a_gpu_and_no_cpu_index_torch_comes_from_pips_own_index(tmp_path):
    calls, err = run_setup(tmp_path, REACHABLE_RC="1")
    assert calls[1] == f"{PIP} -c requirements/cpu.txt torch"
    assert calls[2] == f"{PIP} -c requirements/cpu.txt -e .[test]"
    # said before the download: what comes instead of the CPU build, and how to avoid it
    assert f"{CPU_INDEX} is unreachable" in err
    assert "torch's CUDA build with its CUDA libraries" in err and "several GB" in err
    assert "TORCH_INDEX=URL" in err and "requirements/cpu.txt into .venv first" in err


def test_chromium_is_installed_only_when_asked(tmp_path):
    calls, err = run_setup(tmp_path / "a", chromium=False, root=True)
    assert not any(c.startswith("apt-get") for c in calls)
    assert "no chromium: the browser tests will be skipped (KCOLLECT_BROWSER=1 installs it" in err
    calls, err = run_setup(tmp_path / "b", chromium=False, root=True, KCOLLECT_BROWSER="1")
    assert [c for c in calls if c.startswith("apt-get")] == ["apt-get update -qq", "apt-get install -y -qq chromium"]
    assert "installing chromium with apt-get" in err
    calls, err = run_setup(tmp_path / "c", chromium=False, root=False, KCOLLECT_BROWSER="1")
    assert not any(c.startswith("apt-get") for c in calls) and "install it yourself" in err


def test_ci_asks_for_the_browser_and_has_it():
    # CI must run the browser tests, which skip themselves without chromium: .ci/run asks for it,
    # and under it (KCOLLECT_BROWSER=1 in the environment) a missing chromium is a failure here
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^export KCOLLECT_BROWSER=1$", ci, re.M)
    assert ci.index("KCOLLECT_BROWSER=1") < ci.index("bash scripts/setup.sh")
    if os.environ.get("KCOLLECT_BROWSER") == "1":
        assert shutil.which("chromium") or shutil.which("chromium-browser"), "KCOLLECT_BROWSER=1, no chromium on PATH"


def test_torch_index_can_be_chosen_or_skipped(tmp_path):
    calls, _ = run_setup(tmp_path / "a", TORCH_INDEX="https://mirror.example/cpu")
    assert calls[1].endswith("--index-url https://mirror.example/cpu torch")
    calls, err = run_setup(tmp_path / "b", TORCH_INDEX="")
    assert calls[0] == f"{PIP} -c requirements/cpu.txt torch" and err == ""  # no probe, no warning


def test_with_a_gpu_the_installed_torch_and_triton_stay(tmp_path):
    calls, _ = run_setup(tmp_path, gpu=True)
    assert calls[0] == f"{PIP} -e .[test]" and not any("torch" in c or "requirements" in c for c in calls[:1])
    assert len(calls) == 2


# -- the pinned sets agree with the project -----------------------------------------------------

def _admits(requirements: list[str], pins: dict[str, str], extra: str = "") -> None:
    env = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "extra": extra}
    for text in requirements:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate(env):
            continue
        name = pypi.normalise(req.name)
        assert name in pins, f"{text}: {name} is not pinned"
        assert req.specifier.contains(pins[name], prereleases=True), f"{text}: pinned at {pins[name]}"


def test_cpu_pins_are_exact_and_within_the_projects_ranges():
    pins = pypi.pins(CPU)
    assert set(pins) == {"torch", "triton"}
    _admits(["torch>=2.5", "triton>=3.2"], pins)
    _admits([r for r in pypi.project_requirements() if Requirement(r).name in ("torch", "triton")], pins)


def test_gpu_lock_pins_every_requirement_of_the_project_and_its_choices():
    pins = pypi.pins(GPU)
    lines = [ln for ln in GPU.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == len(pins) and all("==" in ln for ln in lines)  # every line an exact pin
    _admits(pypi.project_requirements("peers"), pins)
    choices = [ln for ln in (ROOT / "requirements" / "gpu.in").read_text().splitlines() if "==" in ln]
    _admits(choices, pins)


# -- against plain PyPI (network) --------------------------------------------------------------

def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15)
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def pypi_online():
    if not reachable(pypi.INDEX + "/pip/"):
        pytest.skip("pypi.org cannot be reached from here: the set-up's resolution against plain PyPI is not checked")


@pytest.mark.network
def test_the_setup_resolves_against_plain_pypi(pypi_online):
    # What setup.sh asks for, on plain PyPI, where torch==X is the CUDA build: its own Triton pin
    # must be requirements/cpu.txt's (a different one ends in ResolutionImpossible).
    pins = pypi.pins(CPU)
    found = pypi.dry_run(["torch", "triton", *pypi.project_requirements("test")], "-c", str(CPU))
    versions = pypi.versions(found)
    assert versions["torch"] == pins["torch"] and versions["triton"] == pins["triton"]
    torch_meta = next(i["metadata"] for i in found if pypi.normalise(i["metadata"]["name"]) == "torch")
    wants = [Requirement(r) for r in torch_meta.get("requires_dist", []) if r.startswith("triton")]
    assert wants and all(w.specifier.contains(pins["triton"]) for w in wants), wants
    assert all("files.pythonhosted.org" in i["download_info"]["url"] for i in found)  # nothing local


@pytest.mark.network
def test_the_gpu_lock_is_consistent_on_plain_pypi(pypi_online):
    # What torch, Triton and the peer require (Linux, Python 3.12), the lock meets: torch's exact
    # Triton and CUDA library pins above all. The lock itself comes from pip's resolver
    # (scripts/lock_gpu.py); this catches a hand edit of one pin without the others.
    pins = pypi.pins(GPU)
    chosen = ["torch", "triton", "liger-kernel"]
    found = pypi.dry_run([f"{n}=={pins[n]}" for n in chosen], "--no-deps", python_version="3.12")
    assert pypi.versions(found) == {n: pins[n] for n in chosen}
    env = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
    for item in found:
        meta = item["metadata"]
        for text in meta.get("requires_dist", []):
            req = Requirement(text)
            if req.marker and not req.marker.evaluate(env):
                continue
            name = pypi.normalise(req.name)
            assert name in pins, f"{meta['name']} needs {text}, which the lock leaves out"
            assert SpecifierSet(str(req.specifier)).contains(pins[name], prereleases=True), \
                f"{meta['name']} needs {text}; the lock has {pins[name]}"


@pytest.mark.network
def test_the_cpu_index_serves_the_pinned_torch():
    if not reachable(CPU_INDEX + "/torch/"):
        pytest.skip(f"{CPU_INDEX} cannot be reached from here: setup.sh falls back to pip's own index")
    found = pypi.dry_run(["torch"], "-c", str(CPU), "--no-deps", index=CPU_INDEX)
    version = pypi.versions(found)["torch"]
    assert version == pypi.pins(CPU)["torch"] + "+cpu", version
