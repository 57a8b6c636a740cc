# Where an NCCL graph's time goes when replays run back to back: one process
# per GPU, a graph of $ANCHOR_OPS (20) NCCL all-reduces (bf16 sum, plain
# buffers and NCCL window buffers) replayed back to back under PyTorch's
# profiler (CUPTI), then per rank the median kernel time and the median gap
# between consecutive kernels, inside a replay and across replays. A probe
# for the peers' slower NCCL figures (tests/gpu/anchors/README.md), never a
# figure of its own. Usage: python3 graph_gaps.py OUT.json WORLD [BYTES,...]
import ctypes, json, os, statistics, sys
import torch, torch.multiprocessing as mp
from torch.profiler import profile, ProfilerActivity
from nccl_window_bench import UID, lib, ck
from anchor_timing import OPS

REPS = 10


def summary(kernels, ops):
    # kernels: (start us, duration us) in launch order over REPS replays of
    # ops kernels each (the graph holds only NCCL kernels).
    kernels.sort()
    durs = [d for _, d in kernels]
    inner, across = [], []
    for i in range(1, len(kernels)):
        gap = kernels[i][0] - (kernels[i - 1][0] + kernels[i - 1][1])
        (across if i % ops == 0 else inner).append(gap)
    med = lambda xs: round(statistics.median(xs), 2) if xs else None
    span = kernels[-1][0] + kernels[-1][1] - kernels[0][0] if kernels else 0
    return {"kernels": len(kernels), "kernel_us": med(durs), "gap_in_replay_us": med(inner),
            "gap_across_replays_us": med(across), "max_gap_us": round(max(inner + across), 2) if inner + across else None,
            "per_op_us": round(span / len(kernels), 2) if kernels else None}


def cuda_kernels(prof, name=""):
    """(start us, duration us) of the profiled CUDA kernels whose name holds name."""
    return [(e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and name in e.name.lower()]


def control():
    # Does the profiler see kernels inside graph replays? A graph of OPS
    # small additions, replayed REPS times: it should report OPS*REPS.
    x = torch.zeros(1024, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(OPS): x.add_(1)
    g.replay(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS): g.replay()
        torch.cuda.synchronize()
    return {"kernels_seen": len(cuda_kernels(prof)), "kernels_replayed": OPS * REPS}


def worker(rank, world, sizes, port, q):
    torch.cuda.set_device(rank)
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    L = lib("libnccl.so.2")
    uid = UID()
    if rank == 0:
        ck(L.ncclGetUniqueId(ctypes.byref(uid)), "uid"); store.set("uid", bytes(uid.internal))
    else:
        ctypes.memmove(ctypes.byref(uid), store.get("uid"), 128)
    comm = ctypes.c_void_p()
    ck(L.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "init")
    maxb = max(sizes)
    win_ptr, win = ctypes.c_void_p(), ctypes.c_void_p()
    ck(L.ncclMemAlloc(ctypes.byref(win_ptr), 2 * maxb), "memalloc")
    ck(L.ncclCommWindowRegister(comm, win_ptr, 2 * maxb, ctypes.byref(win), 1), "winreg")
    plain = torch.empty(maxb, dtype=torch.bfloat16, device="cuda")
    res = {"control": control()}
    for nb in sizes:
        n = nb // 2
        for kind, (sb, rb) in (("plain", (plain.data_ptr(), plain.data_ptr() + nb)), ("window", (win_ptr.value, win_ptr.value + maxb))):
            s = torch.cuda.Stream()
            fn = lambda: ck(L.ncclAllReduce(sb, rb, n, 9, 0, comm, s.cuda_stream), "ar")
            with torch.cuda.stream(s):
                for _ in range(3): fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for _ in range(OPS): fn()
            for _ in range(3): g.replay()
            torch.cuda.synchronize()
            store.add(f"go{nb}{kind}", 1)  # a barrier, so both ranks' replays overlap
            while store.add(f"go{nb}{kind}", 0) < world:
                pass
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(REPS): g.replay()
                torch.cuda.synchronize()
            res[f"{nb} {kind}"] = summary(cuda_kernels(prof, "nccl"), OPS)
            del g
            torch.cuda.synchronize()
    q.put((rank, res))


if __name__ == "__main__":
    out, world = sys.argv[1], int(sys.argv[2])
    sizes = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1 << 10, 1 << 20, 4 << 20]
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, world, sizes, 29631, q)) for r in range(world)]
    [p.start() for p in ps]
    res = dict(q.get(timeout=300) for _ in range(world))
    [p.join(30) for p in ps]
    print(f"ops per graph {OPS}, NCCL_GRAPH_MIXING_SUPPORT={os.environ.get('NCCL_GRAPH_MIXING_SUPPORT', 'unset')}")
    for r in sorted(res):
        for k, v in res[r].items():
            print(f"rank {r} {k:>16}  " + "  ".join(f"{kk}={vv}" for kk, vv in v.items()))
    json.dump(res, open(out, "w"), indent=1)
