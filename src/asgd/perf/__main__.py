"""python -m asgd.perf calibrate | predict | compare | optimize | report (see asgd.perf.cli)."""

import sys

from .cli import main

if __name__ == "__main__":   # importing it (a test, the docs' name check) runs nothing
    sys.exit(main())
