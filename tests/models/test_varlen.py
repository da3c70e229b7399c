"""Packed rows through vlforge_varlen: the same loss and gradients as transformers' dense-mask SDPA path and as
one forward per sample, on the real tiny models; never an L x L mask."""

from __future__ import annotations

import copy

import pytest
import torch

from vlforge.models.varlen import ATTENTION_NAME, register, use_for_text, varlen_attention


def _packed_batch(family: str, tokenizer):
    from vlforge.data import DataConfig, DataStream, QwenVLProcessor, VisionSettings

    settings = VisionSettings.for_family(family, min_pixels=32 * 32, max_pixels=64 * 64, video_min_pixels=16 * 16,
                                         video_max_pixels=64 * 64)
    proc = QwenVLProcessor(tokenizer, settings, family)
    cfg = DataConfig(filter_overlong=True, datasets="dataset.yaml", packing=True, packing_length=1200)
    for batch in DataStream(cfg, proc, base_dir="examples/data"):
        if len(batch["sample_ids"]) >= 3 and "pixel_values" in batch:
            return batch
    raise AssertionError("no packed row with 3 samples and an image")


def _loss_and_grads(model, batch, cu: bool):
    from vlforge.train.loss import token_loss_sum

    model.zero_grad(set_to_none=True)
    if not cu:
        batch = {k: v for k, v in batch.items() if k != "cu_seqlens"}
        batch["attention_mask"] = None
    loss = token_loss_sum(model, batch, "cpu")
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen2_5_vl"])
def test_packed_row_equals_the_dense_mask_path(family, monkeypatch):
    from vlforge.models.load import load
    from vlforge.models.tokenizer import qwen3_tokenizer

    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    batch = _packed_batch(family, qwen3_tokenizer())
    model = load(f"tiny:{family}", dtype="float32").model
    dense_model = copy.deepcopy(model)
    reference = _loss_and_grads(dense_model, dict(batch), cu=True)  # transformers' sdpa + block-diagonal mask
    assert use_for_text(model)
    assert model.config.get_text_config()._attn_implementation == ATTENTION_NAME
    loss, grads = _loss_and_grads(model, dict(batch), cu=True)
    assert loss == pytest.approx(reference[0], rel=1e-5)
    scale = max(float(g.abs().max()) for g in reference[1].values())
    assert max(float((grads[k] - reference[1][k]).abs().max()) for k in grads) <= 1e-5 * scale


def test_samples_never_see_each_other_and_no_dense_mask_is_built():
    register()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 10, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 3, 7, 10])
    out, _ = varlen_attention(None, q, k, v, None, cu_seq_lens_q=cu)
    for a, b in [(0, 3), (3, 7), (7, 10)]:
        alone = torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b],
                                                                 is_causal=True)
        assert torch.allclose(out[:, a:b].transpose(1, 2), alone, atol=1e-6)
    k2 = k.detach().clone()
    k2[:, :, 3:7] += 100  # another sample's keys change: the first sample's output must not
    out2, _ = varlen_attention(None, q, k2, v, None, cu_seq_lens_q=cu)
    assert torch.equal(out2[:, :3], out[:, :3]) and not torch.allclose(out2[:, 3:7], out[:, 3:7])
    from vlforge.memory.probe import saved_bytes

    kept = saved_bytes(lambda: varlen_attention(None, q, k, v, None, cu_seq_lens_q=cu))[0]
    assert kept < 4 * 10 * 10 * 4 * 4  # far below one fp32 (heads x L x L) score tensor per head group


def test_grouped_kv_heads_and_a_pad_tail():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 9, 8)
    k, v = torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    out, _ = varlen_attention(None, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 5, 7]))  # tokens 7-8: pad tail
    rep = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    tail = torch.nn.functional.scaled_dot_product_attention(q[:, :, 7:], rep[0][:, :, 7:], rep[1][:, :, 7:],
                                                            is_causal=True)
    assert torch.allclose(out[:, 7:].transpose(1, 2), tail, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_packed_row_equals_one_sdpa_call_per_sample():
    """On CUDA the torch varlen kernel (where the installed torch has it) gives each sample's own attention."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 8, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 100, 180, 300], device="cuda")
    out, _ = varlen_attention(None, q, k, v, None, cu_seq_lens_q=cu)
    for a, b in [(0, 100), (100, 180), (180, 300)]:
        alone = torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b],
                                                                 is_causal=True)
        assert torch.allclose(out[:, a:b].transpose(1, 2).float(), alone.float(), atol=2e-2)


def test_causal_keyword_follows_the_installed_signature(monkeypatch):
    """torch's varlen kernel spells causality by version (window_size=(-1, 0) or is_causal=True); a signature
    with neither must not be used (a non-causal call would let tokens see the future)."""
    import sys
    import types

    from vlforge.models import varlen

    def fake(params: str):
        namespace: dict = {}
        exec(f"def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, {params}): pass", namespace)
        module = types.ModuleType("torch.nn.attention.varlen")
        module.varlen_attn = namespace["varlen_attn"]
        return module

    for params, causal, bidirectional in (
            ("scale=None, window_size=(-1, -1)", {"window_size": (-1, 0), "scale": None}, {"scale": None}),
            ("is_causal=False, scale=None", {"is_causal": True, "scale": None}, {"scale": None}),
            ("return_aux=None", None, {})):
        monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", fake(params))
        monkeypatch.setattr(varlen, "_OPTIONS", [])
        assert varlen._kernel_options(True) == causal, params
        assert varlen._kernel_options(False) == bidirectional, params


@pytest.mark.parametrize("causal", [True, False])
def test_packed_attention_op_passes_torch_opcheck_and_equals_eager(causal):
    """The op ``torch.compile`` sees (``torch.ops.vlforge.packed_attention``): torch's own checks of its schema,
    fake (shape) kernel and autograd registration, and its gradients equal autograd through the eager path."""
    from vlforge.models.varlen import _attend, packed_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 11, 4, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 3, 8, 11])
    torch.library.opcheck(packed_attention, (q, k, v, cu, 0.3, causal))
    out = packed_attention(q, k, v, cu, 0.3, causal)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    eager = _attend(q, k, v, cu, 0.3, causal)
    want = torch.autograd.grad(eager, (q, k, v), grad)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    first = torch.nn.functional.scaled_dot_product_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], is_causal=causal,
                                                             scale=0.3)
    torch.testing.assert_close(out[:, :3].transpose(1, 2), first)  # a sample sees itself only


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe",
                                    "glm4v"])
def test_vision_tower_through_the_packed_op_equals_its_sdpa_path(family, tiny_checkpoint, monkeypatch):
    """``use_for_vision`` (what ``model.compile`` switches the towers to) against transformers' own SDPA per-image
    loop: two pictures of other sizes, the features and the tower's gradients, in every family."""
    import numpy as np
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vlforge.models import varlen
    from vlforge.models.varlen import VISION_ATTENTION_NAME, _attend, use_for_vision

    path = tiny_checkpoint(family)
    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa")
    processor = AutoProcessor.from_pretrained(path)
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in ((64, 96), (48, 48))]
    inputs = processor.image_processor(images=pictures, return_tensors="pt")
    assert inputs["image_grid_thw"].shape[0] == 2

    def features():
        model.zero_grad(set_to_none=True)
        out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        sum(t.square().sum() for t in tensors).backward()
        return tensors, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    stock, stock_grads = features()
    calls = []
    monkeypatch.setattr(varlen, "_attend", lambda *a: calls.append(a[-1]) or _attend(*a))
    assert use_for_vision(model) and model.config.vision_config._attn_implementation == VISION_ATTENTION_NAME
    ours, grads = features()
    blocks = sum(type(m).__name__.endswith("VisionBlock") for m in model.modules())
    assert calls == [False] * blocks  # every block, bidirectional
    assert len(ours) == len(stock) and stock_grads.keys() == grads.keys() and grads
    for a, b in zip(ours, stock, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], stock_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_packed_attention_under_autocast_takes_what_eager_autocast_gives_it():
    """A compiled graph runs its ops with autocast off: the op's caller casts q/k/v as autocast casts SDPA's (here
    q and k in float32 beside a bfloat16 v, as a q/k norm with float32 weights leaves them); aot_eager is dynamo +
    AOTAutograd without inductor's C++ builds."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    v = torch.randn(1, 2, 9, 4).bfloat16()
    cu = torch.tensor([0, 4, 9])

    def attend(q, k, v):
        return varlen_attention(None, q, k, v, None, cu_seq_lens_q=cu)[0]

    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = attend(q, k, v)
        compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)(q, k, v)
    assert eager.dtype == compiled.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, eager)


def test_cached_bounds_follow_an_in_place_edit_of_the_row_tensor():
    """Bounds are cached per row tensor (read once per forward, not per layer); a write into that tensor, seen
    through it or a view of its memory, is a new row."""
    from vlforge.models.varlen import _bounds

    cu = torch.tensor([0, 2, 6])
    assert _bounds(cu, 6) == ([(0, 2), (2, 6)], False)
    cu.copy_(torch.tensor([0, 4, 6]))
    assert _bounds(cu[:], 6) == ([(0, 4), (4, 6)], False)
    assert _bounds(cu, 6) == ([(0, 4), (4, 6)], False)
