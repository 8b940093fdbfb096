"""Install the collections of requirements.yml from the `ansible` wheel (no Galaxy needed).

Usage: python tools/setup_collections.py DEST   (DEST gets ansible_collections/...)
Downloads the wheel named in pyproject.toml once (pip's cache and find-links apply), extracts
only the listed collections, checks each version against requirements.yml, and links this
checkout in as hostnet.llamafactory so that a plain checkout resolves its own FQCNs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml
from ansible.module_utils.compat.version import LooseVersion

ROOT = Path(__file__).resolve().parents[1]


def version_ok(version: str, spec: str) -> bool:
    ops = {
        ">=": lambda a, b: a >= b,
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }
    for part in (p.strip() for p in spec.split(",") if p.strip() and p.strip() != "*"):
        op = next(o for o in (">=", "<=", "==", "!=", ">", "<") if part.startswith(o))
        if not ops[op](LooseVersion(version), LooseVersion(part[len(op) :])):
            return False
    return True


def main(dest: Path) -> int:
    wheel_req = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hostnet"][
        "collections"
    ]["wheel"]
    wanted = yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]
    stamp_text = hashlib.sha256(f"{wheel_req}{wanted}".encode()).hexdigest()
    stamp = dest / ".stamp"
    if not (stamp.exists() and stamp.read_text() == stamp_text):
        wheels = ROOT / ".cache" / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        found = sorted(wheels.glob(f"{wheel_req.split('==')[0]}-{wheel_req.split('==')[1]}-*.whl"))
        if not found:
            print(f"setup: downloading {wheel_req} (about 55 MB) for its collections", flush=True)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    str(wheels),
                    wheel_req,
                ],
                check=True,
            )
            found = sorted(wheels.glob(f"{wheel_req.split('==')[0]}-*.whl"))
        shutil.rmtree(dest / "ansible_collections", ignore_errors=True)
        with zipfile.ZipFile(found[-1]) as wheel:
            for item in wanted:
                namespace, name = item["name"].split(".")
                prefix = f"ansible_collections/{namespace}/{name}/"
                members = [m for m in wheel.namelist() if m.startswith(prefix)]
                if not members:
                    print(f"setup: {item['name']} is not in {wheel_req}", file=sys.stderr)
                    return 1
                wheel.extractall(dest, members)
                manifest = json.loads((dest / prefix / "MANIFEST.json").read_text())
                version = manifest["collection_info"]["version"]
                if not version_ok(version, item.get("version", "*")):
                    print(
                        f"setup: {item['name']} {version} from {wheel_req} does not satisfy "
                        f"{item['version']} (requirements.yml)",
                        file=sys.stderr,
                    )
                    return 1
                print(f"setup: collection {item['name']} {version}", flush=True)
        stamp.write_text(stamp_text)
    self_link = dest / "ansible_collections" / "hostnet" / "llamafactory"
    if not self_link.is_symlink():
        self_link.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self_link, ignore_errors=True)
        self_link.symlink_to(ROOT, target_is_directory=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
