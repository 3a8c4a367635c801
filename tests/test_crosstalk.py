"""ringtree's collectives beside the user's own traffic on the same communicator, and many at once."""

import numpy as np
import pytest
from mpi4py import MPI

from conftest import assert_everywhere
from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce, iallreduce

pytestmark = pytest.mark.mpi


def test_user_messages_and_native_collectives_around_ringtree_collectives(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    # Wildcard receives posted first: any message ringtree sent on the user's communicator would land here.
    incoming = [np.full(8, -1, np.int64) for _ in range(6)]
    wildcard = [comm.Irecv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG) for buf in incoming]
    sent = [comm.Isend(np.full(8, 100 * rank + tag, np.int64), right, tag) for tag in range(3)]

    data = np.arange(1000, dtype=np.int64) + rank
    expected = np.arange(1000, dtype=np.int64) * size + size * (size - 1) // 2
    failures = []
    pending = iallreduce(data, comm=comm, algorithm="ring", segment=1024)
    if not np.array_equal(allreduce(data, comm=comm), expected):
        failures.append("blocking allreduce amid user traffic")
    native = np.empty_like(data)
    comm.Allreduce(data, native)
    token = comm.bcast(rank if rank == 0 else None, root=0)
    sent += [comm.Isend(np.full(8, 100 * rank + tag, np.int64), right, tag) for tag in range(3, 6)]
    if not np.array_equal(pending.wait(), expected):
        failures.append("iallreduce amid user traffic")
    MPI.Request.Waitall(sent)
    statuses = [MPI.Status() for _ in wildcard]
    MPI.Request.Waitall(wildcard, statuses)

    got = sorted((s.Get_source(), s.Get_tag(), int(buf[0])) for s, buf in zip(statuses, incoming))
    if got != [(left, tag, 100 * left + tag) for tag in range(6)]:
        failures.append(f"user messages: got {got}")
    if not np.array_equal(native, expected) or token != 0:
        failures.append("native collectives disturbed")
    if not np.array_equal(allreduce(data, comm=comm, algorithm="tree"), expected):
        failures.append("allreduce after user traffic")
    assert_everywhere(comm, failures)


def test_64_outstanding_iallreduce_of_mixed_sizes_and_algorithms_waited_in_random_order(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    shared = np.random.default_rng(64)  # the same calls, in the same order, on every rank
    counts = shared.choice([0, 1, 3, size + 1, 1000, 70_000, 300_000], 64)
    names = sorted(ALGORITHMS) + ["auto"]
    inputs = [np.full(count, rank + i, np.int32) for i, count in enumerate(counts)]
    requests = [iallreduce(x, comm=comm, algorithm=names[i % len(names)], segment=[None, 65536][i % 2])
                for i, x in enumerate(inputs)]
    order = np.random.default_rng(rank).permutation(64)  # each rank waits in its own order
    results = {int(i): requests[i].wait() for i in order}
    failures = [f"request {i} ({names[i % len(names)]}, {counts[i]} elements) wrong"
                for i in range(64) if not (results[i] == size * i + size * (size - 1) // 2).all()]
    assert_everywhere(comm, failures)
