"""Typed rows: the frozen dataclasses repositories return instead of driver records, so that the columns a
caller may read are declared in code (the pattern of procrastinate's ``Job.from_row``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Self, cast


class Row:
    """Mixin for a frozen dataclass whose fields are columns of a query's result."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """Build from ``row`` (an ``asyncpg.Record`` or mapping) by field name; extra columns are ignored.

        Raises ``KeyError`` when the row lacks a field's column.
        """
        # cast: mypy cannot tell that every subclass is a dataclass.
        return cls(**{field.name: row[field.name] for field in dataclasses.fields(cast(Any, cls))})
