"""JSON Schema's `date`, `time` and `date-time` formats as exact regexes, for the grammar to enforce.

llguidance's own patterns for these formats check shapes only: they admit 2023-02-30 and year
0000. The patterns here admit exactly the values RFC 3339 calls real, as jsonschema's format
checker (with rfc3339-validator) judges them: month lengths, 29 February in leap years only
(divisible by 4, centuries only when divisible by 400), years 0001-9999, hours 00-23, minutes
and seconds 00-59, and an offset `Z` or +-HH:MM within a day. Two narrowings keep a small
model from running away: a fraction of a second has at most 9 digits, and `T` and `Z` are
written upper-case. A leap second (:60) is not produced: the checker refuses it too.
Every pattern uses only what llguidance's regex dialect takes (no look-around, no backreference).
"""

from __future__ import annotations

_DAY_28 = "(?:0[1-9]|1[0-9]|2[0-8])"
_DAY_30 = "(?:0[1-9]|[12][0-9]|30)"
_DAY_31 = "(?:0[1-9]|[12][0-9]|3[01])"
# 0001-9999: year 0000 is not a date (datetime.date refuses it).
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
# Leap years: the last two digits a multiple of 4 other than 00 (any century), or a century a multiple of 400
# (its first two digits a multiple of 4 other than 00, so never 0000).
_MULTIPLE_OF_4 = "(?:0[48]|[2468][048]|[13579][26])"
_LEAP_YEAR = f"(?:[0-9]{{2}}{_MULTIPLE_OF_4}|{_MULTIPLE_OF_4}00)"

DATE = f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-{_DAY_31}|(?:0[469]|11)-{_DAY_30}|02-{_DAY_28})|{_LEAP_YEAR}-02-29)"
_HOUR = "(?:[01][0-9]|2[0-3])"
_SIXTY = "[0-5][0-9]"
TIME = f"{_HOUR}:{_SIXTY}:{_SIXTY}(?:\\.[0-9]{{1,9}})?(?:Z|[+-]{_HOUR}:{_SIXTY})"
DATE_TIME = f"{DATE}T{TIME}"

PATTERNS = {"date": DATE, "time": TIME, "date-time": DATE_TIME}


def exact(schema: dict) -> dict:
    """A string schema whose `format` is a date or time, with the format's exact pattern in its place.

    A schema that already has a `pattern` keeps both: the answer must match the two (llguidance
    intersects a `pattern` with `allOf`'s other branch)."""
    fmt = schema.get("format")
    if fmt not in PATTERNS:
        return schema
    out = {k: v for k, v in schema.items() if k != "format"}
    if "pattern" in out:
        return {**out, "allOf": [*out.get("allOf", []), {"pattern": f"^{PATTERNS[fmt]}$"}]}
    out["pattern"] = f"^{PATTERNS[fmt]}$"
    return out
