"""Who talks to whom over MPI: the message layout and the non-spinning Waiter (comm), the
parameter server and its reply policies (server), the worker's push/pull (worker), and
the allreduce baseline (allreduce)."""
