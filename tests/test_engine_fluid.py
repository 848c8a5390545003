"""The fluid flow model on its own: max-min fair sharing, re-planning on arrivals and departures."""

from __future__ import annotations

import pytest
import simpy

from costmodel.des.fluid import Flow, FluidNetwork, max_min_rates


def _finish_times(specs, contention=True, capacity=None):
    """Start flows (start_s, volume, resources, latency) and return their completion times."""
    env = simpy.Environment()
    net = FluidNetwork(env, capacity=capacity, contention=contention)
    done: dict[int, float] = {}

    def start(i, t0, vol, res, lat):
        yield env.timeout(t0)
        yield net.transfer(vol, res, lat)
        done[i] = env.now

    for i, spec in enumerate(specs):
        env.process(start(i, *spec))
    env.run()
    return [done[i] for i in range(len(specs))]


def test_single_flow_takes_its_volume_plus_latency() -> None:
    assert _finish_times([(0.0, 2.0, ("a",), 0.5)]) == [pytest.approx(2.5)]


def test_two_flows_on_one_link_share_it_fairly() -> None:
    assert _finish_times([(0.0, 1.0, ("a",), 0.0), (0.0, 1.0, ("a",), 0.0)]) == [pytest.approx(2.0)] * 2


def test_rates_are_replanned_when_flows_start_and_end() -> None:
    # flow 0 alone for 1 s (1 of 3 done), then both share: flow 1 (1.0) ends at 3.0, flow 0 alone again
    t = _finish_times([(0.0, 3.0, ("a",), 0.0), (1.0, 1.0, ("a",), 0.0)])
    assert t[1] == pytest.approx(3.0)
    assert t[0] == pytest.approx(4.0)


def test_max_min_fairness_gives_leftover_to_unconstrained_flows() -> None:
    # classic example: a and b share link x (cap 1); b and c share link y (cap 2)
    env = simpy.Environment()
    flows = [Flow(1.0, ("x",), env.event()), Flow(1.0, ("x", "y"), env.event()), Flow(1.0, ("y",), env.event())]
    rates = max_min_rates(flows, {"x": 1.0, "y": 2.0})
    assert rates[flows[0]] == pytest.approx(0.5)
    assert rates[flows[1]] == pytest.approx(0.5)
    assert rates[flows[2]] == pytest.approx(1.5)


def test_without_contention_flows_do_not_slow_each_other() -> None:
    t = _finish_times([(0.0, 1.0, ("a",), 0.0), (0.0, 1.0, ("a",), 0.0)], contention=False)
    assert t == [pytest.approx(1.0)] * 2


def test_flows_on_disjoint_links_run_at_full_rate() -> None:
    t = _finish_times([(0.0, 1.0, ("a",), 0.0), (0.0, 2.0, ("b",), 0.0)], capacity={"a": 1.0, "b": 2.0})
    assert t == [pytest.approx(1.0), pytest.approx(1.0)]
