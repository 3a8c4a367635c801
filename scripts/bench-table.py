"""A bench JSON file as the Markdown table of docs/performance.md: per size, per algorithm,
time · busbw · ratio to native (above 1: faster than native).

    python scripts/bench-table.py docs/figures/bench-2ranks.json
"""

import argparse
import json

from ringtree.commands.arguments import format_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a JSON file written by python -m ringtree bench --json")
    args = parser.parse_args()
    with open(args.results) as f:
        rows = json.load(f)["rows"]
    algorithms = list(dict.fromkeys(row["algorithm"] for row in rows))
    print("| size | " + " | ".join(algorithms) + " |")
    print("|---:|" + "---:|" * len(algorithms))
    by_size: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_size.setdefault(row["size"], {})[row["algorithm"]] = row
    for size, cells in sorted(by_size.items()):
        texts = []
        for name in algorithms:
            row = cells[name]
            text = f"{row['time_us']:.1f} µs · {row['busbw']:.2f} GB/s"
            if name != "native" and row.get("vs_native") is not None:
                text += f" · **{row['vs_native']:.2f}×**"
            texts.append(text)
        print(f"| {format_size(size)} | " + " | ".join(texts) + " |")
    print(f"\n#wrong summed over every row and rank: {sum(row['wrong'] for row in rows)}.")


if __name__ == "__main__":
    main()
