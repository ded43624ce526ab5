"""mpiexec -n N python bench/peers/cpu_of.py MODULE [args...]: run MODULE as __main__ and, at
exit, write this rank's process CPU seconds (user + system) to $ASGD_CPU_OUT/cpu-<rank>.json.
Registered first, the handler runs last: MPI_Finalize's CPU is counted too."""

import argparse
import atexit
import json
import os
import resource
import runpy
import sys


def _record():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    with open(os.path.join(os.environ["ASGD_CPU_OUT"], f"cpu-{rank:05d}.json"), "w") as f:
        json.dump({"rank": rank, "cpu_s": ru.ru_utime + ru.ru_stime, "user_s": ru.ru_utime, "sys_s": ru.ru_stime}, f)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("module", help="the module to run, as python -m would")
    p.add_argument("args", nargs="*", help="its arguments")
    module = p.parse_args(sys.argv[1:2]).module   # the module's own arguments are its to parse
    atexit.register(_record)
    sys.argv = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
