"""scripts/cluster: its usage errors, a run on emulated hosts, and (as root) namespaces and capped
links that are gone afterwards, also when the run is interrupted."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import MPIEXEC

CLUSTER = pathlib.Path(__file__).parent.parent / "scripts" / "cluster"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_"))},
       "PATH": f"{MPIEXEC.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def cluster(*args, timeout=120, env=ENV):
    return subprocess.run([sys.executable, str(CLUSTER), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def ours(pid=None):
    """The namespaces and links of scripts/cluster's runs (of run `pid`, if given) that exist now."""
    prefix = "rtc" if pid is None else f"rtc{pid}"
    names = subprocess.run(["ip", "-o", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [n for n in names if n.startswith(prefix)] + [
        line.split(": ")[1] for line in links.splitlines() if line.split(": ")[1].startswith(prefix)]


@pytest.mark.parametrize("args,said", [
    (["--layout", "2,x", "--", "true"], "'2,x' is not ranks per host"),
    (["--layout", "2,0", "--", "true"], "every host needs at least one rank"),
    (["--placement", "round-robin", "--layout", "2,1", "--", "true"], "round-robin placement takes an even layout"),
    (["--link-rate", "1gbit", "--", "true"], "give --netns too"),
    (["--netns", "--link-rate", "fast", "--", "true"], "not a rate"),
    (["--layout", "2,2"], "give the command"),
])
def test_a_bad_argument_is_a_usage_error(args, said):
    done = cluster(*args)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


def test_ranks_run_on_the_hosts_of_the_layout_and_the_command_s_status_comes_back():
    script = ("from mpi4py import MPI; import os; c = MPI.COMM_WORLD; "
              "n = c.Split_type(MPI.COMM_TYPE_SHARED).Get_size(); "
              "os.write(1, f'rank {c.rank} shares its host with {n}\\n'.encode()); "
              "raise SystemExit(3 if c.rank == 0 else 0)")
    done = cluster("--layout", "1,2", "--", sys.executable, "-c", script)
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 shares its host with 1", "rank 1 shares its host with 2", "rank 2 shares its host with 2"]
    assert done.returncode == 3


@pytest.mark.parametrize("chosen,seen", [(None, "1"), ("0", "0")])
def test_ranks_send_large_messages_by_rma_write_unless_the_caller_chose_and_by_rendezvous_uncapped(chosen, seen):
    env = {k: v for k, v in ENV.items() if k != "FI_OFI_RXM_USE_RNDV_WRITE"}
    if chosen is not None:
        env["FI_OFI_RXM_USE_RNDV_WRITE"] = chosen
    script = ("import os; os.write(1, ('write ' + os.environ['FI_OFI_RXM_USE_RNDV_WRITE'] + ', sar limit '"
              " + os.environ.get('FI_OFI_RXM_SAR_LIMIT', 'the default') + '\\n').encode())")
    done = cluster("--layout", "1,1", "--", sys.executable, "-c", script, env=env)
    said = f"write {seen}, sar limit " + os.environ.get("FI_OFI_RXM_SAR_LIMIT", "the default")  # no cap, no change
    assert done.returncode == 0 and done.stdout.split("\n").count(said) == 2, done.stderr


@pytest.mark.parametrize("given,seen", [([], "tcp;ofi_rxm"), (["--provider", "tcp"], "tcp")])
def test_ranks_talk_through_the_provider_given_by_default_tcp_over_ofi_rxm(given, seen):
    script = "import os; os.write(1, ('provider ' + os.environ['FI_PROVIDER'] + '\\n').encode())"
    done = cluster(*given, "--layout", "1,1", "--", sys.executable, "-c", script)
    assert done.returncode == 0 and done.stdout.split("\n").count(f"provider {seen}") == 2, done.stderr


@root
@pytest.mark.parametrize("chosen,seen", [(None, str(64 << 20)), ("131072", "131072")])
def test_namespaces_with_capped_links_carry_messages_without_rendezvous_and_are_gone_afterwards(chosen, seen):
    env = {k: v for k, v in ENV.items() if k != "FI_OFI_RXM_SAR_LIMIT"}
    if chosen is not None:
        env["FI_OFI_RXM_SAR_LIMIT"] = chosen
    script = ("from mpi4py import MPI; import numpy as np, os; c = MPI.COMM_WORLD; a = np.ones(1 << 20); "
              "c.Allreduce(MPI.IN_PLACE, a); assert a[0] == c.size; "
              "os.write(1, f'sum {a[0]}, sar limit {os.environ[\"FI_OFI_RXM_SAR_LIMIT\"]}\\n'.encode())")
    done = cluster("--netns", "--link-rate", "1gbit", "--layout", "1,1", "--", sys.executable, "-c", script, env=env)
    assert done.returncode == 0 and done.stdout.count(f"sum 2.0, sar limit {seen}\n") == 2, done.stderr
    assert ours() == []


@pytest.mark.slow
@root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_no_namespace_or_link(sig):
    process = subprocess.Popen([sys.executable, str(CLUSTER), "--netns", "--link-rate", "1gbit", "--layout", "1,1",
                                "--", "sleep", "60"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while not ours(process.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert ours(process.pid), "the namespaces never came"
    time.sleep(1)  # mpiexec and its ranks started
    process.send_signal(sig)
    process.wait(timeout=60)
    assert ours(process.pid) == []
