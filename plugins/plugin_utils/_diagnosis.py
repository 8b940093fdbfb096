# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Known multi-node failure signatures (the one table) and the function that applies it to logs.

Each signature: id, a regular expression over one log line, an example line (recorded here or
quoted from the public report; the README's troubleshooting table shows it), the cause and the
fix; {0}, {1}... in cause/fix are the expression's groups. Order matters: the first match of a
line wins.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

SIGNATURES = [
    {
        "id": "peer-lost",
        "example": "[hostnet.llamafactory agent] rank 0: stopping this rank: rank 1"
        " (198.18.0.11:39949) has not answered for 31 s (peer_timeout 30 s): its node is gone,"
        " frozen or cut off",
        "pattern": r"\[hostnet\.llamafactory agent\] rank \d+: stopping this rank: (rank \d+ "
        r"\([^)]*\)) (has not answered for \d+ s|never answered in \d+ s|exited with code \d+)",
        "cause": "This rank was healthy; its agent stopped it because {0} {1}, so the job could "
        "not go on without that rank.",
        "fix": "Look at {0}: its log, its VM (preempted, stopped, frozen?) and the network "
        "between the nodes. A restart resumes from the newest checkpoint every rank holds "
        "(train.yml again, or launch_max_restarts).",
    },
    {
        "id": "bridge-address",
        "example": "NCCL WARN socketStartConnect: Connect to 172.17.0.2<49113> failed : Software"
        " caused connection abort",
        # Docker's default bridge pools: 172.17.0.0/16 (docker0), then 172.18-31.
        "pattern": r"socketStartConnect: Connect to (172\.(?:1[7-9]|2\d|3[01])\.\d+\.\d+)"
        r"<\d+> failed",
        "cause": "NCCL dials {0}, a Docker bridge address: the containers run on Docker's bridge "
        "network and advertise addresses that only their own VM can reach.",
        "fix": "Run the training containers with host networking (network_mode host, this "
        "collection's launch does) and NCCL_SOCKET_IFNAME set to the VM's NIC "
        "(primary_nic finds it).",
    },
    {
        "id": "gloo-bridge-address",
        "example": "Gloo connectFullMesh failed with [...] timed out connecting: SO_ERROR:"
        " Connection refused, remote=[172.17.0.2]:50575",
        "pattern": r"Gloo connectFullMesh failed.*remote=\[(172\.(?:1[7-9]|2\d|3[01])\.\d+\.\d+)\]",
        "cause": "Gloo dials {0}, a Docker bridge address: the containers run on Docker's bridge "
        "network, every rank advertises its container's 172.x address (often the same one on "
        "every VM) and the peers cannot reach it.",
        "fix": "Run the training containers with host networking (llamafactory_network_mode "
        "host, the default) and GLOO_SOCKET_IFNAME set to the VM's NIC (primary_nic finds it).",
    },
    {
        "id": "peer-crashed",
        "example": "[...pair.cc:553] Connection closed by peer [198.18.0.11]:29351. This is"
        " typically caused by a remote worker crashing.",
        "pattern": r"Connection closed by peer \[([^\]]+)\]",
        "cause": "The rank at {0} went away in the middle of a collective: this rank failed "
        "because another one died first.",
        "fix": "Read the log of the rank at {0} (the wait step names the first rank that failed).",
    },
    {
        "id": "peer-port-blocked",
        "example": "NCCL WARN socketStartConnect: Connect to 10.128.0.6<41234> failed : Connection"
        " refused",
        "pattern": r"socketStartConnect: Connect to (\d+\.\d+\.\d+\.\d+)<(\d+)> failed",
        "cause": "NCCL cannot open a connection to {0} port {1}: NCCL uses ephemeral ports "
        "between every pair of nodes, not only MASTER_PORT.",
        "fix": "Allow all TCP and UDP ports between the nodes (role gcp_firewall) and check that "
        "every node trains on the NIC of the shared network.",
    },
    {
        "id": "nccl-interface-missing",
        "example": "NCCL WARN Bootstrap : no socket interface found",
        "pattern": r"Bootstrap ?: no socket interface found",
        "cause": "NCCL_SOCKET_IFNAME names no interface this host has (or one that is down), so "
        "NCCL cannot even start its bootstrap; NIC names differ between images (ens4, eth0, "
        "enp0s12).",
        "fix": "Let primary_nic choose the interface, or set llamafactory_interface to a NIC "
        "that exists and is up on that host.",
    },
    {
        "id": "gloo-interface-missing",
        "example": "RuntimeError: [...device.cc:83] ifa != nullptr. Unable to find address for:"
        " eth0",
        "pattern": r"Unable to find address for: (\S+)",
        "cause": "GLOO_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) names {0}, an interface this host "
        "does not have; NIC names differ between images (ens4, eth0, enp0s12).",
        "fix": "Let primary_nic choose the interface, or set llamafactory_interface to a NIC that "
        "exists on that host.",
    },
    {
        "id": "gloo-loopback",
        "example": "RuntimeError: Gloo connectFullMesh failed with [...] no error; rank=1;"
        " remote=[127.0.0.1]:44379; Connection refused",
        "pattern": r"Gloo connectFullMesh failed.*remote=\[127\.0\.0\.1\]",
        "cause": "Gloo bound a loopback address: the host name resolves to 127.0.0.1 and no "
        "GLOO_SOCKET_IFNAME was set.",
        "fix": "Set GLOO_SOCKET_IFNAME to the training NIC (this collection's launch sets it "
        "from primary_nic).",
    },
    {
        "id": "network-unreachable",
        "example": "RuntimeError: [...pair.cc:144] connect [198.18.0.10]:33501: connect: Network is"
        " unreachable",
        "pattern": r"connect: Network is unreachable",
        "cause": "A node uses an interface whose address cannot reach its peers.",
        "fix": "Train on the NIC that routes to MASTER_ADDR on every node (primary_nic with "
        "peer), or set llamafactory_interface.",
    },
    {
        "id": "nccl-ib-wrong-type",
        "example": "NCCL WARN socketFinalizeAccept: wrong type 3 != 4",
        "pattern": r"socketFinalizeAccept: wrong type (\d+) != (\d+)",
        "cause": "NCCL's InfiniBand/RoCE transport met a peer speaking the socket transport (or "
        "the reverse): the nodes disagree on the transport, typically hosts that have IB "
        "libraries but no usable IB fabric between them (LLaMA-Factory issue #3641).",
        "fix": "Set NCCL_IB_DISABLE=1 on every node (llamafactory_nccl_ib_disable, on by "
        "default), or "
        "give every node the same working IB/RoCE setup.",
    },
    {
        "id": "collective-timeout",
        "example": "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580,"
        " OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for"
        " 600060 milliseconds before timing out.",
        "pattern": r"Watchdog caught collective operation timeout|Timed out waiting \d+ms for "
        r"(?:recv|send) operation",
        "cause": "A collective waited past its timeout: another rank died, hung or fell far "
        "behind (a rank that never joins leaves the others here for up to the ddp_timeout).",
        "fix": "Find the rank that stopped first (the wait step names it and stops the others "
        "at once); if every rank was alive and only slow (a long save or evaluation), raise "
        "ddp_timeout in the training config.",
    },
    {
        "id": "no-route",
        "example": "RuntimeError: No route to host",
        "pattern": r"No route to host",
        "cause": "A node has no route to a peer's address, or a firewall rejects the connection "
        "with an ICMP 'host prohibited'.",
        "fix": "Open all TCP between the nodes (gcp_firewall on GCP; iptables/nftables on the "
        "nodes) and train on the NIC of the network the nodes share (primary_nic).",
    },
    {
        "id": "master-unreachable",
        "example": "[c10d] The client socket has failed to connect to any network address of"
        " (198.19.0.10, 29555).",
        "pattern": r"failed to connect to any network address of \(([^,\s]+),\s*(\d+)\)",
        "cause": "The rendezvous at {0}:{1} (MASTER_ADDR:MASTER_PORT) cannot be reached: an "
        "external IP as MASTER_ADDR, a closed firewall, or rank 0 not started.",
        "fix": "Use rank 0's internal address as MASTER_ADDR (discover_network finds it), open "
        "the ports between the nodes (gcp_firewall), and start rank 0.",
    },
]

RANK_LINE = re.compile(r"Multi-node training enabled: num nodes: (\d+), node rank: (\d+)")
_COMPILED = [(s, re.compile(s["pattern"])) for s in SIGNATURES]


def diagnose(logs):
    """Findings for logs given as text or as {host: text}: a list of dicts with id, host, line,
    cause and fix, in log order, one per signature and host."""
    if not isinstance(logs, dict):
        logs = {"": logs or ""}
    findings, seen = [], set()
    for host, text in logs.items():
        for line in (text or "").splitlines():
            for signature, pattern in _COMPILED:
                match = pattern.search(line)
                if match:
                    if (host, signature["id"]) not in seen:
                        seen.add((host, signature["id"]))
                        findings.append(
                            {
                                "id": signature["id"],
                                "host": host,
                                "line": line.strip(),
                                "cause": signature["cause"].format(*match.groups()),
                                "fix": signature["fix"].format(*match.groups()),
                            }
                        )
                    break
    findings.extend(_duplicate_ranks(logs))
    return findings


def _duplicate_ranks(logs):
    """Two hosts logging the same LLaMA-Factory node rank: the signature of RANK without
    NODE_RANK on LLaMA-Factory 0.9.1 and newer (both nodes run as rank 0 and hang)."""
    ranks = {}
    for host, text in logs.items():
        match = RANK_LINE.search(text or "")
        if match:
            ranks.setdefault(int(match.group(2)), []).append(host)
    return [
        {
            "id": "duplicate-node-rank",
            "host": ", ".join(hosts),
            "line": "node rank: %d on %s" % (rank, ", ".join(hosts)),
            "cause": "%s all run as node rank %d: LLaMA-Factory 0.9.1 and newer read NODE_RANK and "
            "ignore RANK, so every node given only RANK is rank 0 and the rendezvous hangs."
            % (", ".join(hosts), rank),
            "fix": "Set NODE_RANK (and RANK, for older versions) per node; this collection's "
            "launch sets both from llamafactory_node_rank.",
        }
        for rank, hosts in sorted(ranks.items())
        if len(hosts) > 1
    ]
