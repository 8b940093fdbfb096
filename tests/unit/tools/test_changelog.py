"""A release made from the changelog fragments (antsibull-changelog) on a copy of the collection
shows every fragment and every module of the collection (`nox -s lint` lints the fragments)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
FRAGMENTS = ROOT / "changelogs" / "fragments"


def changelog(*args, cwd):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        [str(BIN / "antsibull-changelog"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_release_shows_every_fragment_and_module(tmp_path):
    copy = tmp_path / "ansible_collections" / "hostnet" / "llamafactory"
    copy.mkdir(parents=True)
    for name in ("galaxy.yml", "meta", "changelogs", "plugins", "roles", "playbooks"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy / name)
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    done = changelog("release", "--version", version, "--date", "2026-11-30", cwd=copy)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = (copy / "CHANGELOG.md").read_text()
    plain = notes.replace("\\", "")
    assert f"## v{version}" in plain
    for fragment in FRAGMENTS.glob("*.yml"):
        for section, entries in yaml.safe_load(fragment.read_text()).items():
            for entry in [entries] if isinstance(entries, str) else entries:
                words = entry.replace("``", "").split()[:6]
                assert " ".join(words).replace("`", "") in plain.replace("<code>", "").replace(
                    "</code>", ""
                ), (fragment.name, section, words)
    for kind in ("modules", "filter"):
        for plugin in (ROOT / "plugins" / kind).glob("[!_]*.py"):
            assert f"hostnet.llamafactory.{plugin.stem}" in plain, (kind, plugin.stem)
