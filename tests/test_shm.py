"""The shared-memory transport (RINGTREE_SHM=on): host arrays between ranks of a node through rings
in an MPI-3 shared window, against MPI's own on the same inputs. The whole correctness matrix also
runs on it in scripts/test (the MPI tests of the collectives with RINGTREE_SHM=on)."""

import threading

import numpy as np
import pytest
from mpi4py import MPI
from test_collectives import failures_on

import ringtree
from conftest import assert_everywhere
from ringtree import settings
from ringtree.algorithms import GENERATORS
from ringtree.errors import MismatchError
from ringtree.runtime.shared_window import SLOTS, ring_bytes
from ringtree.runtime.shm import DIRECT_MIN_BYTES
from ringtree.runtime.state import comm_state

pytestmark = pytest.mark.mpi


@pytest.fixture
def shared(monkeypatch):
    """A communicator whose ringtree state was set up with RINGTREE_SHM=on."""
    monkeypatch.setenv("RINGTREE_SHM", "on")
    settings.reload()
    mine = MPI.COMM_WORLD.Dup()
    comm_state(mine)
    monkeypatch.delenv("RINGTREE_SHM")
    settings.reload()
    yield mine
    mine.Free()


def _pieces(comm) -> int:
    """The pieces this rank has taken out of its peers' rings on `comm`."""
    transport = comm_state(comm).transports.get("shm")
    return sum(inbox.count for inbox in transport.inboxes.values()) if transport else 0


def test_the_transport_reaches_the_ranks_of_the_node_and_carries_every_message(shared):
    failures = []
    x = np.arange(100_000, dtype=np.int64) * (shared.rank + 1)
    expected = np.empty_like(x)
    shared.Allreduce(x, expected)
    got = ringtree.allreduce(x, comm=shared, algorithm="ring")
    if not np.array_equal(got, expected):
        failures.append("ring allreduce differs from MPI's")
    transport = comm_state(shared).transports["shm"]
    peers = set(range(shared.size)) - {shared.rank}  # one node here
    if shared.size > 1 and (transport is None or set(transport.peers) != peers):
        failures.append(f"shared-memory peers {transport and sorted(transport.peers)}, expected {sorted(peers)}")
    elif shared.size > 1 and _pieces(shared) < 2:  # a message each way at least, reduce-scatter and allgather
        failures.append(f"{_pieces(shared)} pieces went through shared memory")
    assert_everywhere(shared, failures)


@pytest.mark.parametrize("name", sorted(set(GENERATORS) - {"allreduce"}))
def test_every_algorithm_of_every_collective_gives_mpi_s_result(shared, name):
    failures = []
    for algorithm in ["auto", *sorted(GENERATORS[name])]:
        for segment in (None, 64):
            failures += failures_on(shared, name, algorithm, segment, lambda x: x, lambda x: x)
    assert_everywhere(shared, failures)


@pytest.mark.parametrize("algorithm", sorted(GENERATORS["allreduce"]))
def test_every_allreduce_wraps_its_rings_many_times_and_gives_mpi_s_result(shared, algorithm):
    count = 3 * ring_bytes(max(1, shared.size - 1)) // 8 + 5  # messages of several rings' worth, not whole pieces
    failures = []
    for segment in (None, 100_000):
        x = ((np.arange(count) * (shared.rank + 3)) % 101 - 50).astype(np.int64)
        expected = np.empty_like(x)
        shared.Allreduce(x, expected)
        got = ringtree.allreduce(x, comm=shared, algorithm=algorithm, segment=segment)
        if not np.array_equal(got, expected):
            failures.append(f"{algorithm} segment {segment}: differs from MPI's")
    assert_everywhere(shared, failures)


def test_calls_in_flight_together_share_the_rings_and_finish_in_any_order(shared):
    # Messages of several calls interleave in one ring; a message whose receive is posted late is kept.
    arrays = [np.full(50_000 + 1000 * k, shared.rank + k, np.int64) for k in range(6)]
    requests = [ringtree.iallreduce(x, comm=shared, algorithm="ring", segment=8192) for x in arrays]
    failures = []
    for k in reversed(range(6)):
        got = requests[k].wait()
        expected = sum(r + k for r in range(shared.size))
        if not (got == expected).all():
            failures.append(f"call {k}: {got[:3]} where every element is {expected}")
    assert_everywhere(shared, failures)


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="needs a peer")
@pytest.mark.parametrize("nbytes", [4096, 3 * DIRECT_MIN_BYTES])
def test_a_message_that_blocks_another_call_s_in_its_ring_is_kept_and_both_calls_finish(shared, nbytes):
    # Rank 0 waits for its first call before it starts the second; the others start both at once, so
    # pieces of the second wait in rank 0's rings in front of the first's last ones.
    count = nbytes * shared.size // 8
    first, second = (np.arange(count, dtype=np.int64) * (shared.rank + 1) + k for k in range(2))
    if shared.rank == 0:
        got = [ringtree.iallreduce(first, comm=shared, algorithm="ring", segment=nbytes // 4).wait()]
        got.append(ringtree.iallreduce(second, comm=shared, algorithm="ring", segment=nbytes // 4).wait())
    else:
        requests = [ringtree.iallreduce(x, comm=shared, algorithm="ring", segment=nbytes // 4) for x in (first, second)]
        got = [request.wait() for request in requests]
    failures = [f"call {k} differs" for k in range(2)
                if not np.array_equal(got[k], np.arange(count) * sum(range(1, shared.size + 1)) + k * shared.size)]
    kept = sum(inbox.messages_kept for inbox in comm_state(shared).transports["shm"].inboxes.values())
    if shared.rank == 0 and not kept:
        failures.append("no message was kept: the test did not block a ring")
    assert_everywhere(shared, failures)


@pytest.mark.parametrize("nbytes", [DIRECT_MIN_BYTES - 8, 3 * DIRECT_MIN_BYTES])
def test_large_messages_are_read_where_they_are_also_before_their_receive_is_posted(shared, nbytes):
    window = comm_state(shared).shared_window
    me = window.node.Get_rank() if window.window is not None else 0
    readable = window.window is not None and all(window.reads(k, me) for k in range(window.count))
    count = nbytes * shared.size // 8
    arrays = [np.arange(count, dtype=np.int64) * (shared.rank + 1) + k for k in range(4)]
    requests = [ringtree.iallreduce(x, comm=shared, algorithm="ring", segment=1 << 30) for x in arrays]
    failures = []
    for k in reversed(range(4)):
        expected = np.arange(count) * sum(range(1, shared.size + 1)) + k * shared.size
        if not np.array_equal(requests[k].wait(), expected):
            failures.append(f"call {k} of {nbytes} bytes a message: differs")
    transport = comm_state(shared).transports["shm"]  # None on one rank: no peer
    direct = sum(inbox.read_directly for inbox in transport.inboxes.values()) if transport else 0
    if shared.size > 1 and not readable:
        failures.append("a rank of the node cannot read another's memory (as root on Linux it can)")
    elif shared.size > 1 and (direct > 0) != (nbytes >= DIRECT_MIN_BYTES):
        failures.append(f"{direct} messages of {nbytes} bytes read where the peer keeps them")
    assert_everywhere(shared, failures)


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="needs a peer")
def test_ranks_that_pass_different_counts_get_mismatch_error_not_a_hang(shared):
    x = np.ones(SLOTS * 1000 + shared.rank, np.float64)
    with pytest.raises(MismatchError):
        ringtree.allgather(x, comm=shared, algorithm="ring", timeout=60)


def test_threads_on_communicators_of_their_own_share_no_ring(shared):
    comms = [shared.Dup() for _ in range(2)]
    for comm in comms:
        comm_state(comm)  # set up in turn here: the window is made with the communicator's state
    failures = []

    def work(comm, k):
        try:
            for _ in range(20):
                x = np.arange(30_000, dtype=np.int64) + comm.rank + k
                got = ringtree.allreduce(x, comm=comm, algorithm="ring", segment=4096)
                expected = np.arange(30_000) * comm.size + sum(range(comm.size)) + k * comm.size
                if not np.array_equal(got, expected):
                    failures.append(f"thread {k}: differs")
                    return
        except Exception as error:  # a failure in a thread must reach the assertion
            failures.append(f"thread {k}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(comm, k)) for k, comm in enumerate(comms)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for comm in comms:
        comm.Free()
    assert_everywhere(shared, failures)


def test_without_the_setting_host_arrays_go_by_mpi(comm):
    mine = comm.Dup()
    ringtree.allreduce(np.ones(100_000), comm=mine, algorithm="ring")
    state = comm_state(mine)
    assert state.shared_window is None and state.transports.get("shm") is None
    mine.Free()


FREED_APART = """
    import time
    import numpy as np
    from mpi4py import MPI
    import ringtree
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    comms = [world.Dup() for _ in range(3)]
    for comm in comms:
        ringtree.allreduce(np.ones(1 << 16), comm=comm)  # sets it up, with its node's window
    try:  # one broken on every rank: its state, and its window, are kept; the window freed at exit
        ringtree.allreduce(np.ones(10 + (rank == 0)), comm=comms[2])
    except ringtree.MismatchError:
        pass
    for comm in comms:
        if rank == 0:
            time.sleep(1.5)  # frees each communicator, and its window, well after the others
        comm.Free()
    total = ringtree.allreduce(np.ones(4))
    lines = world.gather(f"rank {rank}: {total[0]:.0f}")
    if rank == 0:  # one rank prints: lines of several could interleave
        print("\\n".join(lines), flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
def test_ranks_that_free_their_communicators_apart_free_the_windows_together_and_exit(tmp_path):
    # Whether to free a window is the node's answer: a rank that waited for the others on its own
    # clock and gave up, while they went on into MPI's Win_free, hung the job at exit.
    import textwrap

    from conftest import run_mpiexec

    run = run_mpiexec(3, "-c", textwrap.dedent(FREED_APART), env={"RINGTREE_SHM": "on"}, timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(run.stdout.split("\n")[:3]) == [f"rank {rank}: 3" for rank in range(3)], run.stdout + run.stderr
