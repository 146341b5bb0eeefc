"""RoPE's tuned config: the tile of the one kernel (warps, heads per thread, tokens per program)
and its cache hints, and the heuristic that picks it."""
from __future__ import annotations

from dataclasses import dataclass

from .._host.config import tunable

POLICIES = ("", "evict_first", "evict_last")
LAYOUTS = ("heads", "flat")


def _is_pow2(n) -> bool:
    return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


@dataclass(frozen=True)
class RoPEConfig:
    """warps: per program. max_heads: most heads of q (of k) a thread rotates, each from its own
    16-byte loads, with cos/sin loaded once for all of them: the largest power of two <= max_heads
    dividing the head count is used, so no lane is spent on padded heads. tokens: per program (a
    power of two); None: as many as the program's threads cover with one 16-byte vector each of
    the (padded) half of head_dim. policy / cs_policy: cache hints of the q/k and the cos/sin
    loads ("", "evict_first", "evict_last"). layout: "heads", the [tokens, heads, half] tiles above;
    "flat", programs of warps x 32 x `slots` slots walking q (then k) in memory order, a slot one
    16-byte vector of a head's first half and its partner in the second (no padding of the half;
    cos/sin loaded per slot, from L1 after the first head); max_heads and tokens unused there."""

    warps: int = 4
    max_heads: int = 2
    tokens: int | None = None
    policy: str = ""
    cs_policy: str = "evict_last"
    layout: str = "heads"
    slots: int = 1

    def __post_init__(self):
        if not (_is_pow2(self.warps) and _is_pow2(self.max_heads) and (self.tokens is None or _is_pow2(self.tokens))):
            raise ValueError(f"warps, max_heads and tokens must be powers of two, got {self.warps}, "
                             f"{self.max_heads}, {self.tokens}")
        if self.layout not in LAYOUTS or not _is_pow2(self.slots):
            raise ValueError(f"layout must be one of {LAYOUTS} and slots a power of two, got {self.layout!r}, "
                             f"{self.slots}")
        if self.policy not in POLICIES or self.cs_policy not in POLICIES:
            raise ValueError(f"policy and cs_policy must be one of {POLICIES}, got {self.policy!r}, {self.cs_policy!r}")


# Measured on the H200 (bf16, % of copy), the same choices for every architecture so far:
# - 2 heads per thread rather than 4: 1.00-1.03x at every full-grid shape where they differ (e.g.
#   2x64x8x8192x128 fwd 95.6% -> 96.8%), except head_dim 256 (4x8x1x4096x256 fwd 0.98x), where a
#   program's threads cover only 8 tokens: there 4 heads stay.
# - cos/sin hinted evict_last (re-read by every head block of a token block): 1.02-1.11x at every
#   shape but one (1x28x4x32768x128 fwd, 0.999x); e.g. 2x64x8x8192x128 fwd 92% -> 95% of copy.
# - 4 warps; 8 warps for head_dim 80 (a padded half) won 3-5% in some runs and lost 1-2% in
#   others; q/k cache hints and tiles without padding (chunks of the half) won less or lost.
# - the flat layout (4 warps, a slot a thread) where the half of head_dim is not a power of two (the
#   heads layout pads it) or head_dim is 64 or less: lab.ab forward, interleaved, 1c60bb2
#   (lab/results/rope_flat_h200.txt): head_dim 80 0.957x the heads layout's time (Liger 0.956x),
#   64 0.983x (Liger 0.985x); at 128 it lost at 3 of 5 shapes (up to 1.09x), at 256 1.02x. H200 only.
WIDE_HEAD = 256
FLAT_UPTO = 64


@tunable
def pick(head_dim: int, device=None) -> RoPEConfig:
    """The config for a head_dim on the device's architecture (one set of choices for all so far)."""
    half = head_dim // 2
    if head_dim <= FLAT_UPTO or half & (half - 1):
        return RoPEConfig(layout="flat")
    return RoPEConfig(max_heads=4 if head_dim >= WIDE_HEAD else 2)
