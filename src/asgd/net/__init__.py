"""The network: the d_in-hidden-d_out MLP's flat parameter layout, initialization and
numpy reference (mlp), and the numba kernels of the training hot path (kernels)."""
