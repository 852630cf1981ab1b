"""Tables for people: boxed by rich on a terminal, plain aligned columns in pipes and files (never
wrapped or cut, so logs keep every figure and scripts can read them)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def print_table(title: str, columns: list[str], rows: list[list[str]], console: Console | None = None) -> None:
    """On `console` (standard output's by default). Cells are plain text (no markup); a cell may
    hold several lines."""
    console = console or Console(highlight=False, soft_wrap=True)
    if console.is_terminal:
        table = Table(*columns, title=title or None)
        for row in rows:
            table.add_row(*(escape(str(cell)) for cell in row))
        console.print(table)
        return
    lines_of = [[str(cell).split("\n") for cell in row] for row in [columns, *rows]]
    widths = [max(len(line) for row in lines_of for line in row[column]) for column in range(len(columns))]
    lines = [title] if title else []
    for row in lines_of:
        for index in range(max(len(cell) for cell in row)):
            lines.append("  ".join((cell[index] if index < len(cell) else "").ljust(width)
                                   for cell, width in zip(row, widths)).rstrip())
    console.file.write("\n".join(lines) + "\n")
