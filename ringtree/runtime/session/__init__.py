"""A communicator's session: its state (state), the plans its call shapes share (plan), runs bound to
a call's arrays (again) and what calls of a shape share (shapes), the thread rules of its calls
(one_caller), its small control messages (small, counts) and online tuning's trials (trials).
Imports the engine, the transports and the safety net."""
