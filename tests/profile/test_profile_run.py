"""run_profile and the ``vlforge profile`` command on a tiny Qwen3-VL: components, shares, FLOPs, compare, JSON."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.errors import ConfigError, VlforgeError
from vlforge.options import parse_list
from vlforge.patches import patched_modules
from vlforge.profile import ProfileOptions, ProfileReport, compare_table, plot, render, run_profile, run_table
from vlforge.strict import build_options

SYNTHETIC = "2x64x64"


@pytest.fixture(scope="module")
def compared(loaded_tiny):
    loaded = loaded_tiny("qwen3_vl")
    options = ProfileOptions(model="unused", synthetic=SYNTHETIC, compare=["stock", "patched"], repeats=2,
                             warmup=1, attn=["sdpa", "flash_attention_2"])
    return loaded, run_profile(options, loaded=loaded)


def test_every_component_has_positive_time_and_shares_sum_to_100(compared):
    loaded, report = compared
    model = loaded.model
    run = report.run("stock")
    by_name = {c.name: c for c in run.components}
    vision = model.config.vision_config
    expected = ["model.other", "vision.other", "vision.patch_embed", "vision.pos_embed", "vision.rotary_embed",
                "vision.merger", "text.other", "text.embed_tokens", "text.norm", "text.rotary_embed", "lm_head"]
    expected += [f"vision.block.{i}" for i in range(vision.depth)]
    expected += [f"vision.deepstack_merger.{i}" for i in range(len(vision.deepstack_visual_indexes))]
    expected += [f"text.layer.{i}" for i in range(model.config.text_config.num_hidden_layers)]
    for name in expected:
        assert by_name[name].calls >= 1, name
        assert by_name[name].time.median_ms > 0, name
        assert by_name[name].inclusive_ms >= by_name[name].time.median_ms - 1e-9, name
    assert sum(c.share_pct for c in run.components) == pytest.approx(100.0, abs=1e-6)
    assert sum(c.flop_share_pct for c in run.components) == pytest.approx(100.0, abs=1e-6)
    assert run.processor.median_ms > 0 and run.host_to_device.median_ms >= 0
    assert run.forward.median_ms > 0
    blocks = next(t for t in run.totals if t.name == "vision.blocks")
    assert blocks.members == vision.depth
    assert blocks.share_pct == pytest.approx(sum(by_name[f"vision.block.{i}"].share_pct for i in range(vision.depth)))
    # the anomaly list is exactly the flagged rows, worst excess first
    flagged = [c for c in run.components if c.anomaly]
    assert sorted(run.anomalies) == sorted(c.name for c in flagged)
    excess = [by_name[n].share_pct - by_name[n].flop_share_pct for n in run.anomalies]
    assert excess == sorted(excess, reverse=True)


def test_flops_match_the_analytic_shapes(compared):
    loaded, report = compared
    config = loaded.model.config
    vision, text = config.vision_config, config.text_config
    run = report.run("stock")
    by_name = {c.name: c for c in run.components}
    rows, window = report.pixel_values_shape
    # conv patch embedding: 2 * K * O * windows, one window per pixel_values row
    assert by_name["vision.patch_embed"].flops == 2 * window * vision.hidden_size * rows
    # lm_head over every position of the prompt
    assert by_name["lm_head"].flops == 2 * report.sequence_length * text.hidden_size * text.vocab_size
    assert by_name["vision.rotary_embed"].flops == 0 and by_name["text.embed_tokens"].flops == 0
    assert by_name["vision.block.0"].flops > 0 and by_name["text.layer.0"].flops > 0
    assert by_name["vision.patch_embed"].gflops_per_s > 0
    # the GEMM path does the same arithmetic
    patched = {c.name: c for c in report.run("patched").components}
    assert patched["vision.patch_embed"].flops == by_name["vision.patch_embed"].flops


def test_compare_reports_per_component_ratios_and_restores_the_model(compared):
    loaded, report = compared
    assert [r.variant for r in report.runs] == ["stock", "patched"]
    assert report.skipped_attn == {"flash_attention_2": "flash_attention_2 needs a CUDA device"}
    comparison = report.comparisons[0]
    assert (comparison.baseline, comparison.candidate) == ("stock", "patched")
    row = next(r for r in comparison.rows if r.name == "vision.patch_embed")
    stock = report.run("stock").components
    patched = report.run("patched").components
    assert row.baseline_ms == next(c.time.median_ms for c in stock if c.name == "vision.patch_embed")
    assert row.candidate_ms == next(c.time.median_ms for c in patched if c.name == "vision.patch_embed")
    assert row.ratio == pytest.approx(row.baseline_ms / row.candidate_ms)
    assert {r.name for r in comparison.rows} >= {"vision.blocks", "vision", "text", "lm_head"}
    assert patched_modules(loaded.model) == []  # stock again after the run
    console = Console(record=True, width=160)
    render(report, console, per_block=False)
    text = console.export_text()
    assert "stock vs patched" in text and "│ vision.patch_embed" in text and "│ Σ vision.blocks" in text
    compact = Console(record=True, width=160)
    compact.print(compare_table(comparison, per_block=False))
    assert "│ vision.block.0 " not in compact.export_text()
    # the summary view hides blocks unless they are flagged
    compact.print(run_table(report, report.run("stock"), per_block=False))
    shown = compact.export_text()
    for component in report.run("stock").components:
        if component.kind == "block":
            assert (f"│ {component.name} " in shown) == component.anomaly


def test_cli_json_trace_and_plot(tiny_checkpoint, tmp_path):
    pytest.importorskip("matplotlib")
    path = tiny_checkpoint("qwen3_vl")
    result = CliRunner().invoke(app, [
        "profile", "--model", str(path), "--synthetic", "1x32x32", "--repeats", "1", "--warmup", "0",
        "--compare", "stock,patched", "--attn", "eager", "--trace", str(tmp_path / "traces"),
        "--plot", str(tmp_path / "profile.png"), "--json",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    report = ProfileReport.model_validate(data)
    assert [(r.variant, r.batch_size, r.attn) for r in report.runs] == [("stock", 1, "eager"), ("patched", 1, "eager")]
    assert report.warmup == 0 and report.repeats == 1 and len(report.comparisons) == 1
    for run in report.runs:
        trace = json.loads(Path(run.trace).read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "vlforge::vision.patch_embed" in names and "vlforge::lm_head" in names
    png = (tmp_path / "profile.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert math.isfinite(report.comparisons[0].forward_ratio)


def test_batch_sizes_scale_the_work(loaded_tiny):
    report = run_profile(ProfileOptions(model="unused", synthetic="1x32x32", batch_sizes=[1, 3], repeats=1,
                                        warmup=0), loaded=loaded_tiny("qwen3_vl"))
    one, three = ({c.name: c.flops for c in run.components} for run in report.runs)
    assert [r.batch_size for r in report.runs] == [1, 3]
    assert three["vision.patch_embed"] == 3 * one["vision.patch_embed"]
    assert three["lm_head"] == 3 * one["lm_head"]
    assert report.comparisons == []


def test_the_plot_format_follows_the_name(compared, tmp_path, caplog):
    pytest.importorskip("matplotlib")
    with caplog.at_level(logging.INFO, logger="vlforge"):
        plot(compared[1], tmp_path / "x.svg")
    assert b"<svg" in (tmp_path / "x.svg").read_bytes()[:2000]
    assert f"wrote the plot {tmp_path / 'x.svg'}" in caplog.text
    refused = CliRunner().invoke(app, ["profile", "--model", "does-not-matter", "--plot", str(tmp_path / "x.gif")])
    assert isinstance(refused.exception, ConfigError) and re.fullmatch(  # before any loading
        r"--plot .*x\.gif: a plot is written as \.jpeg, \.jpg, \.pdf, \.png, \.svg \(from the name's suffix\); got "
        r"\.gif", str(refused.exception)), refused.output


def test_plot_without_matplotlib_is_one_clear_error(compared, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(VlforgeError, match=r"--plot needs matplotlib: pip install 'vlforge\[plot\]'"):
        plot(compared[1], tmp_path / "x.png")
    result = CliRunner().invoke(app, ["profile", "--model", "does-not-matter", "--plot", str(tmp_path / "x.png")])
    assert "--plot needs matplotlib" in str(result.exception)  # before any loading


def test_bad_flags_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"compare: variants .*'fast'"):
        build_options(ProfileOptions, model="m", compare=["stock", "fast"])
    with pytest.raises(ConfigError, match="batch_sizes"):
        build_options(ProfileOptions, model="m", batch_sizes=[0])
    with pytest.raises(ConfigError, match="attn"):
        build_options(ProfileOptions, model="m", attn=["magic"])
    with pytest.raises(VlforgeError, match=r"--batch-sizes '1,x': 'x' is not a valid int"):
        parse_list("1,x", cast=int, flag="--batch-sizes")
    assert build_options(ProfileOptions, model="m", dtype="bf16").dtype == "bfloat16"
    result = CliRunner().invoke(app, ["profile", "--model", "m", "--synthetic", "8x720"])
    assert result.exit_code != 0
    assert isinstance(result.exception, VlforgeError) and "FRAMESxHEIGHTxWIDTH" in str(result.exception)
