"""Runtime facts the doctor reasons over: read from this process, never guessed.

Every fact is ``None`` when it cannot be read here (no GPU, package not installed, ...); the report
shows it as "absent". ``--assume key=value,...`` overrides facts for what-if exploration and marks
them as assumed.

Example:
    >>> from vlforge.diagnosis.facts import collect_facts, apply_assume
    >>> facts = apply_assume(collect_facts(), "torch=2.9.1,cudnn=9.10.2,device=cuda,dtype=bf16")
    >>> facts.cudnn, facts.dtype, sorted(facts.assumed)
    (91002, 'bfloat16', ['cudnn', 'device', 'dtype', 'torch'])
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from vlforge.errors import VlforgeError, did_you_mean

if TYPE_CHECKING:
    import torch


class DoctorError(VlforgeError, ValueError):
    """Bad doctor input (an unknown ``--assume`` key, an unparsable value) or an unfixable finding."""


DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32", "f32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
}
"""Accepted spellings of a compute dtype -> canonical torch name."""

MEMORY_FORMATS = {"contiguous": "contiguous", "default": "contiguous", "channels_last_3d": "channels_last_3d",
                  "channels_last": "channels_last"}


@dataclass
class Facts:
    """What the doctor knows about this process; ``None`` means absent (could not be read)."""

    python: str | None = None
    os: str | None = None
    torch: str | None = None
    """torch version string, e.g. ``2.9.1+cu128``."""
    torch_cuda: str | None = None
    """CUDA version torch was built with (``torch.version.cuda``)."""
    cudnn: int | None = None
    """Runtime cuDNN version as torch reports it, e.g. ``91002`` for 9.10.2."""
    device: str | None = None
    """Accelerator type used for the run: ``cuda``, ``xpu``, ``mps``, ``npu`` ... or ``cpu``."""
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None
    """CUDA compute capability (major, minor), e.g. (12, 0) for RTX 5090."""
    bf16_supported: bool | None = None
    tf32_matmul: bool | None = None
    tf32_cudnn: bool | None = None
    cpu_threads: int | None = None
    cpu_capability: str | None = None
    transformers: str | None = None
    flash_attn: str | None = None
    flash_attn_3: str | None = None
    """flash-attention 3 (module ``flash_attn_interface``), used by ``attn_implementation="flash_attention_3"``."""
    liger_kernel: str | None = None
    peft: str | None = None
    av: str | None = None
    dtype: str | None = None
    """Compute dtype of the run (``--dtype``, the model's weights, or assumed)."""
    memory_format: str | None = None
    """Memory format of the convolutions when assumed; otherwise read per conv from the model."""
    attn_implementation: str | None = None
    """Attention implementation the model asks for (from its config, or assumed)."""
    assumed: set[str] = field(default_factory=set)
    """Names of the facts set by ``--assume`` rather than read."""

    def names(self) -> list[str]:
        return [f.name for f in fields(self) if f.name != "assumed"]

    def display(self, name: str) -> str:
        """Human form of one fact: ``absent`` when None, ``9.10.2 (91002)`` for cuDNN, ``12.0`` for capability."""
        value = getattr(self, name)
        if value is None:
            return "absent"
        if name == "cudnn":
            return f"{format_cudnn(value)} ({value})"
        if name == "capability":
            return f"{value[0]}.{value[1]}"
        return str(value)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{name: {"value": json_value_or_None, "assumed": bool}}``."""
        out: dict[str, dict[str, Any]] = {}
        for name in self.names():
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = f"{value[0]}.{value[1]}"
            out[name] = {"value": value, "assumed": name in self.assumed}
        return out


def format_cudnn(version: int) -> str:
    """``91002`` -> ``9.10.2``; cuDNN 8 used ``major*1000``: ``8902`` -> ``8.9.2``."""
    if version >= 90000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def parse_cudnn(text: str) -> int:
    """``91002``, ``9.10.2`` or ``9.10`` -> ``91002`` / ``91000`` (cuDNN's own integer encoding)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    parts = text.split(".")
    if not 2 <= len(parts) <= 4 or not all(p.isdigit() for p in parts):
        raise DoctorError(f"--assume cudnn={text!r}: expected 91002 or 9.10.2")
    major, minor = int(parts[0]), int(parts[1])
    patch = int(parts[2]) if len(parts) > 2 else 0
    return major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch


def torch_release(version: str | None) -> tuple[int, int, int] | None:
    """``2.9.1+cu128`` -> ``(2, 9, 1)``; None when absent or unparsable."""
    if version is None:
        return None
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return tuple([*release, 0, 0, 0][:3])  # type: ignore[return-value]


def canonical_dtype(text: str | torch.dtype | None) -> str | None:
    """``bf16``/``torch.bfloat16`` -> ``bfloat16``; raises DoctorError for an unknown spelling."""
    if text is None:
        return None
    if not isinstance(text, str):  # a torch.dtype
        text = str(text).removeprefix("torch.")
    key = str(text).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise DoctorError(f"dtype {text!r} is not one of {', '.join(sorted(set(DTYPES.values())))}")
    return DTYPES[key]


def _package_version(name: str, module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown-version"


def _device_type() -> str:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        current = accelerator.current_accelerator()
        if current is not None:
            return current.type
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def collect_facts() -> Facts:
    """Read the facts of this process (cheap: no GPU work beyond device queries)."""
    import torch

    facts = Facts(
        python=platform.python_version(),
        os=f"{platform.system()} {platform.release()}".strip() or None,
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        device=_device_type(),
        cpu_threads=torch.get_num_threads(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        transformers=_package_version("transformers", "transformers"),
        flash_attn=_package_version("flash-attn", "flash_attn"),
        flash_attn_3=_package_version("flash-attn-3", "flash_attn_interface"),
        liger_kernel=_package_version("liger-kernel", "liger_kernel"),
        peft=_package_version("peft", "peft"),
        av=_package_version("av", "av"),
    )
    if facts.device == "cuda":
        index = torch.cuda.current_device()
        facts.gpu_name = torch.cuda.get_device_name(index)
        facts.capability = tuple(torch.cuda.get_device_capability(index))  # type: ignore[assignment]
        facts.bf16_supported = torch.cuda.is_bf16_supported(including_emulation=False)
        facts.tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32)
        facts.tf32_cudnn = bool(torch.backends.cudnn.allow_tf32)
    elif facts.device == "cpu":
        facts.bf16_supported = True  # every CPU build of torch computes bf16 (natively or emulated)
    if sys.platform == "linux" and facts.os is not None:
        facts.os = f"{facts.os} ({os.uname().machine})"
    return facts


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise DoctorError(f"expected a boolean (true/false), got {text!r}")


def _parse_capability(text: str) -> tuple[int, int]:
    parts = text.strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise DoctorError(f"--assume capability={text!r}: expected MAJOR.MINOR such as 12.0")
    return int(parts[0]), int(parts[1])


def _parse_torch(text: str) -> str:
    if torch_release(text) is None:
        raise DoctorError(f"--assume torch={text!r}: not a version such as 2.9.1")
    return text.strip()


DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "npu", "mtia")
"""Device types ``--assume device=`` accepts (torch's accelerator types; ROCm GPUs are ``cuda``)."""


def _parse_device(text: str) -> str:
    key = text.strip().lower()
    if key not in DEVICE_TYPES:
        raise DoctorError(f"--assume device={text!r}: not a torch device type; allowed: {', '.join(DEVICE_TYPES)}")
    return key


def _parse_memory_format(text: str) -> str:
    key = text.strip().lower()
    if key not in MEMORY_FORMATS:
        raise DoctorError(f"--assume memory_format={text!r}: expected one of {', '.join(MEMORY_FORMATS)}")
    return MEMORY_FORMATS[key]


def _absent_or(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def wrapped(text: str) -> Any:
        return None if text.strip().lower() in ("absent", "none", "") else parse(text)

    return wrapped


_PARSERS: dict[str, Callable[[str], Any]] = {
    "python": str, "os": str, "torch": _parse_torch, "torch_cuda": str, "cudnn": parse_cudnn,
    "device": _parse_device, "gpu_name": str, "capability": _parse_capability,
    "bf16_supported": _parse_bool, "tf32_matmul": _parse_bool, "tf32_cudnn": _parse_bool,
    "cpu_threads": int, "cpu_capability": str, "transformers": str, "flash_attn": str, "flash_attn_3": str,
    "liger_kernel": str, "peft": str, "av": str, "dtype": canonical_dtype,
    "memory_format": _parse_memory_format, "attn_implementation": str,
}
ALIASES = {"gpu": "gpu_name", "threads": "cpu_threads", "cuda": "torch_cuda", "attn": "attn_implementation",
           "bf16": "bf16_supported", "tf32": "tf32_matmul", "flash-attn": "flash_attn",
           "liger": "liger_kernel", "liger-kernel": "liger_kernel", "sm": "capability"}
"""Short spellings accepted by ``--assume``."""


def parse_assume(spec: str | dict[str, str] | None) -> dict[str, Any]:
    """``"torch=2.9.1,cudnn=91002"`` (or a dict) -> ``{"torch": "2.9.1", "cudnn": 91002}``.

    A value of ``absent`` makes the fact absent. Unknown keys raise DoctorError with a suggestion.
    """
    if not spec:
        return {}
    if isinstance(spec, str):
        pairs = []
        for item in spec.split(","):
            if not item.strip():
                continue
            if "=" not in item:
                raise DoctorError(f"--assume {item.strip()!r}: expected key=value")
            key, value = item.split("=", 1)
            pairs.append((key.strip(), value))
    else:
        pairs = [(str(k), str(v)) for k, v in spec.items()]
    out: dict[str, Any] = {}
    for raw_key, value in pairs:
        key = ALIASES.get(raw_key.lower(), raw_key.lower())
        if key not in _PARSERS:
            known = sorted(set(_PARSERS) | set(ALIASES))
            hint = did_you_mean(raw_key.lower(), known) or f"; known keys: {', '.join(sorted(_PARSERS))}"
            raise DoctorError(f"--assume: unknown fact {raw_key!r}{hint}")
        try:
            out[key] = _absent_or(_PARSERS[key])(value)
        except ValueError as error:
            if isinstance(error, DoctorError):
                raise
            raise DoctorError(f"--assume {raw_key}={value!r}: {error}") from None
    return out


def apply_assume(facts: Facts, spec: str | dict[str, str] | None) -> Facts:
    """Override ``facts`` in place with ``--assume`` values, marking each as assumed; returns ``facts``."""
    values = parse_assume(spec)
    if "device" in values and values["device"] != facts.device:
        # Facts read from the real device say nothing about the assumed one: make them absent.
        for name in _DEVICE_FACTS:
            if name not in values and name not in facts.assumed:
                setattr(facts, name, None)
    for key, value in values.items():
        setattr(facts, key, value)
        facts.assumed.add(key)
    return facts


_DEVICE_FACTS = ("gpu_name", "capability", "bf16_supported", "tf32_matmul", "tf32_cudnn")
