"""What runs a collective call, in five rooms that import one way, each only from those before it:

- `safety`: what every wait watches for, at the bottom: the back-off of the one waiting loop, the
  call signatures that show a mismatch, stall warnings, failed peers, the thread rules' marks;
- `transports`: how bytes move: the array backends (numpy, CuPy, torch), CUDA IPC, which transport
  carries a call to each peer, the pacing of sends to other nodes;
- `engine`: what executes a schedule or MPI's own collective: the pipelined engine, the stepwise
  runner, the list of collectives in flight, MPI's own calls and their roots;
- `session`: a communicator's state and what its calls share: plans by shape, runs bound to arrays,
  small control messages, online tuning's trials;
- `checks`: what a call checks with the other ranks before it runs: the comparison of arguments,
  a refusal that every rank hears.

docs/design.md, "The layout", says more; tests/test_layout.py keeps the order.
"""
