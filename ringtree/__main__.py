"""Command line: python -m ringtree {bench,tune,calibrate,simulate,draw,plot,timeline-merge} ..."""

import argparse
import os
import sys


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ringtree", description="ringtree tools")
    commands = parser.add_subparsers(dest="command", required=True)

    from . import bench
    bench_parser = commands.add_parser("bench", help="allreduce bandwidth against native MPI (under mpiexec)",
                                       description=bench.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(bench_parser)

    from . import tune
    tune_parser = commands.add_parser("tune", help="measure every algorithm here and write a tuning table "
                                                   "(under mpiexec)", description=tune.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    tune.add_arguments(tune_parser)

    from . import calibrate, draw, sim
    for name, module, summary in (
            ("calibrate", calibrate, "fit the simulator's alpha, beta, gamma here (under mpiexec, 2+ ranks)"),
            ("simulate", sim, "per-rank traffic and predicted time of an allreduce, from the alpha-beta-gamma model"),
            ("draw", draw, "a schedule as an SVG flow diagram: ranks as lanes, an arrow per message")):
        sub = commands.add_parser(name, help=summary, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(module=module)

    plot_parser = commands.add_parser("plot", help="plot busbw against size from bench --json files, "
                                                   "or a merged timeline with --timeline")
    plot_parser.add_argument("results", nargs="+", help="JSON files written by bench --json (or one merged trace)")
    plot_parser.add_argument("-o", "--output", default="busbw.svg", help="image file (.svg or .png)")
    plot_parser.add_argument("--timeline", action="store_true", help="the input is a merged RINGTREE_TIMELINE trace")

    merge_parser = commands.add_parser("timeline-merge", help="merge per-rank RINGTREE_TIMELINE files into one")
    merge_parser.add_argument("output")
    merge_parser.add_argument("inputs", nargs="+")

    args = parser.parse_args(argv)
    if args.command == "bench":
        bench.run(args)
    elif args.command == "tune":
        tune.run(args)
    elif args.command in ("calibrate", "simulate", "draw"):
        args.module.run(args)
    elif args.command == "plot":
        from .plot import plot, plot_timeline
        if args.timeline:
            plot_timeline(args.results[0], args.output)
        else:
            plot(args.results, args.output)
    else:
        from .timeline import merge
        merge(args.output, args.inputs)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
