"""Every flag is declared once, on its command's options model (issue 39, deliverable 6).

The click command of each line of ``vlforge.cli.COMMANDS`` is built the way ``vlforge`` builds it, and each of its
parameters is compared with the model field it comes from: the same name, help, default and requiredness, and
no field missing. A flag written by hand (a ``typer.Option`` in cli.py) or a model field the command line lost
fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlforge import cli, flags
from vlforge.cli import COMMANDS, Entry, Group, build_command


def _entries() -> list[tuple[str, Entry]]:
    out = []
    for name, entry in COMMANDS.items():
        if isinstance(entry, Group):
            out += [(f"{name} {sub}", e) for sub, e in entry.commands.items()]
        else:
            out.append((name, entry))
    return out


ENTRIES = dict(_entries())


def _cli_default(info) -> object:
    """What the command line shows as the default of a field (split lists as their text)."""
    default = flags._default(info)
    mark = flags.marker(info)
    if isinstance(mark, flags.Flag) and mark.split is not None:
        return flags._split_text(default)
    if isinstance(default, list):
        return default or None
    return default


@pytest.mark.parametrize("path", sorted(ENTRIES))
def test_each_flag_is_its_field(path: str) -> None:
    entry = ENTRIES[path]
    spec = cli._load(entry.target)
    command = build_command(path.split()[-1], entry)
    fields = flags.cli_fields(spec.flags)
    params = {p.name: p for p in command.params if p.name not in ("help",)}
    assert ("as_json" in params) == spec.json, path
    params.pop("as_json", None)
    assert set(params) == set(fields), (path, set(params) ^ set(fields))
    for name, param in params.items():
        info = fields[name]
        assert info.description, f"{path}: {name} has no docstring (its help)"
        assert param.help == info.description, (path, name)
        required = flags._default(info) is ...
        assert param.required == required, (path, name)
        if not required:
            assert param.default == _cli_default(info), (path, name, param.default)
        spelled = flags.flag_of(spec.flags, name)
        if param.param_type_name == "option":
            assert spelled in param.opts, (path, name, param.opts)
        else:
            assert spelled == name.upper(), (path, name)
    assert command.help == entry.summary


def test_cli_declares_no_flag_by_hand() -> None:
    source = Path(cli.__file__).read_text()
    assert "typer.Option(" not in source and "typer.Argument(" not in source


def test_the_root_flags_come_from_their_model() -> None:
    group = cli._command()
    names = {p.name for p in group.params if p.name != "help"}
    assert names == set(cli.RootFlags.model_fields)
    assert {p.name: p.help for p in group.params if p.name != "help"} == {
        name: info.description for name, info in cli.RootFlags.model_fields.items()}


def test_a_bad_value_names_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["profile", "--model", "tiny:qwen3_vl", "--batch-sizes", "1,x"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-sizes" in err[0] and "'x'" in err[0], err
    with pytest.raises(SystemExit) as stop:
        cli.main(["verify", "--model", "tiny:qwen3_vl", "--generate", "-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: --generate:"), err


def test_listing_the_commands_imports_none_of_them() -> None:
    probe = ("import sys\nfrom vlforge.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('vlforge.') and m.count('.') >= 2))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.strip().splitlines()[-1]
    for entry in ENTRIES.values():
        assert entry.target.split(":")[0] not in loaded, (entry.target, loaded)


def test_version_line_names_every_package() -> None:
    from vlforge.about import version_line, versions

    line = version_line()
    found = versions()
    assert line.startswith("vlforge ") and f"torch {found['torch']}" in line and "Python " in line
    assert found["transformers"] in line


def test_key_value_flags_read_booleans_as_python_and_hydra_write_them() -> None:
    """`--template-var enable_thinking=False` (Python's spelling, Hydra's too) is the boolean, never the truthy
    string 'False'; JSON values and plain text keep their meaning."""
    given = ["a=False", "b=TRUE", "c=false", "d=None", "e=null", "f=3", "g=[1, 2]", "h=False Start", "i='x'"]
    assert flags.key_values(given, "--template-var") == {
        "a": False, "b": True, "c": False, "d": "None", "e": None, "f": 3, "g": [1, 2], "h": "False Start", "i": "'x'"}
