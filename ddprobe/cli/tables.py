"""Tables that fit the terminal: each column has a priority, and where the whole table is wider than the
terminal the columns of the highest priority numbers are left out first (never the key columns, priority 0),
so the cells that stay are whole (never ``2.…``). One helper for every table of the CLI but ``commit``'s (which has
narrow headers of its own); the columns left out are named in a line below the table.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table

GAP = 3  # columns between two cells: a pad each side and the box's divider (a space)
EDGES = 2  # the box's left and right edge (a space each; pad_edge off: no padding beside them)
WRAP_MIN = 24  # a wrapping column (free text) is counted at this width at most: it wraps below it


@dataclass(frozen=True)
class Col:
    header: str
    priority: int = 0  # 0: a key column, always kept; higher numbers are left out first
    justify: str = "right"
    wrap: bool = False  # free text that may wrap (counted at WRAP_MIN at most)


def _width(col: Col, cells: list[str]) -> int:
    w = max([cell_len(col.header), *(cell_len(c) for c in cells)])
    return min(w, WRAP_MIN) if col.wrap else w


def natural_width(cols: list[Col], rows: list[list[str]], keep: list[int] | None = None) -> int:
    """Terminal columns the table takes with the columns ``keep`` (default all) at their natural widths."""
    keep = list(range(len(cols))) if keep is None else keep
    return sum(_width(cols[i], [r[i] for r in rows]) for i in keep) + GAP * (len(keep) - 1) + EDGES


def kept(cols: list[Col], rows: list[list[str]], width: int) -> list[int]:
    """Indices of the columns that fit in ``width`` terminal columns: every one when they all fit, else the
    columns of the highest priority number dropped first (the rightmost of a priority first), priority 0 never."""
    keep = list(range(len(cols)))
    for i in sorted(range(len(cols)), key=lambda i: (-cols[i].priority, -i)):
        if natural_width(cols, rows, keep) <= width or cols[i].priority == 0:
            break
        keep.remove(i)
    return keep


def fitted_table(title: str, cols: list[Col], rows: list[list[str]], width: int,
                 styles: list[str] | None = None) -> tuple[Table, list[str]]:
    """A rich Table of ``rows`` (cells in ``cols`` order) that fits ``width`` columns, and the headers of the
    columns left out (empty when all fit). ``styles``: one rich style per row."""
    keep = kept(cols, rows, width)
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i in keep:
        t.add_column(cols[i].header, justify=cols[i].justify, no_wrap=not cols[i].wrap)
    for k, r in enumerate(rows):
        t.add_row(*[r[i] for i in keep], style=styles[k] if styles else None)
    return t, [c.header for i, c in enumerate(cols) if i not in keep]


def left_out_line(headers: list[str]) -> str | None:
    """The line below a narrowed table naming the columns it left out (None when none was)."""
    if not headers:
        return None
    return f"(narrow terminal: {', '.join(headers)} left out; widen it, or COLUMNS=200)"


def print_fitted(title: str, cols: list[Col], rows: list[list[str]], styles: list[str] | None = None) -> None:
    """``fitted_table`` at the width of the terminal we print to, printed, with the line naming what it left out.
    Output that is no terminal (a pipe, a file) and no COLUMNS: every column, the table as wide as it needs."""
    import os

    from .options import columns, out

    if out.is_terminal or os.environ.get("COLUMNS"):
        table, gone = fitted_table(title, cols, rows, columns(), styles)
        out.print(table)
    else:
        table, gone = fitted_table(title, cols, rows, 1 << 20, styles)
        page = out.width
        out.width = max(page, natural_width(cols, rows))  # print clips to the console's width: widen it for this
        try:
            with out.capture() as cap:
                out.print(table)
        finally:
            out.width = page
        # a pipe or a file gets the lines without the padding rich adds (no trailing spaces, no blank last line)
        text = "\n".join(line.rstrip() for line in cap.get().rstrip().splitlines())
        out.print(text, highlight=False, markup=False, soft_wrap=True)
    line = left_out_line(gone)
    if line:
        out.print(line, highlight=False, style="dim")
