"""Packed rows through Qwen3.5's Gated DeltaNet: a packed row equals separate forwards, and the stock gap is pinned.

Tiny Qwen3.5 and Qwen3.5-MoE presets (float64, so that only the model's own fp32 casts limit the agreement), one
packed row of four samples whose
lengths cross the delta rule's 64-token chunk and undercut the conv kernel (3 tokens), against one forward per
sample: per-sample hidden states, a summed token loss and every parameter's gradient. The loss reads the decoder's
last hidden states through a fixed 97-class head instead of the 248k-row ``lm_head`` (tied to the embedding, which
a packed row cannot change): the same gradient paths through every layer at a thousandth of the cost. The pins say
what transformers does without vlforge (refuses ``cu_seq_lens_q``; leaks across samples with restarting position
ids alone), so this guard cannot silently become unnecessary or broken when transformers changes.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn import functional as F

from vlforge.models.linear_attention import sample_bounds, use_for_packed_rows
from vlforge.models.load import load
from vlforge.models.varlen import use_for_text

LENGTHS = (37, 70, 3, 130)
FAMILIES = ("qwen3_5", "qwen3_5_moe")


@pytest.fixture(scope="module")
def models():
    cache: dict[str, torch.nn.Module] = {}

    def get(family: str) -> torch.nn.Module:
        if family not in cache:
            model = load(f"tiny:{family}", dtype=torch.float64).model.train()
            model.get_input_embeddings().weight.requires_grad_(False)
            model.config.get_text_config()._experts_implementation = "eager"  # grouped_mm has no float64
            cache[family] = model
        return cache[family]

    return get


def _samples() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 5000, (n,), generator=generator) for n in LENGTHS]


def _cu() -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(LENGTHS)], dtype=torch.int32)


def _packed_kwargs() -> dict:
    cu = _cu()
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(LENGTHS), "max_length_k": max(LENGTHS)}


def _positions() -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in LENGTHS])[None]


CLASSES = 97


def _loss(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    head = torch.randn(hidden.shape[-1], CLASSES, generator=torch.Generator().manual_seed(2), dtype=hidden.dtype)
    return F.cross_entropy(hidden @ head, targets % CLASSES, reduction="sum")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _separate(model, seqs):
    model.zero_grad(set_to_none=True)
    hidden, total = [], 0.0
    for seq in seqs:
        states = model.model(input_ids=seq[None], use_cache=False).last_hidden_state[0]
        loss = _loss(model, states[:-1], seq[1:])
        loss.backward()
        total += loss.item()
        hidden.append(states.detach())
    return hidden, total, _grads(model)


def _packed(model, seqs, **kwargs):
    model.zero_grad(set_to_none=True)
    row = torch.cat(seqs)[None]
    states = model.model(input_ids=row, position_ids=_positions(), use_cache=False, **kwargs).last_hidden_state[0]
    keep = torch.ones(row.shape[1] - 1, dtype=torch.bool)
    for end in itertools.accumulate(LENGTHS[:-1]):
        keep[end - 1] = False  # a sample's first token is not predicted from the previous sample
    loss = _loss(model, states[:-1][keep], row[0, 1:][keep])
    loss.backward()
    return list(torch.split(states.detach(), LENGTHS)), loss.item(), _grads(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_row_equals_separate_forwards(models, family):
    model = models(family)
    use_for_text(model)  # full-attention layers: per-sample varlen attention, as training uses
    patch = use_for_packed_rows(model)
    try:
        assert patch.count == 1  # the tiny stack: one Gated DeltaNet layer, one full-attention layer
        seqs = _samples()
        h_sep, loss_sep, g_sep = _separate(model, seqs)
        h_pack, loss_pack, g_pack = _packed(model, seqs, **_packed_kwargs())
    finally:
        assert patch.restore() == 1
    for a, b in zip(h_sep, h_pack, strict=True):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-10)
    assert loss_pack == pytest.approx(loss_sep, rel=1e-12)
    assert g_sep.keys() == g_pack.keys() and any("linear_attn" in name for name in g_sep)
    largest = max(float(g.abs().max()) for g in g_sep.values())
    for name, grad in g_sep.items():  # the floor: Qwen3_5RMSNorm and the decay are computed in fp32 by the model
        assert float((g_pack[name] - grad).abs().max()) <= 1e-6 * largest, name


@pytest.mark.parametrize("family", FAMILIES)
def test_the_stock_layer_refuses_boundaries_and_leaks_without_them(models, family):
    """What transformers does alone today: if this test fails, re-check whether the guard is still needed."""
    model = models(family)
    use_for_text(model)
    seqs = _samples()
    with torch.no_grad(), pytest.raises(ValueError, match="packed sequences apart"):
        model.model(input_ids=torch.cat(seqs)[None], position_ids=_positions(), use_cache=False, **_packed_kwargs())
    model.config.get_text_config()._attn_implementation = "sdpa"  # block mask from the restarting positions
    with torch.no_grad():
        alone = model.model(input_ids=seqs[1][None], use_cache=False).last_hidden_state[0]
        row = model.model(input_ids=torch.cat(seqs)[None], position_ids=_positions(), use_cache=False).last_hidden_state[0]
    second = row[LENGTHS[0]:LENGTHS[0] + LENGTHS[1]]
    assert float((second - alone).abs().max()) > 1e-3  # the first sample's state flowed into the second


def test_boundaries_read_like_the_varlen_attention():
    assert sample_bounds(torch.tensor([0, 3, 3, 7]), 9) == [(0, 3), (3, 7), (7, 9)]  # empty sample, pad tail
    with pytest.raises(ValueError, match="end at 12 but it has 9 tokens"):
        sample_bounds(torch.tensor([0, 12]), 9)


def test_a_row_s_boundaries_are_read_once_per_forward_not_once_per_layer():
    from vlforge.models import linear_attention as la

    kwargs = _packed_kwargs()
    first = la._row_of(kwargs, sum(LENGTHS))
    assert la._row_of(kwargs, sum(LENGTHS)) is first  # the next layer of the same forward: no second host read
    assert first.bounds == [(0, 37), (37, 107), (107, 110), (110, 240)]
    again = la._row_of(_packed_kwargs(), sum(LENGTHS))  # the next batch: a new tensor, read anew
    assert again is not first and again.bounds == first.bounds
    seq_idx, cu = again.kernel_index(torch.device("cpu"))
    assert seq_idx.dtype == torch.int32 and seq_idx.shape == (1, 240) and cu.tolist() == [0, 37, 107, 110, 240]


def test_a_model_without_linear_attention_is_refused(models):
    with pytest.raises(ValueError, match="no Gated DeltaNet layer"):
        use_for_packed_rows(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_the_kernel_branch_passes_each_kernel_its_packed_sequence_arguments(models, monkeypatch):
    """CUDA with causal-conv1d and fla: one conv call with ``seq_idx`` and one rule call with ``cu_seqlens`` per
    layer, in the layouts their interfaces document. Stand-ins check those contracts and compute per sample with
    transformers' torch functions, so the row must equal the torch branch's (no GPU here)."""
    import sys

    from vlforge.models import linear_attention as la

    model = models("qwen3_5")
    layer = next(m for m in model.modules() if la.is_gated_deltanet(m))
    stock = vars(sys.modules[type(layer).__module__])
    calls = {"conv": 0, "rule": 0}

    def conv(x, weight, bias=None, seq_idx=None, activation=None):
        calls["conv"] += 1
        assert x.stride(1) == 1, "seq_idx needs a channel-last x"
        assert seq_idx.dtype == torch.int32 and seq_idx.is_contiguous() and seq_idx.shape == (1, x.shape[2])
        cuts = [0, *(torch.nonzero(seq_idx[0, 1:] != seq_idx[0, :-1]).reshape(-1) + 1).tolist(), x.shape[2]]
        return torch.cat([stock["causal_conv1d_fn"](x[:, :, a:b], weight, bias, activation=activation)
                          for a, b in itertools.pairwise(cuts)], dim=2)

    def rule(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
             cu_seqlens=None):
        calls["rule"] += 1
        assert q.shape[0] == 1 and initial_state is None and not output_final_state and use_qk_l2norm_in_kernel
        assert cu_seqlens.dtype == torch.long and int(cu_seqlens[0]) == 0 and int(cu_seqlens[-1]) == q.shape[1]
        cu = cu_seqlens.tolist()
        out = [stock["torch_chunk_gated_delta_rule"](q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                                                     use_qk_l2norm_in_kernel=True)[0] for a, b in itertools.pairwise(cu)]
        return torch.cat(out, dim=1), None

    use_for_text(model)
    patch = use_for_packed_rows(model)
    try:
        row = torch.cat(_samples())[None]
        with torch.no_grad():
            torch_branch = model.model(input_ids=row, position_ids=_positions(), use_cache=False,
                                       **_packed_kwargs()).last_hidden_state
            monkeypatch.setattr(la, "_FOUND", [la.Kernels(conv, rule)])
            monkeypatch.setattr(la, "_kernel_path", lambda x: True)
            kernel_branch = model.model(input_ids=row, position_ids=_positions(), use_cache=False,
                                        **_packed_kwargs()).last_hidden_state
    finally:
        patch.restore()
    assert calls == {"conv": 1, "rule": 1}  # one call of each per Gated DeltaNet layer, not one per sample
    torch.testing.assert_close(kernel_branch, torch_branch, atol=1e-10, rtol=1e-10)
