"""`vlforge tokens audit|fix` end to end: JSON on stdout, exit codes, suggestions, rewrites."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.vocab.audit import AuditOptions, audit_template_tokens, run_audit
from vlforge.vocab.detect import TRAINED, UNTRAINED
from vlforge.vocab.reference import detect_for
from vlforge.vocab.tokenizer import load_tokenizer
from vlforge.vocab.weights import open_embeddings

runner = CliRunner()


def _audit_json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["tokens", "audit", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_r1_format_on_base_model_fails_with_2(lm_untied):
    code, report = _audit_json("--model", str(lm_untied.path), "--format", "r1")
    assert code == 3 and report["exit_code"] == 3 and report["verdict"] == UNTRAINED
    assert report["schema_version"] == "vlforge.vocab.audit/2"
    by_tag = {f["tag"]: f for f in report["findings"]}
    assert by_tag["<think>"]["verdict"] == UNTRAINED and by_tag["<think>"]["added"] == [True]
    assert by_tag["<think>"]["role"] == "generated" and by_tag["<think>"]["sources"] == ["format:r1"]
    assert report["weights"]["tied"] is False and report["weights"]["reference_rows"] > 0
    # suggestions: every piece of every accepted alternative is trained in an independent detect()
    tok = load_tokenizer(lm_untied.path)
    verdicts = detect_for(tok, open_embeddings(lm_untied.path)).verdicts
    think = next(s for s in report["suggestions"] if s["family"] == "think")
    assert think["alternatives"], "no checked alternative for <think>"
    for alt in think["alternatives"]:
        assert set(alt["mapping"]) == {"<think>", "</think>"}
        for check in alt["checks"]:
            assert check["ids"] == tok.encode(check["tag"], add_special_tokens=False)
            assert all(verdicts[i] == TRAINED for i in check["ids"])
            assert all(verdicts[i] != UNTRAINED for i in check["checked_ids"])
    rw = report["rewritten"]
    assert re.match(rw["format_regex"], rw["format_sample"], re.DOTALL)
    assert "<think>" not in rw["format_sample"]


def test_alternative_tags_pass_with_0(lm_untied):
    first = run_audit(AuditOptions(model=lm_untied.path, format="r1"))
    alt = next(s for s in first.suggestions if s.family == "think").alternatives[0].mapping
    answer = [f for f in first.findings if f.tag in ("<answer>", "</answer>")]
    tags = [alt["<think>"], alt["</think>"]] + [f.tag for f in answer if f.verdict == TRAINED]
    code, report = _audit_json("--model", str(lm_untied.path), "--tags", ",".join(tags))
    assert code == 0 and report["verdict"] == TRAINED
    assert [f["tag"] for f in report["findings"]] == tags


def test_weak_exits_1_and_thresholds_override(lm_tied):
    # no cosine score reaches 2 -> <think> falls into the weak band only
    code, report = _audit_json("--model", str(lm_tied.path), "--tags", "<think>",
                               "--threshold", "untrained=2")
    assert code == 1 and report["verdict"] == "weak"
    assert report["weights"]["thresholds"]["untrained"] == 2 and report["weights"]["cuts"]["untrained"] == 2
    bad = runner.invoke(app, ["tokens", "audit", "--model", str(lm_tied.path), "--threshold", "nope=1"])
    assert bad.exit_code != 0


def test_reward_regex_and_rewrite_out(lm_tied, tmp_path):
    regex = r"^<think>.*?</think>\s*<answer>.*?</answer>$"
    out = tmp_path / "regex.txt"
    code, report = _audit_json("--model", str(lm_tied.path), "--reward-regex", regex, "--rewrite-out", str(out))
    assert code == 3
    assert {f["tag"] for f in report["findings"]} == {"<think>", "</think>", "<answer>", "</answer>"}
    new = report["rewritten"]["regex"]
    assert report["rewritten"]["regex_checked"] is True and out.read_text() == new
    mapping = report["rewritten"]["mapping"]
    assert re.match(new, f"{mapping['<think>']}x{mapping['</think>']}<answer>1</answer>", re.DOTALL)


def test_model_template_roles_and_library_entry_point(lm_tied):
    """The checkpoint's own (Qwen3) template, non-thinking: <think> is prefilled, so it does not fail."""
    code, report = _audit_json("--model", str(lm_tied.path), "--template-var", "enable_thinking=false")
    by_tag = {f["tag"]: f for f in report["findings"]}
    assert by_tag["<think>"]["role"] == "prefilled" and by_tag["<think>"]["verdict"] == UNTRAINED
    assert by_tag["<|im_end|>"]["role"] == "generated"
    assert code == 0 and report["verdict"] == TRAINED  # the only generated tag, <|im_end|>, is trained
    findings = audit_template_tokens(lm_tied.path)  # thinking mode: <think> must be generated
    think = next(f for f in findings if f.tag == "<think>")
    assert think.role == "generated" and think.problem


def test_tokenizer_only_audit_real_qwen3(qwen3_dir):
    code, report = _audit_json("--tokenizer", str(qwen3_dir), "--format", "r1")
    assert code == 0 and report["weights"] is None and report["verdict"] == "unknown"
    by_tag = {f["tag"]: f for f in report["findings"]}
    assert by_tag["<think>"]["ids"] == [151667] and by_tag["<answer>"]["ids"] == [27, 9217, 29]
    assert by_tag["<think>"]["context_ids"] == [151667]
    assert report["suggestions"] == [] and any("tokenizer audit only" in n for n in report["notes"])


def test_fix_cli_json(lm_tied, tmp_path):
    out = tmp_path / "fixed"
    result = runner.invoke(app, ["tokens", "fix", "--model", str(lm_tied.path), "--out", str(out),
                                 "--tags", "<think>,</think>", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema_version"] == "vlforge.tokens.fix/1"
    assert [r["id"] for r in report["rows"]] == [lm_tied.tokenizer_len - 2, lm_tied.tokenizer_len - 1]
    code, after = _audit_json("--model", str(out), "--tags", "<think>,</think>")
    assert code == 0 and after["verdict"] == TRAINED


def test_bad_input_is_one_line_error(tmp_path):
    result = runner.invoke(app, ["tokens", "audit", "--model", str(tmp_path / "missing")])
    assert result.exit_code != 0
    assert "missing" in str(result.exception)


def test_rewritten_template_renders_the_alternative(lm_untied, tmp_path):
    out = tmp_path / "template.jinja"
    code, report = _audit_json("--model", str(lm_untied.path), "--rewrite-out", str(out))
    assert code == 3  # thinking mode: <think> is generated
    rw = report["rewritten"]
    new_open = rw["mapping"]["<think>"]
    assert rw["template_checked"] is True and out.read_text() == rw["template"]
    assert "<think>" not in rw["template"] and new_open in rw["template"]
    # the rewritten template, audited as a template, has only trained generated tags left
    code, again = _audit_json("--model", str(lm_untied.path), "--template", str(out))
    generated = {f["tag"]: f["verdict"] for f in again["findings"] if f["role"] == "generated"}
    assert new_open in generated and set(generated.values()) == {TRAINED} and code == 0
