"""The performance lab: the paper's analytical model and its extensions (analytic), its
calibration on this machine (calibrate), its command line (python -m asgd.perf
calibrate | predict | compare | optimize | report; cli), and the figures (report)."""
