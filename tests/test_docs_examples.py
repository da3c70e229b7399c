"""The docs are tested: every shell example in README.md and docs/*.md runs, and the quoted figures are generated.

**Which blocks.** Fenced code blocks whose language is ``bash``, ``sh``, ``shell`` or ``console``. A
``bash`` block is split into commands: blank lines and ``# comment`` lines are dropped, a line ending
in ``\\`` continues on the next, trailing comments are left to bash. In a ``console`` block the ``$ ``
lines are the commands (with their ``\\`` continuation lines) and the other lines are the page's output.
An unlabelled fence that starts like a command (``vlforge``, ``torchrun``, ``$ ``, ...) is an error:
label it ``bash`` (run here) or ``text`` (a synopsis, never run).

**Markers**, an HTML comment on the line right before the fence:

- ``<!-- docs-test: skip (REASON) -->``: not run here; the reason is mandatory and is the skip reason
  pytest reports (``-rs``).
- ``<!-- docs-test: exit 2 -->``: every command of the block must exit 2 (the default is 0);
  ``<!-- docs-test: exit 1 0 0 2 2 -->`` gives one code per command, in order, and ``0|2`` accepts
  either (for a verdict that depends on a measurement of this machine).

**How a block runs** (``test_doc_block``, marked ``slow``; one test per block, id ``FILE:LINE``). Each
Markdown file gets one fresh temporary working directory holding copies of this checkout's
``examples/``, ``benchmarks/`` and ``tests/``, and ``ckpt`` (a tiny Qwen3-VL checkpoint: the pages write
``./ckpt`` for "your checkpoint"). The blocks of a file run there in page order, so a block may use what
an earlier block of the same page wrote (docs/train.md exports the checkpoint its training example
wrote); after a failure, the later blocks of that page are skipped. Each command runs in ``bash -o
pipefail -c`` with this environment's ``bin`` first on ``PATH`` (so ``vlforge`` is this checkout's),
``.venv/bin/python`` replaced by this interpreter and ``.venv/bin/X`` by the ``X`` beside it, and every
``/tmp/...`` path moved under the working directory's ``tmp/`` (runs never share state or see a stale
``/tmp/tiny-run``). It must exit with the expected code; a failure names the page, the line, the command
and the tail of its stderr. For a ``console`` block, every output line of the page must also show up in
the command's stdout + stderr by its stable head: the text before its first digit or ``...`` (for a
table row, each cell's), compared with whitespace collapsed, so timings may change but wording may not.

**Figures** (``benchmarks/readme_figures.py``): fast tests render every region from a small JSON
record written here (its numbers are made up and never leave this file) and check that replacing a
region keeps every other byte of the page, that a page without the markers is a clear error, that
``--check`` reports a difference, and that every region the script knows exists in the real pages.

Run: ``.venv/bin/python -m pytest -q tests/test_docs_examples.py -rs`` (the blocks take minutes: they
load tiny models, train 30 steps and extract features); ``-m "not slow"`` keeps the fast checks only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import warmstart

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
COPIED = ("examples", "benchmarks", "tests")  # what the pages' relative paths name
COMMAND_TIMEOUT_S = 900
STDERR_TAIL_LINES = 40

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_ANY_MARKER = re.compile(r"^\s*<!--\s*docs-test")
_LOOKS_LIKE_COMMAND = re.compile(r"^(\$ |vlforge\b|torchrun\b|python\b|\.venv/bin/|make\b|pip\b)")
_BOX = "┏┃┡│└├┗╇━┳┓┩┛┣┫╋┬┴┼─╭╮╰╯"


@dataclass(frozen=True)
class Command:
    text: str
    line: int  # 1-based line of the page where the command starts
    output: tuple[str, ...] = ()  # console blocks: the page's output lines after it


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str
    commands: tuple[Command, ...]
    skip: str | None = None
    exits: tuple[tuple[int, ...], ...] = field(default=())  # allowed codes per command (one entry: all)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def expected_exit(self, index: int) -> tuple[int, ...]:
        if not self.exits:
            return (0,)
        return self.exits[0] if len(self.exits) == 1 else self.exits[index]


def _split_shell(lines: list[tuple[int, str]], where: str, problems: list[str]) -> list[Command]:
    commands: list[Command] = []
    buf: list[str] = []
    start = 0
    for number, raw in lines:
        text = raw.rstrip()
        if not buf:
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            start = number
        buf.append(text)
        if not text.endswith("\\"):
            commands.append(Command("\n".join(buf), start))
            buf = []
    if buf:
        problems.append(f"{where}: the block ends inside a `\\` continuation")
    return commands


def _split_console(lines: list[tuple[int, str]], where: str, problems: list[str]) -> list[Command]:
    commands: list[tuple[list[str], int, list[str]]] = []
    continuing = False
    for number, raw in lines:
        text = raw.rstrip()
        if continuing:
            commands[-1][0].append(text)
        elif text.startswith("$ "):
            commands.append(([text[2:]], number, []))
        elif commands:
            commands[-1][2].append(text)
        elif text.strip():
            problems.append(f"{where}:{number}: console output before the first `$ ` command line")
        continuing = text.endswith("\\") and (continuing or text.startswith("$ "))
    return [Command("\n".join(cmd), number, tuple(out)) for cmd, number, out in commands]


def _parse_marker(body: str, where: str, problems: list[str]) -> tuple[str | None, tuple[tuple[int, ...], ...]]:
    skip = re.fullmatch(r"skip\s*\((?P<reason>.*)\)", body)
    if skip:
        reason = skip["reason"].strip()
        if not reason:
            problems.append(f"{where}: `docs-test: skip` needs a reason, e.g. `skip (needs a GPU)`")
        return reason or None, ()
    if body == "skip":
        problems.append(f"{where}: `docs-test: skip` needs a reason in parentheses, e.g. `skip (needs a GPU)`")
        return None, ()
    exits = re.fullmatch(r"exit((?:[\s,]+\d+(?:\|\d+)*)+)", body)
    if exits:
        return None, tuple(tuple(int(code) for code in item.split("|")) for item in re.findall(r"[\d|]+", exits[1]))
    problems.append(f"{where}: unknown marker `docs-test: {body}` (use `skip (REASON)` or `exit N [N|M ...]`)")
    return None, ()


def parse_page(text: str, page: str) -> tuple[list[Block], list[str]]:
    """The shell blocks of one Markdown page, and every problem with its markers and fences."""
    blocks: list[Block] = []
    problems: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            if _ANY_MARKER.search(lines[index]):
                following = lines[index + 1] if index + 1 < len(lines) else ""
                match = _FENCE.match(following)
                if not _MARKER.match(lines[index]) or not match or match["lang"] not in SHELL_LANGUAGES:
                    problems.append(f"{page}:{index + 1}: a `docs-test:` marker must be a whole line of its own, "
                                    "right before a ```bash / sh / shell / console fence")
            index += 1
            continue
        fence, indent, language = opening["fence"], len(opening["indent"]), opening["lang"].lower()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[tuple[int, str]] = []
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            body.append((end + 1, lines[end][indent:] if not lines[end][:indent].strip() else lines[end].lstrip()))
            end += 1
        where = f"{page}:{index + 1}"
        if end >= len(lines):
            problems.append(f"{where}: the fence is never closed")
        first = next((text for _, text in body if text.strip()), "")
        if not language and _LOOKS_LIKE_COMMAND.match(first):
            problems.append(f"{where}: an unlabelled fence holds a command ({first.strip()[:60]!r}); label it "
                            "```bash to have it run by this test, or ```text for a synopsis that is never run")
        if language in SHELL_LANGUAGES:
            marker = _MARKER.match(lines[index - 1]) if index else None
            skip, exits = _parse_marker(marker["body"], f"{page}:{index}", problems) if marker else (None, ())
            split = _split_console if language == "console" else _split_shell
            commands = tuple(split(body, where, problems))
            if not commands:
                problems.append(f"{where}: a ```{language} block without a command")
            if len(exits) > 1 and len(exits) != len(commands):
                problems.append(f"{where}: `docs-test: exit` lists {len(exits)} codes for {len(commands)} commands")
            for command in commands:
                if "<<" in command.text:
                    problems.append(f"{page}:{command.line}: here-documents are not supported by this test")
            blocks.append(Block(page, index + 1, language, commands, skip, exits))
        index = end + 1
    return blocks, problems


def collect() -> tuple[list[Block], list[str]]:
    blocks, problems = [], []
    for path in PAGES:
        found, wrong = parse_page(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
        blocks += found
        problems += wrong
    return blocks, problems


BLOCKS, PROBLEMS = collect()


# --------------------------------------------------------------------------- fast checks of the pages


def test_markers_and_fences_are_well_formed():
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_pages_have_shell_examples_and_some_run():
    assert len(BLOCKS) >= 10
    assert sum(block.skip is None for block in BLOCKS) >= 8
    assert all(block.skip for block in BLOCKS if any(c.text.startswith("torchrun") for c in block.commands))


def test_parser_splits_commands_markers_and_console_output():
    page = "\n".join([
        "Intro.",
        "",
        "<!-- docs-test: exit 0 1|2 -->",
        "```bash",
        "# a comment line",
        "vlforge validate a.yaml \\",
        "    key=1   # trailing comment",
        "",
        "vlforge validate b.yaml",
        "```",
        "<!-- docs-test: skip (needs a GPU) -->",
        "```sh",
        "vlforge profile --device cuda",
        "```",
        "```console",
        "$ vlforge doctor \\",
        "    --json",
        "{\"verdict\": \"ok\"}",
        "...",
        "```",
        "```text",
        "vlforge train CONFIG",
        "```",
        "```",
        "vlforge train run.yaml",
        "```",
    ])
    blocks, problems = parse_page(page, "x.md")
    assert [(b.line, b.language, b.skip, b.exits) for b in blocks] == [
        (4, "bash", None, ((0,), (1, 2))), (12, "sh", "needs a GPU", ()), (15, "console", None, ())]
    assert blocks[0].commands == (Command("vlforge validate a.yaml \\\n    key=1   # trailing comment", 6),
                                  Command("vlforge validate b.yaml", 9))
    assert [blocks[0].expected_exit(i) for i in range(2)] == [(0,), (1, 2)]
    assert blocks[1].expected_exit(0) == (0,)
    assert blocks[2].commands == (Command("vlforge doctor \\\n    --json", 16, ('{"verdict": "ok"}', "...")),)
    assert problems == ["x.md:24: an unlabelled fence holds a command ('vlforge train run.yaml'); label it ```bash "
                        "to have it run by this test, or ```text for a synopsis that is never run"]


@pytest.mark.parametrize(("marker", "message"), [
    ("<!-- docs-test: skip -->", "needs a reason"),
    ("<!-- docs-test: skip () -->", "needs a reason"),
    ("<!-- docs-test: exit 1 2 -->", "lists 2 codes for 1 commands"),
    ("<!-- docs-test: maybe -->", "unknown marker"),
])
def test_parser_rejects_bad_markers(marker: str, message: str):
    _, problems = parse_page(f"{marker}\n```bash\nvlforge doctor\n```\n", "x.md")
    assert len(problems) == 1 and message in problems[0], problems


def test_parser_rejects_a_marker_away_from_a_shell_fence():
    _, problems = parse_page("<!-- docs-test: skip (gpu) -->\n\n```bash\nvlforge doctor\n```\n", "x.md")
    assert problems and "right before a ```bash" in problems[0]
    _, problems = parse_page("<!-- docs-test: skip (gpu) -->\n```python\nimport vlforge\n```\n", "x.md")
    assert problems and "right before a ```bash" in problems[0]


# --------------------------------------------------------------------------- running the blocks


def _head(text: str) -> str:
    """The part of an output line that does not depend on the run: before its first digit or '...'."""
    cut = re.split(r"\d|\.\.\.|…", text, maxsplit=1)[0]
    return " ".join(cut.split())


def expected_fragments(output: tuple[str, ...]) -> list[str]:
    fragments = []
    for line in output:
        stripped = line.strip()
        if not stripped or stripped == "...":
            continue
        if stripped[0] in _BOX:
            cells = re.split(r"[│┃]", stripped)[1:-1] if re.search(r"[│┃]", stripped) else []
            heads = [_head(cell) for cell in cells]
        else:
            heads = [_head(stripped)]
        fragments += [head for head in heads if len(head) >= 4]
    return fragments


def test_console_fragments_ignore_numbers_and_borders():
    output = ("...", "┏━━━┳━━┓", "│ patch_layer.fp32_max_abs_diff │ 1.3e-06 │ FAIL   │",
              "verdict: FAIL: x = 1.3e-06", "end to end (69 positions): ...")
    assert expected_fragments(output) == ["patch_layer.fp", "FAIL", "verdict: FAIL: x =", "end to end ("]


def _shell_text(command: str, workdir: Path, tools: Path | None = None) -> str:
    """The command as run here: this environment's tools, /tmp moved under the working directory. ``tools``:
    a folder whose ``python`` / ``vlforge`` / ``torchrun`` stand in for ``.venv/bin``'s (the warm start)."""
    bin_dir = Path(sys.executable).parent
    python = tools / "python" if tools else Path(sys.executable)
    # /tmp first: this checkout's own tools may live under /tmp (a fresh clone there) and must stay put.
    text = re.sub(r"(?<![\w./-])/tmp/", str(workdir / "tmp") + "/", command)
    text = re.sub(r"(?<![\w./-])\.venv/bin/python(?![\w.])", shlex.quote(str(python)), text)

    def tool(match: re.Match) -> str:
        name = match["name"]
        folder = tools if tools and (tools / name).exists() else bin_dir
        return shlex.quote(str(folder / name))

    return re.sub(r"(?<![\w./-])\.venv/bin/(?P<name>[\w.-]+)", tool, text)


def test_commands_are_mapped_to_this_environment(tmp_path: Path):
    text = _shell_text(".venv/bin/python x.py --out /tmp/a && .venv/bin/vlforge tiny a b", tmp_path)
    assert text == (f"{shlex.quote(sys.executable)} x.py --out {tmp_path}/tmp/a && "
                    f"{shlex.quote(str(Path(sys.executable).parent))}/vlforge tiny a b")
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "vlforge").touch()
    text = _shell_text(".venv/bin/python x.py && .venv/bin/vlforge tiny && .venv/bin/ruff check", tmp_path,
                       tmp_path / "warm")
    assert text == (f"{tmp_path}/warm/python x.py && {tmp_path}/warm/vlforge tiny && "
                    f"{shlex.quote(str(Path(sys.executable).parent))}/ruff check")


_FAILED_PAGES: dict[str, str] = {}


@pytest.fixture(scope="module")
def page_workdir(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint):
    """``page -> Path``: one working directory per page, made when its first block runs."""
    made: dict[str, Path] = {}

    def get(page: str) -> Path:
        if page not in made:
            root = tmp_path_factory.mktemp(re.sub(r"\W+", "-", page))
            for name in COPIED:
                shutil.copytree(REPO / name, root / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
            (root / "ckpt").symlink_to(tiny_checkpoint("qwen3_vl"), target_is_directory=True)
            (root / "tmp").mkdir()
            made[page] = root
        return made[page]

    return get


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-STDERR_TAIL_LINES:]) or "(empty)"


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_doc_block(block: Block, page_workdir):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    if block.page in _FAILED_PAGES:
        pytest.skip(f"{block.id}: an earlier block of {block.page} failed ({_FAILED_PAGES[block.page]})")
    workdir = page_workdir(block.page)
    tools = warmstart.tools()
    path = os.pathsep.join([*([str(tools.bin)] if tools else []), str(Path(sys.executable).parent),
                            os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    _FAILED_PAGES[block.page] = block.id  # cleared below when every command passed
    for index, command in enumerate(block.commands):
        where = f"{block.page}:{command.line}"
        expected = block.expected_exit(index)
        try:
            proc = subprocess.run(["bash", "-o", "pipefail", "-c",
                                   _shell_text(command.text, workdir, tools.bin if tools else None)],
                                  cwd=workdir, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired as error:
            pytest.fail(f"{where}: `{command.text}` ran past {COMMAND_TIMEOUT_S} s (in {workdir})\n"
                        f"--- stderr (tail) ---\n{_tail(error.stderr or '')}", pytrace=False)
        if proc.returncode not in expected:
            pytest.fail(f"{where}: `{command.text}` exited {proc.returncode}, the page expects "
                        f"{' or '.join(map(str, expected))} "
                        f"(block {block.id}, run in {workdir})\n--- stderr (tail) ---\n{_tail(proc.stderr)}"
                        + ("" if proc.stderr.strip() else f"\n--- stdout (tail) ---\n{_tail(proc.stdout)}"),
                        pytrace=False)
        seen = " ".join(f"{proc.stdout}\n{proc.stderr}".split())
        missing = [fragment for fragment in expected_fragments(command.output) if fragment not in seen]
        if missing:
            pytest.fail(f"{where}: `{command.text}` printed no line starting like the page's "
                        f"{missing[0]!r} ({len(missing)} of the page's output lines missing: {missing})\n"
                        f"--- stdout (tail) ---\n{_tail(proc.stdout)}\n--- stderr (tail) ---\n{_tail(proc.stderr)}",
                        pytrace=False)
    del _FAILED_PAGES[block.page]


# --------------------------------------------------------------------------- benchmarks/readme_figures.py


def _figures_module():
    spec = importlib.util.spec_from_file_location("readme_figures", REPO / "benchmarks" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("readme_figures", module)
    spec.loader.exec_module(module)
    return module


FIGURES = _figures_module()

# Made-up numbers: only for testing the renderer, never written into a page.
_MACHINE = {"cpu_model": "Test CPU 9000", "logical_cpus": 4, "torch": "9.9.9+cpu", "torch_threads": 4,
            "python": "3.99.0", "platform": "TestOS"}


def _entry(command: str, result: dict, wall_s: float = 12.3) -> dict:
    return {"command": command, "machine": _MACHINE, "utc_start": "2030-01-02T03:04:05+00:00",
            "utc_end": "2030-01-02T03:09:05+00:00", "load_average_before": [0.5, 0.4, 0.3],
            "load_average_after": [2.5, 1.0, 0.5], "wall_s": wall_s, "result": result}


def _timing(median: float, minimum: float) -> dict:
    return {"median_ms": median, "min_ms": minimum, "runs_ms": [minimum, median]}


def _patch_case(conv: float, patched: float, linear: float) -> dict:
    return {"conv3d": _timing(conv, conv - 1), "patched": _timing(patched, patched - 1),
            "linear": _timing(linear, linear - 1), "speedup_patched_vs_conv3d": round(conv / patched, 3),
            "speedup_linear_vs_conv3d": round(conv / linear, 3), "patched_over_linear": round(patched / linear, 3)}


def _throughput_run(steps: int, eff: float, tps: float, first: float, last: float) -> dict:
    return {"steps": steps, "seconds": 1.0, "real_tokens": 100, "computed_tokens": 100, "tokens_per_s": tps,
            "padding_efficiency": eff, "first_loss": first, "last_loss": last}


def figures_record() -> dict:
    patch = {"benchmark": "patch_embed", "repeats": 9, "warmup": 2, "machine": {"torch_threads": 4},
             "results": {"fp32": {"max_abs_diff_vs_conv3d": {"patched": 5e-06, "linear": 5e-06},
                                  "forward": _patch_case(500.0, 50.0, 55.0),
                                  "forward_backward": _patch_case(1500.0, 150.0, 150.0)},
                         "bf16": {"max_abs_diff_vs_conv3d": {"patched": 0.0078, "linear": 0.0078},
                                  "forward": _patch_case(200.0, 100.0, 100.0),
                                  "forward_backward": _patch_case(1000.0, 250.0, 250.0)}},
             "targets": {"fp32_forward_speedup_vs_conv3d": 10.0, "fp32_forward_at_least_4x_faster_than_conv3d": True,
                         "fp32_forward_patched_over_linear": 0.909, "fp32_forward_within_10pct_of_linear": True}}
    throughput = {"benchmark": "train_throughput", "machine": {"threads": 4},
                  "hf_trainer": {"transformers": "9.1", "optim": "adamw_torch_fused"},
                  "settings": {"batch_size": 4, "packing_length": 300, "lr": 0.001},
                  "results": {"hf_trainer": _throughput_run(12, 0.6, 50.0, 11.5, 10.4),
                              "plain_padded_loop": _throughput_run(12, 0.6, 45.0, 11.5, 10.4001),
                              "vlforge_padded": _throughput_run(12, 0.6, 80.0, 11.5, 10.4001),
                              "vlforge_packed": _throughput_run(13, 1.0, 100.0, 11.2, 10.1)},
                  "speedup_vs_hf_trainer": {"hf_trainer": 1.0, "plain_padded_loop": 0.9, "vlforge_padded": 1.6,
                                            "vlforge_packed": 2.0},
                  "speedup_from_packing_alone": 1.25, "target": {"vlforge_packed_vs_hf_trainer": 1.3, "met": True}}
    extract = {"benchmark": "extract", "images": 64, "image_size": 448, "batch_size": 16, "num_workers": 1,
               "results": {"plain_loop": {"samples_per_s": 10.0}, "plain_loop_backbone": {"samples_per_s": 40.0},
                           "vlforge_extract": {"samples_per_s": 50.0}},
               "speedup_vs_plain_loop": 5.0, "speedup_vs_plain_loop_backbone": 1.25,
               "max_abs_diff_hidden_mean_vs_plain": 1e-06, "machine": {"torch_threads": 1}}
    train = {"output_dir": "/x", "steps": 30, "losses": [11.111, 10.0, 9.5, 9.0, 8.5, 8.004],
             "eval_losses": [], "checkpoint": "/x/checkpoint-30", "export_dir": "/x/final", "resumed_from": None}
    return {"schema": FIGURES.SCHEMA, "figures": {
        "patch_embed": _entry(".venv/bin/python benchmarks/patch_embed.py --repeats 9", patch),
        "train_throughput": _entry(".venv/bin/python benchmarks/train_throughput.py", throughput),
        "train_throughput_qwen3_5": _entry(".venv/bin/python benchmarks/train_throughput.py --model tiny:qwen3_5",
                                           throughput),
        "extract": _entry(".venv/bin/python benchmarks/extract.py", extract),
        "tiny_train": _entry("vlforge train examples/qwen3_vl_tiny.yaml --json", train, wall_s=41.6)}}


def _outside_regions(text: str) -> list[str]:
    return re.split(r"<!-- figures:\w+:start -->\n.*?<!-- figures:\w+:end -->", text, flags=re.DOTALL)


def test_figures_regions_exist_in_the_pages():
    for region in FIGURES.REGIONS:
        FIGURES.find_region((REPO / region.file).read_text(encoding="utf-8"), region.name, region.file)
    assert {region.name for region in FIGURES.REGIONS} == set(FIGURES.MEASUREMENTS) | set(FIGURES.RECORDS)


def test_figures_render_from_json_and_keep_the_rest_of_the_page():
    rendered = {(region.file, region.name): body for region, body in FIGURES.render_all(figures_record())}
    assert len(rendered) == len(FIGURES.REGIONS)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    new = readme
    for (file, name), body in rendered.items():
        if file == "README.md":
            new = FIGURES.replace_region(new, name, body, file)
    assert _outside_regions(new) == _outside_regions(readme)  # every byte outside the regions kept
    assert new.count("<!-- figures:") == readme.count("<!-- figures:")
    patch = FIGURES.region_body(new, "patch_embed")
    assert "| fp32 forward | 500.0 | 50.0 | 55.0 | **10.0x** | **0.91** |" in patch
    assert "| bf16 forward+backward | 1000.0 | 250.0 | 250.0 | 4.0x | 1.00 |" in patch
    assert ("Median of 9 runs after 2 warm-ups, measured on Test CPU 9000 (4 logical CPUs, 4 torch threads), "
            "torch 9.9.9+cpu, 2030-01-02 03:04 UTC, quiet: 1-minute load average 0.5 before the run, 2.5 after; "
            "`.venv/bin/python benchmarks/patch_embed.py --repeats 9`:") in patch
    throughput = FIGURES.region_body(new, "train_throughput")
    assert "| vlforge, packed rows of 300 tokens | 1.00 | 100.0 | **2.00x** |" in throughput
    assert "gave 1.25x in that run, below the 1.3x" in throughput
    assert "`vlforge extract` ran at 50.0 samples/s: **5.0x** the seed's per-sample loop (10.0)" in \
        FIGURES.region_body(new, "extract")
    assert FIGURES.replace_region(new, "extract", FIGURES.region_body(new, "extract")) == new  # idempotent
    assert rendered[("docs/train.md", "tiny_train")].startswith(
        "Example on CPU (42 s from start to exit on 4 logical CPUs; loss 11.11 -> 8.00 over 30 steps, the means of "
        "the first and of the last 5 steps; measured on Test CPU 9000")
    detail = rendered[("docs/train.md", "train_throughput")]
    assert "| vlforge, packed rows of 300 tokens | 13 | 1.00 | 100.0 | **2.00x** (target 1.3x: met) |" in detail
    assert "log the same losses on the same batches (first 11.5000 / 11.5000 / 11.5000" in detail
    assert "| fp32 | forward | 500.0 (499.0) | 50.0 (49.0) | 55.0 (54.0) | 10.00x | 0.909 |" in \
        rendered[("docs/patch.md", "patch_embed")]


def test_figures_without_markers_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(FIGURES.FiguresError, match=r"no `<!-- figures:patch_embed:start -->` line"):
        FIGURES.replace_region("# A page\n\nNo markers here.\n", "patch_embed", "body", "README.md")
    with pytest.raises(FIGURES.FiguresError, match="appears 2 times"):
        FIGURES.find_region("<!-- figures:a:start -->\n<!-- figures:a:start -->\n<!-- figures:a:end -->\n", "a")
    with pytest.raises(FIGURES.FiguresError, match="comes before"):
        FIGURES.find_region("<!-- figures:a:end -->\n<!-- figures:a:start -->\n", "a")
    (tmp_path / "README.md").write_text("# vlforge\n\nNo figures here.\n", encoding="utf-8")
    record = tmp_path / "figures.json"
    record.write_text(json.dumps(figures_record()), encoding="utf-8")
    assert FIGURES.main(["--from-json", str(record), "--root", str(tmp_path), "--only", "patch_embed"]) == 2
    err = capsys.readouterr().err
    assert "README.md: no `<!-- figures:patch_embed:start -->` line" in err
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "# vlforge\n\nNo figures here.\n"


def test_figures_check_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "docs").mkdir()
    files = ["README.md", *sorted({region.file for region in FIGURES.REGIONS} - {"README.md"})]
    for file in files:
        shutil.copyfile(REPO / file, tmp_path / file)
    record = tmp_path / "figures.json"
    record.write_text(json.dumps(figures_record()), encoding="utf-8")
    before = {file: (tmp_path / file).read_text(encoding="utf-8") for file in files}
    assert FIGURES.main(["--from-json", str(record), "--root", str(tmp_path), "--check"]) == 1
    assert "region(s) differ from the JSON" in capsys.readouterr().err
    assert {file: (tmp_path / file).read_text(encoding="utf-8") for file in files} == before  # --check writes nothing
    assert FIGURES.main(["--from-json", str(record), "--root", str(tmp_path)]) == 0
    for file in files:
        after = (tmp_path / file).read_text(encoding="utf-8")
        assert _outside_regions(after) == _outside_regions(before[file]), file
    assert "Test CPU 9000" in (tmp_path / "README.md").read_text(encoding="utf-8")
    assert FIGURES.main(["--from-json", str(record), "--root", str(tmp_path), "--check"]) == 0
    missing = {"schema": FIGURES.SCHEMA, "figures": {}}
    record.write_text(json.dumps(missing), encoding="utf-8")
    assert FIGURES.main(["--from-json", str(record), "--root", str(tmp_path), "--only", "extract"]) == 2
    assert "the JSON has no measurement extract" in capsys.readouterr().err


def test_quoted_figures_match_the_committed_measurement(capsys: pytest.CaptureFixture[str]):
    """Every figure region of README.md and docs/ is what benchmarks/figures.json renders: no hand edits."""
    assert FIGURES.main(["--from-json", str(REPO / "benchmarks" / "figures.json"), "--root", str(REPO),
                         "--check"]) == 0, capsys.readouterr().err
