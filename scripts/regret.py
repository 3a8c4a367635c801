"""How far `auto` is from the fastest choice at each size of a bench run, as a Markdown table.

    python scripts/regret.py docs/figures/bench-2ranks.json [--limit 0.10]

Regret = auto's time / the fastest other case's time - 1, MPI's own among the
cases (it is one of auto's candidates): timed as auto runs it (bench's
native-path) where the run has it, in place of mpi4py's call (native);
roundtrip, a CuPy program's way without ringtree, is left out. Exits non-zero if any size's regret is above
--limit.
"""

import argparse
import json
import sys

from ringtree.commands.arguments import format_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a JSON file written by python -m ringtree bench --json")
    parser.add_argument("--limit", type=float, default=0.10, help="largest acceptable regret")
    args = parser.parse_args()
    with open(args.results) as f:
        result = json.load(f)
    by_size: dict[int, dict[str, float]] = {}
    for row in result["rows"]:
        by_size.setdefault(row["size"], {})[row["algorithm"]] = row["time_us"]
    print(f"{result['ranks']} ranks, {result['dtype']} {result['op']}, "
          f"{'in place' if result['inplace'] else 'out of place'}\n")
    print("| size | auto µs | best | best µs | regret |")
    print("|---:|---:|---|---:|---:|")
    worst = 0.0
    for size, times in sorted(by_size.items()):
        # MPI's own as auto runs it (native-path) where the run timed it, else mpi4py's call of it
        left_out = ("auto", "roundtrip", "native") if "native-path" in times else ("auto", "roundtrip")
        candidates = {name: t for name, t in times.items() if name not in left_out}
        best = min(candidates, key=candidates.get)
        regret = times["auto"] / candidates[best] - 1
        worst = max(worst, regret)
        print(f"| {format_size(size)} | {times['auto']:.1f} | {best} | {candidates[best]:.1f} | {regret:+.1%} |")
    print(f"\nlargest regret: {worst:+.1%}")
    if worst > args.limit:
        sys.exit(f"auto is more than {args.limit:.0%} slower than the best algorithm at some size")


if __name__ == "__main__":
    main()
