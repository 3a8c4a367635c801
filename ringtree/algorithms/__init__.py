"""The catalogue of allreduce schedule generators: name -> (nranks, rank, count) -> Schedule.

Generators are pure: they import no MPI and no array library.
"""

from .ring import ring_allreduce
from .tree import tree_allreduce

ALGORITHMS = {
    "ring": ring_allreduce,
    "tree": tree_allreduce,
}
