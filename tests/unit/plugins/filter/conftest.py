"""The calls of the collection's filters in the roles and playbooks, as Jinja parses them: each
one's positional and keyword arguments, to check against the filter's signature."""

import inspect
from pathlib import Path

import jinja2
import jinja2.nodes
import pytest
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
