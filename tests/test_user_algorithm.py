"""A program's own algorithm (ringtree.register_algorithm, examples/reverse_ring.py): verified at
registration, a broken one refused by name with the registry left as it was; then run by name against
MPI's own, offered to auto, compared between ranks, and taken by bench, draw and simulate (--import)."""

import contextlib
import os
import pathlib
import re
import runpy
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, run_mpiexec
from ringtree import settings
from ringtree.algorithms import ALGORITHMS, GENERATORS, REGISTRY
from ringtree.algorithms.allgather import ring_allgather
from ringtree.algorithms.ring import ring_allreduce
from ringtree.api.registration import unregister_algorithm
from ringtree.errors import MismatchError
from ringtree.runtime.safety.mismatch import signature
from ringtree.runtime.session.state import existing_state
from ringtree.schedule import INPUT, OUTPUT, Ref, ScheduleBuilder, even_chunks
from ringtree.tuning import selector
from ringtree.tuning.model import Params
from ringtree.tuning.online import key_of, options_for

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "reverse_ring.py"
ONE_RANK = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own processes; run on one rank")


@contextlib.contextmanager
def registered(collective, name, generator, **options):
    """`generator` registered as `name` while the block runs, and taken out again after it."""
    ringtree.register_algorithm(collective, name, generator, **options)
    try:
        yield
    finally:
        unregister_algorithm(collective, name)


@pytest.fixture
def reverse_ring():
    """The example's reverse ring, registered as the example does it (offered to auto), for one test."""
    runpy.run_path(str(EXAMPLE), run_name="reverse_ring")  # registers it
    yield REGISTRY["allreduce"]["reverse_ring"]
    if "reverse_ring" in REGISTRY["allreduce"]:
        unregister_algorithm("allreduce", "reverse_ring")


def _registry():
    return ({collective: dict(entries) for collective, entries in REGISTRY.items()}, dict(ALGORITHMS),
            {collective: dict(names) for collective, names in GENERATORS.items()})


def forgetful_ring(nranks, rank, count):
    """A ring allreduce whose allgather stops a step short: one chunk never reaches each rank."""
    b = ScheduleBuilder("forgetful", nranks, rank, count)
    chunks = even_chunks(count, nranks)
    incoming = b.scratch("incoming", max(size for _, size in chunks))
    left, right = (rank - 1) % nranks, (rank + 1) % nranks
    if nranks == 1:
        b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
    for step in range(nranks - 1):
        (offset, size), sent = chunks[(rank - step - 1) % nranks], chunks[(rank - step) % nranks]
        b.send(right, Ref(INPUT if step == 0 else OUTPUT, *sent))
        b.recv(left, Ref(incoming.buffer, 0, size))
        b.reduce(Ref(OUTPUT, offset, size), Ref(incoming.buffer, 0, size), Ref(INPUT, offset, size))
    for step in range(nranks - 2):  # one step short
        b.send(right, Ref(OUTPUT, *chunks[(rank + 1 - step) % nranks]))
        b.recv(left, Ref(OUTPUT, *chunks[(rank - step) % nranks]))
    return b.build()


def unanswered(nranks, rank, count):
    """Every rank copies its input and sends it to the next, which never receives it."""
    b = ScheduleBuilder("unanswered", nranks, rank, count)
    b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
    if nranks > 1:
        b.send((rank + 1) % nranks, Ref(INPUT, 0, count))
    return b.build()


def crashing(nranks, rank, count):
    return [][rank]


@pytest.mark.parametrize("generator,name,says", [
    (forgetful_ring, "forgetful", "on 2 ranks, 1 element: rank 1: output[0] holds contributions nothing"),
    (unanswered, "unanswered", "on 2 ranks, 1 element: deadlock: these ops can never finish: rank 0 op 1 (send input[0:1] to 1)"),
    (crashing, "crashing", "on 1 rank, 0 elements: the generator raised IndexError: list index out of range"),
])
def test_a_broken_algorithm_is_refused_at_registration_by_name_and_the_registry_is_unchanged(generator, name, says):
    before = _registry()
    with pytest.raises(ValueError) as refused:
        ringtree.register_algorithm("allreduce", name, generator)
    message = str(refused.value)
    assert message.startswith(f"ringtree.register_algorithm: allreduce algorithm {name!r} refused: on ")
    assert says in message, message
    assert _registry() == before


def test_algorithms_md_shows_the_example_as_it_is_and_the_refusal_as_the_code_words_it():
    text = (pathlib.Path(__file__).parents[1] / "docs" / "algorithms.md").read_text()
    section = text[text.index("## Your own algorithm"):text.index("## How `auto` chooses")]
    shown = re.search(r"^```python\n(.*?)^```", section, flags=re.S | re.M).group(1)
    assert shown in EXAMPLE.read_text() and "register_algorithm(" in shown
    quoted = re.search(r"^(ValueError: ringtree\.register_algorithm: .*)$", section, flags=re.M).group(1)
    with pytest.raises(ValueError) as refused:
        ringtree.register_algorithm("allreduce", "forgetful", forgetful_ring)
    assert quoted == f"ValueError: {refused.value}"


def test_an_allreduce_registered_as_an_allgather_is_refused_for_computing_another_collective():
    def allreduce_as_allgather(nranks, rank, count, collective):
        return ring_allreduce(nranks, rank, count)

    with pytest.raises(ValueError, match="rank 0's schedule is another call's: allreduce of 0 elements as rank 0 of 1"):
        ringtree.register_algorithm("allgather", "allreduce_as_allgather", allreduce_as_allgather)
    assert "allreduce_as_allgather" not in GENERATORS["allgather"]


def test_a_name_taken_reserved_or_of_an_unknown_collective_is_refused(reverse_ring):
    before = _registry()
    refusals = [
        (("allreduce", "ring", forgetful_ring), "the name is taken: 'ring' is one of ringtree's own"),
        (("allreduce", "reverse_ring", forgetful_ring),
         "the name is taken: 'reverse_ring' is registered already, by reverse_ring.reverse_ring_allreduce"),
        (("allscatter", "mine", forgetful_ring), "unknown collective 'allscatter'; known: allreduce, reduce_scatter"),
        (("allreduce", "auto", forgetful_ring), "none of auto, native, roundtrip"),
        (("allreduce", "two words", forgetful_ring), "a word of letters, digits and _"),
        (("allreduce", "mine", "not a function"), "the generator must be a function (nranks, rank, count)"),
    ]
    for arguments, says in refusals:
        with pytest.raises(ValueError, match="ringtree.register_algorithm") as refused:
            ringtree.register_algorithm(*arguments)
        assert says in str(refused.value)
    assert _registry() == before


def test_a_registered_algorithm_is_in_every_view_of_the_registry_and_leaves_it_again(reverse_ring):
    assert ALGORITHMS["reverse_ring"] is GENERATORS["allreduce"]["reverse_ring"] is reverse_ring.generator
    assert reverse_ring.offered and reverse_ring.origin == "reverse_ring.reverse_ring_allreduce"
    assert settings.read({"RINGTREE_ALGORITHM": "reverse_ring"}).algorithm == "reverse_ring"
    assert "algorithms registered: allreduce reverse_ring=reverse_ring.reverse_ring_allreduce (offered to auto)" in (
        selector.identity())
    unregister_algorithm("allreduce", "reverse_ring")
    assert "reverse_ring" not in ALGORITHMS and "reverse_ring" not in GENERATORS["allreduce"]
    assert "algorithms registered" not in selector.identity()


def test_auto_offers_it_among_online_tuning_s_candidates_only_where_the_program_asks(reverse_ring):
    key, params = key_of(64 << 10, False, 4, True), Params(1e-5, 1e-10, 1e-10)
    for nodes in (1, 2):
        assert "reverse_ring" in [option.algorithm for option in options_for(key, 4, params, nodes)]
    with registered("allreduce", "not_offered", reverse_ring.generator):
        assert "not_offered" not in [option.algorithm for option in options_for(key, 4, params)]


def test_another_collective_s_algorithm_registers_and_auto_s_tables_may_name_it():
    def ring_allgather_again(nranks, rank, count, collective):
        return ring_allgather(nranks, rank, count, collective)

    with registered("allgather", "ring_again", ring_allgather_again, offer_to_auto=True):
        assert GENERATORS["allgather"]["ring_again"] is ring_allgather_again
        rules = [{"bytes": [0, None], "algorithm": "ring_again", "segment": 0}]
        table = selector.TuningTable({"format": selector.FORMAT, "collectives": {"allgather": {"2": {
            "rules": rules, "without_native": rules}}}}, "a table tune wrote")
        assert table.collectives["allgather"][2]["rules"][0]["algorithm"] == "ring_again"


def test_a_call_s_signature_tells_apart_algorithms_registered_under_one_name_from_different_code():
    codes = []
    for module in ("a_program", "another_program"):
        def mine(nranks, rank, count):
            return ring_allreduce(nranks, rank, count)

        mine.__module__ = module
        with registered("allreduce", "mine", mine):
            codes.append(signature(1000, np.dtype(np.float64), "sum", "mine", None).code)
    ring = signature(1000, np.dtype(np.float64), "sum", "ring", None).code
    assert len({ring, *codes}) == 3


@pytest.mark.mpi(min_size=2)
def test_the_registered_reverse_ring_gives_mpi_s_allreduce_on_integers_and_the_same_bits_everywhere_on_floats(
        comm, reverse_ring):
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for count in sorted({0, 1, size - 1, size + 1, 1000, 70_001}):
        x = np.random.default_rng(count + rank).integers(-1000, 1000, count)
        expected = np.empty_like(x)
        comm.Allreduce(x, expected)
        in_place = x.copy()
        got = {"out of place": ringtree.allreduce(x, comm=comm, algorithm="reverse_ring"),
               "segmented": ringtree.allreduce(x, comm=comm, algorithm="reverse_ring", segment=4096),
               "started": ringtree.iallreduce(x, comm=comm, algorithm="reverse_ring").wait()}
        ringtree.allreduce(MPI.IN_PLACE, in_place, comm=comm, algorithm="reverse_ring")
        got["in place"] = in_place
        failures += [f"{count} integers, {how}" for how, result in got.items() if not np.array_equal(result, expected)]
        floats = np.random.default_rng(count + rank).standard_normal(count)
        total = ringtree.allreduce(floats, comm=comm, algorithm="reverse_ring")
        if len(set(comm.allgather(total.tobytes()))) != 1:
            failures.append(f"{count} floats: the ranks' bits differ")
        reference = np.empty_like(floats)
        comm.Allreduce(floats, reference)
        if not np.allclose(total, reference):
            failures.append(f"{count} floats: not MPI's total")
    assert_everywhere(comm, failures)


@pytest.mark.mpi(min_size=2)
def test_auto_tries_the_offered_reverse_ring_online_and_every_trial_gives_mpi_s_result(comm, reverse_ring):
    private = comm.Dup()  # its own tuner: what it commits to leaves with it
    x = (np.arange(1500) % 5 * (comm.Get_rank() + 1)).astype(np.int8)  # in place, int8: a key of this test alone
    expected = np.empty_like(x)
    comm.Allreduce(x, expected)

    def auto():
        data = x.copy()
        ringtree.allreduce(MPI.IN_PLACE, data, comm=private)
        return data

    results = [auto()]
    tuner = existing_state(private).tuner
    tried = [option.algorithm for exploration in tuner.explorations.values() for option in exploration.options]
    results += [auto() for _ in range(100)]
    failures = [f"call {i}" for i, result in enumerate(results) if not np.array_equal(result, expected)]
    if "reverse_ring" not in tried:
        failures.append(f"reverse_ring is not among auto's candidates: {tried}")
    if tuner.explorations:
        failures.append("the trials did not end")
    private.Free()
    assert_everywhere(comm, failures)


@pytest.mark.mpi(min_size=2)
def test_ranks_that_registered_differently_are_told_so_at_the_communicator_s_first_call(comm):
    if comm.Get_rank() == 0:
        runpy.run_path(str(EXAMPLE), run_name="reverse_ring")
    private = comm.Dup()
    try:
        with pytest.raises(MismatchError, match="would choose algorithms differently") as told:
            ringtree.allreduce(np.ones(4), comm=private, algorithm="ring")
        assert "algorithms registered: allreduce reverse_ring=reverse_ring.reverse_ring_allreduce" in str(told.value)
    finally:
        if comm.Get_rank() == 0:
            unregister_algorithm("allreduce", "reverse_ring")
        private.Free()


@pytest.mark.mpi(min_size=2)
def test_ranks_whose_algorithm_of_one_name_is_other_code_raise_a_mismatch_at_a_call_of_it(comm):
    def mine(nranks, rank, count):
        return ring_allreduce(nranks, rank, count)

    mine.__module__ = ("a_program", "another_program")[comm.Get_rank() % 2]
    private = comm.Dup()
    ringtree.allreduce(np.ones(4), comm=private)  # the communicator in use before the programs register
    try:
        with registered("allreduce", "mine", mine):
            with pytest.raises(MismatchError, match="disagree at call"):
                ringtree.allreduce(np.ones(4), comm=private, algorithm="mine")
    finally:
        private.Free()


@ONE_RANK
@pytest.mark.parametrize("command,says", [
    (["draw", "--algorithm", "reverse_ring", "--ranks", "4", "-o", "OUT.svg"], "wrote"),
    (["simulate", "--algorithm", "reverse_ring", "--ranks", "5", "--bytes", "1M"], "# reverse_ring, 5 ranks, 1 MiB"),
])
def test_draw_and_simulate_take_the_algorithm_of_a_module_they_import(tmp_path, command, says):
    run = subprocess.run([sys.executable, "-m", "ringtree", command[0], "--import", str(EXAMPLE),
                          *[word.replace("OUT", str(tmp_path / "drawn")) for word in command[1:]]],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert says in run.stdout
    if command[0] == "draw":
        assert (tmp_path / "drawn.svg").read_text().lstrip().startswith("<?xml")


@ONE_RANK
def test_bench_times_the_algorithm_of_a_module_it_imports_against_mpi_s_own():
    run = run_mpiexec(2, "-m", "ringtree", "bench", "--import", str(EXAMPLE), "-b", "8", "-e", "64K", "-f", "64",
                      "--iters", "3", "--warmup", "1", "--algorithms", "reverse_ring,ring,native", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if "reverse_ring" in line.split()]
    assert len(rows) == 3 and all(row[-2] == "0" for row in rows), run.stdout  # #wrong: none


@ONE_RANK
def test_an_import_that_fails_or_registers_a_broken_algorithm_is_a_usage_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import ringtree\nfrom test_user_algorithm import unanswered\n"
                      "ringtree.register_algorithm('allreduce', 'unanswered', unanswered)\n")
    for module, says in [("no_such_module", "--import no_such_module: ModuleNotFoundError: No module named"),
                         (str(tmp_path / "missing.py"), "missing.py: FileNotFoundError: no file"),
                         (str(broken), "ValueError: ringtree.register_algorithm: allreduce algorithm 'unanswered' "
                                       "refused: on 2 ranks, 1 element: deadlock")]:
        run = subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--import", module, "--algorithm",
                              "unanswered", "--ranks", "2", "--bytes", "8"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parent)})
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert "usage: python -m ringtree simulate" in run.stderr and says in run.stderr, run.stderr
