"""Role defaults as a play sees them: each role's defaults/main.yml, the values given (inventory,
extra vars) on top, and the templated defaults rendered by Ansible's own templar with them."""

from pathlib import Path

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES = Path(__file__).resolve().parents[1] / "roles"


def raw(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}


def rendered(roles, given=None, skip=("llamafactory_gcp_project",)) -> dict:
    """The defaults of `roles` (names) with `given` on top (given wins, as any inventory or
    extra var wins over a role default), every templated default rendered. `skip`: defaults
    left out (a lookup of the controller's environment)."""
    given = dict(given or {})
    defaults = {}
    for role in roles:
        defaults.update({k: v for k, v in raw(role).items() if k not in skip})
    variables = {**defaults, **given}
    templar = Templar(loader=DataLoader(), variables=variables)

    def render(value):
        if isinstance(value, str) and "{{" in value:
            return templar.template(trust_as_template(value))
        return value

    return {
        name: render(value) if name not in given else value for name, value in variables.items()
    }
