"""The protocol with no I/O in it: the wire format, the job's topology, the reply policies
(async, ssp, sync, backup workers) as pure decisions, a server shard's bookkeeping, the
worker's loop over a link, and the stats. Only numpy below it; the MPI transport
(asgd.protocol) and the simulator's (asgd.sim) both drive it, so a rule of the protocol is
written once."""
