"""What executes a call: a schedule compiled for a rank (compiled), run by the pipelined engine
(pipelined) or a step at a time (stepwise), every collective in flight in one list (in_flight, with
the thread that moves requests waited on inside MPI); MPI's own collectives (native, its calls in
mpi_calls, roots, passed_through); calls with no element (empty); the timeline. Imports the safety net and the
transports."""
