"""How the benchmarks measure: a call's median time over repeats, after
warm-up runs that compile and allocate; a process's peak memory."""

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


def peak_rss_mb():
    """The process's peak resident memory (VmHWM) in MiB: on the CPU
    plugins, device buffers live in it too."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")
