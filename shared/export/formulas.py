"""Which CSV cells a spreadsheet would run as a formula, and the guard that makes them show as text (docs/api.md:
Submitting an export, Export options; OWASP, "CSV injection").

Several spreadsheet programs trim leading white space and invisible characters and fold full-width or small
forms before they decide that a cell is a formula, so the rule looks at the first character that is none of
those, as the program would see it after Unicode NFKC folding.
"""

from __future__ import annotations

import unicodedata

FORMULA_GUARD = "'"
# A cell starting with one of these is guarded whatever follows: tab and CR because some programs read them
# as the start of a formula, the guard itself so that removing one leading guard always gives the text back.
_GUARDED_FIRST = ("\t", "\r", FORMULA_GUARD)
_FORMULA_SIGNS = ("=", "+", "-", "@")
# Format characters (zero-width space, BOM, direction marks) and space or line separators.
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp"})


def reads_as_formula(cell: str) -> bool:
    """True when a spreadsheet could run ``cell`` (any text) as a formula: its first character is a tab, a
    CR or ``FORMULA_GUARD``, or its first character that is neither white space (``str.isspace()``) nor of
    Unicode category Cf, Zs, Zl or Zp folds under NFKC to text that starts with ``=``, ``+``, ``-`` or ``@``
    (the full-width U+FF1D, the small U+FE62, the superscript U+207C; U+2A75 folds to ``==``). Raises
    nothing.
    """
    if cell.startswith(_GUARDED_FIRST):
        return True
    first = cell[:1]
    if not first.isascii() or first.isspace():
        # The common case, a cell starting with ASCII other than white space, skips this: no such character
        # is of the skipped categories, and NFKC leaves ASCII as it is.
        first = unicodedata.normalize("NFKC", _first_visible(cell))
    return first.startswith(_FORMULA_SIGNS)


def _first_visible(cell: str) -> str:
    # A loop over the leading run only: a cell is a message's text, so this is bounded by its size, and no
    # process pays for a table of every such character in the whole of Unicode.
    for char in cell:
        if not (char.isspace() or unicodedata.category(char) in _INVISIBLE_CATEGORIES):
            return char
    return ""


def guarded(cell: str) -> str:
    """``cell`` with ``FORMULA_GUARD`` in front when ``reads_as_formula(cell)``, else ``cell`` itself; the
    text is otherwise unchanged, so removing one leading guard from a cell that starts with one gives it back.
    """
    return FORMULA_GUARD + cell if reads_as_formula(cell) else cell
