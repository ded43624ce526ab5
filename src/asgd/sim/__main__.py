"""python -m asgd.sim: see asgd.sim.cli."""

import sys

from .cli import main

sys.exit(main())
