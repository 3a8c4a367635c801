"""The IPC transport (runtime/transports/ipc.py) under mpiexec, on a device without a GPU (tests/fake_device.py):
every collective's every algorithm against MPI's own, the registration cache and its invalidation,
the choice of transport per peer, and ranks that differ in their arrays. tests/test_hosts.py runs
it across emulated hosts, where only the ranks of one host use IPC."""

import numpy as np
import pytest
from fake_device import DeviceArray, FakeDevice, device_array, device_empty, device_free, register, synchronize
from mpi4py import MPI
from test_collectives import ALGORITHMS as OTHER_ALGORITHMS
from test_collectives import failures_on

import ringtree
from conftest import assert_everywhere, ipc_failures
from ringtree import settings
from ringtree.algorithms import ALGORITHMS
from ringtree.errors import MismatchError
from ringtree.runtime.session.state import comm_state
from ringtree.runtime.transports.backend import NumpyBackend
from ringtree.runtime.transports.choice import transport_for
from ringtree.runtime.transports.ipc import RETIRED_PER_HEADER, IpcTransport

pytestmark = pytest.mark.mpi
register()


@pytest.fixture
def fresh(comm):
    """A communicator of its own, so that each test starts with nothing registered."""
    mine = comm.Dup()
    yield mine
    mine.Free()


def transport(comm):
    return comm_state(comm).transports.get(FakeDevice.ipc)


def host(array) -> np.ndarray:
    synchronize()
    return np.asarray(array).view(np.ndarray)


def allreduce_failures(comm, algorithm, cases) -> list[str]:
    """Each (count, dtype, segment, in place) case by `algorithm` on device arrays, against MPI's own
    Allreduce of the same (integer-valued) data on the host."""
    failures = []
    for count, dtype, segment, inplace in cases:
        x = ((np.arange(count) * (comm.rank + 3)) % 101 - 50).astype(dtype)
        expected = np.empty_like(x)
        comm.Allreduce(x, expected)
        device = device_array(x)
        what = f"{algorithm} {count} {dtype} segment {segment} in place {inplace}"
        if inplace:
            got = ringtree.allreduce(MPI.IN_PLACE, device, comm=comm, algorithm=algorithm, segment=segment)
        else:
            got = ringtree.allreduce(device, comm=comm, algorithm=algorithm, segment=segment)
            if not np.array_equal(host(device), x):
                failures.append(f"{what}: the input changed")
        if type(got) is not DeviceArray:
            failures.append(f"{what}: the result is a {type(got).__name__}")
        elif not np.array_equal(host(got), expected):
            failures.append(f"{what}: {np.count_nonzero(host(got) != expected)} elements differ from MPI's")
    return failures


CASES = [(1007, np.int64, None, False), (4099, np.int64, 256, True), (333, np.float32, None, True),
         (5000, np.float32, 1024, False), (0, np.int64, None, False), (1, np.int32, None, True)]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS) + ["auto"])
def test_every_allreduce_by_ipc_gives_mpis_result(fresh, algorithm):
    failures = allreduce_failures(fresh, algorithm, CASES)
    failures += ipc_failures(transport(fresh), set(range(fresh.size)) - {fresh.rank})
    assert_everywhere(fresh, failures)


@pytest.mark.parametrize("name, algorithm", [(name, algorithm) for name, algorithms in OTHER_ALGORITHMS.items()
                                             for algorithm in algorithms])
def test_every_other_collective_by_ipc_gives_mpis_result(fresh, name, algorithm):
    failures = failures_on(fresh, name, algorithm, None, device_array, host)
    failures += failures_on(fresh, name, algorithm, 16, device_array, host)
    assert_everywhere(fresh, failures)


def test_the_same_arrays_are_registered_and_mapped_once(fresh):
    x = device_array(np.arange(10000, dtype=np.int64) + fresh.rank)
    out = device_empty(x.size, x.dtype)
    expected = np.empty(x.size, x.dtype)
    fresh.Allreduce(host(x), expected)
    for _ in range(5):
        ringtree.allreduce(x, out, comm=fresh, algorithm="ring", segment=8192)
    failures = [] if np.array_equal(host(out), expected) else ["wrong result"]
    ipc = transport(fresh)
    if fresh.size > 1:
        first = dict(ipc.stats)
        for _ in range(5):
            ringtree.allreduce(x, out, comm=fresh, algorithm="ring", segment=8192)
        if ipc.stats["exported"] != first["exported"] or ipc.stats["opened"] != first["opened"]:
            failures.append(f"repeated calls registered or mapped again: {first} then {ipc.stats}")
        if ipc.stats["headers"] <= first["headers"]:
            failures.append("the repeated calls sent no headers")
    assert_everywhere(fresh, failures)


def test_an_allocation_freed_and_reused_is_registered_again_and_the_old_mapping_closed(fresh):
    # The fake device's allocator gives a freed allocation's address to the next one of its size, as
    # cudaMalloc may: the transport must not take the new array for the old one, and the peers must
    # unmap the old one.
    failures, addresses = [], set()
    ipc = None
    for round in range(4):
        x = device_array(np.full(4096, round + 1, np.int64) * (fresh.rank + 1))
        addresses.add(x.__array_interface__["data"][0])
        got = ringtree.allreduce(x, comm=fresh, algorithm="recursive_doubling")
        expected = (round + 1) * fresh.size * (fresh.size + 1) // 2
        if not (host(got) == expected).all():
            failures.append(f"round {round}: wrong result")
        ipc = transport(fresh)
        device_free(x)
        device_free(got)
    if len(addresses) != 1:
        failures.append(f"the fake device did not reuse the address: {addresses}")
    if fresh.size > 1:
        # Every round exports x anew (and the result, where a rank sends from it), and retires the
        # round before's: only the last round's exports are live at the end.
        if ipc.stats["exported"] < 4 or ipc.stats["retired"] < ipc.stats["exported"] - 2:
            failures.append(f"exports {ipc.stats}")
        if ipc.stats["closed"] == 0 or len(ipc.mapped) > 2 * (fresh.size - 1):
            failures.append(f"old mappings kept: {len(ipc.mapped)} open, {ipc.stats}")
    assert_everywhere(fresh, failures)


def test_transport_staged_moves_device_arrays_through_host_memory(fresh, monkeypatch):
    monkeypatch.setenv("RINGTREE_TRANSPORT", "staged")
    settings.reload()
    try:
        mine = fresh.Dup()
        failures = allreduce_failures(mine, "ring", CASES[:2])
        failures += failures_on(mine, "allgather", "ring", None, device_array, host)
        if transport(mine) is not None:
            failures.append("an IPC transport with RINGTREE_TRANSPORT=staged")
        mine.Free()
    finally:
        monkeypatch.delenv("RINGTREE_TRANSPORT")
        settings.reload()
    assert_everywhere(fresh, failures)


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="needs a peer")
def test_device_arrays_on_one_rank_and_host_arrays_on_another_is_a_mismatch_not_a_hang(fresh):
    x = np.arange(1000, dtype=np.int64)
    given = device_array(x) if fresh.rank == 0 else x
    with pytest.raises(MismatchError):
        ringtree.allreduce(given, comm=fresh, algorithm="ring", timeout=60)


def test_a_header_names_the_region_and_retires_freed_allocations_a_few_at_a_time():
    # One process as both ends: what one transport's headers say, the other maps and reads.
    sender = IpcTransport(FakeDevice.ipc, MPI.COMM_SELF, frozenset({0}))
    receiver = IpcTransport(FakeDevice.ipc, MPI.COMM_SELF, frozenset({0}))
    arrays = [device_array(np.arange(100, dtype=np.int32) * k) for k in range(7)]
    for array in arrays:
        header = sender.header(array, slice(10, 20), 0, {})
        region, nbytes = receiver.source(0, header.tobytes(), np.dtype(np.int32))
        assert nbytes == 40 and np.array_equal(region, host(array)[10:20])
    assert sender.stats["exported"] == 7 and len(receiver.mapped) == 7
    allocations = [FakeDevice.ipc.allocation(array)[0] for array in arrays]
    for array in arrays:
        device_free(array)
    fresh = device_empty(7 * 128, np.int32)  # first fit: where the seven were, if nothing freed before
    fresh[:] = 5
    mine = FakeDevice.ipc.allocation(fresh)[0]
    reused = sum(a.base < mine.base + mine.size and mine.base < a.base + a.size for a in allocations)
    first = sender.header(fresh, slice(0, 700), 0, {})
    assert sender.stats["retired"] == reused
    receiver.source(0, first.tobytes(), np.dtype(np.int32))
    assert len(receiver.mapped) == 1 + 7 - min(reused, RETIRED_PER_HEADER)  # a header tells of four at most
    region, _ = receiver.source(0, sender.header(fresh, slice(0, 1), 0, {}).tobytes(), np.dtype(np.int32))
    assert len(receiver.mapped) == 1 + 7 - reused and region[0] == 5
    empty, nbytes = receiver.source(0, sender.header(fresh, slice(3, 3), 0, {}).tobytes(), np.dtype(np.int32))
    assert empty is None and nbytes == 0
    device_free(fresh)


class _NoLayer(FakeDevice):
    ipc = None  # a device whose memory cannot be shared: no IPC layer


def test_transport_ipc_is_an_error_where_device_memory_cannot_be_shared(comm, monkeypatch):
    monkeypatch.setenv("RINGTREE_TRANSPORT", "ipc")
    settings.reload()
    try:
        with pytest.raises(RuntimeError, match="RINGTREE_TRANSPORT=ipc, but _NoLayer has no IPC layer"):
            transport_for(comm_state(comm), _NoLayer)
        assert transport_for(comm_state(comm), NumpyBackend) is None  # host arrays: MPI, whatever the setting
    finally:
        monkeypatch.delenv("RINGTREE_TRANSPORT")
        settings.reload()


def test_many_calls_in_flight_by_ipc_waited_in_any_order(fresh):
    # Each call has its own tag, so its headers and acks never meet another call's.
    names = sorted(ALGORITHMS)
    rng = np.random.default_rng(7)
    counts = [int(c) for c in rng.integers(0, 5000, 16)]
    inputs = [device_array(np.arange(c, dtype=np.int64) * (fresh.rank + 1) + i) for i, c in enumerate(counts)]
    requests = [ringtree.iallreduce(x, comm=fresh, algorithm=names[i % len(names)], segment=[None, 4096][i % 2])
                for i, x in enumerate(inputs)]
    failures = []
    for i in rng.permutation(len(requests)):  # the same order on every rank: the seed is the same
        got = host(requests[i].wait())
        n = fresh.size
        if not np.array_equal(got, np.arange(counts[i]) * n * (n + 1) // 2 + n * i):
            failures.append(f"call {i} ({names[i % len(names)]}, {counts[i]} elements) wrong")
    assert_everywhere(fresh, failures)


def test_a_rank_that_never_joins_is_a_timeout_not_a_hang(fresh):
    if fresh.size < 2:
        pytest.skip("needs a rank to stay away")
    ringtree.allreduce(device_array(np.ones(4)), comm=fresh)  # sets it up: every rank takes part
    outcome = "stayed away"
    if fresh.rank != fresh.size - 1:
        try:
            ringtree.allreduce(device_array(np.ones(4096)), comm=fresh, algorithm="ring", timeout=1.0)
            outcome = "done"
        except ringtree.TimeoutError as error:
            outcome = "timeout" if "ringtree allreduce" in str(error) else f"timeout saying {error}"
    outcomes = fresh.allgather(outcome)
    assert_everywhere(fresh, [] if "timeout" in outcomes and set(outcomes) <= {"timeout", "stayed away", "done"}
                      else [outcomes])
