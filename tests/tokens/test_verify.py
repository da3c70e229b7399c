"""--verify: the repeat-prompt probability of emitting a token, from a real forward pass."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from vlforge.vocab.audit import AuditOptions, run_audit
from vlforge.vocab.tokenizer import load_tokenizer
from vlforge.vocab.verify import MIN_PROB, prompt_texts, repeat_probabilities_with


def test_repeat_probability_matches_a_manual_forward(lm_tied):
    tok = load_tokenizer(lm_tied.path)
    model = AutoModelForCausalLM.from_pretrained(lm_tied.path).eval()
    think = lm_tied.tokenizer_len - 2
    probs = repeat_probabilities_with(model, tok, [think, 27])
    manual = 0.0
    for prompt in prompt_texts("<think>"):
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        assert think in ids[0].tolist()  # the prompt really contains the token to repeat
        with torch.no_grad():
            manual = max(manual, float(torch.softmax(model(input_ids=ids).logits[0, -1], -1)[think]))
    assert abs(probs[think] - manual) < 1e-6
    assert 0.0 <= probs[27] <= 1.0


def test_audit_verify_fills_probabilities(lm_tied):
    report = run_audit(AuditOptions(model=lm_tied.path, tags=["<think>"], verify=True))
    (finding,) = report.findings
    (row,) = finding.id_reports
    assert row.verify_prob is not None and row.verify_prob < MIN_PROB
    assert finding.verdict == "untrained" and report.exit_code == 3
