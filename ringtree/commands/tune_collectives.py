"""`python -m ringtree tune --collective reduce_scatter|allgather|broadcast|reduce`: the collective's
rules, measured on this machine, written into the tuning table.

For each size of the grid (the size is every block together, float32, sum where the collective
reduces) it times MPI's own and each of the collective's algorithms, unsplit (up to 16 MiB) and with
each segment size smaller than the message, in turns as the bench does, every result checked against
MPI's own first. Each pass goes over the grid, every other one from the largest size down; a case's
time is the mean over passes. The fastest case at each size makes the rules for this rank count
("rules"); the fastest of ringtree's own, the rules for calls MPI's own cannot run ("without_native":
device memory, a reduction MPI lacks, a call with a timeout). A lone size between two of another
winner takes theirs where that is within 5 %. Rules and times go into the table's "collectives" for
this collective and rank count; the rest of the file stays. With RINGTREE_TUNING_FILE naming the
file, `auto` takes these rules (a size past the largest measured, the last rule's choice), and those
of the packaged table for collectives the file has none of.
"""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .arguments import format_size, sizes_from_args
from .bench import NATIVE, measure
from .measure import candidates, in_pass_order, smoothed
from .table_file import read_table, write_table_file

__all__ = ["run_collective", "SEGMENTS_OF_COLLECTIVES"]

SEGMENTS_OF_COLLECTIVES = (256 << 10, 1 << 20, 4 << 20)
UNSPLIT = 1 << 62  # a segment no message reaches
DTYPE = np.dtype(np.float32)


def run_collective(args, comm) -> None:
    name, rank, nranks = args.collective, comm.Get_rank(), comm.Get_size()
    # Every block of the same count: a size rounds down to a whole number of elements per rank.
    counts = sorted({max(1, nbytes // DTYPE.itemsize // nranks) * nranks for nbytes in sizes_from_args(args)})

    def cases(count: int) -> dict:
        found = candidates(count * DTYPE.itemsize, args.algorithms, args.segments)
        return {(NATIVE, 0): (NATIVE, None), **{case: (case[0], case[1] or UNSPLIT) for case in found}}

    progress = None
    if rank == 0:
        from tqdm import tqdm
        progress = tqdm(total=args.passes * sum(len(cases(count)) for count in counts), unit="case",
                        desc=f"tune {name} {nranks} ranks")
    passes: dict[int, list[dict]] = {count: [] for count in counts}
    for k in range(args.passes):
        for count in in_pass_order(counts, k):
            times, wrong = measure(comm, name, cases(count), count, DTYPE, ReduceOp.SUM, args)
            if any(wrong.values()):
                raise SystemExit(f"tune: {name} results differ from native MPI at {count * DTYPE.itemsize} B: "
                                 f"{[case for case, n in wrong.items() if n]}")
            passes[count].append(times)
            if progress is not None:
                progress.update(len(times))
    if progress is not None:
        progress.close()
    if rank != 0:
        return
    sizes = [count * DTYPE.itemsize for count in counts]
    mean = [{case: float(np.mean([p[case] for p in passes[count]])) for case in passes[count][0]} for count in counts]
    own = [{case: seconds for case, seconds in timed.items() if case[0] != NATIVE} for timed in mean]
    found = {"rules": rules_from(sizes, smoothed(mean)), "without_native": rules_from(sizes, smoothed(own)),
             "measured": [{"bytes": nbytes, "algorithm": alg, "segment": seg, "seconds": seconds}
                          for nbytes, timed in zip(sizes, mean) for (alg, seg), seconds in timed.items()]}
    for kind in ("rules", "without_native"):
        print(f"\n{name} on {nranks} ranks, {kind}: which algorithm wins from which size")
        print(f"{'from':>10} {'to':>10}  {'algorithm':<19} segment")
        for rule in found[kind]:
            low, high = rule["bytes"]
            print(f"{low:>10} {high:>10}  {rule['algorithm']:<19} "
                  f"{format_size(rule['segment']) if rule['segment'] else 'unsplit'}")
    data = read_table(args.output)
    data.setdefault("collectives", {}).setdefault(name, {})[str(nranks)] = found
    write_table_file(args.output, data, args.note)
    print(f"\nwrote {args.output}; `auto` takes its {name} rules with RINGTREE_TUNING_FILE={args.output} "
          f"(past {format_size(sizes[-1])}, the last rule's choice)")


def rules_from(sizes: list[int], winners: list[tuple[str, int]]) -> list[dict]:
    """Rules by size from the (algorithm, segment) winning at each size of `sizes` (ascending): a run
    of one winner is one rule, from above the grid point before it (the first: from 0) to its last."""
    rules: list[dict] = []
    previous = -1
    for nbytes, (algorithm, segment) in zip(sizes, winners):
        if rules and (rules[-1]["algorithm"], rules[-1]["segment"]) == (algorithm, segment):
            rules[-1]["bytes"][1] = nbytes
        else:
            rules.append({"bytes": [previous + 1, nbytes], "algorithm": algorithm, "segment": segment})
        previous = nbytes
    return rules
