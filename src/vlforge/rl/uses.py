"""How a reward function's code uses a string that holds a tag, read with :mod:`ast` (nothing runs).

A string is a ``regex`` or a ``literal`` test of the completion (``re.search(P, text)``, ``"<think>" in text``), or
``processing`` (text cut at it: ``split("</think>")``), a ``message`` (logged, printed, raised), ``text`` (part of
the text a regex searches); read in the checked function, ``supplied`` (written into the completion by the reward)
or ``data`` (a test of the ground truth or another column). A test is *soft* when a completion without it still
scores (a fallback to the whole text, partial credit), and may sit in one branch of an if/elif chain of presence
tests (:func:`branch_of`). :mod:`vlforge.rl.reading` applies these to a reward function's strings.

Example:
    >>> import ast
    >>> tree = ast.parse('import re\\ndef f(c):\\n    return bool(re.search(r"<think>", c))\\n')
    >>> parents = {id(k): n for n in ast.walk(tree) for k in ast.iter_child_nodes(n)}
    >>> pattern_use(next(n for n in ast.walk(tree) if isinstance(n, ast.Constant)), tree, parents)
    'regex'
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Iterable
from typing import Any

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
_BUILTINS = frozenset(dir(builtins))
COMPLETION_PARAMS = {"trl": ("completions", "completion_ids"), "verl": ("solution_str",), "openrlhf": ("queries",)}
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


def branch_of(place: ast.AST, parents: dict[int, ast.AST], checked: ast.AST, completion: set[str]
               ) -> tuple[int, int, int] | None:
    """``(chain, branch, scoring branches)`` of the innermost if/elif chain of presence tests on the completion
    (:func:`_presence_chain`, its tests traced to ``completion`` in the ``checked`` function) whose branch test or
    body holds ``place``: a completion takes one branch, so it needs what every scoring branch tests, not each
    branch's own tags. The ``else`` and a branch that only returns or sets a penalty (``return -1.0``) are failing
    paths: a failing branch's ``branch`` is -1. The operands of ``A or B`` (presence tests), and of ``A and B``
    (absence tests: ``"</think>" not in s and "</reasoning>" not in s``) guarding a failing branch, are such
    alternatives too (their chain: the negated position of the expression)."""
    child = place
    while (parent := parents.get(id(child))) is not None and \
            not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(parent, ast.BoolOp) and child in parent.values and _either(parent, parents):
            return -(parent.lineno * 10_000 + parent.col_offset), parent.values.index(child), len(parent.values)
        if isinstance(parent, ast.If) and (child is parent.test or child in parent.body):
            chain = _presence_chain(parent, parents)
            scope = scope_of(parent, parents)
            roles = _roles(scope, checked, completion, parents) if chain is not None else None
            if roles is not None and all(_origins_in(member.test.comparators[0], scope, roles[0], any)
                                         for member in chain):
                scoring = [member for member in chain if not _fails(member.body)]
                return chain[0].lineno, scoring.index(parent) if parent in scoring else -1, len(scoring)
        child = parent
    return None


def _either(expression: ast.BoolOp, parents: dict[int, ast.AST]) -> bool:
    """``expression`` passes when any one of its tests finds its string: ``A or B`` of presence tests (``"<a>" in s``,
    ``re.search(P, s)``, ``s.startswith(...)``), or ``A and B`` of absence tests (``"<a>" not in s``, ``not
    re.search(P, s)``) as the test of an ``if`` whose body fails (:func:`_fails`)."""
    def presence(test: ast.AST) -> bool:
        return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)) or (
            isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)
            and test.func.attr in _MATCHES | _TEXT_TESTS)

    def absence(test: ast.AST) -> bool:
        return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotIn)) or (
            isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and presence(test.operand))

    if isinstance(expression.op, ast.Or):
        return all(map(presence, expression.values))
    guard = parents.get(id(expression))
    return isinstance(guard, ast.If) and guard.test is expression and _fails(guard.body) and \
        all(map(absence, expression.values))


def _fails(statements: list[ast.stmt]) -> bool:
    """The statements only end the test with no credit: ``return -1.0`` / ``return None`` / ``score = 0.0``,
    ``continue``, ``pass``."""
    def penalty(value: ast.AST | None) -> bool:
        if value is None:
            return True
        try:
            number = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
        return number is None or number is False or (isinstance(number, (int, float)) and number <= 0)

    return bool(statements) and all(
        isinstance(s, (ast.Continue, ast.Pass)) or (isinstance(s, ast.Return) and penalty(s.value))
        or (isinstance(s, ast.Assign) and penalty(s.value)) for s in statements)


def _roles(scope: ast.AST | None, checked: ast.AST, completion: set[str], parents: dict[int, ast.AST]
           ) -> tuple[set[str], set[str]] | None:
    """``(completion parameters, data parameters)`` of ``scope``: the ``checked`` function's own, or those of a
    module-level helper it calls directly (``extract(solution_str)``: a parameter that any call fills from the
    completion is one, a parameter every call fills from other parameters is data); None for other scopes."""
    if scope is checked:
        return completion, params_of(checked) - completion
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    module = checked
    while (above := parents.get(id(module))) is not None:
        module = above
    calls = [n for n in ast.walk(module) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == scope.name]
    inside = {id(n) for n in ast.walk(checked)}
    if not any(id(call) in inside for call in calls):
        return None
    positional = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
    filled: dict[str, list[set[str] | None]] = {}
    for call in calls:
        pairs = [*zip(positional, call.args, strict=False), *((k.arg, k.value) for k in call.keywords if k.arg)]
        for param, arg in pairs:  # a call from elsewhere (another helper) is not traced
            filled.setdefault(param, []).append(
                _origins(arg, checked, params_of(checked), frozenset()) if id(call) in inside else None)
    reads = {param for param, sources in filled.items() if any(o and o & completion for o in sources)}
    data = {param for param, sources in filled.items() if param not in reads and len(sources) == len(calls)
            and all(sources)}
    return reads, data


def _origins_in(expr: ast.AST, scope: ast.AST, names: set[str], how: Callable[[Iterable[bool]], bool]) -> bool:
    """``how`` (``any`` / ``all``) of the parameters ``expr`` is computed from (:func:`_origins`) are in ``names``;
    False when it is computed from none, or from a value not traced."""
    origins = _origins(expr, scope, params_of(scope), frozenset())
    return bool(origins) and how(origin in names for origin in origins)


def params_of(function: ast.AST) -> set[str]:
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None}


def use_at(node: ast.AST, parents: dict[int, ast.AST]) -> str | None:
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
                isinstance(n, ast.Constant) and n.value == node.value and use_at(n, parents) == "processing"
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
    differently. An ``else`` that only keeps the text (``else: answer = s``) is still a cut. When the body ends in a
    ``return``, the statements after the ``if`` are its ``else`` (``if "</think>" in s: return ...`` / ``return
    0.0``)."""
    def constant_set(statement: ast.stmt) -> bool:
        return isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)

    otherwise = list(guard.orelse)
    block = parents.get(id(guard))
    if not otherwise and guard.body and isinstance(guard.body[-1], (ast.Return, ast.Raise)) and block is not None:
        siblings = next((getattr(block, key) for key in ("body", "orelse", "finalbody")
                         if guard in getattr(block, key, [])), [])
        otherwise = siblings[siblings.index(guard) + 1:]
    if any(_fixed_score(n) or constant_set(n) for statement in otherwise for n in ast.walk(statement)):
        return True
    flags = {t.id for statement in guard.body for n in ast.walk(statement) if constant_set(n)
             and isinstance(n.value.value, (bool, int)) for t in n.targets if isinstance(t, ast.Name)}
    scope = scope_of(guard, parents)
    return scope is not None and any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in flags
                                     and n.lineno > (guard.end_lineno or guard.lineno) for n in ast.walk(scope))


def _fixed_score(node: ast.AST) -> bool:
    """``node`` ends the test with a score that does not read the text: a ``raise``, a ``return`` of a literal
    (``return 0.0``, ``return``), a literal assigned (``score = 0``)."""
    return isinstance(node, ast.Raise) or (isinstance(node, ast.Return) and (node.value is None or _constant(node.value))) \
        or (isinstance(node, ast.Assign) and _constant(node.value))


def _cut_fails(place: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """The cut at ``place`` stands in a ``try`` whose handlers return, raise or set a constant (``try:
    s.split("<answer>")[1]`` / ``except IndexError: return 0.0``): without the tag the cut fails and that scores."""
    child = place
    while (parent := parents.get(id(child))) is not None and \
            not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(parent, ast.Try) and child in parent.body:
            return any(_fixed_score(n) for handler in parent.handlers for statement in handler.body
                       for n in ast.walk(statement))
        child = parent
    return False


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
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add) and \
                not isinstance(parent.right if parent.left is node else parent.left, ast.Constant):
            summed = True  # a penalty subtracted is not another term of credit
        if summed and isinstance(parent, ast.Compare):
            return False
        node = parent
    if summed:
        return True

    def adds(statement: ast.AST | None) -> bool:
        return isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add) and \
            isinstance(statement.target, ast.Name) and not _constant_zero(statement.value)

    own = [parent] if adds(parent) else parent.body if isinstance(parent, ast.If) and parent.test is node and \
        not parent.orelse and parent.body and all(map(adds, parent.body)) else []
    scope = scope_of(test, parents)
    if not own or scope is None:
        return False
    targets = {statement.target.id for statement in own}
    others = [n for n in ast.walk(scope) if adds(n) and n.target.id in targets and all(n is not o for o in own)
              and not any(_exclusive(n, o, parents) for o in own)]
    return bool(others)


def _constant_zero(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value == 0


def _exclusive(a: ast.AST, b: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """``a`` and ``b`` stand in opposite branches of one ``if`` (never both run)."""
    sides: dict[int, str] = {}
    child = a
    while (parent := parents.get(id(child))) is not None:
        if isinstance(parent, ast.If):
            sides[id(parent)] = "body" if child in parent.body else "orelse" if child in parent.orelse else "test"
        child = parent
    child = b
    while (parent := parents.get(id(child))) is not None:
        if isinstance(parent, ast.If) and id(parent) in sides:
            side = "body" if child in parent.body else "orelse" if child in parent.orelse else "test"
            return {side, sides[id(parent)]} == {"body", "orelse"}
        child = parent
    return False


_MATCHES = frozenset({"search", "match", "fullmatch", "findall", "finditer"})


def _feeds_a_test(top: ast.AST, parent: ast.AST | None, parents: dict[int, ast.AST], scope: ast.AST | None) -> bool:
    """The string ``top`` is the text a test reads: the text argument of a regex match (``re.match(P, "<think>" +
    c)``, ``PATTERN.match("<think>" + c)``), or bound to a name (``text = ...``, ``text += ...``) that a test reads
    (``re.search(P, text)``, ``"<answer>" in text``, ``text.startswith(...)``); not a message or a prompt."""
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr in _MATCHES:
        owner = parent.func.value
        regex_module = isinstance(owner, ast.Name) and owner.id in ("re", "regex")
        return top in parent.args[1 if regex_module else 0:][:1]
    target = parent.targets[0] if isinstance(parent, ast.Assign) and len(parent.targets) == 1 else \
        parent.target if isinstance(parent, ast.AugAssign) else None
    if not isinstance(target, ast.Name) or scope is None:
        return False
    for load in ast.walk(scope):
        if not (isinstance(load, ast.Name) and load.id == target.id and isinstance(load.ctx, ast.Load)):
            continue
        user = parents.get(id(load))
        if isinstance(user, ast.Compare) and load in user.comparators and isinstance(user.ops[0], (ast.In, ast.NotIn)):
            return True
        if isinstance(user, ast.Call) and isinstance(user.func, ast.Attribute) and user.func.attr in _MATCHES and \
                load in user.args:
            return True
        if isinstance(user, ast.Attribute) and user.value is load and user.attr in _TEXT_TESTS | _TEXT_SEARCHES:
            return True
    return False


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
    scope = scope_of(place, parents)
    roles = _roles(scope, checked, completion, parents) if subject is not None and completion else None
    return roles is not None and _origins_in(subject, scope, roles[1], all)


def _origins(expr: ast.AST, scope: ast.AST, params: set[str], seen: frozenset[str],
             memo: dict[str, set[str] | None] | None = None) -> set[str] | None:
    """The parameters of ``scope`` whose values reach ``expr`` (through assignments, loops, comprehensions, calls on
    them), or None when a name's value is not traced (a global, ``self``, a with or except target). A subscript's
    index carries no value (``solution[i]`` is the solution's), nor does a module's name (``re.sub(...)``)."""
    memo = {} if memo is None else memo
    inner = {n.id for comp in ast.walk(expr) if isinstance(comp, ast.comprehension) for n in ast.walk(comp.target)
             if isinstance(n, ast.Name)}
    skipped = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
    skipped |= {id(n) for sub in ast.walk(expr) if isinstance(sub, ast.Subscript) for n in ast.walk(sub.slice)}
    bases = {id(n.value) for n in ast.walk(expr) if isinstance(n, ast.Attribute)}
    out: set[str] = set()
    for name in ast.walk(expr):
        if not isinstance(name, ast.Name) or not isinstance(name.ctx, ast.Load) or name.id in inner or \
                id(name) in skipped or name.id in seen:
            continue
        if name.id in params:
            out.add(name.id)
            continue
        if name.id not in memo:
            sources = bound_values(name.id, scope)
            if not sources:  # a builtin or a module's attribute carries no parameter; another global is untraced
                memo[name.id] = set() if name.id in _BUILTINS or id(name) in bases else None
            else:
                found: set[str] | None = set()
                for source in sources:
                    got = _origins(source, scope, params, seen | {name.id}, memo)
                    if got is None:
                        found = None
                        break
                    found |= got
                memo[name.id] = found
        if memo[name.id] is None:
            return None
        out |= memo[name.id]
    return out


def bound_values(name: str, scope: ast.AST) -> list[ast.AST]:
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
    scope = scope_of(call, parents)
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
    return isinstance(expr, ast.Name) and expr.id not in params_of(scope) and not bound_values(expr.id, scope)


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
    """``expr`` is a literal (``""``, ``None``, ``-1.0``, ``[0, 0, 0, 0]``)."""
    try:
        ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def scope_of(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST | None:
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
    name, scope = statement.targets[0].id, scope_of(statement, parents)
    return scope is not None and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                     and _in_slice(n, parents) for n in ast.walk(scope))


def _in_slice(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """``node`` is (part of) a slice bound or an index: ``text[node + 8:]``."""
    while (parent := parents.get(id(node))) is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Slice) or (isinstance(parent, ast.Subscript) and parent.slice is node):
            return True
        node = parent
    return False


def whole_string(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """``node`` is a whole string, not a piece of an f-string or a ``+`` (``rf"<a>([{X}])"`` compiles only joined)."""
    return not isinstance(parents.get(id(node)), (ast.JoinedStr, ast.FormattedValue, ast.BinOp))


def places_of(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int] | None) -> list[ast.AST]:
    """Where the constant ``node`` is used: itself, or when it is bound to a name, that name's loads (those ``within``
    the nodes given, when given)."""
    if use_at(node, parents) is not None:
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
    uses = [use_at(place, parents) for place in places_of(node, tree, parents, within)]
    known = [u for u in uses if u is not None]
    if known and len(known) == len(uses):
        return max(known, key=_RANK.__getitem__)
    return None if shown_only else "regex"


def pattern_soft(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int] | None = None
                 ) -> bool:
    """Every test of the constant ``node`` leaves a completion without it a score (:func:`_soft_at`)."""
    tests = [p for p in places_of(node, tree, parents, within) if use_at(p, parents) in ("regex", "literal")]
    return bool(tests) and all(_soft_at(place, parents) for place in tests)


def read_use(node: ast.Constant, tree: ast.AST, parents: dict[int, ast.AST], within: set[int],
              checked: ast.AST | None, completion: set[str]) -> str | None:
    """:func:`pattern_use`, and where the checked function shows more: ``supplied`` for text the reward writes into
    the completion (``text = "<think>" + completion``), ``data`` for a test of the ground truth or another column
    (:func:`_tests_data`)."""
    shown = pattern_use(node, tree, parents, within, shown_only=True)
    if checked is None:
        return shown
    top, parent = _standing(node, parents)
    scope = scope_of(node, parents)
    roles = _roles(scope, checked, completion, parents)
    if roles is not None and _feeds_a_test(top, parent, parents, scope) and (
            (top is not node and _origins_in(top, scope, roles[0], any))
            or (isinstance(parent, ast.AugAssign) and isinstance(parent.target, ast.Name)
                and _origins_in(ast.Name(parent.target.id, ast.Load()), scope, roles[0], any))):
        return "supplied"  # ``text = "<think>" + completion``, ``text += "</answer>"``
    if shown == "text":
        return "data"  # a searched text that is not the completion
    cuts = [place for place in places_of(node, tree, parents, within) if use_at(place, parents) == "processing"]
    if shown == "processing" and cuts and any(_cut_fails(place, parents) for place in cuts):
        return "literal"  # the cut raises without the tag, and the handler scores that
    tests = [place for place in places_of(node, tree, parents, within) if use_at(place, parents) in ("regex", "literal")]
    if shown in ("regex", "literal") and tests and all(_tests_data(p, parents, checked, completion) for p in tests):
        return "data"  # ``re.search(r"<answer>(.*)</answer>", ground_truth)``: the data holds the tag
    return shown
