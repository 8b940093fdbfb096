"""gce_firewall.render(): GCE's firewall semantics as iptables rules.

The rendered chains are walked for sample packets the way netfilter walks them (first match;
RETURN back to the caller, DROP ends it; a packet not dropped passes), so each test states GCE's
behaviour - which packets get through - rather than the text. iptables-restore --test checks
that the output loads."""

import ipaddress
import shlex
import shutil
import subprocess

import pytest
from localcluster import gce_firewall, spec
from localcluster.gce_firewall import FirewallError, render

NUMBERS = {"tcp": 6, "udp": 17, "icmp": 1, "esp": 50, "ah": 51, "sctp": 132}
VM0 = "198.18.0.10"
VM1 = "198.18.0.11"
VM2 = "198.18.0.12"
OUTSIDE = "198.19.0.1"  # the controller, on the external network


def vm(tags=(), name="vm0", network="default"):
    return {
        "name": name,
        "tags": list(tags),
        "network": network,
        "nics": {"ens4": "vpc", "ext0": "external"},
        "peers": {
            "vm0": {"address": VM0, "tags": list(tags)},
            "vm1": {"address": VM1, "tags": ["worker"]},
            "vm2": {"address": VM2, "tags": ["other"]},
        },
    }


def rule(name, allowed=None, denied=None, **fields):
    body = {"name": name, **fields}
    if denied is not None:
        body["denied"] = denied
    else:
        body["allowed"] = allowed if allowed is not None else [{"IPProtocol": "all"}]
    return body


def tcp(*ports):
    return [{"IPProtocol": "tcp", "ports": list(ports)}]


class Chains:
    """The rendered chains, walked for one packet as netfilter would."""

    def __init__(self, script: str):
        self.chains: dict[str, list[dict]] = {}
        for line in script.splitlines():
            if line.startswith(":"):
                self.chains[line[1:].split()[0]] = []
            elif line.startswith("-A "):
                words = shlex.split(line)
                options = dict(zip(words[::2], words[1::2], strict=True))
                self.chains[options.pop("-A")].append(options)

    def verdict(self, packet: dict) -> str:
        """'pass' or 'drop' for packet {nic, src, dst, proto, dport, state, direction}."""
        start = (
            gce_firewall.PREROUTING_CHAIN
            if packet.get("direction", "in") == "in"
            else gce_firewall.POSTROUTING_CHAIN
        )
        return "drop" if self._walk(start, packet) == "DROP" else "pass"

    def _walk(self, chain: str, packet: dict) -> str | None:
        for options in self.chains[chain]:
            if not self._matches(options, packet):
                continue
            target = options["-j"]
            if target in self.chains:
                if self._walk(target, packet) == "DROP":
                    return "DROP"
            else:
                return target if target == "DROP" else None  # RETURN: back to the caller
        return None

    @staticmethod
    def _matches(options: dict, packet: dict) -> bool:
        unknown = set(options) - {"-i", "-o", "-s", "-d", "-p", "--dport", "-m", "--ctstate"}
        unknown -= {"--comment", "-j"}
        assert not unknown, f"the walker does not know {unknown}"
        nic = packet.get("nic", "ens4")
        if "-i" in options and options["-i"] != nic:
            return False
        if "-o" in options and options["-o"] != nic:
            return False
        for flag, field in (("-s", "src"), ("-d", "dst")):
            if flag in options and ipaddress.ip_address(packet[field]) not in ipaddress.ip_network(
                options[flag]
            ):
                return False
        if "-p" in options:
            wanted = options["-p"]
            number = NUMBERS.get(wanted, int(wanted) if wanted.isdigit() else -1)
            if number != NUMBERS.get(packet["proto"], packet["proto"]):
                return False
        if "--dport" in options:
            low, _sep, high = options["--dport"].partition(":")
            if not int(low) <= packet["dport"] <= int(high or low):
                return False
        if "--ctstate" in options:
            return packet.get("state", "NEW") in options["--ctstate"].split(",")
        return True


def verdict(rules, target=None, **packet) -> str:
    packet = {"src": VM1, "dst": VM0, "proto": "tcp", "dport": 29500, **packet}
    return Chains(render(rules, target or vm())).verdict(packet)


# ------------------------------------------------------------------ implied rules, state


def test_implied_rules_deny_ingress_and_allow_egress():
    assert verdict([]) == "drop"
    assert verdict([], proto="icmp", dport=0) == "drop"
    assert verdict([], direction="out", src=VM0, dst=VM1) == "pass"


def test_replies_pass_both_ways_and_other_interfaces_are_not_filtered():
    assert verdict([], state="ESTABLISHED") == "pass"
    assert verdict([], state="RELATED", proto="icmp", dport=0) == "pass"
    assert verdict([], nic="lo") == "pass"
    assert verdict([], nic="docker0") == "pass"  # the bridge side; ens4 carried it in
    # ext0 stands for the external IP: filtered like the VPC NIC.
    assert verdict([], nic="ext0", src=OUTSIDE) == "drop"
    assert verdict([rule("ssh", tcp("22"))], nic="ext0", src=OUTSIDE, dport=22) == "pass"


# ------------------------------------------------------------------ priority


def test_lower_priority_number_wins():
    allow = rule("allow-900", tcp("29500"), priority=900)
    deny = rule("deny-1000", denied=tcp("29500"), priority=1000)
    assert verdict([deny, allow]) == "pass"
    allow["priority"] = 1100
    assert verdict([deny, allow]) == "drop"


def test_deny_beats_allow_at_equal_priority_in_any_order():
    allow = rule("a-allow", tcp("29500"), priority=1000)
    deny = rule("z-deny", denied=tcp("29500"), priority=1000)
    assert verdict([allow, deny]) == "drop"
    assert verdict([deny, allow]) == "drop"


def test_priority_defaults_to_1000():
    assert (
        verdict([rule("allow", tcp("29500")), rule("deny", denied=tcp("29500"), priority=1001)])
        == "pass"
    )
    assert (
        verdict([rule("allow", tcp("29500")), rule("deny", denied=tcp("29500"), priority=999)])
        == "drop"
    )


def test_the_implied_rules_sit_at_65535_where_a_deny_wins_the_tie():
    assert verdict([rule("allow", tcp("29500"), priority=65534)]) == "pass"
    assert verdict([rule("allow", tcp("29500"), priority=65535)]) == "drop"
    deny_out = rule("deny-out", denied=tcp("29500"), direction="EGRESS", priority=65535)
    assert verdict([deny_out], direction="out", src=VM0, dst=VM1) == "drop"


# ------------------------------------------------------------------ sources, targets, tags


def test_source_ranges():
    rules = [rule("from-vm1", tcp("29500"), sourceRanges=[f"{VM1}/32", "198.18.5.0/24"])]
    assert verdict(rules) == "pass"
    assert verdict(rules, src="198.18.5.77") == "pass"
    assert verdict(rules, src=VM2) == "drop"


def test_source_tags_match_the_tagged_vms_addresses_or_the_ranges():
    rules = [rule("workers", tcp("29500"), sourceTags=["worker"])]
    assert verdict(rules) == "pass"
    assert verdict(rules, src=VM2) == "drop"
    assert verdict(rules, src=OUTSIDE) == "drop"
    both = [rule("either", tcp("29500"), sourceTags=["worker"], sourceRanges=[OUTSIDE + "/32"])]
    assert verdict(both) == "pass" and verdict(both, src=OUTSIDE) == "pass"
    nobody = [rule("nobody", tcp("29500"), sourceTags=["absent"])]
    assert verdict(nobody) == "drop"
    assert verdict(nobody, src=OUTSIDE) == "drop"  # not the API's 0.0.0.0/0 default


def test_no_source_means_everywhere():
    assert verdict([rule("any", tcp("29500"))], src="198.18.99.1") == "pass"


def test_target_tags_select_the_vms_a_rule_applies_to():
    rules = [rule("to-rank0", tcp("29500"), targetTags=["rank0", "spare"])]
    assert verdict(rules, target=vm(tags=["rank0"])) == "pass"
    assert verdict(rules, target=vm(tags=["worker"])) == "drop"
    assert verdict(rules, target=vm(tags=[])) == "drop"


def test_disabled_rules_and_other_networks_are_ignored():
    deny = rule("deny", denied=tcp("29500"), priority=1, disabled=True)
    assert verdict([deny, rule("allow", tcp("29500"))]) == "pass"
    other = rule(
        "other-net",
        tcp("29500"),
        network="https://www.googleapis.com/compute/v1/projects/p/global/networks/hlf-net",
    )
    assert verdict([other]) == "drop"
    assert verdict([other], target=vm(network="hlf-net")) == "pass"
    same = dict(other, network="projects/p/global/networks/default")
    assert verdict([same]) == "pass"


def test_destination_ranges_on_ingress():
    rules = [rule("to-vm0", tcp("29500"), destinationRanges=[f"{VM0}/32"])]
    assert verdict(rules) == "pass"
    assert verdict(rules, nic="ext0", dst="198.19.0.10") == "drop"


# ------------------------------------------------------------------ protocols, ports


@pytest.mark.parametrize(
    ("allowed", "packet", "expected"),
    [
        ([{"IPProtocol": "all"}], {"proto": "udp", "dport": 53}, "pass"),
        ([{"IPProtocol": "all"}], {"proto": 47, "dport": 0}, "pass"),
        (tcp("22"), {"dport": 22}, "pass"),
        (tcp("22"), {"dport": 23}, "drop"),
        (tcp("22"), {"proto": "udp", "dport": 22}, "drop"),
        (tcp("1000-2000"), {"dport": 1000}, "pass"),
        (tcp("1000-2000"), {"dport": 2000}, "pass"),
        (tcp("1000-2000"), {"dport": 2001}, "drop"),
        (tcp("22", "30000-65535"), {"dport": 40000}, "pass"),
        ([{"IPProtocol": "tcp"}], {"dport": 1}, "pass"),
        ([{"IPProtocol": "udp", "ports": ["53"]}], {"proto": "udp", "dport": 53}, "pass"),
        ([{"IPProtocol": "icmp"}], {"proto": "icmp", "dport": 0}, "pass"),
        ([{"IPProtocol": "icmp"}], {"proto": "tcp", "dport": 22}, "drop"),
        ([{"IPProtocol": "esp"}], {"proto": "esp", "dport": 0}, "pass"),
        ([{"IPProtocol": "ah"}], {"proto": "ah", "dport": 0}, "pass"),
        ([{"IPProtocol": "sctp", "ports": ["9"]}], {"proto": "sctp", "dport": 9}, "pass"),
        ([{"IPProtocol": "ipip"}], {"proto": 4, "dport": 0}, "pass"),
        ([{"IPProtocol": "6", "ports": ["22"]}], {"dport": 22}, "pass"),
        ([{"IPProtocol": "17"}], {"proto": "udp", "dport": 9}, "pass"),
        ([{"IPProtocol": "47"}], {"proto": 47, "dport": 0}, "pass"),
        ([{"IPProtocol": "47"}], {"proto": "tcp", "dport": 0}, "drop"),
        ([{"IPProtocol": "TCP", "ports": ["22"]}], {"dport": 22}, "pass"),
        ([{"IPProtocol": "icmp"}, {"IPProtocol": "udp"}], {"proto": "udp", "dport": 1}, "pass"),
    ],
)
def test_protocols_and_ports(allowed, packet, expected):
    assert verdict([rule("r", allowed)], **packet) == expected


# ------------------------------------------------------------------ egress


def test_egress_deny_by_destination_and_tags():
    deny = rule(
        "no-egress",
        denied=tcp("29500"),
        direction="EGRESS",
        destinationRanges=[f"{VM1}/32"],
        targetTags=["rank0"],
    )
    out = {"direction": "out", "src": VM0, "dst": VM1}
    assert verdict([deny], target=vm(tags=["rank0"]), **out) == "drop"
    assert verdict([deny], target=vm(tags=["rank0"]), **{**out, "dst": VM2}) == "pass"
    assert verdict([deny], target=vm(tags=[]), **out) == "pass"
    assert verdict([deny], target=vm(tags=["rank0"]), **{**out, "state": "ESTABLISHED"}) == "pass"
    # An egress rule does not touch ingress, nor an ingress rule egress.
    assert verdict([deny, rule("in", tcp("29500"))], target=vm(tags=["rank0"])) == "pass"
    assert verdict([rule("in-deny", denied=tcp("29500"), priority=1)], **out) == "pass"


def test_egress_deny_all_with_a_higher_priority_allow():
    rules = [
        rule("deny-all-out", denied=[{"IPProtocol": "all"}], direction="EGRESS", priority=2000),
        rule("vpc-out", direction="EGRESS", destinationRanges=["198.18.0.0/24"], priority=1000),
    ]
    out = {"direction": "out", "src": VM0}
    assert verdict(rules, **out, dst=VM1) == "pass"
    assert verdict(rules, **out, dst="198.19.0.1", nic="ext0") == "drop"


# ------------------------------------------------------------------ the output itself


def test_rerendering_declares_the_same_four_chains_and_touches_no_other():
    script = render([rule("ssh", tcp("22"))], vm())
    declared = [line for line in script.splitlines() if line.startswith(":")]
    assert declared == [f":{chain} - [0:0]" for chain in gce_firewall.CHAINS]
    appended = {line.split()[1] for line in script.splitlines() if line.startswith("-A")}
    assert appended == set(gce_firewall.CHAINS)
    assert script.startswith("*mangle\n") and script.endswith("COMMIT\n")


def _restore_test(binary: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary, "--test", "--noflush"], input=script, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("binary", ["iptables-restore", "iptables-legacy-restore"])
def test_the_output_loads(binary):
    """--test parses (the legacy variant also resolves every target chain) without committing."""
    if not shutil.which(binary):
        pytest.skip(f"{binary} is not installed here")
    rules = [
        *spec.load().firewall,
        rule("p", [{"IPProtocol": p} for p in ("esp", "ah", "ipip", "47", "all")]),
        rule("s", [{"IPProtocol": "sctp", "ports": ["9", "10-20"]}], sourceTags=["worker"]),
        rule("e", denied=tcp("0-65535"), direction="EGRESS", destinationRanges=["0.0.0.0/0"]),
    ]
    result = _restore_test(binary, render(rules, vm(tags=["rank0"])))
    if "Permission denied" in result.stderr or "not permitted" in result.stderr:
        pytest.skip(f"{binary} needs root: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    # ...and the check can fail: a port iptables refuses.
    broken = render([rule("ssh", tcp("22"))], vm()).replace("--dport 22", "--dport 99999")
    assert _restore_test(binary, broken).returncode != 0


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"name": "Bad_Name", "allowed": [{"IPProtocol": "all"}]}, "name must match"),
        ({"name": "r"}, "exactly one of allowed or denied"),
        (
            {"name": "r", "allowed": [{"IPProtocol": "all"}], "denied": [{"IPProtocol": "all"}]},
            "exactly one of allowed or denied",
        ),
        ({"name": "r", "allowed": [{"IPProtocol": "gre"}]}, "protocol 'gre' is not one of"),
        ({"name": "r", "allowed": [{"IPProtocol": "300"}]}, "within 0..255"),
        ({"name": "r", "allowed": [{"IPProtocol": "icmp", "ports": ["1"]}]}, "tcp, udp and sctp"),
        ({"name": "r", "allowed": [{"IPProtocol": "all", "ports": ["1"]}]}, "tcp, udp and sctp"),
        ({"name": "r", "allowed": tcp("70000")}, "port '70000' must be N or N-M"),
        ({"name": "r", "allowed": tcp("20-10")}, "port '20-10'"),
        ({"name": "r", "allowed": tcp("ssh")}, "port 'ssh'"),
        ({"name": "r", "allowed": ["tcp"]}, "give {IPProtocol"),
        ({"name": "r", "allowed": tcp("1"), "priority": 70000}, "priority 70000"),
        ({"name": "r", "allowed": tcp("1"), "direction": "IN"}, "INGRESS or EGRESS"),
        ({"name": "r", "allowed": tcp("1"), "sourceRanges": ["10.0.0.300/8"]}, "not a CIDR"),
        ({"name": "r", "allowed": tcp("1"), "sourceRanges": ["::/0"]}, "only IPv4"),
        ({"name": "r", "allowed": tcp("1"), "sourceRanges": "0.0.0.0/0"}, "must be a list"),
        ({"name": "r", "allowed": tcp("1"), "targetTags": ["Web"]}, "targetTags 'Web'"),
        (
            {"name": "r", "allowed": tcp("1"), "direction": "EGRESS", "sourceTags": ["a"]},
            "sourceTags apply to INGRESS",
        ),
        ({"name": "r", "allowed": tcp("1"), "targetServiceAccounts": ["a@b"]}, "use tags"),
        ({"name": "r", "allowed": tcp("1"), "colour": "red"}, r"unknown keys \['colour'\]"),
        ({"name": "r", "allowed": tcp("1"), "disabled": "yes"}, "disabled must be true or false"),
    ],
)
def test_rules_gce_would_refuse_are_refused_by_name(bad, message):
    with pytest.raises(FirewallError, match=message):
        render([bad], vm())


# ------------------------------------------------------------------ a cluster's state


def test_vm_views_and_enforce_render_every_vm(monkeypatch):
    state = {
        "nodes": [
            {"name": "vm0", "container": "hlf-t-vm0", "nic": "ens4", "vpc_address": VM0},
            {
                "name": "vm1",
                "container": "hlf-t-vm1",
                "nic": "eth0",
                "vpc_address": VM1,
                "tags": ["worker"],
                "external_nic": "ext0",
            },
        ]
    }
    views = gce_firewall.vm_views(state)
    assert views["hlf-t-vm1"]["nics"] == {"eth0": "vpc", "ext0": "external"}
    assert views["hlf-t-vm0"]["peers"]["vm1"] == {"address": VM1, "tags": ["worker"]}
    applied = {}
    monkeypatch.setattr(
        gce_firewall, "apply", lambda name, script, _d: applied.update({name: script})
    )
    monkeypatch.setattr(gce_firewall, "is_running", lambda _name: True)
    gce_firewall.enforce(state, [rule("workers", tcp("29500"), sourceTags=["worker"])])
    assert sorted(applied) == ["hlf-t-vm0", "hlf-t-vm1"]
    assert f"-s {VM1}/32" in applied["hlf-t-vm0"] and "-i eth0" in applied["hlf-t-vm1"]
    # A stopped VM is skipped: it gets the rules when it starts.
    applied.clear()
    monkeypatch.setattr(gce_firewall, "is_running", lambda name: name == "hlf-t-vm0")
    gce_firewall.enforce(state, [])
    assert sorted(applied) == ["hlf-t-vm0"]


def test_enforce_names_every_vm_that_failed(monkeypatch):
    state = {
        "nodes": [
            {"name": n, "container": f"hlf-t-{n}", "nic": "ens4", "vpc_address": a}
            for n, a in (("vm0", VM0), ("vm1", VM1))
        ]
    }

    def apply(name, _script, _deadline):
        if name == "hlf-t-vm1":
            raise gce_firewall.ClusterError("docker exec ... failed (1): iptables-restore: line 3")

    monkeypatch.setattr(gce_firewall, "apply", apply)
    monkeypatch.setattr(gce_firewall, "is_running", lambda _name: True)
    with pytest.raises(gce_firewall.ClusterError, match=r"on vm1 \(hlf-t-vm1\): docker exec"):
        gce_firewall.enforce(state, [])


# ------------------------------------------------------------------ GPU machine types' networks


def gpu_state():
    from localcluster import cluster

    definition = spec.load(
        name="gpubox",
        vms=[
            {"name": "vm0", "machine_type": "a3-megagpu-8g"},
            {"name": "vm1", "machine_type": "a3-megagpu-8g", "tags": ["worker"]},
            {"name": "vm2", "machine_type": "a3-ultragpu-8g"},
        ],
    )
    nodes = []
    for vm in definition.vms:
        control, gpus = cluster.nic_entries(definition, vm)
        nodes.append(
            {
                "name": vm.name,
                "container": definition.container(vm),
                "nic": vm.nic,
                "tags": list(vm.tags),
                "vpc_address": definition.networks["vpc"].address(vm.index),
                "control_nics": control,
                "gpu_nics": gpus,
            }
        )
    return {"nodes": nodes}


def test_tcpxo_gpu_vpcs_are_filtered_by_their_own_rules_rdma_ones_not_at_all():
    views = gce_firewall.vm_views(gpu_state())
    mega, ultra = views["hlf-gpubox-vm0"], views["hlf-gpubox-vm2"]
    assert sorted(mega["more_networks"]) == [f"gpubox-gpu{i}" for i in range(8)]
    gpu0 = mega["more_networks"]["gpubox-gpu0"]
    assert gpu0["nics"] == ["enp6s0"]
    assert gpu0["peers"]["vm1"] == {"address": "198.18.16.11", "tags": ["worker"]}
    # gib: the second control NIC's VPC is filtered, the RDMA NICs' are not.
    assert list(ultra["more_networks"]) == ["gpubox-net-1"]
    assert "gpu0rdma0" not in render([], ultra)

    peer = {"src": "198.18.16.11", "dst": "198.18.16.10", "proto": "tcp", "dport": 5000}
    on_gpu0 = {**peer, "nic": "enp6s0"}
    # The project's default-network rules do not open a GPU VPC: its implied deny-ingress does.
    everything = rule("allow-all-default", [{"IPProtocol": "all"}])
    assert Chains(render([everything], mega)).verdict(on_gpu0) == "drop"
    assert Chains(render([everything], mega)).verdict({**peer, "nic": "ens4"}) == "pass"
    # A rule of that GPU VPC opens it (sourceTags match the peers' addresses there).
    link = "https://www.googleapis.com/compute/v1/projects/hostnet-box/global/networks/"
    opened = rule("gpu0-workers", tcp("5000"), network=link + "gpubox-gpu0", sourceTags=["worker"])
    assert Chains(render([opened], mega)).verdict(on_gpu0) == "pass"
    assert Chains(render([opened], mega)).verdict({**on_gpu0, "nic": "enp7s0"}) == "drop"
    assert Chains(render([opened], mega)).verdict({**on_gpu0, "direction": "out"}) == "pass"
    # A plain VM's chains are the four of before.
    declared = [line for line in render([], vm()).splitlines() if line.startswith(":")]
    assert declared == [f":{chain} - [0:0]" for chain in gce_firewall.CHAINS]


@pytest.mark.parametrize("binary", ["iptables-restore", "iptables-legacy-restore"])
def test_gpu_network_chains_load(binary):
    if not shutil.which(binary):
        pytest.skip(f"{binary} is not installed here")
    views = gce_firewall.vm_views(gpu_state())
    result = _restore_test(binary, render([rule("ssh", tcp("22"))], views["hlf-gpubox-vm0"]))
    assert result.returncode == 0, result.stderr
