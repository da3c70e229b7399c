"""``load(path_or_preset)``: the one loader every vlforge command uses.

Sources, tried in this order:
- ``tiny:FAMILY[+untied][@SEED]`` - a tiny checkpoint (see :mod:`vlforge.models.tiny`), written once
  into the ``tiny/`` folder of vlforge's cache (:func:`vlforge.outputs.cache_root`) and then loaded from disk.
- ``real:NAME[@SEED]`` - a real-size preset (see :mod:`vlforge.models.presets`): its directory holds the
  config, tokenizer and processor only (no weights); :func:`load` builds the model with random weights after
  checking that they fit in the memory of the target device.
- a local directory holding ``config.json``;
- anything else that looks like ``org/name`` - a Hugging Face Hub id (fetched with
  ``huggingface_hub.snapshot_download``; without network this is a :class:`ModelLoadError`).

The model comes from ``AutoModelForImageTextToText`` (``AutoModelForCausalLM`` for text-only
checkpoints), in eval mode, on ``device``; ``trust_remote_code`` stays off unless asked for.

Example (CPU, a few seconds):
    >>> from vlforge.models import load
    >>> loaded = load("tiny:qwen3_vl@0")                               # doctest: +SKIP
    >>> loaded.family, loaded.model.training                            # doctest: +SKIP
    ('qwen3_vl', False)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from vlforge.errors import ConfigError, ModelLoadError
from vlforge.models import tiny
from vlforge.models.compat import ensure_processor_support
from vlforge.models.families import check_transformers
from vlforge.models.presets import PRESET_PREFIX, REAL_PREFIX, parse_preset
from vlforge.models.readers import read_processor, read_tokenizer
from vlforge.models.refs import DTYPE_NAMES, local_checkpoint
from vlforge.outputs import cache_root, file_lock

logger = logging.getLogger(__name__)




@dataclass
class LoadedModel:
    """What :func:`load` returns."""

    model: Any
    """The ``PreTrainedModel``, in eval mode."""
    processor: Any | None
    """The ``ProcessorMixin`` (None for text-only checkpoints or ``processor=False``)."""
    tokenizer: Any | None
    source: str
    """What the caller asked for (preset, path or hub id)."""
    path: Path
    """Local directory the checkpoint was read from."""
    family: str
    """``config.model_type``, e.g. ``qwen3_vl``."""


def parse_dtype(dtype: Any):
    """A torch dtype (or ``"auto"``) from a string such as ``"bf16"`` or a torch dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key == "auto":
            return "auto"
        if key in DTYPE_NAMES:
            return getattr(torch, DTYPE_NAMES[key])
    raise ConfigError(
        f"unknown dtype {dtype!r}; use one of {', '.join(sorted(set(DTYPE_NAMES) | {'auto'}))} or a torch.dtype"
    )


def preset_dir(preset: str) -> Path:
    """Cache directory of a ``tiny:`` preset (written or not); its name hashes what would be written."""
    return _preset(preset)[0]


def preset_path(preset: str) -> Path:
    """Cache directory of a ``tiny:`` preset, written on first use."""
    path, family, seed, tied = _preset(preset)
    name = path.name
    if not (path / tiny.MARKER).is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path.parent / f".{name}.lock"):  # ranks of one job may ask at the same time
            if not (path / tiny.MARKER).is_file():
                logger.info("writing the tiny %s checkpoint of preset %s (once, a few seconds)", family, preset)
                tiny.write_tiny(family, path, seed=seed, tie_word_embeddings=tied)
    return path


def _preset(preset: str) -> tuple[Path, str, int, bool]:
    family, seed, tied = parse_preset(preset)
    import transformers

    fingerprint = json.dumps(
        [tiny.fingerprint(family), tied, transformers.__version__, tiny.VOCAB_MULTIPLE,
         tiny.FILES_VERSION], sort_keys=True
    )
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]
    name = f"{family}{'' if tied else '+untied'}-seed{seed}-{digest}"
    return cache_root() / "tiny" / name, family, seed, tied


REAL_MARKER = "vlforge_real.json"


def real_preset_path(preset: str) -> Path:
    """Cache directory of a ``real:`` preset: config.json, tokenizer and processor files, no weights."""
    from vlforge.models import presets

    name, spec, _seed = presets.parse_real(preset)
    import transformers

    fingerprint = json.dumps([spec._asdict(), transformers.__version__, tiny.FILES_VERSION], sort_keys=True)
    path = cache_root() / "real" / f"{name}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:10]}"
    if not (path / REAL_MARKER).is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path.parent / f".{path.name}.lock"):
            if not (path / REAL_MARKER).is_file():
                from vlforge.outputs import staged_dir

                tokenizer = tiny.build_tokenizer(spec.family)
                config = presets.real_config(name, tokenizer)
                processor = tiny.build_processor(spec.family, tokenizer)
                with staged_dir(path, writer="real") as staging:
                    config.save_pretrained(staging)
                    processor.save_pretrained(staging)
                    marker = {"preset": name, "checkpoint": spec.checkpoint, "weights": "random at load time"}
                    (staging / REAL_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return path


def resolve(path_or_preset: str | os.PathLike[str]) -> Path:
    """The local checkpoint directory of a preset, a directory or a hub id."""
    text = os.fspath(path_or_preset)
    if text.startswith(PRESET_PREFIX):
        return preset_path(text)
    if text.startswith(REAL_PREFIX):
        return real_preset_path(text)
    local = local_checkpoint(text)
    if local is not None:
        return local
    return _download(text)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id))
    except Exception as error:  # network, auth, unknown repo: all mean "cannot load this id"
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(
            f"cannot fetch {repo_id!r} from the Hugging Face Hub ({type(error).__name__}: {first}); "
            "pass a local checkpoint directory or a tiny:FAMILY preset"
        ) from error


def _model_class(config):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


#: ``load(..., shared_processor=True)``'s processors: (directory, trust_remote_code, its files' names, sizes and
#: mtimes) -> (processor, tokenizer), the most recently used last.
_SHARED_PROCESSORS: OrderedDict[tuple[Any, ...], tuple[Any, Any]] = OrderedDict()
_SHARED_PROCESSORS_MAX = 4
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _processor_files(path: Path, trust_remote_code: bool) -> tuple[Any, ...]:
    """What a processor is read from, as a cache key: the directory and its non-weight files' sizes and mtimes."""
    stats = ((entry.name, entry.stat()) for entry in path.iterdir()
             if entry.is_file() and not entry.name.endswith(_WEIGHT_SUFFIXES))
    files = sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)
    return (str(path.resolve()), trust_remote_code, tuple(files))


def load(
    path_or_preset: str | os.PathLike[str],
    *,
    dtype: Any = "float32",
    device: Any = "cpu",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    processor: bool = True,
    tokenizer: bool = True,
    shared_processor: bool = False,
) -> LoadedModel:
    """Load a model (eval mode), its processor and tokenizer from a preset, directory or hub id.

    ``processor=False`` reads the tokenizer alone; with ``tokenizer=False`` too, the model alone (an export copies
    the tokenizer files and never parses them). ``tokenizer=False`` with a processor raises :class:`ConfigError`.

    ``shared_processor``: reuse the processor and tokenizer an earlier ``shared_processor`` load of this process
    read from the same unchanged files (building a Qwen3.5 tokenizer takes seconds); the caller must not change
    them. The trainer loads this way.
    """
    import torch
    from transformers import AutoConfig, PreTrainedTokenizerBase

    if processor and not tokenizer:
        raise ConfigError("load(tokenizer=False) needs processor=False: a processor holds its tokenizer")
    torch_dtype = parse_dtype(dtype)
    try:
        torch_device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"unknown device {device!r}: {error}") from None
    source = os.fspath(path_or_preset)
    path = resolve(path_or_preset)
    ensure_processor_support()
    started = time.perf_counter()
    logger.info("loading %s ...", source)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as error:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {error}") from error
    check_transformers(config.model_type)
    model_class = _model_class(config)
    if source.startswith(REAL_PREFIX):
        model = _random_real(source, config, model_class, torch_dtype, torch_device, attn_implementation)
    else:
        kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        try:
            model = model_class.from_pretrained(path, **kwargs)
        except Exception as error:
            raise ModelLoadError(f"cannot load the model in {path} with {model_class.__name__}: {error}") from error
    model = model.to(torch_device).eval()

    want_tokenizer, loaded_processor, tokenizer = tokenizer, None, None
    key = _processor_files(path, trust_remote_code) if processor and shared_processor else None
    if key is not None and key in _SHARED_PROCESSORS:
        _SHARED_PROCESSORS.move_to_end(key)
        loaded_processor, tokenizer = _SHARED_PROCESSORS[key]
    elif processor:
        try:
            loaded = read_processor(path, trust_remote_code=trust_remote_code)
        except Exception as error:
            raise ModelLoadError(
                f"cannot load the processor in {path}: {error} (pass processor=False to skip it)"
            ) from error
        if isinstance(loaded, PreTrainedTokenizerBase):
            tokenizer = loaded
        else:
            loaded_processor = loaded
            tokenizer = getattr(loaded, "tokenizer", None)
        if key is not None:
            _SHARED_PROCESSORS[key] = (loaded_processor, tokenizer)
            while len(_SHARED_PROCESSORS) > _SHARED_PROCESSORS_MAX:
                _SHARED_PROCESSORS.popitem(last=False)
    elif want_tokenizer and ((path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()):
        tokenizer = read_tokenizer(path, trust_remote_code=trust_remote_code)
    logger.info("loaded %s (%s, %s) from %s in %.1f s", source, config.model_type, torch_dtype, path,
                time.perf_counter() - started)
    return LoadedModel(
        model=model,
        processor=loaded_processor,
        tokenizer=tokenizer,
        source=source,
        path=path,
        family=config.model_type,
    )


def available_bytes(device: torch.device) -> int:
    """Free memory of ``device``: CUDA's free bytes, else the host's MemAvailable (or free physical pages)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _random_real(source: str, config: Any, model_class: Any, dtype: Any, device: Any,
                 attn_implementation: str | None) -> Any:
    """A real-size preset with random weights (seeded), refused when its weights would not fit ``device``."""
    import torch

    from vlforge.models.presets import param_count, parse_real

    name, spec, seed = parse_real(source)
    dtype = torch.float32 if dtype == "auto" else dtype
    params = spec.published_params or param_count(f"real:{name}")
    needed = int(params * dtype.itemsize * 1.1)  # weights + ~10% for buffers and init temporaries
    free = available_bytes(device)
    if needed > free:
        raise ModelLoadError(
            f"{source}: the {dtype_label(dtype)} weights need about {needed / 2**30:.1f} GiB but {device} has "
            f"{free / 2**30:.1f} GiB available; use a smaller preset, dtype=bf16, or plan it with `vlforge plan`"
        )
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        return model_class.from_config(config, dtype=dtype)


def dtype_label(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bf16`` (for messages)."""
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(dtype), str(dtype))


def resolve_device(device: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; a CUDA device that is not there is an error."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ModelLoadError(f"--device {device!r}: {error}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device}: CUDA is not available here")
    return resolved


def load_model_config(ref: str) -> Any:
    """The transformers config of a model reference (tiny preset, local checkpoint, cached hub id); no weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve(ref))
    check_transformers(config.model_type)
    return config
