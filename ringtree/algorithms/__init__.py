"""The catalogue of schedule generators: ALGORITHMS, allreduce's, name -> (nranks, rank, count) ->
Schedule; GENERATORS, every collective's, collective -> name -> (nranks, rank, count, Collective) ->
Schedule (allreduce's take the Collective too, and ignore it). The ones named in NODE_AWARE also take
`topology=` (schedule.topology.Topology: which ranks share a node); without it, all ranks are on one node.

Generators are pure: they import no MPI and no array library. A generator may
also declare when its schedules are the same on every rank up to a rotation of
the ranks (TURNING: the simulator then runs every rank's op k at once), or on
every P-th rank (PERIOD: the simulator then runs P ranks for all), and the
schedule tests check the claims.
"""

from .allgather import bruck_allgather, recursive_doubling_allgather, ring_allgather
from .broadcast import binomial_broadcast, chain_broadcast, scatter_allgather_broadcast
from .double_tree import double_tree_allreduce
from .hierarchical import hierarchical_allreduce
from .rabenseifner import rabenseifner_allreduce
from .recursive_doubling import recursive_doubling_allreduce
from .reduce import binomial_reduce, rabenseifner_reduce
from .reduce_scatter import pairwise_reduce_scatter, recursive_halving_reduce_scatter, ring_reduce_scatter
from .ring import ring_allreduce, ring_period, ring_turns
from .tree import tree_allreduce

ALGORITHMS = {
    "ring": ring_allreduce,
    "tree": tree_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "double_tree": double_tree_allreduce,
    "hierarchical": hierarchical_allreduce,
}

# allreduce's generators that take a topology: the ring goes round the ranks node by node, the
# hierarchical allreduce is built of nodes
NODE_AWARE = {"ring", "hierarchical"}
# allreduce's generators whose segmented schedules, where several ranks of a node cross at once and so
# share its link, post receives ahead (schedule/pipeline.py): by rendezvous, one receive at a time on a
# channel leaves the link idle while its go-ahead waits behind the data queued there. Where one channel
# has a link to itself, receives posted ahead share it and each arrives later (docs/design.md, "Pipelining").
RECEIVES_AHEAD = {"hierarchical"}

GENERATORS = {
    "allreduce": {name: (lambda generator: lambda nranks, rank, count, collective, **topology:
                         generator(nranks, rank, count, **topology))(g)
                  for name, g in ALGORITHMS.items()},
    "reduce_scatter": {
        "ring": ring_reduce_scatter,
        "recursive_halving": recursive_halving_reduce_scatter,
        "pairwise": pairwise_reduce_scatter,
    },
    "allgather": {
        "ring": ring_allgather,
        "recursive_doubling": recursive_doubling_allgather,
        "bruck": bruck_allgather,
    },
    "broadcast": {
        "binomial": binomial_broadcast,
        "chain": chain_broadcast,
        "scatter_allgather": scatter_allgather_broadcast,
    },
    "reduce": {
        "binomial": binomial_reduce,
        "rabenseifner": rabenseifner_reduce,
    },
}

# name -> (nranks, count) -> the count C whose rank 0 schedule gives rank r's: every peer p as (p + r) mod
# nranks, every region of chunk c (schedule.even_chunks) moved to chunk (c + r) mod nranks, and the ops
# on chunks empty at `count` left out (C is count where none is empty)
TURNING = {"ring": ring_turns, "hierarchical": ring_turns}  # hierarchical: on one node, the ring
# name -> (nranks, count) -> a P that divides nranks such that rank r + P's schedule is rank r's with
# every peer p as (p + P) mod nranks
PERIOD = {"ring": ring_period, "hierarchical": ring_period}
