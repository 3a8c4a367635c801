"""Which transport carries a call's messages to each peer.

Host arrays: MPI, which shares memory between the ranks of a node itself (ringtree's own
shared memory was slower at every size: docs/performance.md). Device arrays (a backend with a
device layer, `backend.ipc`): to a rank of the same node, CUDA IPC (ipc.py); to any other, MPI on
device memory where the MPI is CUDA-aware, else staged through pinned host memory (the backend's
`staged`). RINGTREE_TRANSPORT forces one: `ipc` (an error where the device layer is missing),
`direct` or `staged` (no IPC). The node map is MPI's own (CommState.hosts), whatever
RINGTREE_TOPOLOGY says. Every rank of a node decides alike, from settings all ranks
are known to share; RINGTREE_DEBUG=1 logs each peer's transport once per communicator.
"""

from __future__ import annotations

import logging

from ... import settings
from ...debug import log
from .ipc import IpcTransport

__all__ = ["transport_for", "routed"]


def transport_for(state, backend):
    """The transport of `state`'s communicator for `backend`'s arrays (an IpcTransport), or None
    where every peer is reached by MPI."""
    if not backend.device:
        return None
    layer = backend.ipc
    mode = settings.current().transport
    if mode == "ipc" and layer is None:
        name = backend.__name__ if isinstance(backend, type) else type(backend).__name__
        raise RuntimeError(f"ringtree on rank {state.rank}: RINGTREE_TRANSPORT=ipc, but {name} has no IPC layer "
                           "here (RINGTREE_DEBUG=1 says why)")
    if layer is None or mode in ("direct", "staged"):
        return None
    if layer not in state.transports:
        node = state.hosts.node_of
        peers = frozenset(r for r in range(state.size) if r != state.rank and node[r] == node[state.rank])
        state.transports[layer] = IpcTransport(layer, state.comm, peers) if peers else None
        _log_peers(state, f"{layer.name} transports", peers, "IPC",
                   "staged through host memory" if backend.staged else "MPI on device memory")
    return state.transports[layer]


def _log_peers(state, what: str, peers, reached: str, beyond: str) -> None:
    """With RINGTREE_DEBUG: how this rank reaches each rank, `reached` for `peers`, else `beyond`."""
    if log.isEnabledFor(logging.INFO):
        log.info("%s on %s: %s", what, state.name, ", ".join(
            f"rank {r}: {'self' if r == state.rank else reached if r in peers else beyond}" for r in range(state.size)))


def routed(state, backend, choice, segment: int | None):
    """The call's transport (or None), the peers whose messages are never staged (IPC's), and
    `choice` unsegmented where every peer is reached by IPC and the caller left the segment open:
    there each message costs a header, an ack and a copy's launch (tens of microseconds of Python
    and CUDA), and copies and reductions share the devices' memory anyway."""
    transport = transport_for(state, backend)
    if transport is None or not backend.device:
        return transport, frozenset(), choice
    if segment is None and len(transport.peers) == state.size - 1:
        choice = choice._replace(segment=0)
    return transport, transport.peers, choice
