"""python -m asgd.perf calibrate | predict | compare | optimize | report (see asgd.perf.cli)."""

import sys

from .cli import main

sys.exit(main())
