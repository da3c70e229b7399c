"""The doctor's tokens rules: real tiny checkpoints whose ``<think>`` rows are made untrained on purpose.

The tiny models are random-init, so every row looks ``trained`` to the audit. ``broken`` copies the
tiny Qwen3-VL checkpoint and overwrites the rows of ``<think>`` / ``</think>`` with two of the padding
rows past the tokenizer length (rows no token uses, the audit's reference set): a deterministic
``untrained`` verdict. ``vlforge tokens fix`` repairs them again.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.diagnosis import Context, ModelInfo, evaluate, guard, report
from vlforge.diagnosis.facts import DoctorError, Facts
from vlforge.diagnosis.tokens import TokenOptions, TokensAudit, run_tokens_audit
from vlforge.errors import VlforgeError

runner = CliRunner()
THINK, END_THINK = 151667, 151668  # real Qwen3 tokenizer ids (docs/tokens.md)
EMBED = "model.language_model.embed_tokens.weight"
TOKEN_RULES = ("untrained-template-token", "tokens-audit-skipped")


def _copy(src: Path, dst: Path, *, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for path in src.iterdir():
        if path.name not in skip:
            shutil.copy2(path, dst / path.name)
    return dst


@pytest.fixture(scope="module")
def broken(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny Qwen3-VL checkpoint with ``<think>`` / ``</think>`` rows set to unused padding rows."""
    src = tiny_checkpoint("qwen3_vl")
    dst = _copy(src, tmp_path_factory.mktemp("broken") / "ckpt", skip=("model.safetensors",))
    tensors = load_file(src / "model.safetensors")
    rows = tensors[EMBED]
    tokenizer_len = 151669
    assert rows.shape[0] > tokenizer_len + 2, "the tiny checkpoint has no padding rows to copy"
    rows[THINK] = rows[tokenizer_len]
    rows[END_THINK] = rows[tokenizer_len + 1]
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def r1_doc(broken) -> tuple[int, dict]:
    result = runner.invoke(app, ["doctor", "-m", str(broken), "--no-bench", "--format", "r1", "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


def _by_rule(findings: list) -> dict:
    return {(f["rule"] if isinstance(f, dict) else f.rule): f for f in findings}


def test_untrained_generated_tag_is_an_error_with_exit_3(r1_doc, broken) -> None:
    code, doc = r1_doc
    assert code == 3 and doc["exit_code"] == 3 and doc["verdict"] == "error"
    finding = _by_rule(doc["findings"])["untrained-template-token"]
    assert finding["severity"] == "error" and finding["subject"] == "<think>, </think>"
    assert f"'<think>' ({THINK})" in finding["message"] and f"'</think>' ({END_THINK})" in finding["message"]
    assert "format:r1" in finding["message"]
    fix = finding["fix"]
    assert f"vlforge tokens fix --model {broken}" in fix and "--strategy mean-of-pieces" in fix
    assert "--tags '<think>,</think>'" in fix
    assert "arXiv:2405.05417" in finding["source"]
    # <answer> is plain text (trained pieces): the audit saw it, no rule fired for it.
    tokens = doc["model"]["tokens"]
    assert tokens["status"] == "audited" and tokens["format"] == "r1" and tokens["checkpoint"] == str(broken)
    verdicts = {f["tag"]: (f["role"], f["verdict"]) for f in tokens["findings"]}
    assert verdicts["<think>"] == ("generated", "untrained") and verdicts["<answer>"] == ("generated", "trained")
    assert {f["tag"]: f["problem_ids"] for f in tokens["findings"]}["</think>"] == [END_THINK]
    # Alternatives are named in the fix only when the audit checked some.
    for old, new in tokens["alternatives"].items():
        assert f"{old} -> {new}" in fix


def test_no_tokens_skips_the_audit(broken) -> None:
    result = runner.invoke(app, ["doctor", "-m", str(broken), "--no-bench", "--no-tokens", "--json"])
    doc = json.loads(result.stdout)
    assert doc["model"]["tokens"]["status"] == "off"
    assert not [f for f in doc["findings"] if f["rule"].startswith(TOKEN_RULES)]
    assert result.exit_code == doc["exit_code"] < 3


def test_token_flags_with_no_tokens_are_refused_not_dropped(broken) -> None:
    result = runner.invoke(app, ["doctor", "-m", str(broken), "--no-bench", "--no-tokens", "--format", "r1",
                                 "--json"])
    assert isinstance(result.exception, DoctorError) and result.stdout == ""
    assert "--format would be ignored with --no-tokens" in str(result.exception)


def _token_rules(audit: TokensAudit) -> list[tuple[str, str, str]]:
    findings = evaluate(Context(facts=Facts(device="cpu"), model=ModelInfo(extra={"tokens": audit})))
    return [(f.rule, f.severity, f.subject) for f in findings]


def test_trained_rows_give_no_finding(tiny_checkpoint) -> None:
    """The unmodified tiny checkpoint: the same tags, rows not in the unused cluster -> no rule fires."""
    audit = run_tokens_audit(tiny_checkpoint("qwen3_vl"), TokenOptions(format="r1"))
    verdicts = {f.tag: f.verdict for f in audit.findings if f.role == "generated"}
    assert verdicts["<think>"] == verdicts["</think>"] == "trained"
    assert _token_rules(audit) == []


@pytest.mark.slow
def test_vlforge_tokens_fix_clears_the_finding(broken, tmp_path) -> None:
    """The fix the rule names (``vlforge tokens fix``) makes the finding go away (~10 s: fix re-audits)."""
    from vlforge.tokens import FixOptions, fix_checkpoint

    fixed = tmp_path / "fixed"
    fix_checkpoint(FixOptions(model=broken, out=fixed, strategy="mean-of-pieces", tags=["<think>", "</think>"]))
    audit = run_tokens_audit(fixed, TokenOptions(format="r1"))
    assert {f.tag: f.verdict for f in audit.findings if f.tag in ("<think>", "</think>")} == {
        "<think>": "trained", "</think>": "trained"}
    assert _token_rules(audit) == []


def test_model_without_chat_template_is_an_info_finding(broken, tmp_path) -> None:
    bare = _copy(broken, tmp_path / "bare", skip=("chat_template.jinja",))
    result = runner.invoke(app, ["doctor", "-m", str(bare), "--no-bench", "--json"])
    doc = json.loads(result.stdout)
    finding = _by_rule(doc["findings"])["tokens-audit-skipped"]
    assert finding["severity"] == "info" and "no chat template" in finding["message"]
    assert doc["model"]["tokens"]["status"] == "skipped" and result.exit_code < 3
    # Other tags are still audited; the missing template stays an info finding.
    audit = run_tokens_audit(bare, TokenOptions(tags=("<think>",)))
    assert audit.status == "audited" and "no chat template" in audit.template_skipped
    assert _token_rules(audit) == [
        ("untrained-template-token", "error", "<think>"), ("tokens-audit-skipped", "info", "chat template")]


def test_guard_logs_a_warning_and_does_not_raise(broken, caplog) -> None:
    from vlforge.models import load

    model = load(broken, processor=False, tokenizer=False).model
    assert Path(model.config._name_or_path) == broken.absolute()  # how guard finds the checkpoint
    caplog.set_level(logging.INFO, logger="vlforge")
    findings = guard(model, "float32", assume="device=cpu,threads=2", tokens=TokenOptions(format="r1"))
    assert [(f.rule, f.severity) for f in findings] == [("untrained-template-token", "error")]
    record = next(r for r in caplog.records if "untrained-template-token" in r.getMessage())
    assert record.levelno == logging.WARNING
    # Other error-level findings still raise: the exemption is per rule, not a blanket one.
    with pytest.raises(VlforgeError, match="flash-attn-missing") as raised:
        guard(model, "float32", assume="device=cpu,threads=2,attn=flash_attention_2,flash_attn=absent",
              tokens=TokenOptions(format="r1"))
    assert "untrained-template-token" not in str(raised.value)


def test_severity_follows_role_and_verdict(broken) -> None:
    """weak -> warning, prefilled/prompt -> info, unknown -> info; records are the real audit's, re-labelled."""
    audit = run_tokens_audit(broken, TokenOptions(format="r1"))  # cached by the CLI run above
    think = next(f for f in audit.findings if f.tag == "<think>")

    def rules_for(**update) -> list[tuple[str, str]]:
        relabelled = TokensAudit("audited", None, audit.checkpoint, audit.options,
                                 [think.model_copy(update=update)], notes=["no reference set"])
        ctx = Context(facts=Facts(device="cpu"), model=ModelInfo(extra={"tokens": relabelled}))
        return [(f.rule, f.severity) for f in evaluate(ctx)]

    assert rules_for() == [("untrained-template-token", "error")]
    assert rules_for(verdict="weak") == [("untrained-template-token-weak", "warning")]
    assert rules_for(role="prefilled") == [("untrained-template-token-prefilled", "info")]
    assert rules_for(role="prompt", verdict="weak") == [("untrained-template-token-prefilled", "info")]
    assert rules_for(role="unexercised") == []
    assert rules_for(verdict="trained") == []
    assert rules_for(verdict="unknown") == [("untrained-template-token-unknown", "info")]


def test_in_memory_module_and_bad_options(patch_model) -> None:
    rep = report(patch_model, bench=False)
    assert rep.model.extra["tokens"].status == "skipped" and rep.model.to_dict()["tokens"]["checkpoint"] is None
    assert not [f for f in rep.findings if f.rule.startswith(TOKEN_RULES)]
    with pytest.raises(DoctorError, match="--format 'r2': unknown format"):
        TokenOptions(format="r2")
    with pytest.raises(DoctorError, match="does not compile"):
        TokenOptions(reward_regex="<think>(")
    with pytest.raises(DoctorError, match="need --model"):
        report(tokens=TokenOptions(format="r1"))


def test_checkpoint_without_weights_is_an_info_finding(broken, patch_model, tmp_path) -> None:
    """A module whose config names a directory without safetensors: the audit says why, guard goes on."""
    from types import SimpleNamespace

    no_weights = _copy(broken, tmp_path / "no-weights", skip=("model.safetensors",))
    patch_model.config = SimpleNamespace(_name_or_path=str(no_weights))
    findings = guard(patch_model, "float32", assume="device=cpu,threads=2")
    assert [(f.rule, f.severity) for f in findings] == [("tokens-audit-skipped", "info")]
    assert "no *.safetensors weights" in findings[0].message and str(no_weights) in findings[0].message
