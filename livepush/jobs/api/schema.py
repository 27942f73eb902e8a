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

from ...types import shown
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


# jsonschema's messages quote the refused value whole: a long string or a big dict would make a
# refusal kilobytes long, in every log line and error page that shows it. Its head names what was
# refused and its tail the rule's words ("is too long", "is not one of [...]"): both are kept.
_MESSAGE_HEAD, _MESSAGE_TAIL = 240, 120


def _bounded(message: str) -> str:
    """`message` with its middle left out when it is longer than a log line should be."""
    cut = len(message) - _MESSAGE_HEAD - _MESSAGE_TAIL
    if cut <= 40:
        return message
    return f"{message[:_MESSAGE_HEAD]} ... ({cut} characters left out) ... {message[-_MESSAGE_TAIL:]}"


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


def _resolver_of(schema: Any) -> tuple[Any, Any]:
    """A resolver of refs from `schema`'s root (its own $id and ids, and the JSON Schema
    meta-schemas: nothing is fetched), and the root as a draft 2020-12 resource."""
    from jsonschema_specifications import REGISTRY as SPECIFICATIONS
    from referencing.jsonschema import DRAFT202012

    root = DRAFT202012.create_resource(schema)
    base = root.id() or ""
    return SPECIFICATIONS.with_resource(uri=base, resource=root).resolver(base_uri=base), root


def _other_draft(schema: Any) -> Any:
    """The first $schema that a subschema of `schema` declares other than draft 2020-12, else None.
    The validator checks such a part by its own draft's rules (a pasted draft-07 part's
    `dependencies` applied, where 2020-12 has none) while the meta-schema check read it as 2020-12.
    Walked by keyword, so a property named "$schema" is no declaration."""
    from referencing.jsonschema import DRAFT202012

    pending = list(DRAFT202012.create_resource(schema).subresources())
    while pending:
        resource = pending.pop()
        if isinstance(resource.contents, Mapping):
            declared = resource.contents.get("$schema", DRAFT)
            if not isinstance(declared, str) or declared.rstrip("#") != DRAFT:
                return declared
        pending.extend(resource.subresources())
    return None


_NOWHERE = ("points nowhere (refs reach the schema's own $defs and ids, or the JSON Schema meta-schemas: "
            "nothing is fetched)")


def _no_schema(target: Any) -> str | None:
    """What is wrong with `target`, what a $ref reached, when it is no schema (else None). A ref
    may point anywhere in the document (a "default", a "required" list, an "x-" member), and what
    no keyword leads to was never checked against the meta-schema: the validator then failed on
    it at every enqueue with a bare TypeError or AttributeError (our walk, on a number, at import)."""
    import jsonschema
    from jsonschema.exceptions import SchemaError

    if not isinstance(target, (Mapping, bool)):
        return f"points to {shown(target, typed=True, width=60)}, which is no JSON Schema (a dict or a bool)"
    try:
        jsonschema.Draft202012Validator.check_schema(target)
    except SchemaError as exc:
        return f"points to an object that is no valid JSON Schema: {exc.message:.160}"
    return None


def _bad_ref(schema: Any) -> tuple[str, str] | None:
    """The first $ref (or $dynamicRef) of `schema` that resolves to nothing or to a value that is
    no schema, and what is wrong with it; else None. The validator resolves them only when an
    instance reaches them, and then raises its own error: at every enqueue of the job instead of
    once, at import."""
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    resolver, root = _resolver_of(schema)
    walked: set[int] = set()  # the contents walked already, by identity: refs may form cycles

    def first(resolver: Any, resource: Any) -> tuple[str, str] | None:
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
                        return ref, _NOWHERE
                    # Walked contents are schemas already: the root, or places keywords lead to.
                    if id(target.contents) not in walked:
                        why = _no_schema(target.contents)
                        if why is not None:
                            return ref, why
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

    return first(resolver, root)


# Keywords that apply their subschemas to the very value their schema applies to, not to a part of
# it: a chain of them that comes back to where it started never ends.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")


def _endless_ref(schema: Any) -> str | None:
    """A $ref (or $dynamicRef) of `schema` that leads back to a schema it is applied from, with
    only keywords in between that apply to the same value ($ref, allOf, anyOf, oneOf, not, if,
    then, else, dependentSchemas), else None. Draft 2020-12 leaves such a schema's behaviour
    undefined; jsonschema recurses until Python's limit and raises RecursionError, at every
    enqueue whose arguments reach the loop. Call it once every ref resolves to a schema (_bad_ref)."""
    from referencing.jsonschema import DRAFT202012

    resolver, root = _resolver_of(schema)
    on_path: set[int] = set()  # the schemas being applied, by identity
    done: set[int] = set()  # the schemas whose in-place keywords lead to no loop

    def loop_from(resolver: Any, contents: Any) -> str | None:
        if not isinstance(contents, Mapping) or id(contents) in done:
            return None
        on_path.add(id(contents))
        steps: list[tuple[str | None, Any, Any]] = []
        for keyword in ("$ref", "$dynamicRef"):
            ref = contents.get(keyword)
            if isinstance(ref, str):
                target = resolver.lookup(ref)
                steps.append((ref, target.resolver, target.contents))
        subs = [contents.get(k) for k in _IN_PLACE_ONE]
        for keyword in _IN_PLACE_MANY:
            subs.extend(contents.get(keyword) or ())
        dependent = contents.get("dependentSchemas")
        subs.extend(dependent.values() if isinstance(dependent, Mapping) else ())
        for sub in subs:
            if isinstance(sub, Mapping):
                steps.append((None, resolver.in_subresource(DRAFT202012.create_resource(sub)), sub))
        for ref, next_resolver, target in steps:
            if id(target) in on_path:
                return ref or "(a subschema applied to itself)"
            found = loop_from(next_resolver, target)
            if found is not None:
                return ref or found
        on_path.discard(id(contents))
        done.add(id(contents))
        return None

    # From every subschema: a loop may sit under any keyword, below properties or items too.
    pending = [(resolver, root)]
    while pending:
        at, resource = pending.pop()
        found = loop_from(at, resource.contents)
        if found is not None:
            return found
        pending.extend((at.in_subresource(sub), sub) for sub in resource.subresources())
    return None


# Where draft 2020-12 takes subschemas: one, a list, or a map of them. A false one under the
# keywords of _OWN_REFUSAL is reported by that keyword, with the place and a message of its own.
_ONE = ("not", "if", "then", "else", "propertyNames", "contentSchema", "items", "contains",
        "additionalProperties", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("prefixItems", "allOf", "anyOf", "oneOf")
_MAP = ("properties", "patternProperties", "dependentSchemas", "$defs")
_OWN_REFUSAL = frozenset({"items", "contains", "additionalProperties", "unevaluatedItems", "unevaluatedProperties"})
# Refuses every value, as false does, but through a keyword: jsonschema reports a false subschema's
# refusal without the place in the value where it refused (its error skips the step that adds
# the property or index), and with no rule.
_REFUSE_ALL: Mapping[str, Any] = {"not": {}}


def _false_as_not(schema: Any, own_refusal: bool = False) -> Any:
    """`schema` with its false subschemas written {"not": {}}, which refuses the same values,
    except where a keyword reports a false one itself (_OWN_REFUSAL); `schema` itself when it holds
    none."""
    if schema is False:
        return schema if own_refusal else dict(_REFUSE_ALL)
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for keyword in _ONE:
        if keyword in out:
            out[keyword] = _false_as_not(out[keyword], keyword in _OWN_REFUSAL)
    for keyword in _LIST:
        if isinstance(out.get(keyword), list):
            out[keyword] = [_false_as_not(sub) for sub in out[keyword]]
    for keyword in _MAP:
        if isinstance(out.get(keyword), Mapping):
            out[keyword] = {name: _false_as_not(sub) for name, sub in out[keyword].items()}
    return out


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
    other = _other_draft(schema)
    if other is not None:
        raise ConfigError(f"@jobs.job(schema=...) of {job_name}: schemas are draft 2020-12 ($schema {DRAFT!r}), "
                          f"got $schema {shown(other, width=80)} in a subschema: drop that $schema line (and rewrite what "
                          "its draft spells otherwise, such as `dependencies`)")
    bad = _bad_ref(schema)
    if bad is not None:
        raise ConfigError(f"@jobs.job(schema=...) of {job_name}: $ref {bad[0]!r} {bad[1]}")
    ref = _endless_ref(schema)
    if ref is not None:
        raise ConfigError(f"@jobs.job(schema=...) of {job_name}: $ref {ref!r} leads back to a schema it is "
                          "applied from, through keywords that apply to the same value (allOf, anyOf, $ref, "
                          "...): checking the arguments would never end; make the loop go through a part of "
                          "the value (properties, items)")
    validator = jsonschema.Draft202012Validator(_false_as_not(schema))

    def validate(args: list[Any]) -> None:
        error = best_match(validator.iter_errors(_as_stored(args)))
        if error is not None:
            if error.validator == "not" and error.validator_value == {}:
                rule, message = "false", f"False schema does not allow {error.instance!r}"
            else:
                rule, message = repr(error.validator), error.message
            raise InvalidArgumentsError(f"{_path(error)} breaks the schema of {job_name} (rule {rule}): "
                                        f"{_bounded(message)}")

    return validate
