"""Timing shared by the peers' benchmarks of this directory."""
import os, statistics
import torch

# Timing as collgen bench's (bench/gpubench): one untimed replay lines the
# ranks up on the GPU, then reps replays back to back with an event between
# consecutive ones; the median replay / per is the figure. No host
# synchronisation inside, so neither the host's launch of each replay nor
# the ranks' skew is timed. ANCHOR_TIMING=per-replay times each replay
# between its own events with a synchronize after it, the method of the
# figures made before 2026-11-24 (it adds that launch gap and skew).
# OPS is how many collectives each replay (a graph, or an eager batch)
# holds, $ANCHOR_OPS (default 20; NCCL graphs time slower with more, for a
# reason not found: tests/gpu/anchors/README.md).
OPS = int(os.environ.get("ANCHOR_OPS", "20"))


def sizes(default):
    """The byte sizes to measure: $ANCHOR_SIZES (bytes, comma-separated) or default."""
    env = os.environ.get("ANCHOR_SIZES")
    return [int(x) for x in env.split(",")] if env else default

def replay_times(replay, reps, per=None):
    # ANCHOR_STREAM=side replays (and records the events) on a stream of
    # its own instead of the current one (the legacy default stream unless
    # the caller set another), to tell whether that stream matters.
    if os.environ.get("ANCHOR_STREAM") == "side":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return _replay_times(replay, reps, per)
    return _replay_times(replay, reps, per)

def _replay_times(replay, reps, per):
    per = per or OPS
    if os.environ.get("ANCHOR_TIMING") == "per-replay":
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True); ts = []
        for _ in range(reps):
            s.record(); replay(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1000.0 / per)
        return statistics.median(ts)
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    replay()
    evs[0].record()
    for i in range(reps):
        replay(); evs[i + 1].record()
    evs[-1].synchronize()
    return statistics.median(evs[i].elapsed_time(evs[i + 1]) * 1000.0 / per for i in range(reps))
