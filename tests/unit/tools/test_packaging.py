"""The collection as users get it: built, installed from the tarball outside the checkout, its
module documented and its main playbook resolvable by its collection name."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
JUNK = {
    "tests",
    "tools",
    "molecule",
    ".cache",
    ".venv",
    ".ci",
    "dev",
    ".pytest_cache",
    ".ruff_cache",
    "ansible.cfg",
}


def run(args, cwd, env=None):
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result.stdout


def test_build_install_and_use_from_outside(tmp_path):
    run(
        [BIN / "ansible-galaxy", "collection", "build", ROOT, "--output-path", tmp_path],
        cwd=tmp_path,
    )
    tarball = next(tmp_path.glob("hostnet-llamafactory-*.tar.gz"))
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    assert {n.split("/")[0] for n in names} >= {
        "MANIFEST.json",
        "README.md",
        "LICENSE",
        "roles",
        "plugins",
        "playbooks",
    }
    junk = [
        n
        for n in names
        if n.split("/")[0] in JUNK or "__pycache__" in n or n.startswith("inventories/local")
    ]
    assert junk == []

    # Only the installed copy and the dependencies: not the checkout's own link, nor its cfg
    # (with it, ansible-galaxy would find the collection "already installed" and skip it).
    installed = tmp_path / "collections"
    deps = tmp_path / "deps" / "ansible_collections"
    deps.mkdir(parents=True)
    for namespace in ("community", "google", "ansible"):
        (deps / namespace).symlink_to(ROOT / ".cache/collections/ansible_collections" / namespace)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_COLLECTIONS_PATH"] = f"{installed}:{tmp_path / 'deps'}"
    run(
        [
            BIN / "ansible-galaxy",
            "collection",
            "install",
            "--offline",
            "--no-deps",
            "-p",
            installed,
            tarball,
        ],
        cwd=tmp_path,
        env=env,
    )
    assert (installed / "ansible_collections/hostnet/llamafactory/MANIFEST.json").is_file()

    doc = run([BIN / "ansible-doc", "hostnet.llamafactory.primary_nic"], cwd=tmp_path, env=env)
    assert str(installed) in doc and "NCCL_SOCKET_IFNAME" in doc
    (tmp_path / "hosts.ini").write_text("[llamafactory]\nnode0 ansible_host=203.0.113.10\n")
    run(
        [
            BIN / "ansible-playbook",
            "hostnet.llamafactory.train",
            "-i",
            "hosts.ini",
            "--syntax-check",
        ],
        cwd=tmp_path,
        env=env,
    )
