"""all_reduce bus bandwidth over a range of tensor sizes, one process per node under torchrun
(the benchmark runs it in the role's host-networked container and directly on the VM). Rank 0
prints one JSON line per size: {"size_mb", "seconds", "algbw_GBps", "busbw_GBps"}, with bus
bandwidth as nccl-tests defines it (algorithm bandwidth x 2(n-1)/n).

    torchrun ... allreduce_sweep.py --sizes 16 64 256 --deadline 300
"""

import argparse
import datetime
import json
import signal
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--bytes-per-size", type=float, default=1280, help="MB moved per size")
    parser.add_argument("--deadline", type=int, default=300)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # ends the process even inside a C call
    signal.alarm(args.deadline)

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.deadline // 2))
    rank, world = dist.get_rank(), dist.get_world_size()
    for size_mb in args.sizes:
        elements = int(size_mb * 1e6 / 4)
        tensor = torch.ones(elements, dtype=torch.float32)
        dist.all_reduce(tensor)  # warm-up, and the check
        if abs(float(tensor[0]) - world) > 1e-3:
            print(f"all_reduce gave {float(tensor[0])}, expected {world}", flush=True)
            return 2
        iterations = max(3, int(args.bytes_per_size / size_mb))
        dist.barrier()
        begun = time.perf_counter()
        for _iteration in range(iterations):
            dist.all_reduce(tensor)
        seconds = (time.perf_counter() - begun) / iterations
        algbw = elements * 4 / seconds / 1e9
        if rank == 0:
            line = {
                "size_mb": size_mb,
                "iterations": iterations,
                "seconds": round(seconds, 5),
                "algbw_GBps": round(algbw, 4),
                "busbw_GBps": round(algbw * 2 * (world - 1) / world, 4),
            }
            print(json.dumps({"sweep": line}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
