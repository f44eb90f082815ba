"""One stream's speculation state, held on its Stream (stream.drafting) while the stream may draft."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeinfer.speculative.control import Acceptance
from edgeinfer.speculative.ngram import NgramIndex


@dataclass(slots=True)
class Drafting:
    """What the speculator keeps of one stream between steps."""

    ngram: NgramIndex | None  # the stream's own tokens, indexed, where drafts come from n-grams
    accept: Acceptance
    rng: np.random.Generator  # rejection sampling's draws (--spec-verify rejection)
    q: np.ndarray | None = None  # laws the pending draft was drawn from (rejection sampling only)
