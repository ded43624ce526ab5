"""asgd: an MPI asynchronous parameter-server trainer, and the performance lab around it.

    train.py   the run, top to bottom: python -m asgd.train (start reading here)
    run/       what a run is made of: options, results.json, progress, checkpoints,
               signals, phase clocks and traces
    protocol/  who talks to whom over MPI: message layout and waiting, the parameter
               server, the worker's push/pull, allreduce
    data/      the data: formats, the embedded problem, the parser, the readers
    net/       the network: the MLP's flat parameter layout and its numba kernels
    perf/      the performance lab: the analytical model, its calibration, its
               command line (python -m asgd.perf), the report figures
    launch.py  the MPI launcher beside this Python, with the flags each MPI needs

Importing asgd imports nothing else: each rank loads only what its role uses.
"""

__version__ = "0.2.0"


class BadInput(ValueError):
    """A bad option, data file or checkpoint: the message is one line a user can act on
    (it names the option, the file and, where it can, the line)."""
