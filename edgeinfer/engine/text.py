"""Token bytes to text deltas: valid UTF-8 at every chunk, stop strings never leaked."""

from __future__ import annotations

import codecs


class TextStream:
    """Feeds token bytes in, gives text out.

    A character split across tokens is held until its last byte arrives. Text that
    could be the start of a stop string is held until it is known not to be one, so
    a stop string split across tokens is cut out whole.
    """

    def __init__(self, stops: list[str] | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = [s for s in (stops or []) if s]
        self._hold = ""
        self.text = ""  # everything emitted so far
        self.stopped = False
        self.stop_hit: str | None = None  # the stop string that ended the text, once one has

    def feed(self, data: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        buf = self._hold + self._decoder.decode(data)
        cut = -1
        for stop in self._stops:
            i = buf.find(stop)
            if i >= 0 and (cut < 0 or i < cut):
                cut, self.stop_hit = i, stop
        if cut >= 0:
            self.stopped = True
            self._hold = ""
            return self._emit(buf[:cut])
        keep = self._partial_stop_suffix(buf)
        self._hold = buf[len(buf) - keep :] if keep else ""
        return self._emit(buf[: len(buf) - keep])

    def flush(self) -> str:
        """At the end of the stream: whatever was held back.

        The bytes of a character cut off by max_tokens are dropped: that character was
        never generated whole, and U+FFFD in the output would only be noise.
        """
        if self.stopped:
            return ""
        rest = self._hold
        self._hold = ""
        self._decoder.reset()
        return self._emit(rest)

    def _emit(self, s: str) -> str:
        self.text += s
        return s

    def _partial_stop_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:k]):
                    best = k
                    break
        return best
