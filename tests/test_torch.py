"""torch tensors through the functional API and ringtree.Communicator: out of place, in place, float16
and bfloat16, against MPI's own Allreduce of the same values (and, for bfloat16, which MPI cannot
reduce, against ml_dtypes' additions). Runs where torch is installed (scripts/test makes .venv-torch)."""

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, same_on_all_ranks, torch_groups

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.mpi

DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _values(rank, count=1000):
    """Small integers: exact in every dtype here, in any order of the reduction."""
    return (np.arange(count) * (rank + 1) + rank) % 7 - 3


def _native_sum(comm, values):
    out = np.empty_like(values)
    comm.Allreduce(values, out)
    return out


def _bits(tensor):
    return tensor.view(torch.int16).numpy() if tensor.dtype is torch.bfloat16 else tensor.numpy()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_tensor_out_of_place_and_in_place_gives_mpis_sum_as_a_tensor(comm, dtype):
    rank = comm.Get_rank()
    values = _values(rank)
    expected = torch.tensor(_native_sum(comm, values.astype(np.float64))).to(dtype)
    tensor = torch.tensor(values).to(dtype)
    failures = []
    result = ringtree.allreduce(tensor, comm=comm)
    if not isinstance(result, torch.Tensor) or result.dtype is not dtype or result.shape != tensor.shape:
        failures.append(f"out of place gave {type(result).__name__} {getattr(result, 'dtype', None)}")
    elif not torch.equal(result, expected):
        failures.append(f"out of place: {result[:5]} against MPI's {expected[:5]}")
    if not torch.equal(tensor, torch.tensor(values).to(dtype)):
        failures.append("out of place changed the input")
    same = ringtree.allreduce(MPI.IN_PLACE, tensor, comm=comm)
    if same is not tensor or not torch.equal(tensor, expected):
        failures.append(f"in place: {tensor[:5]}")
    request = ringtree.Communicator(comm).Iallreduce(MPI.IN_PLACE, tensor)
    request.Wait()
    if not torch.equal(tensor, expected * comm.Get_size()):
        failures.append(f"Communicator.Iallreduce in place: {tensor[:5]}")
    if not same_on_all_ranks(comm, _bits(tensor)):
        failures.append("ranks differ")
    assert_everywhere(comm, failures)


def test_a_parameter_that_requires_grad_and_a_2d_tensor(comm):
    weight = torch.nn.Parameter(torch.full((3, 4), float(comm.Get_rank())))
    with torch.no_grad():
        ringtree.allreduce(MPI.IN_PLACE, weight, "avg", comm=comm)
    mean = sum(range(comm.Get_size())) / comm.Get_size()
    ok = weight.requires_grad and torch.equal(weight.detach(), torch.full((3, 4), mean))
    assert_everywhere(comm, [] if ok else [f"got {weight}"])


def test_bfloat16_is_rounded_after_each_addition_as_ml_dtypes_adds(comm):
    """Random bfloat16 values, whose sums round: at 2 ranks the one addition is the same in either
    order, so the result must be ml_dtypes' sum to the bit; at any count, the same bits everywhere."""
    rank, size = comm.Get_rank(), comm.Get_size()
    everyone = [np.random.default_rng([7, r]).standard_normal(4096).astype(ml_dtypes.bfloat16) for r in range(size)]
    tensor = torch.from_numpy(everyone[rank].view(np.int16).copy()).view(torch.bfloat16)
    failures = []
    for algorithm in ("ring", "tree", "recursive_doubling", "auto"):
        result = ringtree.allreduce(tensor, comm=comm, algorithm=algorithm)
        got = result.view(torch.int16).numpy()
        if size == 2:
            want = (everyone[0] + everyone[1]).view(np.int16)
            if not np.array_equal(got, want):
                failures.append(f"{algorithm}: {np.count_nonzero(got != want)} elements differ from ml_dtypes' sum")
        if not same_on_all_ranks(comm, got):
            failures.append(f"{algorithm}: ranks differ")
    assert_everywhere(comm, failures)


@pytest.fixture(scope="module")
def gloo():
    """A gloo group over the MPI ranks, for DDP's own setup and its own allreduce."""
    return torch_groups()[1]


def _ddp_steps(group, hook, steps=5):
    """A small model trained with DDP for a few steps on each rank's own data; its parameters."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.02)  # several buckets: overlap and is_last are used
    if hook is not None:
        ddp.register_comm_hook(MPI.COMM_WORLD, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(MPI.COMM_WORLD.Get_rank())
    for _ in range(steps):
        x, y = torch.randn(32, 64, generator=data), torch.randint(0, 10, (32,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name, tolerance", [("allreduce_hook", 1e-5), ("fp16_compress_hook", 1e-2),
                                              ("bf16_compress_hook", 5e-2)])
def test_ddp_with_ringtrees_hook_matches_ddps_own_allreduce_and_is_the_same_on_every_rank(comm, gloo, name,
                                                                                          tolerance):
    import ringtree.torch

    ours = _ddp_steps(gloo, getattr(ringtree.torch, name))
    theirs = _ddp_steps(gloo, None)
    failures = []
    for a, b in zip(ours, theirs):
        if not torch.allclose(a, b, rtol=tolerance, atol=tolerance):
            failures.append(f"{name}: up to {float((a - b).abs().max()):.2e} from DDP's own allreduce")
            break
    if not same_on_all_ranks(comm, np.concatenate([p.numpy().ravel() for p in ours])):
        failures.append(f"{name}: ranks ended with different parameters")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_other_collectives_take_tensors_and_give_tensors(comm, dtype):
    rank, size = comm.Get_rank(), comm.Get_size()
    values = _values(rank, 4 * size)
    total = _native_sum(comm, values.astype(np.float64))
    tensor = torch.tensor(values).to(dtype)
    failures = []
    block = ringtree.reduce_scatter(tensor, comm=comm)
    if not isinstance(block, torch.Tensor) or not torch.equal(block, torch.tensor(total[4 * rank:4 * rank + 4]).to(dtype)):
        failures.append(f"reduce_scatter gave {block!r}")
    gathered = ringtree.allgather(tensor[:4], comm=comm)
    everyone = np.array(comm.allgather(values[:4]))
    if not isinstance(gathered, torch.Tensor) or not torch.equal(gathered, torch.tensor(everyone).to(dtype)):
        failures.append(f"allgather gave {gathered!r}")
    buf = tensor.clone() if rank == 0 else torch.zeros_like(tensor)
    ringtree.Communicator(comm).Bcast(buf, root=0)
    if not torch.equal(buf, torch.tensor(_values(0, 4 * size)).to(dtype)):
        failures.append(f"Bcast gave {buf[:5]}")
    reduced = ringtree.reduce(tensor, root=size - 1, comm=comm)
    if rank == size - 1 and not torch.equal(reduced, torch.tensor(total).to(dtype)):
        failures.append(f"reduce gave {reduced!r}")
    assert_everywhere(comm, failures)
