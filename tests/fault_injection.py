"""mpiexec -n N python tests/fault_injection.py RANK MODULE:FUNCTION [asgd.train options]

Runs asgd.train with MODULE.FUNCTION raising MemoryError on rank RANK the first time it
is called: a local failure at a chosen point of a collective sequence (tests only)."""

import importlib
import sys

from mpi4py import MPI


def main() -> int:
    rank, target, *argv = sys.argv[1:]
    module, name = target.split(":")
    if MPI.COMM_WORLD.rank == int(rank):
        def fail(*args, **kwargs):
            raise MemoryError("injected by tests/fault_injection.py")
        setattr(importlib.import_module(module), name, fail)
    from asgd import train
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
