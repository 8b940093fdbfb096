"""Google's published Compute Engine v1 contract, to check the fake (compute_api.py) against.

The contract is the discovery document compute.v1.json that ships in the google-api-python-client
package (googleapiclient/discovery_cache/documents/); nothing here is written by hand but the
shape of Google's JSON errors, which the document does not describe
(https://cloud.google.com/apis/design/errors#http_mapping).

- validate_request: the HTTP method and URL must be a method of the document: its `path`
  template under the servicePath compute/v1/ of https://compute.googleapis.com/ or
  https://www.googleapis.com/ (`{+name}` may span segments), each path parameter matching its
  `pattern`; every query parameter known to that method or one of the document's standard ones
  (fields, alt, prettyPrint, quotaUser, key...), of its type, format, enum and pattern, repeated
  only where the document allows it; the JSON body valid against the method's `request` schema.
- validate_response: a 2xx body valid against the method's `response` schema, or no body where
  the method has none; a 4xx/5xx body in Google's error shape, its code the HTTP status.
- Schemas: `$ref`s, properties of type string, integer, boolean, number, array and object (a
  map where `additionalProperties`), `format` (int64/uint64 as decimal strings, int32/uint32
  ranges, byte as base64), `enum` and `pattern`; in a request, the properties the document
  annotates as required by the method (a firewall's name for insert and patch). A property the
  schema lacks is an error, in
  a request (the API answers 400 to one) as in a response (the fake must not invent fields); so
  is a null or an empty list in a response (the API leaves such fields out), and a `kind`
  other than the schema's (compute#firewall for a Firewall).
- validate_log: the fake's recorded exchanges (compute_api.py's log). A request the contract
  does not allow must have been refused with an error, as the API would: tests send bad names
  on purpose; a fake that accepted one would be wrong.

Each problem names the method id (compute.firewalls.insert) or, when none matches, the request,
then the JSON path ($.allowed[0].IPProtocol) where it lies.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.util
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

DOCUMENT = "discovery_cache/documents/compute.v1.json"
API_ROOTS = ("https://compute.googleapis.com/", "https://www.googleapis.com/")
INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
# google.rpc.Code names, as the "status" of an error, by HTTP status.
RPC_STATUS = {
    400: {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"},
    401: {"UNAUTHENTICATED"},
    403: {"PERMISSION_DENIED"},
    404: {"NOT_FOUND"},
    409: {"ABORTED", "ALREADY_EXISTS"},
    429: {"RESOURCE_EXHAUSTED"},
    499: {"CANCELLED"},
    500: {"INTERNAL", "UNKNOWN", "DATA_LOSS"},
    501: {"UNIMPLEMENTED"},
    503: {"UNAVAILABLE"},
    504: {"DEADLINE_EXCEEDED"},
}
STRING = {"type": "string"}
# Google's JSON error (v1 error format, with the legacy "errors" list GCE still sends).
ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "integer", "format": "int32"},
                "message": STRING,
                "status": {
                    "type": "string",
                    "enum": sorted(set().union(*RPC_STATUS.values())),
                },
                "errors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            name: STRING
                            for name in (
                                "message",
                                "domain",
                                "reason",
                                "location",
                                "locationType",
                                "extendedHelp",
                                "sendReport",
                                "debugInfo",
                            )
                        },
                    },
                },
                "details": {
                    "type": "array",
                    "items": {"type": "object", "additionalProperties": {"type": "any"}},
                },
            },
        }
    },
}


def document_path(document=DOCUMENT):
    """A discovery document (compute.v1.json by default) inside the installed
    google-api-python-client (not imported)."""
    spec = importlib.util.find_spec("googleapiclient")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("google-api-python-client is not installed: run ./dev setup")
    return Path(next(iter(spec.submodule_search_locations))) / document


class Method:
    """One method of the document, with its URL template compiled."""

    def __init__(self, doc):
        self.doc = doc
        self.id = doc["id"]
        self.http_method = doc["httpMethod"]
        self.parameters = doc.get("parameters", {})
        names, parts = [], []
        for literal, plus, name in re.findall(r"([^{]*)\{(\+?)([^}]*)\}", doc["path"] + "{}"):
            parts.append(re.escape(literal))
            if name:
                names.append(name)
                parts.append("(.+)" if plus else "([^/]+)")
        self.path_names = names
        self.regex = re.compile("".join(parts))
        # The most specific template wins: .../instances/bulkInsert over .../instances/{x}.
        self.literal_length = len(re.sub(r"\{[^}]*\}", "", doc["path"]))


class Contract:
    """The Compute Engine v1 discovery document, as checks of requests and responses (another
    API's document with its own `roots`: storage_contract.py)."""

    roots = API_ROOTS

    def __init__(self, document):
        self.document = document
        self.service_path = document["servicePath"]
        self.standard = document.get("parameters", {})
        self.schemas = document["schemas"]
        self.methods = []
        resources = list(document.get("resources", {}).values())
        while resources:
            resource = resources.pop()
            self.methods += [Method(m) for m in resource.get("methods", {}).values()]
            resources += resource.get("resources", {}).values()
        self.by_id = {m.id: m for m in self.methods}

    @classmethod
    def load(cls, path=None):
        return cls(json.loads(Path(path or document_path()).read_text()))

    # -- requests -------------------------------------------------------------------------------

    def match(self, http_method, url):
        """(Method, path parameters) for a method and a full URL; (None, reason) when none."""
        relative = None
        for root in self.roots:
            if url.startswith(root + self.service_path):
                relative = urlsplit(url).path[len(urlsplit(root).path + self.service_path) :]
        if relative is None:
            return None, f"not under {' or '.join(r + self.service_path for r in self.roots)}"
        found = [(m, m.regex.fullmatch(relative)) for m in self.methods]
        found = [(m, match) for m, match in found if match]
        if not found:
            return None, "no method of the document has this path"
        same = [(m, match) for m, match in found if m.http_method == http_method]
        if not same:
            allowed = ", ".join(sorted({f"{m.http_method} ({m.id})" for m, _match in found}))
            return None, f"no {http_method} method on this path (only {allowed})"
        method, match = max(same, key=lambda pair: pair[0].literal_length)
        values = match.groups()
        return method, {n: unquote(v) for n, v in zip(method.path_names, values, strict=True)}

    def validate_request(self, http_method, url, query=None, body=None):
        """Problems with one request (query: name -> list of values, as parse_qs gives; by
        default the URL's own)."""
        if query is None:
            query = parse_qs(urlsplit(url).query, keep_blank_values=True)
        method, params = self.match(http_method, url)
        if method is None:
            return [f"{http_method} {url}: unknown method: {params}"]
        problems = []
        for name, value in params.items():
            problems += self._parameter(method, name, [value], "path")
        for name, values in sorted(query.items()):
            problems += self._parameter(method, name, values, "query")
        for name, spec in sorted(method.parameters.items()):
            if spec.get("required") and spec["location"] == "query" and name not in query:
                problems.append(f"{method.id}: query parameter {name} is required")
        schema = method.doc.get("request")
        if schema is None:
            if body not in (None, {}):
                problems.append(f"{method.id}: request $: the method takes no body")
        elif isinstance(body, str):
            problems.append(f"{method.id}: request $: not JSON")
        elif body is None:
            problems.append(f"{method.id}: request $: a {schema['$ref']} body is required")
        else:
            problems += self._value(method.id, "request", schema, body, "$")
        return problems

    def _parameter(self, method, name, values, location):
        spec = method.parameters.get(name)
        if spec is None and location == "query":
            spec = self.standard.get(name)
        where = f"{method.id}: {location} parameter {name}"
        if spec is None or spec.get("location") != location:
            return [f"{where}: unknown to the method"]
        if len(values) > 1 and not spec.get("repeated"):
            return [f"{where}: given {len(values)} times, not repeated"]
        problems = []
        for value in values:
            problems += [f"{where}: {why}" for why in parameter_problems(spec, value)]
        return problems

    # -- responses -----------------------------------------------------------------------------

    def validate_response(self, method_id, status, body):
        """Problems with one answer (status, parsed JSON body) to a method of the document."""
        method = self.by_id.get(method_id)
        if method is None:
            return [f"{method_id}: not a method of the document"]
        if status >= 400:
            return self.validate_error(method_id, status, body)
        if not 200 <= status < 300:
            return [f"{method_id}: response: HTTP {status} is neither a success nor an error"]
        schema = method.doc.get("response")
        if schema is None:
            return [] if body in (None, {}) else [f"{method_id}: response $: the method has none"]
        return self._value(method_id, "response", schema, body, "$")

    def validate_error(self, method_id, status, body):
        """Problems with an error answer: Google's JSON error shape, its code the HTTP status."""
        problems = self._value(method_id, "response", ERROR_SCHEMA, body, "$")
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return [*problems, f"{method_id}: response $.error: missing from an HTTP {status}"]
        if error.get("code") != status:
            problems.append(
                f"{method_id}: response $.error.code: {error.get('code')!r}, not the HTTP status "
                f"{status}"
            )
        if not error.get("message"):
            problems.append(f"{method_id}: response $.error.message: missing")
        if "status" in error and error["status"] not in RPC_STATUS.get(status, ()):
            problems.append(
                f"{method_id}: response $.error.status: {error['status']!r} is not a status "
                f"of HTTP {status}"
            )
        return problems

    # -- schemas -------------------------------------------------------------------------------

    def _value(self, method_id, side, schema, value, path):
        """Problems with one JSON value against a schema of the document."""
        where = f"{method_id}: {side} {path}"
        if "$ref" in schema:
            schema = self.schemas[schema["$ref"]]
        if value is None:  # a patch may null a field to remove it; the API never sends null
            return [] if side == "request" else [f"{where}: null (the API leaves unset fields out)"]
        kind = schema.get("type")
        if kind == "any":
            return []
        if kind == "object":
            return self._object(method_id, side, schema, value, path)
        if kind == "array":
            if not isinstance(value, list):
                return [f"{where}: expected an array, got {describe(value)}"]
            if not value and side == "response":
                return [f"{where}: an empty list (the API leaves empty lists out)"]
            problems = []
            for index, item in enumerate(value):
                item_path = f"{path}[{index}]"
                problems += self._value(method_id, side, schema["items"], item, item_path)
            return problems
        return [f"{where}: {why}" for why in scalar_problems(schema, value)]

    def _object(self, method_id, side, schema, value, path):
        if not isinstance(value, dict):
            return [f"{method_id}: {side} {path}: expected an object, got {describe(value)}"]
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        problems = []
        for key, sub in (properties or {}).items():
            required = sub.get("annotations", {}).get("required", ())
            if side == "request" and method_id in required and value.get(key) is None:
                problems.append(f"{method_id}: {side} {path}.{key}: required by the method")
        for key, item in value.items():
            if properties and key in properties:
                sub, item_path = properties[key], f"{path}.{key}"
            elif extra is not None:
                sub, item_path = extra, f"{path}[{json.dumps(key)}]"
            elif properties is None:
                continue  # an object the document leaves open
            else:
                problems.append(f"{method_id}: {side} {path}.{key}: unknown property")
                continue
            problems += self._value(method_id, side, sub, item, item_path)
            if side == "response" and key == "kind" and item != sub.get("default", item):
                problems.append(f"{method_id}: {side} {item_path}: {item!r}, not {sub['default']}")
        return problems


def parameter_problems(spec, text):
    """Why a URL parameter's text is not of its declared type, format, enum or pattern."""
    kind = spec.get("type")
    if kind == "integer":
        if not re.fullmatch(r"-?[0-9]+", text):
            return [f"expected an integer, got {text!r}"]
        value = int(text)
        problems = range_problems(spec.get("format"), value)
        for bound, low in (("minimum", True), ("maximum", False)):
            if bound in spec and (value < int(spec[bound]) if low else value > int(spec[bound])):
                problems.append(f"{value} is beyond its {bound} {spec[bound]}")
        return problems
    if kind == "number":
        try:
            float(text)
        except ValueError:
            return [f"expected a number, got {text!r}"]
        return []
    if kind == "boolean":
        return [] if text in ("true", "false") else [f"expected true or false, got {text!r}"]
    return scalar_problems(spec, text)


def scalar_problems(schema, value):
    """Why a JSON scalar is not of its schema's type, format, enum or pattern."""
    kind, fmt = schema.get("type"), schema.get("format")
    if kind == "string":
        if not isinstance(value, str):
            return [f"expected a string{f' ({fmt})' if fmt else ''}, got {describe(value)}"]
        if fmt in ("int64", "uint64"):
            if not re.fullmatch(r"-?[0-9]+", value):
                return [f"expected a decimal {fmt} string, got {value!r}"]
            return range_problems(fmt, int(value))
        if fmt == "byte":
            try:
                base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
            except (binascii.Error, ValueError):
                return [f"expected base64 (byte), got {value!r}"]
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"expected an integer{f' ({fmt})' if fmt else ''}, got {describe(value)}"]
        return range_problems(fmt, value)
    elif kind == "number":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return [f"expected a number, got {describe(value)}"]
    elif kind == "boolean":
        if not isinstance(value, bool):
            return [f"expected a boolean, got {describe(value)}"]
    else:
        return [f"the document's type {kind!r} is not known here"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{value!r} is not one of {', '.join(map(str, schema['enum']))}"]
    if "pattern" in schema and not re.fullmatch(schema["pattern"], str(value)):
        return [f"{value!r} does not match {schema['pattern']}"]
    return []


def range_problems(fmt, value):
    low, high = INT_RANGES.get(fmt, (value, value))
    return [] if low <= value <= high else [f"{value} is out of the {fmt} range"]


def describe(value):
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    name = kind.get(type(value), "object")
    shown = json.dumps(value)
    return f"{name} {shown if len(shown) <= 40 else shown[:37] + '...'}"


@functools.cache
def contract():
    """The contract of the installed google-api-python-client, loaded once."""
    return Contract.load()


def validate_request(http_method, url, query=None, body=None):
    return contract().validate_request(http_method, url, query, body)


def validate_response(method_id, status, body):
    return contract().validate_response(method_id, status, body)


OAUTH2_API_HOST = "oauth2.googleapis.com"


def validate_log(entries):
    """Problems with the exchanges a fake recorded (compute_api.py's log entries: method, host,
    path, query, body, status, response). A request the contract does not allow passes only
    where it was answered with an error; entries the proxy refused or relayed (to the Cloud
    Storage front, whose own log its tests check) are not API traffic, and the
    OAuth2 token endpoint's (oauth2.googleapis.com) are not Compute Engine's (its own tests check
    them against Google's OAuth2 service-account flow)."""
    api = contract()
    problems = []
    for number, entry in enumerate(entries):
        if entry.get("refused") or entry.get("relayed") or entry.get("host") == OAUTH2_API_HOST:
            continue
        url = f"https://{entry['host']}{entry['path']}"
        label = f"request {number} ({entry['method']} {entry['path']} -> {entry['status']})"
        found = api.validate_request(entry["method"], url, entry.get("query"), entry.get("body"))
        if found and entry["status"] < 400:
            problems += [f"{label}: {p} (yet the fake answered {entry['status']})" for p in found]
        method, _params = api.match(entry["method"], url)
        if method is None:
            if entry["status"] < 400:
                continue  # already reported: an unknown method answered as a success
            method_id = "unknown method"
            found = api.validate_error(method_id, entry["status"], entry.get("response"))
        else:
            found = api.validate_response(method.id, entry["status"], entry.get("response"))
        problems += [f"{label}: {p}" for p in found]
    return problems
