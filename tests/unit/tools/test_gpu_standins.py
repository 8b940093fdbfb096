"""The stand-ins for Google's GPU networking images (tools/localcluster/gpu_standins.py): built on
this machine's Docker (skipped without one), then run here as the real images are run on a VM:
the plugin installers write the real file names and env scripts with the published values, and
the RxDM stand-in needs its aperture devices, reports ready with the real log line, stops on
SIGTERM and refuses unknown flags."""

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from localcluster import gpu_standins, images

FOLDER = Path(gpu_standins.__file__).resolve().parent / "gpu_standins"
PREFIX = "hlf-standin-test-"
TCPXO, RXDM, GIB = (
    gpu_standins.IMAGES[key] for key in ("tcpxo_installer", "rxdm", "gib_installer")
)
LIB = "/var/lib/tcpxo/lib64"

# google/nccl-plugin-gpudirect-tcpxo@8f816be3b74e94cbbeb75db2762431ec09370ac1:
# tcpxo_scripts/nccl-env-profile.sh, with its default NICs (no PCI device found).
TCPXO_ENV = {
    "LD_LIBRARY_PATH": f"{LIB}:",
    "NCCL_FASTRAK_IFNAME": "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8",
    "NCCL_FASTRAK_CTRL_DEV": "eth0",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_CROSS_NIC": "0",
    "NCCL_PROTO": "Simple,LL128",
    "NCCL_MIN_NCHANNELS": "4",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE": "131072",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_P2P_PCI_CHUNKSIZE": "524288",
    "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
    "NCCL_FASTRAK_NUM_FLOWS": "2",
    "NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL": "0",
    "NCCL_BUFFSIZE": "8388608",
    "NCCL_FASTRAK_USE_SNAP": "1",
    "NCCL_FASTRAK_USE_LLCM": "1",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING": "0",
    "NCCL_TUNER_PLUGIN": "libnccl-tuner.so",
    "NCCL_TUNER_CONFIG_PATH": f"{LIB}/a3plus_tuner_config.textproto",
    "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": f"{LIB}/a3plus_guest_config.textproto",
    "NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS": "600000",
    "NCCL_DEBUG": "WARN",
    "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV,COLL,GRAPH",
}
TCPXO_FILES = {
    "libnccl-net.so",
    "libnccl-net_internal.so",
    "libnccl-tcpxo.so",
    "libnccl-tuner.so",
    "libnccl.so.2",
    "a3plus_tuner_config.textproto",
    "a3plus_guest_config.textproto",
    "nccl-env-profile.sh",
}
GIB_ENV = {
    "NCCL_NET": "gIB",
    "NCCL_CROSS_NIC": "0",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_P2P_NET_CHUNKSIZE": "131072",
    "NCCL_NVLS_CHUNKSIZE": "524288",
    "NCCL_IB_ADAPTIVE_ROUTING": "1",
    "NCCL_IB_QPS_PER_CONNECTION": "4",
    "NCCL_IB_TC": "52",
    "NCCL_IB_FIFO_TC": "84",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_SOCKET_IFNAME": "enp0s19,enp192s20",
    # Under /usr/local/gib, where the workload containers see the installer's folder.
    "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config.txtpb",
    "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": "/usr/local/gib/configs/guest_config.txtpb",
    "LD_LIBRARY_PATH": "/usr/local/gib/lib64:",
}
GIB_FILES = {
    "lib64/libnccl-net.so",
    "lib64/libnccl.so.2",
    "scripts/set_nccl_env.sh",
    "configs/guest_config.txtpb",
    "configs/tuner_config.txtpb",
}


def docker_works():
    if not shutil.which("docker"):
        return False
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return False


needs_docker = pytest.mark.skipif(not docker_works(), reason="no Docker daemon answers here")


@pytest.fixture(scope="module")
def built():
    """The three images, built once (cached by their inputs hash after that)."""
    if not docker_works():
        pytest.skip("no Docker daemon answers here")
    import docker
    from localcluster import cluster

    try:
        return gpu_standins.ensure_images(docker.from_env(), cluster.cache_dir())
    except images.ArchiveUnreachable as exc:
        pytest.skip(f"the Debian blank image cannot be built here: {exc}")


@pytest.fixture
def containers():
    """A maker of unique container names; every container so named is removed afterwards."""
    made = []

    def name():
        made.append(f"{PREFIX}{uuid.uuid4().hex[:10]}")
        return made[-1]

    yield name
    if made:
        subprocess.run(["docker", "rm", "-f", *made], capture_output=True, timeout=60, check=False)


@pytest.fixture
def var_lib(tmp_path, built):
    """A folder mounted as the installers' /var/lib; emptied by a container afterwards when
    this test does not run as root (the installers write as root)."""
    folder = tmp_path / "var-lib"
    folder.mkdir()
    yield folder
    if os.geteuid() != 0:
        subprocess.run(
            [
                *("docker", "run", "--rm", "-v", f"{folder}:/clean", "--entrypoint", "sh", TCPXO),
                *("-c", "rm -rf /clean/* /clean/.[!.]*"),
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )


def docker(*args, timeout=60):
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def env_after(name, image, mounts, shell, script, network="none"):
    """The variables `script` (sourced by `shell` in `image`) sets or changes, as a dict."""
    show = "env -0"
    before = "unset LD_LIBRARY_PATH; "
    command = f"{before}{show} > /tmp/before; {script}; {show} > /tmp/after; cat /tmp/before; "
    command += "printf '\\0--after--\\0'; cat /tmp/after"
    result = docker(
        "run",
        "--rm",
        "--name",
        name,
        f"--network={network}",
        *mounts,
        "--entrypoint",
        shell,
        image,
        "-c",
        command,
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.split("\0--after--\0")

    def parse(text):
        return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)

    old, new = parse(first), parse(second)
    return {key: value for key, value in new.items() if old.get(key) != value}, result.stderr


def test_wanted_per_profile():
    assert gpu_standins.wanted("tcpxo") == [TCPXO, RXDM]
    assert gpu_standins.wanted("gib") == [GIB]
    assert gpu_standins.wanted("socket") == []
    with pytest.raises(ValueError, match="auto"):
        gpu_standins.wanted("auto")


def test_every_script_says_it_is_a_standin_of_its_image_version():
    for key, (folder, _target, entrypoint) in gpu_standins.LAYOUT.items():
        scripts = sorted((FOLDER / folder).glob("*.sh"))
        assert FOLDER / folder / Path(entrypoint).name in scripts
        for script in scripts:
            assert "stand-in for the local cluster; not Google's" in script.read_text(), script
        tag = gpu_standins.IMAGES[key].rsplit(":", 1)[1]
        entry = (FOLDER / folder / Path(entrypoint).name).read_text()
        assert f'VERSION="{tag}"' in entry, f"{entrypoint} of {key} does not name {tag}"


def test_load_into_sends_only_what_the_vm_lacks(monkeypatch):
    ids = {("here", "a"): "sha256:1", ("here", "b"): "sha256:2", ("vm", "a"): "sha256:1"}
    piped = []
    monkeypatch.setattr(
        gpu_standins,
        "_image_id",
        lambda docker_cmd, name: ids.get(("vm" if "exec" in docker_cmd else "here", name), ""),
    )
    monkeypatch.setattr(
        gpu_standins, "pipe", lambda producer, consumer, **_: piped.append(producer)
    )
    gpu_standins.load_into("vm0", ["a"])
    assert piped == []
    gpu_standins.load_into("vm0", ["a", "b"])
    assert piped == [["docker", "save", "b"]]
    with pytest.raises(gpu_standins.ClusterError, match="ensure_images"):
        gpu_standins.load_into("vm0", ["c"])


@needs_docker
def test_images_are_labelled_standins_and_cached(built):
    assert built == list(gpu_standins.IMAGES.values())
    for key, name in gpu_standins.IMAGES.items():
        result = docker(
            "image", "inspect", "-f", "{{json .Config.Labels}}|{{.Config.Entrypoint}}", name
        )
        labels, entrypoint = result.stdout.strip().split("|")
        assert '"hostnet.llamafactory.standin":"true"' in labels
        assert f'"{images.IMAGE_LABEL}":"{gpu_standins.KIND}"' in labels
        assert entrypoint == f"[{gpu_standins.LAYOUT[key][2]}]"
    started = time.monotonic()
    import docker as docker_sdk
    from localcluster import cluster

    gpu_standins.ensure_images(docker_sdk.from_env(), cluster.cache_dir())
    assert time.monotonic() - started < 5, "a second ensure_images should find all three cached"


@needs_docker
def test_tcpxo_installer_writes_the_plugin_and_the_published_profile(var_lib, containers):
    result = docker(
        "run",
        "--rm",
        "--name",
        containers(),
        "--network=host",
        "-v",
        f"{var_lib}:/var/lib",
        TCPXO,
        "install",
        "--install-nccl",
    )
    assert result.returncode == 0, result.stderr
    for location in ("tcpxo", "fastrak"):
        lib64 = var_lib / location / "lib64"
        names = {path.name for path in lib64.iterdir()}
        assert names >= TCPXO_FILES, f"{lib64}: missing {TCPXO_FILES - names}"
        assert ".installer-version" not in names  # the real installer writes no marker
        assert (lib64 / "libnccl.so.2").resolve().is_file()
        assert "not Google's" in (lib64 / "libnccl-tcpxo.so").read_text()
    changed, errors = env_after(
        containers(),
        TCPXO,
        ["-v", f"{var_lib}/tcpxo:{Path(LIB).parent}:ro"],
        "bash",
        f'NCCL_LIB_DIR="{LIB}" source {LIB}/nccl-env-profile.sh',
    )
    assert errors == ""
    assert changed == TCPXO_ENV


@needs_docker
def test_tcpxo_profile_finds_the_nics_by_pci_address(var_lib, containers, tmp_path):
    result = docker(
        "run", "--rm", "--name", containers(), "-v", f"{var_lib}:/var/lib", TCPXO, "install"
    )
    assert result.returncode == 0, result.stderr
    sysfs = tmp_path / "class-net"
    slots = {
        "eth0": None,  # a veth: no PCI device
        "enp0s12": "0000:00:0c.0",
        "enp6s0": "0000:06:00.0",
        "enp7s0": "0000:07:00.0",
        "enp134s0": "0000:86:00.0",
        "enp12s0": "0000:0c:00.0",  # not a bus the profile takes for a GPU NIC
    }
    for netdev, slot in slots.items():
        (sysfs / netdev).mkdir(parents=True)
        if slot:
            (sysfs / netdev / "device").mkdir()
            uevent = f"DRIVER=gve\nPCI_CLASS=20000\nPCI_SLOT_NAME={slot}\n"
            (sysfs / netdev / "device" / "uevent").write_text(uevent)
    changed, _output = env_after(
        containers(),
        TCPXO,
        ["-v", f"{var_lib}/tcpxo:/var/lib/tcpxo:ro", "-v", f"{sysfs}:/sys/class/net:ro"],
        "bash",
        f'NCCL_LIB_DIR="{LIB}" source {LIB}/nccl-env-profile.sh',
    )
    assert changed["NCCL_SOCKET_IFNAME"] == changed["NCCL_FASTRAK_CTRL_DEV"] == "enp0s12"
    assert changed["NCCL_FASTRAK_IFNAME"] == "enp134s0,enp6s0,enp7s0"  # in the order of the names


@needs_docker
def test_tcpxo_installer_options(var_lib, containers):
    result = docker(
        "run",
        "--rm",
        "--name",
        containers(),
        "-v",
        f"{var_lib}:/var/lib",
        TCPXO,
        "install",
        "--no-install-nccl-shim-net",
    )
    assert result.returncode == 0, result.stderr
    names = {path.name for path in (var_lib / "tcpxo" / "lib64").iterdir()}
    assert "libnccl-net.so" in names
    assert not {"libnccl.so.2", "libnccl-net_internal.so", "a3plus_guest_config.textproto"} & names
    for args in (["shell"], [], ["install", "--install-ncc"]):
        result = docker("run", "--rm", "--name", containers(), TCPXO, *args)
        assert result.returncode == 2, args
        assert "Usage:" in result.stderr
        assert "stand-in for the local cluster; not Google's" in result.stderr


@needs_docker
def test_gib_installer_writes_the_plugin_and_its_env_script(var_lib, containers):
    result = docker(
        "run",
        "--rm",
        "--name",
        containers(),
        "--network=host",
        "-v",
        f"{var_lib}:/var/lib",
        GIB,
        "install",
        "--install-nccl",
    )
    assert result.returncode == 0, result.stderr
    gib = var_lib / "gib"
    names = {str(path.relative_to(gib)) for path in gib.rglob("*") if path.is_file()}
    assert names == GIB_FILES
    for shell in ("sh", "bash"):
        changed, errors = env_after(
            containers(),
            GIB,
            ["-v", f"{gib}:/usr/local/gib:ro"],
            shell,
            ". /usr/local/gib/scripts/set_nccl_env.sh",
        )
        assert errors == ""
        assert changed == GIB_ENV, shell
    result = docker("run", "--rm", "--name", containers(), GIB, "uninstall")
    assert result.returncode == 2
    assert "Usage:" in result.stderr


def rxdm_run(name, *args, aperture=None, detach=False):
    mounts = ["-v", f"{aperture}:/dev/aperture_devices:ro"] if aperture else []
    return docker("run", *(["-d"] if detach else []), "--name", name, *mounts, RXDM, *args)


@needs_docker
def test_rxdm_needs_aperture_devices(built, containers, tmp_path):
    result = rxdm_run(containers(), "--num_hops=2")
    assert result.returncode == 1
    assert "no aperture devices in /dev/aperture_devices" in result.stderr
    empty = tmp_path / "aperture-empty"
    empty.mkdir()
    result = rxdm_run(containers(), "--num_hops=2", aperture=empty)
    assert result.returncode == 1
    assert "no aperture devices" in result.stderr


@needs_docker
def test_rxdm_reports_ready_and_stops_on_sigterm(built, containers, tmp_path):
    aperture = tmp_path / "aperture"
    (aperture / "0000:06:00.1").mkdir(parents=True)
    name = containers()
    started = rxdm_run(
        name,
        "--num_hops=2",
        "--num_nics=8",
        "--uid=",
        "--alsologtostderr",
        aperture=aperture,
        detach=True,
    )
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 10
    logs = ""
    while time.monotonic() < deadline:
        result = docker("logs", name)
        logs = result.stdout + result.stderr
        if "Buffer manager initialization complete" in logs:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"RxDM stand-in not ready within 10 s:\n{logs}")
    assert "stand-in for the local cluster; not Google's" in logs
    assert re.search(
        r"^I\d{4} [\d:.]+ +1 \S+\] Buffer manager initialization complete$", logs, re.M
    )
    assert "--num_nics is retired" in logs
    stop_started = time.monotonic()
    assert docker("stop", "-t", "10", name).returncode == 0
    assert time.monotonic() - stop_started < 5
    state = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
    assert state == "0"


@needs_docker
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num_hops=2", "--bogus=1"], "unknown command line flag 'bogus'"),
        (["--num_hops=two"], "illegal value 'two' specified for int32 flag 'num_hops'"),
        (["--alsologtostderr=maybe"], "illegal value 'maybe' specified for bool flag"),
    ],
)
def test_rxdm_flag_errors_exit_2(built, containers, tmp_path, args, message):
    aperture = tmp_path / "aperture"
    (aperture / "0000:06:00.1").mkdir(parents=True)
    result = rxdm_run(containers(), *args, aperture=aperture)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Buffer manager initialization complete" not in result.stderr
