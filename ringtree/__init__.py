"""ringtree: ring, tree and three more allreduce algorithms, and reduce-scatter, allgather, broadcast,
reduce and alltoall, for mpi4py programs, on numpy and CuPy buffers.

    from ringtree.allreduce import allreduce, iallreduce
    from ringtree import reduce_scatter, allgather, broadcast, reduce, alltoall
    import ringtree; comm = ringtree.Communicator(MPI.COMM_WORLD)
    bucketer = ringtree.GradientBucketer(gradients)   # fused, overlapped, for training
    ringtree.register_algorithm("allreduce", "mine", generator)   # a program's own, verified first

The package, from the public face inward (docs/design.md draws it):

api/          the public API: the collectives, Communicator, requests, buckets, DDP hooks, the call path
allreduce, torch                                the import paths `ringtree.allreduce`, `ringtree.torch`
errors, ops, settings, debug, tensors, version  the foundation: errors, reduction ops, every RINGTREE_*
                                                variable, RINGTREE_DEBUG's log, tensors as buffers
schedule/     the IR, its builder and the passes (no MPI, no numpy)
algorithms/   the schedule generators (no MPI, no numpy)
runtime/      the engine, the stepwise path, backends, per-communicator state, reliability, timeline
tuning/       the selector, the cost model, the shipped table
sim/          the simulator, its calibration, the verifier (no MPI)
commands/     python -m ringtree ...; nothing imports them
"""

from .allreduce import Request, allreduce, iallreduce  # ringtree.allreduce: the function (its module: sys.modules)
from .api.buckets import GradientBucketer
from .api.collectives import (
    allgather,
    allgather_init,
    alltoall,
    alltoall_init,
    broadcast,
    broadcast_init,
    iallgather,
    ialltoall,
    ibroadcast,
    ireduce,
    ireduce_scatter,
    reduce,
    reduce_init,
    reduce_scatter,
    reduce_scatter_init,
)
from .api.communicator import Communicator
from .api.persistent import PersistentRequest, allreduce_init
from .api.registration import register_algorithm
from .errors import MismatchError, PeerFailure, TimeoutError
from .settings import SettingError
from .version import __version__

__all__ = ["allreduce", "iallreduce", "allreduce_init", "reduce_scatter", "ireduce_scatter", "reduce_scatter_init",
           "allgather", "iallgather", "allgather_init", "broadcast", "ibroadcast", "broadcast_init", "reduce", "ireduce",
           "reduce_init", "alltoall", "ialltoall", "alltoall_init", "Request", "PersistentRequest", "Communicator",
           "GradientBucketer", "register_algorithm", "MismatchError", "PeerFailure", "TimeoutError", "SettingError",
           "__version__"]
