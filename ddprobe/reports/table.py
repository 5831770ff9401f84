"""A report's table: title, columns, rows of text, a note. Its own module so that the sections and the per-kind
renderers (``reports.trace``) share it without importing each other."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
