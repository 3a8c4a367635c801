"""A program's own allreduce: the ring the other way round, each rank sending to its left neighbour and
receiving from its right, registered as "reverse_ring" (docs/algorithms.md, "Your own algorithm").

    mpiexec -n 4 python examples/reverse_ring.py
    mpiexec -n 2 python -m ringtree bench --import examples/reverse_ring.py --algorithms reverse_ring,ring,native
"""

import ringtree
from ringtree.schedule import INPUT, OUTPUT, Ref, ScheduleBuilder, even_chunks, single_rank


def reverse_ring_allreduce(nranks, rank, count):
    if nranks == 1:
        return single_rank("reverse_ring", count)
    b = ScheduleBuilder("reverse_ring", nranks, rank, count)
    chunks = even_chunks(count, nranks)  # (offset, size), one per rank
    left, right, largest = (rank - 1) % nranks, (rank + 1) % nranks, max(size for _, size in chunks)
    incoming = b.scratch("incoming", 2 * largest)  # two slots: one chunk arrives while the other is added
    for step in range(nranks - 1):  # reduce-scatter: afterwards rank r holds the total of chunk r - 1
        sent, (offset, size) = chunks[(rank + step) % nranks], chunks[(rank + step + 1) % nranks]
        partial = Ref(incoming.buffer, step % 2 * largest, size)
        b.send(left, Ref(INPUT if step == 0 else OUTPUT, *sent))
        b.recv(right, partial)
        b.reduce(Ref(OUTPUT, offset, size), partial, Ref(INPUT, offset, size))
    for step in range(nranks - 1):  # allgather: each total goes on to the left
        b.send(left, Ref(OUTPUT, *chunks[(rank - 1 + step) % nranks]))
        b.recv(right, Ref(OUTPUT, *chunks[(rank + step) % nranks]))
    return b.build()


ringtree.register_algorithm("allreduce", "reverse_ring", reverse_ring_allreduce, offer_to_auto=True)

if __name__ == "__main__":
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    x = np.arange(10, dtype=np.int64) * (comm.rank + 1)
    total = ringtree.allreduce(x, comm=comm, algorithm="reverse_ring")
    expected = np.empty_like(x)
    comm.Allreduce(x, expected)
    assert np.array_equal(total, expected), (total, expected)
    if comm.rank == 0:
        print(f"reverse_ring on {comm.size} ranks: {total.tolist()}, as MPI's own Allreduce")
