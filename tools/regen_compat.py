"""Rebuild the derivable columns of compat/ from primary inputs, so anyone can refresh the data after a release.

    python -m tools.regen_compat            # check: the committed data equals what the recorded inputs give
    python -m tools.regen_compat --write    # rewrite compat/ from the recorded inputs
    python -m tools.regen_compat --live --write
        # first re-record the inputs (network: the package registry through pip, the kernel headers from a
        # local Linux checkout given with --linux DIR), then rewrite compat/
    python -m tools.regen_compat --installed-transformers --write
        # add the transformers installed here (an x.y.0 wheel: its training_args.py, checked against the sha256
        # in the dist-info RECORD) as that minor's record, then rewrite compat/; no network
    python -m tools.regen_compat --check-upstream [--linux DIR]
        # by hand, with network: record the newest inputs into a scratch copy and print which inputs are newer
        # and what the data would change (exit 1 when anything would); nothing is written

What is derived, and from what (recorded under tests/fixtures/regen/):
- compat/hf.toml, transformers trainer-arg/value rows: introduced/deprecated/removed, from which options each
  release's transformers/training_args.py declares (TrainingArguments fields, the ddp_backend choices,
  OptimizerNames) and which it marks deprecated; one record per minor release (its first wheel) plus the last
  patch of a major (transformers_training_args.json).
- compat/hf.toml, accelerate launch-flag and value rows: introduced/deprecated/removed, from the add_argument calls of
  accelerate/commands/launch.py and the string constants of accelerate/state.py, with the deprecation each release's
  help texts and warnings state (accelerate_options.json).
- compat/hf.toml, accelerate config-key rows: introduced/removed, from the dataclass fields of BaseConfig /
  ClusterConfig in accelerate/commands/config/config_args.py (the loader rejects any other key)
  (accelerate_config_args.json).
- compat/microarch.toml, Intel `models` and AMD `model_ranges`: from Linux arch/x86/include/asm/intel-family.h
  and the 'Figure out Zen generations' switch of arch/x86/kernel/cpu/amd.c (intel-family.h, amd-zen.c).
- compat/torch.toml, `python` / `python_aarch64`: from the Linux wheel file names of the registry's simple index
  for torch (torch_wheels.txt).
- compat/ipex.toml, `pypi` / `pypi_yanked`: from the registry's intel-extension-for-pytorch files and their yanked
  marks; a CPython tag a wheel has and the row's `python` lacks is reported (ipex_wheels.txt).
- compat/oneccl.toml: which releases exist (one row per release tag of intel/torch-ccl from 1.10.0, CPU or XPU by the
  tag's label) and the XPU builds' local label (+gpu/+xpu as the tag names it) (torch_ccl_tags.txt).
- compat/tuning.toml, [hf_trainer] default_fused_min_transformers / default_fused_min_torch: the first minor whose
  TrainingArguments defaults to adamw_torch_fused and its is_torch_greater_or_equal_than_X_Y gate, pinned by two
  adjacent recorded minors (transformers_default_optim.json, from the same wheels).

Curated columns (replacement, reason, cuda, the macro -> generation map below) stay as written: the script
only rewrites the derived fields and says which rows the inputs name that the data lacks. The live mode is
optional and never runs in CI (tests call check() on the recorded inputs only).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "compat"
FIXTURES = ROOT / "tests" / "fixtures" / "regen"

# --------------------------------------------------------------------------- transformers


def _string(node: ast.AST) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _help_text(call: ast.AST) -> str:
    """The metadata help text of a dataclass `field(...)` (concatenated string constants)."""
    if not isinstance(call, ast.Call):
        return ""
    for kw in call.keywords:
        if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
            for key, value in zip(kw.value.keys, kw.value.values):
                if key is not None and _string(key) == "help":
                    parts = [n.value for n in ast.walk(value) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                    return " ".join(parts)
    return ""


def _choices(call: ast.AST) -> List[str]:
    if not isinstance(call, ast.Call):
        return []
    for kw in call.keywords:
        if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
            for key, value in zip(kw.value.keys, kw.value.values):
                if key is not None and _string(key) == "choices" and isinstance(value, (ast.List, ast.Tuple)):
                    return [s for s in (_string(e) for e in value.elts) if s is not None]
    return []


_DEPRECATED = re.compile(r"deprecat", re.I)


def extract_training_args(source: str, tracked: Iterable[str]) -> Dict[str, List[str]]:
    """{'present': [...], 'deprecated': [...]} among `tracked` option names (NAME or NAME=VALUE) for one release."""
    tree = ast.parse(source)
    fields: Dict[str, ast.AST] = {}
    optims: set = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    fields[stmt.target.id] = stmt.value if stmt.value is not None else ast.Constant(None)
        if isinstance(node, ast.ClassDef) and node.name == "OptimizerNames":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and _string(stmt.value) is not None:
                    optims.add(_string(stmt.value))
    warned = _deprecation_warnings(tree)
    present, deprecated = [], []
    for name in tracked:
        option, _, value = name.partition("=")
        if option not in fields:
            continue
        if value:
            values = optims if option == "optim" else set(_choices(fields[option]))
            if value in values:
                present.append(name)
            continue
        present.append(name)
        help_text = _help_text(fields[option])
        if _DEPRECATED.search(help_text) and not re.search(r"deprecated (alias|in favor) of `?" + option, help_text) \
                or option in warned:
            deprecated.append(name)
        elif re.search(r"deprecated alias of", help_text, re.I):
            deprecated.append(name)
    return {"present": sorted(present), "deprecated": sorted(deprecated)}


def _deprecation_warnings(tree: ast.AST) -> set:
    """Option names a warnings.warn / logger.warning in the module calls deprecated ('`no_cuda` is deprecated')."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("warn", "warning", "warning_once") and node.args:
            text = " ".join(n.value for n in ast.walk(node.args[0]) if isinstance(n, ast.Constant)
                            and isinstance(n.value, str))
            for m in re.finditer(r"`?-?-?(\w+)`? (?:is|has been) deprecated", text):
                out.add(m.group(1))
    return out


_TORCH_GATE = re.compile(r"is_torch_greater_or_equal_than_(\d+)_(\d+)$")


def extract_default_optim(source: str) -> Dict[str, Optional[str]]:
    """TrainingArguments' default optim in one release: {'default': name, 'fused_with_torch': 'X.Y' or None}.

    From 4.54 the class body reads `default_optim = "adamw_torch"` and, under `if is_torch_greater_or_equal_than_2_8`,
    `default_optim = "adamw_torch_fused"`; older releases give the `optim` field a constant default."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            return _class_default_optim(node)
    return {"default": None, "fused_with_torch": None}


def _class_default_optim(cls: ast.ClassDef) -> Dict[str, Optional[str]]:
    default: Optional[str] = None
    gate: Optional[str] = None
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "default_optim" for t in stmt.targets):
            default = _string(stmt.value) or default
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "optim" \
                and default is None and isinstance(stmt.value, ast.Call):
            for kw in stmt.value.keywords:
                if kw.arg == "default":
                    default = _string(kw.value) or (kw.value.attr.lower() if isinstance(kw.value, ast.Attribute)
                                                    else None)
        elif isinstance(stmt, ast.If):
            gate = _fused_gate(stmt) or gate
    return {"default": default, "fused_with_torch": gate}


def _fused_gate(node: ast.If) -> Optional[str]:
    """'X.Y' when an `if is_torch_greater_or_equal_than_X_Y:` (at any depth) sets default_optim to the fused one."""
    for inner in ast.walk(node):
        if not isinstance(inner, ast.If) or not isinstance(inner.test, ast.Name):
            continue
        m = _TORCH_GATE.match(inner.test.id)
        sets_fused = any(isinstance(b, ast.Assign) and _string(b.value) == "adamw_torch_fused"
                         and any(isinstance(t, ast.Name) and t.id == "default_optim" for t in b.targets)
                         for b in inner.body)
        if m and sets_fused:
            return f"{m.group(1)}.{m.group(2)}"
    return None


def derive_fused_default(records: Mapping[str, Mapping[str, Optional[str]]]) -> Tuple[Optional[str], Optional[str]]:
    """(first minor 'X.Y' whose Trainer defaults to fused AdamW, its torch gate) when the recorded release just before
    it does not; (None, None) when no recorded release has it or the edge lies between unrecorded minors."""
    ordered = sorted(records, key=Version)
    for i, release in enumerate(ordered):
        gate = records[release].get("fused_with_torch")
        if gate is None:
            continue
        v = Version(release)
        before = Version(ordered[i - 1]) if i else None
        if before is None or records[ordered[i - 1]].get("fused_with_torch") is not None or \
                (before.major, before.minor + 1) != (v.major, v.minor):
            return None, None  # the edge is not pinned by two adjacent recorded minors
        return f"{v.major}.{v.minor}", gate
    return None, None


def derive_ranges(records: Mapping[str, Mapping[str, Sequence[str]]], name: str
                  ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(introduced, deprecated, removed) of `name` over releases oldest to newest: the first release that has
    it, the first that marks it deprecated, the first after that without it."""
    introduced = deprecated = removed = None
    seen = False
    for release in sorted(records, key=Version):
        rec = records[release]
        has = name in rec["present"]
        if has and not seen:
            introduced, seen = release, True
        if has and deprecated is None and name in rec.get("deprecated", ()):
            deprecated = release
        if seen and not has and removed is None:
            removed = release
    return introduced, deprecated, removed


# --------------------------------------------------------------------------- accelerate


def extract_config_keys(source: str) -> List[str]:
    """Dataclass fields of BaseConfig and ClusterConfig in accelerate/commands/config/config_args.py."""
    tree = ast.parse(source)
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in ("BaseConfig", "ClusterConfig"):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    keys.add(stmt.target.id)
    return sorted(keys)


def extract_accelerate_options(launch_source: str, state_source: str, tracked: Iterable[str]) -> Dict[str, List[str]]:
    """{'present': [...], 'deprecated': [...]} among `tracked` launch flags (--name, from the add_argument calls of
    accelerate/commands/launch.py) and backend values (a string constant of accelerate/state.py) of one release.
    A flag is deprecated when its help says so or a warning says '<name> flag is deprecated'; a value when a warning
    of state.py calls it deprecated."""
    launch, state = ast.parse(launch_source) if launch_source else None, ast.parse(state_source) if state_source else None
    flags: Dict[str, str] = {}
    for node in ast.walk(launch) if launch else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a for a in (_string(x) for x in node.args) if a and a.startswith("--")]
            help_text = next((" ".join(n.value for n in ast.walk(kw.value) if isinstance(n, ast.Constant)
                                       and isinstance(n.value, str)) for kw in node.keywords if kw.arg == "help"), "")
            flags.update({n: help_text for n in names})
    warned = _warning_texts(launch) + _warning_texts(state)
    values = {n.value for n in ast.walk(state) if isinstance(n, ast.Constant) and isinstance(n.value, str)} \
        if state else set()
    present, deprecated = [], []
    for name in tracked:
        if name.startswith("--"):
            if name not in flags:
                continue
            bare = name[2:]
            gone = _DEPRECATED.search(flags[name]) or any(re.search(rf"\b{bare} flag is deprecated", t) for t in warned)
        else:
            if name not in values:
                continue
            gone = any(re.search(rf"\b{name}\b.*deprecat|deprecat.*\b{name}\b", t, re.I) for t in warned)
        present.append(name)
        if gone:
            deprecated.append(name)
    return {"present": sorted(present), "deprecated": sorted(deprecated)}


def _warning_texts(tree: Optional[ast.AST]) -> List[str]:
    out = []
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("warn", "warning", "warning_once") and node.args:
            out.append(" ".join(n.value for n in ast.walk(node.args[0]) if isinstance(n, ast.Constant)
                                and isinstance(n.value, str)))
    return out


# --------------------------------------------------------------------------- CPUs

# intel-family.h macro -> the microarchitecture name in compat/microarch.toml (curated: the kernel names the
# platform, cpuperf the core generation). Macros not listed are ignored on purpose (pre-AVX CPUs, Atom and
# Xeon Phi parts cpuperf does not plan for) only if they are in INTEL_IGNORED; any other is reported as new.
INTEL_NAMES = {
    "SANDYBRIDGE": "sandybridge", "SANDYBRIDGE_X": "sandybridge", "IVYBRIDGE": "ivybridge", "IVYBRIDGE_X": "ivybridge",
    "HASWELL": "haswell", "HASWELL_X": "haswell", "HASWELL_L": "haswell", "HASWELL_G": "haswell",
    "BROADWELL": "broadwell", "BROADWELL_G": "broadwell", "BROADWELL_X": "broadwell", "BROADWELL_D": "broadwell",
    "SKYLAKE_L": "skylake", "SKYLAKE": "skylake", "KABYLAKE_L": "skylake", "KABYLAKE": "skylake",
    "COMETLAKE": "skylake", "COMETLAKE_L": "skylake", "SKYLAKE_X": "skylake_avx512+",
    "CANNONLAKE_L": "cannonlake",
    "ICELAKE_X": "icelake", "ICELAKE_D": "icelake", "ICELAKE": "icelake", "ICELAKE_L": "icelake",
    "ICELAKE_NNPI": "icelake", "ROCKETLAKE": "icelake", "TIGERLAKE_L": "icelake", "TIGERLAKE": "icelake",
    "SAPPHIRERAPIDS_X": "sapphirerapids", "EMERALDRAPIDS_X": "emeraldrapids",
    "GRANITERAPIDS_X": "graniterapids", "GRANITERAPIDS_D": "graniterapids",
    "DIAMONDRAPIDS_X": "diamondrapids", "PANTHERCOVE_X": "diamondrapids", "BARTLETTLAKE": "bartlettlake",
    "LAKEFIELD": "lakefield", "ALDERLAKE": "alderlake", "ALDERLAKE_L": "alderlake",
    "RAPTORLAKE": "raptorlake", "RAPTORLAKE_P": "raptorlake", "RAPTORLAKE_S": "raptorlake",
    "METEORLAKE": "meteorlake", "METEORLAKE_L": "meteorlake",
    "ARROWLAKE_H": "arrowlake", "ARROWLAKE": "arrowlake", "ARROWLAKE_U": "arrowlake", "LUNARLAKE_M": "lunarlake",
    "PANTHERLAKE_L": "pantherlake", "PANTHERLAKE_R": "pantherlake", "WILDCATLAKE_L": "wildcatlake", "NOVALAKE": "novalake", "NOVALAKE_L": "novalake",
    "ATOM_GRACEMONT": "alderlake_n", "ATOM_CRESTMONT_X": "sierraforest", "ATOM_CRESTMONT": "grandridge",
    "ATOM_DARKMONT_X": "clearwaterforest",
}
INTEL_IGNORED = re.compile(r"^(ANY|FAM\d_\w+|PENTIUM\w*|P4_\w+|QUARK\w*|CORE_\w+|CORE2_\w+|NEHALEM\w*|WESTMERE\w*|"
                           r"ATOM_(BONNELL|SALTWELL|SILVERMONT|AIRMONT|GOLDMONT|TREMONT)\w*|XEON_PHI_\w+)$")
_IFM = re.compile(r"^#define\s+INTEL_(\w+)\s+IFM\(\s*(\d+)\s*,\s*(0x[0-9A-Fa-f]+|\d+)\s*\)", re.M)


def parse_intel_family(text: str) -> List[Tuple[str, int, int]]:
    """(macro without INTEL_, family, model) for every IFM() define in intel-family.h."""
    return [(m.group(1), int(m.group(2)), int(m.group(3), 0)) for m in _IFM.finditer(text)]


def intel_models(text: str) -> Tuple[Dict[Tuple[str, int], List[int]], List[str]]:
    """({(name, family): sorted models}, macros the map does not know): Intel rows of microarch.toml."""
    out: Dict[Tuple[str, int], List[int]] = {}
    unknown = []
    for macro, family, model in parse_intel_family(text):
        name = INTEL_NAMES.get(macro)
        if name is None:
            if not INTEL_IGNORED.match(macro):
                unknown.append(f"INTEL_{macro} IFM({family}, {model:#04x})")
            continue
        out.setdefault((name, family), [])
        if model not in out[(name, family)]:
            out[(name, family)].append(model)
    return {k: sorted(v) for k, v in out.items()}, unknown


_ZEN_CASE = re.compile(r"case\s+(0x[0-9a-fA-F]+)(?:\s*\.\.\.\s*(0x[0-9a-fA-F]+))?\s*:")
_ZEN_CAP = re.compile(r"X86_FEATURE_ZEN(\d?)\b")


def amd_ranges(text: str) -> Dict[Tuple[str, int], List[List[int]]]:
    """{(zenN, family): [[lo, hi], ...]} from the 'Figure out Zen generations' switch of amd.c."""
    start = text.find("Figure out Zen generations")
    if start < 0:
        raise ValueError("amd.c: the 'Figure out Zen generations' switch is not there")
    family: Optional[int] = None
    pending: List[List[int]] = []
    out: Dict[Tuple[str, int], List[List[int]]] = {}
    lines = text[start:].splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        case = _ZEN_CASE.search(stripped)
        if case and case.group(2) is None and _opens_model_switch(lines, i):
            family, pending = int(case.group(1), 16), []
            continue
        if case:
            lo = int(case.group(1), 16)
            pending.append([lo, int(case.group(2), 16) if case.group(2) else lo])
            continue
        cap = _ZEN_CAP.search(stripped)
        if cap and family is not None and pending:
            name = "zen" + (cap.group(1) if cap.group(1) not in ("", "1") else "")
            out.setdefault((name, family), []).extend(pending)
            pending = []
        if stripped.startswith("default:") and family is not None and not pending and _opens_model_switch(lines, i):
            break
    return {k: sorted(v) for k, v in out.items()}


def _opens_model_switch(lines: Sequence[str], i: int) -> bool:
    for nxt in lines[i + 1:]:
        t = nxt.strip()
        if not t or t.startswith(("/*", "*", "//")):
            continue
        return t.startswith("switch (c->x86_model)")
    return False


# --------------------------------------------------------------------------- torch wheels

_WHEEL = re.compile(r"^torch-(?P<v>[^-]+)-(?P<py>cp\d+)-(?P<abi>cp\d+[dmu]*t?)-(?P<plat>[^ ]+)\.whl$")


def torch_pythons(filenames: Iterable[str]) -> Dict[str, Dict[str, List[str]]]:
    """{version: {'linux_x86_64': ['3.10', '3.13t', ...], 'linux_aarch64': [...]}} from wheel file names."""
    out: Dict[str, Dict[str, set]] = {}
    for name in filenames:
        m = _WHEEL.match(name.strip())
        if not m or "linux" not in m.group("plat"):
            continue
        plat = "linux_aarch64" if "aarch64" in m.group("plat") else "linux_x86_64" if "x86_64" in m.group("plat") \
            else None
        if plat is None:
            continue
        abi = m.group("abi")  # cp36m (pymalloc ABI of 3.7 and older) / cp311 / cp313t (free-threaded)
        digits = re.sub(r"\D", "", abi)
        py = f"{digits[0]}.{digits[1:]}" + ("t" if abi.endswith("t") else "")
        out.setdefault(Version(m.group("v")).public, {}).setdefault(plat, set()).add(py)
    return {v: {p: sorted(s, key=_py_key) for p, s in plats.items()} for v, plats in out.items()}


def _py_key(py: str) -> Tuple[int, int, int]:
    major, minor = py.rstrip("t").split(".")
    return int(major), int(minor), int(py.endswith("t"))


# --------------------------------------------------------------------------- oneCCL bindings (intel/torch-ccl tags)

_CCL_TAG = re.compile(r"^v(?P<v>\d+\.\d+\.\d+)(?:\+(?P<label>cpu|gpu|xpu))?(?P<rc>\+rc\d+)?$")
_FIRST_CCL = Version("1.10.0")  # the first release under the oneccl_bind_pt / torch_ccl names the data covers


def ccl_releases(tag_lines: Iterable[str]) -> Dict[Tuple[str, str], str]:
    """{(version, device): local label for XPU builds ('' for CPU)} from intel/torch-ccl's release tags.

    A tag `vX.Y.Z[+cpu|+gpu|+xpu]` is a release; `...+rcN` counts only where no final tag of that build exists
    (v2.4.0+cpu+rc0 is the only 2.4.0 tag). +gpu/+xpu tags are Intel GPU builds; the CPU wheels' '+cpu' local
    label is added by setup.py, not named by every tag, so it is not derived."""
    tags = [line.split("\t")[0].strip() for line in tag_lines if line.strip() and not line.startswith("#")]
    finals = {t for t in tags if (m := _CCL_TAG.match(t)) and not m.group("rc")}
    out: Dict[Tuple[str, str], str] = {}
    for tag in tags:
        m = _CCL_TAG.match(tag)
        if m is None or Version(m.group("v")) < _FIRST_CCL:
            continue
        if m.group("rc") and tag[: m.start("rc")] in finals:
            continue
        label = m.group("label") or ""
        device = "xpu" if label in ("gpu", "xpu") else "cpu"
        out[(m.group("v"), device)] = f"+{label}" if device == "xpu" else ""
    return out


def regen_oneccl(text: str, fixtures: Path, report: Report) -> str:
    releases = ccl_releases((fixtures / "torch_ccl_tags.txt").read_text().splitlines())
    seen = set()

    def edit(table: str, body: str) -> Optional[Dict[str, str]]:
        if table != "oneccl":
            return None
        key = (json.loads(_get(body, "version") or '""'), json.loads(_get(body, "device") or '""'))
        if key not in releases:
            report.missing.append(f"oneccl.toml {key[0]} ({key[1]}): no release tag of intel/torch-ccl")
            return None
        seen.add(key)
        return {"local": _q(releases[key])} if key[1] == "xpu" else None

    out = _rewrite(text, "oneccl.toml", edit, report)
    report.missing.extend(f"intel/torch-ccl v{v} ({d}): a release tag oneccl.toml has no row for"
                          for v, d in sorted(set(releases) - seen, key=lambda k: (Version(k[0]), k[1])))
    return out


# --------------------------------------------------------------------------- IPEX wheels on the registry

_IPEX_WHEEL = re.compile(r"^intel_extension_for_pytorch-(?P<v>[^-]+)-(?P<py>cp\d+)-[^-]+-(?P<plat>[^\t ]+)\.whl"
                         r"(?:\t(?P<yanked>yanked))?$")


@dataclass
class IpexFiles:
    """One IPEX version's Linux x86_64 wheels on the registry."""

    python: List[str]
    yanked: bool  # every file yanked


def ipex_wheels(lines: Iterable[str]) -> Dict[str, IpexFiles]:
    """{version: IpexFiles} of the Linux x86_64 wheels of intel-extension-for-pytorch on the registry."""
    pythons: Dict[str, set] = {}
    yanked: Dict[str, bool] = {}
    for line in lines:
        m = _IPEX_WHEEL.match(line.strip("\n"))
        if m is None or "linux" not in m.group("plat") or "x86_64" not in m.group("plat"):
            continue
        version, digits = Version(m.group("v")).public, m.group("py")[2:]
        pythons.setdefault(version, set()).add(f"{digits[0]}.{digits[1:]}")
        yanked[version] = yanked.get(version, True) and bool(m.group("yanked"))
    return {v: IpexFiles(sorted(p, key=_py_key), yanked[v]) for v, p in pythons.items()}


def regen_ipex(text: str, fixtures: Path, report: Report) -> str:
    """pypi / pypi_yanked from the registry's files; a wheel's Python the row lacks is reported (the row's python is
    the union of those files and the release's own docs table, so it is checked, not rewritten)."""
    wheels = ipex_wheels((fixtures / "ipex_wheels.txt").read_text().splitlines())
    known = set()

    def edit(table: str, body: str) -> Optional[Dict[str, str]]:
        if table != "ipex":
            return None
        version = json.loads(_get(body, "version") or '""')
        known.add(version)
        rec = wheels.get(version)
        python = set(json.loads(_get(body, "python") or "[]"))
        for py in rec.python if rec else []:
            if py not in python:
                report.missing.append(f"ipex.toml {version}: the registry has a CPython {py} wheel the row lacks")
        return {"pypi": "true" if rec else "false", "pypi_yanked": "true" if rec and rec.yanked else "false"}

    out = _rewrite(text, "ipex.toml", edit, report)
    report.missing.extend(f"intel-extension-for-pytorch {v}: on the registry, not in ipex.toml"
                          for v in sorted(set(wheels) - known, key=Version))
    return out


# --------------------------------------------------------------------------- rewriting the TOML text


@dataclass
class Change:
    file: str
    row: str
    field: str
    old: str
    new: str


@dataclass
class Report:
    changes: List[Change] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)  # what the inputs name that the data has no row for

    def lines(self) -> List[str]:
        out = [f"{c.file}: {c.row}: {c.field} {c.old} -> {c.new}" for c in self.changes]
        return out + [f"not in the data: {m}" for m in self.missing]


_BLOCK = re.compile(r"(?ms)^\[\[(\w+)\]\]\n.*?(?=^\[\[|^\[|\Z)")


def _blocks(text: str) -> List[Tuple[int, int, str, str]]:
    """(start, end, table, body) of every [[table]] row."""
    return [(m.start(), m.end(), m.group(1), m.group(0)) for m in _BLOCK.finditer(text)]


def _get(body: str, key: str) -> Optional[str]:
    m = re.search(rf'(?m)^{key} = (.*)$', body)
    return m.group(1) if m else None


def _set(body: str, key: str, value: str) -> str:
    return re.sub(rf'(?m)^{key} = .*$', lambda _: f"{key} = {value}", body, count=1)


def _rewrite(text: str, fname: str, edit, report: Report) -> str:
    """Apply edit(table, body) -> {field: new TOML value} to each row; record what changed."""
    out, last = [], 0
    for start, end, table, body in _blocks(text):
        new_body = body
        for key, value in (edit(table, body) or {}).items():
            old = _get(new_body, key)
            if old is None or old == value:
                continue
            ident = _get(body, "name") or _get(body, "version") or table
            report.changes.append(Change(fname, f"[[{table}]] {ident}", key, old, value))
            new_body = _set(new_body, key, value)
        out.append(text[last:start] + new_body)
        last = end
    out.append(text[last:])
    return "".join(out)


def _q(value: Optional[str]) -> str:
    return json.dumps(value or "")


def regen_hf(text: str, fixtures: Path, report: Report) -> str:
    tf = json.loads((fixtures / "transformers_training_args.json").read_text())["releases"]
    acc = json.loads((fixtures / "accelerate_config_args.json").read_text())["releases"]
    acc_records = {v: {"present": keys} for v, keys in acc.items()}
    opts = json.loads((fixtures / "accelerate_options.json").read_text())["releases"]

    newest = {"transformers": max(tf, key=Version), "accelerate": max(acc, key=Version)}

    def edit(table: str, body: str) -> Optional[Dict[str, str]]:
        if table == "hf_data":  # the rows were checked through the newest recorded release
            package = json.loads(_get(body, "package") or '""')
            return {"through": _q(newest[package])} if package in newest else None
        if table != "hf":
            return None
        package, kind, name = (json.loads(_get(body, k) or '""') for k in ("package", "kind", "name"))
        if package == "transformers" and kind in ("trainer-arg", "value"):
            intro, dep, gone = derive_ranges(tf, name)
        elif package == "accelerate" and kind == "config-key":
            intro, dep, gone = derive_ranges(acc_records, name)
            dep = json.loads(_get(body, "deprecated") or '""') or None  # the loader does not mark deprecations
        elif package == "accelerate" and kind in ("launch-flag", "value"):
            intro, dep, gone = derive_ranges(opts, name)
        else:
            return None
        if intro is None:
            report.missing.append(f"{package} {name}: in no recorded release")
            return None
        return {"introduced": _q(intro), "deprecated": _q(dep), "removed": _q(gone)}

    return _rewrite(text, "hf.toml", edit, report)


def regen_microarch(text: str, fixtures: Path, report: Report) -> str:
    intel, unknown = intel_models((fixtures / "intel-family.h").read_text())
    amd = amd_ranges((fixtures / "amd-zen.c").read_text())
    report.missing.extend(f"intel-family.h {u}" for u in unknown)
    seen = set()

    def edit(table: str, body: str) -> Optional[Dict[str, str]]:
        if table != "x86":
            return None
        name, vendor = json.loads(_get(body, "name") or '""'), json.loads(_get(body, "vendor") or '""')
        family = int(_get(body, "family") or "0")
        if vendor == "GenuineIntel":
            key = (name, family)
            if name in ("skylake_avx512", "cascadelake", "cooperlake"):  # one model, told apart by stepping
                key = ("skylake_avx512+", family)
            if key not in intel:
                report.missing.append(f"microarch.toml {name} (family {family}): no model in intel-family.h")
                return None
            seen.add(key)
            return {"models": "[" + ", ".join(str(m) for m in intel[key]) + "]"}
        if vendor == "AuthenticAMD" and (name, family) in amd:
            seen.add((name, family))
            return {"model_ranges": "[" + ", ".join(f"[{lo}, {hi}]" for lo, hi in amd[(name, family)]) + "]"}
        return None

    out = _rewrite(text, "microarch.toml", edit, report)
    report.missing.extend(f"microarch.toml has no row for {n} (family {f}) of the kernel tables"
                          for n, f in sorted(set(intel) | set(amd)) if (n, f) not in seen)
    return out


def regen_torch(text: str, fixtures: Path, report: Report) -> str:
    names = (fixtures / "torch_wheels.txt").read_text().split()
    pythons = torch_pythons(names)

    def edit(table: str, body: str) -> Optional[Dict[str, str]]:
        if table != "torch":
            return None
        version = json.loads(_get(body, "version") or '""')
        plats = pythons.get(version)
        if plats is None:
            report.missing.append(f"torch {version}: no wheel in the recorded simple index")
            return None
        out = {}
        for plat, key in (("linux_x86_64", "python"), ("linux_aarch64", "python_aarch64")):
            if plat in plats:
                out[key] = "[" + ", ".join(json.dumps(p) for p in plats[plat]) + "]"
        return out

    out = _rewrite(text, "torch.toml", edit, report)
    known = {json.loads(_get(b, "version") or '""') for _, _, t, b in _blocks(text) if t == "torch"}
    oldest = min((Version(v) for v in known), default=None)
    report.missing.extend(f"torch {v}: in the simple index, not in torch.toml" for v in sorted(pythons, key=Version)
                          if v not in known and oldest is not None and Version(v) > oldest
                          and not Version(v).is_prerelease)
    return out


def regen_tuning(text: str, fixtures: Path, report: Report) -> str:
    """[hf_trainer] default_fused_min_transformers / _torch from the recorded default optim of each release."""
    records = json.loads((fixtures / "transformers_default_optim.json").read_text())["releases"]
    first, gate = derive_fused_default(records)
    if first is None or gate is None:
        report.missing.append("tuning.toml [hf_trainer]: no two adjacent recorded minors pin the fused-default edge")
        return text
    for key, value in (("default_fused_min_transformers", first), ("default_fused_min_torch", gate)):
        text = _set_in_section(text, "hf_trainer", key, json.dumps(value), report)
    return text


def _set_in_section(text: str, section: str, key: str, value: str, report: Report) -> str:
    m = re.search(rf"(?ms)^\[{section}\]\n.*?(?=^\[|\Z)", text)
    if m is None:
        report.missing.append(f"tuning.toml has no [{section}]")
        return text
    body = m.group(0)
    old = _get(body, key)
    if old is None:
        report.missing.append(f"tuning.toml [{section}] has no {key}")
        return text
    if old == value:
        return text
    report.changes.append(Change("tuning.toml", f"[{section}]", key, old, value))
    return text[:m.start()] + _set(body, key, value) + text[m.end():]


REGEN = {"hf.toml": regen_hf, "microarch.toml": regen_microarch, "torch.toml": regen_torch,
         "tuning.toml": regen_tuning, "oneccl.toml": regen_oneccl, "ipex.toml": regen_ipex}


def regenerate(compat: Path = COMPAT, fixtures: Path = FIXTURES) -> Tuple[Dict[str, str], Report]:
    """{file name: regenerated text}, and what changed or is missing, from the recorded inputs."""
    report = Report()
    out = {name: fn((compat / name).read_text(encoding="utf-8"), fixtures, report) for name, fn in REGEN.items()}
    return out, report


def check(compat: Path = COMPAT, fixtures: Path = FIXTURES) -> Report:
    """What regenerating would change (empty changes = the committed data equals the recorded inputs)."""
    return regenerate(compat, fixtures)[1]


# --------------------------------------------------------------------------- live recording (never in CI)


def _pip_download(spec: str, dest: str) -> Optional[Path]:
    before = set(Path(dest).iterdir())
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "-d", dest, "-q", spec], capture_output=True, text=True, timeout=600)
    new = [p for p in Path(dest).iterdir() if p not in before and p.suffix == ".whl"]
    if proc.returncode != 0 or not new:
        name = spec.split("==", maxsplit=1)[0]
        have = [p for p in Path(dest).glob(f"{name}-*.whl") if spec.split("==")[1] in p.name]
        return have[0] if have else None
    return new[0]


def _versions(package: str) -> List[Version]:
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package], capture_output=True,
                          text=True, timeout=300)
    m = re.search(r"Available versions: (.*)", proc.stdout)
    return sorted(Version(v) for v in m.group(1).split(", ")) if m else []


def _first_of_each_minor(versions: Iterable[Version], since: Version) -> List[Version]:
    first: Dict[Tuple[int, int], Version] = {}
    for v in sorted(versions):
        if v >= since and not v.is_prerelease:
            first.setdefault((v.major, v.minor), v)
    return list(first.values())


def record_transformers(fixtures: Path, tracked: Sequence[str]) -> None:
    versions = _versions("transformers")
    wanted = _first_of_each_minor(versions, Version("2.8.0"))
    for major in {v.major for v in wanted}:  # the last patch of every finished major: where removals show
        last = max((v for v in versions if v.major == major and not v.is_prerelease), default=None)
        if last is not None and last not in wanted and any(v.major > major for v in versions):
            wanted.append(last)
    releases: Dict[str, object] = {}
    optims: Dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for v in sorted(wanted):
            # x.y.0 first even when yanked (pip's index listing hides yanked releases; 4.57.0 is where use_ipex
            # is gone), else the first release of the minor that has a wheel
            x0 = Version(f"{v.major}.{v.minor}.0")
            wheel = _pip_download(f"transformers=={x0}", tmp) if x0 != v else None
            v = x0 if wheel is not None else v
            wheel = wheel or _pip_download(f"transformers=={v}", tmp)
            if wheel is None:
                continue
            with zipfile.ZipFile(wheel) as z:
                names = z.namelist()
                src = z.read("transformers/training_args.py").decode() if "transformers/training_args.py" in names \
                    else ""
            releases[str(v)] = extract_training_args(src, tracked) if src else {"present": [], "deprecated": []}
            if src:
                optims[str(v)] = extract_default_optim(src)
            wheel.unlink()
    _dump(fixtures / "transformers_training_args.json", "transformers/training_args.py of the first wheel of "
          "every minor release (and the last patch of each finished major)", releases)
    _dump(fixtures / "transformers_default_optim.json", "TrainingArguments' default optim (default_optim and its "
          "is_torch_greater_or_equal_than_X_Y gate) in transformers/training_args.py of the same wheels", optims)


class NotAWheelRelease(ValueError):
    """The installed package cannot stand for a release's first wheel (not x.y.0, or not the wheel's file)."""


def installed_wheel_file(dist: str, path: str, search: Optional[Sequence[str]] = None) -> Tuple[Version, str]:
    """(version, text) of `path` in the installed `dist` (found on `search`, None = this interpreter's sys.path),
    checked against the sha256 that pip wrote into the dist-info RECORD from the wheel: a file edited after
    installing, or an editable install, is refused."""
    import base64
    import hashlib
    import importlib.metadata

    found = list(importlib.metadata.distributions(name=dist, path=list(search) if search is not None else sys.path))
    if not found:
        raise importlib.metadata.PackageNotFoundError(dist)
    d = found[0]
    entry = next((f for f in d.files or () if f.as_posix() == path), None)
    if entry is None or entry.hash is None or entry.hash.mode != "sha256":
        raise NotAWheelRelease(f"{dist} {d.version}: {path} has no sha256 in its RECORD (not installed from a wheel)")
    data = Path(str(d.locate_file(entry))).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if digest != entry.hash.value:
        raise NotAWheelRelease(f"{dist} {d.version}: {path} differs from the wheel's (RECORD sha256)")
    return Version(d.version), data.decode()


def record_transformers_release(fixtures: Path, version: Version, source: str, tracked: Sequence[str],
                                how: str) -> None:
    """Add one minor's first wheel (x.y.0) to both transformers inputs, as record_transformers records each
    release; `how` says where the file was read, for the default-optim input's source line."""
    if version.is_prerelease or version.is_devrelease or version.micro != 0 or version.local:
        raise NotAWheelRelease(f"transformers {version}: only an x.y.0 release stands for its minor here "
                               "(whether x.y.0 has a wheel is --live's to find out)")
    args_path, optim_path = fixtures / "transformers_training_args.json", fixtures / "transformers_default_optim.json"
    args, optims = json.loads(args_path.read_text()), json.loads(optim_path.read_text())
    args["releases"][str(version)] = extract_training_args(source, tracked)
    optims["releases"][str(version)] = extract_default_optim(source)
    _dump(args_path, args["source"], args["releases"])
    _dump(optim_path, f"{optims['source']}; {version} {how}", optims["releases"])


def record_installed_transformers(fixtures: Path, tracked: Sequence[str]) -> Version:
    """Record the transformers installed in this interpreter (its wheel's training_args.py) as its release."""
    import datetime

    version, source = installed_wheel_file("transformers", "transformers/training_args.py")
    record_transformers_release(fixtures, version, source, tracked,
                                f"from the installed wheel (RECORD sha256 checked), recorded {datetime.date.today()} "
                                "with --installed-transformers")
    return version


def _member(z: zipfile.ZipFile, path: str) -> str:
    return z.read(path).decode() if path in z.namelist() else ""


def record_accelerate(fixtures: Path, tracked: Sequence[str] = ()) -> None:
    releases: Dict[str, object] = {}
    options: Dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for v in _first_of_each_minor(_versions("accelerate"), Version("0.1.0")):
            wheel = _pip_download(f"accelerate=={v}", tmp)
            if wheel is None:
                continue
            with zipfile.ZipFile(wheel) as z:
                path = "accelerate/commands/config/config_args.py"
                releases[str(v)] = extract_config_keys(_member(z, path)) if path in z.namelist() else []
                options[str(v)] = extract_accelerate_options(_member(z, "accelerate/commands/launch.py"),
                                                             _member(z, "accelerate/state.py"), tracked)
            wheel.unlink()
    _dump(fixtures / "accelerate_config_args.json", "dataclass fields of BaseConfig/ClusterConfig in "
          "accelerate/commands/config/config_args.py of the first wheel of every minor release", releases)
    _dump(fixtures / "accelerate_options.json", "tracked launch flags (add_argument calls of "
          "accelerate/commands/launch.py) and backend values (string constants of accelerate/state.py), with their "
          "deprecation warnings, in the first wheel of every minor release", options)


def index_files(project: str) -> List[Tuple[str, bool]]:
    """(file name, yanked) of every file on `project`'s page of the simple index pip uses (pip's own finder)."""
    from pip._internal.commands.download import DownloadCommand  # the registry's ordinary client

    cmd = DownloadCommand("download", "")
    options, _ = cmd.parse_args(["--only-binary", ":all:"])
    from pip._internal.index.collector import parse_links

    found: Dict[str, bool] = {}

    def every_link(page_link):  # all files on the page, not only those this Python could install
        response = finder._link_collector.fetch_response(page_link)
        if response is not None:
            for link in parse_links(response):
                found[link.filename] = found.get(link.filename, False) or link.is_yanked
        return []

    with cmd.main_context():
        session = cmd.get_default_session(options)
        finder = cmd._build_package_finder(options=options, session=session)
        for sources in finder._link_collector.collect_sources(project_name=project, candidates_from_page=every_link):
            for source in sources:
                if source is not None:
                    list(source.page_candidates())
    return sorted(found.items())


def record_torch(fixtures: Path) -> None:
    """The Linux wheel file names of torch in the simple index."""
    names = [n for n, _ in index_files("torch") if n.endswith(".whl") and "linux" in n]
    (fixtures / "torch_wheels.txt").write_text("\n".join(names) + "\n")


def record_ipex(fixtures: Path) -> None:
    """The wheel file names of intel-extension-for-pytorch in the simple index, each marked when yanked."""
    import datetime

    lines = [f"# Recorded input for tools/regen_compat.py: the wheel files of intel-extension-for-pytorch in the "
             f"registry's simple index (name<TAB>yanked), read {datetime.date.today()}"]
    lines += [f"{n}\t{'yanked' if y else ''}".rstrip() for n, y in index_files("intel-extension-for-pytorch")
              if n.endswith(".whl")]
    (fixtures / "ipex_wheels.txt").write_text("\n".join(lines) + "\n")


def record_kernel(fixtures: Path, linux: Path) -> None:
    (fixtures / "intel-family.h").write_text((linux / "arch/x86/include/asm/intel-family.h").read_text())
    amd = (linux / "arch/x86/kernel/cpu/amd.c").read_text()
    start = amd.index("\t/* Figure out Zen generations: */")
    end = amd.index("warn:", start)
    (fixtures / "amd-zen.c").write_text("/* Linux arch/x86/kernel/cpu/amd.c, bsp_init_amd(), excerpt */\n"
                                        + amd[start:end])


def record_torch_ccl(fixtures: Path, checkout: Path) -> None:
    """The release tags of an intel/torch-ccl clone (git fetch --tags first), with their commits."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True,
                              timeout=120).stdout

    head = git("log", "-1", "--format=%h (%cs)").strip()
    lines = ["# Recorded input for tools/regen_compat.py: the tags of https://github.com/intel/torch-ccl (tag<TAB>commit),",
             f"# read from a clone whose newest commit is {head}; python -m tools.regen_compat --torch-ccl DIR re-records."]
    for tag in sorted(git("tag").split(), key=_tag_key):
        lines.append(f"{tag}\t{git('rev-parse', '--short=7', tag + '^{commit}').strip()}")
    (fixtures / "torch_ccl_tags.txt").write_text("\n".join(lines) + "\n")


def _tag_key(tag: str) -> Tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", tag)) or (0,)


def _recorders(linux: Optional[Path], torch_ccl: Optional[Path] = None) -> List[Callable[[Path], None]]:
    out: List[Callable[[Path], None]] = [lambda d: record_transformers(d, _tracked()),
                                         lambda d: record_accelerate(d, _tracked_accelerate()), record_torch, record_ipex]
    if linux is not None:
        out.append(lambda d: record_kernel(d, linux))
    if torch_ccl is not None:
        out.append(lambda d: record_torch_ccl(d, torch_ccl))
    return out


def check_upstream(fixtures: Path = FIXTURES, recorders: Optional[Sequence[Callable[[Path], None]]] = None,
                   compat: Path = COMPAT) -> Tuple[Report, List[str]]:
    """Record the newest inputs into a scratch copy of `fixtures` (nothing committed moves) and say what the data
    would change, and which recorded inputs differ from the committed ones."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "regen"
        shutil.copytree(fixtures, scratch)
        for record in recorders if recorders is not None else _recorders(None):
            record(scratch)
        moved = [p.name for p in sorted(scratch.iterdir())
                 if not (fixtures / p.name).exists() or (fixtures / p.name).read_bytes() != p.read_bytes()]
        return check(compat, scratch), moved


def _dump(path: Path, source: str, releases: Mapping[str, object]) -> None:
    ordered = {k: releases[k] for k in sorted(releases, key=Version)}
    path.write_text(json.dumps({"source": source, "releases": ordered}, indent=1, sort_keys=False) + "\n")


def _tracked_accelerate() -> List[str]:
    """The accelerate launch-flag and value rows of hf.toml (config keys are all recorded)."""
    text = (COMPAT / "hf.toml").read_text()
    return [json.loads(_get(body, "name") or '""') for _, _, table, body in _blocks(text)
            if table == "hf" and json.loads(_get(body, "package") or '""') == "accelerate"
            and json.loads(_get(body, "kind") or '""') in ("launch-flag", "value")]


def _tracked() -> List[str]:
    """The transformers rows regen_hf derives (trainer-arg and value): the sharding-arg rows are curated by hand
    (their values, like fsdp=true, are no option names), so a record naming them would disagree with every
    recorded release before it."""
    text = (COMPAT / "hf.toml").read_text()
    return [json.loads(_get(body, "name") or '""') for _, _, table, body in _blocks(text)
            if table == "hf" and json.loads(_get(body, "package") or '""') == "transformers"
            and json.loads(_get(body, "kind") or '""') in ("trainer-arg", "value")]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.regen_compat", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="no network, nothing written (CI): exit 1 when compat/ differs from what the recorded inputs "
                         "give or lacks a row they have")
    ap.add_argument("--write", action="store_true", help="rewrite compat/ (default: only say what would change)")
    ap.add_argument("--live", action="store_true", help="re-record the inputs first (network; never in CI)")
    ap.add_argument("--installed-transformers", action="store_true",
                    help="first record the transformers installed in this interpreter (an x.y.0 wheel, its "
                         "training_args.py checked against the RECORD) as its release; no network")
    ap.add_argument("--linux", type=Path, help="a Linux source checkout to record the kernel tables from")
    ap.add_argument("--torch-ccl", type=Path, help="an intel/torch-ccl clone to record the release tags from")
    ap.add_argument("--check-upstream", action="store_true",
                    help="record the newest inputs into a scratch copy (network; never in CI) and print what the data "
                         "would change; nothing is written")
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    args = ap.parse_args(argv)
    if args.check and (args.write or args.live or args.check_upstream or args.installed_transformers):
        ap.error("--check compares only: it takes no --write, --live, --installed-transformers or --check-upstream")
    if args.check_upstream:
        return _print_upstream(*check_upstream(args.fixtures, _recorders(args.linux, args.torch_ccl)))
    if args.live:
        record_transformers(args.fixtures, _tracked())
        record_accelerate(args.fixtures, _tracked_accelerate())
        record_torch(args.fixtures)
        record_ipex(args.fixtures)
        if args.linux:
            record_kernel(args.fixtures, args.linux)
        if args.torch_ccl:
            record_torch_ccl(args.fixtures, args.torch_ccl)
    if args.installed_transformers:
        try:
            print(f"recorded transformers {record_installed_transformers(args.fixtures, _tracked())}", file=sys.stderr)
        except (NotAWheelRelease, ImportError) as exc:
            print(f"--installed-transformers: {exc}", file=sys.stderr)
            return 2
    texts, report = regenerate(COMPAT, args.fixtures)
    for line in report.lines():
        print(line)
    if args.write:
        for name, text in texts.items():
            (COMPAT / name).write_text(text, encoding="utf-8")
    if not report.changes and not (args.check and report.missing):
        print("compat/ equals what the recorded inputs give", file=sys.stderr)
    if args.check:
        return 1 if report.changes or report.missing else 0
    return 1 if report.changes and not args.write else 0


def _print_upstream(report: Report, moved: Sequence[str]) -> int:
    for name in moved:
        print(f"newer input: {name}")
    for line in report.lines():
        print(line)
    if moved or report.changes or report.missing:
        print("update with: python -m tools.regen_compat --live --write (add rows the data lacks by hand)",
              file=sys.stderr)
        return 1
    print("the recorded inputs are the newest upstream offers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["check", "check_upstream", "regenerate", "record_transformers_release", "installed_wheel_file", "extract_training_args", "extract_default_optim", "extract_config_keys", "intel_models", "amd_ranges",
           "torch_pythons", "derive_ranges"]
