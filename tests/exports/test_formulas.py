"""The CSV formula rule on its own (docs/api.md: Submitting an export, Export options): which cells get the guard, and
that the guard is the only change.
"""

from __future__ import annotations

import pytest

from shared.export.formulas import guarded, reads_as_formula
from tests.support.exported_files import FORMULAS

# Beyond the forms every export test uses: each sign in full-width and small forms, superscript, a sign whose
# NFKC form is two signs, and every kind of character the rule skips before the sign.
READ_AS_FORMULAS = [
    *FORMULAS,
    "'",
    "\uff0b1",
    "\uff0d1",
    "\uff20SUM(A1)",
    "\ufe66 small equals",
    "\u207c superscript equals",
    "\u2a75 folds to ==",
    " \u3000\u2028\u2029\u200f\u2060\v\f\x1c\x85=1",
    "\r\n=1",
    "\t",
]

TEXT = [
    "plain",
    "",
    " ",
    "\u200b\ufeff",
    "a=1",
    "1+1",
    " 'not first",
    "\u00a0x = 1",
    "x\uff1d",
    "\u2212 minus sign, which NFKC does not fold",
]


@pytest.mark.parametrize("cell", READ_AS_FORMULAS)
def test_a_cell_that_may_run_as_a_formula_gets_one_leading_guard_and_is_otherwise_unchanged(cell: str) -> None:
    assert reads_as_formula(cell)
    assert guarded(cell) == "'" + cell


@pytest.mark.parametrize("cell", TEXT)
def test_a_cell_that_reads_as_text_stays_as_it_is(cell: str) -> None:
    assert not reads_as_formula(cell)
    assert guarded(cell) == cell


def test_a_long_run_of_invisible_characters_before_the_sign_is_seen_through() -> None:
    assert guarded("\u200b \u00a0" * 100_000 + "\uff1d1") == "'" + "\u200b \u00a0" * 100_000 + "\uff1d1"
