"""Node-aware schedules, checked without MPI: the topology, the node-aware ring and the hierarchical
allreduce on every layout, whole, segmented and staged, by the verifier."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringtree.algorithms.hierarchical import hierarchical_allreduce
from ringtree.algorithms.lower import Shape, lower
from ringtree.algorithms.ring import ring_allreduce
from ringtree.schedule import OpKind
from ringtree.schedule.ir import KEPT
from ringtree.schedule.topology import Topology
from ringtree.sim.verify import verify_schedules


def schedules(algorithm, topology, count, segment=0, window=4, staged=False):
    return [lower(Shape(algorithm, topology.nranks, rank, count, segment, window, staged, False,
                        topology=topology)).schedule for rank in range(topology.nranks)]


def test_a_topology_numbers_nodes_by_their_first_rank_and_says_its_shape():
    t = Topology.of(["b", "a", "b", "a", "c"])
    assert t.node_of == (0, 1, 0, 1, 2) and t.nodes == 3 and t.ranks_per_node == (2, 2, 1)
    assert t.ranks_on(1) == (1, 3) and t.node_order == (0, 2, 1, 3, 4)
    assert str(t) == "3 nodes of 2,2,1, ranks interleaved"
    assert str(Topology.parse("2,2")) == "2 nodes × 2" and Topology.parse("3").node_of == (0, 0, 0)
    assert Topology.placed([2, 2], "round-robin").node_of == (0, 1, 0, 1)
    with pytest.raises(ValueError, match="even layout"):
        Topology.placed([2, 1], "round-robin")
    for bad in ("", "2,x", "2,0"):
        with pytest.raises(ValueError, match="ranks per node|at least one rank"):
            Topology.parse(bad)


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(0, 3), min_size=1, max_size=9), data=st.data())
def test_the_node_aware_ring_crosses_each_node_boundary_once(nodes, data):
    t = Topology.of(nodes)
    count = data.draw(st.integers(t.nranks, 200))  # every chunk holds data: every hop is used
    found = schedules("ring", t, count)
    verify_schedules(found)
    hops = {(s.rank, op.peer) for s in found for op in s.ops if op.kind is OpKind.SEND}
    across = {(a, b) for a, b in hops if t.node_of[a] != t.node_of[b]}
    assert len(across) == (t.nodes if t.nodes > 1 else 0)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(nodes=st.lists(st.integers(0, 4), min_size=1, max_size=10), count=st.integers(0, 300),
       segment=st.sampled_from([0, 1, 7, 64]), window=st.integers(1, 4), staged=st.booleans())
def test_the_hierarchical_allreduce_is_an_allreduce_on_every_layout(nodes, count, segment, window, staged):
    t = Topology.of(nodes)
    verify_schedules(schedules("hierarchical", t, count, segment, window, staged), stepwise=not segment)


@pytest.mark.parametrize("nranks, count", [(1, 5), (2, 0), (3, 100), (4, 1 << 20), (8, 61)])
def test_on_one_node_the_hierarchical_allreduce_is_the_ring(nranks, count):
    # which lets the MPI tests on one node leave it out (tests/test_allreduce.py)
    for rank in range(nranks):
        ours = hierarchical_allreduce(nranks, rank, count, Topology.flat(nranks))
        ring = ring_allreduce(nranks, rank, count)
        assert (ours.ops, ours.scratch) == (ring.ops, ring.scratch)


@pytest.mark.parametrize("layout", ["2,2", "4,4", "3,3,3", "2,2,2,2"])
def test_across_nodes_each_rank_sends_only_its_shard_s_share(layout):
    # Every local rank crosses between nodes at once with 1/P of the data: 2(K-1)/K of it by the ring,
    # the whole shard once each way by recursive doubling on 2 nodes.
    t = Topology.parse(layout)
    count, per_node = 1 << 20, t.ranks_per_node[0]
    for s in [hierarchical_allreduce(t.nranks, rank, count, t) for rank in range(t.nranks)]:
        sent = sum(op.src.count for op in s.ops if op.kind is OpKind.SEND and t.node_of[op.peer] != t.node_of[s.rank])
        share = count / per_node * (1 if t.nodes == 2 else 2 * (t.nodes - 1) / t.nodes)
        assert abs(sent - share) <= 2 * t.nodes, (s.rank, sent, share)
        assert not any(name.startswith(KEPT) for name, _ in s.scratch)  # even nodes: scratch is a window


def test_a_rank_alone_on_its_node_takes_every_shard_across():
    t = Topology.parse("2,1")
    count = 1000
    alone = hierarchical_allreduce(3, 2, count, t)
    sent = sum(op.src.count for op in alone.ops if op.kind is OpKind.SEND)
    assert sent == count  # one shard to each of node 0's ranks, by recursive doubling


def test_the_simulator_charges_messages_between_nodes_their_own_costs_and_one_link_each_way():
    from ringtree.sim import simulate
    from ringtree.sim.result import Costs

    costs = Costs(alpha=1e-6, beta=1e-10, gamma=0.0, between_nodes=(1e-4, 1e-8))
    nbytes = 1 << 20
    # two ranks on two nodes: one exchange, at the cost between nodes (both ways at once)
    apart = simulate("recursive_doubling", 2, nbytes, costs, topology=Topology.parse("1,1"))
    assert apart.time == pytest.approx(1e-4 + 1e-8 * nbytes)
    # four ranks, two per node: the two pairs across share their nodes' links, one message at a time
    shared = simulate("recursive_doubling", 4, nbytes, costs._replace(alpha=0.0, beta=0.0),
                      topology=Topology.of([0, 1, 0, 1]))
    assert shared.time == pytest.approx(2 * (1e-4 + 1e-8 * nbytes))
    # on slow links, the hierarchical allreduce (K bytes per link each way) beats the node-aware ring (1.5 K)
    interleaved = Topology.of([0, 1, 0, 1])
    ring = simulate("ring", 4, 16 << 20, costs, segment=256 << 10, topology=interleaved)
    hierarchical = simulate("hierarchical", 4, 16 << 20, costs, segment=256 << 10, topology=interleaved)
    assert ring.time > 1.3 * hierarchical.time
    # on 3 and 4 nodes its shards cross by the ring (1.5 K per link each way, 2 ranks a node) and still
    # beat the node-aware ring (1.75 K): the receives across, waiting on other nodes, have slots of their own
    for layout in ("2,2,2", "2,2,2,2"):
        t = Topology.parse(layout)
        ring, hierarchical = (simulate(name, t.nranks, 16 << 20, costs, segment=256 << 10, topology=t)
                              for name in ("ring", "hierarchical"))
        assert ring.time > 1.05 * hierarchical.time, layout
    with pytest.raises(ValueError, match="between_nodes"):
        simulate("ring", 2, 8, costs._replace(between_nodes=(1.0, -1.0)))


@pytest.mark.slow
@pytest.mark.parametrize("argv,said", [
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "1M", "--layout", "2,1"], "has 3 ranks, not 4"),
    (["simulate", "--algorithm", "ring", "--ranks", "3", "--bytes", "1M", "--layout", "2,1", "--placement",
      "round-robin"], "takes an even layout"),
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "1M", "--alpha-between", "1e-5"], "go together"),
    (["draw", "--algorithm", "hierarchical", "--ranks", "4", "--layout", "2,x"], "not ranks per node"),
])
def test_a_bad_layout_is_a_usage_error(argv, said):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "ringtree", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


def test_draw_groups_the_lanes_by_node(tmp_path):
    from ringtree.commands.draw import draw
    out = tmp_path / "h.svg"
    draw("hierarchical", 4, 16, str(out), topology=Topology.of([0, 1, 0, 1]))
    svg = out.read_text()
    assert "node 0" in svg and "node 1" in svg and svg.index("rank 2") < svg.index("rank 1")


def test_a_link_with_a_token_bucket_lets_a_burst_through_after_it_idles():
    from ringtree.sim.events import _Links
    from ringtree.sim.result import Costs

    costs = Costs(alpha=0.0, beta=1e-9, gamma=0.0, between_nodes=(0.0, 1e-8), link_burst=1000)
    links = _Links(costs, (0, 1), 2)
    assert links.duration(0, 1, 1000, 0.0) == pytest.approx(1e-5)  # back to back: the bucket is empty
    assert links.duration(0, 1, 1000, 1.0) == pytest.approx(1e-6)  # after a second idle: a full bucket
    assert links.duration(0, 1, 3000, 1.0) == pytest.approx(3e-5)  # at once again: empty
    assert _Links(costs._replace(link_burst=None), (0, 1), 2).duration(0, 1, 1000, 5.0) == pytest.approx(1e-5)
