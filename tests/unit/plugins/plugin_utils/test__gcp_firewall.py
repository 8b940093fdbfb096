"""The gcp_firewall role's logic: the plan and its refusals, drift, and the failure messages.

Drift is also checked against google.cloud's own gcp_compute_firewall.is_different, so that the
role's "update" (the module PATCHes) and "narrow" (it would not) follow the real module.
"""

import copy

import pytest
from ansible_collections.google.cloud.plugins.modules import gcp_compute_firewall
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _gcp_firewall as fw

BASE = {
    "cluster": "llamafactory",
    "project": "hlf-test",
    "network": "default",
    "nodes": {"trainer-1": "10.128.0.6", "trainer-0": "10.128.0.5"},
}


def settings(**changes):
    return dict(copy.deepcopy(BASE), **changes)


def rule(planned, role):
    return next(r for r in planned["rules"] if r["role"] == role)


def created(want, **changes):
    """The resource GCE holds after creating `want`, with changes."""
    resource = dict(
        copy.deepcopy(want), kind="compute#firewall", id="1", logConfig={"enable": False}
    )
    resource.update(changes)
    return resource


# -- plan ---------------------------------------------------------------------------------------


def test_default_plan_allows_everything_between_the_nodes_only():
    planned = fw.plan(settings())
    nodes = rule(planned, "nodes")
    assert nodes["name"] == "llamafactory-nodes"
    assert nodes["params"] == {
        "name": "llamafactory-nodes",
        "description": "hostnet.llamafactory cluster llamafactory: all TCP/UDP and ICMP between "
        "its training nodes (role gcp_firewall)",
        "direction": "INGRESS",
        "priority": 1000,
        "network": {"selfLink": "global/networks/default"},
        "allowed": [
            {"ip_protocol": "tcp", "ports": ["0-65535"]},
            {"ip_protocol": "udp", "ports": ["0-65535"]},
            {"ip_protocol": "icmp"},
        ],
        "source_ranges": ["10.128.0.5/32", "10.128.0.6/32"],
        "disabled": False,
    }
    assert nodes["want"]["network"] == (
        "https://www.googleapis.com/compute/v1/projects/hlf-test/global/networks/default"
    )
    assert nodes["want"]["sourceRanges"] == ["10.128.0.5/32", "10.128.0.6/32"]
    assert rule(planned, "ssh") == {"name": "llamafactory-ssh", "role": "ssh", "state": "absent"}


@pytest.mark.parametrize("address", ["198.18.0.10", "100.64.3.4", "240.0.0.9", "192.168.1.2"])
def test_nodes_in_any_range_a_vpc_subnet_may_use_are_accepted(address):
    """GCP subnets may use the benchmarking, shared and class E ranges, not only RFC 1918."""
    planned = fw.plan(settings(nodes={"trainer-0": address}))
    assert rule(planned, "nodes")["params"]["source_ranges"] == [f"{address}/32"]


def test_a_training_nic_off_the_rules_network_is_refused():
    """The API's networkInterfaces show which address each VM has on the rule's network."""
    link = "https://www.googleapis.com/compute/v1/projects/p/global/networks/"
    interfaces = {
        "trainer-0": [
            {"network": link + "default", "networkIP": "10.128.0.5"},
            {"network": link + "gpu-1", "networkIP": "10.1.0.5"},
        ]
    }
    nodes = {"trainer-0": "10.1.0.5"}
    with pytest.raises(fw.FirewallError) as error:
        fw.plan(settings(nodes=nodes, interfaces=interfaces))
    assert str(error.value).startswith(
        "the training address of trainer-0 is 10.1.0.5 (primary_nic), but its address on "
        "network default, which the rule is for, is 10.128.0.5 (Compute Engine API)"
    )
    planned = fw.plan(settings(nodes=nodes, interfaces=interfaces, network="gpu-1"))
    assert rule(planned, "nodes")["params"]["source_ranges"] == ["10.1.0.5/32"]
    # as the gcp_compute inventory holds them: each network link made {name, region, selfLink}
    held = {
        "trainer-0": [
            {"network": {"name": "default", "selfLink": link + "default"}, "networkIP": "10.1.0.5"}
        ]
    }
    assert fw.plan(settings(nodes=nodes, interfaces=held))
    held["trainer-0"][0]["networkIP"] = "10.128.0.5"
    with pytest.raises(fw.FirewallError, match=r"is 10\.128\.0\.5 \(Compute Engine API\)"):
        fw.plan(settings(nodes=nodes, interfaces=held))
    # without the API's view (a static inventory) the address is taken as it is
    assert fw.plan(settings(nodes=nodes, interfaces={"trainer-0": None}))


def test_ssh_rule_from_admin_ranges():
    planned = fw.plan(settings(ssh_source_ranges=["203.0.113.7/24"], target_tags=["gpu"]))
    ssh = rule(planned, "ssh")
    assert ssh["state"] == "present"
    assert ssh["params"]["allowed"] == [{"ip_protocol": "tcp", "ports": ["22"]}]
    assert ssh["params"]["source_ranges"] == ["203.0.113.0/24"]
    assert ssh["params"]["target_tags"] == ["gpu"]
    assert rule(planned, "nodes")["params"]["target_tags"] == ["gpu"]


def test_tag_and_ranges_sources():
    tag = rule(fw.plan(settings(source="tag")), "nodes")["params"]
    assert tag["source_tags"] == tag["target_tags"] == ["llamafactory"]
    assert "source_ranges" not in tag
    ranges = fw.plan(
        settings(source="ranges", ranges=["10.0.1.0/24", "10.0.0.0/24", "10.0.1.0/24"])
    )
    assert rule(ranges, "nodes")["params"]["source_ranges"] == ["10.0.0.0/24", "10.0.1.0/24"]


def test_absent_plans_both_names():
    planned = fw.plan(settings(state="absent", nodes={}))
    assert [(r["name"], r["state"]) for r in planned["rules"]] == [
        ("llamafactory-nodes", "absent"),
        ("llamafactory-ssh", "absent"),
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"ssh_source_ranges": ["0.0.0.0/0"]},
            "gcp_firewall_ssh_source_ranges contains 0.0.0.0/0: refused",
        ),
        ({"ssh_source_ranges": ["::/0"]}, "contains ::/0: refused"),
        ({"ssh_source_ranges": ["8.8.8.8/0"]}, "contains 8.8.8.8/0: refused"),
        ({"ssh_source_ranges": ["10.0.0.0/8", "2001:db8::/32"]}, "mixes IPv4 and IPv6"),
        ({"ssh_source_ranges": ["nonsense"]}, "is not an address range"),
        ({"source": "ranges", "ranges": ["0.0.0.0/0"]}, "MASTER_PORT 29500 included"),
        (
            {"source": "ranges", "ranges": ["10.0.0.0/8", "34.64.0.0/10"]},
            "not a private IPv4 range",
        ),
        ({"source": "ranges", "ranges": []}, "gcp_firewall_ranges is empty"),
        ({"source": "tag", "target_tags": ["x"]}, "gcp_firewall_target_tags is for"),
        ({"master_port": 22, "ssh_source_ranges": ["203.0.113.0/24"]}, "the SSH port"),
        ({"master_port": 70000}, "llamafactory_master_port is 70000"),
        ({"nodes": {"trainer-0": "10.128.0.5", "trainer-1": None}}, "of trainer-1 is not known"),
        ({"nodes": {"trainer-0": "34.1.2.3"}}, "34.1.2.3, not a private address"),
        ({"nodes": {"trainer-0": "fe80::1"}}, "not an IPv4 address"),
        ({"nodes": {}}, "no training nodes"),
        ({"project": ""}, "llamafactory_gcp_project is not set"),
        ({"project": "My Project"}, "not a GCP project ID"),
        ({"cluster": "Bad_Name"}, "gcp_firewall_cluster_name is 'Bad_Name'"),
        ({"cluster": "x" * 58}, "at most 57 characters"),
        ({"network": "projects/p/global/networks/n"}, "gcp_firewall_network is"),
        ({"priority": 70000}, "gcp_firewall_priority is 70000"),
        ({"source": "everyone"}, "gcp_firewall_source is 'everyone'"),
        ({"state": "gone"}, "gcp_firewall_state is 'gone'"),
    ],
)
def test_plan_refuses(changes, message):
    with pytest.raises(fw.FirewallError, match=None) as error:
        fw.plan(settings(**changes))
    assert message in str(error.value)


def test_ansible_strings_and_numbers_are_accepted():
    planned = fw.plan(settings(priority="900", master_port="29500", ssh_source_ranges=None))
    assert planned["priority"] == 900


# -- drift --------------------------------------------------------------------------------------


class FakeModule:
    """What gcp_compute_firewall.is_different reads of a module: its params."""

    def __init__(self, params, project):
        self.params = dict(params, project=project, state="present")
        for option in ("denied", "destination_ranges", "log_config", "source_service_accounts"):
            self.params.setdefault(option, None)
        for option in ("target_service_accounts", "source_ranges", "source_tags", "target_tags"):
            self.params.setdefault(option, None)


def module_would_patch(planned_rule, resource):
    module = FakeModule(planned_rule["params"], "hlf-test")
    return gcp_compute_firewall.is_different(module, resource)


NODES = rule(fw.plan(settings(ssh_source_ranges=["203.0.113.0/24"])), "nodes")

CASES = [
    ("same", {}, "none"),
    ("range replaced", {"sourceRanges": ["10.128.0.5/32", "10.128.0.9/32"]}, "update"),
    ("range missing", {"sourceRanges": ["10.128.0.5/32"]}, "update"),
    ("range added", {"sourceRanges": ["10.128.0.5/32", "10.128.0.6/32", "0.0.0.0/0"]}, "narrow"),
    ("ranges reordered", {"sourceRanges": ["10.128.0.6/32", "10.128.0.5/32"]}, "none"),
    ("protocol added", {"allowed": [*NODES["want"]["allowed"], {"IPProtocol": "esp"}]}, "narrow"),
    (
        "port added",
        {
            "allowed": [
                {"IPProtocol": "tcp", "ports": ["0-65535", "22"]},
                *NODES["want"]["allowed"][1:],
            ]
        },
        "narrow",
    ),
    ("protocol removed", {"allowed": NODES["want"]["allowed"][:2]}, "update"),
    (
        "ports narrowed",
        {"allowed": [{"IPProtocol": "tcp", "ports": ["29500"]}, *NODES["want"]["allowed"][1:]]},
        "update",
    ),
    ("priority", {"priority": 900}, "update"),
    ("description", {"description": NODES["want"]["description"] + " (edited)"}, "update"),
    ("disabled", {"disabled": True}, "update"),
    ("target tag added", {"targetTags": ["web"]}, "replace"),
    ("source tag added", {"sourceTags": ["web"]}, "replace"),
    ("service account", {"sourceServiceAccounts": ["x@p.iam.gserviceaccount.com"]}, "replace"),
    (
        "other network",
        {"network": "https://www.googleapis.com/compute/v1/projects/hlf-test/global/networks/x"},
        "replace",
    ),
    ("egress", {"direction": "EGRESS"}, "replace"),
]


@pytest.mark.parametrize(("name", "changes", "action"), CASES, ids=[c[0] for c in CASES])
def test_compare(name, changes, action):
    resource = created(NODES["want"], **changes)
    got, lines = fw.compare(NODES["want"], resource)
    assert got == action, lines
    assert bool(lines) == (action != "none")
    if action in ("update", "narrow"):
        # the role's update/narrow split is exactly the module's own view
        assert module_would_patch(NODES, resource) == (action == "update")
    if action == "none":
        assert not module_would_patch(NODES, resource)


def test_same_ranges_spelled_differently_are_no_change():
    # The module compares text and would rewrite this rule once; the role sees the same ranges.
    resource = created(NODES["want"], sourceRanges=["10.128.0.5", "10.128.0.6/32"])
    assert fw.compare(NODES["want"], resource) == ("none", [])


def test_compare_lines_are_readable():
    resource = created(NODES["want"], sourceRanges=["10.128.0.5/32", "0.0.0.0/0"], priority=900)
    lines = fw.compare(NODES["want"], resource)[1]
    assert "sourceRanges: add 10.128.0.6/32; remove 0.0.0.0/0" in lines
    assert "priority: 900, wanted 1000" in lines


def test_drift_actions_and_ownership():
    planned = fw.plan(settings(ssh_source_ranges=["203.0.113.0/24"]))
    ssh = rule(planned, "ssh")
    result = fw.drift(planned, [created(NODES["want"]), created(ssh["want"], priority=10)])
    assert [(r["name"], r["action"]) for r in result["rules"]] == [
        ("llamafactory-nodes", "none"),
        ("llamafactory-ssh", "update"),
    ]
    assert result["changed"] and result["foreign"] == []
    assert result["summary"] == [
        "llamafactory-nodes: no change",
        "llamafactory-ssh: update (priority: 10, wanted 1000)",
    ]

    assert fw.drift(planned, [])["rules"][0]["action"] == "create"
    assert fw.drift(planned, [])["summary"][0] == (
        "llamafactory-nodes: create (allow icmp:all, tcp:0-65535, udp:0-65535 from 10.128.0.5/32, "
        "10.128.0.6/32 on network default)"
    )
    assert not fw.drift(planned, [created(NODES["want"]), created(ssh["want"])])["changed"]

    hand_made = created(NODES["want"], description="someone's rule")
    result = fw.drift(planned, [hand_made])
    assert result["foreign"] == ["llamafactory-nodes"]
    assert result["rules"][0]["action"] == "foreign"

    # another cluster's mark is not ours either
    other = created(NODES["want"], description=fw.description("llamafactory-2", "nodes"))
    assert fw.drift(planned, [other])["foreign"] == ["llamafactory-nodes"]


def test_drift_absent_deletes_only_marked_rules():
    planned = fw.plan(settings(state="absent"))
    ours = created(NODES["want"])
    theirs = created(NODES["want"], name="llamafactory-ssh", description="by hand")
    result = fw.drift(planned, [ours, theirs])
    assert [(r["name"], r["action"]) for r in result["rules"]] == [
        ("llamafactory-nodes", "delete"),
        ("llamafactory-ssh", "foreign"),
    ]
    assert not fw.drift(planned, [])["changed"]


# -- errors -------------------------------------------------------------------------------------

CONTEXT = {
    "project": "hlf-test",
    "network": "default",
    "call": "present",
    "auth_kind": "application",
    "deadline": 300,
    "python": "/usr/bin/python3",
    "rule": "the firewall rule llamafactory-nodes",
}
URL = "https://compute.googleapis.com/compute/v1/projects/hlf-test/global/firewalls"


def google(code, reason, message, method="POST", url=URL):
    """A result as GcpModule.raise_for_status makes it."""
    body = {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }
    return {
        "failed": True,
        "msg": f"GCP returned error: {body}",  # the module's own wording
        "request": {"url": url, "method": method, "body": None},
    }


def test_permission_from_googles_message():
    result = google(
        403,
        "forbidden",
        "Required 'compute.firewalls.create' permission for 'projects/hlf-test/global/firewalls/x'",
    )
    message = fw.explain(result, CONTEXT)
    assert message.startswith(
        "Permission denied: the credentials (llamafactory_gcp_auth_kind=application) lack "
        "compute.firewalls.create in project hlf-test"
    )
    assert "roles/compute.securityAdmin" in message


@pytest.mark.parametrize(
    ("method", "url", "permission"),
    [
        ("GET", URL, "compute.firewalls.list"),
        ("GET", URL + "?filter=x", "compute.firewalls.list"),
        ("POST", URL, "compute.firewalls.create"),
        ("GET", URL + "/a", "compute.firewalls.get"),
        ("PATCH", URL + "/a", "compute.firewalls.update"),
        ("DELETE", URL + "/a", "compute.firewalls.delete"),
        ("GET", URL.replace("firewalls", "operations/op-1"), "compute.globalOperations.get"),
    ],
)
def test_permission_from_the_call(method, url, permission):
    result = google(403, "forbidden", "The caller does not have permission", method, url)
    assert f"lack {permission} in project" in fw.explain(result, CONTEXT)


def test_api_not_enabled():
    result = google(
        403,
        "accessNotConfigured",
        "Compute Engine API has not been used in project 1 before or it is disabled.",
    )
    assert "The Compute Engine API is not enabled in project hlf-test" in fw.explain(
        result, CONTEXT
    )


def test_not_found_project_network_and_other():
    project = google(404, "notFound", "The resource 'projects/hlf-gone' was not found")
    assert fw.explain(project, CONTEXT).startswith("Project hlf-gone was not found")
    network = google(
        404, "notFound", "The resource 'projects/hlf-test/global/networks/n1' was not found"
    )
    assert (
        "The VPC network n1 (gcp_firewall_network=default) was not found in project hlf-test"
        in fw.explain(network, CONTEXT)
    )
    other = google(
        404, "notFound", "The resource 'projects/hlf-test/global/operations/x' was not found"
    )
    assert "answered 404" in fw.explain(other, CONTEXT)


def test_list_crash_on_missing_project():
    # gcp_compute_firewall_info's list call answers 404 and the module crashes on None.get
    result = {
        "failed": True,
        "msg": "Task failed: Module failed: 'NoneType' object has no attribute 'get'",
    }
    assert fw.explain(result, dict(CONTEXT, call="list")).startswith(
        "Project hlf-test was not found"
    )
    assert not fw.explain(result, CONTEXT).startswith("Project")


def test_other_google_errors():
    assert "already exists" in fw.explain(
        google(409, "alreadyExists", "The resource 'x' already exists"), CONTEXT
    )
    assert "rejected the credentials" in fw.explain(
        google(401, "authError", "Invalid Credentials"), CONTEXT
    )
    assert "refused the firewall rule llamafactory-nodes as invalid: bad" in fw.explain(
        google(400, "invalid", "bad"), CONTEXT
    )
    assert "answered HTTP 503" in fw.explain(google(503, "backendError", "later"), CONTEXT)


def test_deadline_and_loop_results():
    item = {
        "failed": True,
        "deadline_exceeded": True,
        "msg": "stopped",
        "item": {"name": "llamafactory-ssh"},
    }
    loop = {
        "failed": True,
        "msg": "One or more items failed",
        "results": [{"failed": False, "item": {"name": "a"}}, item],
    }
    context = dict(CONTEXT, rule=None, deadline=4)
    assert fw.explain(loop, context) == (
        "Compute Engine did not finish writing the firewall rule llamafactory-ssh within "
        "gcp_firewall_operation_timeout (4 s), and the module was stopped. GCP may still complete "
        "the operation: run the role again to converge, or raise gcp_firewall_operation_timeout."
    )
    deleting = fw.explain(item, dict(context, call="absent", rule="the firewall rule x"))
    assert deleting.startswith("Compute Engine did not finish deleting the firewall rule x")


def test_controller_problems():
    missing = {"failed": True, "msg": "Please install the google-auth library"}
    assert "pip install google-auth requests" in fw.explain(missing, CONTEXT)
    adc = {
        "failed": True,
        "msg": "MODULE FAILURE",
        "module_stderr": "google.auth.exceptions.DefaultCredentialsError: Your default "
        "credentials were not found.",
    }
    assert "gcloud auth application-default login" in fw.explain(adc, CONTEXT)
    offline = {
        "failed": True,
        "msg": "MODULE FAILURE",
        "module_stderr": "requests.exceptions.ProxyError: Unable to connect to proxy\n",
    }
    assert "could not reach the Compute Engine API" in fw.explain(offline, CONTEXT)
    expired = {
        "failed": True,
        "msg": "Task failed: Module failed: The credentials do not contain the necessary fields "
        "need to refresh the access token. You must specify refresh_token, token_uri, client_id, "
        "and client_secret.",
    }
    assert "cannot be refreshed: renew llamafactory_gcp_access_token" in fw.explain(
        expired, CONTEXT
    )
    odd = {"failed": True, "msg": "something else"}
    assert (
        fw.explain(odd, CONTEXT)
        == "google.cloud's module failed while writing the firewall rule llamafactory-nodes: "
        "something else"
    )


# -- the nodes' other networks (GPU machine types) ----------------------------------------------

LINK = "https://www.googleapis.com/compute/v1/projects/hlf-test/"


def nic(network, address, nic_type=None, held=True):
    """A NIC as the gcp_compute inventory holds it (gcp_networkInterfaces): its network link
    made {name, region, selfLink}, or (held=False) the API's link as it is."""
    link = LINK + "global/networks/" + network
    interface = {
        "network": {"name": network, "region": None, "selfLink": link} if held else link,
        "subnetwork": LINK + "regions/us-central1/subnetworks/" + network,
        "networkIP": address,
        "stackType": "IPV4_ONLY",
    }
    if nic_type:
        interface["nicType"] = nic_type
    return interface


def a3_mega(index, held=True):
    """An a3-megagpu-8g: nic0 on default, eight GPU NICs (GPUDirect-TCPXO), a VPC each."""
    return [
        nic("default", f"10.128.0.{5 + index}", "GVNIC", held),
        *(nic(f"a3mega-gpunet-{g}", f"10.{g + 1}.0.{5 + index}", "GVNIC", held) for g in range(8)),
    ]


def a3_ultra(index, nic_types=True):
    """An a3-ultragpu-8g: nic0 on default, nic1 on net-1 (gVNIC), eight RDMA NICs on the RoCE
    VPC (a subnet each). nic_types=False: as the local cluster's API lists them, no nicType."""
    return [
        nic("default", f"10.128.0.{5 + index}", "GVNIC" if nic_types else None),
        nic("a3ultra-net-1", f"10.9.0.{5 + index}", "GVNIC" if nic_types else None),
        *(
            nic("a3ultra-rdma-net", f"10.10.{g}.{5 + index}", "MRDMA" if nic_types else None)
            for g in range(8)
        ),
    ]


def pair(shape, **kwargs):
    return {"trainer-0": shape(0, **kwargs), "trainer-1": shape(1, **kwargs)}


def test_an_a3_mega_pair_gets_a_rule_per_gpu_vpc():
    planned = fw.plan(settings(interfaces=pair(a3_mega)))
    assert [(r["role"], r["name"]) for r in planned["rules"]] == [
        ("nodes", "llamafactory-nodes"),
        ("ssh", "llamafactory-ssh"),
        *(("network", f"llamafactory-nodes-a3mega-gpunet-{g}") for g in range(8)),
    ]
    assert planned["networks"] == {
        f"a3mega-gpunet-{g}": f"llamafactory-nodes-a3mega-gpunet-{g}" for g in range(8)
    }
    assert planned["skipped_networks"] == [] and planned["notes"] == []
    assert planned["prune"] is True  # every node's NICs known
    gpu3 = planned["rules"][2 + 3]
    assert gpu3["network"] == "a3mega-gpunet-3"
    assert gpu3["params"] == {
        "name": "llamafactory-nodes-a3mega-gpunet-3",
        "description": "hostnet.llamafactory cluster llamafactory: all TCP/UDP and ICMP between "
        "its training nodes on network a3mega-gpunet-3 (role gcp_firewall)",
        "direction": "INGRESS",
        "priority": 1000,
        "network": {"selfLink": "global/networks/a3mega-gpunet-3"},
        "allowed": [
            {"ip_protocol": "tcp", "ports": ["0-65535"]},
            {"ip_protocol": "udp", "ports": ["0-65535"]},
            {"ip_protocol": "icmp"},
        ],
        "source_ranges": ["10.4.0.5/32", "10.4.0.6/32"],  # their addresses on that network
        "disabled": False,
    }
    assert gpu3["want"]["network"] == LINK + "global/networks/a3mega-gpunet-3"
    # The primary rule is what it was without the API's view.
    assert rule(planned, "nodes") == rule(fw.plan(settings()), "nodes")
    # The API's links as they are (not the inventory's dicts): the same plan.
    assert fw.plan(settings(interfaces=pair(a3_mega, held=False))) == planned


def test_a_deployment_named_like_the_cluster_gives_short_names():
    interfaces = {
        "vm0": [nic("default", "198.18.3.2"), nic("gpufw-gpu0", "198.18.208.2")],
        "vm1": [nic("default", "198.18.3.3"), nic("gpufw-gpu0", "198.18.208.3")],
    }
    nodes = {"vm0": "198.18.3.2", "vm1": "198.18.3.3"}
    planned = fw.plan(settings(cluster="gpufw", nodes=nodes, interfaces=interfaces))
    assert planned["networks"] == {"gpufw-gpu0": "gpufw-nodes-gpu0"}
    assert planned["rules"][-1]["want"]["sourceRanges"] == ["198.18.208.2/32", "198.18.208.3/32"]


def test_an_a3_ultra_pair_gets_net_1_and_no_rule_on_the_roce_vpc():
    for nic_types in (True, False):
        planned = fw.plan(settings(interfaces=pair(a3_ultra, nic_types=nic_types)))
        assert [r["name"] for r in planned["rules"]] == [
            "llamafactory-nodes",
            "llamafactory-ssh",
            "llamafactory-nodes-a3ultra-net-1",
        ]
        assert planned["rules"][-1]["want"]["sourceRanges"] == ["10.9.0.5/32", "10.9.0.6/32"]
        (skipped,) = planned["skipped_networks"]
        assert skipped["network"] == "a3ultra-rdma-net"
        reason = skipped["reason"]
        assert "GCP takes no VPC firewall rules on a RoCE VPC" in reason
        assert "RDMA_ROCE_POLICY" in reason and fw.ROCE_DOC in reason
        assert ("nicType MRDMA" in reason) == nic_types
        assert ("its name marks the RoCE VPC" in reason) == (not nic_types)
        assert planned["notes"] == [f"network a3ultra-rdma-net: no rule, {reason}"]
        # the report says so
        assert fw.drift(planned, [])["summary"][-1] == planned["notes"][0]


def test_a_nic_type_decides_over_the_name():
    interfaces = {"t": [nic("default", "10.128.0.5"), nic("my-rdma-lab", "10.3.0.5", "GVNIC")]}
    planned = fw.plan(settings(nodes={"t": "10.128.0.5"}, interfaces=interfaces))
    assert planned["networks"] == {"my-rdma-lab": "llamafactory-nodes-my-rdma-lab"}
    interfaces["t"][1] = nic("lab", "10.3.0.5", "IRDMA")  # Falcon: no VPC rules either
    planned = fw.plan(settings(nodes={"t": "10.128.0.5"}, interfaces=interfaces))
    assert planned["networks"] == {}
    assert "nicType IRDMA" in planned["skipped_networks"][0]["reason"]


def test_plain_vms_plan_as_before():
    plain = {
        "trainer-0": [nic("default", "10.128.0.5")],
        "trainer-1": [nic("default", "10.128.0.6")],
    }
    with_api = fw.plan(settings(interfaces=plain))
    without = fw.plan(settings())
    assert with_api["rules"] == without["rules"]
    assert with_api["networks"] == without["networks"] == {}
    assert (with_api["prune"], without["prune"]) == (True, False)
    assert (
        without["notes"] == []
        and fw.drift(without, [])["summary"] == fw.drift(with_api, [])["summary"]
    )


def test_a_node_with_unknown_nics_is_said():
    interfaces = {"trainer-0": a3_mega(0), "trainer-1": None}
    planned = fw.plan(settings(interfaces=interfaces))
    assert len(planned["networks"]) == 8 and planned["prune"] is False
    assert planned["rules"][-1]["want"]["sourceRanges"] == ["10.8.0.5/32"]
    assert planned["notes"] == [
        "the Compute Engine API's view of the NICs of trainer-1 is not known (host variable "
        "gcp_networkInterfaces, from the gcp_compute inventory): the rules for the nodes' other "
        "networks leave them out"
    ]


def test_the_primary_network_is_any_of_them():
    """Training over a GPU VPC (gcp_firewall_network): default becomes one of the others."""
    nodes = {"trainer-0": "10.1.0.5", "trainer-1": "10.1.0.6"}
    planned = fw.plan(settings(network="a3mega-gpunet-0", nodes=nodes, interfaces=pair(a3_mega)))
    assert rule(planned, "nodes")["want"]["sourceRanges"] == ["10.1.0.5/32", "10.1.0.6/32"]
    assert "default" in planned["networks"] and "a3mega-gpunet-0" not in planned["networks"]
    assert len(planned["networks"]) == 8


def test_sources_and_targets_in_the_other_modes():
    """tag: the same target tag, but the nodes' addresses as sources; ranges likewise."""
    for changes, targets in (
        ({"source": "tag"}, ["llamafactory"]),
        ({"source": "tag", "tag": "trainers"}, ["trainers"]),
        ({"source": "ranges", "ranges": ["10.128.0.0/20"], "target_tags": ["gpu"]}, ["gpu"]),
        ({"target_tags": ["gpu"]}, ["gpu"]),
    ):
        planned = fw.plan(settings(interfaces=pair(a3_mega), **changes))
        gpu0 = planned["rules"][2]
        assert gpu0["params"]["source_ranges"] == ["10.1.0.5/32", "10.1.0.6/32"]
        assert "source_tags" not in gpu0["params"]
        assert gpu0["params"]["target_tags"] == gpu0["want"]["targetTags"] == targets


@pytest.mark.parametrize("cluster", ["llamafactory", "c" * 40, "c" * 50, "c" * 57, "a-b" * 19])
def test_names_fit_gce_and_match_the_list_pattern(cluster):
    import re

    networks = ["a3mega-gpunet-0", "n" * 63, f"{cluster}-gpu0", "gpu0"]
    interfaces = {
        "t": [nic("default", "10.128.0.5")]
        + [nic(n, f"10.{i + 1}.0.5") for i, n in enumerate(networks)]
    }
    planned = fw.plan(settings(cluster=cluster, nodes={"t": "10.128.0.5"}, interfaces=interfaces))
    names = [r["name"] for r in planned["rules"]]
    assert len(set(names)) == len(names) == 2 + len(networks)
    pattern = re.compile(fw.list_regex(cluster))
    assert planned["list_filter"] == f'name eq "{fw.list_regex(cluster)}"'
    for name in names:
        assert len(name) <= 63 and fw.NAME_RE.match(name), name
        assert pattern.fullmatch(name), name
    again = fw.plan(settings(cluster=cluster, nodes={"t": "10.128.0.5"}, interfaces=interfaces))
    assert again == planned  # deterministic
    # A name depends on its network alone (unless two tails are alike, as gpu0 here).
    only = {"t": [nic("default", "10.128.0.5"), nic("a3mega-gpunet-0", "10.1.0.5")]}
    alone = fw.plan(settings(cluster=cluster, nodes={"t": "10.128.0.5"}, interfaces=only))
    assert alone["networks"]["a3mega-gpunet-0"] == planned["networks"]["a3mega-gpunet-0"]
    assert fw.network_rule_name(cluster, "a3mega-gpunet-0") == alone["networks"]["a3mega-gpunet-0"]


def test_two_networks_with_one_tail_get_hashed_names():
    interfaces = {
        "t": [nic("default", "10.128.0.5"), nic("x-gpu0", "10.1.0.5"), nic("gpu0", "10.2.0.5")]
    }
    planned = fw.plan(settings(cluster="x", nodes={"t": "10.128.0.5"}, interfaces=interfaces))
    assert sorted(planned["networks"].values()) == sorted(
        [fw._hashed_name("x", "x-gpu0"), fw._hashed_name("x", "gpu0")]
    )
    assert planned["networks"]["x-gpu0"] != planned["networks"]["gpu0"]


def test_drift_on_gpu_networks_is_idempotent_and_cleans_up():
    planned = fw.plan(settings(interfaces=pair(a3_mega)))
    present = [created(r["want"]) for r in planned["rules"] if r["state"] == "present"]
    first = fw.drift(planned, [])
    assert [r["action"] for r in first["rules"]] == ["create", "none"] + ["create"] * 8
    assert first["summary"][2] == (
        "llamafactory-nodes-a3mega-gpunet-0: create (allow icmp:all, tcp:0-65535, udp:0-65535 "
        "from 10.1.0.5/32, 10.1.0.6/32 on network a3mega-gpunet-0)"
    )
    assert not fw.drift(planned, present)["changed"]

    # Another cluster's rule that the pattern finds, and a rule by hand: never touched.
    theirs = created(
        planned["rules"][2]["want"],
        name="llamafactory-nodes-x-nodes",
        description=fw.description("llamafactory-nodes-x", "nodes"),
    )
    by_hand = created(planned["rules"][2]["want"], name="llamafactory-nodes-mine", description="")
    assert not fw.drift(planned, [*present, theirs, by_hand])["changed"]

    # Cleanup: every rule of the cluster, whatever the nodes' NICs (no interfaces known).
    absent = fw.plan(settings(state="absent", nodes={}))
    result = fw.drift(absent, [*present, theirs, by_hand])
    assert [(r["name"], r["action"]) for r in result["rules"]] == [
        ("llamafactory-nodes", "delete"),
        ("llamafactory-ssh", "none"),
        *((f"llamafactory-nodes-a3mega-gpunet-{g}", "delete") for g in range(8)),
    ]
    assert result["summary"][2] == "llamafactory-nodes-a3mega-gpunet-0: delete"
    assert not fw.drift(absent, [theirs, by_hand])["changed"]


def test_a_rule_for_a_network_no_node_uses_now_is_deleted():
    planned = fw.plan(settings(interfaces=pair(a3_mega)))
    present = [created(r["want"]) for r in planned["rules"] if r["state"] == "present"]
    plain = {
        "trainer-0": [nic("default", "10.128.0.5")],
        "trainer-1": [nic("default", "10.128.0.6")],
    }
    now = fw.plan(settings(interfaces=plain))
    result = fw.drift(now, present)
    assert [r["action"] for r in result["rules"]] == ["none", "none"] + ["delete"] * 8
    assert result["summary"][2] == (
        "llamafactory-nodes-a3mega-gpunet-0: delete (delete the rule: no node has a NIC on its "
        "network a3mega-gpunet-0 now)"
    )
    # Without the API's view of every node, nothing is known to be stale: left as it is.
    assert not fw.drift(fw.plan(settings()), present)["changed"]


def test_a_failed_rule_names_its_network():
    item = {"name": "llamafactory-nodes-a3mega-gpunet-0", "network": "a3mega-gpunet-0"}
    message = "The resource 'projects/hlf-test/global/networks/a3mega-gpunet-0' was not found"
    failed = dict(google(404, "notFound", message), item=item)
    context = dict(CONTEXT, rule=None)
    text = fw.explain({"results": [failed]}, context)
    assert text.startswith("The VPC network a3mega-gpunet-0 (gcp_firewall_network=a3mega-gpunet-0)")
