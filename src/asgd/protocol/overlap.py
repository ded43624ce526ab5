"""When a worker computes beside its exchange in flight (async and ssp): OverlapRule, in
the worker's loop (protocol.worker), the simulator's worker (asgd.sim) and the model's
queue (asgd.perf.analytic). No MPI here, so the model imports it without starting MPI."""


class OverlapRule:
    """Whether the next step computes while this exchange is in flight (plan.overlap's
    modes only): yes while an exchange lasts under RATIO steps; no once one lasts more
    (then the step would hide at most 1/RATIO of the period, and cost a version of
    staleness); yes again once an exchange, waited for, lasts under RATIO / 2 steps (the
    gap keeps a rate near the limit from flipping the loop every step)."""
    RATIO = 8.0

    def __init__(self, allowed: bool, adaptive: bool = True):
        self.allowed = self.on = allowed
        self.adaptive = adaptive

    def saw(self, step_s: float, exchange_s: float) -> bool:
        """After a step of step_s, the exchange's length as seen (overlapping: the step it
        ran beside plus the wait after it; else the wait); returns `on` for the next step."""
        if self.allowed and self.adaptive:
            if self.on and exchange_s > self.RATIO * step_s:
                self.on = False
            elif not self.on and exchange_s < self.RATIO / 2 * step_s:
                self.on = True
        return self.on
