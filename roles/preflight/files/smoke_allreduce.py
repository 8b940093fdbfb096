"""The launch's collective smoke test: a few all_reduce calls across every rank of the job,
started by torchrun with the job's own environment (MASTER_ADDR, MASTER_PORT, NNODES,
NODE_RANK, NCCL_/GLOO_SOCKET_IFNAME...), in the training image. Rank 0 prints one JSON line
with the measured bandwidth, as nccl-tests defines it: algorithm bandwidth = bytes / time, bus
bandwidth = algorithm bandwidth x 2(n-1)/n.

    torchrun ... smoke_allreduce.py --backend gloo --size-mb 64 --iterations 5 --deadline 60
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--size-mb", type=float, default=64)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--deadline", type=int, default=60)
    args = parser.parse_args(argv)

    # The backstop: SIGALRM's default action ends the process even inside a blocking C call
    # (a Python handler would wait for the call to return). Collectives time out first.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(args.deadline)
    collective_timeout = datetime.timedelta(seconds=max(5, args.deadline // 2))

    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    started = time.time()
    dist.init_process_group(args.backend, timeout=collective_timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    joined = time.time() - started
    print(f"smoke test: rank {rank} of {world} joined in {joined:.1f} s", flush=True)
    elements = int(args.size_mb * 1e6 / 4)
    tensor = torch.ones(elements, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # warm-up, and the check below
    expected = float(world)
    if abs(float(tensor[0]) - expected) > 1e-3 or abs(float(tensor[-1]) - expected) > 1e-3:
        print(f"smoke test: all_reduce gave {float(tensor[0])}, expected {expected}", flush=True)
        return 2
    if args.backend == "nccl":
        torch.cuda.synchronize()
    dist.barrier()
    begun = time.time()
    for _iteration in range(args.iterations):
        dist.all_reduce(tensor)
    if args.backend == "nccl":
        torch.cuda.synchronize()
    seconds = (time.time() - begun) / args.iterations
    size = elements * 4
    algbw = size / seconds / 1e9
    result = {
        "smoke": {
            "world_size": world,
            "backend": args.backend,
            "bytes": size,
            "iterations": args.iterations,
            "seconds_per_all_reduce": round(seconds, 4),
            "algbw_GBps": round(algbw, 3),
            "busbw_GBps": round(algbw * 2 * (world - 1) / world, 3),
            "joined_s": round(joined, 1),
        }
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
