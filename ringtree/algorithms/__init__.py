"""The catalogue of allreduce schedule generators: name -> (nranks, rank, count) -> Schedule.

Generators are pure: they import no MPI and no array library.
"""

from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allreduce
from .tree import tree_allreduce

ALGORITHMS = {
    "ring": ring_allreduce,
    "tree": tree_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
}
