"""The calls of the collection's filters in the roles and playbooks, as Jinja parses them: each
one's positional and keyword arguments, to check against the filter's signature; and what the
gcp_firewall role's filters are given: its settings, and the fake Compute Engine API's answers."""

import inspect
from pathlib import Path
from types import SimpleNamespace

import compute_contract
import jinja2
import jinja2.nodes
import pytest
import requests
import role_defaults
import yaml

ROOT = Path(__file__).resolve().parents[4]


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def filter_calls(name):
    """(file, positional count, keyword names) of every call of hostnet.llamafactory.NAME."""
    env = jinja2.Environment(autoescape=True)  # only parses
    found = []
    for path in sorted([*ROOT.glob("roles/*/*/*.yml"), *ROOT.glob("playbooks/*.yml")]):
        text = path.read_text()
        if f"hostnet.llamafactory.{name}" not in text:
            continue
        for string in _strings(yaml.safe_load(text)):
            if f"hostnet.llamafactory.{name}" not in string:
                continue
            for node in env.parse(string).find_all(jinja2.nodes.Filter):
                if node.name == f"hostnet.llamafactory.{name}":
                    keywords = [kw.key for kw in node.kwargs]
                    found.append((path.relative_to(ROOT).as_posix(), len(node.args), keywords))
    return found


def check_call_sites(name, function):
    """Every call site binds to `function` (the input counts as the first argument)."""
    calls = filter_calls(name)
    assert calls, f"no call of {name} found"
    signature = inspect.signature(function)
    for _where, positional, keywords in calls:
        arguments = [object()] * (1 + positional)
        signature.bind(*arguments, **{key: object() for key in keywords})  # TypeError if not
    return calls


@pytest.fixture
def call_sites():
    return check_call_sites


# -- the gcp_firewall role's filters ------------------------------------------------------------

# roles/gcp_firewall/tasks/main.yml's settings: each key and the role default behind it.
FIREWALL_DEFAULTS = {
    "state": "gcp_firewall_state",
    "cluster": "gcp_firewall_cluster_name",
    "network": "gcp_firewall_network",
    "priority": "gcp_firewall_priority",
    "source": "gcp_firewall_source",
    "tag": "gcp_firewall_tag",
    "ranges": "gcp_firewall_ranges",
    "target_tags": "gcp_firewall_target_tags",
    "ssh_source_ranges": "gcp_firewall_ssh_source_ranges",
}
PROJECT = "hlf-test"  # a project of the fake Compute Engine API (networks default, hlf-net)


def _firewall_settings(**changes):
    defaults = role_defaults.raw("gcp_firewall")
    settings = {key: defaults[name] for key, name in FIREWALL_DEFAULTS.items()}
    settings.update(
        project=PROJECT,
        master_port=29500,
        nodes={"trainer-0": "10.128.0.5", "trainer-1": "10.128.0.6"},
        interfaces={"trainer-0": None, "trainer-1": None},
    )
    settings.update(changes)
    return settings


@pytest.fixture
def firewall_settings():
    """settings(**changes): what main.yml hands gcp_firewall_plan with the role's defaults - two
    nodes' primary_nic addresses, llamafactory_job_plan's MASTER_PORT, and no NICs known from the
    Compute Engine API (a static inventory) - with `changes` on top."""
    return _firewall_settings


@pytest.fixture
def compute(fake_api):
    """The fake Compute Engine API (tools/localcluster/compute_api.py), reset: `api`, a session
    that reaches compute.googleapis.com through its proxy as google.cloud's modules do; `base`,
    the project's URL; `control`, its control API. Every exchange keeps Google's contract."""
    control = requests.Session()
    control.trust_env = False  # plain HTTP on loopback
    control.post(f"{fake_api['control']}/reset").raise_for_status()
    api = requests.Session()
    api.trust_env = False
    api.proxies = {"https": fake_api["proxy"]}
    api.verify = fake_api["ca"]
    api.headers["Authorization"] = f"Bearer {fake_api['token']}"
    base = f"https://compute.googleapis.com/compute/v1/projects/{PROJECT}"
    yield SimpleNamespace(api=api, base=base, control=fake_api["control"], session=control)
    entries = control.get(f"{fake_api['control']}/requests").json()
    assert compute_contract.validate_log([e for e in entries if not e.get("refused")]) == []
    api.close()
    control.close()
