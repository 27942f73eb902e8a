"""`@jobs.job(schema=...)`: a JSON Schema (draft 2020-12) on a job's arguments, checked at enqueue.

The schema describes the positional arguments as one JSON array (what the job's row stores), so
`prefixItems` names them in order, e.g. {"type": "array", "prefixItems": [{"type": "integer"},
{"type": "object", "required": ["email"]}], "items": false}.

The validator is `jsonschema` (the reference implementation), not `fastjsonschema`: measured on
a realistic schema (two positional arguments, a $ref'd row list of ten), fastjsonschema ran a
draft-07 rewrite of it in about 15 µs a call against jsonschema's 230 µs (10 µs for a small
schema), but it implements drafts 4 to 7 only: it refused a valid document under `prefixItems`
with `items: false`, and silently accepted what `unevaluatedProperties` and `dependentRequired`
refuse. A check that is wrong on the draft we document is worse than a slower one, and the cost
is paid only by jobs that declare a schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import ConfigError
from ..errors import InvalidArgumentsError

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _path(error: Any) -> str:
    """The failing place as an `args[...]` path, like the plain-JSON check names it."""
    out = "args"
    for part in error.absolute_path:
        # Keys as JSON strings, as args.py writes them: a repr with its quotes swapped broke on a
        # key holding a quote.
        out += f"[{part}]" if isinstance(part, int) else f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def _as_stored(value: Any) -> Any:
    """`value` with its tuples as lists, as the job's row stores them: jsonschema counts only lists
    as arrays. Returned as it is when it holds no tuple."""
    if isinstance(value, tuple):
        return [_as_stored(v) for v in value]
    if isinstance(value, list):
        items = [_as_stored(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, dict):
        converted = {k: _as_stored(v) for k, v in value.items()}
        return value if all(converted[k] is v for k, v in value.items()) else converted
    return value


def _unresolvable_ref(schema: Any) -> str | None:
    """The first $ref (or $dynamicRef) of `schema` that resolves to nothing, else None. The
    validator resolves them only when an instance reaches them, and then raises its own error:
    at every enqueue of the job instead of once, at import."""
    from jsonschema_specifications import REGISTRY as SPECIFICATIONS
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root = DRAFT202012.create_resource(schema)
    base = root.id() or ""
    registry = SPECIFICATIONS.with_resource(uri=base, resource=root)
    walked: set[int] = set()  # the contents walked already, by identity: refs may form cycles

    def first(resolver: Any, resource: Any) -> str | None:
        contents = resource.contents
        if id(contents) in walked:
            return None
        walked.add(id(contents))
        if isinstance(contents, Mapping):
            for keyword in ("$ref", "$dynamicRef"):
                ref = contents.get(keyword)
                if isinstance(ref, str):
                    try:
                        target = resolver.lookup(ref)
                    except Unresolvable:
                        return ref
                    # What a ref reaches is checked too: it may lie where no keyword leads (a
                    # pointer into "x-common" or "components"), so the walk over the keywords
                    # never met the refs it holds, and validation follows them at every enqueue.
                    found = first(target.resolver, DRAFT202012.create_resource(target.contents))
                    if found is not None:
                        return found
        for sub in resource.subresources():
            found = first(resolver.in_subresource(sub), sub)
            if found is not None:
                return found
        return None

    return first(registry.resolver(base_uri=base), root)


def compile_schema(schema: Any, job_name: str) -> Callable[[list[Any]], None]:
    """A check of a job's arguments against `schema`; ConfigError now (at decoration) if the
    schema is not a valid draft 2020-12 schema."""
    # Imported here: only jobs that declare a schema pay for loading the validator.
    import jsonschema
    from jsonschema.exceptions import SchemaError, best_match

    if not isinstance(schema, Mapping) and not isinstance(schema, bool):
        raise ConfigError(f"@jobs.job(schema=...) of {job_name}: a JSON Schema is a dict (or a bool), "
                          f"got {type(schema).__name__}")
    declared = schema.get("$schema", DRAFT) if isinstance(schema, Mapping) else DRAFT
    if not isinstance(declared, str) or declared.rstrip("#") != DRAFT:
        raise ConfigError(f"@jobs.job(schema=...) of {job_name}: schemas are draft 2020-12 ($schema {DRAFT!r}), "
                          f"got $schema {declared!r}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ConfigError(f"@jobs.job(schema=...) of {job_name} is not a valid JSON Schema: at {where}: "
                          f"{exc.message}") from None
    ref = _unresolvable_ref(schema)
    if ref is not None:
        raise ConfigError(f"@jobs.job(schema=...) of {job_name}: $ref {ref!r} points nowhere (refs reach the "
                          "schema's own $defs and ids, or the JSON Schema meta-schemas: nothing is fetched)")
    validator = jsonschema.Draft202012Validator(schema)

    def validate(args: list[Any]) -> None:
        error = best_match(validator.iter_errors(_as_stored(args)))
        if error is not None:
            raise InvalidArgumentsError(f"{_path(error)} breaks the schema of {job_name} "
                                        f"(rule {error.validator!r}): {error.message}")

    return validate
