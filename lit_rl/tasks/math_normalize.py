"""Hendrycks-style answer normalisation for MATH (``strip_string`` / ``is_equiv``).

A re-implementation of the rules in the MATH repository's ``math_equivalence.py`` as d1/SPG ship them
(``eval/parser_helper.py`` and ``diffu-grpo/math500_utils.py``), including where they give up: the
reference helpers raise on some inputs (``\\frac`` or ``\\sqrt`` at the very end, two ``"\\text{ "``
unit markers, an ``a/b`` whose parts ``int()`` rejects), and ``is_equiv`` then falls back to comparing
the raw strings. :class:`_GiveUp` plays that role here, so the same pairs compare equal. Pure string
operations, linear in the input; no sympy, nothing executed.
"""

from __future__ import annotations


class _GiveUp(Exception):
    """Raised where the reference normaliser raises; ``is_equiv`` then compares raw strings."""


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}; a one-character tail leaves the string unchanged
    parts = s.split("\\frac")
    if len(parts) == 1:
        return s
    out = [parts[0]]
    for sub in parts[1:]:
        out.append("\\frac")
        if not sub:
            raise _GiveUp("\\frac at end")  # reference: IndexError on substr[0]
        if sub[0] == "{":
            out.append(sub)
            continue
        if len(sub) < 2:
            return s
        a, b, rest = sub[0], sub[1], sub[2:]
        out.append("{" + a + "}{" + b + "}" + rest if b != "{" else "{" + a + "}" + b + rest)
    return "".join(out)


def _fix_a_slash_b(s: str) -> str:
    # "3/4" -> \frac{3}{4} only for plain integers written canonically
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError as e:  # the reference lets this escape to is_equiv
        raise _GiveUp("a/b not integers") from e
    if s != f"{a}/{b}":
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(s: str) -> str:
    # "\text{ " only ever marks units in MATH answers
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise _GiveUp("several unit markers")
        return parts[0]
    return s


def _fix_sqrt(s: str) -> str:
    # \sqrt3 -> \sqrt{3}
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = [parts[0]]
    for sub in parts[1:]:
        if not sub:
            raise _GiveUp("\\sqrt at end")  # reference: IndexError on split[0]
        out.append("\\sqrt{" + sub[0] + "}" + sub[1:] if sub[0] != "{" else "\\sqrt" + sub)
    return "".join(out)


def strip_string(s: str) -> str:
    """Normalise a MATH answer string (Hendrycks ``strip_string``). May raise ``_GiveUp``."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    eq = s.split("=")
    if len(eq) == 2 and len(eq[0]) <= 2:  # drop "k = " style prefixes
        s = eq[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """Reference ``is_equiv``: equal after ``strip_string``; raw equality where normalising gives up.

    >>> is_equiv("\\\\dfrac{1}{2}", "0.5"), is_equiv("x = 3", "3"), is_equiv("\\\\frac", "\\\\frac")
    (True, True, True)
    """
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    try:
        return strip_string(str1) == strip_string(str2)
    except (_GiveUp, RecursionError, MemoryError):
        return str1 == str2
