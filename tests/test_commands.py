"""The command-line tools, run as a user runs them: under mpiexec, in a separate process."""

import json
import os
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

import pytest
from mpi4py import MPI

import ringtree
from conftest import run_mpiexec
from ringtree.algorithms import ALGORITHMS, GENERATORS

pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")


@pytest.fixture(scope="module")
def bench_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    results = {}
    for inplace in (False, True):
        path = folder / f"bench-{inplace}.json"
        args = ["-m", "ringtree", "bench", "-b", "8", "-e", "256K", "-f", "16", "--iters", "3", "--warmup", "1",
                "--algorithms", "ring,tree,recursive_doubling,auto,native,native-path", "--json", str(path)]
        run = run_mpiexec(2, *args, *(["--inplace", "--passes", "3"] if inplace else []))
        assert run.returncode == 0, run.stdout + run.stderr
        results[inplace] = (run.stdout, json.loads(path.read_text()))
    return results


@pytest.mark.parametrize("inplace", [False, True])
def test_bench_checks_every_size_against_native(bench_results, inplace):
    stdout, result = bench_results[inplace]
    sizes = sorted({row["size"] for row in result["rows"]})
    assert sizes == [8, 128, 2048, 32768]
    assert {row["algorithm"] for row in result["rows"]} == {"ring", "tree", "recursive_doubling", "auto", "native",
                                                            "native-path"}
    assert all(row["wrong"] == 0 for row in result["rows"])
    assert result["inplace"] is inplace and result["ranks"] == 2
    assert "busbw" in stdout and "#wrong" in stdout


def test_bench_gives_each_case_the_median_of_its_passes(bench_results):
    stdout, result = bench_results[True]  # the in-place run has three passes
    assert result["passes"] == 3 and "medians of 3 passes" in stdout
    for row in result["rows"]:
        assert len(row["passes_us"]) == 3 and row["time_us"] == sorted(row["passes_us"])[1]
    printed = [int(line.split()[0]) for line in stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert printed == sorted(printed) and len(printed) == len(result["rows"])  # once each, after the passes
    assert "passes_us" not in bench_results[False][1]["rows"][0]


@pytest.mark.slow
def test_bench_times_auto_once_online_tuning_has_chosen(tmp_path):
    """An allreduce's first calls of a size are online tuning's trials of its candidates (42 calls at
    64 KiB on 2 ranks): bench warms `auto` up until they are over and the ranks have committed to a
    choice, however few --warmup calls it is given (here none, and 3 timed calls of one)."""
    run = run_mpiexec(2, "-m", "ringtree", "bench", "-b", "64K", "-e", "64K", "--algorithms", "auto,native",
                      "--iters", "3", "--warmup", "0", "--batch", "1e-9",
                      env={"RINGTREE_CACHE_DIR": str(tmp_path), "RINGTREE_DEBUG": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tune 65536-131071 B, out of place, 4-byte elements, native allowed: committed to" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "alltoallv"])
def test_bench_of_every_collective_checks_it_against_native_with_nccl_tests_busbw(tmp_path, collective):
    path = tmp_path / "bench.json"
    run = run_mpiexec(2, "-m", "ringtree", "bench", "--collective", collective, "-b", "8", "-e", "64K", "-f", "64",
                      "--iters", "3", "--warmup", "1", "--budget", "0.2", "--json", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(path.read_text())
    assert result["collective"] == collective and f"ringtree bench {collective}" in run.stdout
    ours = {"pairwise"} if collective == "alltoallv" else set(GENERATORS[collective])  # Bruck: blocks alike only
    assert {row["algorithm"] for row in result["rows"]} == {*ours, "auto", "native"}
    # alltoallv's sizes are whole numbers of its shares: 1 + 2 of 4 bytes at 2 ranks
    assert sorted({row["size"] for row in result["rows"]}) == ([12, 504, 32760] if collective == "alltoallv"
                                                                else [8, 512, 32768])
    factor = 0.5 if collective in ("reduce_scatter", "allgather", "alltoall", "alltoallv") else 1.0  # (n-1)/n, or 1
    for row in result["rows"]:
        assert row["wrong"] == 0 and row["busbw"] == pytest.approx(row["algbw"] * factor)


def test_plot_writes_an_svg(bench_results, tmp_path):
    from ringtree.commands import main

    paths = []
    for inplace, (_, result) in bench_results.items():
        paths.append(tmp_path / f"{inplace}.json")
        paths[-1].write_text(json.dumps(result))
    out = tmp_path / "busbw.svg"
    main(["plot", *map(str, paths), "-o", str(out)])
    assert xml.dom.minidom.parse(str(out)).documentElement.tagName == "svg"


@pytest.mark.slow
def test_timeline_shows_receives_overlapping_reductions(tmp_path):
    template = str(tmp_path / "trace.json")
    run = run_mpiexec(2, "-m", "ringtree", "bench", "-b", "2M", "-e", "2M", "--iters", "3", "--warmup", "0",
                   "--algorithms", "ring", "--segment", "128K", env={"RINGTREE_TIMELINE": template})
    assert run.returncode == 0, run.stdout + run.stderr
    merged = tmp_path / "merged.json"
    from ringtree.commands import main
    main(["timeline-merge", "-o", str(merged), str(tmp_path / "trace.rank0.json"), str(tmp_path / "trace.rank1.json")])
    events = [e for e in json.loads(merged.read_text())["traceEvents"] if e["ph"] == "X"]
    calls = sorted({e["args"]["call"] for e in events})
    plotted = subprocess.run([sys.executable, "-m", "ringtree", "plot", "--timeline", str(merged), "--call",
                              str(calls[0]), "-o", str(tmp_path / "first.png")], capture_output=True, text=True)
    assert plotted.returncode == 0 and (tmp_path / "first.png").exists(), plotted.stderr
    assert f"wrote {tmp_path / 'first.png'}: call {calls[0]} of the trace's calls" in plotted.stdout
    plotted = subprocess.run([sys.executable, "-m", "ringtree", "plot", "--timeline", str(merged)], cwd=tmp_path,
                             capture_output=True, text=True)
    assert f"wrote timeline.svg: call {calls[-1]} of" in plotted.stdout and "--call N for another" in plotted.stdout
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

    from ringtree.allreduce import allreduce
    from ringtree.runtime.engine import timeline
    assert "RINGTREE_TIMELINE" not in os.environ
    allreduce(np.ones(1000), segment=800)
    assert not timeline.TIMELINE.active and not timeline.TIMELINE.events


@pytest.mark.slow
def test_tune_writes_a_table_that_auto_then_uses(tmp_path):
    table = tmp_path / "tuning.json"
    run = run_mpiexec(2, "-m", "ringtree", "tune", "-b", "8", "-e", "2M", "-f", "64", "--iters", "3",
                   "--segments", "1M", "-o", str(table), "--note", "test")
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(table.read_text())
    assert data["note"] == "test" and set(data["models"]) == {"2"}
    rules = data["rules"]
    assert rules and all(rule["ranks"] == [2, 2] for rule in rules)
    assert rules[0]["bytes"][0] == 0 and rules[-1]["bytes"][1] == 2 << 20  # what it measured, no more
    assert "which algorithm wins" in run.stdout
    assert "the table rules sizes up to 2 MiB on 2 ranks" in run.stdout, run.stdout
    # A second rank count merges in; the first one's rules stay.
    assert run_mpiexec(3, "-m", "ringtree", "tune", "-b", "8", "-e", "8", "-o", str(table)).returncode == 0
    merged = json.loads(table.read_text())
    assert {tuple(rule["ranks"]) for rule in merged["rules"]} == {(2, 2), (3, 3)}
    assert [rule for rule in merged["rules"] if rule["ranks"] == [2, 2]] == rules

    script = ("import numpy as np; from ringtree.allreduce import allreduce; "
              "[allreduce(np.ones(n, np.float32)) for n in (2, 1 << 19)]")
    used = run_mpiexec(2, "-c", script, env={"RINGTREE_TUNING_FILE": str(table), "RINGTREE_DEBUG": "1"})
    assert used.returncode == 0, used.stderr
    logged = [line for line in used.stderr.splitlines() if line.startswith("ringtree: allreduce")]
    assert len(logged) == 2, used.stderr  # each distinct choice once, from rank 0 only
    for line, size in zip(logged, (8, 2 << 20)):
        rule = next(i for i, r in enumerate(rules) if r["bytes"][0] <= size and (r["bytes"][1] or size) >= size)
        assert f"allreduce {size} B" in line and f"table tuning.json rule {rule}" in line
        assert rules[rule]["algorithm"] in line


@pytest.mark.slow
def test_tune_collective_writes_the_fastest_measured_as_its_rules_and_auto_takes_them(tmp_path):
    shipped = Path(ringtree.__file__).parent / "tuning" / "default.json"
    table = tmp_path / "tuning.json"
    table.write_text(shipped.read_text())
    before = json.loads(table.read_text())
    run = run_mpiexec(2, "-m", "ringtree", "tune", "--collective", "reduce", "-b", "1K", "-e", "64K", "-f", "8",
                      "--iters", "3", "--segments", "16K", "-o", str(table))
    assert run.returncode == 0, run.stdout + run.stderr
    after = json.loads(table.read_text())
    assert {key: after[key] for key in before if key != "collectives"} == {key: before[key] for key in before
                                                                           if key != "collectives"}
    assert {name: rules for name, rules in after["collectives"].items() if name != "reduce"} == {
        name: rules for name, rules in before["collectives"].items() if name != "reduce"}
    found = after["collectives"]["reduce"]["2"]
    times: dict = {}
    for m in found["measured"]:
        times.setdefault(m["bytes"], {})[(m["algorithm"], m["segment"])] = m["seconds"]
    assert sorted(times) == [1024, 8192, 65536]
    assert set(times[65536]) == {("native", 0), ("binomial", 0), ("binomial", 16384), ("rabenseifner", 0),
                                 ("rabenseifner", 16384)}
    for kind, cases in (("rules", lambda timed: timed),
                        ("without_native", lambda timed: {c: t for c, t in timed.items() if c[0] != "native"})):
        rules = found[kind]
        assert rules[0]["bytes"][0] == 0 and rules[-1]["bytes"][1] == 65536
        for nbytes in (1024, 65536):  # the grid's ends: the case measured fastest there
            rule = next(r for r in rules if r["bytes"][0] <= nbytes <= r["bytes"][1])
            timed = cases(times[nbytes])
            assert (rule["algorithm"], rule["segment"]) == min(timed, key=timed.get)
    assert "reduce on 2 ranks, without_native: which algorithm wins" in run.stdout

    script = ("import numpy as np; from ringtree import reduce; "
              "[reduce(np.ones(n, np.float32)) for n in (256, 16384)]")
    used = run_mpiexec(2, "-c", script, env={"RINGTREE_TUNING_FILE": str(table), "RINGTREE_DEBUG": "1"})
    assert used.returncode == 0, used.stderr
    logged = [line for line in used.stderr.splitlines() if line.startswith("ringtree: reduce")]
    assert len(logged) == 2, used.stderr
    for line, nbytes in zip(logged, (1024, 65536)):
        i, rule = next((i, r) for i, r in enumerate(found["rules"]) if r["bytes"][0] <= nbytes <= r["bytes"][1])
        assert f"reduce {nbytes} B float32 on 2 ranks: {rule['algorithm']}," in line
        assert line.endswith(f"from table tuning.json reduce rules {i}")


@pytest.mark.slow
def test_tune_merge_retunes_only_its_sizes(tmp_path):
    from ringtree.tuning.selector import TuningTable
    shipped = Path(ringtree.__file__).parent / "tuning" / "default.json"
    table = tmp_path / "tuning.json"
    table.write_text(shipped.read_text())
    before = json.loads(table.read_text())
    run = run_mpiexec(2, "-m", "ringtree", "tune", "-b", "1K", "-e", "4K", "--iters", "3", "--merge",
                      "-o", str(table))
    assert run.returncode == 0, run.stdout + run.stderr
    after = json.loads(table.read_text())
    assert after["segments"] == before["segments"]
    assert [r for r in after["rules"] if r["ranks"] != [2, 2]] == [r for r in before["rules"] if r["ranks"] != [2, 2]]
    old, new = TuningTable(before, "before"), TuningTable(after, "after")
    for nbytes in (0, 8, 512, 4097, 1 << 20, 256 << 20):  # outside the re-tuned sizes (512 B, 4 KiB]: as before
        assert new.match(nbytes, 2, "float32", "sum")[1]["algorithm"] == old.match(nbytes, 2, "float32", "sum")[1]["algorithm"]
    for nbytes in (1024, 4096):  # inside, at the grid's ends: the case measured fastest there
        measured = [m for m in after["measured"]["2"] if m["bytes"] == nbytes]
        assert {m["algorithm"] for m in measured} == {*ALGORITHMS, "native"}  # MPI's own a candidate too
        fastest = min(measured, key=lambda m: m["seconds"])
        assert new.match(nbytes, 2, "float32", "sum")[1]["algorithm"] == fastest["algorithm"]
    # nothing to merge into: a clear error on every rank, and the file untouched
    run = run_mpiexec(3, "-m", "ringtree", "tune", "-b", "1K", "-e", "1K", "--merge", "-o", str(table))
    assert run.returncode != 0 and "no rules and segment sizes for 3 ranks" in run.stdout + run.stderr
    assert json.loads(table.read_text()) == after


@pytest.mark.slow
def test_ranks_with_different_tables_get_a_clear_error_on_every_rank(tmp_path):
    script = (
        "import json, os, sys, numpy as np\n"
        "from mpi4py import MPI\n"
        "import ringtree\n"
        "from ringtree.allreduce import allreduce\n"
        "rank = MPI.COMM_WORLD.Get_rank()\n"
        "path = os.path.join(sys.argv[1], f'table{rank % 2}.json')\n"
        "rule = {'ranks': [1, 64], 'bytes': [0, None], 'algorithm': ['ring', 'tree'][rank % 2], 'segment': 0}\n"
        "json.dump({'format': 'ringtree-tuning-1', 'rules': [rule]}, open(path, 'w'))\n"
        "from ringtree.tuning import selector\n"
        "selector.use_table(selector.TuningTable.load(path))\n"
        "try:\n"
        "    allreduce(np.ones(4))\n"
        "    caught = None\n"
        "except ringtree.MismatchError as error:\n"
        "    caught = str(error)\n"
        "everyone = MPI.COMM_WORLD.gather(caught)\n"
        "if rank == 0:\n"
        "    print(json.dumps(everyone))\n"
    )
    run = run_mpiexec(3, "-c", script, str(tmp_path), timeout=60)
    assert run.returncode == 0, run.stderr
    caught = json.loads(run.stdout)
    for rank, message in enumerate(caught):
        assert message is not None, f"rank {rank} raised nothing"
        assert f"on rank {rank}" in message
        assert "ranks [0, 2]: table table0.json" in message and "ranks [1]: table table1.json" in message


@pytest.mark.slow
def test_RINGTREE_ALGORITHM_forces_the_algorithm_and_says_so():
    script = ("import numpy as np; from mpi4py import MPI; from ringtree.allreduce import allreduce\n"
              "result = allreduce(np.arange(5))\n"
              "if MPI.COMM_WORLD.Get_rank() == 0: print(result[4])")
    run = run_mpiexec(2, "-c", script, env={"RINGTREE_ALGORITHM": "double_tree", "RINGTREE_DEBUG": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["8"] and "double_tree" in run.stderr and "from RINGTREE_ALGORITHM" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command, argument, message", [
    (["bench", "-f", "1"], "-f/--stepfactor", "must be at least 2, not 1"),  # grew the size grid forever
    (["bench", "--passes", "0"], "--passes", "must be at least 1, not 0"),
    (["bench", "--segment", "0"], "--segment", "must be at least 1, not 0"),
    (["tune", "--passes", "0", "-o", "OUT"], "--passes", "must be at least 1, not 0"),
    (["tune", "--iters", "-1", "-o", "OUT"], "--iters", "must be at least 1, not -1"),
    (["tune", "--segments", "1M,0", "-o", "OUT"], "--segments", "must be at least 1, not 0"),
    (["calibrate", "--passes", "0", "-o", "OUT"], "--passes", "must be at least 1, not 0"),
    (["calibrate", "-e", "8K", "-o", "OUT"], "-e/--maxbytes", "must be at least 65536, not 8K"),
    (["simulate", "--algorithm", "ring", "--ranks", "0", "--bytes", "1K"], "--ranks", "must be at least 1, not 0"),
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "lots"], "--bytes", "invalid size value: 'lots'"),
    (["draw", "--algorithm", "ring", "--bytes", "-3", "-o", "OUT"], "--bytes", "must be at least 0, not -3"),
])
def test_commands_refuse_a_bad_count_naming_the_argument(tmp_path, command, argument, message):
    output = tmp_path / "out"
    run = run_mpiexec(2, "-m", "ringtree", *[str(output) if word == "OUT" else word for word in command], timeout=60)
    assert run.returncode != 0 and f"argument {argument}: {message}" in run.stderr
    assert not output.exists()


@pytest.mark.slow
def test_bench_refuses_an_empty_grid_before_measuring():
    run = run_mpiexec(2, "-m", "ringtree", "bench", "-b", "1M", "-e", "8", timeout=60)
    assert run.returncode != 0 and "error: no sizes: --minbytes 1048576 is above --maxbytes 8" in run.stderr
    assert "busbw" not in run.stdout


@pytest.mark.slow
def test_calibrate_writes_costs_the_simulator_takes(tmp_path):
    from ringtree.sim import simulate
    from ringtree.sim.calibration import load
    path = tmp_path / "calibration.json"
    run = run_mpiexec(2, "-m", "ringtree", "calibrate", "-e", "64K", "--iters", "3", "--passes", "3",
                      "-o", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    costs = load(str(path))
    assert min(costs.alpha, costs.beta, costs.gamma, costs.overhead, costs.setup) >= 0
    assert costs.eager_limit in [8 << k for k in range(14)]
    assert "fitted to the allreduce times" in run.stdout
    assert simulate('ring', 2, 1 << 20, costs).time > 0
    with open(path) as f:
        measured = json.load(f)["allreduce_seconds"]
    assert {m["bytes"] for m in measured} == {1 << k for k in range(10, 17)}
    assert all(len(m["passes"]) == 3 and m["seconds"] == sorted(m["passes"])[1] for m in measured)
    # --refit fits the file's own measurements again, without MPI: the same data, the same fit.
    again = tmp_path / "refitted.json"
    refit = subprocess.run([sys.executable, "-m", "ringtree", "calibrate", "--refit", str(path), "-o", str(again)],
                           capture_output=True, text=True)
    assert refit.returncode == 0, refit.stderr
    assert load(str(again)) == costs and json.loads(again.read_text())["allreduce_seconds"] == measured


@pytest.mark.slow
@pytest.mark.parametrize("command, message", [
    (["bench", "--dtype", "foo"], "argument --dtype: not a numpy dtype: 'foo'"),
    (["bench", "--dtype", "int32", "--op", "avg"], "--op avg --dtype int32: op avg is not defined for dtype int32"),
    (["bench", "--algorithms", "ring,butterfly"], "argument --algorithms: unknown algorithm 'butterfly'"),
    (["bench", "--algorithms", "roundtrip"], "'roundtrip' copies CuPy arrays to the host: it goes with --cupy"),
    (["bench", "--batch", "0"], "argument --batch: must be above 0, not 0"),
    (["bench", "--collective", "broadcast", "--algorithms", "pairwise"],
     "--algorithms: pairwise is not a broadcast algorithm; known: binomial, chain, scatter_allgather, auto, native, "
     "native-path"),
    (["bench", "--collective", "alltoallv", "--algorithms", "native-path"],
     "'native-path' runs numpy arrays in blocks alike: leave out --cupy and alltoallv"),
    (["bench", "--collective", "allgather", "--inplace"], "--collective allgather times numpy arrays out of place"),
    (["bench", "--collective", "gather"], "argument --collective: invalid choice: 'gather'"),
    (["tune", "--algorithms", "fastest"], "argument --algorithms: unknown algorithm 'fastest'"),
    (["tune", "--collective", "reduce", "--algorithms", "ring"],
     "--algorithms: ring is not a reduce algorithm; known: binomial, rabenseifner"),
    (["tune", "--algorithms", "bruck"], "--algorithms: bruck is not an allreduce algorithm"),
    (["tune", "--collective", "broadcast", "--merge"], "--merge re-tunes allreduce's rules; --collective broadcast"),
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "1K", "--calibration", "missing.json"],
     "argument --calibration: cannot read missing.json: No such file or directory"),
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "1K", "--calibration", "TRACE"],
     "is not a calibration written by `python -m ringtree calibrate`"),
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "10", "--itemsize", "4"],
     "--bytes 10 is not a whole number of 4-byte elements"),
    (["simulate", "--algorithm", "ring", "--ranks", "4", "--bytes", "1M", "--segment", "64K", "--stepwise"],
     "--stepwise runs unsegmented schedules only"),
    (["plot", "TRACE"], "a trace: plot it with --timeline"),
    (["plot", "BENCH", "-o", "x.txt"], "argument -o/--output: x.txt: an image file's name ends in one of .svg, .png"),
    (["plot", "BENCH", "-o", "noext"], "noext: an image file's name ends in one of .svg, .png, .pdf"),
    (["plot", "BENCH", "--call", "3"], "--call picks a call of a trace: give --timeline too"),
    (["draw", "--algorithm", "ring", "-o", "out.txt"], "out.txt: an image file's name ends in one of .svg"),
    (["plot", "--timeline", "missing.json"], "argument FILE: cannot read missing.json"),
    (["timeline-merge", "-o", "OUT", "BENCH"], "every file must be a trace written under RINGTREE_TIMELINE"),
    (["calibrate", "--refit", "TRACE", "-o", "OUT"], "--refit TRACE: not a file written by `python -m ringtree calibrate`"),
    (["draw", "--algorithm", "ring", "--ranks", "2000"], "--ranks 2000: at most 32 lanes are drawn"),
    (["draw", "--algorithm", "ring", "--ranks", "32", "--bytes", "1M", "--segment", "1K"],
     "sends 63488 messages; at most 1000 are drawn"),
    (["draw", "ring"], "the following arguments are required: --algorithm"),
    (["draw", "--algorithm", "ring", "-o", "nowhere/ring.svg"], "argument -o/--output: no folder nowhere to write ring.svg in"),
    (["tune", "-o", "nowhere/table.json"], "argument -o/--output: no folder nowhere to write table.json in"),
    (["bench", "--json", "."], "argument --json: . is a folder, not a file"),
    (["calibrate", "-o", "OUT"], "calibrate measures 2 ranks: mpiexec -n 2 python -m ringtree calibrate"),
    (["bench", "--collective", "allgather", "--op", "max"],
     "--op max: allgather reduces nothing; --op goes with allreduce, reduce_scatter, reduce"),
    (["tune", "-o", "BENCH"], 'is not a ringtree tuning table (a JSON object with no "format"); not overwriting it'),
    (["tune", "-o", "TEXT"], "is not a ringtree tuning table (not JSON); not overwriting it"),
])
def test_every_bad_argument_is_a_usage_error_not_a_traceback(tmp_path, command, message):
    trace, bench, text = tmp_path / "trace.json", tmp_path / "bench.json", tmp_path / "notes.txt"
    trace.write_text(json.dumps({"traceEvents": []}))
    bench.write_text(json.dumps({"rows": []}))
    text.write_text("not a table\n")
    files = {"TRACE": str(trace), "BENCH": str(bench), "TEXT": str(text), "OUT": str(tmp_path / "out")}
    run = subprocess.run([sys.executable, "-m", "ringtree", *[files.get(word, word) for word in command]],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "usage: python -m ringtree" in run.stderr
    assert message.replace("TRACE", str(trace)) in run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_draw_refuses_a_diagram_too_large_at_once():
    import time
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "ringtree", "draw", "--algorithm", "ring", "--ranks", "2000"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and time.perf_counter() - started < 30


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own processes; run on one rank")
@pytest.mark.parametrize("script", sorted(path.name for path in (Path(__file__).parent.parent / "scripts").glob("*.py")))
def test_every_script_imports_and_refuses_a_bad_argument_with_a_usage_error(script):
    # The scripts reach into ringtree's modules: one that moved must not leave a script broken.
    path = Path(__file__).parent.parent / "scripts" / script
    helped = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr
    refused = subprocess.run([sys.executable, str(path), "--no-such-option"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr


@pytest.mark.slow
def test_the_demo_times_auto_once_it_has_committed_and_names_what_it_runs(tmp_path):
    demo = Path(__file__).parent.parent / "examples" / "allreduce_demo.py"
    run = run_mpiexec(2, str(demo), "--count", "1000", "--repeat", "3", env={"RINGTREE_CACHE_DIR": str(tmp_path),
                                                                            "RINGTREE_DEBUG": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    committed = [line for line in run.stderr.splitlines() if "committed to" in line]
    auto = next(line.split()[0] for line in run.stdout.splitlines() if line.strip().startswith("auto="))
    # the trials all came before the timed calls: what the demo names is what online tuning committed to
    assert len(committed) == 1 and committed[0].split("committed to ")[1].split(";")[0].startswith(auto[5:]), \
        run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [["plot", "BENCH"], ["draw", "--algorithm", "ring"]])
def test_plot_and_draw_without_matplotlib_say_how_to_get_it(tmp_path, command):
    hidden = tmp_path / "hidden" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": []}))
    run = subprocess.run([sys.executable, "-m", "ringtree", *[str(bench) if word == "BENCH" else word for word in command]],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(hidden.parent)})
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "need matplotlib: pip install 'ringtree[plot]'" in run.stderr


@pytest.mark.slow
def test_tune_refuses_a_file_that_is_not_a_table_before_measuring(tmp_path):
    """tune -o FILE, FILE there and not a tuning table: a usage error on every rank in the time MPI takes
    to start, not after the grid's half minute of measuring, naming the file, which stays as it was."""
    import time
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"rows": []}))
    started = time.perf_counter()
    run = run_mpiexec(2, "-m", "ringtree", "tune", "-o", str(results), timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count(f"error: argument -o/--output: {results} is not a ringtree tuning table") == 2
    assert "which algorithm wins" not in run.stdout and time.perf_counter() - started < 20
    assert json.loads(results.read_text()) == {"rows": []}


@pytest.mark.slow
def test_bench_times_a_size_in_whole_elements_says_so_and_says_where_it_wrote(tmp_path):
    path = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "ringtree", "bench", "-b", "6", "-e", "6", "--algorithms", "native",
                          "--iters", "3", "--warmup", "0", "--json", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "# ringtree bench: 1 rank, float32, sum" in run.stdout
    assert "# sizes timed in whole 4-byte float32 elements, rounded down to them (one at least): 6 B as 4 B" in run.stdout
    assert [row["size"] for row in json.loads(path.read_text())["rows"]] == [4]
    assert run.stdout.rstrip().endswith(f"# wrote the rows as JSON to {path}")


def test_a_grid_of_sizes_is_timed_in_whole_elements_each_size_once():
    import numpy as np

    from ringtree.commands.measure import whole_elements
    float32 = np.dtype(np.float32)
    assert whole_elements([8, 16], float32) == ([2, 4], None)
    counts, note = whole_elements([1, 2, 4, 6], float32)  # all one element: timed once
    assert counts == [1] and note.endswith(": 1 B as 4 B, 2 B as 4 B, 6 B as 4 B")
    counts, note = whole_elements([8, 64], float32, 3, "per rank on 3 ranks")  # a block of one element at least
    assert counts == [3, 15] and "float32 elements per rank on 3 ranks" in note and note.endswith("8 B as 12 B, 64 B as 60 B")


@pytest.mark.parametrize("collective, op, title", [
    ("reduce_scatter", "sum", "reduce_scatter, 2 ranks, float32 sum"),
    ("allgather", None, "allgather, 1 rank, float32"),  # no op: it reduces nothing
    (None, "max", "allreduce, 2 ranks, float32 max"),  # a file of a bench from before the collective was kept
])
def test_plot_titles_a_panel_with_its_collective(tmp_path, collective, op, title):
    from ringtree.commands import main
    ranks = 1 if collective == "allgather" else 2
    result = {"ranks": ranks, "dtype": "float32", "op": op, "inplace": False, "mpi": "MPICH", "note": "",
              "rows": [{"size": size, "busbw": 1.0, "algorithm": "ring"} for size in (8, 16)]}
    if collective:
        result["collective"] = collective
    (tmp_path / "bench.json").write_text(json.dumps(result))
    main(["plot", str(tmp_path / "bench.json"), "-o", str(tmp_path / "busbw.svg")])
    assert f"<!-- {title} -->" in (tmp_path / "busbw.svg").read_text()


@pytest.mark.slow
def test_simulate_and_draw_say_one_rank_and_one_element_and_where_they_wrote(tmp_path):
    path = tmp_path / "result.json"
    run = subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "1",
                          "--bytes", "4", "--json", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr  # and no progress bar for a quick one
    assert run.stdout.startswith("# ring, 1 rank, 4 B (1 element of 4 B);")
    assert f"wrote the result, every rank's traffic, as JSON to {path}" in run.stdout and json.loads(path.read_text())
    from ringtree.commands import main
    main(["draw", "--algorithm", "ring", "--ranks", "1", "-o", str(tmp_path / "ring.svg")])
    assert "<!-- ring, 1 rank, 1 element -->" in (tmp_path / "ring.svg").read_text()


@pytest.mark.slow
def test_timeline_merge_says_where_it_wrote(tmp_path):
    traces = [tmp_path / f"trace.rank{rank}.json" for rank in (0, 1)]
    for rank, trace in enumerate(traces):
        trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": rank, "name": "send", "ts": 0, "dur": 1}]}))
    merged = tmp_path / "merged.json"
    run = subprocess.run([sys.executable, "-m", "ringtree", "timeline-merge", "-o", str(merged), *map(str, traces)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == f"wrote {merged}: 2 traces merged, 2 events\n", run.stderr
    assert len(json.loads(merged.read_text())["traceEvents"]) == 2


def test_simulate_shows_its_progress_where_stderr_is_no_terminal(monkeypatch, capsys):
    from ringtree.commands import main
    from ringtree.sim import flat
    monkeypatch.setattr(flat, "PROGRESS_EVERY", 0.0)  # a state at every update, not every 10 s
    main(["simulate", "--algorithm", "ring", "--ranks", "16", "--bytes", "64K", "--setup", "1e-6"])  # the event simulation
    out, err = capsys.readouterr()
    assert "predicted time" in out
    assert err.rstrip("\n").split("\r")[-1].startswith("simulating: 100%"), err  # the last state kept


def test_a_fit_with_a_cost_at_zero_or_far_from_its_times_is_called_poor():
    from ringtree.commands.measure import COSTS, poor_fit
    from ringtree.tuning.model import Params, fit, fit_error, predict
    # times that shrink as the size grows: they fit best with negative costs per byte, so both come out 0
    shrinking = [(alg, 2, nbytes, 0, seconds) for alg in ("ring", "tree")
                 for nbytes, seconds in ((1 << 10, 1e-4), (1 << 20, 0.9e-4), (1 << 24, 0.8e-4))]
    params = fit(shrinking)
    assert params.beta == params.gamma == 0 < params.alpha
    warning = poor_fit("the α-β-γ model", [COSTS[name] for name, value in params._asdict().items() if value <= 0],
                       fit_error(shrinking, params))
    assert warning.startswith("a poor fit of the α-β-γ model: β (time per byte sent) and γ (time per byte reduced) "
                              "are 0, at the fit's bound")
    assert "by a factor of 2.72 (the root mean square of ln(fitted / measured)" in poor_fit("costs", [], 1.0)
    truth = Params(1e-5, 1e-10, 2e-10)  # times the model gives exactly: a good fit, no warning
    exact = [(alg, 2, n, 0, predict(alg, 2, n, truth)) for alg in ("ring", "recursive_doubling") for n in (1 << 10, 1 << 24)]
    assert poor_fit("costs", [], fit_error(exact, fit(exact))) is None


@pytest.mark.slow
def test_calibrate_warns_of_a_poor_fit(tmp_path):
    """calibrate --refit (no MPI) of times that shrink as the size grows, and a reduction measured at no
    cost: both fits are poor, and each warning says what makes it so."""
    measured = json.loads((Path(__file__).parent.parent / "docs" / "figures" / "calibration-2ranks.json").read_text())
    rows = [{"algorithm": alg, "bytes": nbytes, "segment": 0, "seconds": seconds} for alg in ("ring", "tree")
            for nbytes, seconds in ((1 << 10, 1e-4), (1 << 16, 0.9e-4), (1 << 20, 0.8e-4))]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"format": measured["format"], "primitives": {**measured["primitives"], "gamma": 0.0},
                                "allreduce_seconds": rows}))
    run = subprocess.run([sys.executable, "-m", "ringtree", "calibrate", "--refit", str(path), "-o",
                          str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "warning: a poor fit of the primitives: γ (time per byte reduced) is 0, at the fit's bound" in run.stderr
    assert "warning: a poor fit of the simulator's costs to the allreduce times: " in run.stderr
    assert "β (time per byte sent)" in run.stderr.split("allreduce times: ")[1]


@pytest.mark.slow
def test_a_cache_dir_that_is_a_file_is_refused_naming_the_variable_and_the_path(tmp_path):
    from ringtree.tuning import cache
    blocking = tmp_path / "cache"
    blocking.write_text("")
    run = subprocess.run([sys.executable, "-m", "ringtree", "cache"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RINGTREE_CACHE_DIR": str(blocking)})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert (f"RINGTREE_CACHE_DIR='{blocking}' is not a value ringtree takes; it takes a directory: {blocking} is a "
            "file, not a folder") in run.stderr
    # Where the variable is not set and the default place is under a file: what the write says.
    with pytest.raises(NotADirectoryError) as caught:
        cache.write(blocking / "ringtree" / "0123.json", {}, {})
    assert caught.value.strerror == f"{blocking} is a file, not a folder: set RINGTREE_CACHE_DIR to a folder for the cache"


def test_debug_log_lines_name_ringtree_once():
    import logging

    from ringtree.debug import Prefixed

    def shown(message: str) -> str:
        return Prefixed("%(message)s").format(logging.makeLogRecord({"msg": message}))
    assert shown("ringtree: cannot write the tuning cache c.json: why") == "ringtree: cannot write the tuning cache c.json: why"
    assert shown("ringtree on rank 1: stalled") == "ringtree on rank 1: stalled"
    assert shown("tune 8-15 B: committed to ring") == "ringtree: tune 8-15 B: committed to ring"
