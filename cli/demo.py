"""`headroom demo`: the seed 001 story, before and after Headroom, on a local cluster.

Without ``--kubeconfig`` it uses the local cluster (``headroom cluster up``),
starting it when none runs and stopping it afterwards unless ``--keep``; a
cluster that was already up is left as it was. The demo is a check: it exits
1 when the story did not happen (stock time-slicing starved no one, or
Headroom still starved someone) and 2 when it could not run at all.
"""

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = Path("demo-output") / "seed001.png"
EXIT_STORY_MISSED = 1
EXIT_CANNOT_RUN = 2


def _seconds(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 5 <= value <= 600:
        raise argparse.ArgumentTypeError(f"{text!r}: a phase lasts 5 to 600 seconds")
    return value


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="seed 001 before and after Headroom, on a local cluster; prints a table, writes a PNG",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="use this cluster (it needs Headroom, simulated agents and a time-sliced GPU node) "
        "instead of the local one",
    )
    parser.add_argument(
        "--duration",
        type=_seconds,
        default=25.0,
        metavar="SECONDS",
        help="length of each phase (default 25; the workloads' timing scales with it)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        metavar="PNG",
        help=f"where to write the plot (default {DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the local cluster this command started, and the AFTER namespace "
        "(the next demo deletes it before it starts)",
    )
    parser.set_defaults(run=run)


def _progress(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _exit_on(signum: int, _frame: object) -> None:
    # Python's default for SIGTERM ends the process at once, skipping the ``finally``
    # that stops the cluster (its processes run in sessions of their own).
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _exit_on)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _run(args: argparse.Namespace) -> int:
    from devcluster import binaries, cluster, demo, process, scenario
    from kube.config import KubeConfigError

    begun = time.monotonic()
    started_cluster = False
    kubeconfig: Path | None = args.kubeconfig
    try:
        if kubeconfig is None:
            if cluster.status().up:
                kubeconfig = cluster.attach().kubeconfig
                _progress(f"using the local cluster that is already up ({kubeconfig})")
            else:
                _progress("starting the local cluster (the first run builds it: minutes)")
                kubeconfig = cluster.up().kubeconfig
                started_cluster = True
        options = demo.DemoOptions(
            kubeconfig=kubeconfig, duration=args.duration, output=args.output, keep=args.keep
        )
        result = demo.run(options, _progress)
    except (
        demo.DemoError,
        scenario.ScenarioError,
        cluster.ClusterError,
        process.ProcessError,
        binaries.BinariesMissing,
        KubeConfigError,
    ) as err:
        print(f"headroom demo: cannot run: {err}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    finally:
        if started_cluster and args.keep:
            _progress(f"kept the local cluster: export KUBECONFIG={kubeconfig}")
        elif started_cluster:
            _progress("stopping the local cluster this demo started (--keep keeps it)")
            cluster.down()

    print()
    print(result.table)
    print(f"plot: {result.plot}")
    took = f"took {result.seconds:.0f}s (two phases of {args.duration:.0f}s, and their set-up)"
    if started_cluster:
        took += f"; {time.monotonic() - begun:.0f}s with starting and stopping the local cluster"
    print(took)
    if result.stand_ins:
        print("\nstand-ins in this run:")
        for line in result.stand_ins:
            print(f"  {line}")
    if result.problems:
        print("\nThe story did not happen:", file=sys.stderr)
        for problem in result.problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_STORY_MISSED
    acted = "evicted" if result.guard == "evict" else "warned about"
    print(
        f"\nverdict: stock time-slicing let the leaking {result.leaker} OOM-starve "
        f"{' and '.join(result.victims)}; with Headroom the guard {acted} {result.leaker} "
        "and no one was starved."
    )
    return 0
