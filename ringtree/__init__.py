"""ringtree: ring and tree allreduce for mpi4py programs, on numpy buffers.

    from ringtree.allreduce import allreduce, iallreduce
    import ringtree; comm = ringtree.Communicator(MPI.COMM_WORLD)
    bucketer = ringtree.GradientBucketer(gradients)   # fused, overlapped, for training
"""

from .buckets import GradientBucketer
from .communicator import Communicator
from .errors import MismatchError, PeerFailure, TimeoutError

__all__ = ["Communicator", "GradientBucketer", "MismatchError", "PeerFailure", "TimeoutError"]
__version__ = "0.1.0"
