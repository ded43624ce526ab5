"""python -m asgd.doctor (see asgd.doctor.cli)."""

import sys

from .cli import main

if __name__ == "__main__":   # importing it (a test, the docs' name check) runs nothing
    sys.exit(main())
