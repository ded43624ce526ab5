"""Deprecated alias, kept for one release: `python -m asgd.model ...` is now
`python -m asgd.perf ...` (the performance model's command line)."""

import sys

if __name__ == "__main__":
    print("asgd.model is deprecated and will be removed in the next release: use python -m asgd.perf",
          file=sys.stderr)
    from .perf.cli import main
    sys.exit(main())
