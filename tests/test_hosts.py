"""Across emulated hosts (scripts/cluster): ringtree learns the node map, and every algorithm of every
collective gives MPI's own result there. Skipped unless scripts/cluster runs it:

    scripts/cluster --layout 2,2 --placement round-robin -- python -m mpi4py -m pytest -m mpi tests/test_hosts.py
"""

import os

import numpy as np
import pytest
from mpi4py import MPI
from test_collectives import failures_on
from test_pipeline import receives_ahead

import ringtree
from conftest import assert_everywhere, ipc_failures, same_on_all_ranks
from ringtree import settings
from ringtree.algorithms import ALGORITHMS, GENERATORS
from ringtree.runtime.engine.in_flight import IN_FLIGHT
from ringtree.runtime.session.state import comm_state
from ringtree.runtime.transports.remote_sends import REMOTE_SENDS
from ringtree.schedule.topology import Topology

LAYOUT = os.environ.get("CLUSTER_LAYOUT")
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(LAYOUT is None, reason="runs under scripts/cluster only")]


def placed() -> Topology:
    """The node map scripts/cluster made."""
    return Topology.placed(list(Topology.parse(LAYOUT).ranks_per_node), os.environ["CLUSTER_PLACEMENT"])


def test_ringtree_learns_which_ranks_share_a_host(comm):
    expected = placed()
    topology = comm_state(comm).topology
    assert topology == expected, f"rank {comm.rank}: learned {topology}, expected {expected}"
    assert topology.crossings(list(topology.node_order)) == (topology.nodes if topology.nodes > 1 else 0)


def test_ringtree_topology_flat_counts_every_rank_on_one_node(comm, monkeypatch):
    monkeypatch.setenv("RINGTREE_TOPOLOGY", "flat")
    settings.reload()
    flat = comm.Dup()
    try:
        assert comm_state(flat).topology == Topology.flat(comm.size)
        x = np.arange(1000, dtype=np.int64) + comm.rank
        expected = np.empty_like(x)
        comm.Allreduce(x, expected)
        got = ringtree.allreduce(x, comm=flat, algorithm="ring")
        assert_everywhere(comm, [] if np.array_equal(got, expected) else ["the ring in rank order differs from MPI's"])
    finally:
        flat.Free()
        monkeypatch.delenv("RINGTREE_TOPOLOGY")
        settings.reload()


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, "auto"])
def test_every_allreduce_algorithm_gives_mpi_s_result_across_hosts(comm, algorithm):
    failures = []
    for count in (0, 1, comm.size + 1, 1000, 100_003):
        for dtype in (np.int64, np.float32):
            x = ((np.arange(count) * 7 + 13 * comm.rank) % 23 - 11).astype(dtype)
            expected = np.empty_like(x)
            comm.Allreduce(x, expected)
            for segment in (None, 4096) if algorithm != "auto" else (None,):
                for inplace in (False, True):
                    what = f"{algorithm} {count} {np.dtype(dtype)} segment {segment} {'in place' if inplace else ''}"
                    if inplace:
                        got = x.copy()
                        ringtree.allreduce(MPI.IN_PLACE, got, comm=comm, algorithm=algorithm, segment=segment)
                    else:
                        got = ringtree.allreduce(x, comm=comm, algorithm=algorithm, segment=segment)
                    if dtype is np.int64 and not np.array_equal(got, expected):
                        failures.append(f"{what}: differs from MPI's")
                    if not same_on_all_ranks(comm, got):
                        failures.append(f"{what}: ranks differ")
                    elif dtype is np.float32 and not np.allclose(got, expected, rtol=1e-5, atol=1e-4):
                        failures.append(f"{what}: far from MPI's")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("name,algorithm", [(name, algorithm) for name in GENERATORS if name != "allreduce"
                                            for algorithm in [*GENERATORS[name], "auto"]])
@pytest.mark.parametrize("segment", [None, 16])
def test_every_other_collective_gives_mpi_s_result_across_hosts(comm, name, algorithm, segment):
    if algorithm == "auto" and segment:
        pytest.skip("auto chooses its own segments")
    assert_everywhere(comm, failures_on(comm, name, algorithm, segment, np.array, np.asarray))


def _one_call_against_mpi_s_own(comm, name, algorithm, count, segment) -> list[str]:
    """One call of collective `name` on `count` int32 elements (blocks of count/size, root the last
    rank, on another host than rank 0), against MPI's own on the same input: what differs."""
    x = ((np.arange(count, dtype=np.int32) * 7 + 13 * comm.rank) % 23 - 11).astype(np.int32)
    block = count // comm.size
    options = dict(comm=comm, algorithm=algorithm, segment=segment)
    root = comm.size - 1
    if name == "allreduce":
        expected = np.empty_like(x)
        comm.Allreduce(x, expected)
        got = ringtree.allreduce(x, **options)
    elif name == "reduce_scatter":
        expected = np.empty(block, np.int32)
        comm.Reduce_scatter_block(x[:block * comm.size], expected)
        got = ringtree.reduce_scatter(x[:block * comm.size], **options)
    elif name == "allgather":
        expected = np.empty(block * comm.size, np.int32)
        comm.Allgather(x[:block], expected)
        got = ringtree.allgather(x[:block], **options).reshape(-1)
    elif name == "broadcast":
        expected = x.copy()
        comm.Bcast(expected, root)
        got = ringtree.broadcast(x.copy(), root, **options)
    elif name == "alltoall":
        expected = np.empty(block * comm.size, np.int32)
        comm.Alltoall(x[:block * comm.size], expected)
        got = ringtree.alltoall(x[:block * comm.size], **options)
        if algorithm != "bruck":  # and given counts (Bruck takes blocks alike only), rank s sending d up to a block
            matrix = (np.add.outer(np.arange(comm.size), 2 * np.arange(comm.size)) + count) % (block + 1)
            sent, received = matrix[comm.rank].tolist(), matrix[:, comm.rank].tolist()
            theirs = np.empty(sum(received), np.int32)
            comm.Alltoallv([x[:sum(sent)], sent], [theirs, received])
            if not np.array_equal(ringtree.alltoall(x[:sum(sent)], None, sent, received, **options), theirs):
                return [f"alltoall {algorithm} given counts {sent}, segment {segment}: differs from MPI's"]
    else:
        expected = np.empty_like(x) if comm.rank == root else None
        comm.Reduce(x, expected, MPI.SUM, root)
        got = ringtree.reduce(x, root=root, **options)
    if expected is None:
        return [] if got is None else [f"{name} {algorithm}: rank {comm.rank}, not the root, got a result"]
    return [] if np.array_equal(got, expected) else [f"{name} {algorithm} of {count} elements, segment {segment}: "
                                                     "differs from MPI's"]


# Many messages to one rank on another host (32 MiB in the segments of 256 KiB that calls across
# nodes get, or 1 MiB in 4 KiB ones): over libfabric's tcp provider alone, a rank that holds some
# dozens of messages it has not matched yet stops taking more (docs/reliability.md).
@pytest.mark.parametrize("name,algorithm", [(name, algorithm) for name in GENERATORS
                                            for algorithm in [*GENERATORS[name], "auto"]])
@pytest.mark.parametrize("nbytes,segment", [(32 << 20, None), (1 << 20, 4096)], ids=["32MiB", "1MiB-in-4KiB"])
def test_every_collective_ends_with_hundreds_of_messages_to_a_rank_on_another_host(comm, name, algorithm, nbytes,
                                                                                   segment):
    if algorithm == "auto" and segment:
        pytest.skip("auto chooses its own segments")
    mine = comm.Dup()  # a timeout there leaves COMM_WORLD's ringtree state usable for the tests after
    try:
        failures = _one_call_against_mpi_s_own(mine, name, algorithm, nbytes // 4, segment)
    finally:
        mine.Free()
    assert_everywhere(comm, failures)


def test_at_most_a_few_synchronous_sends_are_in_flight_to_a_rank_on_another_host(comm):
    mine = comm.Dup()
    try:
        x = np.ones(1 << 18, np.float32)  # 256 segments, all of them ready at the root at once
        request = ringtree.ibroadcast(x, root=0, comm=mine, algorithm="binomial", segment=4096)
        most = 0
        while not request.test():
            most = max([most, *IN_FLIGHT.remote_sends.in_flight.values()])
        remote = comm_state(mine).remote
    finally:
        mine.Free()
    expected = [node != placed().node_of[comm.rank] for node in placed().node_of]
    failures = [] if list(remote) == expected else [f"ranks on another host {remote}, expected {expected}"]
    if most > REMOTE_SENDS:
        failures.append(f"{most} sends in flight to a rank on another host, above {REMOTE_SENDS}")
    if comm.allreduce(most, MPI.MAX) != REMOTE_SENDS:  # the root sends to a rank on another host, held at the limit
        failures.append(f"the most sends in flight to a rank on another host were not {REMOTE_SENDS}")
    assert_everywhere(comm, failures)


def test_the_hierarchical_allreduce_posts_receives_ahead_across_hosts_and_the_ring_does_not(comm):
    mine = comm.Dup()
    try:
        x = np.ones(comm.size * 4096, np.float32)
        lags = {}
        for algorithm in ("hierarchical", "ring"):
            ringtree.allreduce(x, comm=mine, algorithm=algorithm, segment=4096)
            plan = next(plan for key, plan in comm_state(mine).plans.items() if algorithm in key)
            lags[algorithm] = receives_ahead(plan.compiled.schedule)
    finally:
        mine.Free()
    # a rank alone on its node may have no channel whose receives wait for reads of its own
    ahead_somewhere = comm.allreduce(max(lags["hierarchical"], default=0), MPI.MAX) > 1
    fine = ahead_somewhere and 1 not in lags["hierarchical"] and lags["ring"] <= {1}
    assert_everywhere(comm, [] if fine else [f"receives into scratch a window ahead or not, as lags: {lags}"])


def test_device_arrays_go_by_ipc_to_ranks_of_the_same_host_and_staged_to_the_others(comm):
    from test_ipc import CASES, allreduce_failures, transport  # registers the fake device

    node = placed().node_of
    mine = comm.Dup()
    try:
        failures = [f for algorithm in ("ring", "hierarchical", "auto") for f in allreduce_failures(mine, algorithm, CASES)]
        same_host = [r for r in range(comm.size) if r != comm.rank and node[r] == node[comm.rank]]
        failures += ipc_failures(transport(mine), same_host)
    finally:
        mine.Free()
    assert_everywhere(comm, failures)
