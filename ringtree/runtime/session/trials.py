"""An `auto` allreduce under online tuning (tuning/online.py): the plan the tuner chooses, and where the
call is a trial, its start on every rank together."""

from __future__ import annotations

import time
from functools import partial

from ...errors import TimeoutError
from ...tuning.online import key_of
from ...tuning.selector import choice_of
from ..engine.in_flight import progress_others
from ..safety.backoff import wait_until
from ..safety.reliability import give_up
from ..safety.stalls import watched
from ..safety.watch import Watch
from .small import slowest

__all__ = ["tuned_plan"]

# Trials of messages under 64 KiB start together (_line_up): their few microseconds would be mostly
# the ranks' skew. Larger ones are timed as they come, back to back with the calls before them, as
# a program runs them (after a barrier, a 256 KiB Rabenseifner in place took half its time in a loop).
LINE_UP_CLASS = 16


def tuned_plan(state, call, native: bool, timeout, build):
    """(plan, trial) for an "auto" allreduce (`call`, a collective_args.Call) that online tuning
    chooses: the plan of its choice, and the trial the call is, if any; (None, None) where nothing is
    learned and nothing is being learned (the table or the model chooses). `build(choice, plan_key)`
    makes a plan not made before."""
    target = call.target
    key = key_of(target.nbytes, call.inplace, target.dtype.itemsize, native)
    chosen = state.tuner.choose(key, partial(slowest, state, timeout))
    if chosen is None:
        return None, None
    option, why, trial = chosen
    plan_key = (call.collective, call.backend, option, target.size, target.dtype, call.reduce_op)
    plan = state.plans.get(plan_key)
    if plan is None:
        plan = build(choice_of(option.algorithm, target.nbytes, option.segment, why), plan_key)
    if trial is not None and key.size_class <= LINE_UP_CLASS:
        _line_up(state, plan.signature, timeout)
    return plan, trial


def _line_up(state, signature, timeout) -> None:
    """Start a trial on every rank together, so that its time is the call's and not a rank's wait for
    a later one: a barrier, waited for while the collectives in flight progress."""
    request = state.comm.Ibarrier()  # never Barrier: a rank with collectives in flight must poll, and the two do not match
    deadline = None if timeout is None else time.perf_counter() + timeout

    def arrived() -> bool:
        if request.Test():
            return True
        if deadline is not None and time.perf_counter() > deadline:
            state.abandoned.append(request)  # MPI may still complete it, with a late rank
            raise give_up(state, state.calls, TimeoutError(
                f"ringtree allreduce on rank {state.rank} of {state.name}: not every rank came to the barrier "
                f"before a tuning trial (ringtree call #{state.calls}) within {timeout:g} s"))
        return False

    # Backing off: ranks that outnumber the cores must get to run and arrive. Announced: a rank in
    # another call may wait for messages that these ranks send only after the barrier.
    watched(partial(wait_until, arrived, progress_others, 0.0, partial(Watch, state, state.calls, signature, announce=True)),
            f"allreduce on rank {state.rank} of {state.comm.Get_name()}, in the barrier that starts a tuning trial")
