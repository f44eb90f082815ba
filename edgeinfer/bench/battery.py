"""A battery of JSON Schemas with a prompt each: what agents ask for, from flat records to $ref trees.

Used by `bench --workload json`, by `scripts/json_validity.py` and by the tests: every answer
must parse and validate (checked with the jsonschema library, not with edgeinfer's own code).
Left out on purpose: a recursive schema ($ref to itself). It is enforced, but nothing bounds
its depth, and the 135M default model nests until max_tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    prompt: str
    schema: dict[str, Any]


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required, **extra}


STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
SHORT = {"type": "string", "maxLength": 40}
EMPLOYEE = _obj({"name": SHORT, "role": SHORT})
ADDRESS = _obj({"street": SHORT, "city": SHORT, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})

CASES = [
    Case("person", "Describe a fictional person.", _obj({"name": SHORT, "age": {**INT, "minimum": 0, "maximum": 120}})),
    Case("weather", "Report today's weather in Paris.", _obj({"city": SHORT, "celsius": NUM, "sunny": BOOL})),
    Case("color", "Pick a primary color.", _obj({"color": {"enum": ["red", "green", "blue"]}})),
    Case(
        "tags",
        "Give three tags for a blog post about Python.",
        _obj({"tags": {"type": "array", "items": SHORT, "minItems": 3, "maxItems": 3}}),
    ),
    Case("scores", "List some test scores.", _obj({"scores": {"type": "array", "items": INT, "maxItems": 5}})),
    Case(
        "nullable",
        "Describe a book; the subtitle may be missing.",
        _obj({"title": SHORT, "subtitle": {"type": ["string", "null"], "maxLength": 40}}),
    ),
    Case("null_only", "Say nothing, as JSON null in a field.", _obj({"nothing": {"type": "null"}})),
    Case(
        "optional",
        "Describe a product; the discount is optional.",
        _obj({"name": SHORT, "price": {**NUM, "minimum": 0}, "discount": NUM}, required=["name", "price"]),
    ),
    Case("nested", "Give a customer with an address.", _obj({"name": SHORT, "address": ADDRESS})),
    Case(
        "deep",
        "Describe a company, its CEO and the CEO's contact.",
        _obj({"company": _obj({"name": SHORT, "ceo": _obj({"name": SHORT, "contact": _obj({"email": SHORT})})})}),
    ),
    Case(
        "array_of_objects",
        "List two employees with their roles.",
        _obj({"employees": {"type": "array", "items": EMPLOYEE, "minItems": 2, "maxItems": 2}}),
    ),
    Case(
        "any_of",
        "Give an id, as a number or a code.",
        _obj({"id": {"anyOf": [{**INT, "minimum": 1}, {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}]}}),
    ),
    Case(
        "one_of_shapes",
        "Describe a shape.",
        _obj(
            {
                "shape": {
                    "anyOf": [
                        _obj({"kind": {"const": "circle"}, "radius": {**NUM, "exclusiveMinimum": 0}}),
                        _obj({"kind": {"const": "square"}, "side": {**NUM, "exclusiveMinimum": 0}}),
                    ]
                }
            }
        ),
    ),
    Case(
        "defs_ref",
        "Give a shipping order with two addresses.",
        {
            "$defs": {"addr": ADDRESS},
            **_obj({"from": {"$ref": "#/$defs/addr"}, "to": {"$ref": "#/$defs/addr"}}),
        },
    ),
    Case("bounded_number", "Rate a movie from 1 to 5.", _obj({"rating": {**NUM, "minimum": 1, "maximum": 5}})),
    Case("integer_range", "Pick a month number.", _obj({"month": {**INT, "minimum": 1, "maximum": 12}})),
    Case("string_len", "Give a short nickname.", _obj({"nickname": {**STR, "minLength": 3, "maxLength": 8}})),
    Case("pattern", "Give a US phone number.", _obj({"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}})),
    Case("date", "When is the next holiday?", _obj({"date": {"type": "string", "format": "date"}})),
    Case("bool_flags", "Which features does the plan include?", _obj({"sso": BOOL, "api": BOOL, "support": BOOL})),
    Case(
        "enum_array",
        "Which weekdays is the shop open?",
        _obj({"days": {"type": "array", "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]}, "maxItems": 5}}),
    ),
    Case("const", "Acknowledge the request.", _obj({"status": {"const": "ok"}, "note": SHORT})),
    Case(
        "tuple",
        "Give a point as x and y.",
        _obj({"point": {"type": "array", "prefixItems": [NUM, NUM], "items": False, "minItems": 2}}),
    ),
    Case(
        "invoice",
        "Write an invoice with two line items.",
        _obj(
            {
                "number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                "currency": {"enum": ["EUR", "USD"]},
                "paid": BOOL,
                "items": {
                    "type": "array",
                    "items": _obj({"what": SHORT, "qty": {**INT, "minimum": 1, "maximum": 99}, "price": NUM}),
                    "minItems": 1,
                    "maxItems": 3,
                },
            }
        ),
    ),
    Case(
        "tool_args",
        "Book a table for two tonight.",
        _obj(
            {
                "restaurant": SHORT,
                "party_size": {**INT, "minimum": 1, "maximum": 12},
                "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                "notes": {"type": ["string", "null"], "maxLength": 40},
            },
            required=["restaurant", "party_size", "time"],
        ),
    ),
    Case(
        "long_keys",
        "Fill in the customer record.",
        _obj(
            {
                "customer_identification_number": {**INT, "minimum": 0, "maximum": 999},
                "customer_preferred_contact_method": {"enum": ["email", "phone"]},
                "customer_account_is_currently_active": BOOL,
                "customer_loyalty_program_membership_level": {"enum": ["bronze", "silver", "gold"]},
            }
        ),
    ),
]


# A tool for the tool-call checks (scripts/json_validity.py, tests/test_tools.py).
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": _obj({"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}),
    },
}


def schema_text(case: Case) -> str:
    return json.dumps(case.schema)


def check(case: Case, text: str) -> str | None:
    """None if the text parses and validates against the case's schema; else what is wrong."""
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    try:
        # The schema's own draft's checker: the generic FormatChecker judges "time" by draft 3's rules.
        validator = jsonschema.validators.validator_for(case.schema, default=jsonschema.Draft202012Validator)
        jsonschema.validate(value, case.schema, format_checker=validator.FORMAT_CHECKER)
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message}"
    return None
