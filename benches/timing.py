"""How the benchmarks time a call: the median over repeats, after warm-up
runs that compile and allocate."""

import statistics
import time


def median_seconds(run, repeats, warmup):
    """Median seconds of `run()` over `repeats` runs after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
