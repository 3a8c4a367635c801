"""CUDA tensors through ringtree.allreduce and the DDP hook: on a machine with a GPU, torch built with
CUDA and CuPy (scripts/gpu-check runs it there); skipped elsewhere."""

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, same_on_all_ranks, torch_groups

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_a_cuda_tensor_out_of_place_and_in_place_gives_mpis_sum(comm, dtype):
    rank = comm.Get_rank()
    values = (np.arange(100_000) * (rank + 1) + rank) % 7 - 3
    expected = np.empty(values.size, np.float64)
    comm.Allreduce(values.astype(np.float64), expected)
    tensor = torch.tensor(values, device="cuda").to(dtype)
    result = ringtree.allreduce(tensor, comm=comm)
    failures = []
    if not (isinstance(result, torch.Tensor) and result.is_cuda and result.dtype is dtype):
        failures.append(f"out of place gave {type(result).__name__}")
    elif not torch.equal(result.cpu(), torch.tensor(expected).to(dtype)):
        failures.append("out of place: wrong sum")
    ringtree.allreduce(MPI.IN_PLACE, tensor, comm=comm)
    if not torch.equal(tensor.cpu(), torch.tensor(expected).to(dtype)):
        failures.append("in place: wrong sum")
    assert_everywhere(comm, failures)


def test_ddp_on_cuda_with_ringtrees_hook_is_the_same_on_every_rank(comm):
    from torch.nn.parallel import DistributedDataParallel

    import ringtree.torch

    gloo = torch_groups()[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
    ddp = DistributedDataParallel(model, process_group=gloo, bucket_cap_mb=0.02)
    ddp.register_comm_hook(MPI.COMM_WORLD, ringtree.torch.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(comm.Get_rank())
    for _ in range(3):
        x, y = torch.randn(32, 64, generator=data).cuda(), torch.randint(0, 10, (32,), generator=data).cuda()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    weights = np.concatenate([p.detach().cpu().numpy().ravel() for p in model.parameters()])
    assert_everywhere(comm, [] if same_on_all_ranks(comm, weights) else ["ranks differ"])
