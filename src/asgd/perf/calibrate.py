"""`mpiexec -n N python -m asgd.perf.calibrate PROBE ...`: the calibration's MPI probes at
the path scripts have named; they are asgd.probes.ranks (python -m asgd.probes.ranks)."""

import sys

if __name__ == "__main__":
    from ..probes.ranks import main   # under the `if`: importing it initializes MPI
    sys.exit(main(sys.argv[1:]))
