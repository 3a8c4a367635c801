"""ringtree.Communicator as a drop-in for mpi4py's Comm.Allreduce and Iallreduce."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, same_on_all_ranks

pytestmark = pytest.mark.mpi


def _native(comm, data, op=MPI.SUM):
    out = np.empty_like(data)
    comm.Allreduce(data, out, op)
    return out


def test_arrays_in_place_and_out_of_place(comm):
    rt = ringtree.Communicator(comm)
    data = np.arange(10, dtype=np.int32) * (comm.Get_rank() + 1)
    expected = _native(comm, data)
    out = np.zeros_like(data)
    assert rt.Allreduce(data, out) is None
    inplace = data.copy()
    rt.Allreduce(MPI.IN_PLACE, inplace)
    assert_everywhere(comm, [] if np.array_equal(out, expected) and np.array_equal(inplace, expected) else ["wrong"])


def test_buffer_protocol_objects(comm):
    rt = ringtree.Communicator(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    send = array.array("d", [rank, 2.0 * rank, 1.0])
    recv = array.array("d", [0.0] * 3)
    rt.Allreduce(send, recv)
    raw = bytearray(4)
    rt.Allreduce(bytearray([rank % 256, 1, 2, 3]), raw, MPI.MAX)
    total = size * (size - 1) / 2
    ok = list(recv) == [total, 2 * total, size] and list(raw) == [(size - 1) % 256, 1, 2, 3]
    assert_everywhere(comm, [] if ok else [f"got {recv} and {list(raw)}"])


@pytest.mark.parametrize("spec", [
    lambda b: [b, MPI.DOUBLE],
    lambda b: [b, 6, MPI.DOUBLE],
    lambda b: [b, (6, 0), MPI.DOUBLE],
    lambda b: [b, 6, 0, MPI.DOUBLE],
    lambda b: (b, "d"),
], ids=["buf-type", "buf-count-type", "buf-(count,displ)-type", "buf-count-displ-type", "typecode"])
def test_buffer_specifications(comm, spec):
    rt = ringtree.Communicator(comm)
    data = np.linspace(0, 1, 6) + comm.Get_rank()
    out = np.zeros(6)
    rt.Allreduce(spec(data), spec(out))
    # Floats: another algorithm than MPI's adds in another order, so close to native, and the same bits everywhere.
    right = np.allclose(out, _native(comm, data), rtol=1e-12, atol=0) and same_on_all_ranks(comm, out)
    assert_everywhere(comm, [] if right else [f"got {out}"])


def test_datatype_in_the_specification_wins_over_the_array_dtype(comm):
    rt = ringtree.Communicator(comm)
    data = np.full(4, comm.Get_rank() + 1, np.int32)
    raw = np.zeros(16, np.uint8)  # 4 int32 as bytes, typed by the specification
    rt.Allreduce([data, MPI.INT], [raw, MPI.INT], MPI.MAX)
    assert_everywhere(comm, [] if (raw.view(np.int32) == comm.Get_size()).all() else [f"got {raw}"])


def test_count_and_displacement_select_part_of_the_buffer(comm):
    rt = ringtree.Communicator(comm)
    data = np.ones(10, np.int64)
    out = np.full(10, -1, np.int64)
    rt.Allreduce([data, 4, 3, MPI.INT64_T], [out, (4, 3), MPI.INT64_T])
    expected = np.full(10, -1, np.int64)
    expected[3:7] = comm.Get_size()
    assert_everywhere(comm, [] if np.array_equal(out, expected) else [f"got {out}"])


def test_iallreduce_returns_an_mpi4py_style_request(comm):
    rt = ringtree.Communicator(comm)
    buffers = [np.full(n, comm.Get_rank(), np.float64) for n in (1, 1000, 50_000)]
    requests = [rt.Iallreduce(MPI.IN_PLACE, b) for b in buffers]
    for request in reversed(requests):
        assert request.Wait() is True
    assert requests[0].Test()
    total = sum(range(comm.Get_size()))
    assert_everywhere(comm, [] if all((b == total).all() for b in buffers) else ["wrong"])


def test_other_attributes_reach_the_wrapped_communicator(comm):
    rt = ringtree.Communicator(comm)
    assert rt.Get_rank() == comm.Get_rank() and rt.Get_size() == comm.Get_size()
    assert rt.bcast("hello" if comm.Get_rank() == 0 else None) == "hello"
