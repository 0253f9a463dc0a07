"""What a training script's source shows, read from its syntax tree (never run): what it imports, which calls it
makes (resolved through its imports: `L.Trainer` of `import lightning as L` is Lightning's Trainer, `Trainer` of
`from transformers import Trainer` Hugging Face's), the keywords it passes a framework's Trainer, the dataclasses it
defines and hands to HfArgumentParser, the options it adds with `add_argument`. A framework adapter
(cpuperf.plan.frameworks) recognises a script by these, not by a substring. Pure."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from cpuperf.knowledge.script_parsers import FieldSpec, ScriptOption

_MAX_SOURCE = 4 * 1024 * 1024  # the edge reads at most this (cpuperf.probe read_script); a larger file is not parsed


@dataclass(frozen=True)
class DataclassSpec:
    name: str
    bases: Tuple[str, ...]
    fields: Tuple[FieldSpec, ...]


@dataclass(frozen=True)
class ScriptSource:
    """A script's source as its syntax tree shows it. `read` False: no source (not found, unreadable, or not
    Python cpuperf can parse: `why` says which)."""

    read: bool
    why: str = ""
    modules: FrozenSet[str] = frozenset()  # every module imported, dotted ('lightning.pytorch', 'transformers')
    calls: FrozenSet[str] = frozenset()  # every call, its callee resolved through the imports ('lightning.Trainer')
    # keywords passed to each resolved callee ('lightning.Trainer' -> {'max_epochs', 'precision'}); '**' where
    # a mapping is unpacked into the call (any keyword may be in it)
    keywords: Tuple[Tuple[str, FrozenSet[str]], ...] = ()
    dataclasses: Tuple[DataclassSpec, ...] = ()
    hf_parser_types: Optional[Tuple[str, ...]] = None  # the names handed to HfArgumentParser(...); None: none made
    arguments: Tuple[ScriptOption, ...] = ()  # options the script adds with add_argument("--x", ...)
    unread_arguments: bool = False  # an add_argument call whose option strings are not literals

    def imports(self, *tops: str) -> bool:
        """Whether it imports any of these packages (or a module inside one)."""
        return any(m == t or m.startswith(t + ".") for m in self.modules for t in tops)

    def calls_any(self, *names: str) -> bool:
        return any(c in self.calls for c in names)

    def keywords_of(self, *callees: str) -> FrozenSet[str]:
        out: Set[str] = set()
        for name, words in self.keywords:
            if name in callees:
                out |= words
        return frozenset(out)

    def dataclass_named(self, name: str) -> Optional[DataclassSpec]:
        return next((d for d in self.dataclasses if d.name == name), None)


NO_SOURCE = ScriptSource(False, "the script could not be read")


def _dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}  # local name -> dotted origin
        self.modules: Set[str] = set()
        self.calls: List[Tuple[str, ast.Call]] = []
        self.dataclasses: List[DataclassSpec] = []

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.modules.add(a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self.modules.add(node.module)
            for a in node.names:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if name is None and isinstance(node.func, ast.Attribute):
            name = f"<value>.{node.func.attr}"  # a method of what an expression gives: HfArgumentParser(...).parse_args()
        if name:
            self.calls.append((name, node))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        decorated = any((_dotted(d.func if isinstance(d, ast.Call) else d) or "").split(".")[-1] == "dataclass"
                        for d in node.decorator_list)
        if decorated:
            fields = tuple(_field(s) for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                           and "ClassVar" not in ast.unparse(s.annotation))
            self.dataclasses.append(DataclassSpec(node.name, tuple(filter(None, (_dotted(b) for b in node.bases))),
                                                  tuple(f for f in fields if f is not None)))
        self.generic_visit(node)

    def resolve(self, name: str) -> str:
        head, _, rest = name.partition(".")
        origin = self.aliases.get(head)
        return (f"{origin}.{rest}" if rest else origin) if origin else name


def _field(stmt: ast.AnnAssign) -> Optional[FieldSpec]:
    assert isinstance(stmt.target, ast.Name)
    name, annotation = stmt.target.id, ast.unparse(stmt.annotation)
    value = stmt.value
    if value is None:
        return FieldSpec(name, annotation)
    if isinstance(value, ast.Call) and (_dotted(value.func) or "").split(".")[-1] == "field":
        kw = {k.arg: k.value for k in value.keywords if k.arg}
        flag = kw.get("init")
        init = not (isinstance(flag, ast.Constant) and flag.value is False)
        default = ast.unparse(kw["default"]) if "default" in kw else ("[]" if "default_factory" in kw else "")
        return FieldSpec(name, annotation, default, init)
    return FieldSpec(name, annotation, ast.unparse(value))


_KINDS = {"int": "int", "float": "float", "str": "str"}


def _argument(call: ast.Call) -> Tuple[Optional[ScriptOption], bool]:
    """(the option an add_argument call adds, whether its option strings could not be read)."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(names) != len(call.args):
        return None, True
    if not names or not names[0].startswith("-"):
        return None, False  # a positional: no option string
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = kw.get("action")
    nargs = kw.get("nargs")
    kind = _KINDS.get(_dotted(kw["type"]) or "", "str") if "type" in kw else "str"
    given_dest = kw.get("dest")
    dest = str(given_dest.value) if isinstance(given_dest, ast.Constant) else \
        next((n for n in names if n.startswith("--")), names[0]).lstrip("-").replace("-", "_")
    if isinstance(action, ast.Constant) and action.value in ("store_true", "store_false", "count", "store_const",
                                                               "append_const", "help", "version"):
        return ScriptOption(str(dest), tuple(names), "none", "none"), False
    if isinstance(action, ast.Constant) and action.value == "append":
        return ScriptOption(str(dest), tuple(names), "one", kind), False
    if isinstance(action, ast.AST) and not isinstance(action, ast.Constant):
        return ScriptOption(str(dest), tuple(names), "optional", "str"), False  # a class: arity not told
    arity = {"?": "optional", "+": "many", "*": "many"}.get(
        str(nargs.value) if isinstance(nargs, ast.Constant) else "", "one")
    return ScriptOption(str(dest), tuple(names), arity, kind), False


def read_source(text: Optional[str]) -> ScriptSource:
    """The script's source read once (`text` None: it could not be read)."""
    if text is None:
        return NO_SOURCE
    if len(text) > _MAX_SOURCE:
        return ScriptSource(False, f"the script is over {_MAX_SOURCE // (1024 * 1024)} MiB: not parsed")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError) as exc:
        return ScriptSource(False, f"the script is not Python cpuperf can parse ({type(exc).__name__})")
    reader = _Reader()
    reader.visit(tree)
    calls, keywords, hf_types, arguments, unread = set(), [], None, [], False
    for raw, node in reader.calls:
        name = reader.resolve(raw)
        calls.add(name)
        words = frozenset(k.arg if k.arg else "**" for k in node.keywords)
        keywords.append((name, words))
        if name.split(".")[-1] == "HfArgumentParser":
            hf_types = _parser_types(node, reader)
        if raw.split(".")[-1] == "add_argument":
            opt, hidden = _argument(node)
            unread = unread or hidden
            if opt is not None:
                arguments.append(opt)
    return ScriptSource(True, "", frozenset(reader.modules), frozenset(calls), tuple(keywords),
                        tuple(reader.dataclasses), hf_types, tuple(arguments), unread)


def _parser_types(call: ast.Call, reader: _Reader) -> Tuple[str, ...]:
    """The dataclass names handed to HfArgumentParser((A, B, TrainingArguments)) or HfArgumentParser(A); '?' for
    what is not a name (a variable list)."""
    if not call.args:
        return ()
    arg = call.args[0]
    items = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
    out = []
    for item in items:
        name = _dotted(item)
        out.append(reader.resolve(name).split(".")[-1] if name else "?")
    return tuple(out)
