"""The docs tell the truth: docs/architecture.md is checked against the code (every module named, no module
that does not exist, its layer table equal to the import-linter contract in pyproject.toml and to the real
imports, its list of known exceptions equal to the real ones), README's links into docs/ resolve, and every
command of `cpuperf --help` has its section in docs/commands.md."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

from cli_util import run_cli

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "cpuperf"
ARCH = ROOT / "docs" / "architecture.md"
EVERYTHING_BELOW = "everything below"
OUTSIDE_PKG = ("tests", "benchmarks", "tools", "compat", "docs", ".ci")


def _toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads(path.read_text())


def modules() -> Dict[str, Path]:
    """Every module of the package: dotted name -> file (a package's __init__.py under the package's name)."""
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def imports_of(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The cpuperf modules `name` imports, at any depth of its code (`from a import b` is a.b when that is a module)."""
    is_pkg = path.name == "__init__.py"
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "cpuperf")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cpuperf":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known
            found.update(subs or {target})
    return found


def top_package(module: str) -> str:
    """The unit of the layers: cpuperf.<first part> (cpuperf itself for the root package)."""
    return ".".join(module.split(".")[:2])


def section(text: str, heading: str) -> str:
    """The text under a markdown heading (any level), up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert m, f"docs/architecture.md has no heading {heading!r}"
    level = len(m.group(1))
    rest = text[m.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def table(text: str) -> List[List[str]]:
    """The rows of the first markdown table in text, header and rule left out."""
    rows = [line.strip().strip("|").split("|") for line in text.splitlines() if line.strip().startswith("|")]
    return [[c.strip() for c in row] for row in rows[2:]]


def ticks(cell: str) -> List[str]:
    return re.findall(r"`([^`]+)`", cell)


def page_module(token: str, known: Dict[str, Path]) -> str | None:
    """The module a backticked token of the page names, '' for a token that names no module of cpuperf, or None
    when it looks like one but none exists."""
    if re.fullmatch(r"cpuperf(\.\w+)+", token):
        return token if token in known else None
    if re.fullmatch(r"[\w./]+\.py", token):
        rel = token[len("cpuperf/"):] if token.startswith("cpuperf/") else token
        if rel.split("/")[0] in OUTSIDE_PKG:
            return ""
        by_path = {_rel(p): m for m, p in known.items()}
        return by_path.get(rel)
    return ""


def arch_text() -> str:
    return ARCH.read_text()


# --- modules ---------------------------------------------------------------------------------------------

def test_every_module_of_the_package_is_on_the_architecture_page():
    known = modules()
    named = {page_module(t, known) for t in ticks(arch_text())}
    missing = sorted(m for m in known if m not in named)
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_architecture_page_names_no_module_that_does_not_exist():
    known = modules()
    ghosts = sorted({t for t in ticks(arch_text()) if page_module(t, known) is None})
    assert not ghosts, f"docs/architecture.md names modules that do not exist: {ghosts}"


# --- layers ----------------------------------------------------------------------------------------------

def contract() -> Tuple[List[List[str]], List[bool], Dict[str, Set[str]]]:
    """pyproject's layers (top first), whether each layer's packages are independent, and the forbidden imports."""
    cfg = _toml(ROOT / "pyproject.toml")["tool"]["importlinter"]["contracts"]
    layers_c = next(c for c in cfg if c["type"] == "layers")
    layers, independent = [], []
    for layer in layers_c["layers"]:
        sep = "|" if "|" in layer else ":"
        layers.append([p.strip() for p in layer.split(sep)])
        independent.append(sep == "|")
    forbidden: Dict[str, Set[str]] = {}
    for c in cfg:
        if c["type"] == "forbidden":
            for src in c["source_modules"]:
                forbidden.setdefault(src, set()).update(c["forbidden_modules"])
    return layers, independent, forbidden


def page_layers() -> List[Tuple[int, str, Set[str]]]:
    """The page's layer table: (layer number, package, the packages it may import)."""
    rows = []
    for cells in table(section(arch_text(), "Layers")):
        number, package, may = cells[0], ticks(cells[1]), cells[-1]
        assert number.isdigit() and len(package) == 1, f"a layer row is (number | `package` | ... | may import): {cells}"
        allowed = {f"cpuperf.{t}" for t in ticks(may)}
        rows.append((int(number), package[0], allowed | ({EVERYTHING_BELOW} if EVERYTHING_BELOW in may else set())))
    return rows


def test_the_layer_table_is_the_import_contract():
    layers, independent, forbidden = contract()
    rows = page_layers()
    assert [sorted(p for n, p, _ in rows if n == i + 1) for i in range(len(layers))] == [sorted(l) for l in layers]
    assert len(rows) == sum(len(l) for l in layers), "a package is listed twice"
    for number, package, allowed in rows:
        below = {p for layer in layers[number:] for p in layer}
        expected = below | (set() if independent[number - 1] else set(layers[number - 1]) - {package})
        expected -= forbidden.get(package, set())
        claimed = (allowed - {EVERYTHING_BELOW}) | (below if EVERYTHING_BELOW in allowed else set())
        assert claimed == expected, (package, "page says", sorted(claimed), "contract says", sorted(expected))


def test_every_real_import_keeps_to_the_layer_table():
    known = modules()
    allowed = {}
    layers = contract()[0]
    for number, package, may in page_layers():
        below = {p for layer in layers[number:] for p in layer}
        allowed[package] = (may - {EVERYTHING_BELOW}) | (below if EVERYTHING_BELOW in may else set())
    wrong = []
    for name, path in known.items():
        src = top_package(name)
        for target in imports_of(name, path, set(known)):
            dst = top_package(target)
            if dst not in (src, "cpuperf") and dst not in allowed[src]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_no_command_imports_another_and_the_page_says_the_contract_enforces_it():
    known = modules()
    real = {(name, target) for name, path in known.items() if name.startswith("cpuperf.commands.")
            for target in imports_of(name, path, set(known))
            if target.startswith("cpuperf.commands.") and target != name}
    assert real == set(), sorted(real)
    contracts = _toml(ROOT / "pyproject.toml")["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence")
    commands = {n for n in known if n.startswith("cpuperf.commands.")}
    assert set(independent["modules"]) == commands  # a new command is covered the day it is added
    assert "independence contract" in arch_text()


# --- who reads the OS ------------------------------------------------------------------------------------

def _strings(tree: ast.AST) -> List[str]:
    """String constants of the code, docstrings left out (f-strings give their constant parts)."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _uses_environ(tree: ast.AST) -> bool:
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os" \
                and n.attr in ("environ", "environb", "getenv", "getenvb"):
            return True
        if isinstance(n, ast.ImportFrom) and n.module == "os" and {a.name for a in n.names} & {"environ", "getenv"}:
            return True
    return False


# row key on the page -> does this module's code do it
OS_READS = {
    "/proc": lambda tree: any(re.match(r"/(proc|sys)(/|$)", s) for s in _strings(tree)),
    "SLURM_": lambda tree: any(s.startswith("SLURM_") for s in _strings(tree)),
    "os.environ": _uses_environ,
}


def test_modules_outside_probe_that_read_the_os_are_exactly_the_listed_ones():
    known = modules()
    rows = table(section(arch_text(), "Modules outside probe/ that read the OS"))
    for key, reads in OS_READS.items():
        row = [r for r in rows if key in r[0]]
        assert len(row) == 1, f"one row of 'Modules outside probe/ that read the OS' names {key!r}"
        listed = {page_module(t, known) for t in ticks(row[0][1])}
        real = {name for name, path in known.items()
                if not name.startswith("cpuperf.probe") and reads(ast.parse(path.read_text()))}
        assert listed == real, (key, "page only", sorted(listed - real), "code only", sorted(real - listed))


# --- links and commands ----------------------------------------------------------------------------------

def test_every_docs_link_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for link in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if not link.startswith(("http://", "https://")) and not (page.parent / link).is_file():
                broken.append(f"{page.relative_to(ROOT)} -> {link}")
    assert not broken, broken
    readme_links = re.findall(r"\]\((docs/[^)#\s]+\.md)", (ROOT / "README.md").read_text())
    assert readme_links, "README links to no page of docs/"


def test_every_command_of_cpuperf_help_has_a_section_in_docs_commands():
    proc = run_cli(["--help"])
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("Commands:", 1)[1]
    commands = re.findall(r"^\s{2}([a-z][a-z-]*)\s", listed, re.M)
    assert len(commands) >= 8, commands
    text = (ROOT / "docs" / "commands.md").read_text()
    missing = [c for c in commands if not re.search(rf"^## `cpuperf {re.escape(c)}\b", text, re.M)]
    assert not missing, f"docs/commands.md has no section for: {missing}"


def _owners() -> List[Tuple[str, str]]:
    """(module path, name) for every owner the 'One owner per fact' table of the architecture page names."""
    text = ARCH.read_text().split("## One owner per fact", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    owners = []
    for row in rows:
        cell = row.rstrip(" |").rsplit("|", 1)[1]
        module = None
        for token in re.findall(r"`([^`]+)`", cell):
            if token.endswith(".py"):
                module = token
            else:
                assert module is not None, row
                owners.append((module, token))
    return owners


def _top_level_names(path: Path) -> Set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_every_fact_has_the_one_owner_the_page_names():
    owners = _owners()
    assert len(owners) >= 15
    defined = {path.relative_to(PKG).as_posix(): _top_level_names(path) for path in PKG.rglob("*.py")}
    for module, name in owners:
        assert name in defined.get(module, set()), f"{module} defines no {name}"
        others = sorted(m for m, names in defined.items() if name in names and m != module)
        assert not others, f"{name} is owned by {module}, but {', '.join(others)} define it too"


def test_the_benchmark_page_stands_without_the_tracker():
    """docs/benchmarks.md is read by users: it names measurements and code, never issue or pull-request numbers."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    found = re.findall(r"(?i)\b(?:issues?|PRs?|pull requests?)\s+#?\d+|(?<![\w&/])#\d+\b", text)
    assert not found, found


def test_each_lever_has_one_owner_row():
    """Every lever of the plan (decide/records.py Levers: its fields and the generic path's) is named in exactly one row
    of the owner table."""
    from cpuperf.knowledge.knobs import DECISION_IDS

    text = ARCH.read_text().split("## One owner per fact", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| the lever")]
    named = [token for row in rows for token in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert sorted(named) == sorted(DECISION_IDS)
    assert all(len(re.findall(r"`[^`]+\.py`", row.split("|")[2])) == 1 for row in rows)


# --- the first page a newcomer reads -------------------------------------------------------------------------

def _prose_sentences(text: str) -> List[str]:
    """The sentences of a page's prose: code blocks and tables left out, inline code counted as one word."""
    kept, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and not line.startswith("|"):
            kept.append(line)
    prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "CODE", "\n".join(kept)))
    out = []
    for para in re.split(r"\n\s*\n|\n(?=\s*[-#])", prose):
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z(*])", " ".join(para.split()))
    return out


def test_the_readme_starts_with_the_users_line_and_then_the_contributors_line():
    """The first code block holds exactly two command lines: line 1 installs and runs the main job (for users),
    line 2 is `bash tests/run.sh` (what CI runs), and the block and the text after it say which is whose."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None and text.index(block.group(0)) < text.index("\n## ")
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    commands = [ln for ln in lines if not ln.lstrip().startswith("#")]
    assert len(commands) == 2, commands
    assert "cpuperf install" in commands[0] and "cpuperf train --auto" in commands[0]
    assert commands[1] == "bash tests/run.sh"
    comments = [ln for ln in lines if ln.lstrip().startswith("#")]
    assert any("Use it" in c for c in comments) and any("contributors" in c and "root" in c for c in comments)
    after = text[text.index(block.group(0)) + len(block.group(0)):].split("\n## ", 1)[0]
    assert "run the first line only" in after and "for contributors" in after and "15-20 minutes" in after


def test_the_readme_reads_in_minutes_and_its_terms_are_explained():
    text = (ROOT / "README.md").read_text()
    long = [s for s in _prose_sentences(text) if len(s.split()) > 40]
    assert not long, long  # one idea a sentence: split a longer one
    assert "](docs/glossary.md)" in text
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    for term in ("lever", "rank", "plan", "read back", "rankexec", "% of achievable", "MFU", "host class",
                 "the rule", "undecided", "finding"):
        assert re.search(rf"^\| \*\*[^|]*{re.escape(term)}", glossary, re.M | re.I), term
    for page in ("commands.md", "scripts-and-launchers.md"):
        assert "(glossary.md)" in (ROOT / "docs" / page).read_text().split("\n## ", 1)[0], page
