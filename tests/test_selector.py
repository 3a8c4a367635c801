"""The selector, the tuning table and the cost model, without MPI."""

import json
import re

import pytest

from ringtree import settings
from ringtree.algorithms import ALGORITHMS, REGISTRY
from ringtree.schedule import OpKind
from ringtree.sim.verify import allreduce_schedules
from ringtree.tuning import selector
from ringtree.tuning.model import Params, coefficients, fit, predict
from ringtree.tuning.selector import TuningTable, select

SEGMENT_BYTES = REGISTRY["allreduce"]["ring"].segment  # every allreduce algorithm's default


def _table(rules, models=None, segments=None):
    return TuningTable({"format": selector.FORMAT, "rules": rules, "models": models or {}, "segments": segments or {}},
                       "test.json")


@pytest.fixture
def table():
    rules = [
        {"ranks": [2, 2], "bytes": [0, 1024], "algorithm": "tree", "segment": 0, "ops": ["max"]},
        {"ranks": [2, 2], "bytes": [0, 1024], "algorithm": "recursive_doubling", "segment": 0},
        {"ranks": [2, 4], "bytes": [1025, None], "algorithm": "ring", "segment": 1 << 20},
    ]
    selector.use_table(_table(rules, {"2": {"alpha": 1e-5, "beta": 1e-10, "gamma": 1e-10}}))
    yield
    selector.use_table(None)


def test_the_first_matching_rule_wins_and_filters_apply(table):
    assert select(8, 2, "float32", "max")[:2] == ("tree", 0)
    assert select(8, 2, "float32", "sum")[:2] == ("recursive_doubling", 0)
    assert select(1024, 2)[:2] == ("recursive_doubling", 0)
    assert select(1025, 3)[:2] == ("ring", 0)  # one segment would hold it all: not split
    assert select(4 << 20, 4)[:2] == ("ring", 1 << 20)
    assert select(4 << 20, 4).source == "table test.json rule 2"


def test_uncovered_rank_counts_go_to_the_model(table):
    choice = select(8, 8)
    params = selector.table().model(8)
    assert choice.source == "model"
    best = min(ALGORITHMS, key=lambda name: predict(name, 8, 8, params, SEGMENT_BYTES))
    assert choice.algorithm == best


@pytest.fixture
def environment(monkeypatch):
    """A function that makes the settings those of an environment holding just these variables."""
    return lambda **variables: monkeypatch.setattr(settings, "_current", settings.read(variables))


def test_explicit_algorithm_and_segment_win(table, environment):
    assert select(8, 2, algorithm="double_tree")[:2] == ("double_tree", 0)
    assert select(8 << 20, 2, segment=1 << 20)[:2] == ("ring", 1 << 20)
    environment(RINGTREE_ALGORITHM="rabenseifner")
    assert select(8, 2).algorithm == "rabenseifner" and select(8, 2).source == "RINGTREE_ALGORITHM"
    assert select(8, 2, algorithm="tree").algorithm == "tree"


def test_the_identity_changes_with_the_table_and_the_setting(table, environment):
    first = selector.identity()
    selector.use_table(_table([{"ranks": [1, 9], "bytes": [0, None], "algorithm": "tree", "segment": 0}]))
    assert selector.identity() != first
    second = selector.identity()
    environment(RINGTREE_ALGORITHM="ring")
    assert selector.identity() != second


def test_bad_tables_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a ringtree tuning table"):
        TuningTable({"rules": []}, "x.json")
    with pytest.raises(ValueError, match="unknown algorithm 'fast'"):
        _table([{"ranks": [1, 2], "bytes": [0, None], "algorithm": "fast", "segment": 0}])
    refused = [({"bytes": [0, None]}, '"ranks": [low, high]'), ({"ranks": [1, 2], "bytes": [8]}, "not [8]"),
               ({"ranks": [4, 2], "bytes": [0, None]}, "not [4, 2]"), ({"ranks": [1, 2], "bytes": [0, None], "nodes": "2"},
                                                                       '"nodes"')]
    for rule, said in refused:
        with pytest.raises(ValueError, match=re.escape(said)):
            _table([{**rule, "algorithm": "ring", "segment": 0}])
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": selector.FORMAT, "rules": []}))
    assert TuningTable.load(str(path)).origin == "t.json"


def test_the_packaged_table_covers_2_and_4_ranks_at_every_size_it_measured_and_no_more():
    packaged = selector.default_table()
    for nranks in (2, 4):
        for shift in range(0, 29):
            assert packaged.match(1 << shift, nranks, "float32", "sum") is not None
        assert packaged.match((256 << 20) + 1, nranks, "float32", "sum") is None
        assert nranks in packaged.models


def test_outside_a_small_tables_sizes_the_model_chooses_as_with_no_table(table):  # table: reset after
    # What `tune -b 8 -e 64K` writes: rules up to 64 KiB only.
    selector.use_table(_table([{"ranks": [2, 2], "bytes": [0, 65536], "algorithm": "tree", "segment": 16384}],
                              models={"2": {"alpha": 1e-5, "beta": 3e-10, "gamma": 2e-10}},
                              segments={"2": {name: 16384 for name in ALGORITHMS}}))
    assert select(1 << 16, 2).source.startswith("table")
    assert select(1 << 16, 2, algorithm="ring").segment == 16384  # its segment sizes too, where it measured
    big = select(64 << 20, 2)
    assert big.source == "model" and big.segment == SEGMENT_BYTES  # not 16 KiB: 4096 pieces of 64 MiB
    selector.use_table(_table([], models={"2": {"alpha": 1e-5, "beta": 3e-10, "gamma": 2e-10}}))
    assert select(64 << 20, 2)._replace(source="") == big._replace(source="")


def test_fit_recovers_the_parameters_it_was_made_with():
    truth = Params(alpha=7e-6, beta=3e-10, gamma=9e-10)
    measurements = [(name, n, size, 0, predict(name, n, size, truth))
                    for name in ALGORITHMS for n in (2, 3, 4, 8) for size in (8, 4096, 1 << 20, 1 << 26)]
    fitted = fit(measurements)
    for got, want in zip(fitted, truth):
        assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8, 13])
def test_the_models_bytes_bound_what_the_busiest_rank_sends(algorithm, nranks):
    # The model's β coefficient is the bytes sent along the critical path, which is at least what
    # the busiest rank sends (double tree, pipelined, counts its two trees' traffic at once).
    count = 1024 * nranks
    sent = max(sum(op.src.count for op in s.ops if op.kind is OpKind.SEND)
               for s in allreduce_schedules(algorithm, nranks, count))
    assert sent <= coefficients(algorithm, nranks, count)[1] * count + 1e-9


def test_tune_picks_per_algorithm_the_segment_best_where_all_were_tried():
    from ringtree.commands.measure import candidates
    from ringtree.commands.table_file import segments_from
    timings = {(1 << 20): 3.0, (4 << 20): 2.0, (16 << 20): 2.5}
    measurements = []
    for nbytes in (8 << 20, 32 << 20, 64 << 20):
        for algorithm, segment in candidates(nbytes, ["ring", "tree"], list(timings)):
            seconds = (timings.get(segment, 9.0) if algorithm == "ring" else 10.0 - timings.get(segment, 0.0))
            measurements.append((algorithm, 2, nbytes, segment, seconds * nbytes))
    assert segments_from(measurements) == {"ring": 4 << 20, "tree": 1 << 20}


def _winners(times_by_size: dict[int, dict[str, float]]) -> list[str]:
    from ringtree.commands.table_file import winners_from
    mean = {nbytes: {(alg, 0): t for alg, t in times.items()} for nbytes, times in times_by_size.items()}
    return [alg for _, alg, *_ in winners_from(mean, ["ring", "tree"], {"ring": 1 << 30, "tree": 1 << 30})]


def test_tune_puts_a_crossover_where_it_was_measured():
    # The ring 3 % faster from 4 KiB on: a rule that kept the previous winner within 5 % would start
    # it a size late, or never.
    times = {1 << k: {"tree": 1.0, "ring": 1.2 if k < 12 else 0.97} for k in range(8, 16)}
    assert _winners(times) == ["tree"] * 4 + ["ring"] * 4


def test_tune_smooths_a_lone_near_tie_but_keeps_a_lone_clear_win():
    times = {1 << k: {"tree": 1.0, "ring": 1.1} for k in range(8, 13)}
    times[1 << 9]["ring"] = 0.98   # 2 % ahead at one size between two of the tree's: noise
    times[1 << 11]["ring"] = 0.80  # 20 % ahead: kept
    assert _winners(times) == ["tree", "tree", "tree", "ring", "tree"]


LAYOUT = {"ranks": [2, 2], "nodes": [1, 1], "ranks_per_node": [2, 2]}  # what tune stamps on 2 ranks of one node


def _rule(low, high, algorithm, segment=0):
    return {**LAYOUT, "bytes": [low, high], "algorithm": algorithm, "segment": segment}


def test_rules_are_kept_per_layout_of_nodes_and_ranks_per_node():
    from ringtree.schedule.topology import Topology
    two_by_two, round_robin, one_node = Topology.parse("2,2"), Topology.of([0, 1, 0, 1]), Topology.flat(4)
    table = selector.TuningTable({"format": selector.FORMAT, "rules": [
        {"ranks": [4, 4], "nodes": [2, None], "ranks_per_node": [2, 2], "bytes": [0, None], "algorithm": "hierarchical",
         "segment": 0},
        {"ranks": [4, 4], "nodes": [1, 1], "bytes": [0, None], "algorithm": "ring", "segment": 0},
        {"ranks": [4, 4], "bytes": [0, None], "algorithm": "tree", "segment": 0}]}, "test")
    assert table.match(1024, 4, None, None, two_by_two)[1]["algorithm"] == "hierarchical"
    assert table.match(1024, 4, None, None, round_robin)[1]["algorithm"] == "hierarchical"
    assert table.match(1024, 4, None, None, one_node)[1]["algorithm"] == "ring"
    assert table.match(1024, 4, None, None)[1]["algorithm"] == "ring"  # no topology: one node
    assert table.match(1024, 4, None, None, Topology.parse("1,3"))[1]["algorithm"] == "tree"  # 3 ranks on a node
    # the packaged table: measured rules on 2 nodes of 2, the hierarchical allreduce's from 4 KiB
    selector.use_table(selector.packaged_table())
    try:
        assert selector.select(1 << 20, 4, "float32", "sum", topology=round_robin).algorithm == "hierarchical"
        assert selector.select(1 << 20, 4, "float32", "sum", topology=one_node).algorithm != "hierarchical"
        # a layout no rule names: the model, which on several nodes takes the hierarchical allreduce
        choice = selector.select(1 << 20, 6, "float32", "sum", topology=Topology.parse("3,3"))
        assert (choice.algorithm, choice.source, choice.segment) == ("hierarchical", "model",
                                                                     selector.SEGMENT_BYTES_ACROSS_NODES)
    finally:
        selector.use_table(None)


def test_a_merged_retune_replaces_the_rules_of_its_sizes_only():
    from ringtree.commands.table_file import merged_rules, rules_from
    old = [_rule(0, 1024, "recursive_doubling"), _rule(1025, 1 << 20, "rabenseifner", 1 << 21),
           _rule((1 << 20) + 1, None, "ring", 1 << 22)]
    # re-tuned 4 KiB to 64 KiB (grid point below: 2 KiB): the ring wins up to 16 KiB, then the tree
    winners = [(4096, "ring", 1 << 22, 1.0, None), (16384, "ring", 1 << 22, 1.0, None),
               (65536, "tree", 1 << 21, 1.0, None)]
    new = rules_from(winners, LAYOUT, 2048)
    assert new == [_rule(2049, 16384, "ring", 1 << 22), _rule(16385, 65536, "tree", 1 << 21)]
    assert merged_rules(old, new, 2048, 65536) == [
        _rule(0, 1024, "recursive_doubling"), _rule(1025, 2048, "rabenseifner", 1 << 21),
        _rule(2049, 16384, "ring", 1 << 22), _rule(16385, 65536, "tree", 1 << 21),
        _rule(65537, 1 << 20, "rabenseifner", 1 << 21), _rule((1 << 20) + 1, None, "ring", 1 << 22)]
    # a winner the same as the old rule next to it joins it (an old table's open end stays open)
    joined = merged_rules(old, rules_from([(1 << 21, "ring", 1 << 22, 1.0, None)], LAYOUT, 1 << 20),
                          1 << 20, 1 << 21)
    assert joined == old
    assert merged_rules(old, [_rule(2049, 4096, "tree")], 2048, 4096)[-1] == old[-1]


def test_tune_writes_mpi_s_own_where_it_is_fastest_with_ringtree_s_fastest_for_the_calls_it_cannot_run():
    from ringtree.commands.table_file import rules_from, winners_from
    from ringtree.tuning.online import NATIVE
    # MPI's own fastest up to 512 B, then the ring; the tree beats the ring below 4 KiB
    mean = {1 << k: {("tree", 0): 2.0, ("ring", 0 if k <= 22 else 1 << 22): 3.0 if k < 12 else 1.0,
                     (NATIVE, 0): 1.5 if k < 12 else 5.0} for k in range(3, 27, 3)}
    segments = {"ring": 1 << 22, "tree": 1 << 22}
    winners = winners_from(mean, ["ring", "tree", NATIVE], segments, winners_from(mean, ["ring", "tree"], segments))
    rules = rules_from(winners, LAYOUT)
    assert [(rule["bytes"], rule["algorithm"], rule["segment"], rule.get("without_native")) for rule in rules] == [
        ([0, 512], NATIVE, 0, {"algorithm": "tree", "segment": 0}),
        ([513, 2 << 20], "ring", 0, None),  # unsplit where its messages fit in one segment
        ([(2 << 20) + 1, 16 << 20], "ring", 4 << 20, None)]
    table = selector.TuningTable({"format": selector.FORMAT, "rules": rules}, "test")
    selector.use_table(table)
    try:
        assert selector.select(8, 2, "float32", "sum", native=True)[:2] == (NATIVE, 0)
        assert selector.select(8, 2, "float16", "avg", native=False)[:2] == ("tree", 0)
        assert selector.select(1 << 20, 2, "float32", "sum", native=True)[:2] == ("ring", 0)
    finally:
        selector.use_table(None)
    with pytest.raises(ValueError, match="rule 0 takes MPI's own allreduce but names no algorithm"):
        selector.TuningTable({"format": selector.FORMAT, "rules": [{**rules[0], "without_native": None}]}, "test")


def test_the_other_collectives_choose_by_size_at_the_nearest_measured_rank_count():
    from ringtree.algorithms import GENERATORS
    from ringtree.tuning.collectives import NATIVE, choose, rules_for
    packaged = selector.packaged_table().collectives
    assert set(packaged) == set(GENERATORS) - {"allreduce"}
    for collective, measured in packaged.items():
        for nranks in range(1, 33):
            nearest = min(measured, key=lambda ranks: (abs(ranks - nranks), ranks))
            for native, kind in ((True, "rules"), (False, "without_native")):
                origin, rules = rules_for(collective, nranks, native)
                assert origin == "ringtree/tuning/default.json" and rules is measured[nearest][kind]
                for nbytes in (0, 8, 1 << 20, 1 << 30):  # every size has a rule: past the last, the last's
                    rule = next((r for r in rules if nbytes <= r["bytes"][1]), rules[-1])
                    assert choose(collective, nbytes, nranks, native=native).algorithm == rule["algorithm"]
                assert all(rule["algorithm"] != NATIVE for rule in measured[nearest]["without_native"])


def _collectives_table(rules, without=None):
    return TuningTable({"format": selector.FORMAT, "rules": [], "collectives": {"broadcast": {"2": {
        "rules": rules, "without_native": without or [{"bytes": [0, 8], "algorithm": "binomial", "segment": 0}]}}}},
        "mine.json")


def test_a_tuning_file_s_collective_rules_replace_the_packaged_ones_and_only_for_its_collectives():
    from ringtree.tuning.collectives import choose
    selector.use_table(_collectives_table([{"bytes": [0, 1024], "algorithm": "native", "segment": 0},
                                           {"bytes": [1025, 1 << 20], "algorithm": "chain", "segment": 65536}]))
    try:
        choice = choose("broadcast", 1024, 2)
        assert (choice.algorithm, choice.segment, choice.source) == ("native", 0, "table mine.json broadcast rules 0")
        choice = choose("broadcast", 4096, 3)  # one segment: whole
        assert (choice.algorithm, choice.segment, choice.source) == ("chain", 0, "table mine.json broadcast rules 1")
        assert choose("broadcast", 1 << 30, 2)[:2] == ("chain", 65536)  # past the largest size measured
        assert choose("broadcast", 1 << 30, 2, segment=1 << 20)[:2] == ("chain", 1 << 20)  # the caller's segment
        assert choose("broadcast", 4096, 2, native=False)[:2] == ("binomial", 0)
        assert "default.json" in choose("reduce", 4096, 2).source  # a collective the file has no rules for
    finally:
        selector.use_table(None)


@pytest.mark.parametrize("rules, message", [
    ([{"bytes": [0, None], "algorithm": "ring", "segment": 0}], "broadcast on 2 ranks, rules 0 names unknown algorithm 'ring'"),
    ([], "broadcast on 2 ranks has no 'rules'"),
])
def test_a_table_s_collective_rules_naming_what_the_collective_lacks_are_refused(rules, message):
    with pytest.raises(ValueError, match=message):
        _collectives_table(rules)
    with pytest.raises(ValueError, match="names unknown collective 'gather'"):
        TuningTable({"format": selector.FORMAT, "collectives": {"gather": {}}}, "mine.json")


def test_the_other_collectives_take_the_callers_algorithm_and_segment_and_do_without_native():
    from ringtree.tuning.collectives import NATIVE, choose
    assert choose("broadcast", 8 << 20, 4, "chain")[:2] == ("chain", 256 << 10)  # a chain's own segment
    assert choose("broadcast", 8 << 20, 4, "chain", 1 << 20)[:2] == ("chain", 1 << 20)
    assert choose("allgather", 512, 4, "ring", 1 << 20)[:2] == ("ring", 0)  # no larger than a segment: whole
    for collective in ("reduce_scatter", "allgather", "broadcast", "reduce"):
        for nbytes in (8, 1 << 20, 1 << 30):
            assert choose(collective, nbytes, 4, native=False).algorithm != NATIVE
