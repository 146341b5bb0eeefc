"""The CI gate of a push re-measures a regression before it fails the job (issue 39)."""
import re
from pathlib import Path

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "benchmark.yml"


def test_the_push_gate_confirms_by_measurement_before_it_fails():
    text = WORKFLOW.read_text()
    push = text[text.index("\n  benchmark:"):text.index("\n  pull-request:")]
    (command,) = re.findall(r"kcollect compare .*", push)
    assert '"${BENCH_SHA}~1" "$BENCH_SHA"' in command and "--confirm" in command.split(">")[0]
    assert re.search(r'exit "\$rc"', push[push.index(command):])  # its verdict is the job's
