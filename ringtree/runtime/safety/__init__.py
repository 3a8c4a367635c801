"""What every wait watches for: the back-off of the one waiting loop (backoff), call signatures and
the mismatches they show (mismatch), what a stalled wait looks at (watch), failed peers (failures,
reliability), stall warnings (stalls) and the threads' marks (threads). Imports no other room of the
runtime."""
