"""The launch's collective smoke test: a few all_reduce (or all_gather) calls across every rank
of the job, started by torchrun with the job's own environment (MASTER_ADDR, MASTER_PORT,
NNODES, NODE_RANK, NCCL_/GLOO_SOCKET_IFNAME...), in the training image. Rank 0 prints one JSON
line with the measured bandwidth, as nccl-tests defines it: algorithm bandwidth = bytes / time
(bytes: the buffer, all_gather's whole output), bus bandwidth = algorithm bandwidth x 2(n-1)/n
for all_reduce, x (n-1)/n for all_gather. With several sizes (a sweep: the pass mark's sizes,
2, 4 and 8 GiB, whose busbw the mark's rule averages) each size's figures are listed; the
top-level ones are the largest size's.

    torchrun ... smoke_allreduce.py --backend gloo --size-mb 64 --iterations 5 --deadline 60
    torchrun ... smoke_allreduce.py --backend nccl --collective all_gather \
        --sizes-bytes 2147483648 4294967296 8589934592 --deadline 300
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}


def measure(dist, torch, collective, size_bytes, world, rank, device, iterations, sync):
    """(bytes, seconds per call, error or None) of `collective` on a buffer of size_bytes."""
    elements = max(world, int(size_bytes / 4) // world * world)
    if collective == "all_reduce":
        buffer = torch.ones(elements, dtype=torch.float32, device=device)

        def call():
            dist.all_reduce(buffer)

        call()  # warm-up, and the check below
        expected = float(world)
        got = (float(buffer[0]), float(buffer[-1]))
        buffer.fill_(1.0)
    else:
        share = torch.full((elements // world,), float(rank), dtype=torch.float32, device=device)
        buffer = torch.empty(elements, dtype=torch.float32, device=device)

        def call():
            dist.all_gather_into_tensor(buffer, share)

        call()
        expected = float(world - 1)  # the last rank's share ends the output
        got = (float(buffer[-1]), float(buffer[-1]))
    if any(abs(value - expected) > 1e-3 for value in got):
        return elements * 4, None, f"{collective} gave {got[0]}, expected {expected}"
    sync()
    dist.barrier()
    begun = time.time()
    for _iteration in range(iterations):
        call()
    sync()
    return elements * 4, (time.time() - begun) / iterations, None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--collective", choices=sorted(BUS_FACTOR), default="all_reduce")
    parser.add_argument("--size-mb", type=float, default=64)
    parser.add_argument("--sizes-bytes", type=int, nargs="+", help="a sweep (replaces --size-mb)")
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

    def sync():
        if args.backend == "nccl":
            torch.cuda.synchronize()

    started = time.time()
    dist.init_process_group(args.backend, timeout=collective_timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    joined = time.time() - started
    print(f"smoke test: rank {rank} of {world} joined in {joined:.1f} s", flush=True)
    sizes = []
    for wanted in args.sizes_bytes or [args.size_mb * 1e6]:
        size, seconds, error = measure(
            dist, torch, args.collective, wanted, world, rank, device, args.iterations, sync
        )
        if error:
            print(f"smoke test: {error}", flush=True)
            return 2
        algbw = size / seconds / 1e9
        sizes.append(
            {
                "bytes": size,
                "seconds": round(seconds, 6),
                "algbw_GBps": round(algbw, 3),
                "busbw_GBps": round(algbw * BUS_FACTOR[args.collective](world), 3),
            }
        )
    last = sizes[-1]
    result = {
        "smoke": {
            "world_size": world,
            "backend": args.backend,
            "collective": args.collective,
            "bytes": last["bytes"],
            "iterations": args.iterations,
            "seconds_per_call": round(last["seconds"], 4),
            "seconds_per_all_reduce": round(last["seconds"], 4),  # the name before sweeps
            "algbw_GBps": last["algbw_GBps"],
            "busbw_GBps": last["busbw_GBps"],
            "sizes": sizes,
            "joined_s": round(joined, 1),
        }
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
