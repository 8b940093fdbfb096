"""Command line: python -m localcluster {up,down,status,build,images,rmi,load-image} [...].

load-image: the training image (built once: LLaMA-Factory on a CPU torch) in every VM of a
running cluster, and the demo's tiny model and dataset in .cache/assets.

env: what a GCP client on the controller needs to reach the cluster's Compute Engine API (its
proxy and CA), as export lines: eval "$(python -m localcluster env)" before ansible-playbook -i
inventories/local/NAME.gcp (the GCP path's inventory: `up` writes it beside the static one).

registry: a private registry (TLS, user and password) on a running cluster's VPC, trusted by its
VMs, holding the training image (pushed once); prints the image name and a 0600 vars file that
points a job at it with the credentials (ansible-playbook -e @FILE), and makes the demo's assets.

build [--kind vm|blank] [--platform P ...]: make sure the images exist; exits 3 when a platform's
archive does not answer (that platform is then skipped, and said so)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from . import box_api, cluster, images, registry, spec, train_image
from .util import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument(
        "command",
        choices=[
            "up",
            "down",
            "status",
            "env",
            "build",
            "images",
            "rmi",
            "load-image",
            "registry",
            "bucket",
        ],
    )
    parser.add_argument("--kind", choices=sorted(images.KINDS), default="vm", help="for build")
    parser.add_argument(
        "--platform",
        nargs="+",
        choices=sorted(images.PLATFORMS),
        default=["debian12"],
        help="for build",
    )
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
    parser.add_argument(
        "--prefix", help="for bucket: list the objects under it (else print gs://BUCKET)"
    )
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
            print(f"inventory: {state['inventory']} (llamafactory_platform local)")
            print(f"GCP-path inventory: {state['gcp_inventory']} (with `env`'s variables)")
        elif args.command == "env":
            for key, value in cluster.api_environment(definition).items():
                print(f"export {key}={shlex.quote(value)}")
        elif args.command == "down":
            cluster.down(definition)
        elif args.command == "status":
            print(json.dumps(cluster.status(definition), indent=2))
        elif args.command == "build":
            unreachable = []
            for name in args.platform:
                try:
                    images.ensure_vm_image(
                        cluster.client(),
                        images.PLATFORMS[name],
                        cluster.cache_dir(),
                        kind=args.kind,
                    )
                except images.ArchiveUnreachable as exc:
                    print(f"localcluster: SKIPPED {name}: {exc}", file=sys.stderr)
                    unreachable.append(name)
            if unreachable:
                return 3
        elif args.command == "registry":
            docker_client = cluster.client()
            train_image.ensure_assets(docker_client, cluster.cache_dir())
            found = registry.start(definition, docker_client, cluster.cache_dir())
            name = registry.push(
                docker_client, found, train_image.TRAIN_IMAGE, registry.TRAIN_REPOSITORY
            )
            print(f"image: {name}\nvars: {registry.pull_vars(found, name)}")
        elif args.command == "bucket":
            path = cluster.state_dir(definition) / "state.json"
            gcs = json.loads(path.read_text()).get("gcs") if path.exists() else None
            if not gcs:
                raise ClusterError(f"cluster {definition.name} is not up: run `./dev cluster up`")
            if args.prefix is None:
                print(f"gs://{gcs['bucket']}")
            else:
                storage = box_api.Storage(gcs)
                for name, entry in sorted(storage.objects(args.prefix).items()):
                    size, crc = entry["size"], entry["crc32c"]
                    print(f"gs://{gcs['bucket']}/{name}  {size} bytes  crc32c {crc}")
                storage.close()
        elif args.command == "load-image":
            train_image.load_cluster(definition, cluster.client())
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
