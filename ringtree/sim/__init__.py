"""Running every rank's schedule without MPI: the α-β-γ simulator, its calibration, and the verifier.

result       Costs in; SimResult and its Events out
simulator    simulate(): the shortcuts where they hold, else the event simulation
flat         schedules in the compact form the simulation runs, built in parallel at many ranks
events       the event simulation of every rank
turned       the shortcuts: every rank at once (turned), and one period standing for all (periodic)
calibration  the calibration file, and the fit of the costs to measured allreduce times
verify       every rank's schedule on symbolic buffers: an allreduce, and no deadlock

The verifier lives here rather than in schedule/ because it runs schedules
on numpy buffers, and schedule/ imports no numpy.
"""

from .result import Call, Costs, Event, SimResult
from .simulator import simulate

__all__ = ["Call", "Costs", "Event", "SimResult", "simulate"]
