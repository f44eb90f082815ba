"""UTF-8 and stop-string handling of the text stream, byte by byte."""

import pytest

from edgeinfer.engine.text import TextStream

pytestmark = pytest.mark.pure


def feed_all(ts, pieces):
    out = [ts.feed(p) for p in pieces]
    out.append(ts.flush())
    return out


def test_multibyte_character_split_across_tokens_is_held_until_complete():
    data = "héllo 🙂!".encode()
    ts = TextStream()
    out = feed_all(ts, [data[i : i + 1] for i in range(len(data))])
    for chunk in out:
        chunk.encode("utf-8")  # every chunk is valid text on its own
        assert "\ufffd" not in chunk
    assert "".join(out) == "héllo 🙂!"


def test_stop_string_split_across_tokens_never_leaks():
    ts = TextStream(["<END>"])
    out = [ts.feed(p.encode()) for p in ["Hello <", "EN", "D> more"]]
    assert "".join(out) == "Hello "
    assert ts.stopped and ts.text == "Hello "
    assert ts.flush() == ""


def test_held_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    ts = TextStream(["<END>"])
    assert ts.feed(b"a <E") == "a "
    assert ts.feed(b"X") == "<EX"
    assert ts.flush() == ""


def test_earliest_of_several_stops_wins():
    ts = TextStream(["bb", "a"])
    assert ts.feed(b"xxbba") == "xx"


def test_flush_releases_held_text_at_end():
    ts = TextStream(["STOP"])
    assert ts.feed(b"ST") == ""
    assert ts.flush() == "ST"
    assert ts.text == "ST"


def test_a_character_cut_off_at_the_end_is_dropped_not_replaced():
    ts = TextStream()
    assert ts.feed(b"ab" + "é".encode()[:1]) == "ab"
    assert ts.flush() == ""
    assert ts.text == "ab"
