"""The lab's measurements of this machine: the calibration's microbenchmarks of asgd's own
parts (calibrate: params.json, what the performance model asgd.perf reads), the probes
that run as MPI jobs (ranks), and each architecture's exchange round (exchanges). Above
the model: they name its exchange probes; below the command line that runs them
(python -m asgd.perf calibrate)."""


class CalibrationError(RuntimeError):
    """A probe could not run or gave no answer."""
