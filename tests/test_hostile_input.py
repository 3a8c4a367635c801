"""Random and wrong arguments thrown at allreduce: a right result or a clear exception, never a crash,
a hang or a changed input. On one rank (COMM_SELF), so hypothesis can draw freely."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce, iallreduce

COMM = MPI.COMM_SELF
DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex64", "U3", "O"]
OPS = [MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX, MPI.LAND, MPI.BXOR, "sum", "avg", "max", "median", 3, None, MPI.OP_NULL]


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    view = draw(st.sampled_from(["whole", "strided", "reversed", "readonly", "fortran"]))
    wide = shape[:-1] + (2 * shape[-1],) if view == "strided" and shape else shape
    array = np.arange(int(np.prod(wide))).astype(dtype).reshape(wide)
    if view == "strided" and shape:
        array = array[..., ::2]
    elif view == "reversed" and shape:
        array = array[..., ::-1]
    elif view == "readonly":
        array.flags.writeable = False
    elif view == "fortran":
        array = np.asfortranarray(array)
    return array


@settings(max_examples=300, deadline=None)
@given(send=st.one_of(arrays(), st.sampled_from([None, 3, "text", [1, 2], MPI.IN_PLACE, b"bytes"])),
       recv=st.one_of(st.none(), arrays(), st.sampled_from(["same", "overlap", 7])),
       op=st.sampled_from(OPS), algorithm=st.sampled_from([*ALGORITHMS, "auto", "fast", 1]),
       segment=st.sampled_from([None, 1, 64, 0, -5, 2.5, "1M"]), blocking=st.booleans())
def test_any_arguments_give_a_right_result_or_a_clear_error(send, recv, op, algorithm, segment, blocking):
    if isinstance(recv, str) and recv == "same":
        recv = send
    elif isinstance(recv, str) and recv == "overlap" and isinstance(send, np.ndarray) and send.ndim:
        recv = send[..., 1:] if send.shape[-1] > 1 else send
    arrays_given = [np.frombuffer(x, np.uint8) if isinstance(x, bytes) else x for x in (send, recv)
                    if isinstance(x, (np.ndarray, bytes))]
    before = [np.copy(x) for x in arrays_given]
    try:
        if blocking:
            result = allreduce(send, recv, op, comm=COMM, algorithm=algorithm, segment=segment)
        else:
            result = iallreduce(send, recv, op, comm=COMM, algorithm=algorithm, segment=segment).wait()
    except (TypeError, ValueError) as error:
        assert "on rank 0" in str(error) or "comm" in str(error), error
        for original, x in zip(before, arrays_given):
            assert np.array_equal(original, x, equal_nan=original.dtype.kind in "fc"), "an input changed"
        return
    source_before = before[0]  # the input: sendbuf, or recvbuf when in place
    # As MPI reads them: the same number of elements, in memory order (the shapes may differ).
    assert result.size == source_before.size and result.dtype == source_before.dtype
    assert np.array_equal(result.ravel(order="K"), source_before.ravel(order="K"), equal_nan=True)  # one rank: the input
    if send is not MPI.IN_PLACE and recv is not send:
        assert np.array_equal(arrays_given[0], before[0], equal_nan=True), "sendbuf changed"
