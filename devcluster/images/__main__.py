"""``python -m devcluster.images [--check]``: build the images (``make image``).

Prints ``<ref> <archive>`` per image on stdout; progress goes to stderr.
``--check`` then runs ``headroom --help`` and ``kube-scheduler --version`` in
them as uid 10001 on a read-only root filesystem (umoci + runc, no daemon).
"""

import argparse
import sys
import tempfile
from pathlib import Path

from devcluster.binaries import BinariesMissing
from devcluster.images import Bundle, ImageError, ensure, headroom_ref, scheduler_ref
from devcluster.images.tools import require

CHECKS = {headroom_ref: ("headroom", "--help"), scheduler_ref: ("kube-scheduler", "--version")}


def _progress(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def check(built: dict[str, Path]) -> None:
    require(["umoci", "runc"], _progress)
    for ref_of, args in CHECKS.items():
        ref = ref_of()
        with tempfile.TemporaryDirectory(dir=built[ref].parent, prefix="check-") as work:
            result = Bundle.unpack(built[ref], ref, Path(work)).run(*args)
        if result.returncode != 0:
            raise ImageError(
                f"{' '.join(args)} in {ref} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        first = next(iter(result.stdout.splitlines()), "(no output)")
        _progress(f"{ref}: `{' '.join(args)}` ran as 10001:10001, read-only root: {first}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.images", description=__doc__)
    parser.add_argument("--check", action="store_true", help="run each image once after building")
    options = parser.parse_args(argv)
    try:
        built = ensure(_progress)
        if options.check:
            check(built)
    except (ImageError, BinariesMissing) as error:
        _progress(f"error: {error}")
        return 1
    for ref, archive in built.items():
        print(ref, archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
