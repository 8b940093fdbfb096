"""The checks of hostnet.llamafactory as nox sessions (./dev runs them; `nox -l` lists them).

    lint                    ruff, antsibull-changelog lint, then ansible-lint (antsibull-nox)
    sanity                  ansible-test sanity --local (antsibull-nox, on a copy laid out as
                            ansible_collections/hostnet/llamafactory)
    units                   pytest tests/unit
    molecule(scenario=S)    one molecule scenario; SKIPPED when its images cannot be built here
    matrix(core=X.Y)        units and sanity under ansible-core X.Y on Python 3.13, in a
                            Debian 13 container (this machine's Python 3.11 caps it at 2.19)

lint, units and molecule run in the development venv (./dev setup); sanity and ansible-lint in
venvs of their own under .nox/ (antsibull-nox). antsibull-nox's own sanity and unit sessions
insist on `ansible-test --docker` and an ansible-core from git, neither of which reach this
project's CI: sanity is its generic ansible-test session with `--local` and ansible-core from PyPI.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import antsibull_nox
import nox
import yaml
from antsibull_nox.sessions.ansible_test import add_ansible_test_session

ROOT = Path(__file__).resolve().parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# ansible-core lines of the matrix, oldest first; ./dev test runs the newest (the last).
CORES = ("2.19", "2.20", "2.21")
# Development-only tools the matrix's controller checks do not need.
NOT_NEEDED = (
    "ansible-core",
    "ansible-lint",
    "molecule",
    "molecule-plugins",
    "ruff",
    "pytest-testinfra",
)

os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "tools"), str(ROOT / "tests"), os.environ.get("PYTHONPATH")])
)
if CA_BUNDLE.is_file():  # ansible-test hands pip no CA settings of pip's own configuration
    os.environ.setdefault("PIP_CERT", str(CA_BUNDLE))
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "sanity", "units"]
antsibull_nox.load_antsibull_nox_toml()  # antsibull-nox.toml: the ansible-lint session


def dev_core() -> str:
    """The ansible-core line of the development venv (pyproject.toml): '2.19'."""
    deps = PYPROJECT["project"]["dependencies"]
    return next(re.search(r">=\s*(\d+\.\d+)", d)[1] for d in deps if d.startswith("ansible-core"))


def unit_requirements() -> list[str]:
    """pyproject.toml's dependencies without ansible-core and the development-only tools."""
    name = re.compile(r"[A-Za-z0-9_.-]+")
    deps = PYPROJECT["project"]["dependencies"]
    return [d for d in deps if name.match(d)[0].lower() not in NOT_NEEDED]


def core_requirement(core: str) -> str:
    """'2.21' -> 'ansible-core>=2.21,<2.22'."""
    major, minor = (int(x) for x in core.split("."))
    return f"ansible-core>={major}.{minor},<{major}.{minor + 1}"


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff, antsibull-changelog lint, then ansible-lint (production profile, .ansible-lint)."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("antsibull-changelog", "lint")
    session.notify("ansible-lint")


# ansible-test downloads a pip bootstrap script (get-pip) for the venvs some sanity tests make,
# from a host this project's CI cannot reach, and hands pip no CA settings. A stand-in where it
# caches that download: ensurepip, then pip itself with the system CA bundle.
GET_PIP = f'''"""Stand-in for get-pip.py (noxfile.py): ensurepip, then pip."""
import ensurepip, os, subprocess, sys
environ = dict(os.environ)  # ensurepip empties PIP_* in os.environ: pip gets them back
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
cert = ["--cert", "{CA_BUNDLE}"] if os.path.exists("{CA_BUNDLE}") else []
subprocess.check_call([sys.executable, "-m", "pip", "install", *cert, *args], env=environ)
'''


def get_pip_stand_in() -> None:
    cache = Path.home() / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    # The versions the sanity venv's ansible-test asks for (2.19: 24.2, 2.20: 25.2, ...).
    sources = ROOT.glob(".nox/sanity/lib/python3*/site-packages/ansible_test/_internal/*.py")
    versions = {v for f in sources for v in re.findall(r"pip='([0-9.]+)'", f.read_text())}
    for version in versions or {"24.2", "25.2"}:
        (cache / f"get_pip_{version.replace('.', '_')}.py").write_text(GET_PIP)


SANITY_CORE = os.environ.get("HLF_CORE") or dev_core()  # set by matrix() in its container
add_ansible_test_session(
    name="sanity",
    description=f"ansible-test sanity --local, ansible-core {SANITY_CORE} from PyPI",
    ansible_test_params=[
        "sanity",
        "--local",
        "--requirements",
        "--skip-test",
        "pslint",
        "--python",
        f"{sys.version_info.major}.{sys.version_info.minor}",
    ],
    default=True,
    ansible_core_version=SANITY_CORE,
    ansible_core_source="pypi",
    callback_before=get_pip_stand_in,
    # antsibull-nox 1.10 copies tests/output back bottom-up, which fails on Python 3.12+ for
    # nested folders it has not made yet (ansible-test's scratch tests/output/.tmp/pylint).
    callback_after=lambda: shutil.rmtree("tests/output/.tmp", ignore_errors=True),
)


@nox.session(venv_backend="none")
def units(session: nox.Session) -> None:
    """The unit tests (tests/unit), with the packaging test (build, install, use)."""
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/unit", *session.posargs)


def scenario_images(scenario: str) -> dict[str, str]:
    platforms = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())
    return {p["name"]: p.get("image", "") for p in platforms["platforms"]}


def molecule_command(scenario: str, platforms: list[str], unusable: list[str]) -> list[str] | None:
    """The molecule command for the platforms that can run; None: the scenario is skipped
    (molecule can leave out all platforms but one, not some of several)."""
    usable = [p for p in platforms if p not in unusable]
    command = ["molecule", "test", "-s", scenario]
    if not unusable:
        return command
    return [*command, "--platform-name", usable[0]] if len(usable) == 1 else None


SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
SCENARIOS.remove("default")  # a stub: molecule looks for it before every scenario (see it)


@nox.session(venv_backend="none", default=False)
@nox.parametrize("scenario", SCENARIOS)
def molecule(session: nox.Session, scenario: str) -> None:
    """One molecule scenario, SKIPPED where its images cannot be built.

    Its local images are built first (cached). Platforms whose
    distribution archive does not answer (Ubuntu's is not reached everywhere) are left out;
    a scenario left with none, or with a part of several, is SKIPPED (not passed)."""
    from localcluster import cluster, images

    client, unusable = cluster.client(), []
    for platform, image in scenario_images(scenario).items():
        found = re.fullmatch(r"hostnet-llamafactory/(vm|blank):([a-z0-9]+)", image)
        if found:
            try:
                dist = images.PLATFORMS[found[2]]
                images.ensure_vm_image(client, dist, cluster.cache_dir(), kind=found[1])
            except images.ArchiveUnreachable as exc:
                session.warn(f"platform {platform} ({image}) left out: {exc}")
                unusable.append(platform)
    command = molecule_command(scenario, list(scenario_images(scenario)), unusable)
    if command is None:
        session.skip(f"SKIPPED {scenario}: its platforms {unusable} cannot be built here")
    session.run(*command, *session.posargs)


@nox.session(venv_backend="none", default=False)
@nox.parametrize(
    "core", [nox.param(c, tags=["newest-core"] if c == CORES[-1] else []) for c in CORES]
)
def matrix(session: nox.Session, core: str) -> None:
    """units and sanity under an ansible-core line on Python 3.13, in a Debian 13 container.

    ansible-core: the line's newest release on PyPI. The container: one of
    hostnet-llamafactory/controller:debian13 (built once by debootstrap, cached), with the
    checkout as git lists it (tracked, and untracked but not ignored); pip reaches PyPI from it
    with this machine's CA bundle. `-- --keep` keeps the container."""
    from localcluster import cluster, images

    image = images.ensure_vm_image(
        cluster.client(), images.PLATFORMS["debian13"], cluster.cache_dir(), kind="controller"
    )
    name, src = f"hlf-matrix-{core}", "/work/ansible_collections/hostnet/llamafactory"
    wheel_name, version = PYPROJECT["tool"]["hostnet"]["collections"]["wheel"].split("==")
    wheel = next((ROOT / ".cache" / "wheels").glob(f"{wheel_name}-{version}-*.whl"), None)
    if wheel is None:
        session.error(f"{wheel_name}=={version} is not in .cache/wheels: run ./dev setup first")
    ca = []
    if CA_BUNDLE.is_file():  # for a machine behind a TLS-inspecting proxy; harmless elsewhere
        ca = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "-e", f"PIP_CERT={CA_BUNDLE}"]
        ca += ["-e", f"SSL_CERT_FILE={CA_BUNDLE}"]
    # Outside the checkout: later runs, from any clone on this machine, download nothing.
    pip_cache = Path.home() / ".cache" / "hostnet-llamafactory" / "matrix-pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    run = ["docker", "run", "-d", "--name", name, "--label", "hostnet.llamafactory.matrix=1", *ca]
    run += ["-v", f"{pip_cache}:/root/.cache/pip", "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1"]
    session.run(*run, image, "sleep", "infinity", silent=True)
    wheel_path = wheel.relative_to(ROOT)  # copied in too: the collections (setup_collections.py)
    try:
        copy = f"""set -o pipefail
            {{ git ls-files -co --exclude-standard -z; printf '%s\\0' {wheel_path}; }} |
            tar -c --null --ignore-failed-read -T - |
            docker exec -i {name} sh -c 'mkdir -p {src} && tar -x -C {src}'"""
        session.run("bash", "-c", copy, silent=True)
        requirements = shlex.join([core_requirement(core), *unit_requirements()])
        git = "git -c user.name=matrix -c user.email=matrix@localhost"
        script = f"""cd {src}
            {git} init -q && git add -A && {git} commit -qm snapshot  # what nox copies (git's list)
            python3 -m venv /opt/venv && export PATH=/opt/venv/bin:$PATH
            pip install -q --progress-bar off --upgrade pip
            pip install -q --progress-bar off {requirements}
            python tools/setup_collections.py .cache/collections
            HLF_CORE={core} nox --non-interactive -s units sanity"""
        session.run("docker", "exec", name, "timeout", "3600", "bash", "-euxc", script)
    finally:
        if "--keep" in session.posargs:
            session.log(f"kept: docker exec -it -w {src} {name} bash; remove: docker rm -f {name}")
        else:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
