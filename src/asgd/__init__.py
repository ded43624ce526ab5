"""asgd: an MPI asynchronous parameter-server trainer, and the performance lab around it.

    train.py   the run, top to bottom: python -m asgd.train (start reading here)
    run/       what a run is made of: options, results.json, the run folder, progress,
               checkpoints, signals, phase clocks and traces
    protocol/  who talks to whom over MPI: the parameter server, the worker's push/pull,
               the message strategies (float64, 1-bit), allreduce
    data/      the data: formats, the embedded problem, the parser, the readers
    mpiutil.py waiting without spinning, agreeing on failures, clocks
    net/       the network: the MLP's flat parameter layout, its numba kernels, the
               server-side optimizers, and the plain-numpy reference
    wire.py    the wire format: tags, headers, shards, byte counts (written once)
    launch.py  the MPI launcher beside this Python, with the flags each MPI needs
    perf/      the performance lab: the analytical model, its calibration, its
               command line (python -m asgd.perf), the report figures
    sim/       the simulator (SimGrid): python -m asgd.sim
    testbed/   an emulated cluster of namespaces and shaped links: python -m asgd.testbed
Layers, bottom up: launch, wire, net, mpiutil, data, protocol, run, train; then the lab,
perf under sim and testbed. A module imports only from its own layer's package or from
layers below it (tests/test_layers.py).

Importing asgd imports nothing else: each rank loads only what its role uses.
"""

__version__ = "0.3.0"


class BadInput(ValueError):
    """A bad option, data file or checkpoint: the message is one line a user can act on
    (it names the option, the file and, where it can, the line)."""
