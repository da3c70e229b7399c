"""Importing vlforge changes no process-wide state: environment, umask, working directory, torch settings,
logging configuration, warning filters, process groups.

Two checks: every module's import-time code (module and class bodies) holds no call that changes such
state, and a fresh interpreter that imports every vlforge module ends in the same state it started in,
once the third-party modules vlforge loads were imported first (their import-time effects are theirs).
The one deliberate exception is ``vlforge/__init__.py``'s import hook for transformers' processors
(``vlforge.models.compat.install_import_hook``, see docs/models.md).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vlforge"

#: dotted call prefixes that change process-wide state
STATEFUL = ("os.environ.update", "os.environ.setdefault", "os.environ.pop", "os.putenv", "os.umask", "os.chdir",
            "torch.set_", "torch.manual_seed", "torch.use_deterministic_algorithms", "torch.cuda.set_device",
            "torch.distributed.init_process_group", "dist.init_process_group", "warnings.filterwarnings",
            "warnings.simplefilter", "logging.basicConfig", "sys.setrecursionlimit", "sys.path.insert",
            "sys.path.append", "multiprocessing.set_start_method", "mp.set_start_method", "random.seed",
            "np.random.seed", "numpy.random.seed")
ALLOWED = {("__init__.py", "install_import_hook")}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


_BLOCKS = ("body", "orelse", "finalbody", "handlers")


def _main_guard(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and ast.unparse(stmt.test).replace("'", '"') == '__name__ == "__main__"'


def _import_time_nodes(body: list[ast.stmt]):
    """The nodes that run when the module is imported: module and class bodies, not function bodies or
    ``if __name__ == "__main__":`` blocks."""
    for stmt in body:
        if _main_guard(stmt):
            continue
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from stmt.decorator_list
            continue
        if not any(getattr(stmt, name, None) for name in _BLOCKS):
            yield stmt
            continue
        for name, value in ast.iter_fields(stmt):  # headers: an if's test, a with's items, a class's bases ...
            if name not in _BLOCKS:
                yield from (v for v in (value if isinstance(value, list) else [value]) if isinstance(v, ast.AST))
        for name in _BLOCKS:
            for block in getattr(stmt, name, None) or []:
                yield from _import_time_nodes(block.body if isinstance(block, ast.ExceptHandler) else [block])


def test_no_module_changes_process_state_at_import():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for top in _import_time_nodes(tree.body):
            for node in ast.walk(top):
                if isinstance(node, ast.Call):
                    name = _dotted(node.func)
                    if (path.name, name) in ALLOWED:
                        continue
                    if name.startswith(STATEFUL) or name == "install_import_hook":
                        found.append(f"{path.relative_to(SRC)}:{node.lineno}: {name}()")
                elif isinstance(node, ast.Assign | ast.AugAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        text = _dotted(target.value if isinstance(target, ast.Subscript) else target)
                        if text == "os.environ" or text.startswith(("torch.backends.", "sys.")):
                            found.append(f"{path.relative_to(SRC)}:{node.lineno}: assigns {text}")
    assert not found, found


_LIST = """
import importlib, json, pkgutil, sys, vlforge
for m in pkgutil.walk_packages(vlforge.__path__, "vlforge."):
    importlib.import_module(m.name)
print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] != "vlforge" and "__main__" not in n)))
"""

_COMPARE = """
import contextlib, importlib, json, logging, os, pkgutil, sys, warnings
for name in json.loads(sys.argv[1]):
    with contextlib.suppress(Exception):
        importlib.import_module(name)
import torch
def state():
    mask = os.umask(0o022)
    os.umask(mask)
    return {"env": dict(os.environ), "umask": mask, "cwd": os.getcwd(), "dtype": str(torch.get_default_dtype()),
            "threads": torch.get_num_threads(), "grad": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "matmul": torch.get_float32_matmul_precision(), "cudnn": torch.backends.cudnn.benchmark,
            "root_logging": [logging.getLogger().level, [repr(h) for h in logging.getLogger().handlers]],
            "warnings": [repr(f) for f in warnings.filters], "recursion": sys.getrecursionlimit(),
            "process_group": torch.distributed.is_available() and torch.distributed.is_initialized()}
before = state()
import vlforge
for m in pkgutil.walk_packages(vlforge.__path__, "vlforge."):
    importlib.import_module(m.name)
after = state()
env = {k: [before["env"].get(k), after["env"].get(k)] for k in {*before["env"], *after["env"]}
       if before["env"].get(k) != after["env"].get(k)}
print(json.dumps({"env": env, **{k: [before[k], after[k]] for k in before if k != "env" and before[k] != after[k]}},
                 default=str))
"""


def test_importing_every_module_leaves_the_process_as_it_was():
    run = [sys.executable, "-c"]
    third_party = subprocess.run([*run, _LIST], capture_output=True, text=True, check=True, timeout=300).stdout
    proc = subprocess.run([*run, _COMPARE, third_party.strip().splitlines()[-1]], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"env": {}}
