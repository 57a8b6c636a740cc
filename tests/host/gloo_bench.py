#!/usr/bin/env python3
"""Time PyTorch gloo all-reduce on this host's CPUs, and compare with collgen.

Run on the GPU machine through tests/host/compare.sh; it needs torch (and
numpy for the memcpy figure) but no GPU and no Go.

  gloo_bench.py bench  --world 4 --sizes 4KiB,64KiB,1MiB,16MiB --out gloo.json
  gloo_bench.py memcpy [--mib 256]
  gloo_bench.py report gloo.json host.json [--targets 4KiB=30,16MiB=3] [--memcpy-gbps X]

bench writes results in collgen's bench.Result JSON format (backend "gloo"),
so `collgen bench --baseline gloo.json` can compute speed-ups; report prints
the side-by-side table and checks the speed-up targets (exit 1 if missed).
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
    gloo = {(r["bytes"], r["world"]): r for r in load(a.gloo) if r["collective"] == "allreduce" and r["dtype"] == "f32"}
    host = [r for r in load(a.host) if r["collective"] == "allreduce" and r["dtype"] == "f32" and r.get("op", "sum") == "sum"]
    memcpy = load(a.memcpy) if a.memcpy and os.path.exists(a.memcpy) else {}
    targets = {}
    for t in (a.targets or "").split(","):
        if t.strip():
            size, _, factor = t.partition("=")
            targets[parse_size(size)] = float(factor)
    print("%-7s %5s %12s %12s %9s %9s %12s %12s  %s" % ("size", "world", "gloo(us)", "collgen(us)", "speedup", "target",
                                                         "gloo GB/s", "collgen GB/s", "collgen algorithm"))
    ok = True
    for r in sorted(host, key=lambda r: r["bytes"]):
        g = gloo.get((r["bytes"], r["world"]))
        if g is None:
            continue
        sp = g["median_us"] / r["median_us"] if r["median_us"] > 0 else 0
        tgt = targets.get(r["bytes"])
        mark = ""
        if tgt is not None:
            mark = "%.0fx %s" % (tgt, "ok" if sp >= tgt else "MISSED")
            ok = ok and sp >= tgt
        print("%-7s %5d %12.1f %12.1f %8.1fx %9s %12.2f %12.2f  %s" % (fmt_size(r["bytes"]), r["world"], g["median_us"],
              r["median_us"], sp, mark, g["bus_gbps"], r["bus_gbps"], r["algorithm"]))
    big = max(host, key=lambda r: r["bytes"], default=None)
    for k, v in memcpy.items():
        line = "memcpy (%s): %.1f GB/s" % (k, v)
        if big:
            line += "; collgen %s all-reduce bus bandwidth %.2f GB/s = %.0f%% of it" % (fmt_size(big["bytes"]), big["bus_gbps"], 100 * big["bus_gbps"] / v)
        print(line)
    missing = [fmt_size(b) for b in targets if not any(r["bytes"] == b for r in host)]
    if missing:
        print("no collgen result for target sizes: %s" % ", ".join(missing))
        ok = False
    if not ok:
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
    r = sub.add_parser("report", help="compare gloo and collgen results")
    r.add_argument("gloo")
    r.add_argument("host")
    r.add_argument("--memcpy", default="", help="JSON written by the memcpy command")
    r.add_argument("--targets", default="", help="required speed-ups, e.g. 4KiB=30,16MiB=3")
    a = p.parse_args(argv)
    {"bench": cmd_bench, "memcpy": cmd_memcpy, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
