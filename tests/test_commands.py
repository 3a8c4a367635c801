"""The command-line tools, run as a user runs them: under mpiexec, in a separate process."""

import json
import os
import pathlib
import subprocess
import sys
import xml.dom.minidom

import pytest
from mpi4py import MPI

pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
MPIEXEC = pathlib.Path(sys.executable).parent / "mpiexec"


def _mpiexec(nranks, *args, env=None, timeout=240):
    # A clean environment: no process-manager variables from an mpiexec this test may run under.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALNRANKS"))}
    return subprocess.run([str(MPIEXEC), "-n", str(nranks), sys.executable, *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bench_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    results = {}
    for inplace in (False, True):
        path = folder / f"bench-{inplace}.json"
        args = ["-m", "ringtree", "bench", "-b", "8", "-e", "256K", "-f", "16", "--iters", "3", "--warmup", "1",
                "--algorithms", "ring,tree,recursive_doubling,auto,native", "--json", str(path)]
        run = _mpiexec(2, *args, *(["--inplace"] if inplace else []))
        assert run.returncode == 0, run.stdout + run.stderr
        results[inplace] = (run.stdout, json.loads(path.read_text()))
    return results


@pytest.mark.parametrize("inplace", [False, True])
def test_bench_checks_every_size_against_native(bench_results, inplace):
    stdout, result = bench_results[inplace]
    sizes = sorted({row["size"] for row in result["rows"]})
    assert sizes == [8, 128, 2048, 32768]
    assert {row["algorithm"] for row in result["rows"]} == {"ring", "tree", "recursive_doubling", "auto", "native"}
    assert all(row["wrong"] == 0 for row in result["rows"])
    assert result["inplace"] is inplace and result["ranks"] == 2
    assert "busbw" in stdout and "#wrong" in stdout


def test_plot_writes_an_svg(bench_results, tmp_path):
    from ringtree.__main__ import main

    paths = []
    for inplace, (_, result) in bench_results.items():
        paths.append(tmp_path / f"{inplace}.json")
        paths[-1].write_text(json.dumps(result))
    out = tmp_path / "busbw.svg"
    main(["plot", *map(str, paths), "-o", str(out)])
    assert xml.dom.minidom.parse(str(out)).documentElement.tagName == "svg"


def test_timeline_shows_receives_overlapping_reductions(tmp_path):
    template = str(tmp_path / "trace.json")
    run = _mpiexec(2, "-m", "ringtree", "bench", "-b", "2M", "-e", "2M", "--iters", "3", "--warmup", "0",
                   "--algorithms", "ring", "--segment", "128K", env={"RINGTREE_TIMELINE": template})
    assert run.returncode == 0, run.stdout + run.stderr
    merged = tmp_path / "merged.json"
    from ringtree.__main__ import main
    main(["timeline-merge", str(merged), str(tmp_path / "trace.rank0.json"), str(tmp_path / "trace.rank1.json")])
    events = [e for e in json.loads(merged.read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == {0, 1}
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        receives = [e for e in mine if e["name"].startswith("recv")]
        reductions = [e for e in mine if e["name"].startswith("reduce")]
        sends = [e for e in mine if e["name"].startswith("send")]
        assert receives and reductions and sends

        def during(inner, outer):
            return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
        overlapped = [r for r in reductions if any(during(r, m) for m in receives + sends)]
        assert len(overlapped) >= len(reductions) // 2, f"rank {rank}: little overlap"


def test_without_the_variable_nothing_is_recorded():
    import numpy as np
    from ringtree import timeline
    from ringtree.allreduce import allreduce
    assert "RINGTREE_TIMELINE" not in os.environ
    allreduce(np.ones(1000), segment=800)
    assert not timeline.ACTIVE and not timeline._events
