"""What executes a call: a schedule compiled for a rank (compiled), run by the pipelined engine
(pipelined) or a step at a time (stepwise), every collective in flight in one list (in_flight, with
its progress thread for requests waited on inside MPI: progress); MPI's own collectives (native,
roots, passed_through); calls with no element (empty); the timeline. Imports the safety net and the
transports."""
