"""@jobs.job(schema=...) (docs/jobs.md "Enqueue options"): a JSON Schema (draft 2020-12) on the
arguments as one JSON array, checked at enqueue; a refusal names the path and the rule, and
nothing is written."""

from __future__ import annotations

import re
from typing import Any

import pytest

from livepush import ConfigError, jobs
from livepush.jobs import InvalidArgumentsError
from livepush.jobs.api.schema import DRAFT
from tests.jobs.conftest import q

ROW = {"type": "object", "required": ["email"], "additionalProperties": False,
       "properties": {"email": {"type": "string", "pattern": "^[^@]+@[^@]+$"}, "rows": {"type": "array",
                      "items": {"$ref": "#/$defs/row"}}}}


@jobs.job(name="t.schema_import", schema={
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "array", "prefixItems": [{"type": "integer", "minimum": 1}, ROW], "items": False, "minItems": 2,
    "$defs": {"row": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}},
})
async def schema_import(ctx: Any, import_id: int, spec: dict[str, Any]) -> None:
    return None


GOOD = {"email": "a@b.c", "rows": [{"id": 1}]}


def test_valid_arguments_are_enqueued(jobs_db: str) -> None:
    handle = schema_import.enqueue(7, GOOD)
    assert q(jobs_db, "SELECT args FROM livepush_job_payloads WHERE id = %s", (handle.id,)) == [([7, GOOD],)]


@pytest.mark.parametrize(("args", "path", "rule"), [
    ((0, GOOD), "args[0]", "minimum"),
    ((7, {"email": "nope"}), 'args[1]["email"]', "pattern"),
    ((7, {**GOOD, "x": 1}), "args[1]", "additionalProperties"),
    ((7, {"email": "a@b.c", "rows": [{"id": "1"}]}), 'args[1]["rows"][0]["id"]', "type"),
    ((7, GOOD, 3), "args", "items"),
    ((7,), "args", "minItems"),
])
def test_a_refusal_names_the_path_and_the_rule_and_writes_nothing(
        jobs_db: str, args: tuple[Any, ...], path: str, rule: str) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        schema_import.enqueue(*args)
    message = str(caught.value)
    assert message.startswith(f"{path} breaks the schema of t.schema_import (rule '{rule}')"), message
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_one_refused_item_writes_nothing_of_the_batch(jobs_db: str) -> None:
    with pytest.raises(InvalidArgumentsError, match=r"args\[0\]"):
        jobs.enqueue_many([(schema_import, [1, GOOD]), (schema_import, [0, GOOD])])
    with pytest.raises(InvalidArgumentsError, match=r"args\[0\]"):
        schema_import.request(0, GOOD)
    with pytest.raises(InvalidArgumentsError):
        with jobs.group() as g:
            g.enqueue(schema_import, 1, GOOD)
            g.enqueue(schema_import, 1, {})
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_an_invalid_schema_fails_at_decoration() -> None:
    with pytest.raises(ConfigError, match="not a valid JSON Schema: at type"):
        jobs.job(name="t.bad_schema", schema={"type": "nonsense"})(lambda ctx: None)
    with pytest.raises(ConfigError, match="draft 2020-12"):
        jobs.job(name="t.old_schema", schema={"$schema": "http://json-schema.org/draft-07/schema#"})(lambda ctx: None)
    # A part pasted from an older schema with its $schema line: its own draft's rules would check
    # that part (draft-07's `dependencies` applied, where 2020-12 has none), the rest 2020-12's.
    old_part = {"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"]}}
    with pytest.raises(ConfigError, match=r"draft 2020-12.*draft-07.*in a subschema"):
        jobs.job(name="t.old_part", schema={"prefixItems": [old_part]})(lambda ctx, person: None)
    # One that declares 2020-12, or a property named $schema, is no other draft.
    same = {"$schema": DRAFT, "type": "object", "properties": {"$schema": {"type": "string"}}}
    jobs.job(name="t.same_part", schema={"prefixItems": [same]})(lambda ctx, person: None)
    with pytest.raises(ConfigError, match="is a dict"):
        jobs.job(name="t.list_schema", schema=[1])(lambda ctx: None)


def test_format_is_not_checked_and_a_pattern_is_a_python_regex_as_the_docs_say() -> None:
    """What differs from a validator in the browser: `format` is an annotation (any string passes
    "email"), `\\d` takes any Unicode digit as Python's `re` does (`[0-9]` only ASCII ones), and an
    ECMA-262 `\\p{L}` is refused at import as no regex."""
    email = jobs.job(name="t.schema_format", schema={"prefixItems": [{"type": "string", "format": "email"}]})(
        lambda ctx, address: None)
    assert list(email.request("not an address").args) == ["not an address"]
    digits = jobs.job(name="t.schema_digits", schema={"prefixItems": [{"type": "string", "pattern": "^\\d+$"}]})(
        lambda ctx, code: None)
    ascii_digits = jobs.job(name="t.schema_ascii_digits",
                            schema={"prefixItems": [{"type": "string", "pattern": "^[0-9]+$"}]})(lambda ctx, code: None)
    arabic_indic = "\u0661\u0662"
    assert list(digits.request(arabic_indic).args) == [arabic_indic]
    with pytest.raises(InvalidArgumentsError, match="pattern"):
        ascii_digits.request(arabic_indic)
    with pytest.raises(ConfigError, match="regex"):
        jobs.job(name="t.schema_unicode_class", schema={"prefixItems": [{"pattern": "^\\p{L}+$"}]})(
            lambda ctx, name: None)


@pytest.mark.parametrize(("schema", "says"), [
    ({"$schema": 5}, r"\$schema 5"),
    ({"$schema": None}, r"\$schema None"),
    ({"prefixItems": [{"$ref": "#/$defs/person"}]}, "'#/\\$defs/person'"),
    ({"items": {"$ref": "https://example.com/row.json"}}, "'https://example.com/row.json'"),
    ({"$id": "https://example.com/import", "items": {"$ref": "row"}}, "'row'"),
    ({"prefixItems": [{"$ref": "#/x-common/row"}], "x-common": {"row": {"$ref": "#/$defs/gone"}}},
     "'#/\\$defs/gone'"),
    ({"$ref": "#/components/a", "components": {"a": {"$ref": "#/components/b"}}}, "'#/components/b'"),
])
def test_a_schema_that_cannot_check_anything_fails_at_decoration_not_at_every_enqueue(schema: Any, says: str) -> None:
    """A $schema that is not a string, or a $ref to nowhere (a missing $defs entry, a remote
    schema the validator does not fetch), also one inside what another $ref reaches where no
    keyword leads (an "x-common" or "components" member): a ConfigError naming it at import. The
    $ref otherwise passed, and every enqueue of the job raised the validator's own referencing
    error."""
    with pytest.raises(ConfigError, match=f"t.dangling_schema.*{says}"):
        jobs.job(name="t.dangling_schema", schema=schema)(lambda ctx, *args: None)


@pytest.mark.parametrize(("schema", "ref", "found"), [
    ({"type": "array", "minItems": 1, "items": {"$ref": "#/minItems"}}, "#/minItems", "int 1"),
    ({"type": "array", "prefixItems": [{"$ref": "#/$defs/row/required"}],
      "$defs": {"row": {"type": "object", "required": ["id"]}}}, "#/$defs/row/required", r"list \['id'\]"),
    ({"title": "import", "prefixItems": [{"$ref": "#/title"}]}, "#/title", "str 'import'"),
    ({"prefixItems": [{"$ref": "#/x-common/row"}], "x-common": {"row": {"type": "record"}}}, "#/x-common/row",
     "'record' is not valid"),
])
def test_a_ref_to_a_value_that_is_no_schema_fails_at_decoration_naming_the_ref(schema: Any, ref: str,
                                                                               found: str) -> None:
    """A $ref that resolves to a value that is not a JSON Schema (a number, a list, a string, or an
    object that breaks the meta-schema) is a ConfigError at import naming the ref and what it
    found. It raised a bare TypeError at import, or passed and made every enqueue whose
    arguments reached it raise the validator's AttributeError or TypeError."""
    with pytest.raises(ConfigError, match=f"t.no_schema_ref: \\$ref '{re.escape(ref)}' points to .*{found}"):
        jobs.job(name="t.no_schema_ref", schema=schema)(lambda ctx, *args: None)


@pytest.mark.parametrize("schema", [
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
    {"type": "array", "prefixItems": [{"$ref": "#/$defs/n"}],
     "$defs": {"n": {"anyOf": [{"type": "integer"}, {"allOf": [{"$ref": "#/$defs/n"}]}]}}},
    {"type": "array", "items": {"$ref": "#/$defs/b"}, "$defs": {"a": {"not": {"$ref": "#/$defs/b"}},
                                                              "b": {"if": {"$ref": "#/$defs/a"}}}},
])
def test_a_schema_whose_refs_loop_on_one_value_fails_at_decoration(schema: Any) -> None:
    """A $ref that comes back to a schema it is applied from, through keywords that apply to the
    same value (allOf, anyOf, not, if, $ref, ...), would never end: a ConfigError at import. It
    passed, and every enqueue whose arguments reached the loop raised RecursionError."""
    with pytest.raises(ConfigError, match=r"t.looping_schema: \$ref '#/\$defs/\w' leads back"):
        jobs.job(name="t.looping_schema", schema=schema)(lambda ctx, *args: None)


@jobs.job(name="t.schema_tree", schema={
    "type": "array", "prefixItems": [{"$ref": "#/$defs/node"}],
    "$defs": {"node": {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}})
async def schema_tree(ctx: Any, node: dict[str, Any]) -> None:
    return None


def test_a_recursive_schema_through_a_part_of_the_value_is_fine(jobs_db: str) -> None:
    """A $ref back to an enclosing schema through properties or items checks a smaller part of the
    value each time (a tree): it is taken, and checks every level."""
    schema_tree.enqueue({"id": 1, "children": [{"id": 2, "children": [{"id": 3}]}]})
    with pytest.raises(InvalidArgumentsError, match=r'args\[0\]\["children"\]\[0\]\["children"\]\[0\]\["id"\] breaks'):
        schema_tree.enqueue({"id": 1, "children": [{"id": 2, "children": [{"id": "3"}]}]})


@jobs.job(name="t.schema_forbids", schema={
    "type": "array", "prefixItems": [{"type": "object", "properties": {"internal": False},
                                      "patternProperties": {"^_": False}}, {"$ref": "#/$defs/never"}],
    "$defs": {"never": False}})
async def schema_forbids(ctx: Any, spec: dict[str, Any], *extra: Any) -> None:
    return None


@pytest.mark.parametrize(("args", "path"), [
    (({"internal": 1},), 'args[0]["internal"]'),
    (({"ok": 1, "_private": 2},), 'args[0]["_private"]'),
    (({}, "second"), "args[1]"),
])
def test_a_refusal_by_a_false_subschema_names_its_place_and_the_rule(args: tuple[Any, ...], path: str) -> None:
    """A false subschema (a property, pattern or place that must not be there) refuses with the
    path of what it refused and the rule `false`, as any rule does. jsonschema's own error for it
    names the enclosing value and no rule: `args[0] ... (rule None)`."""
    with pytest.raises(InvalidArgumentsError) as caught:
        schema_forbids.request(*args)
    assert str(caught.value).startswith(f"{path} breaks the schema of t.schema_forbids (rule false): "
                                        "False schema does not allow"), str(caught.value)


@jobs.job(name="t.schema_quoted", schema={"type": "array", "prefixItems": [{"type": "object", "properties": {
    "it's": {"type": "integer"}, 'say "hi"': {"type": "integer"}}}]})
async def schema_quoted(ctx: Any, spec: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize(("key", "path"), [("it's", 'args[0]["it\'s"]'), ('say "hi"', 'args[0]["say \\"hi\\""]')])
def test_a_refusal_names_a_key_with_quotes_as_the_plain_json_check_does(key: str, path: str) -> None:
    """Paths write keys as JSON strings (the plain-JSON check's way): a quote in a key is kept or
    escaped, never turned into one that ends the key early."""
    with pytest.raises(InvalidArgumentsError) as caught:
        schema_quoted.request({key: "x"})
    assert str(caught.value).startswith(f"{path} breaks the schema of t.schema_quoted (rule 'type')"), str(caught.value)


def test_a_tuple_is_an_array_to_the_schema_as_to_the_plain_json_check(jobs_db: str) -> None:
    """Tuples are plain JSON arguments, stored as lists; jsonschema alone counts only lists as
    arrays, and refused `(…,)` where the stored job would hold `[…]`."""
    handle = schema_import.enqueue(7, {"email": "a@b.c", "rows": ({"id": 1}, {"id": 2})})
    assert q(jobs_db, "SELECT args FROM livepush_job_payloads WHERE id = %s", (handle.id,)) == \
        [([7, {"email": "a@b.c", "rows": [{"id": 1}, {"id": 2}]}],)]
    with pytest.raises(InvalidArgumentsError, match=r'args\[1\]\["rows"\]\[1\]\["id"\] breaks'):
        schema_import.request(7, {"email": "a@b.c", "rows": ({"id": 1}, {"id": "2"})})


@jobs.job(name="t.schema_short", schema={"type": "array", "prefixItems": [
    {"type": "string", "maxLength": 10}, {"type": "object", "additionalProperties": False}, {"enum": ["a", "b"]}]})
async def schema_short(ctx: Any, name: str, spec: dict[str, Any], choice: Any) -> None:
    return None


@pytest.mark.parametrize(("args", "path", "rule", "ends"), [
    (("x" * 100_000, {}, "a"), "args[0]", "maxLength", "is too long"),
    (("ok", {f"k{i}": i for i in range(5_000)}, "a"), "args[1]", "additionalProperties", "were unexpected)"),
    (("ok", {}, list(range(5_000))), "args[2]", "enum", "is not one of ['a', 'b']"),
])
def test_a_refusal_of_a_large_value_stays_a_line_long_and_keeps_the_rule_s_words(
        args: tuple[Any, ...], path: str, rule: str, ends: str) -> None:
    """The message goes into logs and error pages: it names the path, the rule and what the rule
    says, not the whole refused value."""
    with pytest.raises(InvalidArgumentsError) as caught:
        schema_short.request(*args)
    message = str(caught.value)
    assert message.startswith(f"{path} breaks the schema of t.schema_short (rule '{rule}'): "), message[:300]
    assert message.endswith(ends), message[-300:]
    assert "characters left out" in message
    assert len(message) < 600, len(message)
