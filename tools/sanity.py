"""Run `ansible-test sanity` on this checkout, offline-capable.

ansible-test needs the collection at ansible_collections/NS/NAME inside a git work tree, and some
of its tests build virtual environments with a pip bootstrap script downloaded from a host that
may be unreachable. So: copy the files git knows (tracked, and untracked but not ignored) into
.cache/sanity/ansible_collections/hostnet/llamafactory, commit them there, provide a stand-in for
the bootstrap script (ensurepip, then pip with the system CA bundle), and run ansible-test from a
venv of its own (its --requirements would otherwise change the development venv).

Usage: python tools/sanity.py [--core 'ansible-core==2.20.10']   (default: pyproject.toml's)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "sanity"
VENV = ROOT / ".cache" / "sanity-venv"
COPY = WORK / "ansible_collections" / "hostnet" / "llamafactory"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
GET_PIP = '''"""Stand-in for get-pip.py written by tools/sanity.py: ensurepip, then pip itself."""
import ensurepip
import os
import subprocess
import sys

# ensurepip drops PIP_* and sets PIP_CONFIG_FILE=/dev/null in os.environ: pip itself gets the
# environment as it was (pip.conf, e.g. an offline wheelhouse, applies).
environ = dict(os.environ)
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
cert = ["--cert", "{ca}"] if os.path.exists("{ca}") else []
subprocess.check_call([sys.executable, "-m", "pip", "install", *cert, *args], env=environ)
'''


def sh(*command: str, cwd: Path = ROOT, env: dict | None = None) -> str:
    return subprocess.run(
        command, cwd=cwd, check=True, capture_output=True, text=True, env=env
    ).stdout


def pip_versions(venv: Path) -> set[str]:
    """The pip versions whose bootstrap script the venv's ansible-test downloads (2.19: 24.2,
    2.20+: 25.2), read from its source; empty when not found."""
    found = set()
    for source in venv.glob(
        "lib/python3*/site-packages/ansible_test/_internal/python_requirements.py"
    ):
        found.update(re.findall(r"pip='([0-9.]+)'", source.read_text()))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--core",
        help="the ansible-core requirement to test with (default: pyproject.toml's), "
        "e.g. 'ansible-core==2.20.10' (tools/matrix.py)",
    )
    args = parser.parse_args(argv)
    default = next(
        d
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("ansible-core")
    )
    core = args.core or default
    python = VENV / "bin" / "python"
    stamp = VENV / ".hostnet-core"  # the requirement the venv was made with (none: the default)
    made_with = stamp.read_text() if stamp.is_file() else default
    if not python.exists() or made_with != core:
        print(f"sanity: venv for ansible-test ({core})", flush=True)
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", core], check=True)
        stamp.write_text(core)

    shutil.rmtree(WORK, ignore_errors=True)
    COPY.mkdir(parents=True)
    files = sh("git", "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file() or source.is_symlink():
            (COPY / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, COPY / name, follow_symlinks=False)
    git_env = dict(
        os.environ,
        GIT_AUTHOR_NAME="sanity",
        GIT_AUTHOR_EMAIL="sanity@localhost",
        GIT_COMMITTER_NAME="sanity",
        GIT_COMMITTER_EMAIL="sanity@localhost",
    )
    sh("git", "init", "-q", cwd=COPY)
    sh("git", "add", "-A", cwd=COPY)
    sh("git", "commit", "-qm", "sanity snapshot", cwd=COPY, env=git_env)

    cache = Path.home() / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    versions = {"24.2", "25.0.1", "25.1.1", *pip_versions(VENV)}
    for version in versions:
        name = f"get_pip_{version.replace('.', '_')}.py"
        (cache / name).write_text(GET_PIP.replace("{ca}", CA_BUNDLE))

    env = dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.pop("ANSIBLE_CONFIG", None)
    if Path(CA_BUNDLE).exists():
        env.setdefault("PIP_CERT", CA_BUNDLE)
    command = [
        str(VENV / "bin" / "ansible-test"),
        "sanity",
        "--local",
        "--python",
        f"{sys.version_info.major}.{sys.version_info.minor}",
        "--requirements",
        "--skip-test",
        "pslint",
        "--color",
        "no",
    ]
    return subprocess.run(command, cwd=COPY, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
