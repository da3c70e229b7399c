"""Ulysses sequence parallelism: SP=2 on 2 gloo ranks equals one process (loss and gradients), and its errors.

The slow tests launch this file under ``torchrun`` as a worker (``python -m torch.distributed.run ...
test_trainer_sp.py WORKDIR``): every rank computes one step's token-mean loss and full gradients of
the first matching batch and rank 0 saves them; the test computes the same in this process with SP=1.
A case is ``CASE`` (the spec's ``model``) or ``FAMILY:CASE`` (the spec's ``models[FAMILY]``), so one
launch serves several families (tests/train/test_trainer_sp_families.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainkit import REPO, free_port, tiny_config, train_env

from vlforge.config.parallel import check_sequence_parallel
from vlforge.config.schema import TrainConfig
from vlforge.errors import ConfigError
from vlforge.train.sp import block_causal_mask, segment_ids, shard_bounds, text_model
from vlforge.train.trainer import Trainer

CASES = {
    # An unpacked sample with an image (deepstack features on some shards only).
    "image": {"packing": {"packing": False}},
    # An unpacked sample with a video (Qwen2.5-VL: mrope positions scaled by second_per_grid_ts).
    "video": {"packing": {"packing": False}},
    # A packed row of images, a video and text: sample boundaries must survive the exchange.
    "packed": {"packing": {"packing": True, "packing_length": 400}},
    # Two right-padded samples in one batch: the (B, 1, L, L) mask path instead of per-sample attention.
    "padded": {"packing": {"packing": False}, "training": {"per_device_train_batch_size": 2}},
    # A packed row with recomputation: the all-to-alls run again inside the backward.
    "packed_gc": {"packing": {"packing": True, "packing_length": 400}, "model": {"gradient_checkpointing": True}},
}
#: Mixture-of-experts cases: the router's load-balancing loss on (a whole-sequence statistic, summed over the group).
_ROUTER = {"model": {"overwrite_config": {"output_router_logits": True, "router_aux_loss_coef": 0.02}}}
CASES |= {f"router_{case}": {**CASES[case], **_ROUTER} for case in ("packed", "padded")}

#: Qwen3-VL's cases (its packed row holds the video).
QWEN3_CASES = ("image", "packed", "padded", "packed_gc")


def _wanted(case: str, batch: dict[str, Any]) -> bool:
    case = case.removeprefix("router_")
    if case == "image":
        return "pixel_values" in batch
    if case == "video":
        return "pixel_values_videos" in batch
    if case == "padded":
        return batch["input_ids"].shape[0] == 2 and not bool(batch["attention_mask"].all())
    return "image_grid_thw" in batch and len(batch["sample_ids"]) >= 3


def _first_batch(trainer: Trainer, case: str) -> dict[str, Any]:
    for batch in trainer.stream:
        if _wanted(case, batch):
            return batch
    raise AssertionError(f"no {case} batch in the example data")


def _full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def step_loss_and_grads(trainer: Trainer, batch: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    """Global token-mean loss and the full gradient of one micro-batch (collective under torchrun)."""
    trainer.model.zero_grad(set_to_none=True)
    count, loss_sum = trainer.accumulate([batch])
    total = trainer.ctx.all_reduce_sum(loss_sum.clone())
    grads = {name: _full(p.grad).detach().clone() for name, p in trainer.model.named_parameters()
             if p.grad is not None}
    return float(total / count), grads


def _config(root: Path, model_path: Path, case: str, degree: int, **extra: dict) -> TrainConfig:
    cfg = tiny_config(root / f"out-{case}-{degree}", model_path, **CASES[case], **extra)
    cfg["sp_ulysses_degree"] = degree
    return TrainConfig.model_validate(cfg)


def result_file(workdir: Path, entry: str) -> Path:
    """Where the worker saves the SP result of ``entry`` (``CASE`` or ``FAMILY:CASE``)."""
    return workdir / f"sp-{entry.replace(':', '-')}.pt"


def worker(workdir: Path) -> None:
    """torchrun entry: SP over all ranks for every case; rank 0 writes :func:`result_file`."""
    spec = json.loads((workdir / "spec.json").read_text())
    for entry in spec["cases"]:
        family, _, case = entry.rpartition(":")
        model = spec["models"][family] if family else spec["model"]
        cfg = _config(workdir, Path(model), case, spec["degree"], **spec.get("extra", {}))
        trainer = Trainer(cfg, progress=False, export=False)
        trainer.setup()
        assert trainer.sp is not None and trainer.ctx.data_world == trainer.ctx.world_size // spec["degree"]
        batch = _first_batch(trainer, case)
        loss, grads = step_loss_and_grads(trainer, batch)
        if trainer.ctx.is_main:
            torch.save({"loss": loss, "grads": grads, "sample_ids": batch["sample_ids"],
                        "length": int(batch["input_ids"].shape[1]), "router_aux": float(trainer.step_router_aux)},
                       result_file(workdir, entry))
        trainer.stream.close()
    trainer.ctx.close()


def run_sp(workdir: Path, model_path: Path | dict[str, Path], nproc: int, degree: int, cases: list[str],
           **extra: dict) -> None:
    """One torchrun launch of :func:`worker`; ``model_path`` is one checkpoint or ``{family: checkpoint}``."""
    workdir.mkdir(parents=True, exist_ok=True)
    models = {"models": {k: str(v) for k, v in model_path.items()}} if isinstance(model_path, dict) else {
        "model": str(model_path)}
    (workdir / "spec.json").write_text(json.dumps({**models, "degree": degree, "cases": cases, "extra": extra}))
    import warmstart  # tests/ (not on this file's path when it runs as a torchrun worker)

    command = [warmstart.python(), "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(free_port()), str(Path(__file__).resolve()), str(workdir)]
    proc = subprocess.run(command, env=train_env(), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


@pytest.fixture(scope="module")
def sp2_results(tmp_path_factory, model_path):
    workdir = tmp_path_factory.mktemp("sp2")
    run_sp(workdir, model_path, 2, 2, list(QWEN3_CASES))
    return workdir


def compare(reference: tuple[float, dict[str, torch.Tensor]], saved: dict[str, Any]) -> None:
    loss, grads = reference
    assert saved["loss"] == pytest.approx(loss, rel=1e-5)
    assert saved["grads"].keys() == grads.keys()
    scale = max(float(g.abs().max()) for g in grads.values())
    worst = max(float((saved["grads"][k] - grads[k]).abs().max()) for k in grads)
    assert worst <= 1e-4 * scale, (worst, scale)
    vision = [k for k in grads if ".visual." in k]
    assert vision and any(float(grads[k].abs().max()) > 0 for k in vision)  # the tower is in the comparison


def one_process(tmp_path: Path, model_path: Path, case: str, saved: dict[str, Any]) -> None:
    """SP=1 loss and gradients of the same batch in this process equal ``saved`` (the SP run's)."""
    trainer = Trainer(_config(tmp_path, model_path, case, 1), progress=False, export=False)
    trainer.setup()
    batch = _first_batch(trainer, case)
    trainer.stream.close()
    assert batch["sample_ids"] == saved["sample_ids"]
    compare(step_loss_and_grads(trainer, batch), saved)
    assert saved["router_aux"] == pytest.approx(float(trainer.step_router_aux), rel=1e-5)
    assert (saved["router_aux"] > 0) == case.startswith("router_")  # the router loss is on exactly there


@pytest.mark.slow
@pytest.mark.parametrize("case", QWEN3_CASES)
def test_sp2_on_two_ranks_equals_one_process(tmp_path, model_path, sp2_results, case):
    saved = torch.load(result_file(sp2_results, case), weights_only=False)
    if case == "packed":
        assert saved["length"] % 2 == 1  # the row is padded to the degree
    one_process(tmp_path, model_path, case, saved)


@pytest.mark.slow
def test_sp4_repeats_the_two_kv_heads(tmp_path, model_path):
    """Degree 4 over the tiny model's 4 query / 2 k-v heads: k and v are repeated before the exchange."""
    run_sp(tmp_path / "sp4", model_path, 4, 4, ["packed"])
    saved = torch.load(tmp_path / "sp4" / "sp-packed.pt", weights_only=False)
    one_process(tmp_path, model_path, "packed", saved)


def _losses(output_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [record["loss"] for record in records if "loss" in record]


@pytest.mark.slow
@pytest.mark.parametrize(("nproc", "degree", "packed"), [(2, 2, True), (4, 2, False)], ids=["sp2", "dp2xsp2"])
def test_training_with_sp_matches_one_process(tmp_path, model_path, nproc, degree, packed):
    """`vlforge.train` end to end: same logged losses and exported weights as one process (dp x accumulation).

    The 2x2 mesh runs unpacked samples: packing happens per data shard, so packed rows of 2 shards
    differ from those of one process, while single samples are dealt identically.
    """
    check_training_matches(tmp_path, model_path, nproc, degree, packed)


def check_training_matches(tmp_path: Path, model_path: Path, nproc: int, degree: int, packed: bool) -> None:
    """SP training run == one process (losses, export); its checkpoint-1 resumed without SP continues it."""
    from trainkit import exported_weights, max_abs_diff, run_training, write_config

    dp = nproc // degree
    packing = {"packing": True, "packing_length": 200} if packed else {"packing": False}
    sp_cfg = tiny_config(tmp_path / "sp", model_path, packing=packing, training={"max_steps": 2},
                         checkpointing={"save_steps": 1})
    sp_cfg["sp_ulysses_degree"] = degree
    run_training(write_config(tmp_path / "sp.yaml", sp_cfg), nproc)
    ref_cfg = tiny_config(tmp_path / "ref", model_path, packing=packing,
                          training={"max_steps": 2, "gradient_accumulation_steps": dp})
    run_training(write_config(tmp_path / "ref.yaml", ref_cfg), 1)
    assert _losses(tmp_path / "sp") == pytest.approx(_losses(tmp_path / "ref"), rel=1e-5)
    weights_sp, weights_ref = exported_weights(tmp_path / "sp" / "final"), exported_weights(tmp_path / "ref" / "final")
    assert max_abs_diff(weights_ref, exported_weights(model_path)) > 1e-4
    assert max_abs_diff(weights_sp, weights_ref) < 1e-5
    exported = json.loads((tmp_path / "sp" / "final" / "config.json").read_text())
    assert "vlforge" not in json.dumps(exported)  # the Ulysses attention hook is not written into the export

    # Resume the SP run's first checkpoint in one process without SP: same second step, same final weights.
    resumed_cfg = TrainConfig.model_validate({**ref_cfg, "checkpointing": {
        "output_dir": str(tmp_path / "resumed"), "resume": str(tmp_path / "sp" / "checkpoint-1")}})
    trainer = Trainer(resumed_cfg, progress=False)
    result = trainer.train()
    assert result.steps == 2 and result.resumed_from == tmp_path / "sp" / "checkpoint-1"
    assert _losses(tmp_path / "resumed") == pytest.approx(_losses(tmp_path / "ref")[1:], rel=1e-5)
    assert max_abs_diff(exported_weights(result.export_dir), weights_ref) < 1e-5


# -- fast: pieces and errors ---------------------------------------------------------------------------
def test_shards_cover_the_padded_sequence():
    assert [shard_bounds(7, 2, r) for r in range(2)] == [(0, 4), (4, 8)]
    assert [shard_bounds(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_block_causal_mask_never_crosses_samples_or_pads():
    seg = segment_ids(torch.tensor([0, 2, 4], dtype=torch.int32), None, 6)
    mask = block_causal_mask(seg)[0, 0]
    assert mask.shape == (6, 6)
    assert mask[1, 0] and not mask[0, 1]  # causal inside sample 0
    assert not mask[2, 1] and mask[3, 2]  # sample 1 never sees sample 0
    assert mask[4, 4] and mask[5, 5] and not mask[5, 4] and not mask[4, 3]  # each pad sees only itself
    left_padded = segment_ids(None, torch.tensor([[0, 1, 1]]), 4)
    assert left_padded[0, 1] == left_padded[0, 2] and len(set(left_padded[0].tolist())) == 3


def test_degree_must_divide_the_processes():
    check_sequence_parallel(2, family="qwen3_vl", heads=4, world=4)
    with pytest.raises(ConfigError, match=r"sp_ulysses_degree: 2 does not divide the 3 process\(es\)"):
        check_sequence_parallel(2, family="qwen3_vl", heads=4, world=3)
    with pytest.raises(ConfigError, match=r"does not divide the 1 process\(es\)"):
        check_sequence_parallel(2, family="qwen3_vl", heads=4, world=1)


def test_unsupported_family_and_heads_are_refused():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text = {"hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 3,
            "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 128}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 1, "out_hidden_size": 48,
              "deepstack_visual_indexes": [0]}
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision))
    heads = model.config.get_text_config().num_attention_heads
    with pytest.raises(ConfigError, match=r"does not divide the 3 attention heads of the text model"):
        check_sequence_parallel(2, family="qwen3_vl", heads=heads, world=2)
    check_sequence_parallel(3, family="qwen3_vl", heads=heads, world=3)
    assert text_model(model) is model.model.language_model
    with pytest.raises(ConfigError, match=r"not supported for model family 'llava' \(supported: qwen2_vl, qwen2_5_vl, "
                                          r"qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe, glm4v, glm4v_moe\); set sp_ulysses_degree: 1"):
        check_sequence_parallel(2, family="llava", heads=heads, world=2)


def test_one_process_with_sp2_fails_before_loading(tmp_path, model_path):
    trainer = Trainer(_config(tmp_path, model_path, "image", 2), progress=False, export=False)
    with pytest.raises(ConfigError, match=r"sp_ulysses_degree: 2 does not divide the 1 process"):
        trainer.setup()
    assert trainer.tm is None and not trainer.ready


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
