"""ringtree: ring and tree allreduce for mpi4py programs, on numpy buffers.

    from ringtree.allreduce import allreduce, iallreduce
    import ringtree; comm = ringtree.Communicator(MPI.COMM_WORLD)
"""

from .communicator import Communicator

__all__ = ["Communicator"]
__version__ = "0.1.0"
