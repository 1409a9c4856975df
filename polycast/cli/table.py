"""One way to print a table: rich when it is installed (the `cli` extra), else aligned text."""

from __future__ import annotations

import sys


def print_table(title: str, columns: list[str], rows: list[list[object]],
                right: set[str] | None = None, file=None) -> None:
    """Print ``rows`` under ``columns``; columns named in ``right`` (default: every column
    whose cells are all numbers) are right-aligned."""
    file = file or sys.stdout
    cells = [[_fmt(v) for v in row] for row in rows]
    if right is None:
        right = {c for i, c in enumerate(columns)
                 if rows and all(isinstance(r[i], (int, float)) for r in rows)}
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    if Console is not None:
        table = Table(title=title, title_justify="left", header_style="bold")
        for c in columns:
            table.add_column(c, justify="right" if c in right else "left")
        for row in cells:
            table.add_row(*row)
        Console(file=file, width=max(100, _width(columns, cells))).print(table)
        return
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c)
              for i, c in enumerate(columns)]

    def line(vals):
        return "  ".join(v.rjust(w) if c in right else v.ljust(w)
                         for v, w, c in zip(vals, widths, columns)).rstrip()
    if title:
        print(title, file=file)
    print(line(columns), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in cells:
        print(line(row), file=file)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-3 or abs(v) >= 1e6 else f"{v:.3f}".rstrip("0").rstrip(".")
    return str(v)


def _width(columns, cells) -> int:
    return sum(max(len(c), *(len(r[i]) for r in cells)) if cells else len(c)
               for i, c in enumerate(columns)) + 3 * len(columns) + 4
