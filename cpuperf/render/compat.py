"""Pure rendering helpers for `cpuperf compat`: the matrix as rows or a rich Table, a Resolution as lines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cpuperf.knowledge.matrix import Matrix, python_range, spec_text
from cpuperf.knowledge.resolve import PIP_NAME, Resolution

if TYPE_CHECKING:  # rich is imported lazily: start-up stays fast for commands that never draw a table
    from rich.table import Table

MATRIX_COLUMNS = ("package", "version", "torch", "python", "where", "status")


def matrix_rows(matrix: Matrix) -> list[dict[str, str]]:
    """One dict per IPEX / oneccl_bind_pt release, newest first, for tables and --json."""
    rows: list[dict[str, str]] = []
    for r in sorted(matrix.ipex, key=lambda x: x.version, reverse=True):
        status = r.status
        if r.pypi and not r.pypi_yanked:
            status += ", on PyPI"
        elif r.pypi_yanked:
            status += ", yanked on PyPI"
        rows.append({
            "package": PIP_NAME["ipex"],
            "version": str(r.version),
            "torch": spec_text([r.torch]),
            "python": python_range(r.python),
            "where": r.index_url or "PyPI",
            "status": status,
        })
    for c in sorted(matrix.oneccl, key=lambda x: (x.version, x.device), reverse=True):
        rows.append({
            "package": PIP_NAME["oneccl"],
            "version": f"{c.version}{c.local if c.device != 'cpu' else ''}",
            "torch": spec_text(c.torch),
            "python": python_range(c.python),
            "where": c.index_url,
            "status": "release" if c.device == "cpu" else "XPU build (not for CPU)",
        })
    return rows


def torch_rows(matrix: Matrix) -> list[dict[str, str]]:
    """One dict per torch release, newest first: Python wheels and CUDA variants."""
    return [
        {
            "version": str(t.version),
            "python": python_range(t.python),
            "cuda": ", ".join(t.cuda) or "-",
            "cpu_index_url": t.cpu_index_url,
        }
        for t in sorted(matrix.torch, key=lambda x: x.version, reverse=True)
    ]


def matrix_table(matrix: Matrix, title: str = "Intel add-ons for PyTorch on CPU (IPEX, oneCCL bindings)") -> Table:
    """The add-on matrix as a rich Table (rich imported here, not at module load)."""
    from rich.table import Table

    table = Table(title=title)
    for col in MATRIX_COLUMNS:
        # names and versions stay whole; the long index URLs fold
        table.add_column(col, no_wrap=col in ("package", "version", "torch", "python"), overflow="fold")
    short = {PIP_NAME["ipex"]: "IPEX", PIP_NAME["oneccl"]: "oneCCL"}
    for row in matrix_rows(matrix):
        style = "dim" if "XPU" in row["status"] or "withdrawn" in row["status"] else None
        cells = dict(row, package=short.get(row["package"], row["package"]),
                     where=row["where"].replace("https://", ""))
        table.add_row(*(cells[c] for c in MATRIX_COLUMNS), style=style)
    return table


def resolution_lines(res: Resolution) -> list[str]:
    """Plain lines for a human: the pins, the pip commands, then every rejection and note."""
    lines: list[str] = [f"Python {res.python} on {res.platform}"]
    if res.torch is not None:
        lines.append(f"  torch {res.torch}  ({res.torch_index_url})")
    else:
        lines.append("  torch: none fits")
    for key in ("ipex", "oneccl"):
        if key not in res.want:
            continue
        pin = getattr(res, key)
        name = PIP_NAME[key]
        lines.append(f"  {name} {pin.version}  ({pin.index_url or 'PyPI'})" if pin else f"  {name}: none fits")
    argv = res.install_argv()
    if argv and res.ok:
        lines.append("Install:")
        lines.extend("  " + " ".join(["python", "-m", "pip", "install", *a]) for a in argv)
    if res.rejected:
        lines.append("Not chosen:")
        for r in res.rejected:
            what = f"{PIP_NAME.get(r.package, r.package)} {r.version}" if r.version else PIP_NAME.get(r.package, r.package)
            lines.append(f"  - {what}: {r.reason}")
    if res.notes:
        lines.append("Notes:")
        lines.extend(f"  - {n}" for n in res.notes)
    return lines
