"""The ``vlforge`` command line: thin typer commands, each building its options and running one job.

Every command follows one convention (:mod:`vlforge.command`): options from the flags -> checks before work
(before torch loads) -> run -> report (tables, or with ``--json`` only JSON on stdout) -> exit code
(:class:`vlforge.errors.ExitCode`: 0 ok, 1 warnings, 2 bad input, 3 a failing verdict; every ``--help`` says
so). User errors print one line on stderr. ``python -m vlforge.train`` and ``python -m vlforge.extract`` (the
torchrun entry points) run these same commands.

Example (CPU, seconds):
    vlforge tiny qwen3_vl /tmp/tiny-qwen3-vl --seed 0
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from vlforge.collector import freeze_at_exit
from vlforge.errors import EXIT_CODES_HELP, ExitCode, VlforgeError
from vlforge.tables import report_console
from vlforge.versions import check_startup

app = typer.Typer(
    name="vlforge",
    help="Fast and correct Qwen-VL-family vision-language models: patch, diagnose, profile, verify, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)


def _setup_logging(verbose: bool) -> None:
    """Rich log lines in a terminal; plain, unwrapped ``LEVEL message`` lines in a log file or pipe. Under
    torchrun (``WORLD_SIZE`` > 1) each line names its rank and the other ranks than 0 log warnings only."""
    root = logging.getLogger("vlforge")
    if any(getattr(h, "_vlforge_cli", False) for h in root.handlers):
        return
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    prefix = f"[rank {rank}] " if world > 1 else ""
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(prefix + "%(levelname)-7s %(message)s"))
    handler._vlforge_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    level = logging.DEBUG if verbose else logging.INFO
    root.setLevel(level if rank == 0 else max(level, logging.WARNING))


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")] = False,
) -> None:
    _setup_logging(verbose)
    # Hugging Face's own progress bars ("Loading weights") would interleave with vlforge's log lines;
    # vlforge logs what it loads instead. HF_HUB_DISABLE_PROGRESS_BARS=0 brings them back.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if quiet:
        logging.getLogger("vlforge").setLevel(logging.WARNING)


def _run(job: Any, options: Any, *, as_json: bool = False) -> None:
    """The one convention (:mod:`vlforge.command`): checks before work, run, report, exit code."""
    from vlforge.command import execute

    raise typer.Exit(execute(job, options, as_json=as_json, console=report_console()))


def _build(cls: Any, **values: Any) -> Any:
    from vlforge.options import build_options

    return build_options(cls, **values)


def _list(text: str | None, flag: str, cast: Any = str) -> list[Any]:
    from vlforge.options import parse_list

    return parse_list(text, cast=cast, flag=flag)


def _validated(config: Path, overrides: list[str]) -> Any:
    """The config read and validated once (``vlforge validate``'s report), or one ``error:`` line per problem
    and exit 2."""
    from vlforge.config.validate import check

    report = check(config, overrides, model=False)  # each job checks its model after its output paths
    if not report.ok:
        for line in report.error_lines():
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT)
    return report.resolved


def _main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@app.command()
def tiny(
    family: Annotated[str, typer.Argument(help="Model family, e.g. qwen3_vl (see `vlforge tiny --list`).")] = "",
    out_dir: Annotated[Path | None, typer.Argument(help="Directory to write the checkpoint into.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    list_families: Annotated[bool, typer.Option("--list", help="List the families and exit.")] = False,
    untied: Annotated[bool, typer.Option("--untied", help="Separate lm_head instead of tied embeddings.")] = False,
) -> None:
    """Write a small random-initialised, loadable Hugging Face checkpoint of FAMILY into OUT_DIR."""
    from vlforge.models.tiny import JOB, TinyRequest

    _run(JOB, TinyRequest(family=family, out_dir=out_dir, seed=seed, untied=untied, list_families=list_families))


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(help="Time budget for the speed measurement.")] = 20.0,
) -> None:
    """Tiny Qwen3-VL through doctor, patch, profile, verify, speed, train and extract, measured here."""
    from vlforge.demo import JOB, DemoRequest

    _run(JOB, DemoRequest(seconds=seconds))


_ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Checkpoint dir, preset (tiny:qwen3_vl, real:qwen3_vl_2b) or hub id.")]
_SyntheticOpt = Annotated[str | None, typer.Option(help="Random frames FRAMESxHxW (e.g. 8x720x1280) through the "
                                                        "model's processor rules; default 1x224x224.")]
_ImageOpt = Annotated[list[Path] | None, typer.Option("--image", help="Image file(s), one prompt (repeatable).")]
_VideoOpt = Annotated[Path | None, typer.Option(help="Video file, decoded with PyAV, frames sampled uniformly.")]
_FramesOpt = Annotated[int, typer.Option(help="Frames sampled from --video.")]
_JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the JSON report on stdout.")]


@app.command()
def profile(
    model: _ModelOpt,
    synthetic: _SyntheticOpt = None,
    image: _ImageOpt = None,
    video: _VideoOpt = None,
    video_frames: _FramesOpt = 8,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes, e.g. 1,4,8.")] = "1",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    attn: Annotated[str, typer.Option(help="Comma-separated: sdpa,eager,flash_attention_2 (unavailable ones "
                                           "are skipped with a warning).")] = "sdpa",
    warmup: Annotated[int, typer.Option(help="Untimed forwards per configuration (the first counts FLOPs).")] = 1,
    repeats: Annotated[int, typer.Option(help="Timed iterations per configuration.")] = 3,
    compare: Annotated[str, typer.Option(help="Variants run in one process on the same weights: stock, patched, "
                                              "patched-fp32; e.g. stock,patched prints per-component ratios.")] = "stock",
    trace: Annotated[Path | None, typer.Option(help="Write a torch.profiler Chrome trace per run into DIR.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a bar chart PNG (needs vlforge[plot]).")] = None,
    per_block: Annotated[bool, typer.Option("--per-block/--summary", help="One row per block and layer.")] = True,
    as_json: _JsonOpt = False,
) -> None:
    """Time every component of a VLM through forward hooks: share, FLOPs, anomalies, stock vs patched."""
    from vlforge.profile.command import JOB
    from vlforge.profile.options import ProfileOptions

    _run(JOB, _build(
        ProfileOptions, model=model, synthetic=synthetic, images=image or [], video=video, video_frames=video_frames,
        batch_sizes=_list(batch_sizes, "--batch-sizes", int), dtype=dtype, device=device,
        attn=_list(attn, "--attn"), warmup=warmup, repeats=repeats, compare=_list(compare, "--compare"),
        trace_dir=trace, plot=plot, per_block=per_block,
    ), as_json=as_json)


@app.command()
def verify(
    model: _ModelOpt,
    synthetic: _SyntheticOpt = None,
    image: _ImageOpt = None,
    video: _VideoOpt = None,
    video_frames: _FramesOpt = 8,
    batch_size: Annotated[int, typer.Option(help="Copies of the input in the batch.")] = 1,
    dtype: Annotated[str, typer.Option(help="Dtype of the tower and end-to-end comparison.")] = "bfloat16",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, ...")] = "auto",
    attn: Annotated[str, typer.Option(help="Attention implementation.")] = "sdpa",
    precision: Annotated[str, typer.Option(help="Patched precision under test: native or fp32.")] = "native",
    generate: Annotated[int, typer.Option(help="Greedy tokens generated by both (0: skip).")] = 8,
    tower_reference: Annotated[bool, typer.Option(help="Tower error vs an fp64 (CPU) / fp32 (GPU) copy.")] = True,
    max_fp32_layer_diff: Annotated[float, typer.Option(help="Patch layer fp32 max abs diff must be below.")] = 1e-5,
    min_bf16_layer_cosine: Annotated[float, typer.Option(help="Patch layer bf16 cosine must exceed.")] = 0.999,
    min_tower_cosine: Annotated[float, typer.Option(help="Per-sample pooled tower cosine must exceed.")] = 0.99,
    max_kl: Annotated[float | None, typer.Option(help="Also fail when mean logits KL exceeds this.")] = None,
    min_top1: Annotated[float | None, typer.Option(help="Also fail when top-1 agreement is below this.")] = None,
    require_identical_generation: Annotated[bool, typer.Option(help="Also fail when generations differ.")] = False,
    as_json: _JsonOpt = False,
) -> None:
    """Prove the patched model computes the same outputs as the stock one; exit 3 naming any failed check."""
    from vlforge.verify.command import JOB
    from vlforge.verify.options import VerifyOptions

    _run(JOB, _build(
        VerifyOptions, model=model, synthetic=synthetic, images=image or [], video=video,
        video_frames=video_frames, batch_size=batch_size, dtype=dtype, device=device, attn=attn,
        precision=precision, generate_tokens=generate, tower_reference=tower_reference,
        max_fp32_layer_diff=max_fp32_layer_diff, min_bf16_layer_cosine=min_bf16_layer_cosine,
        min_tower_cosine=min_tower_cosine, max_kl=max_kl, min_top1=min_top1,
        require_identical_generation=require_identical_generation,
    ), as_json=as_json)


_ConfigArg = Annotated[Path, typer.Argument(help="Training config YAML: native, LMMS Engine or guide layout.")]


@app.command()
def validate(
    config: _ConfigArg,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides, e.g. training.learning_rate=1e-4.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
) -> None:
    """Check a training config: print it resolved (exit 0) or one line per problem (exit 2)."""
    from vlforge.config.validate import JOB, ValidateRun

    _run(JOB, ValidateRun(config, tuple(overrides or ())), as_json=as_json)


@app.command()
def train(
    config: _ConfigArg,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides, e.g. training.max_steps=10.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only a JSON summary on stdout.")] = False,
    token_audit: Annotated[bool, typer.Option("--token-audit/--no-token-audit", help="Audit the chat template's "
                                              "special tokens at start-up (model.token_audit).")] = True,
) -> None:
    """Train in this process (for several: torchrun ... -m vlforge.train CONFIG); export to OUTPUT_DIR/final."""
    from vlforge.train.command import JOB, TrainRun

    settings = [*(overrides or []), *([] if token_audit else ["model.token_audit=false"])]
    resolved = _validated(config, settings)  # read and validated once, before torch and the model load
    progress = not as_json and sys.stderr.isatty() and _main_rank()
    _run(JOB, TrainRun(resolved, progress=progress), as_json=as_json)


@app.command()
def plan(
    config: _ConfigArg,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides, e.g. packing.packing_length=8192.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs (processes) per node.")] = 1,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    gpu_memory: Annotated[str | None, typer.Option(help="Memory of one GPU, e.g. 80GB or 141GiB (default: this "
                                                        "machine's CUDA device, else 80GB).")] = None,
    seq_len: Annotated[int | None, typer.Option(min=1, help="Typical sample length in tokens (packing: "
                                                             "samples per row; padded: the batch's length).")] = None,
    label_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of tokens that are labels.")] = 0.5,
    visual_share: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Share of tokens that are visual "
                                                       "(default: one image or video at the limits per sample).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
) -> None:
    """Estimate peak memory per rank of a training config (meta device, no weights) and what makes it fit; exit 1
    when it does not fit."""
    from vlforge.plan.command import JOB, PlanRun
    from vlforge.plan.options import check_layout, parse_memory

    if gpu_memory is not None:  # flags first: a typo costs no config read
        parse_memory(gpu_memory)
    check_layout(gpus, nodes)
    _run(JOB, PlanRun(_validated(config, overrides or []), gpus=gpus, nodes=nodes, gpu_memory=gpu_memory,
                      seq_len=seq_len, label_share=label_share, visual_share=visual_share), as_json=as_json)


@app.command("export")
def export_command(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint directory (OUTPUT_DIR/checkpoint-STEP).")],
    out: Annotated[Path, typer.Argument(help="New Hugging Face directory to write.")],
    source: Annotated[str | None, typer.Option(help="Source model (default: the one the run trained).")] = None,
) -> None:
    """Write a training checkpoint as a Hugging Face directory (safetensors + config + processor files)."""
    from vlforge.train.export import JOB, ExportRequest

    _run(JOB, ExportRequest(checkpoint, out, source))


@app.command()
def doctor(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Checkpoint dir or preset (tiny:qwen3_vl, real:qwen3_vl_2b).")] = None,
    dtype: Annotated[str | None, typer.Option(help="Compute dtype of the run: float32, bf16, fp16.")] = None,
    assume: Annotated[str | None, typer.Option(help="What-if facts: torch=2.9.1,cudnn=91002,device=cuda,...")] = None,
    bench: Annotated[bool, typer.Option("--bench/--no-bench", help="Measure the patch convs here.")] = True,
    windows: Annotated[int | None, typer.Option(min=1, help="Windows per measured call (default: a 1024x1024 image).")] = None,
    bench_seconds: Annotated[float | None, typer.Option(min=0.0, help="Time budget of the measurement "
                                                         "[default: 5].")] = None,
    json_output: _JsonOpt = False,
    tokens: Annotated[bool, typer.Option("--tokens/--no-tokens", help="Audit untrained special tokens of the "
                                         "chat template (reads the checkpoint's embeddings, a few seconds).")] = True,
    fmt: Annotated[str | None, typer.Option("--format", help="Also audit a reward format's tags: r1.")] = None,
    reward_regex: Annotated[str | None, typer.Option(help="Also audit the literal tags of this reward regex.")] = None,
    tags: Annotated[list[str] | None, typer.Option("--tags", help="Also audit these tags (comma-separated).")] = None,
) -> None:
    """Diagnose this machine (and a model): facts, rules, measurement, fixes. Exit 0 ok, 1 warnings, 3 errors."""
    from vlforge.doctor.command import JOB, DoctorOptions

    _run(JOB, _build(DoctorOptions, model=model, dtype=dtype, assume=assume, bench=bench, windows=windows,
                     bench_seconds=bench_seconds, tokens=tokens, fmt=fmt, reward_regex=reward_regex,
                     tags=tags or []), as_json=json_output)


tokens_app = typer.Typer(help="Under-trained tokens: scan a vocabulary, audit template / reward-format tags, repair.",
                         no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")
_ListOpt = list[str] | None


@tokens_app.command("audit")
def tokens_audit(
    model: Annotated[Path | None, typer.Option("--model", "-m", help="Checkpoint dir (safetensors), tiny:FAMILY or hub id.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer directory (default: --model).")] = None,
    tags: Annotated[_ListOpt, typer.Option("--tags", help="Tags to generate, comma-separated, repeatable.")] = None,
    template: Annotated[Path | None, typer.Option(help="Chat template (jinja) file to probe.")] = None,
    model_template: Annotated[bool, typer.Option("--model-template", help="Probe the tokenizer's template "
                                                 "(default when no other source is given).")] = False,
    template_var: Annotated[_ListOpt, typer.Option(help="Template variable KEY=VALUE, e.g. enable_thinking=false.")] = None,
    reward_regex: Annotated[str | None, typer.Option(help="Reward regex; its literal tags must be generated.")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="Built-in format: r1 (<think>..</think><answer>..</answer>).")] = None,
    reference_ids: Annotated[_ListOpt, typer.Option(help="Extra known-unused ids for the reference set.")] = None,
    threshold: Annotated[_ListOpt, typer.Option(help="Override a threshold KEY=VALUE (see docs/tokens.md).")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Forward-pass repeat check of the tag ids.")] = False,
    verify_dtype: Annotated[str, typer.Option(help="dtype for --verify.")] = "float32",
    rewrite_out: Annotated[Path | None, typer.Option(help="Write the rewritten template / regex here.")] = None,
    json_output: _JsonOpt = False,
) -> None:
    """Audit tags: encoding, generated vs prefilled, weights verdicts. Exit 3 untrained, 1 weak, 0 fine (2: bad input)."""
    from vlforge.tokens.command import AUDIT, AuditRequest

    _run(AUDIT, _build(
        AuditRequest, model=model, tokenizer=tokenizer, tags=tags or [], template=template,
        model_template=model_template, template_vars=template_var or [], reward_regex=reward_regex, fmt=fmt,
        reference_ids=reference_ids or [], thresholds=threshold or [], verify=verify, verify_dtype=verify_dtype,
        rewrite_out=rewrite_out), as_json=json_output)


@tokens_app.command("scan")
def tokens_scan(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint dir (safetensors), tiny:FAMILY or hub id.")],
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer directory (default: --model).")] = None,
    top: Annotated[int | None, typer.Option(help="Report only the N highest-scoring flagged ids.")] = None,
    reference_ids: Annotated[_ListOpt, typer.Option(help="Extra known-unused ids for the reference set.")] = None,
    threshold: Annotated[_ListOpt, typer.Option(help="Override a threshold or cut KEY=VALUE (see docs/tokens.md).")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Repeat-prompt check of the flagged ids (causal LMs).")] = False,
    verify_dtype: Annotated[str, typer.Option(help="dtype for --verify.")] = "float32",
    verify_batch: Annotated[int, typer.Option(help="Prompts per forward pass for --verify.")] = 32,
    verify_max: Annotated[int, typer.Option(help="Verify at most this many flagged ids (highest score first).")] = 512,
    json_output: _JsonOpt = False,
) -> None:
    """Score every vocabulary id: untrained / weak / trained from the weights alone. Exit 0 (2: bad input)."""
    from vlforge.tokens.command import SCAN, ScanRequest

    _run(SCAN, _build(
        ScanRequest, model=model, tokenizer=tokenizer, top=top, reference_ids=reference_ids or [],
        thresholds=threshold or [], verify=verify, verify_dtype=verify_dtype, verify_batch=verify_batch,
        verify_max=verify_max), as_json=json_output)


@tokens_app.command("fix")
def tokens_fix(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint directory (safetensors).")],
    out: Annotated[Path, typer.Option(help="New checkpoint directory (must not exist or be empty).")],
    strategy: Annotated[str, typer.Option(help="mean-of-pieces or trained-mean.")] = "mean-of-pieces",
    ids: Annotated[_ListOpt, typer.Option("--ids", help="Ids to re-initialise, comma-separated.")] = None,
    tags: Annotated[_ListOpt, typer.Option("--tags", help="Re-initialise the untrained / weak ids of these tags.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the added noise.")] = 0,
    noise: Annotated[float, typer.Option(help="Noise std relative to the per-element row scale.")] = 0.02,
    trainable_rows: Annotated[Path | None, typer.Option(help="Write the changed ids (to unfreeze) as JSON.")] = None,
    json_output: _JsonOpt = False,
) -> None:
    """Write a copy of the checkpoint whose flagged embedding rows are re-initialised."""
    from vlforge.tokens.command import FIX, FixRequest

    _run(FIX, _build(FixRequest, model=model, out=out, strategy=strategy, ids=ids or [], tags=tags or [], seed=seed,
                     noise=noise, trainable_rows=trainable_rows), as_json=json_output)


@app.command()
def extract(
    model: _ModelOpt,
    data: Annotated[str, typer.Option(help="Dataset file (.jsonl/.json/.parquet/.arrow), dataset YAML or data config.")],
    out: Annotated[Path, typer.Option(help="Cache directory (created; resumed when it holds the same run).")],
    features: Annotated[str, typer.Option(help="Comma-separated: vision_tokens, vision_pooled, deepstack, "
                                               "hidden_mean, hidden_last.")] = "vision_pooled,hidden_mean",
    layers: Annotated[str, typer.Option(help="hidden_states indices for hidden_*: 0 embeddings, -1 last.")] = "-1",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    batch_size: Annotated[int, typer.Option(help="Samples per forward (fixed for a cache).")] = 8,
    shard_size: Annotated[int, typer.Option(help="Samples of the global order per shard.")] = 256,
    fmt: Annotated[str, typer.Option("--format", help="safetensors or parquet.")] = "safetensors",
    num_workers: Annotated[int, typer.Option(help="DataLoader workers preprocessing while the model runs.")] = 0,
    on_error: Annotated[str, typer.Option(help="skip (into errors.jsonl) or raise.")] = "skip",
    max_skip_fraction: Annotated[float, typer.Option(help="Exit 2 when more than this share of the samples is "
                                                          "skipped (0 none, 1 never).")] = 0.1,
    attn: Annotated[str | None, typer.Option(help="Attention implementation (default: the model's).")] = None,
    id_field: Annotated[str, typer.Option(help="Record key used as sample id when present ('' = never).")] = "id",
    weights_hash: Annotated[str, typer.Option(help="full (hash weight bytes) or header (headers + sizes).")] = "full",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, ...")] = "auto",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a cache of another model/options.")] = False,
    show_progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar (rank 0).")] = True,
    token_audit: Annotated[bool, typer.Option("--token-audit/--no-token-audit", help="Audit the chat template's "
                                              "special tokens at start-up (a few seconds).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON summary on stdout.")] = False,
) -> None:
    """Extract features into a sharded, resumable cache (works under torchrun; see docs/extract.md)."""
    from vlforge.extract.command import JOB, ExtractRun
    from vlforge.extract.options import ExtractOptions

    options = _build(
        ExtractOptions, model=model, data=data, out=out, features=_list(features, "--features"),
        layers=_list(layers, "--layers", int), dtype=dtype, batch_size=batch_size, shard_size=shard_size,
        format=fmt, num_workers=num_workers, on_error=on_error, max_skip_fraction=max_skip_fraction,
        attn_implementation=attn, id_field=id_field, weights_hash=weights_hash, device=device,
        overwrite=overwrite, token_audit=token_audit,
    )
    _run(JOB, ExtractRun(options, progress=show_progress and not as_json), as_json=as_json)


def _command() -> typer.core.TyperGroup:
    """``app`` as a click command whose ``--help`` shows boolean flags without a value type and the exit codes.

    typer 0.29 renders every flag as ``--verbose -v <bool>``, as if it took a value. Every option of every
    command and sub-command that is a flag gets an empty metavar, which hides the type; options that take a
    value keep theirs (``--windows <int range>``). Only this command object changes, never typer's classes.
    (typer 0.29 vendors click, so its options are recognised by ``is_flag``, not as ``click.Option``.)
    """
    def flagless(get_help_option):  # --help itself is made per context, when help is asked for
        def get(ctx):
            option = get_help_option(ctx)
            if option is not None:
                option.metavar = ""
            return option

        return get

    command = typer.main.get_command(app)
    pending = [command]
    while pending:
        current = pending.pop()
        current.epilog = EXIT_CODES_HELP  # defined once (vlforge.errors.ExitCode), shown in every --help
        for param in current.params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        current.get_help_option = flagless(current.get_help_option)
        pending.extend(getattr(current, "commands", {}).values())
    return command  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``argv``: the arguments after ``vlforge``, default ``sys.argv``): user errors
    become one line on stderr and their exit code (2). An older torch or transformers than vlforge supports
    (:mod:`vlforge.versions`) is such an error, for every command and for ``python -m vlforge.train``.

    The message is printed literally (escaped), so text such as ``pip install 'vlforge[plot]'`` is never
    read as rich markup.
    """
    freeze_at_exit()  # the interpreter's shutdown then skips walking the heap (~1.3 s with torch imported)
    try:
        check_startup()  # an older torch or transformers than supported: one line, before any of it is imported
        _command()(args=argv, prog_name="vlforge")
    except VlforgeError as error:
        console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
