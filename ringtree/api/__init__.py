"""The public API: what a program calls, checked and run through the one call path.

allreduce, collectives, persistent    the public functions, blocking, started and persistent
communicator, mpi_style               Communicator: mpi4py's method names and buffer specs
request                               Request, and MPI's own requests beside ringtree's
buckets, torch                        gradient bucketing; DDP comm hooks (the one module that imports torch)
call_path                             the one path: a call checked, its plan found or built, run
collective_args, checks, buffers      a call's arguments checked; what mpi4py takes as a buffer, as arrays
registration                          register_algorithm: a program's own algorithm, verified, then registered

`ringtree` re-exports the public names; `ringtree.allreduce` and `ringtree.torch` keep their import paths.
"""
