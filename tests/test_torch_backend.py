"""ringtree as a torch.distributed backend: every collective torch code calls, on the default group
made by `init_process_group("ringtree")` under mpiexec, against the same call on a gloo group of the
same ranks; DDP (no hook) and FSDP2 trained on each; the errors a user meets. Runs where torch is
installed (scripts/test makes .venv-torch), at 1 to 4 ranks.

The inputs are small integers, so that every dtype holds every sum exactly in any order: results
are compared exactly (gloo's call runs in 64 bits where gloo lacks the dtype); averages, which
divide, within rounding. Results every rank holds must be bitwise the same on every rank."""

import pathlib
import textwrap
import time

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, run_mpiexec, same_on_all_ranks, torch_groups

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")  # ringtree reduces bfloat16 with it

pytestmark = pytest.mark.mpi
one_rank_only = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")

INTEGERS = [torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(scope="module")
def groups():
    return torch_groups()


@pytest.fixture(scope="module")
def dist(groups):
    import torch.distributed

    return torch.distributed


def _values(rank, count, dtype, salt=0):
    """Small integers (-3 to 3) as `dtype`, different on each rank."""
    values = (np.arange(count) * (rank + 2 + salt) + rank + salt) % 7 - 3
    return torch.tensor(values).to(dtype)


def _wide(tensor):
    """The same values in 64 bits, for gloo, which does not reduce every dtype."""
    return tensor.to(torch.float64 if tensor.is_floating_point() else torch.int64)


def _bits(tensor):
    tensor = tensor.detach().contiguous()
    return tensor.view(torch.int16).numpy() if tensor.dtype is torch.bfloat16 else tensor.numpy()


def _differences(comm, name, ours, theirs, everywhere=True, rtol=0.0):
    """What differs between ringtree's results and gloo's (cast to ringtree's dtype), and, for results
    every rank holds, between the ranks."""
    failures = []
    for index, (a, b) in enumerate(zip(ours, theirs)):
        b = b.to(a.dtype)
        same = torch.allclose(a.double(), b.double(), rtol=rtol, atol=0) if rtol else torch.equal(a, b)
        if a.shape != b.shape or not same:
            failures.append(f"{name}[{index}]: {a.flatten()[:6]} where gloo gives {b.flatten()[:6]}")
    if everywhere and not same_on_all_ranks(comm, np.concatenate([_bits(a).ravel().view(np.uint8) for a in ours])):
        failures.append(f"{name}: the ranks' results differ")
    return failures


def _reduce_ops(dist, dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    if not dtype.is_floating_point:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    return ops


@pytest.mark.parametrize("dtype", INTEGERS + FLOATS, ids=str)
def test_all_reduce_with_every_op_gives_glooss_result_on_every_rank(comm, groups, dist, dtype):
    ours_group, gloo = groups
    rank = comm.Get_rank()
    failures = []
    for op in _reduce_ops(dist, dtype):
        ours = _values(rank, 1000, dtype)
        theirs = _wide(ours)
        dist.all_reduce(ours, op=op, group=ours_group)
        dist.all_reduce(theirs, op=op, group=gloo)
        failures += _differences(comm, f"all_reduce {op}", [ours], [theirs])
    if dtype.is_floating_point:
        ours, theirs = _values(rank, 1000, dtype), _wide(_values(rank, 1000, dtype))
        dist.all_reduce(ours, op=dist.ReduceOp.AVG, group=ours_group)
        dist.all_reduce(theirs, group=gloo)  # gloo has no AVG: its sum, divided
        failures += _differences(comm, "all_reduce AVG", [ours], [theirs / comm.Get_size()], rtol=1e-2)
        ours, theirs = _values(rank, 1000, dtype), _wide(_values(rank, 1000, dtype)) * 0.5
        dist.all_reduce(ours, op=dist._make_nccl_premul_sum(0.5), group=ours_group)
        dist.all_reduce(theirs, group=gloo)
        failures += _differences(comm, "all_reduce PREMUL_SUM 0.5", [ours], [theirs])
    assert_everywhere(comm, failures)


def test_all_reduce_of_random_floats_is_glooss_within_rounding_and_bitwise_the_same_on_every_rank(comm, groups, dist):
    ours_group, gloo = groups
    ours = torch.randn(100_000, generator=torch.Generator().manual_seed(comm.Get_rank()))
    theirs = ours.clone()
    dist.all_reduce(ours, group=ours_group)
    dist.all_reduce(theirs, group=gloo)
    failures = [] if torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5) else ["beyond rounding from gloo's"]
    if not same_on_all_ranks(comm, ours.numpy()):
        failures.append("the ranks' results differ")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_broadcast_and_reduce_from_every_root(comm, groups, dist, dtype):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for root in range(size):
        ours = _values(rank, 300, dtype)
        theirs = _wide(ours)
        dist.broadcast(ours, src=root, group=ours_group)
        dist.broadcast(theirs, src=root, group=gloo)
        failures += _differences(comm, f"broadcast from {root}", [ours], [theirs])
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            ours = _values(rank, 300, dtype)
            theirs = _wide(ours)
            dist.reduce(ours, dst=root, op=op, group=ours_group)
            dist.reduce(theirs, dst=root, op=op, group=gloo)
            if rank == root:
                failures += _differences(comm, f"reduce {op} to {root}", [ours], [theirs], everywhere=False)
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bfloat16, torch.float32], ids=str)
def test_all_gather_into_a_list_into_a_tensor_and_in_place(comm, groups, dist, dtype):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = _values(rank, 50, dtype).reshape(5, 10)
    failures = []
    ours, theirs = [torch.empty_like(mine) for _ in range(size)], [_wide(torch.empty_like(mine)) for _ in range(size)]
    dist.all_gather(ours, mine, group=ours_group)
    dist.all_gather(theirs, _wide(mine), group=gloo)
    failures += _differences(comm, "all_gather", ours, theirs)
    ours, theirs = mine.new_empty(size * 5, 10), _wide(mine.new_empty(size * 5, 10))
    dist.all_gather_single(ours, mine, group=ours_group)
    dist.all_gather_single(theirs, _wide(mine), group=gloo)
    failures += _differences(comm, "all_gather_single", [ours], [theirs])
    in_place = mine.new_zeros(size * 50)
    in_place[rank * 50:(rank + 1) * 50] = mine.reshape(-1)  # as FSDP gathers: its shard is a view of the output
    dist.all_gather_single(in_place, in_place[rank * 50:(rank + 1) * 50], group=ours_group)
    failures += _differences(comm, "all_gather_single in place", [in_place], [theirs.reshape(-1)])
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.float32], ids=str)
def test_reduce_scatter_of_a_list_and_of_a_tensor(comm, groups, dist, dtype):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX] + ([dist.ReduceOp.AVG] if dtype.is_floating_point else [])
    for op in ops:
        gloo_op, after = (dist.ReduceOp.SUM, 1 / size) if op == dist.ReduceOp.AVG else (op, 1)
        rtol = 1e-2 if op == dist.ReduceOp.AVG else 0.0
        inputs = [_values(rank, 7, dtype, salt=block) for block in range(size)]
        ours, theirs = inputs[0].new_empty(7), _wide(inputs[0].new_empty(7))
        dist.reduce_scatter(ours, inputs, op=op, group=ours_group)
        dist.reduce_scatter(theirs, [_wide(t) for t in inputs], op=gloo_op, group=gloo)
        failures += _differences(comm, f"reduce_scatter {op}", [ours], [theirs * after], everywhere=False, rtol=rtol)
        whole = _values(rank, 6 * size, dtype).reshape(size * 2, 3)
        ours, theirs = whole.new_empty(2, 3), _wide(whole.new_empty(2, 3))
        dist.reduce_scatter_single(ours, whole, op=op, group=ours_group)
        dist.reduce_scatter_single(theirs, _wide(whole), op=gloo_op, group=gloo)
        failures += _differences(comm, f"reduce_scatter_single {op}", [ours], [theirs * after], everywhere=False,
                                 rtol=rtol)
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float64], ids=str)
def test_all_to_all_with_even_and_uneven_splits_and_of_lists(comm, groups, dist, dtype):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    mine = _values(rank, 12 * size, dtype).reshape(4 * size, 3)
    ours, theirs = torch.empty_like(mine), _wide(torch.empty_like(mine))
    dist.all_to_all_single(ours, mine, group=ours_group)
    dist.all_to_all_single(theirs, _wide(mine), group=gloo)
    failures += _differences(comm, "all_to_all_single, even", [ours], [theirs], everywhere=False)
    send = [(rank + peer) % 3 for peer in range(size)]  # rows to each peer; some none
    receive = [(peer + rank) % 3 for peer in range(size)]
    mine = _values(rank, 3 * sum(send), dtype).reshape(-1, 3)
    ours, theirs = mine.new_empty(sum(receive), 3), _wide(mine.new_empty(sum(receive), 3))
    dist.all_to_all_single(ours, mine, receive, send, group=ours_group)
    dist.all_to_all_single(theirs, _wide(mine), receive, send, group=gloo)
    failures += _differences(comm, "all_to_all_single, uneven", [ours], [theirs], everywhere=False)
    inputs = [_values(rank, 5, dtype, salt=peer) for peer in range(size)]
    ours, theirs = [torch.empty_like(t) for t in inputs], [_wide(torch.empty_like(t)) for t in inputs]
    dist.all_to_all(ours, inputs, group=ours_group)
    dist.all_to_all(theirs, [_wide(t) for t in inputs], group=gloo)
    failures += _differences(comm, "all_to_all", ours, theirs, everywhere=False)
    inputs = [_values(rank, 1 + peer, dtype, salt=peer) for peer in range(size)]  # gloo takes only equal sizes
    ours = [torch.empty(1 + rank, dtype=dtype) for _ in range(size)]
    dist.all_to_all(ours, inputs, group=ours_group)
    expected = [_values(peer, 1 + rank, dtype, salt=rank) for peer in range(size)]
    failures += _differences(comm, "all_to_all of uneven sizes", ours, expected, everywhere=False)
    assert_everywhere(comm, failures)


def test_gather_and_scatter_to_and_from_every_root(comm, groups, dist):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for root in range(size):
        mine = _values(rank, 9, torch.float32)
        ours = [torch.empty(9) for _ in range(size)] if rank == root else None
        theirs = [torch.empty(9) for _ in range(size)] if rank == root else None
        dist.gather(mine, ours, dst=root, group=ours_group)
        dist.gather(mine, theirs, dst=root, group=gloo)
        if rank == root:
            failures += _differences(comm, f"gather to {root}", ours, theirs, everywhere=False)
        parts = [_values(peer, 4, torch.int64, salt=root) for peer in range(size)] if rank == root else None
        ours, theirs = torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64)
        dist.scatter(ours, parts, src=root, group=ours_group)
        dist.scatter(theirs, parts, src=root, group=gloo)
        failures += _differences(comm, f"scatter from {root}", [ours], [theirs], everywhere=False)
    assert_everywhere(comm, failures)


def test_send_recv_isend_irecv_and_batch_isend_irecv_round_a_ring(comm, groups, dist):
    ours_group, _ = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        pytest.skip("needs a peer")
    after, before = (rank + 1) % size, (rank - 1) % size
    failures = []
    got = torch.empty(5, dtype=torch.bfloat16)
    if rank % 2 == 0:
        dist.send(_values(rank, 5, torch.bfloat16), after, group=ours_group)
        dist.recv(got, before, group=ours_group)
    else:
        dist.recv(got, before, group=ours_group)
        dist.send(_values(rank, 5, torch.bfloat16), after, group=ours_group)
    if not torch.equal(got, _values(before, 5, torch.bfloat16)):
        failures.append(f"send/recv: got {got}")
    got = torch.empty(5, dtype=torch.int64)
    works = [dist.irecv(got, before, group=ours_group, tag=3), dist.isend(_values(rank, 5, torch.int64), after,
                                                                          group=ours_group, tag=3)]
    for work in works:
        work.wait()
    if not torch.equal(got, _values(before, 5, torch.int64)):
        failures.append(f"isend/irecv: got {got}")
    got = torch.empty(4)
    operations = [dist.P2POp(dist.isend, _values(rank, 4, torch.float32), after, group=ours_group),
                  dist.P2POp(dist.irecv, got, before, group=ours_group)]
    for work in dist.batch_isend_irecv(operations):
        work.wait()
    if not torch.equal(got, _values(before, 4, torch.float32)):
        failures.append(f"batch_isend_irecv: got {got}")
    assert_everywhere(comm, failures)


def test_coalesced_forms_and_functional_collectives(comm, groups, dist):
    import torch.distributed._functional_collectives as functional
    from torch.distributed.distributed_c10d import _coalescing_manager

    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    ours = [_values(rank, n, torch.float32) for n in (3, 1000)]
    theirs = [t.clone() for t in ours]
    dist.all_reduce_coalesced(ours, group=ours_group)
    dist.all_reduce_coalesced(theirs, group=gloo)
    failures += _differences(comm, "all_reduce_coalesced", ours, theirs)
    ours = [_values(rank, n, torch.int64) for n in (3, 1000)]
    theirs = [t.clone() for t in ours]
    with _coalescing_manager(group=ours_group, async_ops=True) as manager:
        for tensor in ours:
            dist.all_reduce(tensor, group=ours_group)
    manager.wait()
    for tensor in theirs:
        dist.all_reduce(tensor, group=gloo)
    failures += _differences(comm, "all_reduce under _coalescing_manager", ours, theirs)
    mine = _values(rank, 6 * size, torch.float32)
    reduced = functional.all_reduce(mine, "sum", ours_group).wait()
    gathered = functional.all_gather_tensor(mine[:6], 0, ours_group).wait()
    scattered = functional.reduce_scatter_tensor(mine, "sum", 0, ours_group).wait()
    expected = mine.clone()
    dist.all_reduce(expected, group=gloo)
    every = torch.empty(6 * size)
    dist.all_gather_single(every, mine[:6], group=gloo)
    failures += _differences(comm, "functional all_reduce", [reduced], [expected])
    failures += _differences(comm, "functional all_gather_tensor", [gathered], [every])
    failures += _differences(comm, "functional reduce_scatter_tensor", [scattered], [expected[6 * rank:6 * rank + 6]],
                             everywhere=False)
    assert_everywhere(comm, failures)


ASYNC = pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])


def _finish(work):
    """Wait for what a call with async_op=True returned (a Work, or a Future); a blocking call's None."""
    if work is not None:
        work.wait()


def _shaped(rank, shapes, dtype=torch.int64, salt=0):
    return [_values(rank, int(np.prod(shape)), dtype, salt=salt + i).reshape(shape) for i, shape in enumerate(shapes)]


@ASYNC
@pytest.mark.parametrize("shapes", [[(2,), (2,)], [(2,), (3,), (2, 4)], [(5, 1), (0,), (1,)]],
                         ids=["equal", "unequal", "with-an-empty-one"])
def test_all_gather_coalesced_and_all_reduce_coalesced_give_glooss_results(comm, groups, dist, shapes, async_op):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    inputs = _shaped(rank, shapes)
    failures = []
    # torch's outputs are [rank][tensor]: with equal shapes a [tensor][rank] reading is wrong with no error
    ours, theirs = ([[torch.full_like(t, -9) for t in inputs] for _ in range(size)] for _ in range(2))
    _finish(dist.all_gather_coalesced(ours, inputs, group=ours_group, async_op=async_op))
    _finish(dist.all_gather_coalesced(theirs, inputs, group=gloo, async_op=async_op))
    failures += _differences(comm, "all_gather_coalesced", sum(ours, []), sum(theirs, []))
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        ours, theirs = [t.clone() for t in inputs], [t.clone() for t in inputs]
        _finish(dist.all_reduce_coalesced(ours, op=op, group=ours_group, async_op=async_op))
        _finish(dist.all_reduce_coalesced(theirs, op=op, group=gloo, async_op=async_op))
        failures += _differences(comm, f"all_reduce_coalesced {op}", ours, theirs)
    assert_everywhere(comm, failures)


def _gathered_and_scattered_coalesced(dist, group, rank, size, how, async_op):
    """all_gather_single and reduce_scatter_single of several tensors coalesced `how`: under torch's
    _coalescing_manager, through the group's methods as torch's C++ calls them, or as torch's
    functional collectives; the gathered tensors, then the scattered ones."""
    from torch.distributed import _functional_collectives as functional
    from torch.distributed import distributed_c10d as c10d

    mine, wholes = _shaped(rank, [(2, 3), (5,), (1,)]), _shaped(rank, [(2 * size, 3), (5 * size,), (size,)], salt=5)
    gathered = [t.new_full((size * t.shape[0], *t.shape[1:]), -9) for t in mine]
    scattered = [t.new_full((t.shape[0] // size, *t.shape[1:]), -9) for t in wholes]
    if how == "coalescing manager":
        with c10d._coalescing_manager(group=group, async_ops=async_op) as manager:
            for output, tensor in zip(gathered, mine):
                dist.all_gather_single(output, tensor, group=group, async_op=async_op)
        _finish(manager if async_op else None)
        with c10d._coalescing_manager(group=group, async_ops=async_op) as manager:
            for output, tensor in zip(scattered, wholes):
                dist.reduce_scatter_single(output, tensor, group=group, async_op=async_op)
        _finish(manager if async_op else None)
    elif how == "group methods":
        group.allgather_into_tensor_coalesced(gathered, mine, _options(c10d.AllgatherOptions, async_op)).wait()
        group.reduce_scatter_tensor_coalesced(scattered, wholes, _options(c10d.ReduceScatterOptions, async_op)).wait()
    else:
        gathered = [t.wait() for t in functional.all_gather_single_coalesced(mine, group)]
        scattered = [t.wait() for t in functional.reduce_scatter_single_coalesced(wholes, "sum", [0] * 3, group)]
    return gathered, scattered


def _options(kind, async_op: bool):
    """torch's options of a call, as its C++ makes them: waited for at once or not."""
    options = kind()
    options.asyncOp = async_op
    return options


@pytest.mark.parametrize(("how", "async_op"), [("coalescing manager", False), ("coalescing manager", True),
                                               ("group methods", False), ("group methods", True), ("functional", True)],
                         ids=["coalescing-manager-blocking", "coalescing-manager-async", "group-methods-blocking",
                              "group-methods-async", "functional"])
def test_all_gather_into_tensor_and_reduce_scatter_tensor_coalesced_give_glooss_results(comm, groups, dist, how,
                                                                                       async_op):
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    ours = _gathered_and_scattered_coalesced(dist, ours_group, rank, size, how, async_op)
    theirs = _gathered_and_scattered_coalesced(dist, gloo, rank, size, how, async_op)
    failures = _differences(comm, f"all_gather_into_tensor coalesced ({how})", ours[0], theirs[0])
    failures += _differences(comm, f"reduce_scatter_tensor coalesced ({how})", ours[1], theirs[1], everywhere=False)
    assert_everywhere(comm, failures)


@ASYNC
def test_the_base_forms_give_glooss_results(comm, groups, dist, async_op):
    from torch.distributed import distributed_c10d as c10d

    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    mine, whole = _values(rank, 6, torch.int64).reshape(2, 3), _values(rank, 4 * size, torch.int64, salt=1)
    results = []
    for group in (ours_group, gloo):
        gathered, scattered = mine.new_full((2 * size, 3), -9), whole.new_full((4,), -9)
        group._allgather_base(gathered, mine, _options(c10d.AllgatherOptions, async_op)).wait()
        group._reduce_scatter_base(scattered, whole, _options(c10d.ReduceScatterOptions, async_op)).wait()
        results.append((gathered, scattered))
    failures = _differences(comm, "_allgather_base", [results[0][0]], [results[1][0]])
    failures += _differences(comm, "_reduce_scatter_base", [results[0][1]], [results[1][1]], everywhere=False)
    assert_everywhere(comm, failures)


def _reduced_bools(dist, group, op, rank, size, async_op):
    """Every reduction of bool tensors with `op`: name -> (the results, whether every rank holds them)."""
    def bools(salt, count):
        # bit `rank` of the index: any 2 ** size elements in a row hold every combination of the ranks' values
        return (torch.arange(salt, salt + count) >> rank) % 2 == 1

    tensor = bools(0, 48)
    _finish(dist.all_reduce(tensor, op=op, group=group, async_op=async_op))
    results = {"all_reduce": ([tensor], True)}
    tensor = bools(1, 48)
    _finish(dist.reduce(tensor, dst=size - 1, op=op, group=group, async_op=async_op))
    results["reduce"] = [tensor] if rank == size - 1 else [], False
    tensors = [bools(2, 30), bools(3, 7).reshape(7, 1)]
    _finish(dist.all_reduce_coalesced(tensors, op=op, group=group, async_op=async_op))
    results["all_reduce_coalesced"] = tensors, True
    output = torch.zeros(9, dtype=torch.bool)
    _finish(dist.reduce_scatter(output, [bools(4 + 9 * peer, 9) for peer in range(size)], op=op, group=group,
                                async_op=async_op))
    results["reduce_scatter"] = [output], False
    output = torch.zeros(4, 3, dtype=torch.bool)
    _finish(dist.reduce_scatter_single(output, bools(9, 12 * size).reshape(4 * size, 3), op=op, group=group,
                                       async_op=async_op))
    results["reduce_scatter_single"] = [output], False
    return results


@ASYNC
def test_bool_tensors_reduce_with_every_op_as_on_gloo(comm, groups, dist, async_op):
    # gloo 2.13, measured at 2 and 3 ranks: SUM, MAX and BOR are a logical or, PRODUCT, MIN and BAND
    # an and, BXOR an exclusive or (true where an odd number of ranks hold true)
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
               dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        ours = _reduced_bools(dist, ours_group, op, rank, size, async_op)
        theirs = _reduced_bools(dist, gloo, op, rank, size, async_op)
        for name, (results, everywhere) in ours.items():
            failures += _differences(comm, f"{name} {op}", results, theirs[name][0], everywhere=everywhere)
    assert_everywhere(comm, failures)


class _NonContiguous:
    """A tensor's values laid out in a tensor that is not contiguous: a 2-D one transposed in memory,
    any other every other element of a larger tensor whose other elements hold -7 (`untouched()`:
    whether they still do, after the call wrote through it)."""

    def __init__(self):
        self.gaps = []

    def __call__(self, tensor):
        if tensor.dim() == 2 and min(tensor.shape) > 1:
            laid = tensor.t().contiguous().t()
        else:
            padded = torch.full((*tensor.shape, 2), -7, dtype=tensor.dtype)
            padded[..., 0] = tensor
            laid = padded[..., 0]
            self.gaps.append(padded[..., 1])
        assert not laid.is_contiguous()
        return laid

    def untouched(self):
        return all(bool((gap == -7).all()) for gap in self.gaps)


def _every_collective(dist, group, laid, rank, size, async_op):
    """Each collective on `group`, its tensors laid out by `laid` (a tensor -> the same values in the
    layout under test): name -> (the results, whether every rank holds them)."""
    def values(count, salt, *shape):
        return laid(_values(rank, count, torch.int64, salt=salt).reshape(*shape or (count,)))

    def zeros(*shape):
        return laid(torch.zeros(shape, dtype=torch.int64))

    def done(work):
        _finish(work if async_op else None)

    tensor = values(12, 0, 3, 4)
    done(dist.all_reduce(tensor, group=group, async_op=async_op))
    results = {"all_reduce": ([tensor], True)}
    tensor = values(8, 1)
    done(dist.broadcast(tensor, src=size - 1, group=group, async_op=async_op))
    results["broadcast"] = [tensor], True
    tensor = values(8, 2)
    done(dist.reduce(tensor, dst=0, op=dist.ReduceOp.MAX, group=group, async_op=async_op))
    results["reduce"] = [tensor] if rank == 0 else [], False
    outputs = [zeros(2, 3) for _ in range(size)]
    done(dist.all_gather(outputs, values(6, 3, 2, 3), group=group, async_op=async_op))
    results["all_gather"] = outputs, True
    output = zeros(2 * size, 3)
    done(dist.all_gather_single(output, values(6, 4, 2, 3), group=group, async_op=async_op))
    results["all_gather_single"] = [output], True
    output = zeros(5)
    done(dist.reduce_scatter(output, [values(5, 5 + peer) for peer in range(size)], group=group, async_op=async_op))
    results["reduce_scatter"] = [output], False
    output = zeros(2, 2)
    done(dist.reduce_scatter_single(output, values(4 * size, 6, 2 * size, 2), group=group, async_op=async_op))
    results["reduce_scatter_single"] = [output], False
    output = zeros(2 * size, 3)
    done(dist.all_to_all_single(output, values(6 * size, 7, 2 * size, 3), group=group, async_op=async_op))
    results["all_to_all_single"] = [output], False
    send, receive = [(rank + peer) % 3 + 1 for peer in range(size)], [(peer + rank) % 3 + 1 for peer in range(size)]
    output = zeros(sum(receive), 2)
    done(dist.all_to_all_single(output, values(2 * sum(send), 8, sum(send), 2), receive, send, group=group,
                                async_op=async_op))
    results["all_to_all_single with splits"] = [output], False
    outputs = [zeros(4) for _ in range(size)]
    done(dist.all_to_all(outputs, [values(4, 9 + peer) for peer in range(size)], group=group, async_op=async_op))
    results["all_to_all"] = outputs, False
    outputs = [zeros(3) for _ in range(size)] if rank == 0 else None
    done(dist.gather(values(3, 10), outputs, dst=0, group=group, async_op=async_op))
    results["gather"] = outputs or [], False
    output = zeros(3)
    parts = [values(3, 11 + peer) for peer in range(size)] if rank == size - 1 else None
    done(dist.scatter(output, parts, src=size - 1, group=group, async_op=async_op))
    results["scatter"] = [output], False
    tensors = [values(4, 12), values(6, 13, 2, 3)]
    done(dist.all_reduce_coalesced(tensors, group=group, async_op=async_op))
    results["all_reduce_coalesced"] = tensors, True
    outputs = [[zeros(4), zeros(2, 3)] for _ in range(size)]
    done(dist.all_gather_coalesced(outputs, [values(4, 14), values(6, 15, 2, 3)], group=group, async_op=async_op))
    results["all_gather_coalesced"] = sum(outputs, []), True
    return results


@ASYNC
def test_non_contiguous_inputs_and_outputs_give_glooss_results_on_contiguous_ones(comm, groups, dist, async_op):
    # gloo 2.13 reads a strided view as if it were contiguous in all_reduce, broadcast, reduce,
    # reduce_scatter and scatter, and refuses one in all_to_all_single: the reference is gloo's call on
    # contiguous tensors of the same values
    ours_group, gloo = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    laid = _NonContiguous()
    ours = _every_collective(dist, ours_group, laid, rank, size, async_op)
    theirs = _every_collective(dist, gloo, lambda tensor: tensor, rank, size, async_op)
    failures = []
    for name, (results, everywhere) in ours.items():
        failures += _differences(comm, name, [t.contiguous() for t in results], theirs[name][0], everywhere=everywhere)
    if not laid.untouched():
        failures.append("a call wrote between a strided tensor's elements")
    tensor, expected = laid(_values(rank, 6, torch.int64)), _values(rank, 6, torch.int64)
    value = dist.all_reduce(tensor, group=ours_group, async_op=True).get_future().wait()  # as DDP's C++ waits
    dist.all_reduce(expected, group=gloo)
    failures += _differences(comm, "all_reduce's future", [tensor, value[0]], [expected, expected])
    if size > 1:  # gloo refuses non-contiguous tensors to send and recv: the reference is the values sent
        after, before = (rank + 1) % size, (rank - 1) % size
        got = laid(torch.zeros(5, dtype=torch.int64))
        works = [dist.irecv(got, before, group=ours_group), dist.isend(laid(_values(rank, 5, torch.int64)), after,
                                                                        group=ours_group)]
        for work in works:
            work.wait()
        failures += _differences(comm, "isend/irecv", [got], [_values(before, 5, torch.int64)], everywhere=False)
    assert_everywhere(comm, failures)


def test_sparse_tensors_are_refused_by_name_on_every_rank_and_the_group_goes_on(comm, groups, dist):
    ours_group, _ = groups
    rank, size = comm.Get_rank(), comm.Get_size()

    def sparse():
        return torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))

    def dense(count=4):
        return torch.ones(count)

    group = {"group": ours_group}
    calls = {  # the name each says: the call's
        "all_reduce": lambda: dist.all_reduce(sparse(), **group),
        "all_reduce, async": lambda: dist.all_reduce(sparse(), async_op=True, **group).wait(),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([dense(), sparse()], **group),
        "broadcast": lambda: dist.broadcast(sparse(), src=0, **group),
        "reduce": lambda: dist.reduce(sparse(), dst=0, **group),
        "all_gather": lambda: dist.all_gather([dense() for _ in range(size)], sparse(), **group),
        "all_gather, into a sparse output": lambda: dist.all_gather([sparse() for _ in range(size)], dense(), **group),
        "all_gather_coalesced": lambda: dist.all_gather_coalesced([[dense()] for _ in range(size)], [sparse()], **group),
        "all_gather_into_tensor": lambda: dist.all_gather_single(dense(4 * size), sparse(), **group),
        "reduce_scatter": lambda: dist.reduce_scatter(dense(), [sparse() for _ in range(size)], **group),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_single(
            dense(), torch.sparse_coo_tensor([[0]], [1.0], (4 * size,)), **group),
        "all_to_all_single": lambda: dist.all_to_all_single(dense(4 * size), torch.sparse_coo_tensor(
            [[0]], [1.0], (4 * size,)), **group),
        "all_to_all": lambda: dist.all_to_all([dense() for _ in range(size)], [sparse() for _ in range(size)], **group),
        "gather": lambda: dist.gather(sparse(), [dense() for _ in range(size)] if rank == 0 else None, dst=0, **group),
        "scatter": lambda: dist.scatter(sparse(), [dense() for _ in range(size)] if rank == 0 else None, src=0,
                                        **group),  # on every rank: the inputs are the root's alone
    }
    if size > 1:
        calls["send"] = lambda: dist.send(sparse(), (rank + 1) % size, **group)
    failures = []
    for what, call in calls.items():
        name = what.split(",")[0]
        try:
            call()
            failures.append(f"{what}: no error")
        except NotImplementedError as error:
            if f"ringtree's torch backend: {name} of a sparse tensor (layout torch.sparse_coo) is not supported" \
                    not in str(error):
                failures.append(f"{what}: {error}")
        except Exception as error:  # any other: named in the failure
            failures.append(f"{what}: {type(error).__name__}: {error}")
    tensor = torch.full((3,), float(rank))
    dist.all_reduce(tensor, group=ours_group)
    if not torch.equal(tensor, torch.full((3,), float(sum(range(size))))):
        failures.append(f"the next all_reduce gave {tensor.tolist()}")
    assert_everywhere(comm, failures)


def test_lists_of_the_wrong_length_and_mismatched_outputs_are_a_clear_error_before_any_message(comm, groups, dist):
    ours_group, _ = groups
    rank, size = comm.Get_rank(), comm.Get_size()
    group = {"group": ours_group}

    def empties(count, shape=(2,), dtype=torch.float32):
        return [torch.empty(shape, dtype=dtype) for _ in range(count)]

    calls = [
        (ValueError, "all_gather_coalesced", f"the list of outputs holds {size + 1} lists, not one per rank ({size})",
         lambda: dist.all_gather_coalesced([empties(1) for _ in range(size + 1)], [torch.ones(2)], **group)),
        (ValueError, "all_gather_coalesced", "an output list holds 1 tensors, not one per input (2)",
         lambda: dist.all_gather_coalesced([empties(1) for _ in range(size)], [torch.ones(2), torch.ones(2)],
                                           **group)),
        (ValueError, "all_gather_coalesced", "its own output has 3 elements, its input 2",
         lambda: dist.all_gather_coalesced([empties(1, (3,)) for _ in range(size)], [torch.ones(2)], **group)),
        (TypeError, "all_gather_coalesced", "an output's dtype is not its input's, torch.int64",
         lambda: dist.all_gather_coalesced([empties(1) for _ in range(size)], [torch.ones(2, dtype=torch.int64)],
                                           **group)),
        (ValueError, "all_gather", f"an output list holds {size + 1} tensors, not one per rank ({size})",
         lambda: dist.all_gather(empties(size + 1), torch.ones(2), **group)),
        (ValueError, "reduce_scatter", f"an input list holds {size + 1} tensors, not one per rank ({size})",
         lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2) for _ in range(size + 1)], **group)),
        (ValueError, "all_to_all", f"the list of outputs holds {size + 1} tensors, not one per rank ({size})",
         lambda: dist.all_to_all(empties(size + 1), [torch.ones(2) for _ in range(size + 1)], **group)),
        (ValueError, "all_reduce", "an output of shape (4,), strides (0,), has elements that share memory",
         lambda: dist.all_reduce(torch.ones(1).expand(4), **group)),
        (TypeError, "all_reduce", "RedOpType.AVG of bool tensors is not defined",
         lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG, **group)),
    ]
    failures = []
    for kind, name, says, call in calls:
        try:
            call()
            failures.append(f"{name} ({says}): no error")
        except kind as error:
            if f"ringtree {name} on rank {rank}: {says}" not in str(error):
                failures.append(f"{name}: {error}")
        except Exception as error:  # any other: named in the failure
            failures.append(f"{name} ({says}): {type(error).__name__}: {error}")
    tensor = torch.full((3,), float(rank))
    dist.all_reduce(tensor, group=ours_group)  # every rank raised before any message: the group goes on
    if not torch.equal(tensor, torch.full((3,), float(sum(range(size))))):
        failures.append(f"the next all_reduce gave {tensor.tolist()}")
    assert_everywhere(comm, failures)


def test_async_work_waits_completes_and_gives_a_future_of_its_tensors(comm, groups, dist):
    ours_group, _ = groups
    size = comm.Get_size()
    tensors = [torch.ones(n) for n in (10, 100_000)]
    works = [dist.all_reduce(t, group=ours_group, async_op=True) for t in tensors]
    futures = [work.get_future() for work in works]  # completed by the progress thread: nobody waits here
    values = [future.wait() for future in futures]
    failures = [f"future {i} gave {v}" for i, v in enumerate(values) if not (len(v) == 1 and v[0] is not None
                                                                           and torch.equal(v[0], torch.full_like(v[0], size)))]
    failures += [f"work {i} not completed after its future" for i, w in enumerate(works) if not w.is_completed()]
    work = dist.broadcast(tensors[0], src=0, group=ours_group, async_op=True)
    if work.wait() is not True:
        failures.append("wait() did not return True")
    chained = dist.all_reduce(torch.ones(4), group=ours_group, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    if not torch.equal(chained.wait(), torch.full((4,), 2.0 * size)):
        failures.append(f"a chained future gave {chained.wait()}")
    dist.barrier(group=ours_group)
    assert_everywhere(comm, failures)


def test_bad_input_is_a_clear_error_before_any_message(comm, groups, dist):
    ours_group, _ = groups
    rank = comm.Get_rank()
    with pytest.raises(ValueError, match=f"on rank {rank}: .*input_split_sizes"):
        dist.all_to_all_single(torch.empty(3), torch.empty(3), [1] * comm.Get_size(), [5] * comm.Get_size(),
                               group=ours_group)
    with pytest.raises(NotImplementedError, match="recv from any source"):
        dist.recv(torch.empty(1), group=ours_group)
    dist.barrier(group=ours_group)  # every rank is still in step
    assert_everywhere(comm, [])


def test_ranks_that_disagree_on_a_count_all_get_ringtrees_mismatch_error(comm, dist):
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    group = dist.new_group(backend="ringtree")  # of its own: the failed call stays there
    failures = []
    try:
        dist.all_reduce(torch.ones(10 + comm.Get_rank()), group=group)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"on rank {comm.Get_rank()}" not in str(error):
            failures.append(str(error))
    assert_everywhere(comm, failures)


def test_ranks_whose_all_to_all_splits_disagree_all_get_ringtrees_mismatch_error_and_the_group_goes_on(comm, dist):
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2:
        pytest.skip("needs two ranks to disagree")
    send = [1 + rank] * size  # rank s sends every rank 1 + s rows; rank 1 expects one more from rank 0
    receive = [1 + s + (rank == 1 and s == 0) for s in range(size)]
    failures = []
    try:
        dist.all_to_all_single(torch.empty(sum(receive)), torch.ones(sum(send)), receive, send)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if "rank 0 sends rank 1 1 elements, rank 1 expects 2" not in str(error):
            failures.append(str(error))
    receive = [1 + s for s in range(size)]
    out = torch.empty(sum(receive))
    dist.all_to_all_single(out, torch.full((sum(send),), float(rank)), receive, send)
    if not torch.equal(out, torch.cat([torch.full((1 + s,), float(s)) for s in range(size)])):
        failures.append(f"the next call gave {out.tolist()}")
    assert_everywhere(comm, failures)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


class _Transformer(torch.nn.Module):
    """A small transformer encoder over token sequences, classifying each sequence."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 32)
        self.layers = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
                                          for _ in range(2))
        self.head = torch.nn.Linear(32, 10)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def _batches(rank, model_name, steps=4):
    data = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=data) if model_name == "mlp" else torch.randint(0, 50, (16, 12), generator=data)
        yield x, torch.randint(0, 10, (16,), generator=data)


def _trained(group, model_name, wrap):
    """A model trained a few steps on each rank's own data, wrapped by `wrap(model, group)`; its
    parameters, whole, flattened."""
    torch.manual_seed(0)
    model = _mlp() if model_name == "mlp" else _Transformer()
    wrapped = wrap(model, group)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    for x, y in _batches(group.rank(), model_name):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(wrapped(x), y).backward()
        optimizer.step()
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([p.detach().reshape(-1) for p in whole])


def _ddp(model, group):
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)  # several buckets


def _fsdp2(model, group):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    layers = getattr(model, "layers", None) or [m for m in model if isinstance(m, torch.nn.Linear)]
    for layer in layers:  # each layer a unit of its own, as FSDP2's examples shard a transformer
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
@pytest.mark.parametrize("wrap", [_ddp, _fsdp2], ids=["ddp", "fsdp2"])
def test_training_on_ringtrees_group_ends_where_gloo_does_and_the_same_on_every_rank(comm, groups, wrap, model_name):
    ours_group, gloo = groups
    ours = _trained(ours_group, model_name, wrap)
    theirs = _trained(gloo, model_name, wrap)
    failures = []
    if not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6):
        failures.append(f"up to {float((ours - theirs).abs().max()):.2e} from gloo's parameters")
    if not same_on_all_ranks(comm, ours.numpy()):
        failures.append("the ranks' parameters differ")
    assert_everywhere(comm, failures)


def test_a_group_of_some_ranks_is_an_mpi_communicator_of_those_ranks(comm, dist):
    evens = list(range(0, comm.Get_size(), 2))
    group = dist.new_group(evens, backend="ringtree")
    failures = []
    if comm.Get_rank() % 2:
        if group != dist.GroupMember.NON_GROUP_MEMBER:
            failures.append(f"an odd rank got {group}")
    else:
        tensor = torch.tensor([float(comm.Get_rank())])
        dist.all_reduce(tensor, group=group)
        ranks = MPI.Group.Translate_ranks(group.comm.Get_group(), list(range(len(evens))), comm.Get_group())
        if tensor.item() != sum(evens) or list(ranks) != evens or dist.get_backend(group) != "ringtree":
            failures.append(f"sum {tensor.item()}, ranks {ranks}, backend {dist.get_backend(group)}")
    assert_everywhere(comm, failures)


RENDEZVOUS = """
    import os, sys
    import torch, torch.distributed as dist
    from mpi4py import MPI
    import ringtree.torch
    rank, how = MPI.COMM_WORLD.Get_rank(), sys.argv[1]
    if how == "wrong rank":
        try:
            dist.init_process_group("ringtree", rank=1 - rank, world_size=2)
        except ValueError as error:
            print(f"rank {rank}: {error}")
        sys.exit(0)
    if how == "torch's env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK=str(rank), WORLD_SIZE="2")
        dist.init_process_group("ringtree")
    else:
        dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank, world_size=2)
    tensor = torch.tensor([rank + 1.0])
    dist.all_reduce(tensor)
    print(f"rank {rank}: {dist.get_backend()} sum {tensor.item()}")
    dist.destroy_process_group()
"""


@pytest.mark.slow
@one_rank_only
@pytest.mark.parametrize("how", ["wrong rank", "torch's env", "tcp init_method"])
def test_a_rank_and_world_size_that_disagree_with_mpi_are_refused_and_torchs_own_rendezvous_are_honoured(how):
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    run = run_mpiexec(2, "-c", textwrap.dedent(RENDEZVOUS), how, str(port), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        if how == "wrong rank":
            assert (f"rank {rank}: ringtree: torch was given rank {1 - rank}, but MPI says {rank} (rank {rank} of 2); "
                    "under mpiexec, leave rank and world_size out") in run.stdout, run.stdout + run.stderr
        else:
            assert f"rank {rank}: ringtree sum 3.0" in run.stdout, run.stdout + run.stderr


DIES = """
    import os, pathlib, sys
    import torch, torch.distributed as dist
    from mpi4py import MPI
    import ringtree, ringtree.torch
    dist.init_process_group("ringtree")
    rank = dist.get_rank()
    work = dist.all_reduce(torch.ones(16 << 20), async_op=True)
    if rank == 1:
        work.is_completed()
        os._exit(3)
    try:
        work.wait()
    except ringtree.PeerFailure as error:
        pathlib.Path(sys.argv[1], f"rank-{rank}.txt").write_text(str(error))  # the job's abort may cut its output
        raise
"""


@pytest.mark.slow
@one_rank_only
@pytest.mark.skipif("MPICH" not in MPI.Get_library_version(), reason="-disable-auto-cleanup is MPICH's launcher's")
def test_a_rank_that_dies_raises_peer_failure_on_the_survivors_and_the_job_ends(tmp_path):
    started = time.perf_counter()
    run = run_mpiexec(3, "-c", textwrap.dedent(DIES), str(tmp_path), options=["-disable-auto-cleanup"], timeout=120)
    assert run.returncode != 0
    assert time.perf_counter() - started < 90
    reports = [path.read_text() for path in sorted(pathlib.Path(tmp_path).glob("rank-*.txt"))]
    assert reports, run.stdout + run.stderr
    for report in reports:
        assert "the MPI failed a message with rank 1" in report, report


TIMEOUTS = """
    import datetime, pathlib, sys, time
    import torch, torch.distributed as dist
    import ringtree, ringtree.torch
    dist.init_process_group("ringtree")
    rank, folder = dist.get_rank(), pathlib.Path(sys.argv[1])
    calls = {
        "barrier": lambda g: dist.barrier(group=g),
        "all_reduce": lambda g: dist.all_reduce(torch.ones(10), group=g),
        "all_reduce, async": lambda g: dist.all_reduce(torch.ones(1 << 16), group=g, async_op=True).wait(),
        "broadcast": lambda g: dist.broadcast(torch.ones(10), src=1, group=g),
        "gather": lambda g: dist.gather(torch.ones(3), [torch.empty(3), torch.empty(3)] if rank == 0 else None, dst=0,
                                        group=g),
        "recv": lambda g: dist.recv(torch.empty(3), src=1, group=g) if rank == 0 else dist.send(torch.ones(3), 0, g),
        # large: MPI sends it only once the receive is posted, which MPI cannot cancel, so it is let go
        "send": lambda g: dist.send(torch.ones(1 << 20), 1, g) if rank == 0 else dist.recv(torch.empty(1 << 20), 0, g),
    }
    lines = []
    for label, call in calls.items():
        group = dist.new_group(backend="ringtree", timeout=datetime.timedelta(seconds=1))
        dist.barrier(group=group)  # every rank has set it up
        if rank == 1:
            time.sleep(2.5)  # later than the group's timeout
        started = time.perf_counter()
        try:
            call(group)
            outcome = "returned"
        except ringtree.TimeoutError as error:
            outcome = "given up" if "gave this call up after its timeout" in str(error) else "TimeoutError"
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}"
        lines.append(f"{label}: {outcome} after {time.perf_counter() - started:.1f} s")
    (folder / f"rank-{rank}.txt").write_text("\\n".join(lines))
"""


@pytest.mark.slow
@one_rank_only
def test_every_wait_keeps_the_groups_timeout_and_a_late_rank_raises_too(tmp_path):
    # As gloo's: a peer that does not come within the group's timeout is an error on the rank that
    # waits, and the rank that comes late raises too, as the others gave the call up.
    run = run_mpiexec(2, "-c", textwrap.dedent(TIMEOUTS), str(tmp_path), timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    waited, late = ((tmp_path / f"rank-{rank}.txt").read_text().splitlines() for rank in (0, 1))
    assert len(waited) == len(late) == 7, run.stdout + run.stderr
    for line in waited:
        outcome, seconds = line.split(": ", 1)[1].rsplit(" after ", 1)
        assert outcome == "TimeoutError" and 1 <= float(seconds.split()[0]) < 2.5, line
    for line in late:
        label, outcome = line.split(": ", 1)
        # a send or receive has no call to give up: the late rank's part of it ends as MPI's
        assert outcome.startswith("returned" if label in ("recv", "send") else "given up"), line
