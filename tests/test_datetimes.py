"""The date and time formats' patterns admit exactly what jsonschema's format checker calls real."""

from __future__ import annotations

import re

import jsonschema
import pytest

from edgeinfer.engine import datetimes
from edgeinfer.engine.grammar import closed

pytestmark = pytest.mark.pure

CHECK = jsonschema.Draft202012Validator.FORMAT_CHECKER
# Every leap-year rule: ordinary years, multiples of 4, centuries (1900, 2100 are not leap; 2000, 2400
# are), the first years, the last ones, and 0000 (not a year at all).
YEARS = [*range(0, 30), *range(1896, 1905), *range(1996, 2005), 2100, 2400, 9600, 9700, *range(9995, 10000)]


def test_every_day_of_the_leap_year_cycle_is_judged_as_the_checker_judges_it():
    wrong = [
        date
        for y in YEARS
        for m in range(0, 14)
        for d in range(0, 33)
        if bool(re.fullmatch(datetimes.DATE, date := f"{y:04d}-{m:02d}-{d:02d}")) != CHECK.conforms(date, "date")
    ]
    assert wrong == []
    assert re.fullmatch(datetimes.DATE, "2024-02-29") and not re.fullmatch(datetimes.DATE, "2023-02-29")
    assert not re.fullmatch(datetimes.DATE, "1900-02-29") and re.fullmatch(datetimes.DATE, "2000-02-29")


@pytest.mark.parametrize(
    "time",
    [
        "00:00:00Z",
        "23:59:59Z",
        "24:00:00Z",
        "12:60:00Z",
        "12:00:60Z",
        "12:00:00",
        "12:00:00.5Z",
        "12:00:00.123456789-05:30",
        "12:00:00+23:59",
        "12:00:00+24:00",
        "12:00:00+05:60",
        "12:00:00.Z",
        "1:00:00Z",
    ],
)
def test_times_are_judged_as_the_checker_judges_them(time):
    assert bool(re.fullmatch(datetimes.TIME, time)) == CHECK.conforms(time, "time")
    stamp = f"2024-02-29T{time}"
    assert bool(re.fullmatch(datetimes.DATE_TIME, stamp)) == CHECK.conforms(stamp, "date-time")


def test_the_enforced_schema_carries_the_pattern_in_place_of_the_format():
    assert closed({"type": "string", "format": "date"}) == {"type": "string", "pattern": f"^{datetimes.DATE}$"}
    both = closed({"type": "string", "format": "date-time", "pattern": "^20"})
    assert both["pattern"] == "^20" and both["allOf"] == [{"pattern": f"^{datetimes.DATE_TIME}$"}]
    assert closed({"type": "string", "format": "email"}) == {"type": "string", "format": "email"}
    nested = closed({"type": "object", "properties": {"at": {"type": "string", "format": "time"}}})
    assert nested["properties"]["at"] == {"type": "string", "pattern": f"^{datetimes.TIME}$"}
