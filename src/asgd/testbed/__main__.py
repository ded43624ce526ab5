"""python -m asgd.testbed up | down | status | run (see asgd.testbed.cli)."""

import sys

from .cli import main

sys.exit(main())
