"""The α-β-γ simulator, the draw command and the calibration fits, checked without MPI."""

import fcntl
import json
import math
import os
import pty
import struct
import subprocess
import sys
import termios
import xml.etree.ElementTree as ElementTree

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ringtree.sim.simulator
from ringtree.algorithms import ALGORITHMS, REGISTRY
from ringtree.algorithms.tree import binomial_family
from ringtree.commands.draw import draw
from ringtree.sim import Call, Costs, simulate
from ringtree.sim.calibration import best_fit, fit_per_byte, fit_protocols, simulated
from ringtree.sim.events import run_events
from ringtree.sim.flat import flat_schedules
from ringtree.sim.turned import run_periodic, run_turned, turned_schedules, turned_sizes
from ringtree.tuning.selector import WINDOW, runs_stepwise

COSTS = Costs(alpha=1e-5, beta=1e-9, gamma=5e-10)


@pytest.mark.parametrize("nranks", list(range(2, 65)) + [100, 128, 255, 256])
def test_ring_sends_2_n_minus_1_over_n_of_the_data_from_every_rank(nranks):
    nbytes = 4 * nranks * 1000  # whole chunks: the share is exact
    result = simulate('ring', nranks, nbytes, COSTS)
    ideal = 2 * (nranks - 1) * nbytes // nranks
    assert result.bytes_sent == result.bytes_received == (ideal,) * nranks
    assert result.messages_sent == (2 * (nranks - 1),) * nranks


@pytest.mark.parametrize("nranks", [3, 7, 64])
def test_ring_share_rounds_by_at_most_one_element_per_message(nranks):
    nbytes = 4 * (nranks * 1000 + 1)
    ideal = 2 * (nranks - 1) * nbytes / nranks
    for sent in simulate('ring', nranks, nbytes, COSTS).bytes_sent:
        assert abs(sent - ideal) <= 2 * (nranks - 1) * 4


def test_two_rank_ring_and_tree_times_follow_the_model_by_hand():
    alpha, beta, gamma, k = 1e-5, 1e-9, 5e-10, 1 << 20
    # ring: exchange half each way, reduce that half, exchange the reduced halves
    ring = simulate('ring', 2, k, Costs(alpha=alpha, beta=beta, gamma=gamma))
    assert ring.time == pytest.approx(2 * alpha + 2 * beta * k / 2 + gamma * k / 2)
    # tree: rank 1 sends all to rank 0, which reduces and sends all back
    tree = simulate('tree', 2, k, Costs(alpha=alpha, beta=beta, gamma=gamma))
    assert tree.time == pytest.approx(2 * (alpha + beta * k) + gamma * k)


def test_a_receive_port_takes_one_message_at_a_time():
    # tree on 3 ranks: the root receives from ranks 1 and 2, one after the other, then sends to both in turn
    alpha, k = 1e-5, 4000
    result = simulate('tree', 3, k, Costs(alpha=alpha, beta=0.0, gamma=0.0))
    assert result.time == pytest.approx(4 * alpha)
    assert result.finish[0] == pytest.approx(4 * alpha)


def test_pipelining_lets_the_levels_of_a_tree_overlap():
    k = 64 << 20
    whole = simulate('tree', 8, k, Costs(alpha=1e-06, beta=1e-10, gamma=1e-10))
    pipelined = simulate('tree', 8, k, Costs(alpha=1e-06, beta=1e-10, gamma=1e-10), segment=1 << 20)
    assert pipelined.time < 0.8 * whole.time
    assert pipelined.bytes_sent == whole.bytes_sent
    # a leaf sends its whole message up and receives the result, each in 64 segments
    assert pipelined.messages_sent[7] == pipelined.messages_received[7] == 64


def test_the_call_overhead_delays_every_rank_alike():
    plain = simulate('double_tree', 6, 4096, COSTS)
    late = simulate('double_tree', 6, 4096, COSTS._replace(overhead=7e-06))
    assert late.finish == pytest.approx([f + 7e-6 for f in plain.finish])


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), nranks=st.integers(1, 24), count=st.integers(0, 400),
       segment=st.sampled_from([0, 4, 64, 256]))
def test_traffic_balances_and_nothing_finishes_before_it_can(algorithm, nranks, count, segment):
    result = simulate(algorithm, nranks, 4 * count, COSTS, segment=segment, trace=True)
    assert sum(result.bytes_sent) == sum(result.bytes_received)
    assert sum(result.messages_sent) == sum(result.messages_received)
    for event in result.events:
        assert event.finish >= event.start >= 0
    if nranks > 1 and count:
        # at least one message of the whole data's share and one reduction stand between start and end
        assert result.time >= COSTS.alpha
    assert result.time == max(result.finish, default=0.0)
    without_trace = simulate(algorithm, nranks, 4 * count, COSTS, segment=segment)
    assert without_trace.time == result.time and without_trace.bytes_sent == result.bytes_sent


def test_tree_root_carries_log_n_times_the_data():
    nranks, k = 16, 4 << 20
    result = simulate('tree', nranks, k, COSTS)
    children = len(binomial_family(nranks, 0)[1])
    assert children == math.log2(nranks)
    assert result.bytes_sent[0] == result.bytes_received[0] == children * k
    assert sum(result.bytes_sent) == 2 * (nranks - 1) * k  # each rank but the root: once up, once down


def _every_rank(nranks, count, segment, costs, stepwise=False):
    """The ring of `count` float32 elements (segments of `segment`), every rank built and simulated."""
    return run_events(flat_schedules("ring", nranks, count, segment, stepwise=stepwise),
                      Call("ring", nranks, 4 * count, 4, 4 * segment), costs)


def _outcome(result):
    """All a simulation says but its trace: times, and traffic per rank."""
    return (result.time, result.finish, result.bytes_sent, result.bytes_received, result.messages_sent,
            result.messages_received, result.bytes_reduced)


@pytest.mark.parametrize("algorithm", sorted(name for name, entry in REGISTRY["allreduce"].items() if entry.turning))
@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("count_of, segment", [(lambda n: n, 0), (lambda n: 7 * n, 0), (lambda n: 7 * n + 3, 0),
                                               (lambda n: 40 * n + n // 2, 12), (lambda n: 40 * n, 3), (lambda n: 0, 0),
                                               (lambda n: n - 1, 0), (lambda n: n // 2 + 1, 0), (lambda n: n - 1, 1),
                                               (lambda n: n // 2 + 1, 2)])
def test_turning_schedules_are_every_rank_s_schedule_turned(algorithm, nranks, count_of, segment):
    """What an entry's `turning` claims: rank r's ops are those of rank 0's schedule for C = turning(N, count)
    elements, each peer p as (p + r) mod N, each region of chunk c in chunk (c + r) mod N, less those on
    chunks empty at `count`: so the kinds, peers and sizes turned_sizes derives from rank 0's program."""
    count = count_of(nranks)
    built_for = REGISTRY["allreduce"][algorithm].turning(nranks, count)
    assert built_for == (count if count >= nranks or count == 0 else nranks)
    template = flat_schedules(algorithm, nranks, built_for, segment, regions=True, ranks=1)[0]
    sizes = turned_sizes(template, nranks, count, segment, built_for)
    assert sizes is not None
    for rank, program in enumerate(flat_schedules(algorithm, nranks, count, segment)):
        kept = [k for k in range(len(template[0])) if sizes[k, rank] > 0]
        assert len(kept) == len(template[0]) or built_for != count
        assert program[0] == bytes(template[0][k] for k in kept)
        assert program[1] == [None if template[1][k] is None else (template[1][k] + rank) % nranks for k in kept]
        assert program[2] == [int(sizes[k, rank]) * 4 for k in kept]


@pytest.mark.parametrize("nranks, count, segment", [(2, 2, 0), (3, 30, 0), (4, 4000, 0), (8, 8 * 999, 0),
                                                   (8, 8 * 1000, 256), (5, 5 * 77, 9), (16, 16 * 64, 16),
                                                   (2, 3, 0), (3, 31, 0), (8, 8 * 999 + 5, 0), (7, 13, 0),
                                                   (8, 8 * 1000 + 3, 256), (5, 5 * 77 + 2, 9), (9, 1000, 50),
                                                   (16, 16 * 64 + 7, 17), (5, 0, 0),
                                                   (8, 5, 0), (16, 7, 0), (31, 30, 0), (64, 33, 0), (3, 1, 0),
                                                   (16, 7, 1), (31, 30, 2), (9, 4, 3), (64, 63, 1)])
@pytest.mark.parametrize("costs", [COSTS, Costs(alpha=2e-6, beta=3e-10, gamma=1e-10, overhead=1e-5,
                                               eager_limit=1024, alpha_rendezvous=2e-5),
                                   Costs(alpha=0.0, beta=1e-9, gamma=5e-9)])
def test_a_turning_schedule_simulated_for_all_ranks_at_once_matches_the_event_simulation(nranks, count, segment,
                                                                                         costs):
    # The last nine have fewer elements than ranks: rank 0's schedule for one element a chunk, with
    # each rank's ops on its empty chunks left out; segmented or not, as a chunk's one element is one
    # segment.
    built_for = REGISTRY["allreduce"]["ring"].turning(nranks, count)
    program = flat_schedules("ring", nranks, built_for, segment, regions=True, ranks=1)[0]
    at_once = run_turned(program, Call("ring", nranks, 4 * count, 4, 4 * segment), costs, built_for)
    assert at_once is not None  # these shapes and costs leave no doubt about the serving order
    full = _every_rank(nranks, count, segment, costs)
    assert _outcome(at_once) == _outcome(full)
    assert simulate('ring', nranks, 4 * count, costs, segment=4 * segment).finish == full.finish


@pytest.mark.parametrize("algorithm", sorted(name for name, entry in REGISTRY["allreduce"].items() if entry.period))
@pytest.mark.parametrize("nranks, count, segment", [(8, 4, 0), (12, 9, 0), (16, 12, 0), (16, 40, 3), (12, 30, 4),
                                                   (6, 0, 0), (10, 25, 0), (9, 9, 0)])
def test_periodic_schedules_repeat_every_period_ranks(algorithm, nranks, count, segment):
    """What an entry's `period` claims: rank r + P's program is rank r's with every peer p as (p + P) mod N."""
    period = REGISTRY["allreduce"][algorithm].period(nranks, count)
    assert nranks % period == 0
    programs = flat_schedules(algorithm, nranks, count, segment)
    for rank in range(nranks - period):
        later, program = programs[rank + period], programs[rank]
        assert later[0] == program[0] and later[2:6] == program[2:6]
        assert later[1] == [None if p is None else (p + period) % nranks for p in program[1]]


@pytest.mark.parametrize("nranks, count, segment", [(8, 4, 0), (8, 6, 0), (16, 12, 0), (12, 9, 0), (64, 48, 0),
                                                   (10, 5, 0), (16, 8, 1), (16, 2, 0)])
@pytest.mark.parametrize("costs", [COSTS, Costs(alpha=2e-6, beta=3e-10, gamma=1e-10, overhead=1e-5,
                                               eager_limit=2, alpha_rendezvous=2e-5),
                                   Costs(alpha=0.0, beta=1e-9, gamma=5e-9)])
def test_a_periodic_schedule_simulated_on_one_period_of_ranks_matches_all_ranks(nranks, count, segment, costs):
    # Fewer elements than ranks: empty chunks, so the ranks differ, but every P-th rank alike.
    period = REGISTRY["allreduce"]["ring"].period(nranks, count)
    assert period < nranks
    few = run_periodic(Call("ring", nranks, 4 * count, 4, 4 * segment), period, costs)
    assert few is not None
    full = _every_rank(nranks, count, segment, costs)
    assert _outcome(few) == _outcome(full)
    assert simulate('ring', nranks, 4 * count, costs, segment=4 * segment).finish == full.finish


@settings(max_examples=25, deadline=None)
@given(nranks=st.integers(2, 24), per_rank=st.sampled_from([0, 0, 1, 2, 5]), extra=st.integers(0, 23),
       segment=st.sampled_from([0, 0, 1, 3]), costs=st.sampled_from([
           COSTS, Costs(alpha=2e-6, beta=3e-10, gamma=1e-10, overhead=1e-5, eager_limit=8, alpha_rendezvous=2e-5),
           Costs(alpha=0.0, beta=1e-9, gamma=5e-9), Costs(alpha=1e-6, beta=0.0, gamma=0.0),
           Costs(alpha=1e-6, beta=1e-10, gamma=1e-11, setup=4e-7)]),
       duplex=st.booleans(), stepwise=st.booleans())
def test_the_ring_s_shortcuts_give_what_simulating_every_rank_gives(nranks, per_rank, extra, segment, costs, duplex,
                                                                   stepwise):
    count = per_rank * nranks + extra % nranks
    stepwise = stepwise and not segment  # a step at a time is for unsegmented schedules
    costs = costs._replace(duplex=duplex)
    fast = simulate("ring", nranks, 4 * count, costs, segment=4 * segment, stepwise=stepwise)
    assert _outcome(fast) == _outcome(_every_rank(nranks, count, segment, costs, stepwise))


def test_a_setup_cost_makes_an_exchange_dearer_than_a_one_way_message():
    # A message holds both its ranks for its first `setup`: of two ranks exchanging, one message
    # starts that much after the other; a one-way message waits for nothing.
    costs = Costs(alpha=1.0, beta=0.0, gamma=0.0, setup=0.5)
    assert simulate('ring', 2, 8, costs).time == 3.0  # two exchanges
    assert simulate('recursive_doubling', 2, 8, costs).time == 1.5  # one
    assert simulate('tree', 2, 8, costs).time == 2.0  # up, then down: one way each
    with pytest.raises(ValueError, match="must be >= 0"):
        simulate('ring', 4, 64, COSTS._replace(setup=-1.0))


def test_the_stepwise_path_runs_each_rank_s_ops_a_step_at_a_time():
    # The double tree on 2 ranks lists rank 0's send of rank 1's half after its own half's reduction;
    # posted when ready, that send leaves at once (two message times in all), but run in listed order
    # it waits for the reduction, and rank 1's half comes back a message time later.
    costs = Costs(alpha=1.0, beta=0.0, gamma=0.0)
    assert simulate('double_tree', 2, 8, costs).time == 2.0
    assert simulate('double_tree', 2, 8, costs, stepwise=True).time == 3.0
    # The ring and the tree list their ops in the order they can run: nothing changes.
    for algorithm in ("ring", "tree"):
        assert simulate(algorithm, 2, 8, costs, stepwise=True).time == simulate(algorithm, 2, 8, costs).time
    with pytest.raises(ValueError, match="unsegmented"):
        simulate('ring', 4, 1 << 20, COSTS, segment=1 << 16, stepwise=True)


def test_where_ranks_split_chunks_into_different_segment_counts_every_rank_is_simulated():
    # 16 ranks, chunks of 64 and 65 elements, segments of 16: 4 segments on some ranks, 5 on others.
    program = flat_schedules("ring", 16, 16 * 64 + 7, 16, regions=True)[0]
    assert turned_sizes(program, 16, 16 * 64 + 7, 16) is None
    assert run_turned(program, Call("ring", 16, 4 * (16 * 64 + 7), 4, 64), COSTS) is None
    full = _every_rank(16, 16 * 64 + 7, 16, COSTS)
    assert simulate('ring', 16, 4 * (16 * 64 + 7), COSTS, segment=64).finish == full.finish


@pytest.fixture
def refuse_rank_by_rank(monkeypatch):
    """A call that makes building every rank's schedule (flat_schedules) fail the test from then on."""
    def every_rank(*args, **kwargs):
        raise AssertionError("every rank's schedule built")
    return lambda: monkeypatch.setattr(ringtree.sim.simulator, "flat_schedules", every_rank)


def test_a_1024_rank_segmented_ring_with_fewer_elements_than_ranks_runs_every_rank_at_once(refuse_rank_by_rank):
    # 1023 elements: a period of 1024 ranks, so without the turned shortcut every rank's schedule would
    # be built and run as events, which takes minutes.
    refuse_rank_by_rank()
    result = simulate('ring', 1024, 4 * 1023, COSTS, segment=4)
    assert sum(result.bytes_sent) == sum(result.bytes_received) == 2 * 1023 * 1023 * 4  # each element 2(N-1) hops


@pytest.mark.parametrize("nranks, count, segment", [(2, 2, 0), (5, 5 * 40, 7), (8, 8 * 64, 16), (16, 16 * 3, 0),
                                                   (13, 13 * 50, 12)])
@pytest.mark.parametrize("window", [2, 4])
def test_turned_programs_are_every_rank_s_own_where_chunks_are_alike(nranks, count, segment, window):
    template = flat_schedules("ring", nranks, count, segment, window, regions=True, ranks=1)[0]
    turned = turned_schedules(template, nranks, count, segment)
    assert [program[:7] for program in turned] == [program[:7] for program in
                                                  flat_schedules("ring", nranks, count, segment, window)]


@pytest.mark.parametrize("count", [12 * 30, 12 * 30 + 5])
def test_one_port_simulation_builds_rank_0_s_schedule_only(refuse_rank_by_rank, count):
    expected = run_events(flat_schedules("ring", 12, count, 8), Call("ring", 12, 4 * count, 4, 32),
                          COSTS._replace(duplex=False))
    refuse_rank_by_rank()
    assert _outcome(simulate('ring', 12, 4 * count, COSTS._replace(duplex=False), segment=32)) == _outcome(expected)


def _ordered(dependents) -> list[int]:
    """Each op's transitive successors, as a bit mask: the order a program's dependencies impose."""
    after = [0] * len(dependents)
    for op in reversed(range(len(dependents))):
        for successor in dependents[op]:
            after[op] |= after[successor] | 1 << successor
    return after


# Chunks differing by an element, unsplit or split into as many segments on every rank.
@pytest.mark.parametrize("nranks, count, segment", [(3, 4, 0), (7, 13, 0), (7, 20, 3), (5, 5 * 9 + 2, 4),
                                                   (16, 16 * 3 + 15, 0), (9, 9 * 6 + 4, 4)])
@pytest.mark.parametrize("window", [2, 4])
def test_turned_programs_simulate_as_every_rank_s_own_where_chunks_differ_by_one(nranks, count, segment, window):
    template = flat_schedules("ring", nranks, count, segment, window, regions=True, ranks=1)[0]
    turned = turned_schedules(template, nranks, count, segment)
    own = flat_schedules("ring", nranks, count, segment, window)
    # The same ops and sizes; a rank's own dependencies may link more ops, but never order them otherwise.
    assert [(p[0], p[1], p[2], p[4], p[6]) for p in turned] == [(p[0], p[1], p[2], p[4], p[6]) for p in own]
    assert [_ordered(p[3]) for p in turned] == [_ordered(p[3]) for p in own]
    call = Call("ring", nranks, 4 * count, 4, 4 * segment)
    for costs in (COSTS, Costs(alpha=0.0, beta=1e-9, gamma=1e-9),
                  Costs(alpha=2e-6, beta=3e-10, gamma=2e-9, eager_limit=16, alpha_rendezvous=9e-6)):
        for duplex in (True, False):
            assert _outcome(run_events(turned, call, costs._replace(duplex=duplex))) \
                == _outcome(run_events(own, call, costs._replace(duplex=duplex)))


def test_turned_programs_decline_empty_chunks_and_chunks_split_unalike():
    assert turned_schedules(flat_schedules("ring", 8, 8, regions=True, ranks=1)[0], 8, 5, 0) is None
    # chunks of 64 and 65 elements in segments of 16: 4 on some ranks, 5 on others
    template = flat_schedules("ring", 16, 16 * 64 + 7, 16, regions=True, ranks=1)[0]
    assert turned_schedules(template, 16, 16 * 64 + 7, 16) is None


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_1024_ranks(algorithm):
    result = simulate(algorithm, 1024, 1 << 20, COSTS)
    assert len(result.finish) == 1024 and result.time > 0
    assert sum(result.bytes_sent) == sum(result.bytes_received)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        simulate('butterfly', 4, 64, COSTS)
    with pytest.raises(ValueError, match="multiple of itemsize"):
        simulate('ring', 4, 63, COSTS)
    with pytest.raises(ValueError, match="must be >= 0"):
        simulate('ring', 4, 64, Costs(alpha=-1.0, beta=0.0, gamma=0.0))


@pytest.mark.parametrize("algorithm", ["ring", "tree", "double_tree"])
def test_draw_writes_valid_svg_with_an_arrow_per_message(algorithm, tmp_path):
    path = tmp_path / f"{algorithm}.svg"
    draw(algorithm, 4, 4, str(path))
    root = ElementTree.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    text = path.read_text()
    assert all(f"rank {r}" in text for r in range(4))
    # matplotlib names each annotation's arrow patch in a group id "patch_..."; count one per message
    messages = sum(simulate(algorithm, 4, 4, COSTS, itemsize=1).messages_sent)
    arrows = sum(1 for element in root.iter() if element.get("id", "").startswith("patch_"))
    assert arrows >= messages


@pytest.mark.slow
def test_simulate_command_prints_json():
    out = subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "8",
                          "--bytes", "1MiB", "--json", "-"], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert result["bytes_sent"] == [2 * 7 * (1 << 20) // 8] * 8
    assert result["time"] > 0


@pytest.mark.slow
def test_simulate_command_runs_a_blocking_call_a_step_at_a_time():
    times = [json.loads(subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "double_tree",
                                        "--ranks", "2", "--bytes", "8", "--alpha", "1", "--beta", "0", "--gamma", "0",
                                        "--json", "-", *stepwise], capture_output=True, text=True,
                                       check=True).stdout)["time"]
             for stepwise in ([], ["--stepwise"])]
    assert times == [2.0, 3.0]


@pytest.mark.slow
def test_simulate_command_takes_a_setup_cost():
    out = subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "2",
                          "--bytes", "8", "--alpha", "1", "--beta", "0", "--gamma", "0", "--setup", "0.5", "--json", "-"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["time"] == 3.0


@pytest.mark.slow
def test_simulate_command_gives_ranges_where_ranks_differ_too_much_for_a_line_each():
    # 64 ranks, chunks of 10 and 11 elements: traffic differs from rank to rank by an element or so
    command = [sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "64", "--bytes",
               str(4 * (64 * 10 + 7))]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    result = json.loads(subprocess.run(command + ["--json", "-"], capture_output=True, text=True, check=True).stdout)
    low, high = (line.split() for line in out.splitlines() if line.lstrip().startswith(("min of", "max of")))
    assert low[:3] == ["min", "of", "64"] and high[:3] == ["max", "of", "64"]
    assert int(low[3]) == min(result["bytes_sent"]) < int(high[3]) == max(result["bytes_sent"])
    assert "--json lists every rank" in out


@pytest.mark.slow
def test_a_command_whose_reader_goes_away_stops_quietly():
    # About 90 KB of JSON, more than a pipe holds: the command is still writing when the reader leaves.
    command = subprocess.Popen([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "1024",
                                "--bytes", "1MiB", "--json", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert command.stdout.readline().strip() == b"{"
    command.stdout.close()
    assert command.wait(timeout=60) == 1
    assert command.stderr.read() == b""


SIMULATE_EVERY_RANK = [sys.executable, "-m", "ringtree", "simulate", "--algorithm", "tree", "--ranks", "64",
                       "--bytes", "1MiB", "--no-duplex"]  # a tree, one port per rank: no shortcut


@pytest.mark.slow
def test_simulating_every_rank_shows_progress_on_a_terminal_and_nothing_elsewhere():
    pid, terminal = pty.fork()
    if pid == 0:  # the command, on a terminal 100 columns wide
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        os.execv(sys.executable, SIMULATE_EVERY_RANK)
    shown = b""
    while True:
        try:
            data = os.read(terminal, 4096)
        except OSError:  # the command has ended
            break
        if not data:
            break
        shown += data
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert b"building schedules" in shown and b"simulating" in shown and b"predicted time" in shown
    piped = subprocess.run(SIMULATE_EVERY_RANK, capture_output=True, check=True)
    assert piped.stderr == b"" and b"predicted time" in piped.stdout


@pytest.mark.slow
def test_simulate_command_refuses_half_a_protocol_with_a_message():
    run = subprocess.run([sys.executable, "-m", "ringtree", "simulate", "--algorithm", "ring", "--ranks", "4",
                          "--bytes", "1M", "--eager-limit", "4K"], capture_output=True, text=True)
    assert run.returncode == 2 and "simulate: error: eager_limit and alpha_rendezvous go together" in run.stderr
    assert "Traceback" not in run.stderr


def test_calibration_fits_recover_known_parameters():
    alpha, alpha_rendezvous, limit, beta = 3e-6, 9e-6, 2048, 2e-10
    sizes = [8 << (2 * i) for i in range(12)]
    messages = {n: (alpha if n <= limit else alpha_rendezvous) + beta * n for n in sizes}
    fitted = fit_protocols(messages)
    assert fitted[2] == limit
    assert fitted[:2] + fitted[3:] == pytest.approx((alpha, alpha_rendezvous, beta), rel=1e-6)
    assert fit_per_byte({n: 1.5e-10 * n for n in sizes}) == pytest.approx(1.5e-10)


def test_messages_above_the_eager_limit_take_the_rendezvous_latency():
    costs = Costs(alpha=1e-6, beta=0.0, gamma=0.0)
    small = simulate('tree', 2, 1024, costs._replace(eager_limit=1024, alpha_rendezvous=5e-06))
    large = simulate('tree', 2, 1028, costs._replace(eager_limit=1024, alpha_rendezvous=5e-06))
    assert small.time == pytest.approx(2e-6) and large.time == pytest.approx(10e-6)
    with pytest.raises(ValueError, match="go together"):
        simulate('tree', 2, 1024, costs._replace(eager_limit=1024))


def test_with_one_port_a_rank_sends_or_receives_not_both():
    alpha, beta, gamma, k = 1e-5, 1e-9, 5e-10, 1 << 20
    costs = Costs(alpha=alpha, beta=beta, gamma=gamma)
    # recursive doubling on 2 ranks: one exchange, then the reduction
    assert simulate('recursive_doubling', 2, k, costs).time == pytest.approx(alpha + beta * k + gamma * k)
    assert simulate('recursive_doubling', 2, k, costs._replace(duplex=False)).time == pytest.approx(
        2 * (alpha + beta * k) + gamma * k)
    # the tree's two messages go one way each, one after the other: one port changes nothing
    assert simulate('tree', 2, k, costs._replace(duplex=False)).time == simulate('tree', 2, k, costs).time


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("nranks", [3, 4, 8])
def test_one_port_is_never_faster_and_is_simulated_on_every_rank(algorithm, nranks):
    count = 64 * nranks
    one_port = simulate(algorithm, nranks, 4 * count, COSTS._replace(duplex=False))
    assert one_port.time >= simulate(algorithm, nranks, 4 * count, COSTS).time
    full = run_events(flat_schedules(algorithm, nranks, count), Call(algorithm, nranks, 4 * count),
                      COSTS._replace(duplex=False))
    assert one_port.finish == full.finish  # a turning schedule does not turn in time with one port


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_calibration_fits_simulate_as_simulate_does(algorithm):
    costs = COSTS._replace(overhead=2e-6, eager_limit=4096, alpha_rendezvous=2e-5, setup=1e-6)
    for nbytes, segment in ((1 << 10, 0), (12 << 10, 4096), (1 << 20, 256 << 10), (1 << 20, 0)):
        for duplex in (True, False):
            costs = costs._replace(duplex=duplex)
            assert simulated(algorithm, nbytes, segment, costs._asdict()) == simulate(
                algorithm, 2, nbytes, costs, segment=segment, window=WINDOW,
                stepwise=runs_stepwise(algorithm, nbytes, segment)).time


@pytest.mark.slow
@pytest.mark.parametrize("port, model", [("full duplex", dict(duplex=True, setup=2e-6)),
                                         ("one port", dict(duplex=False))])
def test_calibration_finds_the_port_model_eager_limit_and_costs_of_its_data(port, model):
    truth = Costs(alpha=4e-6, alpha_rendezvous=9e-6, eager_limit=8192, beta=2e-10, gamma=1e-10, overhead=5e-6,
                  **model)
    collectives = [(algorithm, nbytes, 0, simulate(algorithm, 2, nbytes, truth,
                                                   stepwise=runs_stepwise(algorithm, nbytes, 0)).time)
                   for algorithm in ("ring", "tree", "recursive_doubling", "double_tree")
                   for nbytes in (1 << 10, 1 << 14, 1 << 18, 1 << 22)]
    primitives = dict(alpha=5e-6, alpha_rendezvous=1e-5, eager_limit=4096, beta=3e-10, gamma=2e-10, overhead=0.0)
    fitted, fits = best_fit(collectives, primitives)
    assert fitted is fits[port] and fitted["eager_limit"] == 8192
    names = ("alpha", "alpha_rendezvous", "beta", "gamma", "overhead")
    assert [fitted[name] for name in names] == pytest.approx([getattr(truth, name) for name in names], rel=1e-3)
    assert fitted["setup"] == pytest.approx(truth.setup, rel=1e-3, abs=1e-9)  # 1 ns: none

