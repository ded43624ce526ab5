"""The network: the d_in-hidden-d_out MLP's flat parameter layout, initialization and
numpy reference (mlp), the numba kernels of the training hot path (kernels), and the
optimizers a server runs (optimizers)."""

OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam")  # what a server does with an update: asgd.net.optimizers
