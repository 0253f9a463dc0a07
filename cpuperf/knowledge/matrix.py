"""Load and validate the compatibility data in compat/*.toml into typed, frozen rows.

The data (not this module) is the knowledge: every row names its `source`. This module only parses,
checks and indexes it. A malformed data set raises one MatrixError listing every bad row.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import date, timedelta
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, TypeVar, Union

from packaging.version import Version

if TYPE_CHECKING:  # packaging.specifiers costs more to import than typer and rich together: not for ccl-env
    from packaging.specifiers import SpecifierSet

from cpuperf.data import MAX_DEPTH, too_deep
from cpuperf.errors import BadDataError
from cpuperf.versions import base_of, numeric_version, version_or_none

try:  # Python 3.11+; not a version check: the node probe bundle runs where tomllib may be absent
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python < 3.11, or the bundle's JSON stand-in
    import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]

ENV_DIR = "CPUPERF_COMPAT_DIR"
PY_RE = re.compile(r"^3\.(\d{1,2})(t?)$")
_DATE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})?$")
_MONTH_OR_DATE_RE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])(-\d{2})?$")


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One bad row: which file, which row, what is wrong."""

    file: str
    row: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.row}: {self.problem}"


class MatrixError(BadDataError):
    """The compat data is malformed or unreadable (exit 6); `problems` lists every bad row, not just the first."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(problems)
        listed = "; ".join(str(p) for p in self.problems)  # one line: the error boundary prints one
        super().__init__(f"{len(self.problems)} problem(s) in the compatibility data: {listed}",
                         hint=f"fix the listed rows, or unset {ENV_DIR}")


# --------------------------------------------------------------------------- rows


def python_key(py: str) -> tuple[int, int]:
    """Sort key for '3.N' / '3.Nt' strings."""
    m = PY_RE.match(py)
    if not m:
        return (99, 0)
    return (int(m.group(1)), 1 if m.group(2) else 0)


def python_range(pys: Iterable[str]) -> str:
    """'3.9–3.13' (plus free-threaded builds) for messages."""
    std = sorted((p for p in pys if not p.endswith("t")), key=python_key)
    ft = sorted((p for p in pys if p.endswith("t")), key=python_key)
    if not std and not ft:
        return "none"
    text = std[0] if len(std) == 1 else (f"{std[0]}–{std[-1]}" if std else "")
    if ft:
        text = f"{text}, {', '.join(ft)}" if text else ", ".join(ft)
    return text


def spec_text(specs: Iterable[object]) -> str:
    """Human form of torch specifiers: '==2.8.*' -> '2.8.*', '==1.12.0' -> '1.12.0'."""
    out = []
    for s in specs:
        text = str(s)
        out.append(text[2:] if text.startswith("==") and "," not in text else text)
    return " or ".join(out)


@dataclass(frozen=True)
class TorchRelease:
    """One torch release: which CPython wheels exist, which CUDA variants are served."""

    version: Version
    python: frozenset[str]
    python_aarch64: frozenset[str]
    cuda: tuple[str, ...]
    cpu_index_url: str
    source: str
    reason: str = ""
    pypi_aarch64: str = "cpu"  # what the registry's plain Linux aarch64 wheel is: 'cpu', or 'cuda' (from 2.11)

    def pythons(self, platform: str) -> frozenset[str]:
        """CPython versions with a wheel on `platform`."""
        return self.python_aarch64 if platform == "linux_aarch64" else self.python


@dataclass(frozen=True)
class CudaVariant:
    """A cuXYZ wheel flavour and the Linux driver it needs."""

    tag: str
    cuda: str
    min_driver_linux: str
    toolkit_driver_linux: str
    index_url: str
    source: str
    reason: str = ""


@dataclass(frozen=True)
class IpexRelease:
    """One CPU release of intel_extension_for_pytorch."""

    version: Version
    torch: SpecifierSet
    built_against: Version | None
    python: frozenset[str]
    pypi: bool
    pypi_yanked: bool
    yank_reason: str
    index_url: str
    index_kind: str
    local: str
    import_check: str
    status: str
    released: str
    source: str
    reason: str = ""


@dataclass(frozen=True)
class OnecclRelease:
    """One release of the oneCCL bindings (oneccl_bind_pt / torch_ccl), CPU or XPU build."""

    version: Version
    device: str
    torch: tuple[SpecifierSet, ...]
    python: frozenset[str]
    index_url: str
    index_kind: str
    import_name: str
    local: str
    source: str
    reason: str = ""

    def accepts(self, torch: Version) -> bool:
        """True when any documented torch specifier matches `torch` (local labels ignored)."""
        return any(s.contains(torch, prereleases=True) for s in self.torch)


@dataclass(frozen=True)
class TorchPin:
    """The newest torch a retired add-on covers: '==2.8.*' (a minor series) or '==2.7.0' (one release)."""

    text: str  # as written, e.g. '==2.8.*'

    @property
    def version(self) -> Version:
        return Version(self.text[2:].strip().rstrip(".*"))

    def contains(self, version: Version, prereleases: bool = True) -> bool:
        """PEP 440 '==' semantics for these two forms (a prefix match for '.*')."""
        release = base_of(version).release
        pin = self.version.release
        if self.text.rstrip().endswith(".*"):
            return release[:len(pin)] == pin
        return release + (0,) * (len(pin) - len(release)) == pin + (0,) * (len(release) - len(pin))

    def __iter__(self) -> Iterator[TorchPin]:  # iterable like a one-clause SpecifierSet
        return iter((self,))

    def __str__(self) -> str:
        return self.text.replace(" ", "")


_PIN_RE = re.compile(r"^==\s*\d+(\.\d+)*(\.\*)?$")


@dataclass(frozen=True)
class EolNotice:
    """A retired component: last release, newest torch it covers, and what to use instead."""

    component: str
    status: str
    last_release: Version
    last_torch: TorchPin
    announced: str
    end_of_support: str
    alternative: str
    source: str
    reason: str = ""


@dataclass(frozen=True)
class PythonEol:
    """A CPython minor version's end of life, as its release PEP schedules it: a month ('2026-10') or a day."""

    python: str  # '3.10'
    end_of_life: str  # 'YYYY-MM' (the PEP's month) or 'YYYY-MM-DD' (the day it happened)
    source: str
    reason: str = ""

    def last_day(self) -> date:
        """The last day of support: the day given, or the last day of the month given."""
        parts = [int(p) for p in self.end_of_life.split("-")]
        if len(parts) == 3:
            return date(parts[0], parts[1], parts[2])
        year, month = parts
        first_of_next = date(year + month // 12, month % 12 + 1, 1)
        return first_of_next - timedelta(days=1)


@dataclass(frozen=True)
class HfOption:
    """A transformers/accelerate option with the releases that added, deprecated and removed it."""

    package: str
    name: str
    kind: str
    introduced: Version | None
    deprecated: Version | None
    removed: Version | None
    replacement: str
    source: str
    reason: str = ""
    verified: bool = False  # only verified rows are rendered as flags or config keys

    def valid_in(self, version: Version) -> bool:
        """True when `version` has this option: introduced <= version < removed (an unverified row: never)."""
        v = base_of(version)
        return self.verified and (self.introduced is None or v >= self.introduced) and \
            (self.removed is None or v < self.removed)


@dataclass(frozen=True)
class HfData:
    """The newest release of a package that the hf rows were checked against."""

    package: str
    through: Version
    source: str
    reason: str = ""


@dataclass(frozen=True)
class Matrix:
    """All compat rows, sorted oldest to newest; `files` says where they came from."""

    torch: tuple[TorchRelease, ...]
    cuda: tuple[CudaVariant, ...]
    ipex: tuple[IpexRelease, ...]
    oneccl: tuple[OnecclRelease, ...]
    eol: tuple[EolNotice, ...]
    hf: tuple[HfOption, ...]
    hf_data: tuple[HfData, ...] = ()
    python_eol: tuple[PythonEol, ...] = ()
    files: tuple[str, ...] = ()

    def python_end_of_life(self, python: str) -> PythonEol | None:
        """The end-of-life row of a CPython minor ('3.10', or '3.13t': the same interpreter release), or None."""
        minor = python.removesuffix("t")
        for row in self.python_eol:
            if row.python == minor:
                return row
        return None

    def hf_through(self, package: str) -> Version | None:
        """The newest `package` release the hf rows were checked against; None = unknown."""
        for row in self.hf_data:
            if row.package == package:
                return row.through
        return None

    def torch_release(self, version: Version) -> TorchRelease | None:
        """The torch row for `version` (local label ignored), or None."""
        base = base_of(version)
        for row in self.torch:
            if row.version == base:
                return row
        return None

    def eol_notice(self, component: str) -> EolNotice | None:
        """The end-of-life row for 'ipex' or 'oneccl', if any."""
        for row in self.eol:
            if row.component == component:
                return row
        return None

    def cuda_variant(self, tag: str) -> CudaVariant | None:
        """The cuXYZ row, or None."""
        for row in self.cuda:
            if row.tag == tag:
                return row
        return None


# --------------------------------------------------------------------------- field parsers

T = TypeVar("T")
Parser = Callable[[object], T]


class _Bad(Exception):
    """A field failed to parse; the message is the problem text."""


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise _Bad(f"expected a string, got {type(value).__name__}")
    return value


def _build_kind(value: object) -> str:
    text = _str(value)
    if text not in ("cpu", "cuda"):
        raise _Bad(f"{text!r} is not 'cpu' or 'cuda'")
    return text


def _nonempty(value: object) -> str:
    text = _str(value)
    if not text.strip():
        raise _Bad("must not be empty")
    return text


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"expected true/false, got {value!r}")
    return value


def _version(value: object) -> Version:
    text = _nonempty(value)
    version = version_or_none(text)
    if version is None:
        raise _Bad(f"{text!r} is not a PEP 440 version")
    return version


def _opt_version(value: object) -> Version | None:
    text = _str(value)
    return _version(text) if text else None


def _spec(value: object) -> SpecifierSet:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    text = _nonempty(value)
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise _Bad(f"{text!r} is not a PEP 440 specifier") from None


def _spec_list(value: object) -> tuple[SpecifierSet, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise _Bad("expected a specifier or a non-empty list of specifiers")
    return tuple(_spec(v) for v in items)


def _pythons(value: object) -> frozenset[str]:
    if not isinstance(value, list):
        raise _Bad("expected a list of Python versions like \"3.11\"")
    good = [v for v in value if isinstance(v, str) and PY_RE.match(v)]
    if len(good) != len(value):
        bad = [v for v in value if not isinstance(v, str) or not PY_RE.match(v)]
        raise _Bad(f"not Python versions of the form 3.N or 3.Nt: {bad!r}")
    return frozenset(good)


def _str_list(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _Bad("expected a list of strings")
    items = [v for v in value if isinstance(v, str)]
    if len(items) != len(value):
        raise _Bad("expected a list of strings")
    return tuple(items)


def _url(value: object) -> str:
    text = _str(value)
    if text and not re.match(r"^https?://\S+$", text):
        raise _Bad(f"{text!r} is not an http(s) URL")
    return text


def _date(value: object) -> str:
    text = _str(value)
    if not _DATE_RE.match(text):
        raise _Bad(f"{text!r} is not a YYYY-MM-DD date")
    return text


def _month_or_date(value: object) -> str:
    text = _nonempty(value)
    if not _MONTH_OR_DATE_RE.match(text):
        raise _Bad(f"{text!r} is not a YYYY-MM month or a YYYY-MM-DD date")
    if text.count("-") == 2:
        try:
            date.fromisoformat(text)
        except ValueError:
            raise _Bad(f"{text!r} is not a calendar date") from None
    return text


def _minor_python(value: object) -> str:
    text = _nonempty(value)
    if not re.match(r"^3\.\d{1,2}$", text):
        raise _Bad(f"{text!r} is not a CPython minor version like \"3.10\"")
    return text


def _choice(*allowed: str) -> Parser[str]:
    def parse(value: object) -> str:
        text = _str(value)
        if text not in allowed:
            raise _Bad(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return parse


def _driver(value: object) -> str:
    text = _str(value)
    if text and not re.match(r"^\d+(\.\d+)*$", text):
        raise _Bad(f"{text!r} is not a driver version like 525.60.13")
    return text


_INDEX_KIND = _choice("find-links", "extra-index-url", "index-url")
_HF_PACKAGE = _choice("transformers", "accelerate")
_NO_VERSION = Version("0")


def _torch_pin(value: object) -> TorchPin:
    text = _nonempty(value).strip()
    if not _PIN_RE.match(text):
        raise _Bad(f"{text!r}: give the newest torch as '==X.Y.*' or '==X.Y.Z'")
    return TorchPin(text)


# --------------------------------------------------------------------------- rows, field by field

Row = Union[TorchRelease, CudaVariant, IpexRelease, OnecclRelease, EolNotice, HfOption, HfData, PythonEol]
RowKey = tuple[Union[str, Version], ...]


class _Fields:
    """One [[kind]] row read field by field into its record. A field that is missing or does not parse is a problem,
    and a stand-in of its type takes its place, so one pass finds every problem of the row (the record is then
    dropped). An optional field that is absent takes the file's default, else the record's."""

    def __init__(self, raw: Mapping[str, object], defaults: Mapping[str, str]):
        self.raw = raw
        self.defaults = defaults
        self.read: list[str] = []
        self.problems: list[str] = []

    def need(self, name: str, parse: Parser[T], stand_in: T) -> T:
        """A required field."""
        self.read.append(name)
        if name not in self.raw:
            self.problems.append(f"missing required field {name!r}")
            return stand_in
        return self._parse(name, parse, stand_in)

    def may(self, name: str, parse: Parser[T], default: T) -> T:
        """An optional field; absent, the record's default."""
        self.read.append(name)
        if name not in self.raw:
            return default
        return self._parse(name, parse, default)

    def url(self, name: str, default: str) -> str:
        """An optional URL that a file may set for all of its rows (a top-level scalar)."""
        return self.may(name, _url, self.defaults.get(name, default))

    def _parse(self, name: str, parse: Parser[T], stand_in: T) -> T:
        try:
            return parse(self.raw[name])
        except _Bad as exc:
            self.problems.append(f"{name}: {exc}")
            return stand_in

    def unknown(self) -> list[str]:
        return [f"unknown field {name!r}" for name in self.raw if name not in self.read]


def _torch(f: _Fields) -> TorchRelease:
    return TorchRelease(
        version=f.need("version", _version, _NO_VERSION),
        python=f.need("python", _pythons, frozenset()),
        python_aarch64=f.may("python_aarch64", _pythons, frozenset()),
        cuda=f.may("cuda", _str_list, ()),
        cpu_index_url=f.url("cpu_index_url", _DEFAULT_CPU_INDEX),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
        pypi_aarch64=f.may("pypi_aarch64", _build_kind, "cpu"),
    )


def _cuda(f: _Fields) -> CudaVariant:
    return CudaVariant(
        tag=f.need("tag", _nonempty, ""),
        cuda=f.need("cuda", _nonempty, ""),
        min_driver_linux=f.need("min_driver_linux", _driver, ""),
        toolkit_driver_linux=f.may("toolkit_driver_linux", _driver, ""),
        index_url=f.need("index_url", _url, ""),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
    )


def _ipex(f: _Fields) -> IpexRelease:
    from packaging.specifiers import SpecifierSet

    return IpexRelease(
        version=f.need("version", _version, _NO_VERSION),
        torch=f.need("torch", _spec, SpecifierSet()),
        built_against=f.may("built_against", _opt_version, None),
        python=f.need("python", _pythons, frozenset()),
        pypi=f.need("pypi", _bool, False),
        pypi_yanked=f.need("pypi_yanked", _bool, False),
        yank_reason=f.may("yank_reason", _str, ""),
        index_url=f.need("index_url", _url, ""),
        index_kind=f.need("index_kind", _INDEX_KIND, ""),
        local=f.may("local", _str, ""),
        import_check=f.need("import_check", _choice("none", "exit127", "attributeerror"), ""),
        status=f.need("status", _choice("release", "withdrawn"), ""),
        released=f.may("released", _date, ""),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
    )


def _oneccl(f: _Fields) -> OnecclRelease:
    return OnecclRelease(
        version=f.need("version", _version, _NO_VERSION),
        device=f.need("device", _choice("cpu", "xpu"), ""),
        torch=f.need("torch", _spec_list, ()),
        python=f.need("python", _pythons, frozenset()),
        index_url=f.need("index_url", _url, ""),
        index_kind=f.need("index_kind", _INDEX_KIND, ""),
        import_name=f.need("import_name", _choice("torch_ccl", "oneccl_bindings_for_pytorch"), ""),
        local=f.may("local", _str, ""),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
    )


def _eol(f: _Fields) -> EolNotice:
    return EolNotice(
        component=f.need("component", _choice("ipex", "oneccl"), ""),
        status=f.need("status", _choice("archived", "deprecated", "end-of-life"), ""),
        last_release=f.need("last_release", _version, _NO_VERSION),
        last_torch=f.need("last_torch", _torch_pin, TorchPin("==0")),
        announced=f.may("announced", _date, ""),
        end_of_support=f.may("end_of_support", _date, ""),
        alternative=f.need("alternative", _nonempty, ""),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
    )


def _python_eol(f: _Fields) -> PythonEol:
    return PythonEol(
        python=f.need("python", _minor_python, ""),
        end_of_life=f.need("end_of_life", _month_or_date, ""),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
    )


def _hf(f: _Fields) -> HfOption:
    package = f.need("package", _HF_PACKAGE, "")
    name = f.need("name", _nonempty, "")
    kind = f.need("kind", _choice("trainer-arg", "launch-flag", "value", "config-key", "sharding-arg"), "")
    introduced = f.may("introduced", _opt_version, None)
    deprecated = f.may("deprecated", _opt_version, None)
    removed = f.may("removed", _opt_version, None)
    replacement = f.may("replacement", _str, "")
    verified = f.may("verified", _bool, False)
    return HfOption(package=package, name=name, kind=kind, introduced=introduced, deprecated=deprecated,
                    removed=removed, replacement=replacement, verified=verified,
                    source=f.need("source", _nonempty, ""), reason=f.may("reason", _str, ""))


def _hf_data(f: _Fields) -> HfData:
    return HfData(
        package=f.need("package", _HF_PACKAGE, ""),
        through=f.need("through", _version, _NO_VERSION),
        source=f.need("source", _nonempty, ""),
        reason=f.may("reason", _str, ""),
    )


# kind -> its record, read field by field (in the order problems are listed)
_KINDS: dict[str, Callable[[_Fields], Row]] = {
    "torch": _torch, "cuda": _cuda, "ipex": _ipex, "oneccl": _oneccl, "eol": _eol, "hf": _hf, "hf_data": _hf_data,
    "python_eol": _python_eol,
}
# Top-level scalars a file may set as defaults for its rows.
_FILE_DEFAULTS = {"cpu_index_url": "torch"}
_DEFAULT_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _key(row: Row) -> RowKey:
    """Identity of a row: a row in CPUPERF_COMPAT_DIR with the same key replaces the shipped one."""
    if isinstance(row, OnecclRelease):
        return (row.version, row.device)
    if isinstance(row, CudaVariant):
        return (row.tag,)
    if isinstance(row, EolNotice):
        return (row.component,)
    if isinstance(row, HfOption):
        return (row.package, row.name)
    if isinstance(row, HfData):
        return (row.package,)
    if isinstance(row, PythonEol):
        return (row.python,)
    return (row.version,)


def _label(kind: str, index: int, raw: Mapping[str, object]) -> str:
    ident = raw.get("version") or raw.get("tag") or raw.get("component") or raw.get("name") or raw.get("package") \
        or raw.get("python")
    return f"[[{kind}]] #{index + 1}" + (f" ({ident})" if isinstance(ident, str) else "")


def _read_table(path: Path, problems: list[Problem], shipped: bool = False) -> dict[str, object] | None:
    """One TOML file's top table; None (with the problem appended) when it cannot be read or parsed. A shipped file
    is read through cpuperf.data's remembered parse (tomllib is pure Python: the shipped tables cost about 25 ms of
    CPU to parse in every command that plans a script's flags); a file of $CPUPERF_COMPAT_DIR is read bounded and
    parsed here, each problem named."""
    from cpuperf.fsutil import InputRefused, read_text_capped

    if shipped:
        from cpuperf.data import load_toml
        from cpuperf.errors import BadDataError

        try:
            return load_toml(str(path))
        except BadDataError as exc:
            problems.append(Problem(path.name, "file", exc.message))
            return None

    name = path.name
    try:
        data = tomllib.loads(read_text_capped(path))
        if too_deep(data):
            raise RecursionError
    except OSError as exc:
        problems.append(Problem(name, "file", f"cannot read: {exc.strerror or exc}"))
        return None
    except InputRefused as exc:
        problems.append(Problem(name, "file", f"cannot read: {exc}"))
        return None
    except UnicodeDecodeError as exc:
        problems.append(Problem(name, "file", f"not UTF-8 text (byte {exc.start})"))
        return None
    except tomllib.TOMLDecodeError as exc:
        problems.append(Problem(name, "file", f"not valid TOML: {exc}"))
        return None
    except RecursionError:
        problems.append(Problem(name, "file", f"nested deeper than {MAX_DEPTH} levels"))
        return None
    table: dict[str, object] = data
    return table


def _parse_file(path: Path, problems: list[Problem], shipped: bool = False) -> list[tuple[str, RowKey, Row]]:
    """Parse one TOML file into (kind, key, record) rows, appending every problem found."""
    name = path.name
    data = _read_table(path, problems, shipped)
    if data is None:
        return []
    defaults: dict[str, str] = {}
    rows: list[tuple[str, RowKey, Row]] = []
    for top, value in data.items():
        if top in _FILE_DEFAULTS:
            try:
                defaults[top] = _url(value)
            except _Bad as exc:
                problems.append(Problem(name, top, str(exc)))
            continue
        if top not in _KINDS:
            problems.append(Problem(name, top, f"unknown table; expected one of {', '.join(sorted(_KINDS))}"))
            continue
        tables = [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []
        if not isinstance(value, list) or len(tables) != len(value):
            problems.append(Problem(name, top, f"must be an array of tables ([[{top}]])"))
            continue
        for i, raw in enumerate(tables):
            row, row_problems = _parse_row(top, raw, defaults)
            if row is None:
                problems.append(Problem(name, _label(top, i, raw), "; ".join(row_problems)))
                continue
            rows.append((top, _key(row), row))
    return rows


def _parse_row(kind: str, raw: Mapping[str, object], defaults: Mapping[str, str]) -> tuple[Row | None, list[str]]:
    """One [[kind]] row as its record (None when it has problems), and its problems."""
    fields = _Fields(raw, defaults)
    row = _KINDS[kind](fields)
    row_problems = fields.unknown() + fields.problems
    if not row_problems:
        row_problems.extend(_row_checks(row))
    return (None if row_problems else row), row_problems


def _row_checks(row: Row) -> list[str]:
    """Cross-field checks a parser of one field cannot make."""
    out: list[str] = []
    if isinstance(row, (IpexRelease, OnecclRelease, TorchRelease)) and not row.python:
        out.append("python: must list at least one version")
    if isinstance(row, IpexRelease):
        if row.status == "release" and not row.index_url and not row.pypi:
            out.append("a release needs an index_url or pypi = true")
        if row.pypi_yanked and not row.pypi:
            out.append("pypi_yanked = true but pypi = false")
        ba = row.built_against
        if ba is not None and not row.torch.contains(ba, prereleases=True):
            out.append(f"built_against {ba} does not satisfy torch {row.torch}")
    if isinstance(row, HfOption) and row.introduced is not None and row.removed is not None \
            and row.removed <= row.introduced:
        out.append(f"removed {row.removed} is not after introduced {row.introduced}")
    if isinstance(row, HfOption) and row.verified and "unverified" in (row.source + row.reason).lower():
        out.append("verified = true but the source or reason says unverified")
    if isinstance(row, OnecclRelease) and row.device == "cpu" and not row.index_url:
        out.append("a CPU release needs an index_url (the bindings are not on PyPI)")
    return out


R = TypeVar("R", TorchRelease, CudaVariant, IpexRelease, OnecclRelease, EolNotice, HfOption, HfData, PythonEol)


def _sorted(rows: Iterable[Row], cls: type[R]) -> tuple[R, ...]:
    """The rows of one kind, oldest to newest."""
    return tuple(sorted((r for r in rows if isinstance(r, cls)), key=_sort_key))


def _sort_key(row: Row) -> RowKey:
    if isinstance(row, (TorchRelease, IpexRelease)):
        return (row.version,)
    if isinstance(row, OnecclRelease):
        return (row.version, row.device)
    if isinstance(row, CudaVariant):
        return (numeric_version(row.cuda), row.tag)
    if isinstance(row, EolNotice):
        return (row.component,)
    if isinstance(row, HfData):
        return (row.package,)
    if isinstance(row, PythonEol):
        return (Version(row.python),)
    return (row.package, row.name)


# --------------------------------------------------------------------------- locating and loading


def shipped_dir() -> Path:
    """Where the shipped data lives: cpuperf/compat inside a wheel, else compat/ at the repo root."""
    from cpuperf.data import builtin_compat_dir

    return builtin_compat_dir()


# The matrix reads only its own files: <subject>.toml shipped, <subject>*.toml in extra directories
# (e.g. ipex-2.9.toml). Other files in compat/ (microarch.toml, tuning.toml) belong to other modules.
SUBJECTS = ("ipex", "oneccl", "torch", "cuda", "eol", "hf")


def _toml_files(directory: Path, problems: list[Problem] | None = None) -> list[Path]:
    try:  # glob() hides an unreadable directory as an empty one: list it, and say so when it fails
        names = os.listdir(directory)
    except OSError as exc:
        if problems is not None:
            problems.append(Problem(str(directory), "directory", f"cannot read it: {exc.strerror or exc}"))
        return []
    return sorted(directory / n for n in names
                  if n.endswith(".toml") and n.lower().startswith(SUBJECTS) and (directory / n).is_file())


def extra_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The directories named by $CPUPERF_COMPAT_DIR (os.pathsep-separated; empty = none)."""
    from cpuperf.data import extra_compat_dirs

    return extra_compat_dirs(environ)


def load_matrix(
    extra_dir: str | os.PathLike[str] | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    subjects: tuple[str, ...] = (),
) -> Matrix:
    """Load the shipped compat data plus `extra_dir` (default: the $CPUPERF_COMPAT_DIR directories).

    Only files named <subject>*.toml are read (subjects: ipex, oneccl, torch, cuda, eol, hf).
    Rows in an extra directory with the same key (version, device, tag, ...) replace shipped rows;
    other rows are added. Raises MatrixError listing every bad row of every file.
    """
    base = Path(base_dir) if base_dir is not None else shipped_dir()
    extras = extra_dirs(environ) if extra_dir is None else [Path(extra_dir)]
    shipped = base_dir is None and base.is_dir()  # the first layer is cpuperf's own data

    problems: list[Problem] = []
    layers: list[list[Path]] = []
    if not base.is_dir():
        problems.append(Problem(str(base), "directory", "shipped compat data not found"))
    else:
        layers.append(_toml_files(base, problems))
    for extra in extras:
        if not extra.is_dir():
            problems.append(Problem(str(extra), "directory", f"{ENV_DIR} names no such directory"))
        else:
            layers.append(_toml_files(extra, problems))

    if subjects:
        layers = [[f for f in layer if f.name.startswith(subjects)] for layer in layers]
    merged: dict[str, dict[RowKey, Row]] = {k: {} for k in _KINDS}
    files: list[str] = []
    for layer in layers:
        seen: dict[tuple[str, RowKey], str] = {}
        for path in layer:
            files.append(str(path))
            for kind, key, row in _parse_file(path, problems, shipped=shipped and layer is layers[0]):
                if (kind, key) in seen:
                    problems.append(
                        Problem(path.name, f"[[{kind}]] {'/'.join(map(str, key))}",
                                f"duplicate of a row in {seen[(kind, key)]}")
                    )
                    continue
                seen[(kind, key)] = path.name
                merged[kind][key] = row  # a later layer replaces an earlier one
    if problems:
        raise MatrixError(problems)
    return Matrix(
        torch=_sorted(merged["torch"].values(), TorchRelease),
        cuda=_sorted(merged["cuda"].values(), CudaVariant),
        ipex=_sorted(merged["ipex"].values(), IpexRelease),
        oneccl=_sorted(merged["oneccl"].values(), OnecclRelease),
        eol=_sorted(merged["eol"].values(), EolNotice),
        hf=_sorted(merged["hf"].values(), HfOption),
        hf_data=_sorted(merged["hf_data"].values(), HfData),
        python_eol=_sorted(merged["python_eol"].values(), PythonEol),
        files=tuple(files),
    )


@lru_cache(maxsize=8)
def _cached(extra: str) -> Matrix:
    return load_matrix(extra or None, environ={})


@lru_cache(maxsize=8)
def _cached_eol(extra: str) -> Matrix:
    return load_matrix(extra or None, environ={}, subjects=("eol",))


def eol_notice(component: str) -> EolNotice | None:
    """The end-of-life row of 'ipex' or 'oneccl' (compat/eol.toml plus $CPUPERF_COMPAT_DIR), without
    loading the rest of the matrix."""
    return _cached_eol(os.environ.get(ENV_DIR, "")).eol_notice(component)


def check_env_dir(environ: Mapping[str, str] | None = None) -> None:
    """With $CPUPERF_COMPAT_DIR set, load it once up front: malformed or unreadable extra data is exit 6
    under every command, not only under those whose code path happens to consult the matrix."""
    env = os.environ if environ is None else environ
    if env.get(ENV_DIR, "").strip():
        _cached(env[ENV_DIR])


def default_matrix() -> Matrix:
    """The shipped data plus $CPUPERF_COMPAT_DIR, loaded once per distinct directory."""
    return _cached(os.environ.get(ENV_DIR, ""))
