"""The float64 references the collector gates every provider on, as the collector computes them."""
import collections

import pytest
import torch

from kcollect import verify
from kcollect.registry import load

REGISTRY = load(plugins=False)
STEPPED = [n for n in REGISTRY.names() if "T" in REGISTRY.get(n).grid("quick")[0].dims]


def _indexing_nodes(outputs) -> collections.Counter:
    """How many autograd nodes of the outputs' graph take one index of a tensor (x[:, t]): each one's
    backward writes its gradient into zeros of the whole tensor."""
    seen, todo, count = set(), [o.grad_fn for o in outputs if torch.is_tensor(o)], collections.Counter()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ in ("SelectBackward0", "IndexBackward0"):
            count[type(node).__name__] += 1
        todo.extend(f for f, _ in node.next_functions)
    return count


@pytest.mark.parametrize("name", STEPPED)
def test_a_references_backward_grows_linearly_with_the_steps(name):
    # a step loop that indexes its inputs step by step (x[:, t]) has a backward quadratic in T: at
    # T 4096 the RTU's took 73 s on the CPU, against 0.6 s for the same loop over x.unbind(1)
    spec = REGISTRY.get(name)
    dims = dict(spec.grid("quick")[0].dims)

    def graph(steps: int) -> collections.Counter:
        inputs = verify.upcast(spec.make_inputs({**dims, "T": steps}, spec.dtypes[0], "cpu", 0))
        for n in spec.grad_inputs:
            inputs[n].requires_grad_(True)
        return _indexing_nodes(verify.as_tuple(spec.reference(**inputs)))

    assert graph(dims["T"]) == graph(2 * dims["T"])
