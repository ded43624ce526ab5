"""The performance model, pure (no MPI, no jobs run): the paper's analytical model and its
extensions (analytic), every architecture's iteration and the whole model's entry,
predict (architectures), and the figures (report). Its command line, python -m asgd.perf
calibrate | predict | compare | optimize | report (cli), sits above the measurements it
runs (asgd.probes, which write params.json)."""
