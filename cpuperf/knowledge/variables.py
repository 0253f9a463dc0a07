"""THE table of process-environment variables (compat/variables.toml): which runtime reads each, the lever it
carries, its type and range, whether a plan may set it, whether it makes a runtime write files or load code, and
what the launch, the worker and the vendor scripts do with it. Loaded and checked once per process.

Every list of variable names in cpuperf is a read of this table (tests/test_variables.py fails on another one).
Light at import on purpose: ccl-env runs in every new shell; the file's parse is remembered (cpuperf.data), so a
warm run reads JSON and builds NamedTuples (a frozen dataclass costs ~5x more to define at import).
"""

from __future__ import annotations

import re
from typing import Dict, FrozenSet, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

from cpuperf.errors import BadDataError

FILE = "variables.toml"
SCHEMA = "cpuperf.variables/1"
# What each type's values are (a closed set: a row naming another is refused at load).
TYPES = ("threads", "count", "cpus", "time", "port", "host", "ifnames", "tuning", "malloc_conf", "preload",
         "path_list", "path")
RUNTIMES = ("openmp", "intel-openmp", "gnu-openmp", "mkl", "oneccl", "intel-mpi", "libfabric", "gloo",
            "open-mpi", "prrte", "hydra", "torch-distributed", "pytorch", "ideep", "loader", "jemalloc", "onednn", "python", "tools",
            "lightning")
_FLAGS = ("plan", "launch", "several_ranks", "meet", "binds_ranks", "writes_files", "loads_code", "report", "forward",
          "script_switch")
_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*")
_PREFIX = re.compile(r"[A-Z][A-Z0-9_]*_")


class Variable(NamedTuple):
    """One row: a variable by name."""

    name: str
    runtime: str
    type: str
    reason: str
    source: str
    lever: Optional[str] = None
    min: Optional[int] = None
    max: Optional[int] = None
    plan: bool = False
    launch: bool = False
    several_ranks: bool = False
    meet: bool = False
    binds_ranks: bool = False
    writes_files: bool = False
    loads_code: bool = False
    report: bool = False
    forward: bool = False
    script_switch: bool = False
    file_options: Tuple[str, ...] = ()


class Family(NamedTuple):
    """A prefix a runtime owns: its names that no row names are tuning text."""

    prefix: str
    runtime: str
    source: str
    plan: bool = False
    lever: Optional[str] = None


# A column's wanted value in names()/prefixes(): the value, or a tuple of values any of which will do.
Where = Union[str, bool, None, Tuple[str, ...]]


class Variables(NamedTuple):
    rows: Mapping[str, Variable]  # in the table's order
    families: Tuple[Family, ...]
    refused_parts: Tuple[str, ...]  # a family name holding one names a file or a tree, or writes one

    def row(self, name: str) -> Optional[Variable]:
        return self.rows.get(name)

    def names(self, **where: Where) -> Tuple[str, ...]:
        """The names of the rows whose columns have the given values (lever=("a", "b"): any of them)."""
        return tuple(v.name for v in self.rows.values() if _matches(v, where))

    def prefixes(self, **where: Where) -> Tuple[str, ...]:
        return tuple(f.prefix for f in self.families if _matches(f, where))

    def family(self, name: str) -> Optional[Family]:
        """The family `name` belongs to (its longest prefix), None when none."""
        found = [f for f in self.families if name.startswith(f.prefix)]
        return max(found, key=lambda f: len(f.prefix)) if found else None


def _matches(row: Union[Variable, Family], where: Mapping[str, Where]) -> bool:
    for key, want in where.items():
        got = getattr(row, key)
        if got not in want if isinstance(want, tuple) else got != want:
            return False
    return True


_MEMO: List[Variables] = []


def variables() -> Variables:
    """compat/variables.toml, loaded and checked once per process."""
    if not _MEMO:
        from cpuperf.data import load_builtin

        _MEMO.append(parse(load_builtin(FILE)))
    return _MEMO[0]


def parse(raw: Mapping[str, object], lever_ids: Optional[Iterable[str]] = None) -> Variables:
    """The table from its parsed TOML; BadDataError naming the first row that is not what the header says."""
    if raw.get("schema") != SCHEMA:
        raise _bad(f"schema {str(raw.get('schema'))[:40]!r}, expected {SCHEMA!r}")
    if lever_ids is None:
        from cpuperf.knowledge.knobs import DECISION_IDS

        lever_ids = DECISION_IDS
    levers = frozenset(lever_ids)
    rows: Dict[str, Variable] = {}
    for i, item in enumerate(_list(raw, "variable")):
        row = _variable(item, f"variable[{i}]", levers)
        if row.name in rows:
            raise _bad(f"variable[{i}]: {row.name} has a row already")
        rows[row.name] = row
    families = tuple(_family(item, f"family[{i}]", levers) for i, item in enumerate(_list(raw, "family")))
    if len({f.prefix for f in families}) != len(families):
        raise _bad("family: a prefix is given twice")
    table = raw.get("families")
    parts = table.get("refused_parts") if isinstance(table, dict) else None
    if not isinstance(parts, list) or not all(isinstance(p, str) and _NAME.fullmatch(p) for p in parts):
        raise _bad("families.refused_parts must be a list of upper-case name parts")
    return Variables(rows, families, tuple(parts))


def _bad(what: str) -> BadDataError:
    return BadDataError(f"malformed data file compat/{FILE}: {what}", hint="fix the row, or reinstall cpuperf")


def _list(raw: Mapping[str, object], key: str) -> List[object]:
    items = raw.get(key)
    if not isinstance(items, list) or not items:
        raise _bad(f"[[{key}]] rows are missing")
    return items


def _text(item: Mapping[str, object], key: str, where: str, pattern: Optional[re.Pattern[str]] = None) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip() or pattern is not None and not pattern.fullmatch(value):
        raise _bad(f"{where}.{key} must be " + ("a name like OMP_NUM_THREADS" if pattern is not None else "text"))
    return value


class _Common(NamedTuple):
    """The columns a variable's row and a family's share, checked."""

    item: Mapping[str, object]  # the row, a table
    runtime: str
    source: str
    lever: Optional[str]
    flags: Dict[str, bool]


def _common(item: object, where: str, levers: FrozenSet[str], keys: Tuple[str, ...]) -> _Common:
    if not isinstance(item, dict):
        raise _bad(f"{where} is not a table")
    unknown = sorted(set(item) - set(keys))
    if unknown:
        raise _bad(f"{where}: unknown key {unknown[0]!r}")
    runtime = _text(item, "runtime", where)
    if runtime not in RUNTIMES:
        raise _bad(f"{where}.runtime {runtime[:40]!r} is not one of {', '.join(RUNTIMES)}")
    source = _text(item, "source", where)
    if "http" not in source:
        raise _bad(f"{where}.source must cite the documentation by its address")
    lever = item.get("lever")
    if lever is not None and lever not in levers:
        raise _bad(f"{where}.lever {str(lever)[:40]!r} is not a lever (cpuperf.decide.records.Levers)")
    flags: Dict[str, bool] = {}
    for k in _FLAGS:
        value = item.get(k, False)
        if k in keys and not isinstance(value, bool):
            raise _bad(f"{where}.{k} must be true or false")
        if k in keys:
            flags[k] = bool(value)
    return _Common(item, runtime, source, None if lever is None else str(lever), flags)


_VARIABLE_KEYS = ("name", "runtime", "type", "reason", "source", "lever", "min", "max", "file_options", *_FLAGS)


def _variable(raw: object, where: str, levers: FrozenSet[str]) -> Variable:
    common = _common(raw, where, levers, _VARIABLE_KEYS)
    item = common.item
    name = _text(item, "name", where, _NAME)
    kind = _text(item, "type", where)
    if kind not in TYPES:
        raise _bad(f"{where} ({name}).type {kind[:40]!r} is not one of {', '.join(TYPES)}")
    low, high = item.get("min"), item.get("max")
    if low is None and high is None:
        low = high = None
    elif not (type(low) is int and type(high) is int and 0 <= low <= high):
        raise _bad(f"{where} ({name}): min and max are whole numbers, both or neither, min <= max")
    if kind in ("threads", "count", "port") and low is None:
        raise _bad(f"{where} ({name}): a {kind} needs its range (min, max)")
    options = item.get("file_options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) and o for o in options):
        raise _bad(f"{where} ({name}).file_options must be a list of option names")
    if common.flags["plan"] and (common.flags["writes_files"] and not options):
        raise _bad(f"{where} ({name}): a variable that makes its runtime write files is never a plan's")
    return Variable(name=name, type=kind, reason=_text(item, "reason", where), min=low, max=high,
                    file_options=tuple(options), runtime=common.runtime, source=common.source, lever=common.lever,
                    **common.flags)


def _family(raw: object, where: str, levers: FrozenSet[str]) -> Family:
    common = _common(raw, where, levers, ("prefix", "runtime", "source", "lever", "plan"))
    return Family(prefix=_text(common.item, "prefix", where, _PREFIX), runtime=common.runtime, source=common.source,
                  lever=common.lever, plan=common.flags["plan"])


# -- values, typed per row ---------------------------------------------------------------------------------------

_WHOLE = re.compile(r"0|[1-9][0-9]{0,8}")
_CPU_LIST = re.compile(r"auto|[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*")
_TIME = re.compile(r"infinite|[0-9]{1,9}(ms|us|s)?")
_IFNAMES = re.compile(r"[A-Za-z0-9_.:@-]{1,15}(,[A-Za-z0-9_.:@-]{1,15})*")  # IFNAMSIZ 16 incl. NUL
TUNING_TEXT = re.compile(r"[A-Za-z0-9_.,:/+=@%\[\]-]*")  # oneCCL, Intel MPI, OpenMP and libfabric knobs
_TUNING_WHY = "not a value this setting takes (letters, digits and _.,:/+=@%[]- only)"


def _in_range(text: str, row: Variable) -> bool:
    return bool(_WHOLE.fullmatch(text)) and (row.min or 0) <= int(text) <= (row.max if row.max is not None else 10**9)


def value_problem(name: str, value: str) -> Optional[str]:
    """Why `value` is not a value of variable `name` by its row's type and range, or as its family's tuning text
    (None: it is, or the table does not type it: a path list, a name of no row or family)."""
    table = variables()
    row = table.row(name)
    if row is None:
        if table.family(name) is None or name.endswith("PATH"):  # a family's own list of paths: not tuning text
            return None
        return None if TUNING_TEXT.fullmatch(value) else _TUNING_WHY
    kind = row.type
    if kind == "threads":
        ok = all(_in_range(part, row) for part in value.split(","))
        return None if ok else f"not a positive whole number up to {row.max} (or a list such as 4,2)"
    if kind == "port":
        return None if _in_range(value, row) else f"not a port in {row.min}..{row.max}"
    if kind == "count":
        return None if _in_range(value, row) else f"not a whole number in {row.min}..{row.max}"
    if kind == "cpus":
        return None if _CPU_LIST.fullmatch(value) else "not 'auto' or a list of CPUs (0,1,4-7)"
    if kind == "time":
        return None if _TIME.fullmatch(value) else "not a time (0, 200ms, infinite)"
    if kind == "ifnames":
        return None if _IFNAMES.fullmatch(value) else "not a network interface name"
    if kind == "host":
        from cpuperf.probe.hosts import valid_host

        return None if valid_host(value) else "not a host name or IP address"
    if kind in ("tuning", "malloc_conf"):
        return None if TUNING_TEXT.fullmatch(value) else _TUNING_WHY
    return None  # preload, path_list, path: checked where a plan carries them (cpuperf.plan.saved)


def file_option(row: Variable, value: str) -> Optional[str]:
    """The option of `value` that makes the runtime write files (jemalloc's prof*), None when none."""
    for option in value.split(","):
        key = option.split(":", 1)[0].strip()
        if any(key.startswith(stem) for stem in row.file_options):
            return key
    return None
