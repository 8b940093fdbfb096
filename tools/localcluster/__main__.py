"""Command line: python -m localcluster {up,down,status,images,rmi} [--config FILE] [...]."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import cluster, images, spec
from .util import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "images", "rmi"])
    parser.add_argument(
        "--config",
        type=Path,
        help="cluster definition (default: %(default)s)",
        default=spec.DEFAULT_DEFINITION,
    )
    parser.add_argument("--name", help="override the definition's cluster name")
    parser.add_argument("--nodes", type=int, help="override the number of VMs")
    parser.add_argument("--inventory", help="where to write the inventory")
    parser.add_argument("--shift", type=int, help="move every subnet by SHIFT x 32 /24s")
    args = parser.parse_args(argv)
    try:
        definition = spec.load(
            args.config,
            name=args.name,
            nodes=args.nodes,
            inventory=args.inventory,
            shift=args.shift,
        )
        if args.command == "up":
            state = cluster.up(definition)
            print(f"inventory: {state['inventory']}")
        elif args.command == "down":
            cluster.down(definition)
        elif args.command == "status":
            print(json.dumps(cluster.status(definition), indent=2))
        elif args.command == "images":
            for tag, kind, size in images.list_images(cluster.client()):
                print(f"{tag:45} {kind:6} {size / 2**20:8.0f} MiB")
        else:
            images.remove_images(cluster.client())
    except ClusterError as exc:
        print(f"localcluster: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
