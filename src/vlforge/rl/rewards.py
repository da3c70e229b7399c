"""A reward function read from its file and called the way its engine calls it.

:func:`inspect_reward` reads the file with :mod:`ast` only (no code runs, no torch): the function exists, what it
takes, and the regular expressions in the file that name tags (``r"<think>.*</think>.*\\\\boxed..."``): the tags the
reward needs. :func:`load_scorer` runs the file (its imports resolve with ``--reward-path`` directories appended
to ``sys.path``) and returns a :class:`Scorer` that calls the function in its engine's signature
(:mod:`vlforge.rl.engines`).

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
import builtins
import dataclasses
import importlib.util
import inspect
import math
import re
import sys
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError
from vlforge.vocab.templates import TAG_RE, TemplateError, regex_literals


@dataclass(frozen=True)
class Need:
    """A pattern the reward tests the completion with."""

    text: str
    regex: bool
    soft: bool = False
    """A completion without it scores too (a fallback to the whole text, partial credit)."""
    branch: tuple[str, int] | None = None
    """``(FILE:LINE of the chain, branch)``: tested only in that branch of an if/elif chain of presence tests."""


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
    branches: list[tuple[int, int] | None] = field(default_factory=list)
    """Per pattern: ``(line of the chain, branch)`` when it is tested only in one branch of an if/elif chain of
    presence tests on the completion (:func:`_branch_of`), else None."""
    via: str | None = None
    """The import the named file takes the function with (``from .scores import compute_score``), when ``file`` is
    another module's."""

    @property
    def needs(self) -> list[Need]:
        """The patterns the function tests the completion with (not those it only cuts text with)."""
        branches = self.branches or [None] * len(self.patterns)
        return [Need(text, use == "regex", soft, None if branch is None else (f"{file}:{branch[0]}", branch[1]))
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


_REGEX_TESTS = frozenset({"search", "match", "fullmatch", "findall", "finditer", "compile"})
_REGEX_EDITS = frozenset({"sub", "subn", "split"})
_TEXT_TESTS = frozenset({"startswith", "endswith", "__contains__"})
_TEXT_EDITS = frozenset({"split", "rsplit", "partition", "rpartition", "replace", "strip", "lstrip", "rstrip",
                         "removeprefix", "removesuffix"})
_TEXT_SEARCHES = frozenset({"find", "rfind", "index", "rindex", "count"})
"""A test for the tag (``text.count("<think>") == 1``, ``find(...) != -1``), unless the result cuts the text (a
slice bound: ``text[text.find("</think>") + 8:]``)."""
_MESSAGE_CALLS = frozenset({"print", "debug", "info", "warning", "warn", "error", "exception", "critical", "fatal",
                            "log"})
"""Calls whose string arguments are messages (``print``, ``logger.debug``, ``warnings.warn``), not tests."""
_RANK = {"regex": 3, "literal": 2, "processing": 1, "text": 1, "message": 0}
_COMPLETION_PARAMS = {"trl": ("completions", "completion_ids"), "verl": ("solution_str",), "openrlhf": ("queries",)}
"""The parameters that carry the completion, by engine signature (EasyR1's and verl's built-in scorers: the first)."""


def _standing(node: ast.AST, parents: dict[int, ast.AST]) -> tuple[ast.AST, ast.AST | None]:
    """``node`` and its parent, past the f-string, ``+`` or ``.format`` that builds a larger string of it."""
    parent = parents.get(id(node))
    while isinstance(parent, (ast.JoinedStr, ast.FormattedValue, ast.BinOp)) or _formatted(node, parent, parents):
        if isinstance(parent, ast.Attribute):  # "...{}".format(x): the call is the value
            parent = parents.get(id(parent))
        node, parent = parent, parents.get(id(parent))  # f"...{x}..." / "a" + x
    return node, parent


def _presence_chain(branch: ast.If, parents: dict[int, ast.AST]) -> list[ast.If] | None:
    """The if/elif chain ``branch`` belongs to when it has two or more branches that each test that a string is in
    a text (``if "<reasoning>" in c: ... elif "<think>" in c: ...``), else None."""
    top = branch
    while isinstance(above := parents.get(id(top)), ast.If) and len(above.orelse) == 1 and above.orelse[0] is top:
        top = above
    chain = [top]
    while len(chain[-1].orelse) == 1 and isinstance(chain[-1].orelse[0], ast.If):
        chain.append(chain[-1].orelse[0])
    presence = len(chain) >= 2 and all(
        isinstance(t := member.test, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.In)
        and isinstance(t.left, ast.Constant) and isinstance(t.left.value, str) for member in chain)
    return chain if presence else None


def _branch_of(place: ast.AST, parents: dict[int, ast.AST], checked: ast.AST, completion: set[str]
               ) -> tuple[int, int] | None:
    """``(chain, branch)`` of the innermost if/elif chain of presence tests on the completion (:func:`_presence_chain`,
    its tests traced to ``completion`` in the ``checked`` function) whose branch test or body holds ``place``: a
    completion takes one branch, so it needs what every branch tests, not each branch's own tags. The ``else`` is
    taken as the failing path."""
    child = place
    while (parent := parents.get(id(child))) is not None and \
            not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(parent, ast.If) and (child is parent.test or child in parent.body):
            chain = _presence_chain(parent, parents)
            scope = _scope(parent, parents)
            roles = _roles(scope, checked, completion) if chain is not None else None
            if roles is not None and all(_origins_in(member.test.comparators[0], scope, roles[0], any)
                                         for member in chain):
                return chain[0].lineno, chain.index(parent)
        child = parent
    return None


def _roles(scope: ast.AST | None, checked: ast.AST, completion: set[str]) -> tuple[set[str], set[str]] | None:
    """``(completion parameters, data parameters)`` of ``scope``: the ``checked`` function's own, or those of a
    module-level helper it calls directly (``extract(solution_str)``: a parameter that any call fills from the
    completion is one, a parameter every call fills from other parameters is data); None for other scopes."""
    if scope is checked:
        return completion, _params(checked) - completion
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    calls = [n for n in ast.walk(checked) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == scope.name]
    if not calls:
        return None
    positional = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
    filled: dict[str, list[set[str] | None]] = {}
    for call in calls:
        pairs = [*zip(positional, call.args, strict=False), *((k.arg, k.value) for k in call.keywords if k.arg)]
        for param, arg in pairs:
            filled.setdefault(param, []).append(_origins(arg, checked, _params(checked), frozenset()))
    reads = {param for param, sources in filled.items() if any(o and o & completion for o in sources)}
    data = {param for param, sources in filled.items() if param not in reads and len(sources) == len(calls)
            and all(sources)}
    return reads, data


def _origins_in(expr: ast.AST, scope: ast.AST, names: set[str], how: Callable[[Iterable[bool]], bool]) -> bool:
    """``how`` (``any`` / ``all``) of the parameters ``expr`` is computed from (:func:`_origins`) are in ``names``;
    False when it is computed from none, or from a value not traced."""
    origins = _origins(expr, scope, _params(scope), frozenset())
    return bool(origins) and how(origin in names for origin in origins)


def _params(function: ast.AST) -> set[str]:
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None}


def _use_at(node: ast.AST, parents: dict[int, ast.AST]) -> str | None:
    """How the expression ``node`` is used where it stands, by its own call or comparison, or None when that does
    not say; ``text`` when it is part of the text a regex searches (``re.match(P, "<think>" + c)``)."""
    node, parent = _standing(node, parents)
    if isinstance(parent, ast.Assert) and parent.msg is node:
        return "message"
    if isinstance(parent, ast.keyword) and _message_call(parents.get(id(parent)), parents):
        return "message"  # logger.warning(msg="...")
    if isinstance(parent, ast.Compare):
        if not any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for op in parent.ops):
            return None
        guard = parents.get(id(parent))  # `if "</think>" in s: s = s.split("</think>")[-1]` only guards a cut
        if isinstance(guard, ast.If) and guard.test is parent and isinstance(node, ast.Constant) and any(
                isinstance(n, ast.Constant) and n.value == node.value and _use_at(n, parents) == "processing"
                for statement in guard.body for n in ast.walk(statement)) and not _scores_the_test(guard, parents):
            return "processing"
        return "literal"
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "len":
        return "processing"  # its length: an offset to cut at (``text[i + len("</think>"):]``)
    if isinstance(parent, ast.Call) and node in parent.args and _message_call(parent, parents):
        return "message"  # logged, printed or raised: says something, tests nothing
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and node in parent.args:
        name, owner = parent.func.attr, parent.func.value
        if isinstance(owner, ast.Name) and owner.id in ("re", "regex"):
            if name in _REGEX_TESTS - {"compile"} and parent.args.index(node) > 0:
                return "text"  # ``re.match(P, "<think>" + c)``: part of the text searched, not the pattern
            return "regex" if name in _REGEX_TESTS else "processing" if name in _REGEX_EDITS else None
        if name in _TEXT_SEARCHES:
            return "processing" if _cuts(parent, parents) else "literal"
        return "literal" if name in _TEXT_TESTS else "processing" if name in _TEXT_EDITS else None
    return None


def _formatted(node: ast.AST, parent: ast.AST | None, parents: dict[int, ast.AST]) -> bool:
    """``parent`` is ``node.format`` called: ``"...{}".format(x)``."""
    call = parents.get(id(parent)) if isinstance(parent, ast.Attribute) else None
    return isinstance(parent, ast.Attribute) and parent.attr == "format" and parent.value is node and \
        isinstance(call, ast.Call) and call.func is parent


def _message_call(call: ast.AST | None, parents: dict[int, ast.AST]) -> bool:
    """``call`` logs, prints, warns or builds the exception a ``raise`` throws."""
    if not isinstance(call, ast.Call):
        return False
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
    return name in _MESSAGE_CALLS or isinstance(parents.get(id(call)), ast.Raise)


def _scores_the_test(guard: ast.If, parents: dict[int, ast.AST]) -> bool:
    """The ``if`` does more than cut: its ``else`` returns, raises or sets a constant (``else: return 0.0``), or its
    body sets a flag the function reads after it (``complete = True``), so a completion without the tag scores
    differently. An ``else`` that only keeps the text (``else: answer = s``) is still a cut."""
    def constant_set(statement: ast.stmt) -> bool:
        return isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)

    if any(isinstance(n, (ast.Return, ast.Raise)) or constant_set(n) for statement in guard.orelse
           for n in ast.walk(statement)):
        return True
    flags = {t.id for statement in guard.body for n in ast.walk(statement) if constant_set(n)
             and isinstance(n.value.value, (bool, int)) for t in n.targets if isinstance(t, ast.Name)}
    scope = _scope(guard, parents)
    return scope is not None and any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in flags
                                     and n.lineno > (guard.end_lineno or guard.lineno) for n in ast.walk(scope))


def _soft_at(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """The test ``node`` stands in does not decide the score alone: a regex match read with a fallback to the whole
    text (:func:`_falls_back`), or a test that adds partial credit (:func:`_partial_credit`)."""
    node, parent = _standing(node, parents)
    if isinstance(parent, ast.Compare):
        return _partial_credit(parent, parents)
    if not (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and node in parent.args):
        return False
    owner = parent.func.value
    if isinstance(owner, ast.Name) and owner.id in ("re", "regex") and parent.func.attr != "compile":
        return _falls_back(parent, parents) or _partial_credit(parent, parents)
    return _partial_credit(parent, parents)


def _partial_credit(test: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """``test`` adds to a score beside other terms: a term of a sum with another non-constant term that is not
    compared (``0.5 * ("<think>" in t) + 0.5 * ok``, not ``t.count(a) + t.count(b) != 2``), or what an augmented
    assignment adds (``score += 0.5 if m else 0``; an ``if`` without ``else`` whose body only does that: ``if
    t.count("<think>") == 1: count += 0.25``) to a name that some other statement adds to as well."""
    node, summed = test, False
    while (parent := parents.get(id(node))) is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Add, ast.Sub)) and \
                not isinstance(parent.right if parent.left is node else parent.left, ast.Constant):
            summed = True
        if summed and isinstance(parent, ast.Compare):
            return False
        node = parent
    if summed:
        return True

    def adds(statement: ast.AST | None) -> bool:
        return isinstance(statement, ast.AugAssign) and isinstance(statement.op, (ast.Add, ast.Sub)) and \
            isinstance(statement.target, ast.Name)

    own = [parent] if adds(parent) else parent.body if isinstance(parent, ast.If) and parent.test is node and \
        not parent.orelse and parent.body and all(map(adds, parent.body)) else []
    scope = _scope(test, parents)
    if not own or scope is None:
        return False
    targets = {statement.target.id for statement in own}
    others = [n for n in ast.walk(scope) if adds(n) and n.target.id in targets and all(n is not o for o in own)]
    return bool(others)


def _tests_data(place: ast.AST, parents: dict[int, ast.AST], checked: ast.AST, completion: set[str]) -> bool:
    """The test at ``place`` reads only parameters of the checked function ``checked`` other than the ``completion``
    ones (the ground truth, a dataset column, the prompt), through the assignments and loops of that function."""
    node, parent = _standing(place, parents)
    subject: ast.AST | None = None
    if isinstance(parent, ast.Compare) and len(parent.ops) == 1:
        subject = parent.comparators[0] if parent.left is node else parent.left
    elif isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute):
        owner = parent.func.value
        if isinstance(owner, ast.Name) and owner.id in ("re", "regex"):
            subject = parent.args[1] if len(parent.args) > 1 and parent.args[0] is node else None
        else:
            subject = owner
    scope = _scope(place, parents)
    roles = _roles(scope, checked, completion) if subject is not None and completion else None
    return roles is not None and _origins_in(subject, scope, roles[1], all)


def _origins(expr: ast.AST, scope: ast.AST, params: set[str], seen: frozenset[str]) -> set[str] | None:
    """The parameters of ``scope`` whose values reach ``expr`` (through assignments, loops, comprehensions, calls on
    them), or None when a name's value is not traced (a global, ``self``, a with or except target)."""
    inner = {n.id for comp in ast.walk(expr) if isinstance(comp, ast.comprehension) for n in ast.walk(comp.target)
             if isinstance(n, ast.Name)}
    called = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
    out: set[str] = set()
    for name in ast.walk(expr):
        if not isinstance(name, ast.Name) or not isinstance(name.ctx, ast.Load) or name.id in inner or \
                id(name) in called or name.id in seen:
            continue
        if name.id in params:
            out.add(name.id)
            continue
        sources = _bound_values(name.id, scope)
        if not sources:
            if name.id in dir(builtins):
                continue
            return None
        for source in sources:
            got = _origins(source, scope, params, seen | {name.id})
            if got is None:
                return None
            out |= got
    return out


def _bound_values(name: str, scope: ast.AST) -> list[ast.AST]:
    """The expressions ``scope`` binds ``name`` to: assignments (a tuple's own element where the value is one),
    ``for`` and comprehension targets (``zip(a, b)`` and ``enumerate(a)`` element-wise), walrus."""
    out: list[ast.AST] = []

    def bind(target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name) and target.id == name:
            out.append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts: list[ast.AST] | None = None
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                parts = list(value.elts)
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "zip" and \
                    len(value.args) == len(target.elts):
                parts = list(value.args)
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                    value.func.id == "enumerate" and len(target.elts) == 2 and value.args:
                parts = [ast.Constant(0), value.args[0]]
            for i, element in enumerate(target.elts):
                bind(element, parts[i] if parts is not None else value)

    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            bind(node.target, node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bind(node.target, node.iter)
        elif isinstance(node, ast.NamedExpr):
            bind(node.target, node.value)
    return out


def _falls_back(call: ast.Call, parents: dict[int, ast.AST]) -> bool:
    """The match ``call`` returns is bound to a name read only by tests with a fallback to the text when nothing
    matched and inside their matched branch (``m.group(1) if m else text``, ``if m: answer = m.group(1) else: answer
    = text``), or ``call`` stands in a ``try`` whose handlers keep the text. A completion without the pattern is then
    scored on its text; a fallback to a constant (``else ""``, ``else INVALID``), a return or a raise scores it
    apart, and so does a test that reads the match itself (``if m and answer == truth``)."""
    holder = parents.get(id(call))
    scope = _scope(call, parents)
    if scope is None:
        return False
    if isinstance(holder, ast.NamedExpr):
        name = holder.target.id
    elif isinstance(holder, ast.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0], ast.Name):
        name = holder.targets[0].id
    else:  # ``try: a = re.search(...).group(1)`` / ``except AttributeError: a = text``
        statement = holder
        while statement is not None and not isinstance(statement, ast.stmt):
            statement = parents.get(id(statement))
        guard = parents.get(id(statement))
        return isinstance(guard, ast.Try) and statement in guard.body and bool(guard.handlers) and all(
            _keeps_text(handler.body) for handler in guard.handlers)
    verdicts, read = [], set()
    for node in ast.walk(scope):
        if isinstance(node, (ast.If, ast.IfExp)) and (missing := _branch_without_match(node, name)) is not None:
            matched = node.body if missing is node.orelse else node.orelse
            read |= {id(n) for part in [node.test, *(matched if isinstance(matched, list) else [matched])]
                     for n in ast.walk(part)}
            if isinstance(node, ast.IfExp):
                verdicts.append(not _constant(missing) and not _global(missing, scope))
            elif missing:
                verdicts.append(_keeps_text(missing))
            else:  # ``if m: text = m[-1]``: a text bound before keeps its value
                verdicts.append(_keeps_text(node.body) and all(
                    _bound_before(target.id, node, scope) for s in node.body for target in s.targets))
    loads = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    # ``if m and pred == gt`` reads the match itself: no fallback then
    return bool(verdicts) and all(verdicts) and all(id(n) in read for n in loads)


def _global(expr: ast.AST, scope: ast.AST) -> bool:
    """``expr`` is a name the function neither takes nor binds (a module constant: ``else INVALID``)."""
    return isinstance(expr, ast.Name) and expr.id not in _params(scope) and not _bound_values(expr.id, scope)


def _keeps_text(statements: list[ast.stmt]) -> bool:
    """Each statement binds a name to a value that is not a constant (``answer = text``): nothing scored, returned
    or raised."""
    return bool(statements) and all(isinstance(s, ast.Assign) and not _constant(s.value)
                                    and all(isinstance(t, ast.Name) for t in s.targets) for s in statements)


def _bound_before(name: str, node: ast.stmt, scope: ast.AST) -> bool:
    """``name`` holds a value that is not a constant before ``node``: a parameter of ``scope``, or the target of an
    earlier assignment or loop in it (the last such binding counts)."""
    earlier = [other for other in ast.walk(scope) if isinstance(other, (ast.Assign, ast.For))
               and other.lineno < node.lineno and any(
                   isinstance(t, ast.Name) and t.id == name for target in
                   (other.targets if isinstance(other, ast.Assign) else [other.target]) for t in ast.walk(target))]
    last = max(earlier, key=lambda other: other.lineno, default=None)
    if last is not None:
        return isinstance(last, ast.For) or not _constant(last.value)
    arguments = scope.args if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    return arguments is not None and any(a.arg == name for a in (*arguments.posonlyargs, *arguments.args,
                                                                  *arguments.kwonlyargs))


def _branch_without_match(node: ast.If | ast.IfExp, name: str) -> Any:
    """The branch of ``node`` taken when ``name`` holds no match (``if m`` / ``m is not None``: the else; ``not m`` /
    ``m is None``: the body), or None when its test is not such a test of ``name``."""
    test = node.test.target if isinstance(node.test, ast.NamedExpr) else node.test

    def is_name(expr: ast.AST) -> bool:
        expr = expr.target if isinstance(expr, ast.NamedExpr) else expr
        return isinstance(expr, ast.Name) and expr.id == name

    if is_name(test):
        return node.orelse
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and is_name(test.operand):
        return node.body
    if isinstance(test, ast.Compare) and is_name(test.left) and len(test.ops) == 1 and \
            isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        return node.orelse if isinstance(test.ops[0], ast.IsNot) else node.body if isinstance(test.ops[0], ast.Is) \
            else None
    return None


def _constant(expr: ast.AST) -> bool:
    """``expr`` is a constant (``""``, ``None``, ``-1.0``)."""
    return isinstance(expr, ast.Constant) or (isinstance(expr, ast.UnaryOp) and isinstance(expr.operand, ast.Constant))


def _scope(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST | None:
    """The function (or module) ``node`` stands in."""
    scope = parents.get(id(node))
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        scope = parents.get(id(scope))
    return scope


def _cuts(call: ast.Call, parents: dict[int, ast.AST]) -> bool:
    """The result of ``call`` (a ``find`` / ``index``) is a slice bound, directly or through the name it is assigned
    to in its function (``i = s.rfind("</think>")`` ... ``s[i + 8:]``)."""
    if _in_slice(call, parents):
        return True
    statement = parents.get(id(call))
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)):
        return False
    name, scope = statement.targets[0].id, _scope(statement, parents)
    return scope is not None and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                     and _in_slice(n, parents) for n in ast.walk(scope))


def _in_slice(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """``node`` is (part of) a slice bound or an index: ``text[node + 8:]``."""
    while (parent := parents.get(id(node))) is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Slice) or (isinstance(parent, ast.Subscript) and parent.slice is node):
            return True
        node = parent
    return False


def _module_statements(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The module-level statements, also those inside module-level ``if`` / ``try`` / ``with`` / ``for`` blocks
    (``try: FMT = re.compile(...)``), not inside functions or classes."""
    for node in statements:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for key in ("body", "orelse", "finalbody"):
                yield from _module_statements(getattr(node, key, []))
            for handler in getattr(node, "handlers", []):
                yield from _module_statements(handler.body)


def _module_bindings(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """The statements that bind each module-level name: functions, classes and assignments
    (:func:`_module_statements`)."""
    defined: dict[str, list[ast.AST]] = {}
    for node in _module_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.setdefault(name.id, []).append(node)
    return defined


def _import_of(tree: ast.Module, name: str) -> tuple[ast.ImportFrom, str] | None:
    """The last module-level ``from M import X [as name]`` binding ``name`` (in module-level blocks too), and ``X``."""
    found = [(node, alias.name) for node in _module_statements(tree.body) if isinstance(node, ast.ImportFrom)
             for alias in node.names if (alias.asname or alias.name) == name]
    return max(found, key=lambda item: item[0].lineno, default=None)


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


def _whole(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """``node`` is a whole string, not a piece of an f-string or a ``+`` (``rf"<a>([{X}])"`` compiles only joined)."""
    return not isinstance(parents.get(id(node)), (ast.JoinedStr, ast.FormattedValue, ast.BinOp))


def _places(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int] | None) -> list[ast.AST]:
    """Where the constant ``node`` is used: itself, or when it is bound to a name, that name's loads (those ``within``
    the nodes given, when given)."""
    if _use_at(node, parents) is not None:
        return [node]
    parent = parents.get(id(node))
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        name = parent.targets[0].id
        return [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name
                and isinstance(n.ctx, ast.Load) and (within is None or id(n) in within)]
    return []


def pattern_use(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int] | None = None,
                *, shown_only: bool = False) -> str | None:
    """``regex`` (a regular expression a match is tested with), ``literal`` (a plain-text test: ``in``, ``==``,
    ``startswith``), ``processing`` (text cut or replaced: ``split("</think>")``, ``re.sub``) or ``message`` (logged,
    printed or raised), ``text`` (part of the text a regex searches). A constant bound to a name takes its strongest
    use among that name's uses (those ``within`` the nodes given, when given); a use the file does not show counts as
    ``regex`` (None with ``shown_only``)."""
    uses = [_use_at(place, parents) for place in _places(node, tree, parents, within)]
    known = [u for u in uses if u is not None]
    if known and len(known) == len(uses):
        return max(known, key=_RANK.__getitem__)
    return None if shown_only else "regex"


def pattern_soft(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int] | None = None
                 ) -> bool:
    """Every test of the constant ``node`` leaves a completion without it a score (:func:`_soft_at`)."""
    places = [p for p in _places(node, tree, parents, within) if _use_at(p, parents) in ("regex", "literal")]
    return bool(places) and all(_soft_at(place, parents) for place in places)


def _imported_from(node: ast.ImportFrom, file: Path, search: tuple[Path, ...], *, local: bool = False,
                   submodule: str | None = None) -> Path | None:
    """The file of the module ``node`` imports from (``from .utils import f`` beside ``file``; ``from pkg.mod import
    f`` in ``file``'s directory, ``search`` or, unless ``local``, ``sys.path``), or None; with ``submodule``, the
    file of that module of it (``from pkg import mod``)."""
    parts = [*((node.module or "").split(".") if node.module else []), *([submodule] if submodule else [])]
    here = file.resolve().parents
    if node.level:
        return _module_file(parts, [here[node.level - 1]], local=True) if node.level <= len(here) else None
    return _module_file(parts, [here[0], *search], local=local)


def _module_file(parts: list[str], bases: list[Path], *, local: bool = False) -> Path | None:
    """The file of the module ``parts`` (``["pkg", "mod"]``; empty: the package at a base) under the first of
    ``bases`` then (unless ``local``) ``sys.path`` that holds it: ``pkg/mod.py`` or ``pkg/mod/__init__.py``."""
    for base in [*bases, *([] if local else (Path(p) for p in sys.path if p))]:
        stem = base.joinpath(*parts)
        for candidate in (stem.with_suffix(".py") if parts else None, stem / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate
    return None


def _called_imports(tree: ast.Module, within: set[int], file: Path, search: tuple[Path, ...]
                    ) -> list[tuple[Path, str]]:
    """The imported functions the nodes ``within`` call, as ``(module file, function)``: ``from M import f`` ...
    ``f(...)``, ``import M`` / ``from P import M`` ... ``M.f(...)``; only modules beside ``file`` or on ``search``
    (an installed package's code is not read)."""
    bound: dict[str, tuple[ast.Import | ast.ImportFrom, str]] = {}
    for node in _module_statements(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                local = alias.asname or (alias.name if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0])
                bound[local] = (node, alias.name)
    here = file.resolve().parent
    out: list[tuple[Path, str]] = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and id(call) in within):
            continue
        func, source, name = call.func, None, ""
        if isinstance(func, ast.Name) and isinstance((entry := bound.get(func.id, (None, "")))[0], ast.ImportFrom):
            source, name = _imported_from(entry[0], file, search, local=True), entry[1]
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in bound:
            node, module = bound[func.value.id]
            source = _module_file(module.split("."), [here, *search], local=True) if isinstance(node, ast.Import) \
                else _imported_from(node, file, search, local=True, submodule=module)
            name = func.attr
        if source is not None and (source, name) not in out:
            out.append((source, name))
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
    imported = None if owner else _import_of(tree, function)
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
    completion = set(_COMPLETION_PARAMS.get(signature, params[:1] if signature in (None, "easyr1") else []))
    patterns, spans, uses, soft, branches = [], [], [], [], []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and id(node) in within and TAG_RE.search(node.value.replace("\\/", "/"))):  # r"<\/think>" too
            patterns.append(node.value)
            spans.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0))
            shown = _read_use(node, tree, parents, within, checked, completion)
            uses.append(shown or ("processing" if _called else "regex"))  # library code: only what it shows
            soft.append(pattern_soft(node, tree, parents, within))
            tests = [place for place in _places(node, tree, parents, within)
                     if _use_at(place, parents) in ("regex", "literal")]
            spots = {_branch_of(place, parents, checked, completion) for place in tests} if checked else {None}
            branches.append(spots.pop() if shown in ("regex", "literal") and len(spots) == 1 else None)
            if shown == "regex" and _whole(node, parents):
                try:  # the engine would raise at its first score
                    re.compile(node.value)
                except re.error as error:
                    raise ConfigError(f"--reward {file}:{node.lineno}: the regex {node.value!r} does not compile "
                                      f"({error})") from None
    order = sorted(range(len(patterns)), key=lambda i: spans[i])
    info = RewardInfo(file=file, function=function, params=params, var_keyword=var_keyword, positional=positional,
                      required=required, var_positional=var_positional,
                      patterns=[patterns[i] for i in order], uses=[uses[i] for i in order],
                      soft=[soft[i] for i in order], spans=[spans[i] for i in order], files=[file] * len(order),
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


def _read_use(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int],
              checked: ast.AST | None, completion: set[str]) -> str | None:
    """:func:`pattern_use`, and where the checked function shows more: ``supplied`` for text the reward writes into
    the completion (``text = "<think>" + completion``), ``data`` for a test of the ground truth or another column
    (:func:`_tests_data`)."""
    shown = pattern_use(node, tree, parents, within, shown_only=True)
    if checked is None:
        return shown
    top, _parent = _standing(node, parents)
    scope = _scope(node, parents)
    roles = _roles(scope, checked, completion) if top is not node else None
    if roles is not None and _origins_in(top, scope, roles[0], any):
        return "supplied"
    if shown == "text":
        return "data"  # a searched text that is not the completion
    tests = [place for place in _places(node, tree, parents, within) if _use_at(place, parents) in ("regex", "literal")]
    if shown in ("regex", "literal") and tests and all(_tests_data(p, parents, checked, completion) for p in tests):
        return "data"  # ``re.search(r"<answer>(.*)</answer>", ground_truth)``: the data holds the tag
    return shown


VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The keywords verl calls a ``custom_reward_function`` with (its ``reward_kwargs`` besides)."""
VERL_SCORERS = ("gsm8k", "math_reward", "math_dapo", "math_verify", "math_batch", "prime_math", "prime_code",
                "sandbox_fusion", "geo3k", "search_r1_like_qa_em", "rlla")
"""The modules of verl 0.9.1's ``verl/utils/reward_score`` that its default_compute_score calls positionally."""


def verl_scorer_file(file: Path) -> bool:
    """``file`` is one of verl's built-in scorers: in a ``reward_score`` package (verl's own, a fork's such as
    TinyZero's) or named as one of verl's (a copy, a rewrite)."""
    return "reward_score" in file.resolve().parts or file.stem in VERL_SCORERS


def call_problem(info: RewardInfo, engine: str, *, keywords: set[str], verl_positional: bool = False) -> str | None:
    """Why ``engine`` cannot call the function the way it calls reward functions, or None. ``keywords``: the extra
    keyword arguments the run passes (``reward_kwargs``); ``verl_positional``: the function may be one of verl's
    built-in scorers, which default_compute_score calls ``f(solution_str, ground_truth)`` (a ``--reward`` file in a
    ``reward_score`` package: verl's own, or a fork's such as TinyZero's)."""
    shown = f"{info.function}({', '.join(info.params)}{', **' if info.var_keyword else ''}"
    shown += "kwargs)" if info.var_keyword else ")"
    if "." in info.function and engine != "trl":
        return (f"{engine} looks its reward function up by name in the module, which cannot name the method "
                f"{info.function}: expose it as a module-level function")
    if info.signature is not None and info.signature != engine:
        return f"{shown} is {info.signature}'s reward signature, not {engine}'s: pass --engine {info.signature}"
    unfilled = [name for name in info.required if name not in keywords]
    unknown = sorted(keywords - set(info.params)) if not info.var_keyword else []
    if unknown:  # verl merges reward_kwargs into its call, EasyR1 binds them with functools.partial: a TypeError
        return f"{engine} passes the reward kwargs {', '.join(unknown)}: {shown} cannot take them (add **kwargs)"

    def positional(count: int, call: str) -> str | None:
        if not info.var_positional and info.positional < count:
            return f"{engine} calls {call}: {shown} takes fewer positional arguments"
        extra = unfilled[count:]
        return f"{engine} calls {call}: {shown} also requires {', '.join(extra)}" if extra else None

    if engine == "trl":
        if not info.var_keyword:
            return (f"TRL calls reward functions with keywords (prompts=, completions=, completion_ids=, "
                    f"trainer_state=, ... and the dataset's columns): {shown} needs **kwargs")
        return None
    if engine == "verl":
        missing, extra = _verl_keywords_unfit(info, keywords)
        if not missing and not extra:
            return None
        if verl_positional and "data_source" not in info.params:  # as default_compute_score calls its scorers
            return positional(2, f"{info.function}(solution_str, ground_truth)")
        return (f"verl calls {info.function}(data_source=, solution_str=, ground_truth=, extra_info=): {shown} "
                + (f"cannot take {', '.join(missing)}" if missing else f"also requires {', '.join(extra)}"))
    if engine == "easyr1":
        return positional(1, f"{info.function}(reward_inputs)")
    if engine == "openrlhf":
        return positional(3, f"{info.function}(queries, prompts, labels)")
    return None


def _verl_keywords_unfit(info: RewardInfo, keywords: set[str]) -> tuple[list[str], list[str]]:
    """What stops verl's keyword call (``data_source=, solution_str=, ground_truth=, extra_info=`` and the run's
    reward kwargs): the keywords ``info``'s function cannot take, and the parameters that call leaves unfilled."""
    taken = set(info.params) | keywords
    missing = [k for k in VERL_KEYWORDS if k not in taken] if not info.var_keyword else []
    return missing, [k for k in info.required if k not in keywords and k not in VERL_KEYWORDS]


def pattern_literals(pattern: str, *, regex: bool = True, added: list[str] | None = None) -> list[str]:
    """The literal runs every match of ``pattern`` holds (of an alternation, the tags every alternative holds;
    ``added``: the tokenizer's added-token contents), or the string itself when it is not (used as) a regex."""
    if not regex:
        return [pattern]
    try:
        return regex_literals(pattern, required_only=True, added=added)
    except TemplateError:
        return [pattern]


def trl_reward_file(name: str) -> Path | None:
    """The file of a reward that TRL's ``trl grpo`` names without a module (``think_format_reward``), found
    without importing TRL."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    for path in sorted((Path(next(iter(spec.submodule_search_locations))) / "rewards").glob("*.py")):
        if f"def {name}(" in path.read_text():
            return path
    return None


def resolve_module_function(ref: str, search: list[Path]) -> tuple[Path, str]:
    """``module.function`` (TRL's ``reward_funcs``) as a file and a name, found on ``search`` + ``sys.path``."""
    module, _, function = ref.rpartition(".")
    if not module:
        found = trl_reward_file(ref)
        if found is None:
            raise ConfigError(f"reward_funcs {ref!r}: not a module.function path, and no reward of TRL "
                              "(trl.rewards) has that name (is trl installed? pip install 'vlforge[trl]')")
        return found, ref
    found = _module_file(module.split("."), search)
    if found is not None:
        return found, function
    raise ConfigError(f"reward_funcs {ref!r}: no file for module {module!r} in the working directory, "
                      "--reward-path or sys.path")


def _package_name(file: Path) -> str | None:
    """``pkg.sub.mod`` for a file inside a package (directories with ``__init__.py``), its top package's parent
    put on ``sys.path``; None for a file outside one."""
    top = file.resolve().parent
    if not (top / "__init__.py").is_file():
        return None
    while (top.parent / "__init__.py").is_file():
        top = top.parent
    parts = file.resolve().relative_to(top.parent).with_suffix("").parts
    if str(top.parent) not in sys.path:
        sys.path.append(str(top.parent))
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_function(file: Path, function: str, extra_paths: list[Path], *, as_module: bool = False
                   ) -> tuple[Callable, Any]:
    for path in extra_paths:
        if str(path) not in sys.path:
            sys.path.append(str(path))
    name = f"vlforge_reward_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--reward {file}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's module: any import or runtime error is theirs to read
        sys.modules.pop(name, None)
        package = _package_name(file) if as_module and isinstance(error, ImportError) else None
        try:  # relative imports: the module of its package, imported by its dotted name as TRL imports it
            module = importlib.import_module(package) if package is not None else None
        except Exception:  # the first error is the one to report
            module = None
        if module is not None and Path(getattr(module, "__file__", "") or "").resolve() != file.resolve():
            module = None  # another package of that name came first on sys.path
        if module is None:
            raise ConfigError(f"--reward {file}: importing it failed ({type(error).__name__}: {error}); "
                              "add the directories its imports need with --reward-path") from None
    fn: Any = module
    for part in function.split("."):  # ``Class.method``
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ConfigError(f"--reward {file}: {function!r} is not a function")
    return fn, module


def _number(value: Any, where: str) -> float:
    if value is None:
        return math.nan
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    raise ConfigError(f"{where}: returned {type(value).__name__} {value!r}, not a number")


@dataclass
class Sample:
    """One completion as the engine hands it to its reward."""

    text: str
    """The completion decoded with the engine's ``skip_special_tokens``."""
    ids: list[int]
    prompt_text: str
    row: Any
    """The :class:`~vlforge.rl.prompts.PromptRow`."""


@dataclass
class Scorer:
    """The user's reward function called in its engine's signature."""

    engine: str
    fn: Callable
    info: RewardInfo
    kwargs: dict = field(default_factory=dict)
    reward_type: str = "batch"

    @property
    def where(self) -> str:
        return f"{self.info.file}:{self.info.function}"

    def __call__(self, samples: list[Sample]) -> list[float]:
        try:
            scores = getattr(self, f"_{self.engine}")(samples)
        except ConfigError:
            raise
        except Exception as error:  # the user's function failed on a real completion
            raise ConfigError(f"{self.where} raised {type(error).__name__}: {error}") from None
        if len(scores) != len(samples):
            raise ConfigError(f"{self.where}: returned {len(scores)} rewards for {len(samples)} completions")
        return scores

    def _trl(self, samples: list[Sample]) -> list[float]:
        rows = [s.row for s in samples]
        if rows[0].conversational:
            prompts: list[Any] = [r.messages for r in rows]
            completions: list[Any] = [[{"role": "assistant", "content": s.text}] for s in samples]
        else:
            prompts = [s.prompt_text for s in samples]
            completions = [s.text for s in samples]
        columns = {key: [r.columns.get(key) for r in rows] for key in rows[0].columns if key != "completion"}
        out = self.fn(prompts=prompts, completions=completions, completion_ids=[s.ids for s in samples],
                      trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None,
                      **columns, **self.kwargs)
        return [_number(v, self.where) for v in out]

    def _verl(self, samples: list[Sample]) -> list[float]:
        keywords = _verl_keywords_unfit(self.info, set(self.kwargs)) == ([], [])
        out = []
        for s in samples:
            if keywords:
                value = self.fn(data_source=s.row.data_source, solution_str=s.text, ground_truth=s.row.answer,
                                extra_info=s.row.extra_info, **self.kwargs)
            else:  # verl's default_compute_score calls its built-in scorers positionally
                value = self.fn(s.text, s.row.answer, **self.kwargs)
            if isinstance(value, dict):
                value = value.get("score")
            out.append(_number(value, self.where))
        return out

    def _easyr1(self, samples: list[Sample]) -> list[float]:
        inputs = [{"response": s.text, "response_length": len(s.ids), "ground_truth": s.row.answer} for s in samples]
        if self.reward_type == "sequential":
            results = [self.fn(item, **self.kwargs) for item in inputs]
        else:
            results = list(self.fn(inputs, **self.kwargs))
        out = []
        for result in results:
            if not isinstance(result, dict) or "overall" not in result:
                raise ConfigError(f"{self.where}: EasyR1 expects a dict with 'overall' per response, got {result!r}")
            out.append(_number(result["overall"], self.where))
        return out

    def _openrlhf(self, samples: list[Sample]) -> list[float]:
        out = []
        for s in samples:  # OpenRLHF calls the function once per query
            value = self.fn([s.prompt_text + s.text], [s.prompt_text], [s.row.answer])
            if isinstance(value, dict):
                value = value.get("rewards")
            if hasattr(value, "tolist"):
                value = value.tolist()
            if isinstance(value, (list, tuple)):
                if len(value) != 1:
                    raise ConfigError(f"{self.where}: returned {len(value)} rewards for one query")
                value = value[0]
            out.append(_number(value, self.where))
        return out


def _awaited(fn: Callable) -> Callable:
    """``fn`` (a coroutine function) called to completion."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return call


def load_scorer(engine: str, info: RewardInfo, *, kwargs: dict | None = None, extra_paths: list[Path] | None = None,
                reward_type: str | None = None, named: tuple[Path, str] | None = None) -> Scorer:
    """Run the reward file and wrap its function for ``engine``; ``reward_type`` (EasyR1's config key) over the
    file's ``REWARD_TYPE``, else batch. ``named``: the file and function the run names (default: where ``info``
    found the function), loaded as the engine loads it: by its path (verl, EasyR1), or as a module of its package
    where it is in one (TRL imports ``module.function``, so relative imports work)."""
    file, function = named or (info.file, info.function)
    fn, module = _load_function(file, function, list(extra_paths or []), as_module=engine == "trl")
    if inspect.iscoroutinefunction(fn):  # verl awaits an async compute_score: one event loop per call here
        fn = _awaited(fn)
    reward_type = reward_type or str(getattr(module, "REWARD_TYPE", "batch"))
    return Scorer(engine=engine, fn=fn, info=info, kwargs=dict(kwargs or {}), reward_type=reward_type)
