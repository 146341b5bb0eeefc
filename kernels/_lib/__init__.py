"""What several ops share: launch shapes, device queries and residency, coop rows, L2 prefetch,
online log-sum-exp. Ops import the names from here (one place, like Liger's ops/utils.py)."""
from .coop import (MAX_SPINS, coop_plan, coop_program, last_to_arrive, publish, publish2, wait_slots2, wait_total,
                   wait_total2)
from .device import first_fit, l2_bytes, on_sm90, resident_programs, shared_bytes, shared_limit, sm_count
from .launch import (LINES_CHUNK_BYTES, LINES_CHUNK_BYTES_WIDE, LINES_NARROW_ROW_BYTES, LINES_PROGRAMS_PER_SM,
                     LINES_PROGRAMS_PER_SM_WIDE, MAX_FUSED_SIZE, ElementwiseConfig, elementwise_config, launch_elementwise, lines_launch,
                     row_settings)
from .config import arch, config_record, forced, tunable
from .lse import LOG2E, lse2_combine, lse_update
from .prefetch import l2_prefetch_ok, prefetch_ahead, prefetch_chunk, prefetch_l2, prefetch_rows, prefetch_segment
from .widen import widen, widen_asm

__all__ = [n for n in dir() if not n.startswith("_")]
