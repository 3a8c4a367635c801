"""The torch.distributed backend "ringtree", registered by `import ringtree.torch`: under mpiexec,
`dist.init_process_group("ringtree")` needs no other argument.

Rank and world size come from MPI. torch's default `env://` rendezvous needs a key-value store; where
MASTER_ADDR and MASTER_PORT are not both set, ringtree's handler of `env://` makes one over MPI
instead: rank 0 starts torch's TCPStore on a port the system picks and sends its host and port to
the others (so gloo groups made beside a ringtree one work with no setup either). Given
MASTER_ADDR and MASTER_PORT, torch's own handler runs; `init_method`, `store`, `rank` and
`world_size` given by the user are honoured where they agree with MPI and refused, by name, where not.

Each group is an MPI communicator of its ranks (COMM_WORLD's for the default group, a new one of
the global ranks for `new_group`), which torch_group.ProcessGroup serves.
"""

from __future__ import annotations

import socket
import sys

import torch.distributed as dist
from mpi4py import MPI

from ..settings import torch_rendezvous
from .torch_group import ProcessGroup

__all__ = ["NAME", "register"]

NAME = "ringtree"


def register() -> None:
    """Make "ringtree" a torch.distributed backend (CPU and CUDA), and env:// work under mpiexec."""
    if NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create_group, extended_api=True, devices=["cpu", "cuda"])
    # Replaced in torch's table (register_rendezvous_handler refuses a second handler of a scheme); the
    # module by its name, as torch.distributed.rendezvous is the function.
    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    torch_env = handlers["env"]

    def env_or_mpi(url: str, timeout=dist.constants.default_pg_timeout, **kwargs):
        given = torch_rendezvous()
        if "MASTER_ADDR" in given and "MASTER_PORT" in given:
            return torch_env(url, timeout=timeout, **kwargs)
        return _mpi_rendezvous(url, timeout)

    handlers["env"] = env_or_mpi


def _mpi_rendezvous(url: str, timeout):
    """env:// without MASTER_ADDR/MASTER_PORT: a TCPStore on rank 0, its address sent over MPI."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    asked = dict(pair.split("=", 1) for pair in url.partition("?")[2].split("&") if "=" in pair)
    environment = torch_rendezvous()
    for what, mine in (("rank", rank), ("world_size", size)):
        given = asked.get(what, environment.get(what.upper()))
        if given is not None and int(given) != mine:
            raise ValueError(f"ringtree: torch was given {what} {given}, but MPI says {mine} (rank {rank} of "
                             f"{size}); under mpiexec, leave rank and world_size out")
    store, address = None, None
    if rank == 0:
        try:
            host = environment.get("MASTER_ADDR") or socket.gethostname()
            store = dist.TCPStore(host, 0, size, True, timeout=timeout, wait_for_workers=False)
            address = (host, store.port)
        except Exception as error:  # any: the other ranks raise it too, rather than wait
            address = error
    address = world.bcast(address)
    if isinstance(address, Exception):
        raise RuntimeError(f"ringtree: rank 0 could not start torch's TCPStore: {address}") from None
    if store is None:
        store = dist.TCPStore(address[0], address[1], size, False, timeout=timeout)
    yield store, rank, size
    raise RuntimeError("ringtree: env:// over MPI cannot rendezvous again")


def _create_group(options, _backend_options=None) -> ProcessGroup:
    """torch's group of `options` (its rank, size, global ranks and timeout) as a ProcessGroup over MPI."""
    world = MPI.COMM_WORLD
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    if options.group_size != len(ranks) or options.group_size > world.Get_size():
        raise ValueError(f"ringtree: torch's group of {options.group_size} ranks does not fit MPI's "
                         f"{world.Get_size()} (rank {world.Get_rank()}); run the job under mpiexec")
    if ranks[options.group_rank] != world.Get_rank():
        raise ValueError(f"ringtree: torch gives this process global rank {ranks[options.group_rank]}, but MPI "
                         f"gives it {world.Get_rank()}; the ranks of torch's default group must be MPI's")
    if ranks == list(range(world.Get_size())):
        comm = world.Dup()
    else:
        comm = world.Create_group(world.Get_group().Incl(ranks))
    timeout = options.timeout.total_seconds() if options.timeout is not None else None
    return ProcessGroup(comm, timeout)
