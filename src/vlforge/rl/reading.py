"""A reward function read from its file with :mod:`ast` only (no code runs, no torch).

:func:`inspect_reward` finds the function (a module-level one, a ``Class.method``, one imported from a module beside
the file), what it takes, and the strings in it and in what it reaches that name tags
(``r"<think>.*</think>.*\\\\boxed..."``), each with how the function uses it (:mod:`vlforge.rl.uses`): the tags the
reward needs. The scorers it calls from modules beside it are read one level deep.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "r.py"
    >>> _ = path.write_text('import re\\ndef f(completions, **kw):\\n    return [float(bool(re.search(r"<think>.*</think>", c))) for c in completions]\\n')
    >>> info = inspect_reward(path, "f")
    >>> info.params, info.patterns, info.signature
    (['completions'], ['<think>.*</think>'], 'trl')
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vlforge.errors import ConfigError
from vlforge.rl.uses import (
    COMPLETION_PARAMS,
    branch_of,
    pattern_soft,
    places_of,
    read_use,
    use_at,
    whole_string,
)
from vlforge.vocab.templates import TAG_RE


@dataclass(frozen=True)
class Need:
    """A pattern the reward tests the completion with."""

    text: str
    regex: bool
    soft: bool = False
    """A completion without it scores too (a fallback to the whole text, partial credit)."""
    branch: tuple[str, int, int] | None = None
    """``(FILE:LINE of the chain, branch, scoring branches)``: tested only in that branch of an if/elif chain of
    presence tests (branch -1: a failing one)."""


@dataclass
class RewardInfo:
    """What the file says about the function, read without running it."""

    file: Path
    function: str
    params: list[str]
    var_keyword: bool
    patterns: list[str]
    """String constants that hold a tag (docstrings excluded), in source order: the function's own and those of
    the module-level helpers and constants it reaches (:func:`_reachable`), not the file's other functions'."""
    uses: list[str] = field(default_factory=list)
    """How the file uses each pattern (:func:`pattern_use`): ``regex``, ``literal``, ``processing``, ``message``;
    and, read in the checked function, ``supplied`` (written into the completion's text by the reward) or ``data``
    (a test of the ground truth or another column, not of the completion)."""
    soft: list[bool] = field(default_factory=list)
    """Per pattern: the file scores a completion without it too (:func:`pattern_soft`: a fallback to the whole text,
    partial credit)."""
    positional: int = 0
    """Parameters a positional argument can fill."""
    required: list[str] = field(default_factory=list)
    """Parameters without a default."""
    var_positional: bool = True
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(line, column, end line, end column) of each pattern in the source, for rewrites."""
    files: list[Path] = field(default_factory=list)
    """The file each pattern is in: ``file``, or a module whose function the function calls
    (:func:`_called_imports`)."""
    branches: list[tuple[int, int, int] | None] = field(default_factory=list)
    """Per pattern: ``(line of the chain, branch, scoring branches)`` when it is tested only in one branch of an
    if/elif chain of presence tests on the completion (:func:`~vlforge.rl.uses.branch_of`), else None."""
    via: str | None = None
    """The import the named file takes the function with (``from .scores import compute_score``), when ``file`` is
    another module's."""

    @property
    def needs(self) -> list[Need]:
        """The patterns the function tests the completion with (not those it only cuts text with)."""
        branches = self.branches or [None] * len(self.patterns)
        return [Need(text, use == "regex", soft, None if branch is None else (f"{file}:{branch[0]}", *branch[1:]))
                for text, use, soft, branch, file in
                zip(self.patterns, self.uses, self.soft, branches, self.files or [self.file] * len(branches),
                    strict=True) if use in ("regex", "literal")]

    @property
    def needed(self) -> list[tuple[str, bool]]:
        """``(text, is_regex)`` of :attr:`needs`."""
        return [(need.text, need.regex) for need in self.needs]

    @property
    def supplied(self) -> list[str]:
        """Strings the function adds to the completion's text itself (``completion = "<think>" + completion``): a
        pattern's tag among them is not needed from the completion."""
        return [text for text, use in zip(self.patterns, self.uses, strict=True) if use == "supplied"]

    @property
    def firm(self) -> list[tuple[str, bool]]:
        """The needed patterns less the soft ones (a completion without them scores too: ``m.group(1) if m else
        text``, ``if "<think>" in t: score += 0.25``)."""
        return [(text, use == "regex") for text, use, soft in zip(self.patterns, self.uses, self.soft, strict=True)
                if use in ("regex", "literal") and not soft]

    @property
    def signature(self) -> str | None:
        """The engine whose signature the parameters match (None: none does)."""
        names = set(self.params)
        if {"queries", "prompts", "labels"} <= names:
            return "openrlhf"
        if {"data_source", "solution_str", "ground_truth"} <= names:
            return "verl"
        if self.params[:1] in (["reward_inputs"], ["reward_input"]):
            return "easyr1"
        if "completions" in names or (self.var_keyword and not self.params):
            return "trl"
        return None


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                out.add(id(first.value))
    return out


def module_statements(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The module-level statements, also those inside module-level ``if`` / ``try`` / ``with`` / ``for`` blocks
    (``try: FMT = re.compile(...)``), not inside functions or classes."""
    for node in statements:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for key in ("body", "orelse", "finalbody"):
                yield from module_statements(getattr(node, key, []))
            for handler in getattr(node, "handlers", []):
                yield from module_statements(handler.body)


def _module_bindings(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """The statements that bind each module-level name: functions, classes and assignments
    (:func:`module_statements`)."""
    defined: dict[str, list[ast.AST]] = {}
    for node in module_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.setdefault(name.id, []).append(node)
    return defined


def _local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names ``function`` binds itself (parameters, assignments, loop and comprehension targets, nested functions,
    imports), less those it declares ``global``: a load of one of them is not the module's binding."""
    names: set[str] = set()
    declared: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Global):
            declared.update(node.names)
    return names - declared


def _reachable(tree: ast.Module, start: ast.AST, owner: ast.ClassDef | None = None) -> set[int]:
    """Ids of the nodes ``start`` can run or read: its own, and those of the module-level functions, classes and
    assignments it names, transitively (a helper, a pattern constant), and the decorated functions a registry it
    reads collects (``@register`` appending to the ``REWARDS`` it iterates). Other functions of the file are not.
    ``Class.attr`` (and ``cls.attr`` / ``self.attr`` in a method of ``owner``) reaches that member, not the class."""
    defined = _module_bindings(tree)
    seen: set[int] = set()

    def members(cls: ast.ClassDef, attr: str) -> list[ast.AST]:
        return [n for n in cls.body if getattr(n, "name", None) == attr or (
            isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == attr
                for target in (n.targets if isinstance(n, ast.Assign) else [n.target]) for t in ast.walk(target)))]

    def reach(first: ast.AST) -> None:
        queue = [first]
        while queue:
            top = queue.pop()
            if id(top) in seen:
                continue
            own = _local_names(top) if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
            by_member: set[int] = set()
            for node in ast.walk(top):  # breadth first: an attribute before its owner's name
                seen.add(id(node))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    name = node.value.id
                    classes = [owner] if owner is not None and name in ("cls", "self") else [] if name in own else \
                        [d for d in defined.get(name, []) if isinstance(d, ast.ClassDef)]
                    if classes:
                        by_member.add(id(node.value))
                        queue.extend(m for cls in classes for m in members(cls, node.attr) if id(m) not in seen)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in own and \
                        id(node) not in by_member:
                    queue.extend(d for d in defined.get(node.id, []) if id(d) not in seen)

    reach(start)
    decorated = [n for nodes in defined.values() for n in nodes
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.decorator_list]
    grew = True
    while grew:
        grew = False
        reached = {name for name, nodes in defined.items() if any(id(n) in seen for n in nodes)}
        for function in decorated:
            if id(function) in seen:
                continue
            for decorator in function.decorator_list:
                name = decorator.func if isinstance(decorator, ast.Call) else decorator
                bodies = defined.get(name.id, []) if isinstance(name, ast.Name) else []
                if any(isinstance(n, ast.Name) and n.id in reached - {name.id} for body in bodies
                       for n in ast.walk(body)):
                    reach(function)
                    grew = True
                    break
    return seen


def _imported_from(node: ast.ImportFrom, file: Path, search: tuple[Path, ...], *, local: bool = False,
                   submodule: str | None = None) -> Path | None:
    """The file of the module ``node`` imports from (``from .utils import f`` beside ``file``; ``from pkg.mod import
    f`` in ``file``'s directory, ``search`` or, unless ``local``, ``sys.path``), or None; with ``submodule``, the
    file of that module of it (``from pkg import mod``)."""
    parts = [*((node.module or "").split(".") if node.module else []), *([submodule] if submodule else [])]
    here = file.resolve().parents
    if node.level:
        return module_file(parts, [here[node.level - 1]], local=True) if node.level <= len(here) else None
    return module_file(parts, [here[0], *search], local=local)


def module_file(parts: list[str], bases: list[Path], *, local: bool = False) -> Path | None:
    """The file of the module ``parts`` (``["pkg", "mod"]``; empty: the package at a base) under the first of
    ``bases`` then (unless ``local``) ``sys.path`` that holds it: ``pkg/mod.py`` or ``pkg/mod/__init__.py``."""
    for base in [*bases, *([] if local else (Path(p) for p in sys.path if p))]:
        stem = base.joinpath(*parts)
        for candidate in (stem.with_suffix(".py") if parts else None, stem / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate
    return None


def _imports(tree: ast.Module) -> dict[str, tuple[ast.Import | ast.ImportFrom, str]]:
    """Each name the module's imports bind (in module-level blocks too; the last import of a name wins): its import
    and the name imported."""
    bound: dict[str, tuple[ast.Import | ast.ImportFrom, str]] = {}
    for node in module_statements(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                local = alias.asname or (alias.name if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0])
                bound[local] = (node, alias.name)
    return bound


def _imported_name(expr: ast.AST, bound: dict[str, tuple[ast.Import | ast.ImportFrom, str]], file: Path,
                   search: tuple[Path, ...]) -> tuple[Path, str] | None:
    """``(module file, name)`` of what ``expr`` names from an import: ``f`` of ``from M import f``, ``M.f`` of
    ``import M`` / ``from P import M``; only modules beside ``file`` or on ``search`` (an installed package's code is
    not read)."""
    if isinstance(expr, ast.Name) and isinstance((entry := bound.get(expr.id, (None, "")))[0], ast.ImportFrom):
        source = _imported_from(entry[0], file, search, local=True)
        return (source, entry[1]) if source is not None else None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in bound:
        node, module = bound[expr.value.id]
        source = module_file(module.split("."), [file.resolve().parent, *search], local=True) \
            if isinstance(node, ast.Import) else _imported_from(node, file, search, local=True, submodule=module)
        return (source, expr.attr) if source is not None else None
    return None


def _called_imports(tree: ast.Module, within: set[int], file: Path, search: tuple[Path, ...]
                    ) -> list[tuple[Path, str]]:
    """The imported functions the nodes ``within`` call, as ``(module file, function)`` (:func:`_imported_name`)."""
    bound = _imports(tree)
    out: list[tuple[Path, str]] = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and id(call) in within and \
                (found := _imported_name(call.func, bound, file, search)) is not None and found not in out:
            out.append(found)
    return out


def _imported_constants(tree: ast.Module, within: set[int], file: Path, search: tuple[Path, ...]
                        ) -> list[tuple[ast.AST, Path, ast.Constant]]:
    """The loads ``within`` of a string constant with a tag that the module imports (DeepScaleR's ``from
    .globals import THOUGHT_DELIMITER_END``), each with the module file and the constant there."""
    bound = _imports(tree)
    tagged: dict[Path, dict[str, ast.Constant]] = {}  # each module read once: its tag constants by name
    out: list[tuple[ast.AST, Path, ast.Constant]] = []
    for load in ast.walk(tree):
        if id(load) not in within or not (isinstance(load, ast.Attribute) or (
                isinstance(load, ast.Name) and isinstance(load.ctx, ast.Load))):
            continue
        found = _imported_name(load, bound, file, search)
        if found is None:
            continue
        source, name = found
        if source not in tagged:
            try:
                module = ast.parse(read_source(source)[0])
            except (SyntaxError, OSError, UnicodeDecodeError, RecursionError):
                module = ast.Module(body=[], type_ignores=[])
            tagged[source] = {key: node.value for key, nodes in _module_bindings(module).items() for node in nodes
                              if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                              and isinstance(node.value.value, str) and TAG_RE.search(node.value.value)}
        if name in tagged[source]:
            out.append((load, source, tagged[source][name]))
    return out


def _method_kind(node: ast.AST) -> str | None:
    """``staticmethod``, ``classmethod`` or ``method`` for a function in a class body, else None."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
    return next((kind for kind in ("staticmethod", "classmethod") if kind in decorators), "method")


def _method_of(file: Path, defined: dict[str, list[ast.AST]], owner: str, name: str
               ) -> tuple[ast.ClassDef, ast.AST]:
    """The class and its static or class method ``owner.name`` (a module-level class), or one line saying why not."""
    from vlforge.errors import did_you_mean

    classes = [n for n in defined.get(owner, []) if isinstance(n, ast.ClassDef)]
    if not classes:
        names = [key for key, nodes in defined.items() if any(isinstance(n, ast.ClassDef) for n in nodes)]
        raise ConfigError(f"--reward {file}: no class {owner!r}{did_you_mean(owner, names)} (classes: "
                          f"{', '.join(names) or 'none'})")
    methods = {m.name: m for m in classes[-1].body if _method_kind(m) is not None}
    node = methods.get(name)
    if node is None:
        raise ConfigError(f"--reward {file}: class {owner} has no method {name!r}{did_you_mean(name, list(methods))} "
                          f"(methods: {', '.join(methods) or 'none'})")
    if _method_kind(node) == "method":
        raise ConfigError(f"--reward {file}: {owner}.{name} is an instance method, which the engine cannot call "
                          "without an instance: make it a @staticmethod, or name a module-level function")
    return classes[-1], node


TRUTH_PARAMS = ("ground_truth", "solution", "answer", "gt", "label", "target", "reference")
"""Second parameters that make a function of no engine's signature a ``(text, truth)`` scorer (verl's built-in
``compute_score(solution_str, ground_truth)``, geo3k's ``(predict_str, ground_truth)``)."""


def _completion_params(signature: str | None, params: list[str]) -> set[str]:
    """The parameters that carry the completion: the engine's (:data:`~vlforge.rl.uses.COMPLETION_PARAMS`), an
    EasyR1 function's one argument, a ``(text, truth)`` scorer's first; else every parameter (nothing is taken for
    data when the signature does not say)."""
    if signature in COMPLETION_PARAMS:
        return set(COMPLETION_PARAMS[signature])
    if signature == "easyr1" or (len(params) >= 2 and params[1] in TRUTH_PARAMS):
        return set(params[:1])
    return set(params)


def read_source(file: Path) -> tuple[str, str]:
    """A Python file's text and encoding as Python reads it: a UTF-8 BOM or a ``# -*- coding: ... -*-`` line."""
    with file.open("rb") as handle:
        encoding, _ = tokenize.detect_encoding(handle.readline)  # SyntaxError for an unknown one, as Python's
    return file.read_bytes().decode(encoding), encoding


def inspect_reward(file: Path, function: str, search: tuple[Path, ...] = (), *,
                   _seen: frozenset[tuple[Path, str]] = frozenset(), _called: bool = False) -> RewardInfo:
    """Parse ``file`` and describe ``function``; a missing file, a syntax error or a missing function is one line.
    A function the file imports (``from scores import compute_score``) is read from the module it comes from (found
    beside ``file``, on ``search`` or ``sys.path``); ``via`` records the import. The imported functions it calls
    (:func:`_called_imports`) are read one level deep (``_called``), their strings only where a use shows."""
    if file.is_dir():
        raise ConfigError(f"--reward {file}: is a directory, not a Python file")
    if not file.is_file():
        raise ConfigError(f"--reward {file}: not found")
    try:
        tree = ast.parse(read_source(file)[0], filename=str(file))
    except SyntaxError as error:
        line = f":{error.lineno}" if error.lineno else ""
        raise ConfigError(f"--reward {file}{line}: not valid Python ({error.msg})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--reward {file}: cannot read ({error})") from None
    except RecursionError:
        raise ConfigError(f"--reward {file}: nested too deeply for vlforge to read") from None
    defined = _module_bindings(tree)
    seen = _seen | {(file.resolve(), function)}
    owner, _, method = function.rpartition(".")  # ``Class.method``: a static or class method (VLM-R1's modules)
    owner_class, bindings = None, defined.get(function, [])
    if owner:
        owner_class, member = _method_of(file, defined, owner, method)
        bindings = [member]
    imported = None if owner else _imports(tree).get(function)  # the last import that binds the name
    if imported is not None and not isinstance(imported[0], ast.ImportFrom):
        imported = None
    if imported is not None and (not bindings or imported[0].lineno > bindings[-1].lineno):
        node, original = imported
        source = _imported_from(node, file, search)
        module = "." * node.level + (node.module or "")
        if source is None:
            raise ConfigError(f"--reward {file}: {function!r} is imported from {module}, whose file vlforge cannot "
                              "find (add its directory with --reward-path)")
        if (source.resolve(), original) in seen:
            raise ConfigError(f"--reward {file}: {function!r} is imported from {module}, which imports it back: the "
                              "imports form a cycle and define no function")
        found = inspect_reward(source, original, search, _seen=seen, _called=_called)
        return dataclasses.replace(found, via=f"from {module} import {original}")  # the named file's own import
    found = [n for n in bindings if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assigned = [n for n in bindings if isinstance(n, ast.Assign)]
    if not found and not assigned:
        names = [key for key, nodes in defined.items()
                 if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in nodes)]
        names += [f"{key}.{m.name}" for key, nodes in defined.items() for n in nodes if isinstance(n, ast.ClassDef)
                  for m in n.body if _method_kind(m) in ("staticmethod", "classmethod")]
        from vlforge.errors import did_you_mean

        raise ConfigError(f"--reward {file}: no function {function!r}{did_you_mean(function, names)} "
                          f"(functions: {', '.join(names) or 'none'})")
    params: list[str] = []
    var_keyword = var_positional = True
    positional, required = 0, []
    if found:
        args = found[0].args
        bound = 1 if owner and _method_kind(found[0]) == "classmethod" else 0  # ``cls``
        params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)][bound:]
        var_keyword, var_positional = args.kwarg is not None, args.vararg is not None
        ordered = [*args.posonlyargs, *args.args][bound:]
        positional = len(ordered)
        required = [a.arg for a in ordered[: len(ordered) - len(args.defaults)]]
        required += [a.arg for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True) if default is None]
    elif isinstance(assigned[-1].value, ast.Constant):
        raise ConfigError(f"--reward {file}: {function!r} is {assigned[-1].value.value!r}, not a function")
    docstrings = _docstring_nodes(tree)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    within = _reachable(tree, found[-1] if found else assigned[-1], owner_class)
    checked = found[-1] if found else None
    signature = RewardInfo(file, function, params, var_keyword, []).signature
    completion = _completion_params(signature, params)
    if found and found[0].args.kwarg is not None and not completion & set(params):
        completion.add(found[0].args.kwarg.arg)  # ``completions = kwargs["completions"]``
    patterns, spans, uses, soft, branches = [], [], [], [], []
    sources: list[Path | None] = []  # the module an imported constant is in (None: this file)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and id(node) in within and TAG_RE.search(node.value.replace("\\/", "/"))):  # r"<\/think>" too
            patterns.append(node.value)
            sources.append(None)
            spans.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0))
            shown = read_use(node, tree, parents, within, checked, completion)
            uses.append(shown or ("processing" if _called else "regex"))  # library code: only what it shows
            soft.append(pattern_soft(node, tree, parents, within))
            tests = [place for place in places_of(node, tree, parents, within)
                     if use_at(place, parents) in ("regex", "literal")]
            spots = {branch_of(place, parents, checked, completion) for place in tests} if checked else {None}
            branches.append(spots.pop() if shown in ("regex", "literal") and len(spots) == 1 else None)
            if shown == "regex" and whole_string(node, parents):
                try:  # the engine would raise at its first score
                    re.compile(node.value)
                except re.error as error:
                    raise ConfigError(f"--reward {file}:{node.lineno}: the regex {node.value!r} does not compile "
                                      f"({error})") from None
    held: dict[tuple[Path, tuple[int, int, int, int]], int] = {}
    for load, source, constant in _imported_constants(tree, within, file, search):
        shown = read_use(load, tree, parents, within, checked, completion)
        if shown is None:  # a use the code does not show: not counted (as in a called scorer)
            continue
        span = (constant.lineno, constant.col_offset, constant.end_lineno or constant.lineno,
                constant.end_col_offset or 0)
        tested = shown in ("regex", "literal")
        branch = branch_of(load, parents, checked, completion) if checked and tested else None
        if (source, span) in held:  # the constant loaded twice: one pattern, required where any load requires it
            i = held[(source, span)]
            if tested and uses[i] not in ("regex", "literal"):
                uses[i], soft[i], branches[i] = shown, pattern_soft(load, tree, parents, within), branch
            elif tested:
                soft[i] = soft[i] and pattern_soft(load, tree, parents, within)
                branches[i] = branches[i] if branches[i] == branch else None
            continue
        held[(source, span)] = len(patterns)
        patterns.append(constant.value)
        spans.append(span)
        uses.append(shown)
        soft.append(pattern_soft(load, tree, parents, within))
        branches.append(branch)
        sources.append(source)
    order = sorted(range(len(patterns)), key=lambda i: (str(sources[i]) if sources[i] else "", spans[i]))
    info = RewardInfo(file=file, function=function, params=params, var_keyword=var_keyword, positional=positional,
                      required=required, var_positional=var_positional,
                      patterns=[patterns[i] for i in order], uses=[uses[i] for i in order],
                      soft=[soft[i] for i in order], spans=[spans[i] for i in order],
                      files=[sources[i] or file for i in order],
                      branches=[branches[i] for i in order])
    for source, name in [] if _called else _called_imports(tree, within, file, search):  # one level: the scorers
        if (source.resolve(), name) in seen:
            continue
        try:
            called = inspect_reward(source, name, search, _seen=seen, _called=True)
        except ConfigError:  # not a function vlforge can read there (a class, a name it re-exports): adds nothing
            continue
        held = set(zip(info.files, info.spans, strict=True))
        for i, where in enumerate(zip(called.files, called.spans, strict=True)):
            if where not in held:  # a module constant two called functions share: once
                held.add(where)
                for key in ("patterns", "uses", "soft", "spans", "files", "branches"):
                    getattr(info, key).append(getattr(called, key)[i])
    return info
