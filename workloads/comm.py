"""The collective record shared by the cost model's optimizer plan and the reference backend.

Both sides describe every collective the same way so that tests can compare the lists exactly.
``bytes`` follows the nccl-tests "size" convention: the buffer for all-reduce and broadcast, the
full gathered (or pre-scattered) array for all-gather and reduce-scatter (count × group size ×
element size), the total gathered array for a variable-size all-gather, and the whole per-rank
send buffer for all-to-all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

CollectiveOp = Literal["all_reduce", "reduce_scatter", "all_gather", "all_gather_v", "broadcast", "all_to_all", "send_recv"]
GroupKind = Literal["dp", "expert_dp", "tp", "etp", "cp", "ep", "etp_ep", "pp", "embd", "world",
                    "dp_instance", "dp_across", "expert_dp_instance", "expert_dp_across"]
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True, order=True)
class CollectiveCall:
    """One kind of collective issued ``count`` times per optimizer step by one rank."""

    op: CollectiveOp
    group: GroupKind
    group_size: int
    dtype: str
    bytes: int
    count: int = 1
    phase: str = ""  # e.g. grad_reduce, param_gather, ns_norm, ns_gram, ns_gather

    def key(self) -> tuple[str, str, int, str, int, str]:
        """Identity without the count (used to merge identical calls)."""
        return (self.op, self.group, self.group_size, self.dtype, self.bytes, self.phase)

    def to_dict(self) -> dict[str, object]:
        """Plain dict of the fields (``bytes`` per call, ``count`` calls per step) for JSON."""
        return asdict(self)


def merge_calls(calls: Iterable[CollectiveCall]) -> list[CollectiveCall]:
    """Merge identical calls by summing counts; the result is sorted (canonical for comparison).

    Calls on groups of size 1 are dropped: a collective over one rank moves nothing, and Megatron
    and the reference both skip it.
    """
    counts: Counter[tuple[str, str, int, str, int, str]] = Counter()
    for c in calls:
        if c.group_size > 1:
            counts[c.key()] += c.count
    return sorted(
        CollectiveCall(op=k[0], group=k[1], group_size=k[2], dtype=k[3], bytes=k[4], count=n, phase=k[5])  # type: ignore[arg-type]
        for k, n in counts.items()
    )
