"""What the micro-benchmarks (bench_kernel, bench_server, bench_messaging) share beyond
common.micro's timing and common.report's end of a run: the options each takes, and the
float32 / float64 line."""

import common

from asgd.core.wire import PRECISIONS


def add_options(p, repeat: int, quick: str, min_time: float | None = 0.05) -> None:
    """--repeat, --min-time (unless None), --precisions and --quick (its help: what it sets)."""
    p.add_argument("--repeat", type=int, default=repeat, help=f"interleaved repetitions (default {repeat})")
    if min_time is not None:
        p.add_argument("--min-time", type=float, default=min_time,
                       help=f"seconds per repetition; short calls are looped to reach it (default {min_time})")
    p.add_argument("--precisions", type=common.choice_list(PRECISIONS), default=",".join(PRECISIONS),
                   help=f"comma list of {', '.join(PRECISIONS)} (default both)")
    p.add_argument("--quick", action="store_true", help=quick)


def ratio_line(what: str, ratios: list[dict], case, cpu: bool = False) -> list[str]:
    """The float32 / float64 line (none without both precisions): case(ratio row) names each;
    cpu: the CPU-time ratio in brackets beside the wall clock's."""
    cells = (f"{case(r)} {r['float32_over_float64']:.2f}" + (f" ({r['float32_over_float64_cpu']:.2f})" if cpu else "")
             for r in ratios)
    return [f"float32 / float64 {what}: " + "; ".join(cells)] if ratios else []

