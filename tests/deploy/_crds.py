"""Validating custom resources (no cluster here) against CRD schemas vendored in tests/deploy/crds/.

Each fixture holds a CRD's ``openAPIV3Schema``. It becomes a strict JSON Schema the way the API
server's strict field validation treats it: an object that lists ``properties`` refuses any other field,
unless it says ``x-kubernetes-preserve-unknown-fields`` or gives ``additionalProperties`` itself. The
CEL rules (``x-kubernetes-validations``) that the API server would run are checked by hand below.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import yaml

CRD_DIR = Path(__file__).resolve().parent / "crds"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_fixtures() -> dict[str, dict]:
    """{"<group>/<version>/<kind>": fixture} for every vendored CRD."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[f"{crd['group']}/{crd['version']}/{crd['kind']}"] = crd
    return out


def _inference_pool_rules(doc: dict) -> list[str]:
    spec = doc["spec"]
    errors = []
    numbers = [p["number"] for p in spec["targetPorts"]]
    if len(numbers) != len(set(numbers)):
        errors.append("spec.targetPorts: port number must be unique")
    ref = spec["endpointPickerRef"]
    if ref.get("kind", "Service") == "Service" and "port" not in ref:
        errors.append("spec.endpointPickerRef: port is required when kind is 'Service' or unspecified")
    return errors


# The CEL rules of each CRD, as Python: doc -> error messages.
CEL_RULES: dict[str, Callable[[dict], list[str]]] = {
    "inference.networking.k8s.io/v1/InferencePool": _inference_pool_rules,
}


def validate_custom_resource(doc: dict) -> list[str]:
    """Error messages for ``doc`` against its vendored CRD ('' list when valid); KeyError if none is vendored."""
    import jsonschema

    key = f"{doc['apiVersion']}/{doc['kind']}"
    crd = crd_fixtures()[key]
    schema = _strict(copy.deepcopy(crd["openAPIV3Schema"]))
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
    meta = doc.get("metadata", {})
    if not DNS_SUBDOMAIN.match(meta.get("name", "")) or len(meta.get("name", "")) > 253:
        errors.append(f"metadata.name: {meta.get('name')!r} is not a DNS subdomain")
    for label, value in meta.get("labels", {}).items():
        if not isinstance(value, str):
            errors.append(f"metadata.labels.{label}: not a string")
    if not errors and key in CEL_RULES:
        errors += CEL_RULES[key](doc)
    return errors
