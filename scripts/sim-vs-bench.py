"""Simulated against measured times, as a Markdown table: how well the α-β-γ model fits.

    python scripts/sim-vs-bench.py calibration.json bench.json [--algorithms ring,tree] [--limit 1.5]

For each size of the bench run from --min to --max bytes, the simulator runs
the same algorithm with the segment size the selector gives it, a step at a
time where the stepwise path does (as the bench did), with the costs from
the calibration file. Exits non-zero if any ratio is
beyond a factor --limit either way.

A second table compares the bench's times with the calibration's own
measurements of the same calls (same algorithm, size and segment), where it
made them: a ratio far from 1 there means the machine ran at another speed in
the two runs, which no fit of the calibration can follow.
"""

import argparse
import json
import sys

from ringtree.commands.arguments import format_size, parse_size
from ringtree.commands.calibrate import describe
from ringtree.sim import simulate
from ringtree.sim.calibration import load
from ringtree.tuning.selector import WINDOW, select


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("calibration", help="a file written by python -m ringtree calibrate")
    parser.add_argument("results", help="a file written by python -m ringtree bench --json")
    parser.add_argument("--algorithms", default="ring,tree")
    parser.add_argument("--min", type=parse_size, default=parse_size("1K"))
    parser.add_argument("--max", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--limit", type=float, default=1.5, help="largest acceptable factor between the two")
    args = parser.parse_args()
    costs = load(args.calibration)
    with open(args.calibration) as f:
        calibrated = {(m["algorithm"], m["bytes"], m["segment"]): m["seconds"] * 1e6
                      for m in json.load(f)["allreduce_seconds"]}
    with open(args.results) as f:
        bench = json.load(f)
    algorithms = args.algorithms.split(",")
    itemsize = 2 if bench["dtype"] == "float16" else 8 if bench["dtype"] in ("float64", "int64") else 4
    print(f"{bench['ranks']} ranks, {bench['dtype']} {bench['op']}; {describe(costs._asdict())}\n")
    print("| size | " + " | ".join(f"{a} measured µs | {a} simulated µs | ratio" for a in algorithms) + " |")
    print("|---:|" + "---:|---:|---:|" * len(algorithms))
    worst = 1.0
    rows = {(row["size"], row["algorithm"]): row["time_us"] for row in bench["rows"]}
    same_calls = []  # (size, [(bench µs, calibration µs) or None per algorithm])
    for size in sorted({size for size, _ in rows}):
        if not args.min <= size <= args.max or any((size, a) not in rows for a in algorithms):
            continue
        cells, pairs = [], []
        for algorithm in algorithms:
            choice = select(size, bench["ranks"], bench["dtype"], bench["op"], algorithm)
            segment, stepwise = choice.segment, choice.stepwise and bench.get("arrays", "numpy") == "numpy"
            earlier = calibrated.get((algorithm, size, segment))  # 0 where unsplit, in select() as in calibrate
            pairs.append(None if earlier is None or bench["ranks"] != 2 else (rows[size, algorithm], earlier))
            simulated = simulate(algorithm, bench["ranks"], size, costs, itemsize=itemsize, segment=segment,
                                 window=WINDOW, stepwise=stepwise).time * 1e6
            ratio = simulated / rows[size, algorithm]
            worst = max(worst, ratio, 1 / ratio)
            cells.append(f"{rows[size, algorithm]:.1f} | {simulated:.1f} | {ratio:.2f}")
        print(f"| {format_size(size)} | " + " | ".join(cells) + " |")
        if any(pairs):
            same_calls.append((size, pairs))
    print(f"\nlargest factor between simulated and measured: {worst:.2f}")
    if same_calls:
        print("\nThe same calls in the calibration run, which the fit rests on:\n")
        print("| size | " + " | ".join(f"{a} bench µs | {a} calibration µs | ratio" for a in algorithms) + " |")
        print("|---:|" + "---:|---:|---:|" * len(algorithms))
        ratios = []
        for size, pairs in same_calls:
            cells = []
            for pair in pairs:
                if pair is None:
                    cells.append("— | — | —")
                else:
                    ratios.append(pair[0] / pair[1])
                    cells.append(f"{pair[0]:.1f} | {pair[1]:.1f} | {ratios[-1]:.2f}")
            print(f"| {format_size(size)} | " + " | ".join(cells) + " |")
        print(f"\nbench over calibration for the same calls: {min(ratios):.2f} to {max(ratios):.2f}"
              + ("; the machine ran at another speed in the two runs" if max(max(ratios), 1 / min(ratios)) > 1.25
                 else ""))
    if worst > args.limit:
        sys.exit(f"beyond the limit of {args.limit}")


if __name__ == "__main__":
    main()
