"""The schedule IR, its builder and the passes from schedule to schedule; no MPI, no numpy.

collectives  the registry of collectives: one CollectiveKind each, what differs between them
ir        Ref, Op, OpKind, Schedule and the ScheduleBuilder that derives dependencies
order     the orders a schedule runs in: dataflow, and the steps of the stepwise path
pipeline  segmenting: every op split into segments, scratch into a window of slots
staging   messages through host memory, for device buffers an MPI cannot take
lower     Shape -> Program: the one place where a call's shape picks the passes

`lower` and the generators it calls are imported by their full path: the
generators import this package.
"""

from .ir import INPUT, OUTPUT, Op, OpKind, Ref, Schedule, ScheduleBuilder, even_chunks, single_rank
from .order import Dataflow, dataflow, steps, stepwise

__all__ = ["INPUT", "OUTPUT", "Op", "OpKind", "Ref", "Schedule", "ScheduleBuilder", "even_chunks", "single_rank",
           "Dataflow", "dataflow", "steps", "stepwise"]
