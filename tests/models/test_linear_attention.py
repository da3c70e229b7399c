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


def _both_branches(model, monkeypatch, found) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed row's hidden states through the torch branch, then through the kernel branch with ``found`` as
    the installed kernels (their device check included)."""
    from vlforge.models import linear_attention as la

    use_for_text(model)
    patch = use_for_packed_rows(model)
    try:
        row = torch.cat(_samples())[None]
        with torch.no_grad():
            torch_branch = model.model(input_ids=row, position_ids=_positions(), use_cache=False,
                                       **_packed_kwargs()).last_hidden_state
            monkeypatch.setattr(la, "_FOUND", [found])
            monkeypatch.setattr(la, "_CHECKED", {})
            monkeypatch.setattr(la, "_kernel_device", lambda x: True)
            kernel_branch = model.model(input_ids=row, position_ids=_positions(), use_cache=False,
                                        **_packed_kwargs()).last_hidden_state
    finally:
        patch.restore()
    return torch_branch, kernel_branch


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

    torch_branch, kernel_branch = _both_branches(model, monkeypatch,
                                                 la.Kernels(causal_conv1d_fn=conv, chunk_gated_delta_rule=rule))
    assert calls == {"conv": 2, "rule": 2}  # the device's one check, then one call per layer, not one per sample
    torch.testing.assert_close(kernel_branch, torch_branch, atol=1e-10, rtol=1e-10)


def test_fla_s_triton_conv_is_given_cu_seqlens_in_its_time_major_layout(models, monkeypatch):
    """Without causal-conv1d, fla's own Triton ``causal_conv1d`` (x as (B, T, C), ``cu_seqlens``) runs the conv:
    a stand-in checks that contract and computes per sample, so the row must equal the torch branch's."""
    import sys

    from vlforge.models import linear_attention as la

    model = models("qwen3_5")
    layer = next(m for m in model.modules() if la.is_gated_deltanet(m))
    stock = vars(sys.modules[type(layer).__module__])
    calls = []

    def conv(x, weight, bias=None, activation=None, cu_seqlens=None, **kwargs):
        calls.append(kwargs)
        assert x.shape[0] == 1 and x.shape[2] == weight.shape[0], "fla's conv takes (B, T, C)"
        assert cu_seqlens.dtype == torch.long and int(cu_seqlens[-1]) == x.shape[1]
        pieces = [stock["causal_conv1d_fn"](x[:, a:b].transpose(1, 2), weight, bias, activation=activation)
                  for a, b in itertools.pairwise(cu_seqlens.tolist())]
        return torch.cat(pieces, dim=2).transpose(1, 2), None

    torch_branch, kernel_branch = _both_branches(model, monkeypatch, la.Kernels(fla_causal_conv1d=conv))
    assert calls == [{}, {}]  # the device's one check and the one layer's call, no initial or final state
    torch.testing.assert_close(kernel_branch, torch_branch, atol=1e-10, rtol=1e-10)


def test_a_kernel_that_fails_its_check_is_left_out_and_the_row_stays_exact(models, monkeypatch, caplog):
    """The per-device check: a conv that ignores ``seq_idx`` (leaks across samples) and a rule that raises in its
    backward (as fla does on Hopper with Triton 3.4-3.7.0) are both left out with a warning; the torch path runs."""
    import sys

    from vlforge.models import linear_attention as la

    model = models("qwen3_5")
    layer = next(m for m in model.modules() if la.is_gated_deltanet(m))
    stock = vars(sys.modules[type(layer).__module__])

    def leaking_conv(x, weight, bias=None, seq_idx=None, activation=None):
        return stock["causal_conv1d_fn"].__wrapped__(x, weight, bias, activation=activation)

    class Refuses(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q):
            return q.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results")

    def refusing_rule(q, k, v, g, beta, cu_seqlens=None, **kwargs):
        return Refuses.apply(v), None

    monkeypatch.setattr(la, "_FOUND", [la.Kernels(causal_conv1d_fn=leaking_conv, chunk_gated_delta_rule=refusing_rule)])
    monkeypatch.setattr(la, "_CHECKED", {})
    monkeypatch.setattr(la, "_kernel_device", lambda x: True)
    use_for_text(model)
    patch = use_for_packed_rows(model)
    try:
        with caplog.at_level("WARNING", logger="vlforge.models.linear_attention"):
            hidden, _, _ = _packed(model, _samples(), **_packed_kwargs())
    finally:
        patch.restore()
    assert la._CHECKED["cpu"] == la.Kernels()
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert "causal-conv1d's causal_conv1d_fn disagrees" in warnings and "chunk_gated_delta_rule does not run" in warnings
    separate, _, _ = _separate(model, _samples())
    for got, want in zip(hidden, separate, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_meta_memory_probes_run_the_torch_mixers_not_the_dispatched_kernels(monkeypatch):
    """transformers' mixer functions dispatch to fla / causal-conv1d whenever those import, meta tensors included
    (on a GPU host that launched Triton on null pointers: an illegal memory access at the trainer's next CUDA
    call). The planner's meta probe must compute with the unwrapped torch functions."""
    import functools
    import sys

    from vlforge.memory.probe import meta_model, text_layer_bytes
    from vlforge.models import linear_attention as la
    model = meta_model(load("tiny:qwen3_5").model.config, torch.bfloat16)
    stock = sys.modules[type(next(m for m in model.modules() if la.is_gated_deltanet(m))).__module__]
    for name in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"):
        original = getattr(stock, name)

        @functools.wraps(original)
        def dispatched(*args, _name=name, **kwargs):
            raise AssertionError(f"the {_name} kernel dispatch ran on meta tensors")

        monkeypatch.setattr(stock, name, dispatched)
    assert text_layer_bytes(model, 256, torch.bfloat16) > 0
    with pytest.raises(AssertionError, match="kernel dispatch ran"):  # the dispatching functions are back
        stock.causal_conv1d_fn(torch.zeros(1, 2, 3), torch.zeros(2, 4))


def test_the_mixers_as_ops_pass_torch_opcheck_and_equal_the_eager_functions(models):
    """What ``torch.compile`` sees of a packed row's Gated DeltaNet (``vlforge::gated_deltanet_conv`` and
    ``vlforge::gated_deltanet_rule``): torch's own checks of their schemas, fake kernels and autograd registration,
    and their values and gradients against the eager per-sample functions on a row of four samples."""
    from vlforge.models.linear_attention import (
        _row_for,
        gated_deltanet_conv,
        gated_deltanet_rule,
        packed_causal_conv1d,
        packed_delta_rule,
    )

    model = models("qwen3_5")
    use_for_packed_rows(model)
    layer = next(m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet"))
    modeling = type(layer).__module__
    cu = torch.tensor([0, *itertools.accumulate(LENGTHS)])
    length = int(cu[-1])
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    weight = layer.conv1d.weight.squeeze(1).detach().clone().requires_grad_()
    x = rand(1, weight.shape[0], length)
    torch.library.opcheck(gated_deltanet_conv, (x, weight, None, cu, modeling))
    got = gated_deltanet_conv(x, weight, None, cu, modeling)
    want = packed_causal_conv1d(layer, x, _row_for(cu, length))  # the layer's own weight: the same values
    torch.testing.assert_close(got, want)
    grad = torch.randn(got.shape, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(got, x, grad)[0], torch.autograd.grad(want, x, grad)[0])

    hk, hv = layer.num_k_heads, layer.num_v_heads
    inputs = (rand(1, length, hk, layer.head_k_dim), rand(1, length, hk, layer.head_k_dim),
              rand(1, length, hv, layer.head_v_dim), -F.softplus(rand(1, length, hv)).detach().requires_grad_(),
              rand(1, length, hv).sigmoid().detach().requires_grad_())
    torch.library.opcheck(gated_deltanet_rule, (*inputs, cu, modeling))
    got = gated_deltanet_rule(*inputs, cu, modeling)
    want = packed_delta_rule(layer, *inputs, _row_for(cu, length))
    torch.testing.assert_close(got, want)
    grad = torch.randn(got.shape, generator=generator, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad), strict=True):
        torch.testing.assert_close(a, b)


def test_a_compiled_gated_deltanet_layer_under_autocast_equals_eager():
    """Under compile the packed conv and delta rule run as ops with autocast off: the layer casts the conv's inputs
    as eager autocast does, so a bfloat16-autocast forward and backward match eager (aot_eager: dynamo +
    AOTAutograd, no C++ builds)."""
    model = load("tiny:qwen3_5").model.train()
    use_for_packed_rows(model)
    layer = next(m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet"))
    cu = torch.tensor([0, *itertools.accumulate(LENGTHS)])
    hidden = torch.randn(1, int(cu[-1]), layer.hidden_size, generator=torch.Generator().manual_seed(0))

    def run(forward):
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(hidden, cu_seq_lens_q=cu)
        out.float().square().sum().backward()
        return out, {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}

    torch._dynamo.reset()
    eager, eager_grads = run(layer.forward)
    compiled, grads = run(torch.compile(layer.forward, backend="aot_eager", fullgraph=True))
    assert compiled.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(compiled.float(), eager.float(), rtol=2e-2, atol=2e-2)
    assert grads.keys() == eager_grads.keys() and "conv1d.weight" in grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=5e-2, atol=5e-2, msg=name)


def test_a_kernel_check_inside_an_op_kernel_still_differentiates():
    """Under compile the first Gated DeltaNet kernel check runs inside the conv op's kernel, where the dispatcher
    has autograd off: the check (a forward and backward against the torch path) must still run, or every kernel
    would be dropped as "does not run here"."""
    from vlforge.models.linear_attention import _passes

    def check(fn):
        x = torch.ones(3, requires_grad=True)
        (grad,) = torch.autograd.grad(fn(x).sum(), x)
        return float((grad - 2).abs().max())

    @torch.library.custom_op("vlforge_test::kernel_check", mutates_args=())
    def checked(x: torch.Tensor) -> torch.Tensor:
        kept = _passes("x * 2", lambda t: t * 2, check)
        return x + (kept is not None)

    assert float(checked(torch.zeros(()))) == 1.0
