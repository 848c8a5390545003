"""Cost of the topology layer: one collective query, placing every group of a 100,000-GPU job,
building flows for a representative group. Prints figures (no assertions); run with
``python benchmarks/bench_collectives.py``.
"""

from __future__ import annotations

import time

import numpy  # noqa: F401 - imported up front so timings exclude its one-off import

from topologies import collectives, layout, placement
from topologies.flows import collective_flows
from topologies.hardware import load_system
from topologies.placement import GROUP_KINDS, place_job


def _per_call_us(fn, repeat: int) -> float:  # noqa: ANN001
    t = time.perf_counter()
    for i in range(repeat):
        fn(i)
    return (time.perf_counter() - t) / repeat * 1e6


def _clear() -> None:
    collectives.clear_cost_cache()
    layout.fabric_layout.cache_clear()
    placement._shape.cache_clear()


def main() -> None:
    system = load_system("gb300-nvl72")
    p = place_job(system, 1440, tp=8, pp=4, ep=8)
    shapes = [p.shape(k) for k in ("tp", "dp", "ep", "pp", "world")]
    ops = collectives.OPS

    _clear()
    cold = _per_call_us(lambda i: collectives.collective_time_s(ops[i % 7], 1e6 + i, shapes[i % 5], system), 20000)
    warm = _per_call_us(lambda i: collectives.collective_time_s(ops[i % 7], 1e6 + i % 100, shapes[i % 5], system), 200000)
    print(f"collective query, uncached (all eligible algorithms evaluated): {cold:.1f} us")
    print(f"collective query, cached (repeated op/size/shape):            {warm:.2f} us")
    print(f"  -> {1e6 / cold:,.0f} uncached or {1e6 / warm:,.0f} cached queries per second")

    for gpus, kw in ((100_000, dict(tp=8, pp=4, ep=8)), (99_936, dict(tp=8, pp=4, ep=8))):
        _clear()
        t = time.perf_counter()
        pl = place_job(system, gpus, **kw)
        shapes_all = {k: pl.shape(k) for k in GROUP_KINDS}
        t_shapes = time.perf_counter() - t
        t = time.perf_counter()
        one = {k: pl.group_gpus(k, pl.group_count(k) - 1) for k in GROUP_KINDS}
        t_one = time.perf_counter() - t
        t = time.perf_counter()
        n_lists = sum(len(pl.all_groups(k)) for k in ("tp", "ep", "pp"))
        t_lists = time.perf_counter() - t
        print(f"placing {gpus:,} GPUs ({pl.gpus_per_domain} per rack, {pl.domains} racks, {pl.layout.tiers} tiers):")
        print(f"  every group kind's shape (arithmetic):  {t_shapes * 1e3:.2f} ms  "
              f"(dp: {shapes_all['dp'].size} ranks over {shapes_all['dp'].domains} racks)")
        print(f"  one group of each kind as GPU lists:    {t_one * 1e3:.2f} ms  ({sum(map(len, one.values())):,} ids)")
        print(f"  all tp, ep, pp groups as GPU lists:     {t_lists * 1e3:.0f} ms  ({n_lists:,} groups)")

    for kind, op in (("dp", "reduce_scatter"), ("ep", "all_to_all")):
        big = place_job(system, 4608, tp=8, pp=4, ep=64)
        gpus = big.group_gpus(kind, 0)
        t = time.perf_counter()
        fs = collective_flows(op, 1e9, gpus, big.layout, system, shape=big.shape(kind))
        print(f"flows of one {kind} {op} on 4,608 GPUs ({len(gpus)} ranks): {(time.perf_counter() - t) * 1e3:.1f} ms, "
              f"{len(fs.flows)} flows, {len(fs.capacities_Bps)} edges")


if __name__ == "__main__":
    main()
