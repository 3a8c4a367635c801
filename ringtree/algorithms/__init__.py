"""The catalogue of allreduce schedule generators: name -> (nranks, rank, count) -> Schedule.

Generators are pure: they import no MPI and no array library.
"""

from .double_tree import double_tree_allreduce
from .rabenseifner import rabenseifner_allreduce
from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allreduce
from .tree import tree_allreduce

ALGORITHMS = {
    "ring": ring_allreduce,
    "tree": tree_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "double_tree": double_tree_allreduce,
}
