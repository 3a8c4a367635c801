"""`python -m ringtree plot`: bus bandwidth against message size, per algorithm, from bench --json files."""

from __future__ import annotations

import json


def plot(result_files: list[str], output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result_files), figsize=(6.5 * len(result_files), 4.5), squeeze=False)
    for ax, path in zip(axes[0], result_files):
        with open(path) as f:
            result = json.load(f)
        by_algorithm: dict[str, list[dict]] = {}
        for row in result["rows"]:
            by_algorithm.setdefault(row["algorithm"], []).append(row)
        for name, rows in by_algorithm.items():
            rows.sort(key=lambda r: r["size"])
            ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], marker="o", markersize=3,
                    label=name, linestyle="--" if name == "native" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{result['ranks']} ranks, {result['dtype']} {result['op']}"
                     f"{', in place' if result.get('inplace') else ''}\n{result.get('note') or result['mpi']}",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(output)
