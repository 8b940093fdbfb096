"""Run every molecule scenario (./dev test): build the local images they use first, and leave out,
visibly, the platforms whose distribution archive does not answer (Ubuntu is not a promised
source on every machine). Exits non-zero when any scenario fails.

Usage: python tools/run_molecule.py [SCENARIO ...]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml
from localcluster import cluster, images

ROOT = Path(__file__).resolve().parents[1]
IMAGE = re.compile(r"^hostnet-llamafactory/(?P<kind>vm|blank):(?P<platform>[a-z0-9]+)$")


def scenarios(names: list[str]) -> dict[str, list[dict]]:
    found = {}
    for path in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        if not names or path.parent.name in names:
            found[path.parent.name] = yaml.safe_load(path.read_text())["platforms"]
    return found


def main(names: list[str]) -> int:
    wanted = scenarios(names)
    if not wanted:
        print("molecule: no scenarios", file=sys.stderr)
        return 1
    client, unavailable = cluster.client(), set()
    for image in sorted({p.get("image", "") for platforms in wanted.values() for p in platforms}):
        match = IMAGE.match(image)
        if not match:
            continue
        try:
            images.ensure_vm_image(
                client, images.PLATFORMS[match["platform"]], cluster.cache_dir(), kind=match["kind"]
            )
        except images.ArchiveUnreachable as exc:
            print(f"molecule: SKIPPED platform {image}: {exc}", flush=True)
            unavailable.add(image)
    failed, started = [], time.monotonic()
    for name, platforms in wanted.items():
        usable = [p["name"] for p in platforms if p.get("image") not in unavailable]
        command = ["molecule", "test", "-s", name]
        if not usable:
            print(f"molecule: SKIPPED scenario {name}: none of its images can be built")
            continue
        if len(usable) < len(platforms):
            if len(usable) > 1:
                print(f"molecule: SKIPPED scenario {name}: it cannot run on part of its platforms")
                continue
            command += ["--platform-name", usable[0]]
        print(f"molecule: {name} ({', '.join(usable)})", flush=True)
        begun = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, env=dict(os.environ), check=False)
        status = "ok" if result.returncode == 0 else f"FAILED ({result.returncode})"
        print(f"molecule: {name}: {status} in {time.monotonic() - begun:.0f} s", flush=True)
        if result.returncode != 0:
            failed.append(name)
    print(
        f"molecule: {len(wanted) - len(failed)} passed, {len(failed)} failed "
        f"in {time.monotonic() - started:.0f} s" + (f": {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
