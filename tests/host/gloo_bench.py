#!/usr/bin/env python3
"""Time PyTorch gloo all-reduce on this host's CPUs, and compare with collgen.

Run on the GPU machine through tests/host/compare.sh; it needs torch (and
numpy for the memcpy figure) but no GPU and no Go.

  gloo_bench.py bench  --world 4 --sizes 4KiB,64KiB,1MiB,16MiB --out gloo.json
  gloo_bench.py memcpy [--mib 256]
  gloo_bench.py report --gloo gloo-w*.json --host host-w*-s*.json [--max-us 4:4KiB=6] [--out table.md]

bench writes results in collgen's bench.Result JSON format (backend "gloo"),
so `collgen bench --baseline gloo.json` can compute speed-ups; report
summarises several back-to-back collgen sweeps per world against gloo (best,
median of the sweeps' medians, worst/best, speed-up) and exits 1 when a
size's sweeps differ by more than --stability, a sweep is slower than gloo,
or a --max-us target is missed.
"""

import argparse
import json
import os
import re
import socket
import statistics
import sys
import time

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(s):
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", s)
    if not m or (m.group(2) or "B") not in UNITS:
        raise argparse.ArgumentTypeError("bad size %r: want e.g. 4KiB, 16MiB or 4096" % s)
    return int(m.group(1)) * UNITS[m.group(2) or "B"]


def parse_sizes(s):
    return [parse_size(x) for x in s.split(",") if x.strip()]


def fmt_size(n):
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return "%d%s" % (n // mult, unit)
    return "%dB" % n


def bus_gbps(nbytes, world, us):
    if us <= 0:
        return 0.0
    return nbytes / (us * 1e-6) / 1e9 * 2 * (world - 1) / world


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, sizes, min_iters, seconds, out, threads):
    import torch
    import torch.distributed as dist

    if threads > 0:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    results = []
    try:
        for nbytes in sizes:
            n = nbytes // 4
            t = torch.ones(n, dtype=torch.float32)
            # Correctness: a sum of ones is the world size.
            dist.all_reduce(t)
            if not torch.all(t == world):
                raise SystemExit("gloo all-reduce gave a wrong result at %s" % fmt_size(nbytes))
            for _ in range(5):
                dist.all_reduce(t)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(5):
                dist.all_reduce(t)
            per = torch.tensor([(time.perf_counter() - t0) / 5])
            dist.all_reduce(per, op=dist.ReduceOp.MAX)
            iters = int(min(5000, max(min_iters, seconds / max(per.item(), 1e-9))))
            times = torch.zeros(iters, dtype=torch.float64)
            for i in range(iters):
                t0 = time.perf_counter()
                dist.all_reduce(t)
                times[i] = (time.perf_counter() - t0) * 1e6
            # The slowest rank's time per iteration, as collgen bench reports.
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            med = statistics.median(times.tolist())
            results.append({"backend": "gloo", "collective": "allreduce", "algorithm": "gloo", "dtype": "f32",
                            "op": "sum", "world": world, "bytes": nbytes, "iters": iters,
                            "median_us": med, "bus_gbps": bus_gbps(nbytes, world, med)})
            if rank == 0:
                print("gloo allreduce f32 %-6s %8.1f us  (%d iters)" % (fmt_size(nbytes), med, iters), file=sys.stderr, flush=True)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=2)


def cmd_bench(a):
    import torch.multiprocessing as mp

    port = free_port()
    mp.spawn(_rank_main, args=(a.world, port, a.sizes, a.min_iters, a.seconds, a.out, a.threads), nprocs=a.world, join=True)
    print("wrote %s" % a.out, file=sys.stderr)


def memcpy_gbps(mib):
    """Best-of-5 single-thread copy bandwidth (bytes copied per second) with
    numpy, and multi-threaded with torch when available."""
    out = {}
    n = mib << 20
    try:
        import numpy as np

        src = np.ones(n, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
        out["numpy_1thread"] = n / best / 1e9
    except ImportError:
        pass
    try:
        import torch

        src = torch.ones(n, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)
        best = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
        out["torch_%dthreads" % torch.get_num_threads()] = n / best / 1e9
    except ImportError:
        pass
    return out


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cmd_memcpy(a):
    res = memcpy_gbps(a.mib)
    if not res:
        print("memcpy: neither numpy nor torch is installed; no figure", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)
    for k, v in res.items():
        print("memcpy %d MiB %s: %.1f GB/s" % (a.mib, k, v))


def load(path):
    with open(path) as f:
        return json.load(f)


def cmd_report(a):
    """Summarise back-to-back sweeps: per world and size, the best and the
    median of the sweeps' medians, their worst/best ratio, gloo's median and
    the speed-up (gloo / collgen's median of medians)."""
    gloo = {}
    for path in a.gloo:
        for r in load(path):
            if r["collective"] == "allreduce" and r["dtype"] == "f32":
                gloo[(r["world"], r["bytes"])] = r["median_us"]
    runs, algs, waits = {}, {}, {}
    for path in a.host:
        for r in load(path):
            if r["collective"] == "allreduce" and r["dtype"] == "f32" and r.get("op", "sum") == "sum":
                runs.setdefault((r["world"], r["bytes"]), []).append(r["median_us"])
                # An auto row names its choice in "picked" (older collgen
                # binaries named it in "algorithm").
                algs[(r["world"], r["bytes"])] = r.get("picked") or r["algorithm"]
                # Late barrier waits per call by how they ended (spun,
                # yielded, blocked); older collgen binaries leave them out.
                lw = r.get("late_waits")
                waits.setdefault((r["world"], r["bytes"]), []).append(
                    None if lw is None else (lw["spun"], lw["yielded"], lw["blocked"]))
    max_us = {}
    for t in (a.max_us or "").split(","):
        if t.strip():
            key, _, us = t.partition("=")
            world, _, size = key.partition(":")
            max_us[(int(world), parse_size(size))] = float(us)
    memcpy = load(a.memcpy) if a.memcpy and os.path.exists(a.memcpy) else {}
    lines = [a.title, ""] if a.title else []
    lines += ["| world | size | sweeps | best (us) | median (us) | worst/best | gloo (us) | speed-up | algorithm | late waits/call, best / worst sweep (spun-yielded-blocked) | notes |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    problems = []
    for (world, nbytes) in sorted(runs):
        meds = runs[(world, nbytes)]
        best, worst, med = min(meds), max(meds), statistics.median(meds)
        g = gloo.get((world, nbytes))
        notes = []
        if worst / best > a.stability:
            notes.append("CLIFF: worst/best > %.1f" % a.stability)
        if g is not None and worst > g:
            notes.append("SLOWER than gloo (worst sweep)")
        lim = max_us.get((world, nbytes))
        if lim is not None:
            notes.append("target <= %g us: %s" % (lim, "met" if med <= lim else "MISSED"))
            if med > lim:
                problems.append("w%d %s: median %.1f us > %g us" % (world, fmt_size(nbytes), med, lim))
        if len(meds) != a.sweeps:
            notes.append("%d of %d sweeps" % (len(meds), a.sweeps))
        problems += ["w%d %s: %s" % (world, fmt_size(nbytes), n) for n in notes if n.startswith(("CLIFF", "SLOWER"))]
        ws = waits[(world, nbytes)]
        fmt_w = lambda w: "-" if w is None else "%.2f-%.2f-%.2f" % w
        late = "%s / %s" % (fmt_w(ws[meds.index(best)]), fmt_w(ws[meds.index(worst)]))
        lines.append("| %d | %s | %d | %.1f | %.1f | %.2f | %s | %s | %s | %s | %s |" % (
            world, fmt_size(nbytes), len(meds), best, med, worst / best,
            "%.1f" % g if g is not None else "-", "%.1fx" % (g / med) if g is not None else "-",
            algs[(world, nbytes)], late, "; ".join(notes)))
    worlds = {w for (w, _) in runs}
    for (world, nbytes) in sorted(k for k in set(max_us) - set(runs) if k[0] in worlds):
        problems.append("w%d %s: no collgen result for a target size" % (world, fmt_size(nbytes)))
    for k, v in memcpy.items():
        lines.append("")
        lines.append("memcpy 256 MiB (%s): %.1f GB/s" % (k, v))
    lines.append("")
    lines.append("%s" % ("all sizes stable (worst/best <= %.1f), never slower than gloo, targets met" % a.stability
                         if not problems else "PROBLEMS: " + "; ".join(problems)))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if problems:
        raise SystemExit(1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="time gloo all-reduce (f32, sum)")
    b.add_argument("--world", type=int, default=4)
    b.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4KiB,64KiB,1MiB,16MiB"))
    b.add_argument("--min-iters", type=int, default=50)
    b.add_argument("--seconds", type=float, default=1.0, help="target time per size")
    b.add_argument("--threads", type=int, default=0, help="torch intra-op threads per rank (0: torch's default)")
    b.add_argument("--out", default="gloo.json")
    m = sub.add_parser("memcpy", help="measure copy bandwidth")
    m.add_argument("--mib", type=int, default=256)
    m.add_argument("--out", default="")
    r = sub.add_parser("report", help="summarise collgen sweeps against gloo")
    r.add_argument("--gloo", nargs="+", default=[], help="gloo results (bench --out), any worlds")
    r.add_argument("--host", nargs="+", required=True, help="collgen bench --json results, one file per sweep, any worlds")
    r.add_argument("--sweeps", type=int, default=5, help="sweeps expected per world and size")
    r.add_argument("--stability", type=float, default=1.5, help="largest worst/best ratio of a size's sweep medians")
    r.add_argument("--max-us", default="", help="latency targets on the median, e.g. 4:4KiB=6,4:16MiB=1500 (world:size=us)")
    r.add_argument("--memcpy", default="", help="JSON written by the memcpy command")
    r.add_argument("--out", default="", help="also write the table (markdown) here")
    r.add_argument("--title", default="", help="a line to print above the table")
    a = p.parse_args(argv)
    {"bench": cmd_bench, "memcpy": cmd_memcpy, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
