"""What safety by default costs: allreduce with RINGTREE_SIGNATURES on and off, with the engine's
thread lock and without it, and native MPI, in one run.

    mpiexec -n 2 python scripts/safety-cost.py [--sizes 8,1M] [--algorithms auto,ring] [--iters 31] [--threaded]
                                               [--nonblocking] [--shared]

Each setting of RINGTREE_SIGNATURES gets a communicator of its own (the setting
is read when ringtree sets a communicator up). "no lock" is the default with
the engine's lock (in_flight.LOCK) swapped for one that does nothing, for its
turns only: what the lock costs a single thread. With --threaded a second
thread has called ringtree first, so calls take the paths of a program with
several threads, and "no lock" swaps out the check that one thread at a time
is in a call on a communicator (threads.enter_call) as well. With
--nonblocking each call is iallreduce(...).wait() (the engine). With --shared
the calls come from a second thread, on communicators the first thread set
up, so that each blocking call ends with every rank confirming it
(runtime/session/one_caller.py); "own" is a communicator the second thread set up,
whose calls are not confirmed. Online tuning's
trials are run first. Timing is bench's (turns in shuffled order, medians of the slowest
rank).
"""

import argparse
import contextlib
import os
import sys
import threading

import numpy as np
from mpi4py import MPI

from ringtree import settings
from ringtree.allreduce import allreduce, iallreduce
from ringtree.commands.arguments import format_size, parse_size
from ringtree.commands.measure import time_in_turns
from ringtree.runtime.engine import in_flight
from ringtree.runtime.engine import pipelined as engine
from ringtree.runtime.session import one_caller

WARM_UP = 60  # calls per size and algorithm: past online tuning's trials
LOCK, NO_LOCK = in_flight.LOCK, contextlib.nullcontext()
ALLREDUCE_MODULE = sys.modules["ringtree.allreduce"]  # the package's ringtree.allreduce is the function


ENTER_CALL = one_caller.enter_call


def locking(lock) -> None:
    engine.LOCK = in_flight.LOCK = ALLREDUCE_MODULE.LOCK = lock  # the engine's uses, and allreduce's as it starts one
    one_caller.enter_call = ENTER_CALL if lock is LOCK else (lambda comm, second: None)


def communicator_with(signatures: str) -> MPI.Comm:
    os.environ["RINGTREE_SIGNATURES"] = signatures
    settings.reload()
    comm = MPI.COMM_WORLD.Dup()
    allreduce(np.ones(1), comm=comm)  # sets ringtree up on it, with this setting
    return comm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,1M")
    parser.add_argument("--algorithms", default="auto,recursive_doubling,tree,ring")
    parser.add_argument("--iters", type=int, default=31)
    parser.add_argument("--threaded", action="store_true", help="after a second thread has called ringtree")
    parser.add_argument("--nonblocking", action="store_true", help="iallreduce(...).wait() instead of allreduce")
    parser.add_argument("--shared", action="store_true",
                        help="from a second thread, on communicators the first thread set up: each call confirmed")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if args.threaded or args.shared:
        second = threading.Thread(target=allreduce, args=(np.ones(1),), kwargs=dict(comm=world.Dup()))
        second.start()
        second.join()
    on, off = communicator_with("1"), communicator_with("0")
    if not args.shared:
        measure(args, world, on, off, None)
        return
    measuring = threading.Thread(target=lambda: measure(args, world, on, off, communicator_with("1")))
    measuring.start()
    measuring.join()


def measure(args, world, on, off, own) -> None:
    """The table: each size and algorithm timed in turns on `on`, `off` and, if given, `own`."""
    ours = (lambda *a, **k: iallreduce(*a, **k).wait()) if args.nonblocking else allreduce
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, float64 sum, medians of {args.iters} turns"
              f"{', after a second thread has called' if args.threaded else ''}"
              f"{', from a thread on communicators another set up' if own is not None else ''}"
              f"{', iallreduce(...).wait()' if args.nonblocking else ''}\n\n"
              "| size | algorithm | native µs | signatures off µs | on (default) µs | on, no lock µs | on / off | lock's cost |"
              + (" own µs | on / own |" if own is not None else "") + "\n"
              "|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if own is not None else ""))
    for nbytes in map(parse_size, args.sizes.split(",")):
        data = np.ones(max(1, nbytes // 8))
        out = np.empty_like(data)
        for algorithm in args.algorithms.split(","):
            def unlocked(data=data, out=out, a=algorithm):
                locking(NO_LOCK)
                try:
                    ours(data, out, comm=on, algorithm=a)
                finally:
                    locking(LOCK)

            calls = {"native": lambda data=data, out=out: world.Allreduce(data, out),
                     "off": lambda data=data, out=out, a=algorithm: ours(data, out, comm=off, algorithm=a),
                     "on": lambda data=data, out=out, a=algorithm: ours(data, out, comm=on, algorithm=a),
                     "no lock": unlocked}
            if own is not None:
                calls["own"] = lambda data=data, out=out, a=algorithm: ours(data, out, comm=own, algorithm=a)
            for call in calls.values():
                for _ in range(WARM_UP):
                    call()
            median = time_in_turns(world, calls, 0.01, args.iters, 3.0)
            if world.Get_rank() == 0:
                print(f"| {format_size(nbytes)} | {algorithm} | {median['native'] * 1e6:.2f} | {median['off'] * 1e6:.2f} | "
                      f"{median['on'] * 1e6:.2f} | {median['no lock'] * 1e6:.2f} | {median['on'] / median['off']:.3f} | "
                      f"{median['on'] / median['no lock'] - 1:+.1%} |"
                      + (f" {median['own'] * 1e6:.2f} | {median['on'] / median['own']:.3f} |" if own is not None else ""),
                      flush=True)


if __name__ == "__main__":
    main()
