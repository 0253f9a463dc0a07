"""Pure resolver: (python, torch, wishes) + compat matrix -> pinned wheel set, or a reason for every no.

No OS access and no torch import: callers pass the facts (Python version, installed packages).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Iterable, Mapping

from packaging.version import Version

from cpuperf.jsonable import NOT_IN_JSON, JsonObject, as_json
from cpuperf.knowledge.matrix import (
    PY_RE,
    IpexRelease,
    Matrix,
    OnecclRelease,
    TorchRelease,
    default_matrix,
    python_key,
    python_range,
    spec_text,
)
from cpuperf.probe.pkgscan import canonical_name
from cpuperf.versions import base_of, major_minor_of, version_or_none

SCHEMA = "cpuperf.compat/1"
PLATFORMS = ("linux_x86_64", "linux_aarch64")

# Short ids used in `want`, JSON keys and `rejected[].package`; pip names for commands and messages.
PIP_NAME = {"torch": "torch", "ipex": "intel-extension-for-pytorch", "oneccl": "oneccl_bind_pt"}
# Words users and pip use for the three components, by canonical (PEP 503) name.
_ALIASES = {
    "torch": "torch", "pytorch": "torch",
    "ipex": "ipex", "intel-extension-for-pytorch": "ipex",
    "oneccl": "oneccl", "ccl": "oneccl", "oneccl-bind-pt": "oneccl", "oneccl-bindings-for-pytorch": "oneccl",
    "torch-ccl": "oneccl",
}


class ResolveError(ValueError):
    """Bad input to the resolver: malformed version, unknown package or platform."""


# --------------------------------------------------------------------------- input parsing


def normalize_package(name: str) -> str:
    """'intel_extension_for_pytorch' -> 'ipex'; raises ResolveError for unknown names."""
    key = canonical_name(name.strip())
    if key not in _ALIASES:
        known = ", ".join(sorted({"torch", "ipex", "oneccl"}))
        raise ResolveError(f"unknown package {name!r}; known: {known} (or their pip names)")
    return _ALIASES[key]


def normalize_python(python: str) -> str:
    """'3.11', '3.11.7', '3.13t', 'cp311' -> '3.11' / '3.13t'; raises ResolveError otherwise."""
    text = str(python).strip().lower()
    m = re.match(r"^cp3(\d{1,2})(t?)$", text) or re.match(r"^3\.(\d{1,2})(?:\.\d+)?(t?)$", text)
    if not m:
        raise ResolveError(f"malformed Python version {python!r}; expected 3.N, 3.N.M or 3.Nt")
    out = f"3.{int(m.group(1))}{m.group(2)}"
    if not PY_RE.match(out):  # pragma: no cover - the regexes above already ensure it
        raise ResolveError(f"malformed Python version {python!r}")
    return out


def parse_version(text: str, what: str = "version") -> Version:
    """PEP 440 parse with a ResolveError (not InvalidVersion) on bad input."""
    version = version_or_none(str(text).strip())
    if version is None:
        raise ResolveError(f"malformed {what} {text!r}; expected a PEP 440 version like 2.5.0 or 2.5.0+cpu")
    return version


def _normalize_want(want: Iterable[str]) -> frozenset[str]:
    if isinstance(want, str):
        want = [w for w in want.split(",") if w.strip()]
    out = set()
    for w in want:
        pkg = normalize_package(w)
        if pkg == "torch":
            continue  # torch is always part of the answer
        out.add(pkg)
    return frozenset(out)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Pin:
    """An exact pin and where pip finds it."""

    package: str = field(metadata=NOT_IN_JSON)  # the compat/1 object holds the pin under its package's key
    version: str
    index_url: str | None
    index_kind: str  # index-url | extra-index-url | find-links | pypi
    on_pypi: bool = False  # also installable (unyanked) from PyPI without index_url

    @property
    def pip_name(self) -> str:
        """The distribution name pip installs."""
        return PIP_NAME[self.package]

    def pip_args(self) -> list[str]:
        """Arguments after `python -m pip install` for this pin alone."""
        args = [f"{self.pip_name}=={self.version}"]
        if self.index_url and self.index_kind != "pypi":
            flag = {"find-links": "-f", "extra-index-url": "--extra-index-url", "index-url": "--index-url"}
            args += [flag[self.index_kind], self.index_url]
        return args

    def to_json(self) -> JsonObject:
        """{"version", "index_url", ...} as in the cpuperf.compat/1 schema."""
        return as_json(self)

    def json_computed(self) -> Mapping[str, object]:
        return {"pip_args": self.pip_args()}


@dataclass(frozen=True)
class Rejection:
    """A candidate that does not fit, with one sentence a person understands."""

    package: str
    version: str | None
    reason: str

    def to_json(self) -> JsonObject:
        """{"package", "version", "reason"}."""
        return as_json(self)


@dataclass(frozen=True)
class Resolution:
    """The resolver's answer: pins (or None) plus a reason for every rejected candidate."""

    python: str
    platform: str
    want: frozenset[str]
    torch: str | None
    torch_index_url: str | None
    ipex: Pin | None
    oneccl: Pin | None
    rejected: tuple[Rejection, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when torch and every wished-for component were pinned."""
        return self.torch is not None and all(getattr(self, w) is not None for w in self.want)

    def install_argv(self) -> list[list[str]]:
        """pip argument lists (after `python -m pip install`), torch first, one list per index."""
        out: list[list[str]] = []
        if self.torch is not None:
            args = [f"torch=={self.torch}"]
            if self.torch_index_url:
                args += ["--index-url", self.torch_index_url]
            out.append(args)
        for pin in (self.ipex, self.oneccl):
            if pin is not None:
                out.append(pin.pip_args())
        return out

    def to_json(self) -> dict[str, object]:
        """The cpuperf.compat/1 JSON object."""
        return {
            "schema": SCHEMA,
            "torch": self.torch,
            "python": self.python,
            "ipex": self.ipex.to_json() if self.ipex else None,
            "oneccl": self.oneccl.to_json() if self.oneccl else None,
            "rejected": [r.to_json() for r in self.rejected],
            "notes": list(self.notes),
            "torch_index_url": self.torch_index_url,
            "platform": self.platform,
            "want": sorted(self.want),
            "ok": self.ok,
            "install": [["python", "-m", "pip", "install", *a] for a in self.install_argv()],
        }


# --------------------------------------------------------------------------- per-candidate checks


def _pyfmt(pys: Iterable[str]) -> str:
    return python_range(pys)


def torch_reasons(row: TorchRelease, python: str, platform: str) -> list[str]:
    """Why torch `row` has no wheel for this Python/platform (empty when it has one)."""
    pys = row.pythons(platform)
    if python in pys:
        return []
    return [f"torch {row.version} has no {platform} wheel for Python {python} (wheels: {_pyfmt(pys)})"]


def ipex_reasons(row: IpexRelease, torch: Version | None, python: str, platform: str) -> list[str]:
    """Every reason IPEX `row` does not fit; empty when it fits."""
    v = row.version
    out: list[str] = []
    if platform != "linux_x86_64":
        out.append(f"IPEX {v} has CPU wheels for Linux x86_64 only, not {platform}")
    if row.status == "withdrawn":
        why = f": {row.yank_reason}" if row.yank_reason else ""
        out.append(f"IPEX {v} was withdrawn (yanked from PyPI{why}, never announced)")
    if torch is not None and not row.torch.contains(torch, prereleases=True):
        out.append(f"IPEX {v} is built for torch {spec_text([row.torch])}; you have torch {torch}")
    if python not in row.python:
        out.append(f"IPEX {v} has no wheel for Python {python} (wheels: {_pyfmt(row.python)})")
    return out


def oneccl_reasons(row: OnecclRelease, torch: Version | None, python: str, platform: str) -> list[str]:
    """Every reason oneccl_bind_pt `row` does not fit a CPU stack; empty when it fits."""
    v = row.version
    out: list[str] = []
    if platform != "linux_x86_64":
        out.append(f"oneccl_bind_pt {v} has wheels for Linux x86_64 only, not {platform}")
    if row.device != "cpu":
        out.append(f"oneccl_bind_pt {v}{row.local} is an Intel GPU (XPU) build, not a CPU wheel")
    if torch is not None and not row.accepts(torch):
        out.append(f"oneccl_bind_pt {v} is built for torch {spec_text(row.torch)}; you have torch {torch}")
    if python not in row.python:
        out.append(f"oneccl_bind_pt {v} has no wheel for Python {python} (wheels: {_pyfmt(row.python)})")
    return out


def _ipex_pin(row: IpexRelease) -> Pin:
    return Pin("ipex", str(row.version), row.index_url or None, row.index_kind if row.index_url else "pypi",
               on_pypi=row.pypi and not row.pypi_yanked)


def _oneccl_pin(row: OnecclRelease) -> Pin:
    return Pin("oneccl", str(row.version), row.index_url, row.index_kind)


@dataclass
class _Pick:
    pin: Pin | None
    rejected: list[Rejection] = field(default_factory=list)


def _newest_ccl(m: Matrix) -> str:
    """The newest oneccl_bind_pt release in the data, with its local label (2.8.0+xpu)."""
    row = max(m.oneccl, key=lambda r: r.version)
    return f"{row.version}{row.local}"


def _eol_text(m: Matrix, comp: str, torch: Version) -> str | None:
    """The end-of-life sentence when `torch` is newer than anything `comp` ever supported."""
    notice = m.eol_notice(comp)
    rows = m.ipex if comp == "ipex" else [r for r in m.oneccl if r.device == "cpu"]
    if not rows:
        return None
    newest = max(major_minor_of(r.version) for r in rows)
    if major_minor_of(torch) <= newest:
        return None
    name = "IPEX" if comp == "ipex" else "oneccl_bind_pt"
    if notice is None:
        return f"no {name} release supports torch {torch}"
    project = "IPEX" if comp == "ipex" else "the oneCCL bindings"
    verb = "is" if comp == "ipex" else "are"
    return (
        f"{project} {verb} {notice.status}: the last release, {name} {notice.last_release}, supports torch "
        f"{spec_text([notice.last_torch])} only and you have torch {torch}; instead use {notice.alternative}"
    )


def _pick_ipex(m: Matrix, torch: Version, python: str, platform: str) -> _Pick:
    """Newest IPEX that fits, and reasons for the near misses (same torch minor, or EOL)."""
    winner: IpexRelease | None = None
    losers: list[tuple[IpexRelease, str]] = []
    for row in sorted(m.ipex, key=lambda r: r.version, reverse=True):
        reasons = ipex_reasons(row, torch, python, platform)
        if not reasons and winner is None:
            winner = row
        elif reasons and major_minor_of(row.version) == major_minor_of(torch):
            losers.append((row, reasons[0]))
    pick = _Pick(_ipex_pin(winner) if winner else None)
    for row, reason in losers:
        if winner is not None and row.version < winner.version and "built for torch" not in reason:
            continue  # an older sibling that also would not fit is noise once we have an answer
        pick.rejected.append(Rejection("ipex", str(row.version), reason))
    if winner is None and not losers:
        eol = _eol_text(m, "ipex", torch)
        if eol:
            notice = m.eol_notice("ipex")
            pick.rejected.append(Rejection("ipex", str(notice.last_release) if notice else None, eol))
        else:
            first = min(m.ipex, key=lambda r: r.version) if m.ipex else None
            hint = f" (the first, {first.version}, needs torch {spec_text([first.torch])})" if first else ""
            pick.rejected.append(Rejection("ipex", None, f"no IPEX CPU release supports torch {torch}{hint}"))
    return pick


def _pick_oneccl(m: Matrix, torch: Version, python: str, platform: str) -> _Pick:
    """Newest CPU oneccl_bind_pt that fits; near misses get a reason (and 'use X' when X fits)."""
    winner: OnecclRelease | None = None
    losers: list[tuple[OnecclRelease, str]] = []
    for row in sorted(m.oneccl, key=lambda r: (r.version, r.device == "cpu"), reverse=True):
        reasons = oneccl_reasons(row, torch, python, platform)
        if not reasons and winner is None:
            winner = row
            continue
        if not reasons:
            continue
        same_minor = major_minor_of(row.version) == major_minor_of(torch)
        if row.accepts(torch) or (row.device == "cpu" and same_minor):
            losers.append((row, reasons[0]))
    pick = _Pick(_oneccl_pin(winner) if winner else None)
    for row, reason in losers:
        if winner is not None:
            reason = f"{reason}: use {winner.version}"
        elif row.device == "cpu" and not row.accepts(torch) and major_minor_of(row.version) == major_minor_of(torch):
            fits = [t.version for t in m.torch if row.accepts(t.version) and not torch_reasons(t, python, platform)]
            if fits:
                reason = f"{reason}: install torch {max(fits)} to use it, or use the built-in 'gloo' backend"
            else:
                reason = (f"{reason}; no torch release it supports has a {platform} wheel for Python {python}: "
                          "use the built-in 'gloo' backend")
        pick.rejected.append(Rejection("oneccl", f"{row.version}{row.local if row.device != 'cpu' else ''}", reason))
    if winner is None and not any(r.device == "cpu" for r, _ in losers):
        eol = _eol_text(m, "oneccl", torch)
        if eol:
            notice = m.eol_notice("oneccl")
            pick.rejected.append(Rejection("oneccl", str(notice.last_release) if notice else None, eol))
        elif not losers:
            pick.rejected.append(Rejection("oneccl", None, f"no oneccl_bind_pt CPU release is documented for torch {torch}"))
    return pick


# --------------------------------------------------------------------------- resolve


def _torch_index(m: Matrix, row: TorchRelease | None) -> str:
    if row is not None:
        return row.cpu_index_url
    return m.torch[-1].cpu_index_url if m.torch else "https://download.pytorch.org/whl/cpu"


def _check_platform(platform: str) -> str:
    if platform not in PLATFORMS:
        raise ResolveError(f"unknown platform {platform!r}; known: {', '.join(PLATFORMS)}")
    return platform


def _requested_torch(text: str) -> tuple[Version, bool]:
    """(version, exact): '2.5' means 'any 2.5.x' (exact=False); '2.5.0+cpu' is exact."""
    v = parse_version(text, "torch version")
    return v, len(v.release) >= 3


def resolve(
    python: str,
    torch: str | None = None,
    want: Iterable[str] = frozenset(),
    platform: str = "linux_x86_64",
    matrix: Matrix | None = None,
    installed_torch: str | None = None,
) -> Resolution:
    """Pin torch (+ IPEX / oneccl_bind_pt when wanted) for `python`; None plus reasons when nothing fits.

    torch=None chooses the newest torch that has a wheel for `python` and satisfies every wish;
    installed_torch (when torch is None) keeps the installed torch instead. '2.5' means newest 2.5.x.
    """
    py = normalize_python(python)
    wants = _normalize_want(want)
    plat = _check_platform(platform)
    m = matrix if matrix is not None else default_matrix()
    notes: list[str] = []

    installed = parse_version(installed_torch, "installed torch version") if installed_torch else None
    asked = torch is not None
    if torch is None and installed is not None:
        notes.append(f"keeping the installed torch {installed}")
        torch = str(installed)
    if torch is None:
        return _best_stack(m, py, wants, plat, notes)

    requested, exact = _requested_torch(torch)
    if asked:
        _check_known_torch(m, requested, exact)
    if installed is not None and base_of(installed) != base_of(requested):
        notes.append(f"torch {installed} is installed; this plan replaces it")
    if not exact:
        return _best_in_minor(m, py, wants, plat, requested, notes)
    return _pinned(m, py, wants, plat, requested, notes)


def _check_known_torch(m: Matrix, t: Version, exact: bool) -> None:
    """A torch release (or minor) the data does not list is an input error, not a silent 'ok'."""
    known = m.torch_release(t) is not None if exact else any(major_minor_of(r.version) == major_minor_of(t) for r in m.torch)
    if known or not m.torch:
        return
    newest = m.torch[-1].version
    what = f"torch {t}" if exact else f"torch {t.major}.{t.minor}"
    if base_of(t) > newest:
        raise ResolveError(f"{what} is not in cpuperf's data (data ends at torch {newest}; "
                           f"extend with CPUPERF_COMPAT_DIR)")
    raise ResolveError(f"{what} is not a torch release (known: {m.torch[0].version} ... {newest})")


def _same_minor_with_wheel(m: Matrix, t: Version, py: str, plat: str) -> TorchRelease | None:
    """The newest release of t's minor that has a wheel for `py`, if any."""
    rows = [r for r in m.torch if major_minor_of(r.version) == major_minor_of(t) and not torch_reasons(r, py, plat)]
    return max(rows, key=lambda r: r.version) if rows else None


def _pinned(m: Matrix, py: str, wants: frozenset[str], plat: str, t: Version, notes: list[str]) -> Resolution:
    rejected: list[Rejection] = []
    row = m.torch_release(t)
    torch_out: str | None = t.public  # "2.5.0+cpu" -> "2.5.0": the CPU index serves the +cpu build
    if row is None:
        newest = m.torch[-1].version if m.torch else None
        if newest is not None and base_of(t) > newest:
            notes.append(f"torch {t} is newer than this data (newest known {newest}); wheels not checked")
        else:
            notes.append(f"torch {t} is not a known release; wheels not checked")
    else:
        why = torch_reasons(row, py, plat)
        if why:
            alt = _same_minor_with_wheel(m, t, py, plat)
            hint = f"; torch {alt.version} has one" if alt is not None else ""
            rejected.append(Rejection("torch", str(t), why[0] + hint))
            torch_out = None
    if t.local and not t.local.startswith("cpu"):
        notes.append(f"torch {t} is a +{t.local} build; the Intel CPU add-ons are validated with +cpu builds")
    ipex = oneccl = None
    if "ipex" in wants:
        pick = _pick_ipex(m, t, py, plat)
        ipex = pick.pin if torch_out else None
        rejected += pick.rejected
    if "oneccl" in wants:
        pick = _pick_oneccl(m, t, py, plat)
        oneccl = pick.pin if torch_out else None
        rejected += pick.rejected
    if torch_out is None and (ipex is None and oneccl is None) and wants:
        notes.append("no add-on is pinned because torch itself cannot be installed for this Python")
    return Resolution(py, plat, wants, torch_out, _torch_index(m, row) if torch_out else None,
                      ipex, oneccl, tuple(rejected), tuple(notes))


def _try(m: Matrix, row: TorchRelease, py: str, wants: frozenset[str], plat: str) -> tuple[bool, dict[str, _Pick]]:
    picks: dict[str, _Pick] = {}
    if "ipex" in wants:
        picks["ipex"] = _pick_ipex(m, row.version, py, plat)
    if "oneccl" in wants:
        picks["oneccl"] = _pick_oneccl(m, row.version, py, plat)
    return all(p.pin is not None for p in picks.values()), picks


def _best_in_minor(m: Matrix, py: str, wants: frozenset[str], plat: str, req: Version, notes: list[str]) -> Resolution:
    rows = [r for r in m.torch if major_minor_of(r.version) == major_minor_of(req)]
    for row in sorted(rows, key=lambda r: r.version, reverse=True):
        if torch_reasons(row, py, plat):
            continue
        ok, picks = _try(m, row, py, wants, plat)
        if ok:
            return _from_picks(m, py, wants, plat, row, picks, notes)
    if not rows:
        return _pinned(m, py, wants, plat, Version(f"{req.base_version}.0"), notes)
    # nothing in this minor fits every wish: explain against the release `--with`-less resolution would pick
    # (the newest with a wheel for this Python), else against the newest release of the minor
    alt = _same_minor_with_wheel(m, req, py, plat)
    return _pinned(m, py, wants, plat, alt.version if alt is not None else max(r.version for r in rows), notes)


def _from_picks(m: Matrix, py: str, wants: frozenset[str], plat: str, row: TorchRelease,
                picks: Mapping[str, _Pick], notes: list[str]) -> Resolution:
    ipex = picks["ipex"].pin if "ipex" in picks else None
    oneccl = picks["oneccl"].pin if "oneccl" in picks else None
    rejected = [r for p in picks.values() for r in p.rejected]
    return Resolution(py, plat, wants, str(row.version), row.cpu_index_url, ipex, oneccl,
                      tuple(rejected), tuple(notes))


def _best_stack(m: Matrix, py: str, wants: frozenset[str], plat: str, notes: list[str]) -> Resolution:
    """Newest torch with a wheel for `py` where every wanted add-on has a fitting release."""
    candidates = [r for r in sorted(m.torch, key=lambda r: r.version, reverse=True)
                  if not r.version.is_prerelease and not torch_reasons(r, py, plat)]
    if not candidates:
        pys = sorted({p for r in m.torch for p in r.pythons(plat)}, key=python_key)
        reason = f"no torch release has a {plat} wheel for Python {py} (torch wheels exist for {_pyfmt(pys)})"
        return Resolution(py, plat, wants, None, None, None, None,
                          (Rejection("torch", None, reason),), tuple(notes))
    newest = candidates[0]
    for row in candidates:
        ok, picks = _try(m, row, py, wants, plat)
        if ok:
            if row is not newest and wants:
                names = " and ".join(PIP_NAME[w] for w in sorted(wants))
                verb = "needs" if len(wants) == 1 else "need"
                notes.append(f"the newest torch for Python {py} is {newest.version}; "
                             f"{names} {verb} torch {row.version}")
            # near misses of the chosen torch only; reasons for newer torches are summarised in notes
            return _from_picks(m, py, wants, plat, row, picks, notes)
    # nothing exists: one reason per wanted add-on
    rejected: list[Rejection] = []
    for w in sorted(wants):
        rejected.append(_why_no_component(m, w, py, plat, candidates))
    notes.append(f"without {' and '.join(PIP_NAME[w] for w in sorted(wants))}, the newest torch for "
                 f"Python {py} is {newest.version}")
    return Resolution(py, plat, wants, None, None, None, None, tuple(rejected), tuple(notes))


def _why_no_component(m: Matrix, comp: str, py: str, plat: str, torches: list[TorchRelease]) -> Rejection:
    name = PIP_NAME[comp]
    rows: list[IpexRelease | OnecclRelease] = list(m.ipex) if comp == "ipex" else [r for r in m.oneccl if r.device == "cpu"]
    if plat != "linux_x86_64":
        return Rejection(comp, None, f"{name} has wheels for Linux x86_64 only, not {plat}")
    if not any(py in r.python for r in rows):
        last = max(rows, key=lambda r: r.version)
        return Rejection(comp, str(last.version),
                         f"no {name} release has a wheel for Python {py} "
                         f"(the last, {last.version}, has wheels for {_pyfmt(last.python)})")
    alone = []
    for t in torches:
        pick = _pick_ipex(m, t.version, py, plat) if comp == "ipex" else _pick_oneccl(m, t.version, py, plat)
        if pick.pin is not None:
            alone.append(t.version)
    if alone:
        return Rejection(comp, None, f"{name} fits torch {max(alone)} for Python {py}, but no torch release "
                                     f"satisfies it together with the other wishes")
    return Rejection(comp, None, f"no {name} release fits any torch that has a wheel for Python {py}")


# --------------------------------------------------------------------------- why_not


def why_not(
    package: str,
    version: str,
    python: str,
    torch: str | None = None,
    matrix: Matrix | None = None,
    platform: str = "linux_x86_64",
) -> list[str]:
    """Every reason `package==version` does not fit this Python/torch; [] when it fits."""
    comp = normalize_package(package)
    v = parse_version(version)
    py = normalize_python(python)
    plat = _check_platform(platform)
    t = parse_version(torch, "torch version") if torch else None
    m = matrix if matrix is not None else default_matrix()
    if comp == "torch":
        row = m.torch_release(v)
        if row is None:
            return [f"torch {v} is not a known release in this data"]
        return torch_reasons(row, py, plat)
    if comp == "ipex":
        ipex_rows = [r for r in m.ipex if r.version == base_of(v)]
        if not ipex_rows:
            known = ", ".join(str(r.version) for r in m.ipex)
            return [f"intel-extension-for-pytorch {v} is not a known CPU release (known: {known})"]
        return _and_what_fits(m, "ipex", ipex_reasons(ipex_rows[0], t, py, plat), t, py, plat)
    ccl_rows = [r for r in m.oneccl if r.version == base_of(v)]
    if v.local:  # '2.7.0+xpu' names the build explicitly
        ccl_rows = [r for r in ccl_rows if r.local.lstrip("+") == v.local] or ccl_rows
    if not ccl_rows:
        known = ", ".join(f"{r.version}{'' if r.device == 'cpu' else r.local}" for r in m.oneccl)
        return [f"oneccl_bind_pt {v} is not a known release (known: {known})"]
    ccl = sorted(ccl_rows, key=lambda r: r.device != "cpu")[0]
    return _and_what_fits(m, "oneccl", oneccl_reasons(ccl, t, py, plat), t, py, plat)


def _and_what_fits(m: Matrix, component: str, reasons: list[str], t: Version | None, py: str, plat: str) -> list[str]:
    """An add-on's reasons against the installed torch `t`, then its retirement and the release that fits `t`."""
    if t is not None and reasons:
        eol = _eol_text(m, component, t)
        if eol:
            reasons.append(eol)
        pick = _pick_ipex if component == "ipex" else _pick_oneccl
        fit = pick(m, t, py, plat).pin
        if fit is not None:
            dist = "intel-extension-for-pytorch" if component == "ipex" else "oneccl_bind_pt"
            reasons.append(f"for torch {t} and Python {py} use {dist} {fit.version}")
    return reasons


# --------------------------------------------------------------------------- HF options


def hf_option_status(package: str, version: str, name: str, matrix: Matrix | None = None) -> str:
    """'ok' | 'deprecated' | 'removed' | 'too-old' | 'unknown' for a transformers/accelerate option."""
    v = parse_version(version, f"{package} version")
    m = matrix if matrix is not None else default_matrix()
    for row in m.hf:
        if row.package == package and row.name == name:
            if row.removed is not None and v >= row.removed:
                return "removed"
            if row.introduced is not None and v < row.introduced:
                return "too-old"
            if row.deprecated is not None and v >= row.deprecated:
                return "deprecated"
            return "ok"
    return "unknown"


# --------------------------------------------------------------------------- installed findings


def _pip(*args: str) -> str:
    return shlex.join(["python", "-m", "pip", *args])


# Installed distributions by pip name only: a bare "oneccl" there is the oneCCL runtime wheel, not the bindings.
_INSTALLED = {"torch": "torch", "intel-extension-for-pytorch": "ipex", "oneccl-bind-pt": "oneccl", "torch-ccl": "oneccl"}


def _lookup(packages: Mapping[str, str | None], comp: str) -> str | None:
    for name, ver in packages.items():
        if _INSTALLED.get(canonical_name(name.strip())) == comp and ver:
            return ver
    return None


def installed_findings(
    python: str,
    packages: Mapping[str, str | None],
    matrix: Matrix | None = None,
    platform: str = "linux_x86_64",
) -> list[dict[str, str]]:
    """Doctor findings for an installed stack: [{"id", "severity", "message", "fix"}]; [] when healthy.

    `packages` maps pip distribution names (torch, intel_extension_for_pytorch, oneccl_bind_pt, torch_ccl,
    dashes or underscores) to installed versions (None = absent). Other names are ignored: the doctor
    passes whatever it scanned, including the unrelated `oneccl` runtime wheel.
    """
    py = normalize_python(python)
    plat = _check_platform(platform)
    m = matrix if matrix is not None else default_matrix()
    torch_s, ipex_s, ccl_s = (_lookup(packages, c) for c in ("torch", "ipex", "oneccl"))
    torch_v = parse_version(torch_s, "torch version") if torch_s else None
    out = _python_findings(m, py, plat, torch_v)
    if ipex_s:
        out += _ipex_findings(m, py, plat, torch_v, parse_version(ipex_s, "IPEX version"))
    if ccl_s:
        out += _oneccl_findings(m, py, plat, torch_v, parse_version(ccl_s, "oneccl_bind_pt version"))
    return out


class _Findings:
    """One check's findings, in the order they are added."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []

    def add(self, fid: str, severity: str, message: str, fix: str) -> None:
        self.rows.append({"id": fid, "severity": severity, "message": message, "fix": fix})


def _python_findings(m: Matrix, py: str, plat: str, torch_v: Version | None) -> list[dict[str, str]]:
    """Python versions torch publishes no wheel for (any torch, or the installed one)."""
    found = _Findings()
    add = found.add
    all_pys = {p for r in m.torch for p in r.pythons(plat)}
    if py not in all_pys:
        best = max((p for p in all_pys if not p.endswith("t")), key=python_key, default=None)
        add("python-no-wheels", "error",
            f"no torch release has a {plat} wheel for Python {py}",
            f"create an environment with Python {best} (e.g. `uv venv --python {best}`) and reinstall"
            if best else "use a CPython version that torch publishes wheels for")
    elif torch_v is not None:
        trow = m.torch_release(torch_v)
        if trow is not None and torch_reasons(trow, py, plat):
            stack = _best_stack(m, py, frozenset(), plat, [])
            fix = (_pip("install", f"torch=={stack.torch}", "--index-url", stack.torch_index_url or "")
                   if stack.torch else "")
            add("torch-no-wheel-for-python", "warning",
                f"torch {torch_v} publishes no wheel for Python {py}: it was built locally or for another Python",
                fix)
    return found.rows


def _ipex_findings(m: Matrix, py: str, plat: str, torch_v: Version | None, iv: Version) -> list[dict[str, str]]:
    """The installed IPEX against the installed torch, its Python, its build and its retirement."""
    found = _Findings()
    add = found.add
    notice = m.eol_notice("ipex")
    rows = [r for r in m.ipex if r.version == base_of(iv)]
    if torch_v is not None and major_minor_of(iv) != major_minor_of(torch_v):
        check = rows[0].import_check if rows else "exit127"
        effect = {
            "exit127": "`import intel_extension_for_pytorch` prints an error and exits the process with code 127",
            "attributeerror": "`import intel_extension_for_pytorch` prints an error and raises AttributeError",
            "none": "the import fails while loading its compiled extension",
        }[check]
        fit = _pick_ipex(m, torch_v, py, plat)
        if fit.pin is not None:
            fix = _pip("install", *fit.pin.pip_args())
        else:
            fix = _pip("uninstall", "-y", "intel-extension-for-pytorch")
        msg = (f"IPEX {iv} needs torch {iv.major}.{iv.minor}.* but torch {torch_v} is installed: {effect}")
        if fit.pin is None and notice is not None and major_minor_of(torch_v) > major_minor_of(notice.last_release):
            msg += f"; IPEX is {notice.status} (last release {notice.last_release}): on torch>={torch_v.major}.{torch_v.minor} use {notice.alternative}"
        add("ipex-torch-mismatch", "error", msg, fix)
    elif rows and rows[0].status == "withdrawn":
        fit = _pick_ipex(m, torch_v, py, plat) if torch_v else _Pick(None)
        add("ipex-withdrawn", "warning", f"IPEX {iv} was withdrawn by its maintainers ({rows[0].yank_reason})",
            _pip("install", *fit.pin.pip_args()) if fit.pin else _pip("uninstall", "-y", "intel-extension-for-pytorch"))
    elif rows and py not in rows[0].python:
        add("ipex-no-wheel-for-python", "warning",
            f"IPEX {iv} publishes no wheel for Python {py}; this install was built locally",
            _pip("uninstall", "-y", "intel-extension-for-pytorch"))
    newest = max((r.version for r in m.ipex), default=None)
    if iv.local and iv.local.startswith("xpu"):
        add("ipex-xpu-build", "warning",
            f"IPEX {iv} is the Intel GPU (XPU) build, outside cpuperf's data (its CPU releases end at {newest}): "
            "cpuperf plans CPU training as if IPEX were absent", _pip("uninstall", "-y", "intel-extension-for-pytorch"))
    elif not rows and newest is not None and base_of(iv) > newest:
        add("ipex-newer-than-data", "info",
            f"IPEX {iv} is newer than cpuperf's data (data ends at IPEX {newest}): its torch pairing is not "
            "checked; cpuperf assumes it needs the torch of its own major.minor", "")
    if notice is not None:
        add("ipex-retired", "info",
            f"IPEX is {notice.status} (last release {notice.last_release}); on torch>=2.9 use {notice.alternative}",
            _pip("uninstall", "-y", "intel-extension-for-pytorch"))
    return found.rows


def _oneccl_findings(m: Matrix, py: str, plat: str, torch_v: Version | None, cv: Version) -> list[dict[str, str]]:
    """The installed oneCCL bindings against the installed torch, their build and their retirement."""
    found = _Findings()
    add = found.add
    notice = m.eol_notice("oneccl")
    xpu_labels = {r.local.lstrip("+") for r in m.oneccl if r.device == "xpu" and r.local} | {"xpu"}
    if cv.local and (cv.local.startswith("xpu") or cv.local in xpu_labels):
        add("oneccl-xpu-build", "error",
            f"oneccl_bind_pt {cv} is the Intel GPU (XPU) build; it is not a CPU wheel",
            _fix_oneccl(m, torch_v, py, plat))
    elif torch_v is not None:
        cpu_rows = [r for r in m.oneccl if r.version == base_of(cv) and r.device == "cpu"]
        if cpu_rows and not cpu_rows[0].accepts(torch_v):
            msg = (f"oneccl_bind_pt {cv} is built for torch {spec_text(cpu_rows[0].torch)} but torch {torch_v} "
                   f"is installed: the ccl backend will fail to load or crash")
            fit = _pick_oneccl(m, torch_v, py, plat)
            if fit.pin is None:
                eol = _eol_text(m, "oneccl", torch_v)
                if eol:
                    msg += f"; {eol}"
            add("oneccl-torch-mismatch", "error", msg, _fix_oneccl(m, torch_v, py, plat))
        elif not cpu_rows and base_of(cv) > max((r.version for r in m.oneccl), default=base_of(cv)):
            add("oneccl-newer-than-data", "info",
                f"oneccl_bind_pt {cv} is newer than cpuperf's data (data ends at {_newest_ccl(m)}): which torch "
                "it was built for is not known, so cpuperf plans CPU DDP with gloo, as without the bindings "
                "(the ccl backend only with a release in the data)", "")
        elif not cpu_rows:
            add("oneccl-unknown", "warning", f"oneccl_bind_pt {cv} is not a known CPU release",
                _fix_oneccl(m, torch_v, py, plat))
    if notice is not None:
        add("oneccl-retired", "info",
            f"the oneCCL bindings are {notice.status} (last CPU release {notice.last_release}); "
            f"prefer {notice.alternative}",
            _pip("uninstall", "-y", "oneccl_bind_pt"))
    return found.rows


def _fix_oneccl(m: Matrix, torch_v: Version | None, py: str, plat: str) -> str:
    if torch_v is not None:
        fit = _pick_oneccl(m, torch_v, py, plat)
        if fit.pin is not None:
            return _pip("install", "--force-reinstall", "--no-deps", *fit.pin.pip_args())
    return _pip("uninstall", "-y", "oneccl_bind_pt")


__all__ = [
    "SCHEMA",
    "Pin",
    "hf_option_status",
    "Rejection",
    "Resolution",
    "ResolveError",
    "installed_findings",
    "ipex_reasons",
    "normalize_package",
    "normalize_python",
    "oneccl_reasons",
    "resolve",
    "torch_reasons",
    "why_not",
]


# "Within six months" of a Python's end of life: long enough to move an environment before security fixes stop.
EOL_SOON = timedelta(days=183)


def newest_torch_for_python(m: Matrix, python: str, platform: str = "linux_x86_64") -> Version | None:
    """The newest torch in the data that ships a `platform` wheel for `python` ('3.10', '3.13t'), or None."""
    return max((r.version for r in m.torch if normalize_python(python) in r.pythons(platform)), default=None)


def python_eol_finding(python: str, today: date, matrix: Matrix | None = None,
                       platform: str = "linux_x86_64") -> dict[str, str] | None:
    """{"id", "severity", "message", "fix"} when `python` is past its end of life on `today` (a warning) or within
    six months of it (info), naming the newest torch with a wheel for it; None otherwise or when the data has no
    row for it. Pure: the caller passes today's date (probe_today)."""
    m = matrix if matrix is not None else default_matrix()
    py = normalize_python(python)
    row = m.python_end_of_life(py)
    if row is None:
        return None
    last = row.last_day()
    if today < last - EOL_SOON:
        return None
    pep = re.search(r"PEP \d+", row.source)
    cite = f" ({pep.group(0)})" if pep else ""
    torch_v = newest_torch_for_python(m, py, platform)
    newest = m.torch[-1].version if m.torch else None
    if torch_v is None:
        wheels = f"no torch release in cpuperf's data ships a {platform} wheel for it"
    elif torch_v == newest:
        wheels = f"torch {torch_v}, the newest in cpuperf's data, still ships {platform} wheels for it"
    else:
        wheels = f"the newest torch with a {platform} wheel for it is {torch_v} (torch {newest} has none)"
    successor = max((p for p in (m.torch[-1].pythons(platform) if m.torch else ()) if not p.endswith("t")),
                    key=python_key, default=None)
    fix = (f"create an environment with Python {successor} (e.g. `uv venv --python {successor}`) and reinstall"
           if successor and successor != py.removesuffix("t") else "")
    if today > last:
        return {"id": "python-end-of-life", "severity": "warning",
                "message": f"Python {py} reached its end of life on {last}{cite}: no more security fixes; {wheels}",
                "fix": fix}
    return {"id": "python-end-of-life-soon", "severity": "info",
            "message": f"Python {py} reaches its end of life on {last}{cite}, within six months; {wheels}",
            "fix": fix}
