"""Load and validate the compatibility data in compat/*.toml into typed, frozen rows.

The data (not this module) is the knowledge: every row names its `source`. This module only parses,
checks and indexes it. A malformed data set raises one MatrixError listing every bad row.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

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


def spec_text(specs: Iterable[Any]) -> str:
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


def _torch_pin(value: Any) -> TorchPin:
    text = _nonempty(value).strip()
    if not _PIN_RE.match(text):
        raise _Bad(f"{text!r}: give the newest torch as '==X.Y.*' or '==X.Y.Z'")
    return TorchPin(text)


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
    files: tuple[str, ...] = ()

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

Parser = Callable[[Any], Any]


class _Bad(Exception):
    """A field failed to parse; the message is the problem text."""


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad(f"expected a string, got {type(value).__name__}")
    return value


def _build_kind(value: Any) -> str:
    text = _str(value)
    if text not in ("cpu", "cuda"):
        raise _Bad(f"{text!r} is not 'cpu' or 'cuda'")
    return text


def _nonempty(value: Any) -> str:
    text = _str(value)
    if not text.strip():
        raise _Bad("must not be empty")
    return text


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"expected true/false, got {value!r}")
    return value


def _version(value: Any) -> Version:
    text = _nonempty(value)
    version = version_or_none(text)
    if version is None:
        raise _Bad(f"{text!r} is not a PEP 440 version")
    return version


def _opt_version(value: Any) -> Version | None:
    text = _str(value)
    return _version(text) if text else None


def _spec(value: Any) -> SpecifierSet:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    text = _nonempty(value)
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise _Bad(f"{text!r} is not a PEP 440 specifier") from None


def _spec_list(value: Any) -> tuple[SpecifierSet, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise _Bad("expected a specifier or a non-empty list of specifiers")
    return tuple(_spec(v) for v in items)


def _pythons(value: Any) -> frozenset[str]:
    if not isinstance(value, list):
        raise _Bad("expected a list of Python versions like \"3.11\"")
    bad = [v for v in value if not isinstance(v, str) or not PY_RE.match(v)]
    if bad:
        raise _Bad(f"not Python versions of the form 3.N or 3.Nt: {bad!r}")
    return frozenset(value)


def _str_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad("expected a list of strings")
    return tuple(value)


def _url(value: Any) -> str:
    text = _str(value)
    if text and not re.match(r"^https?://\S+$", text):
        raise _Bad(f"{text!r} is not an http(s) URL")
    return text


def _date(value: Any) -> str:
    text = _str(value)
    if not _DATE_RE.match(text):
        raise _Bad(f"{text!r} is not a YYYY-MM-DD date")
    return text


def _choice(*allowed: str) -> Parser:
    def parse(value: Any) -> str:
        text = _str(value)
        if text not in allowed:
            raise _Bad(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return parse


def _driver(value: Any) -> str:
    text = _str(value)
    if text and not re.match(r"^\d+(\.\d+)*$", text):
        raise _Bad(f"{text!r} is not a driver version like 525.60.13")
    return text


# kind -> (field -> (parser, required)), key fields, default for missing optional fields
_SCHEMA: dict[str, dict[str, tuple[Parser, bool]]] = {
    "torch": {
        "version": (_version, True),
        "python": (_pythons, True),
        "python_aarch64": (_pythons, False),
        "cuda": (_str_list, False),
        "cpu_index_url": (_url, False),
        "source": (_nonempty, True),
        "reason": (_str, False),
        "pypi_aarch64": (_build_kind, False),
    },
    "cuda": {
        "tag": (_nonempty, True),
        "cuda": (_nonempty, True),
        "min_driver_linux": (_driver, True),
        "toolkit_driver_linux": (_driver, False),
        "index_url": (_url, True),
        "source": (_nonempty, True),
        "reason": (_str, False),
    },
    "ipex": {
        "version": (_version, True),
        "torch": (_spec, True),
        "built_against": (_opt_version, False),
        "python": (_pythons, True),
        "pypi": (_bool, True),
        "pypi_yanked": (_bool, True),
        "yank_reason": (_str, False),
        "index_url": (_url, True),
        "index_kind": (_choice("find-links", "extra-index-url", "index-url"), True),
        "local": (_str, False),
        "import_check": (_choice("none", "exit127", "attributeerror"), True),
        "status": (_choice("release", "withdrawn"), True),
        "released": (_date, False),
        "source": (_nonempty, True),
        "reason": (_str, False),
    },
    "oneccl": {
        "version": (_version, True),
        "device": (_choice("cpu", "xpu"), True),
        "torch": (_spec_list, True),
        "python": (_pythons, True),
        "index_url": (_url, True),
        "index_kind": (_choice("find-links", "extra-index-url", "index-url"), True),
        "import_name": (_choice("torch_ccl", "oneccl_bindings_for_pytorch"), True),
        "local": (_str, False),
        "source": (_nonempty, True),
        "reason": (_str, False),
    },
    "eol": {
        "component": (_choice("ipex", "oneccl"), True),
        "status": (_choice("archived", "deprecated", "end-of-life"), True),
        "last_release": (_version, True),
        "last_torch": (_torch_pin, True),
        "announced": (_date, False),
        "end_of_support": (_date, False),
        "alternative": (_nonempty, True),
        "source": (_nonempty, True),
        "reason": (_str, False),
    },
    "hf": {
        "package": (_choice("transformers", "accelerate"), True),
        "name": (_nonempty, True),
        "kind": (_choice("trainer-arg", "launch-flag", "value", "config-key", "sharding-arg"), True),
        "introduced": (_opt_version, False),
        "deprecated": (_opt_version, False),
        "removed": (_opt_version, False),
        "replacement": (_str, False),
        "verified": (_bool, False),
        "source": (_nonempty, True),
        "reason": (_str, False),
    },
    "hf_data": {
        "package": (_choice("transformers", "accelerate"), True),
        "through": (_version, True),
        "source": (_nonempty, True),
        "reason": (_str, False),
    },
}
_DEFAULTS: dict[str, Any] = {
    "python_aarch64": frozenset(),
    "cuda": (),
    "reason": "",
    "yank_reason": "",
    "built_against": None,
    "local": "",
    "released": "",
    "toolkit_driver_linux": "",
    "announced": "",
    "end_of_support": "",
    "introduced": None,
    "deprecated": None,
    "removed": None,
    "replacement": "",
    "verified": False,
    "pypi_aarch64": "cpu",
}
# Top-level scalars a file may set as defaults for its rows.
_FILE_DEFAULTS = {"cpu_index_url": "torch"}
_DEFAULT_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _key(kind: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Identity of a row: a row in CPUPERF_COMPAT_DIR with the same key replaces the shipped one."""
    if kind == "oneccl":
        return (row["version"], row["device"])
    if kind == "cuda":
        return (row["tag"],)
    if kind == "eol":
        return (row["component"],)
    if kind == "hf":
        return (row["package"], row["name"])
    if kind == "hf_data":
        return (row["package"],)
    return (row["version"],)


def _label(kind: str, index: int, raw: Mapping[str, Any]) -> str:
    ident = raw.get("version") or raw.get("tag") or raw.get("component") or raw.get("name") or raw.get("package")
    return f"[[{kind}]] #{index + 1}" + (f" ({ident})" if isinstance(ident, str) else "")


def _read_table(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    """One TOML file's top table; None (with the problem appended) when it cannot be read or parsed."""
    from cpuperf.fsutil import InputRefused, read_text_capped

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
    table: dict[str, Any] = data
    return table


def _parse_file(path: Path, problems: list[Problem]) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """Parse one TOML file into (kind, key, fields) rows, appending every problem found."""
    name = path.name
    data = _read_table(path, problems)
    if data is None:
        return []
    defaults: dict[str, Any] = {}
    rows: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    for top, value in data.items():
        if top in _FILE_DEFAULTS:
            try:
                defaults[top] = _url(value)
            except _Bad as exc:
                problems.append(Problem(name, top, str(exc)))
            continue
        if top not in _SCHEMA:
            problems.append(Problem(name, top, f"unknown table; expected one of {', '.join(sorted(_SCHEMA))}"))
            continue
        if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
            problems.append(Problem(name, top, f"must be an array of tables ([[{top}]])"))
            continue
        for i, raw in enumerate(value):
            parsed, row_problems = _parse_row(top, raw, defaults)
            if row_problems:
                problems.append(Problem(name, _label(top, i, raw), "; ".join(row_problems)))
                continue
            rows.append((top, _key(top, parsed), parsed))
    return rows


def _parse_row(kind: str, raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """One [[kind]] row's fields parsed (absent ones from the file's or the schema's defaults), and its problems."""
    fields = _SCHEMA[kind]
    parsed: dict[str, Any] = {}
    row_problems: list[str] = []
    for fname in raw:
        if fname not in fields:
            row_problems.append(f"unknown field {fname!r}")
    for fname, (parser, required) in fields.items():
        if fname not in raw:
            if required:
                row_problems.append(f"missing required field {fname!r}")
            elif fname in defaults:
                parsed[fname] = defaults[fname]
            elif fname == "cpu_index_url":
                parsed[fname] = _DEFAULT_CPU_INDEX
            else:
                parsed[fname] = _DEFAULTS.get(fname)
            continue
        try:
            parsed[fname] = parser(raw[fname])
        except _Bad as exc:
            row_problems.append(f"{fname}: {exc}")
    if not row_problems:
        row_problems.extend(_row_checks(kind, parsed))
    return parsed, row_problems


def _row_checks(kind: str, row: Mapping[str, Any]) -> list[str]:
    """Cross-field checks a parser of one field cannot make."""
    out: list[str] = []
    if kind in ("ipex", "oneccl", "torch") and not row["python"]:
        out.append("python: must list at least one version")
    if kind == "ipex":
        if row["status"] == "release" and not row["index_url"] and not row["pypi"]:
            out.append("a release needs an index_url or pypi = true")
        if row["pypi_yanked"] and not row["pypi"]:
            out.append("pypi_yanked = true but pypi = false")
        ba = row["built_against"]
        if ba is not None and not row["torch"].contains(ba, prereleases=True):
            out.append(f"built_against {ba} does not satisfy torch {row['torch']}")
    if kind == "hf" and row["introduced"] is not None and row["removed"] is not None \
            and row["removed"] <= row["introduced"]:
        out.append(f"removed {row['removed']} is not after introduced {row['introduced']}")
    if kind == "hf" and row["verified"] and "unverified" in (row["source"] + row["reason"]).lower():
        out.append("verified = true but the source or reason says unverified")
    if kind == "oneccl" and row["device"] == "cpu" and not row["index_url"]:
        out.append("a CPU release needs an index_url (the bindings are not on PyPI)")
    return out


def _build(kind: str, row: dict[str, Any]) -> Any:
    cls = {
        "torch": TorchRelease,
        "cuda": CudaVariant,
        "ipex": IpexRelease,
        "oneccl": OnecclRelease,
        "eol": EolNotice,
        "hf": HfOption,
        "hf_data": HfData,
    }[kind]
    return cls(**row)


def _sort_key(kind: str, row: Any) -> tuple[Any, ...]:
    if kind in ("torch", "ipex"):
        return (row.version,)
    if kind == "oneccl":
        return (row.version, row.device)
    if kind == "cuda":
        return (numeric_version(row.cuda), row.tag)
    if kind == "eol":
        return (row.component,)
    if kind == "hf_data":
        return (row.package,)
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
    merged: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {k: {} for k in _SCHEMA}
    files: list[str] = []
    for layer in layers:
        seen: dict[tuple[str, tuple[Any, ...]], str] = {}
        for path in layer:
            files.append(str(path))
            for kind, key, row in _parse_file(path, problems):
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

    built: dict[str, tuple[Any, ...]] = {}
    for kind, rows in merged.items():
        objs = [_build(kind, r) for r in rows.values()]
        objs.sort(key=functools.partial(_sort_key, kind))
        built[kind] = tuple(objs)
    return Matrix(files=tuple(files), **built)


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
