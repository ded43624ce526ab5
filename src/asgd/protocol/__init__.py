"""Who talks to whom over MPI: what a loop is given (context: the rank's endpoint, the
mini-batch schedule), how messages sit in memory (messages: dense in the run's precision, or 1-bit through
onebit), the parameter server driving asgd.core's shard and policies (server; its
updates and its workers' deaths: updates, deaths), the worker's push/pull
link and loop (worker), and the allreduce baseline (allreduce). The message layout
itself is asgd.core.wire's; nothing here reads options or writes files (asgd.run)."""
