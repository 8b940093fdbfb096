"""The collections of requirements.yml, for a machine where Galaxy does not answer.

`ansible-galaxy collection install -r requirements.yml` is the ordinary way; Galaxy is not
reachable from this project's CI, so the collections come from the `ansible` PyPI wheel named
in pyproject.toml ([tool.hostnet.collections]; PyPI is reachable): downloaded once, only the
listed collections extracted, each version checked against requirements.yml. Such a wheel pins
one release of each collection: a newer one than it bundles needs Galaxy (or a newer wheel).
The checkout is linked in as hostnet.llamafactory so that a plain checkout resolves its FQCNs.

Usage: python tools/setup_collections.py DEST   (DEST gets ansible_collections/...)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def version_ok(version: str, spec: str) -> bool:
    """Whether a collection version satisfies a requirements.yml range ('>=4.8.0,<5.0.0', '*')."""
    return SpecifierSet("" if spec.strip() == "*" else spec).contains(version, prereleases=True)


def main(dest: Path) -> int:
    wheel_req = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hostnet"]
    wheel_req = wheel_req["collections"]["wheel"]
    wanted = yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]
    stamp, stamp_text = dest / ".stamp", f"{wheel_req} {wanted}"
    if not (stamp.exists() and stamp.read_text() == stamp_text):
        wheels = ROOT / ".cache" / "wheels"
        name, version = wheel_req.split("==")
        if not list(wheels.glob(f"{name}-{version}-*.whl")):
            print(f"setup: downloading {wheel_req} (about 55 MB) for its collections", flush=True)
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
            subprocess.run([*pip, wheel_req], check=True)
        shutil.rmtree(dest / "ansible_collections", ignore_errors=True)
        with zipfile.ZipFile(next(wheels.glob(f"{name}-{version}-*.whl"))) as wheel:
            for item in wanted:
                prefix = f"ansible_collections/{item['name'].replace('.', '/')}/"
                wheel.extractall(dest, [m for m in wheel.namelist() if m.startswith(prefix)])
                manifest = dest / prefix / "MANIFEST.json"
                if not manifest.is_file():
                    sys.exit(f"setup: {item['name']} is not in {wheel_req}")
                found = json.loads(manifest.read_text())["collection_info"]["version"]
                if not version_ok(found, item.get("version", "*")):
                    sys.exit(
                        f"setup: {item['name']} {found} from {wheel_req} does not satisfy "
                        f"{item['version']} (requirements.yml)"
                    )
                print(f"setup: collection {item['name']} {found}", flush=True)
        stamp.write_text(stamp_text)
    self_link = dest / "ansible_collections" / "hostnet" / "llamafactory"
    if not self_link.is_symlink():
        self_link.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self_link, ignore_errors=True)
        self_link.symlink_to(ROOT, target_is_directory=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
