"""Every LMMS Engine key vlforge honours changes what the trainer does (issue 18).

Configs are written in LMMS Engine's layout and go through vlforge's real loader, trainer, data pipeline and
torch.distributed (gloo); each test sets a key away from its default and checks the effect.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest
import torch
from trainkit import DATASET, exported_weights, free_port, run_training, write_config

from vlforge.config import load_config, resolve_config
from vlforge.config.data import data_config
from vlforge.dist import DistContext, init_distributed
from vlforge.errors import ConfigError
from vlforge.train import trainer as trainer_module
from vlforge.train.model_setup import fsdp_mesh, precision_policy, prepare_model
from vlforge.train.optim import build_optimizer, build_scheduler, lr_multiplier
from vlforge.train.trainer import Trainer, pin_batch, run


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


def lmms(tmp: Path, model: Path, *, data: dict | None = None, args: dict | None = None,
         model_config: dict | None = None) -> Path:
    """An LMMS Engine config of a short fp32-free tiny run (bf16: true is LMMS Engine's pure bf16)."""
    cfg = {
        "trainer_type": "fsdp2_trainer",
        "dataset_config": {"dataset_type": "vision", "dataset_format": "yaml", "dataset_path": str(DATASET),
                           "shuffle": False, "packing": False, "video_max_frames": 4, "video_max_pixels": 3136,
                           "processor_config": {"processor_name": str(model), "processor_type": "qwen3_vl",
                                                "extra_kwargs": {"image_max_pixels": 12544}},
                           **(data or {})},
        "model_config": {"load_from_pretrained_path": str(model), **(model_config or {})},
        "trainer_args": {"output_dir": str(tmp / "out"), "per_device_train_batch_size": 1, "max_steps": 3,
                         "learning_rate": 1e-3, "lr_scheduler_type": "constant", "bf16": True, "report_to": "none",
                         "logging_steps": 1, "save_steps": 100, **(args or {})},
    }
    tmp.mkdir(parents=True, exist_ok=True)
    return write_config(tmp / "lmms.yaml", cfg)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(out: Path) -> list[str]:
    return sorted((p.name for p in out.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))


# ---- runs: logging_first_step, save_strategy, overwrite_config, learning_rate 0 --------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_path):
    """The same 3-step run with the keys at LMMS Engine's defaults and set away from them."""
    root = tmp_path_factory.mktemp("honoured")
    common = {"logging_steps": 3, "save_steps": 1}
    base = lmms(root / "base", model_path, args=common)
    moved = lmms(root / "moved", model_path,
                 args={**common, "logging_first_step": True, "save_strategy": "no"},
                 model_config={"overwrite_config": {"vlforge_marker": 7, "use_cache": False}})
    for config in (base, moved):
        run(load_config(config), progress=False)
    return root / "base" / "out", root / "moved" / "out"


def test_logging_first_step(runs):
    base, moved = runs
    assert [r["step"] for r in _records(base) if "loss" in r] == [3]
    assert [r["step"] for r in _records(moved) if "loss" in r] == [1, 3]


def test_save_strategy_no_keeps_the_final_checkpoint_only(runs):
    base, moved = runs
    assert _checkpoints(base) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]  # steps: every save_steps
    assert _checkpoints(moved) == ["checkpoint-3"]


def test_overwrite_config_reaches_the_model_and_the_export(runs):
    base, moved = runs
    exported = json.loads((moved / "final" / "config.json").read_text())
    assert exported["vlforge_marker"] == 7 and exported["use_cache"] is False
    assert "vlforge_marker" not in json.loads((base / "final" / "config.json").read_text())


def test_save_strategy_epoch_saves_at_each_epoch_end(tmp_path, model_path):
    # 10 samples, 5 per optimiser step: 2 steps per epoch, 2 epochs
    config = lmms(tmp_path, model_path, args={"max_steps": -1, "num_train_epochs": 2, "per_device_train_batch_size": 5,
                                             "save_strategy": "epoch", "save_steps": 3, "learning_rate": 1e-4})
    result = run(load_config(config), progress=False)
    assert result.steps == 4
    assert _checkpoints(tmp_path / "out") == ["checkpoint-2", "checkpoint-4"]  # not save_steps' checkpoint-3


def test_learning_rate_zero_is_allowed_warns_and_trains_nothing(tmp_path, model_path):
    config = lmms(tmp_path, model_path, args={"learning_rate": 0, "max_steps": 1, "bf16": False},
                  data={"dataset_type": "vision"})
    resolved = resolve_config(config, ["fsdp.param_dtype=float32", "fsdp.output_dtype=null"])
    assert any(w.startswith("training.learning_rate: 0 trains nothing") for w in resolved.warnings)
    run(resolved.config, progress=False)
    before, after = exported_weights(model_path), exported_weights(tmp_path / "out" / "final")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


# ---- optimizer and schedule ----------------------------------------------------------------------------------

def test_optim_picks_the_fused_or_the_foreach_adamw(tmp_path, model_path):
    params = [torch.nn.Parameter(torch.ones(3))]
    for name, fused in (("adamw_torch_fused", True), ("adamw_torch", False)):
        cfg = load_config(lmms(tmp_path, model_path, args={"optim": name}))
        optimizer = build_optimizer(params, cfg.training, torch.device("cpu"))
        assert bool(optimizer.defaults["fused"]) is fused and bool(optimizer.defaults["foreach"]) is not fused
    resolved = resolve_config(lmms(tmp_path, model_path, args={"optim": "adafactor"}))
    assert resolved.config.training.optim == "adamw_torch_fused"
    assert any(w.startswith("trainer_args.optim: \"adafactor\" has no effect") for w in resolved.warnings)


def test_lr_scheduler_kwargs_shape_the_schedule(tmp_path, model_path):
    plain = load_config(lmms(tmp_path, model_path, args={"lr_scheduler_type": "cosine"}))
    floor = load_config(lmms(tmp_path, model_path, args={"lr_scheduler_type": "cosine",
                                                        "lr_scheduler_kwargs": {"min_lr_ratio": 0.2}}))

    def lrs(cfg):
        optimizer = build_optimizer([torch.nn.Parameter(torch.ones(2))], cfg.training, torch.device("cpu"))
        scheduler = build_scheduler(optimizer, cfg.training, total=10)
        out = []
        for _ in range(11):
            out.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return out

    assert lrs(plain)[-1] == pytest.approx(0.0) and lrs(floor)[-1] == pytest.approx(2e-4)
    # LMMS Engine's wsd: warm-up, 90% of the rest stable, then a cosine decay
    wsd = load_config(lmms(tmp_path, model_path, args={"lr_scheduler_type": "wsd", "warmup_steps": 2}))
    assert wsd.training.lr_scheduler_kwargs["stable_ratio"] == 0.9
    kw = wsd.training.lr_scheduler_kwargs
    values = [lr_multiplier(s, "wsd", total=22, warmup=2, kwargs=kw) for s in range(23)]
    assert values[1] == 0.5 and values[2:20] == [1.0] * 18 and values[21] == pytest.approx(0.5) and values[22] == 0
    # constant warms up from 1% as LMMS Engine's LinearLR does; without warm-up: the set rate
    constant = load_config(lmms(tmp_path, model_path, args={"warmup_steps": 4}))
    assert lr_multiplier(0, "constant", total=9, warmup=4, kwargs=constant.training.lr_scheduler_kwargs) == 0.01
    assert lr_multiplier(0, "constant", total=9, warmup=0, kwargs=constant.training.lr_scheduler_kwargs) == 1.0


def test_schedules_equal_lmms_engines_own_functions():
    """vlforge's formulas against LMMS Engine 0.1.4's (run in its venv) when the peer is built."""
    import subprocess
    import sys

    from cfgkit import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    import peer_env

    python = peer_env.peer_python()
    if python is None:
        pytest.skip("LMMS Engine's venv is not built (python3 scripts/peer_env.py build)")
    cases = [("cosine", 20, 3, {"min_lr_ratio": 0.1, "num_cycles": 0.5}), ("wsd", 30, 4, {"stable_ratio": 0.8}),
             ("wsd", 30, 0, {"min_lr_ratio": 0.05}), ("constant", 10, 4, {})]
    code = (
        "import json, sys, torch\n"
        "from lmms_engine.utils import fsdp2_utils as u\n"
        "out = []\n"
        "for kind, total, warm, kw in json.loads(sys.argv[1]):\n"
        "    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)\n"
        "    if kind == 'cosine': s = u.get_cosine_schedule_with_warmup(opt, warm, total, **kw)\n"
        "    elif kind == 'wsd': s = u.get_wsd_schedule_with_warmup(opt, warm, total, **kw)\n"
        "    else: s = u.get_constant_schedule(opt, warm, **kw)\n"
        "    lrs = []\n"
        "    for _ in range(total): lrs.append(s.get_last_lr()[0]); opt.step(); s.step()\n"
        "    out.append(lrs)\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([str(python), "-c", code, json.dumps(cases)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    defaults = {"wsd": {"stable_ratio": 0.9, "decay": "cosine"}, "constant": {"start_factor": 0.01}}
    for (kind, total, warm, kw), expected in zip(cases, theirs, strict=True):
        mine = [lr_multiplier(s, kind, total=total, warmup=warm, kwargs={**defaults.get(kind, {}), **kw})
                for s in range(total)]
        assert mine == pytest.approx(expected, abs=1e-12), kind


# ---- data: data_seed, video_min_pixels, image pixels, vision_iterable -----------------------------------------

def test_data_seed_orders_the_mixture(tmp_path, model_path):
    from vlforge.data.config import ResolvedEntry
    from vlforge.data.mixture import Mixture

    for name in "ab":
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"k": f"{name}{i}"}) + "\n" for i in range(8)))
    entries = [ResolvedEntry(tmp_path / f"{n}.jsonl", tmp_path, "jsonl", 1.0, None) for n in "ab"]
    orders = {}
    for seed in (1, 2):
        cfg = load_config(lmms(tmp_path, model_path, data={"data_seed": seed}, args={"seed": 42}))
        assert data_config(cfg).seed == seed  # the data order follows data_seed, not trainer_args.seed
        mixture = Mixture(entries, seed=data_config(cfg).seed)
        orders[seed] = [record.record["k"] for _, record in iter(mixture.next, None)]
    assert sorted(orders[1]) == sorted(orders[2]) and orders[1] != orders[2]
    trainer_seed = load_config(lmms(tmp_path, model_path, args={"data_seed": 5}))
    assert data_config(trainer_seed).seed == 5  # trainer_args.data_seed, transformers' sampler seed


def test_video_and_image_pixel_limits_reach_the_data_pipeline(tmp_path, model_path):
    cfg = load_config(lmms(tmp_path, model_path, data={"video_min_pixels": 1568, "processor_config": {
        "processor_name": str(model_path), "processor_type": "qwen3_vl",
        "extra_kwargs": {"image_min_pixels": 784, "image_max_pixels": 4096}}}))
    pipeline = data_config(cfg)
    assert (pipeline.video_min_pixels, pipeline.min_pixels, pipeline.max_pixels) == (1568, 784, 4096)
    default = data_config(load_config(lmms(tmp_path, model_path)))
    assert default.video_min_pixels == 3136  # LMMS Engine's default when the key is left out


def test_vision_iterable_reads_like_vision(tmp_path, model_path):
    cfg = load_config(lmms(tmp_path, model_path, data={"dataset_type": "vision_iterable"}, args={"max_steps": -1}))
    assert cfg.data.streaming is False and cfg.training.max_steps is None  # the steps are counted


# ---- precision: bf16 / fp16, reduce_dtype, output_dtype, hsdp_shard_size --------------------------------------

def test_bf16_means_what_it_means_in_lmms_engine(tmp_path, model_path):
    ctx = init_distributed()
    pure = prepare_model(load_config(lmms(tmp_path, model_path), ["model.token_audit=false"]), ctx)
    assert next(pure.model.parameters()).dtype == torch.bfloat16 and not pure.autocast  # bf16 weights, bf16 compute
    half = prepare_model(load_config(lmms(tmp_path, model_path, args={"bf16": False}), ["model.token_audit=false"]),
                         ctx)
    assert next(half.model.parameters()).dtype == torch.float32  # vlforge keeps fp32 masters
    assert half.autocast and half.compute_dtype == torch.float16  # float16 compute, no loss scaling
    with pytest.raises(Exception, match="bf16 and fp16 are both true"):
        load_config(lmms(tmp_path, model_path, args={"fp16": True}))


def test_output_dtype_casts_every_unit_in_one_process(tmp_path, model_path):
    ctx = init_distributed()
    ids = torch.randint(0, 100, (1, 12))
    dtypes = {}
    for output in ("float32", "bfloat16"):
        cfg = load_config(lmms(tmp_path, model_path, args={"bf16": False, "output_dtype": output}),
                          ["fsdp.param_dtype=float32", "model.token_audit=false"])
        tm = prepare_model(cfg, ctx)
        layers = []
        tm.model.model.language_model.layers[0].register_forward_hook(lambda m, a, o, seen=layers: seen.append(o))
        with torch.no_grad():
            logits = tm.model(input_ids=ids).logits
        dtypes[output] = (logits.dtype, (layers[0][0] if isinstance(layers[0], tuple) else layers[0]).dtype)
    assert dtypes == {"float32": (torch.float32, torch.float32), "bfloat16": (torch.bfloat16, torch.bfloat16)}


def test_reduce_and_output_dtype_make_the_fsdp2_policy(tmp_path, model_path):
    lmms_default = load_config(lmms(tmp_path, model_path))
    policy = precision_policy(lmms_default)
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16,) * 3
    moved = load_config(lmms(tmp_path, model_path, args={"bf16": False, "reduce_dtype": "float32",
                                                        "output_dtype": "float16"}))
    policy = precision_policy(moved)
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (
        torch.float16, torch.float32, torch.float16)


def test_hsdp_shard_size_must_divide_the_ranks(tmp_path, model_path):
    cfg = load_config(lmms(tmp_path, model_path, args={"fsdp_config": {"hsdp_shard_size": 2}}))
    assert cfg.fsdp.hsdp_shard_size == 2
    odd = DistContext(rank=0, world_size=3, local_rank=0, device=torch.device("cpu"), owns_group=False)
    with pytest.raises(ConfigError, match="hsdp_shard_size: 2 does not divide the 3 process"):
        fsdp_mesh(cfg, odd)
    with pytest.raises(Exception, match="pure DDP"):
        load_config(lmms(tmp_path, model_path, args={"fsdp_config": {"hsdp_shard_size": 1}}))


@pytest.mark.slow
def test_hsdp_over_four_gloo_ranks_trains_like_one_process(tmp_path, model_path):
    """2 replicas x 2 shards: the same losses as one process; the log names the mesh."""
    common = {"data": {"packing": False}, "args": {
        "bf16": False, "max_steps": 2, "gradient_accumulation_steps": 1, "max_grad_norm": None,
        "reduce_dtype": "float32", "output_dtype": "float32", "fsdp_config": {"hsdp_shard_size": 2}}}
    four = lmms(tmp_path / "four", model_path, **common)
    one_args = {**common["args"], "gradient_accumulation_steps": 4}
    one = lmms(tmp_path / "one", model_path, data=common["data"], args=one_args)
    overrides = ["fsdp.param_dtype=float32"]
    proc = run_training(four, 4, *overrides)
    assert "HSDP: shard within groups of 2 ranks, replicate across 2 group(s)" in proc.stderr
    run_training(one, 1, *overrides)
    losses = [[r["loss"] for r in _records(p.parent / "out") if "loss" in r] for p in (four, one)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-5)


# ---- process group: use_cpu, ddp_timeout; pinned memory -------------------------------------------------------

def test_use_cpu_and_ddp_timeout_reach_the_process_group(tmp_path, model_path, monkeypatch):
    seen = []
    real = trainer_module.init_distributed

    def spy(**kwargs):
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(trainer_module, "init_distributed", spy)
    Trainer(load_config(lmms(tmp_path, model_path, args={"use_cpu": True, "ddp_timeout": 42})), progress=False)
    Trainer(load_config(lmms(tmp_path, model_path)), progress=False)
    assert seen[0] == {"device": torch.device("cpu"), "timeout": datetime.timedelta(seconds=42)}
    assert seen[1] == {"device": None, "timeout": datetime.timedelta(seconds=1800)}


def _late_barrier(rank: int, port: int, timeout: float, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    ctx = init_distributed(device=torch.device("cpu"), timeout=datetime.timedelta(seconds=timeout))
    if rank == 1:
        time.sleep(timeout * 3)  # never joins the barrier in time
        out.put((rank, "slept", 0.0))
        return
    start = time.monotonic()
    try:
        ctx.barrier()
        out.put((rank, "passed", time.monotonic() - start))
    except Exception:
        out.put((rank, "timed out", time.monotonic() - start))


def test_ddp_timeout_is_the_collective_timeout():
    """Rank 1 skips the barrier: rank 0 gives up after the configured seconds, not torch's 30 minutes."""
    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    procs = [context.Process(target=_late_barrier, args=(rank, port, 2.0, out)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    results = {}
    for _ in procs:
        rank, what, seconds = out.get(timeout=120)
        results[rank] = (what, seconds)
    for proc in procs:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    assert results[0][0] == "timed out" and 1.5 < results[0][1] < 6.0, results


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory serves copies to a CUDA device")
def test_dataloader_pin_memory_pins_batches_on_cuda(tmp_path, model_path):
    on = Trainer(load_config(lmms(tmp_path, model_path, args={"dataloader_pin_memory": True})), progress=False)
    off = Trainer(load_config(lmms(tmp_path, model_path, args={"dataloader_pin_memory": False})), progress=False)
    assert on.pin and not off.pin
    batch = pin_batch({"input_ids": torch.ones(1, 4, dtype=torch.long), "n": 3})
    assert batch["input_ids"].is_pinned() and batch["n"] == 3


def test_pin_memory_is_off_on_the_cpu(tmp_path, model_path):
    cfg = load_config(lmms(tmp_path, model_path, args={"dataloader_pin_memory": True, "use_cpu": True}))
    assert cfg.dataloader_pin_memory is True
    assert not Trainer(cfg, progress=False).pin  # nothing to pin for: the batches stay on the CPU


def test_fsdp2_false_still_shards_like_lmms_engines_fsdp2_trainer(tmp_path, model_path):
    cfg = load_config(lmms(tmp_path, model_path, args={"fsdp2": False}))
    assert cfg.fsdp.fsdp2 is True
