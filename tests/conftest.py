import faulthandler
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI

MPIEXEC = pathlib.Path(sys.executable).parent / "mpiexec"

# Online tuning keeps what it learns in a cache (rank 0 reads and writes it): the tests' own, never the user's.
_CACHE = tempfile.TemporaryDirectory(prefix="ringtree-test-cache-")
os.environ.setdefault("RINGTREE_CACHE_DIR", _CACHE.name)


def pytest_configure(config):
    # Under mpiexec every rank runs the suite; rank 0 reports in full, the others only failures.
    if MPI.COMM_WORLD.Get_rank() != 0:
        config.option.verbose = -2
    # A stage's time is up (timeout, or mpiexec passing its signal on): say where (a rank whose main thread
    # waits inside MPI says it once that returns, or is killed; scripts/test kills 30 s later).
    _RUNNING[2] = config
    signal.signal(signal.SIGTERM, _stopped)


_RUNNING: list = [None, 0.0, None]  # the test this rank runs, since when, and pytest's configuration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING[:2] = [item.nodeid, time.monotonic()]
    yield
    _RUNNING[0] = None


def _stopped(signum, frame):
    """Say which test this rank was running when its stage ran out of time, and where each thread was."""
    test, since, config = _RUNNING
    capture = config.pluginmanager.getplugin("capturemanager") if config is not None else None
    if capture is not None:
        capture.suspend_global_capture(in_=True)  # as pytest-timeout does: what follows reaches the terminal
    where = f"in {test}, {time.monotonic() - since:.0f} s into it" if test else "between tests"
    sys.stderr.write(f"\n[rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}] stopped (signal {signum}) "
                     f"{where}; its threads:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
    os._exit(124)


@pytest.fixture
def comm():
    return MPI.COMM_WORLD


def assert_everywhere(comm, failures):
    """Collective assertion: fails on every rank if any rank has failures, naming them.

    Every rank must call it, so one rank's failure never leaves the others waiting.
    """
    failures = list(failures)
    everyone = comm.allgather(failures[:5])
    bad = {rank: f for rank, f in enumerate(everyone) if f}
    assert not bad, "failures by rank: " + "; ".join(f"rank {r}: {f}" for r, f in bad.items())


def ipc_failures(ipc, peers) -> list[str]:
    """What is wrong with a communicator's IPC transport `ipc` (runtime/transports/ipc.py, or None), which should
    reach exactly `peers` and, where it reaches any, have carried messages."""
    if (sorted(ipc.peers) if ipc else []) != sorted(peers):
        return [f"IPC peers {ipc and sorted(ipc.peers)}, expected {sorted(peers)}"]
    if ipc and not ipc.stats["headers"]:
        return ["no message went by IPC"]
    return []


def value_bits(array):
    """The bytes of `array` that hold its values. x86 long double keeps 10 bytes of value in 16,
    and the padding is whatever the memory held: a store of each value into zeroed memory
    (multiplying by one keeps -0.0 and NaN payloads) leaves the padding zero."""
    if array.dtype.itemsize > 8 and array.dtype.kind == "f" or array.dtype.itemsize > 16:
        array = np.multiply(array, 1, out=np.zeros_like(array))
    return np.ascontiguousarray(array).tobytes()


def same_on_all_ranks(comm, array):
    """True where every rank holds bitwise the same values."""
    return len(set(comm.allgather(value_bits(array)))) == 1


def run_mpiexec(nranks, *args, options=(), env=None, timeout=240):
    """`mpiexec [options] -n nranks python *args` as a user runs it, in a separate process.

    A clean environment: no process-manager variables from an mpiexec this test may run under."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALNRANKS"))}
    command = [str(MPIEXEC), *options, "-n", str(nranks), sys.executable, *args]
    try:
        return subprocess.run(command, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:  # what the ranks said (their stall warnings) goes with the failure
        said = [out.decode(errors="replace") if isinstance(out, bytes) else out or ""
                for out in (expired.stdout, expired.stderr)]
        return subprocess.CompletedProcess(command, -9, said[0], said[1] + f"\n[killed after {timeout} s]")


def torch_groups():
    """torch.distributed's default group on ringtree's backend, made as a user makes it under mpiexec
    (`init_process_group("ringtree")`, no other argument), and a gloo group of the same ranks to
    compare with; each made once per process."""
    import torch.distributed as dist

    import ringtree.torch  # noqa: F401  (registers the backend)

    if not dist.is_initialized():
        dist.init_process_group("ringtree")
    if not _GLOO:
        _GLOO.append(dist.new_group(backend="gloo"))
    return dist.group.WORLD, _GLOO[0]


_GLOO: list = []
