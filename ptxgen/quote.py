"""Bounded quotes of untrusted input (a spec's values, an archive's member names) for messages."""

from __future__ import annotations

import reprlib
from typing import Any

MAX_QUOTE = 300  # characters of the input a message may quote

_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict, _repr.maxlevel = 80, 80, 6, 6, 3


def clip(text: str) -> str:
    """One line of at most MAX_QUOTE characters (and a mark where it was cut)."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + "..."


def echo(value: Any) -> str:
    """A bounded repr of a value, cheap even on a huge one (reprlib stops early)."""
    return clip(_repr.repr(value))
