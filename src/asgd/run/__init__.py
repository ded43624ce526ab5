"""What a run is made of: options (config), results.json and the summary (results),
epochs and progress lines (progress), checkpoints, signals, and the per-rank phase clock
and trace (trace)."""
