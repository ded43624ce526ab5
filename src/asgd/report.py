"""Deprecated alias, kept for one release: `python -m asgd.report RUN...` is now
`python -m asgd.perf report RUN...`."""

import sys

if __name__ == "__main__":
    print("asgd.report is deprecated and will be removed in the next release: use python -m asgd.perf report",
          file=sys.stderr)
    from .perf.cli import main
    sys.exit(main(["report", *sys.argv[1:]]))
