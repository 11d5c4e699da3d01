"""``headroom``: one entry point, one subcommand per module in this package.

Each command module has ``add_parser(subparsers)`` and ``run(args) -> int``;
they import their shell lazily so that ``headroom --help`` stays fast.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from cli import agent, certs, cluster, demo, explain, extender, top, webhook
from headroom import __version__

COMMANDS: tuple[ModuleType, ...] = (explain, webhook, extender, agent, certs, top, cluster, demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headroom",
        description="Share NVIDIA GPUs in Kubernetes by memory.",
    )
    parser.add_argument("--version", action="version", version=f"headroom {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (default INFO)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
