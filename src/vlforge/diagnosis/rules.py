"""The doctor's rules, as data: one table of :class:`Rule` records evaluated over facts, model, measurements.

Each rule has an id, one severity, a condition that returns the subjects it fires for (a conv name,
or ``""`` for the environment as a whole), a one-line message, the fix, a cost line and the public
source it comes from. Rules whose fix is ``vlforge.patch`` carry ``action="patch"`` so that
:func:`vlforge.diagnosis.guard` can apply it.

Example:
    >>> from vlforge.diagnosis.facts import Facts
    >>> from vlforge.diagnosis.rules import Context, evaluate
    >>> facts = Facts(torch="2.9.0", device="cuda", dtype="bfloat16")
    >>> [f.rule for f in evaluate(Context(facts=facts))]
    ['cudnn-conv3d-skipped-env']
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from vlforge.diagnosis.facts import Facts, format_cudnn, torch_release
from vlforge.diagnosis.model_info import ConvInfo, ModelInfo
from vlforge.diagnosis.tokens import TokensAudit, problem_ids
from vlforge.errors import ExitCode

Severity = Literal["info", "warning", "error"]
SEVERITY_ORDER = {"info": 0, "warning": 1, "error": 2}
HALF = ("bfloat16", "float16")
SLOW_RATIO = 2.0
"""A measured conv/GEMM time ratio at or above this is an error-level finding."""


# ---------------------------------------------------------------------------------------------------------
# The facts-level predicates, each stated once and reused by the rule table.


def torch_skips_cudnn_conv3d(torch_version: str | None, cudnn: int | None) -> bool:
    """True when this torch build skips cuDNN for half-precision 3-D convs at this runtime cuDNN.

    torch <= 2.8: never. torch 2.9.0: always (any cuDNN). torch >= 2.9.1: when 9.8 <= cuDNN < 9.15
    (``Convolution.cpp``: ``cudnn_version >= 90800 && cudnn_version < 91500``).
    """
    release = torch_release(torch_version)
    if release is None or release[:2] < (2, 9):
        return False
    if release == (2, 9, 0):
        return True
    return cudnn is not None and 90800 <= cudnn < 91500


def conv_dtype(ctx: Context, conv: ConvInfo) -> str:
    """The dtype a conv computes in: the run's dtype when known, else its weight's."""
    return ctx.facts.dtype or conv.dtype


def conv_memory_format(ctx: Context, conv: ConvInfo) -> str:
    return ctx.facts.memory_format or conv.memory_format


def cudnn_skipped_for(ctx: Context, conv: ConvInfo) -> bool:
    """The full PyTorch condition for one conv: CUDA, half input, 5-D weight with a kernel size != 1,
    default memory format, and a torch/cuDNN pair that skips cuDNN."""
    return (
        ctx.facts.device == "cuda"
        and conv_dtype(ctx, conv) in HALF
        and conv.weight_ndim == 5
        and any(k != 1 for k in conv.kernel)
        and conv_memory_format(ctx, conv) == "contiguous"
        and torch_skips_cudnn_conv3d(ctx.facts.torch, ctx.facts.cudnn)
    )


def blackwell_slow_bf16(ctx: Context, conv: ConvInfo | None) -> bool:
    """Compute capability 12.x with cuDNN 9.10 and bf16: cuDNN's conv3d kernel there is very slow."""
    f = ctx.facts
    return (
        f.device == "cuda"
        and f.capability is not None
        and f.capability[0] == 12
        and f.cudnn is not None
        and 91000 <= f.cudnn < 91100
        and (f.dtype if conv is None else conv_dtype(ctx, conv)) == "bfloat16"
        and (conv is None or conv.weight_ndim == 5)
    )


def cudnn_920_bf16_backward(ctx: Context, conv: ConvInfo | None) -> bool:
    """cuDNN 9.20 with bf16: a bf16 backward engine for this 3-D conv may be missing."""
    f = ctx.facts
    return (
        f.device == "cuda"
        and f.cudnn is not None
        and 92000 <= f.cudnn < 92100
        and (f.dtype if conv is None else conv_dtype(ctx, conv)) == "bfloat16"
        and (conv is None or conv.weight_ndim == 5)
    )


# ---------------------------------------------------------------------------------------------------------
# Records.


@dataclass
class Measurement:
    """Stock conv vs vlforge GEMM at one conv shape on the actual device (filled by ``bench.py``).

    Within a time budget a figure may be one call's time (``extrapolated``) or missing (that variant
    was not measured); ``note`` then says which. A ratio needs both of its pass's figures, so a
    variant that was not measured never yields a ratio, a finding or a verdict.
    """

    convs: list[str]
    """Names of the model's convs with this shape."""
    kernel: tuple[int, ...]
    in_channels: int
    out_channels: int
    windows: int
    device: str
    dtype: str
    repeats: int
    """Timed repeats of the forward figures (0: single calls, or not measured)."""
    forward_ms: dict[str, float]
    """Median milliseconds per call: ``{"conv": ..., "gemm": ...}``; a variant not measured is absent."""
    train_ms: dict[str, float] | None
    """Median milliseconds of forward + backward, or None when not measured."""
    train_repeats: int | None = None
    """Timed repeats of the forward+backward figures (None when that pass did not run)."""
    extrapolated: bool = False
    """Some figure is a single (warm-up) call's time: the budget fitted no timed repeat."""
    note: str | None = None
    """What is partial and why (None when every figure is a median of timed repeats)."""

    @property
    def complete(self) -> bool:
        return self.note is None

    @staticmethod
    def _ratio(times: dict[str, float] | None) -> float | None:
        if not times or "conv" not in times or "gemm" not in times:
            return None
        return times["conv"] / max(times["gemm"], 1e-9)

    @property
    def ratio_forward(self) -> float | None:
        """conv / GEMM forward time, or None when either was not measured."""
        return self._ratio(self.forward_ms)

    @property
    def ratio_train(self) -> float | None:
        return self._ratio(self.train_ms)

    @property
    def ratios(self) -> list[float]:
        return [r for r in (self.ratio_forward, self.ratio_train) if r is not None]

    @property
    def ratio(self) -> float | None:
        """The larger of the forward and forward+backward ratios (conv time / GEMM time); None if neither."""
        return max(self.ratios, default=None)

    @property
    def gemm_slower(self) -> bool:
        return bool(self.ratios) and all(r < 1.0 for r in self.ratios)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["complete"] = self.complete
        out["ratio_forward"] = None if self.ratio_forward is None else round(self.ratio_forward, 3)
        out["ratio_train"] = None if self.ratio_train is None else round(self.ratio_train, 3)
        return out


@dataclass
class Context:
    """Everything a rule may look at. ``model`` and ``measurements`` are None when not available."""

    facts: Facts
    model: ModelInfo | None = None
    measurements: list[Measurement] | None = None

    def convs(self, predicate: Callable[[ConvInfo], bool]) -> list[ConvInfo]:
        return [] if self.model is None else [c for c in self.model.convs if predicate(c)]


@dataclass(frozen=True)
class Hit:
    """One subject a rule fires for, with values for its message template."""

    subject: str = ""
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    """One row of the table."""

    id: str
    severity: Severity
    condition: Callable[[Context], Iterable[Hit]]
    message: str
    """One line; ``str.format`` template over the facts' display values and the hit's values."""
    fix: str
    source: str
    cost: str = ""
    facts: tuple[str, ...] = ()
    """Facts the rule reads (shown in the report's fact column)."""
    action: Literal["patch"] | None = None
    """What :func:`vlforge.diagnosis.guard` may do about it."""
    guard_raises: bool = True
    """False: :func:`vlforge.diagnosis.guard` logs this error-level finding as a warning instead of raising
    (the run itself can cure it, e.g. training updates an untrained embedding row)."""


@dataclass(frozen=True)
class Finding:
    """A rule that fired, for one subject."""

    rule: str
    severity: Severity
    subject: str
    message: str
    fix: str
    cost: str
    source: str
    facts: dict[str, str]
    action: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------
# Conditions.


def _hits(convs: Iterable[ConvInfo], **values: Any) -> list[Hit]:
    return [Hit(c.name, {"conv": c.name, "kernel": "x".join(map(str, c.kernel)), **values}) for c in convs]


def _unpatched(c: ConvInfo) -> bool:
    return c.patchable and not c.patched


def _patched(c: ConvInfo) -> bool:
    return c.patched


def _env_only(ctx: Context) -> bool:
    return ctx.model is None


def _cudnn_unpatched(ctx: Context) -> list[Hit]:
    return _hits(ctx.convs(lambda c: _unpatched(c) and cudnn_skipped_for(ctx, c)))


def _cudnn_unpatchable(ctx: Context) -> list[Hit]:
    return _hits(ctx.convs(lambda c: not c.patchable and cudnn_skipped_for(ctx, c)))


def _cudnn_patched(ctx: Context) -> list[Hit]:
    return _hits(ctx.convs(lambda c: _patched(c) and cudnn_skipped_for(ctx, c)))


def _cudnn_env(ctx: Context) -> list[Hit]:
    f = ctx.facts
    if (
        _env_only(ctx)
        and f.device == "cuda"
        and f.dtype in (None, *HALF)
        and f.memory_format in (None, "contiguous")
        and torch_skips_cudnn_conv3d(f.torch, f.cudnn)
    ):
        return [Hit()]
    return []


def _blackwell_unpatched(ctx: Context) -> list[Hit]:
    return _hits(ctx.convs(lambda c: _unpatched(c) and blackwell_slow_bf16(ctx, c)))


def _blackwell_patched(ctx: Context) -> list[Hit]:
    return _hits(ctx.convs(lambda c: _patched(c) and blackwell_slow_bf16(ctx, c)))


def _blackwell_env(ctx: Context) -> list[Hit]:
    return [Hit()] if _env_only(ctx) and blackwell_slow_bf16(ctx, None) else []


def _cudnn920_unpatched(ctx: Context) -> list[Hit]:
    return _hits(ctx.convs(lambda c: _unpatched(c) and cudnn_920_bf16_backward(ctx, c)))


def _cudnn920_env(ctx: Context) -> list[Hit]:
    return [Hit()] if _env_only(ctx) and cudnn_920_bf16_backward(ctx, None) else []


def _flash_attn_missing(ctx: Context) -> list[Hit]:
    attn = ctx.facts.attn_implementation
    if attn == "flash_attention_2" and ctx.facts.flash_attn is None:
        return [Hit("attn_implementation", {"attn": attn, "package": "flash-attn"})]
    if attn == "flash_attention_3" and ctx.facts.flash_attn_3 is None:
        return [Hit("attn_implementation", {"attn": attn, "package": "flash-attn-3 (flash_attn_interface)"})]
    return []


def _bf16_unsupported(ctx: Context) -> list[Hit]:
    f = ctx.facts
    return [Hit("dtype")] if f.dtype == "bfloat16" and f.bf16_supported is False else []


def _one_thread(ctx: Context) -> list[Hit]:
    f = ctx.facts
    return [Hit("cpu_threads")] if f.device == "cpu" and f.cpu_threads == 1 else []


def _tf32_off(ctx: Context) -> list[Hit]:
    f = ctx.facts
    if (
        f.device == "cuda"
        and f.capability is not None
        and f.capability[0] >= 8
        and f.tf32_matmul is False
        and f.dtype in (None, "float32")
    ):
        return [Hit("tf32_matmul")]
    return []


def _measured(ctx: Context, keep: Callable[[Measurement, list[ConvInfo]], bool]) -> list[Hit]:
    hits = []
    by_name = {} if ctx.model is None else {c.name: c for c in ctx.model.convs}
    for m in ctx.measurements or []:
        if m.ratio is None:  # a variant was not measured within the budget: no ratio, so no verdict
            continue
        convs = [by_name[name] for name in m.convs if name in by_name]
        if not keep(m, convs):
            continue
        single = " (one call each: budget)"  # a pass whose figures had no timed repeat
        passes = []
        if m.ratio_forward is not None:
            passes.append(f"fwd {m.forward_ms['conv']:.3g} ms conv vs {m.forward_ms['gemm']:.3g} ms GEMM"
                          + (single if m.repeats == 0 else ""))
        if m.ratio_train is not None:
            passes.append(f"fwd+bwd {m.train_ms['conv']:.3g} vs {m.train_ms['gemm']:.3g} ms"  # type: ignore[index]
                          + (single if m.train_repeats == 0 else ""))
        hits.append(Hit(", ".join(m.convs), {
            "conv": ", ".join(m.convs),
            "ratio": _ratio_text(m.ratio if not m.gemm_slower else 1 / min(m.ratios)),
            "measured": f"{', '.join(passes)}; {m.windows} windows, {m.dtype}, {m.device}",
        }))
    return hits


def _ratio_text(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 100 else f"{ratio:,.0f}x"


def _all_unpatched(convs: list[ConvInfo]) -> bool:
    return bool(convs) and not any(c.patched for c in convs)


def _any_gemm_forced(convs: list[ConvInfo]) -> bool:
    """Patched with a fixed precision (not ``auto``): the GEMM runs whatever the measurement says."""
    return any(c.patched and c.precision != "auto" for c in convs)


def _bench_slow_unpatched(ctx: Context) -> list[Hit]:
    return _measured(ctx, lambda m, convs: m.ratio >= SLOW_RATIO and _all_unpatched(convs))


def _bench_slow_patched(ctx: Context) -> list[Hit]:
    return _measured(ctx, lambda m, convs: m.ratio >= SLOW_RATIO and any(c.patched for c in convs))


def _bench_mild(ctx: Context) -> list[Hit]:
    return _measured(ctx, lambda m, convs: 1.0 <= m.ratio < SLOW_RATIO and not m.gemm_slower)


def _bench_gemm_slower_patched(ctx: Context) -> list[Hit]:
    return _measured(ctx, lambda m, convs: m.gemm_slower and _any_gemm_forced(convs))


def _bench_gemm_slower_unpatched(ctx: Context) -> list[Hit]:
    return _measured(ctx, lambda m, convs: m.gemm_slower and not _any_gemm_forced(convs))


def _tokens_audit(ctx: Context) -> TokensAudit | None:
    audit = None if ctx.model is None else ctx.model.extra.get("tokens")
    return audit if isinstance(audit, TokensAudit) else None


def _tag_hit(audit: TokensAudit, findings: list[Any]) -> list[Hit]:
    """One hit for a group of tags: their names, problem ids, sources, and the fix's arguments."""
    if not findings:
        return []
    tags = [f.tag for f in findings]
    listed = ", ".join(f"{f.tag!r} ({', '.join(map(str, problem_ids(f) or f.ids))})" for f in findings)
    sources = sorted({s for f in findings for s in f.sources})
    mapping = {t: audit.alternatives[t] for t in tags if t in audit.alternatives}
    alternatives = "; or use the checked alternative tags " + ", ".join(
        f"{old} -> {new}" for old, new in mapping.items()) if mapping else ""
    checkpoint = audit.checkpoint or "M"
    return [Hit(", ".join(tags), {
        "tags": listed, "tag_list": shlex.quote(",".join(tags)), "sources": ", ".join(sources),
        "checkpoint": checkpoint, "model_arg": shlex.quote(checkpoint),
        "fixed": shlex.quote(checkpoint.rstrip("/") + "-fixed"), "alternatives": alternatives,
        "notes": "; ".join(audit.notes) or "no notes",
    })]


def _token_findings(ctx: Context, roles: tuple[str, ...], verdicts: tuple[str, ...]) -> list[Hit]:
    audit = _tokens_audit(ctx)
    if audit is None or audit.status != "audited":
        return []
    return _tag_hit(audit, [f for f in audit.findings if f.role in roles and f.verdict in verdicts])


def _token_untrained(ctx: Context) -> list[Hit]:
    return _token_findings(ctx, ("generated",), ("untrained",))


def _token_weak(ctx: Context) -> list[Hit]:
    return _token_findings(ctx, ("generated",), ("weak",))


def _token_read_only(ctx: Context) -> list[Hit]:
    return _token_findings(ctx, ("prefilled", "prompt"), ("untrained", "weak"))


def _token_unknown(ctx: Context) -> list[Hit]:
    return _token_findings(ctx, ("generated",), ("unknown",))


def _tokens_skipped(ctx: Context) -> list[Hit]:
    audit = _tokens_audit(ctx)
    if audit is None or audit.checkpoint is None:
        return []  # no checkpoint directory at all (an in-memory module): nothing to audit, not a finding
    if audit.status == "skipped":
        return [Hit("tokens", {"checkpoint": audit.checkpoint, "what": "untrained template tokens",
                               "reason": audit.reason})]
    if audit.template_skipped is not None:
        return [Hit("chat template", {"checkpoint": audit.checkpoint, "what": "the chat template's tokens",
                                      "reason": audit.template_skipped})]
    return []


def _tokens_failed(ctx: Context) -> list[Hit]:
    audit = _tokens_audit(ctx)
    if audit is None or audit.status != "failed":
        return []
    return [Hit("tokens", {"checkpoint": audit.checkpoint, "reason": audit.reason})]


# ---------------------------------------------------------------------------------------------------------
# The table.

_SRC_CUDNN = (
    "pytorch/pytorch#166122 (2.9 Conv3d regression), #166480 (cuDNN re-enabled for 9.15+), #168167; "
    "sgl-project/sglang#14119 (refuses 2.9.1 + cuDNN < 9.15); LlamaFactory src/llamafactory/model/loader.py"
)
_SRC_BLACKWELL = "huggingface/transformers#45750 and PR #45771 (Qwen3-VL patch embed Conv3d on RTX 5090, bf16)"
_FIX_CUDNN = (
    "vlforge.patch(model) (train/extract/profile do it at load), or install cuDNN >= 9.15 "
    "(pip install -U 'nvidia-cudnn-cu12>=9.15') or torch >= 2.10"
)
_CUDNN_MSG = "torch {torch} with cuDNN {cudnn} skips cuDNN for {dtype} 3-D convs"
_SRC_TOKENS = (
    "arXiv:2405.05417 (Land & Bartolo 2024, Fishing for Magikarp: under-trained tokens); Qwen3-VL practical "
    "issues blog, section 2: <think>/</think> never trained in the base model break zero-RL output formats"
)

RULES: list[Rule] = [
    Rule(
        id="cudnn-conv3d-skipped",
        severity="error",
        condition=_cudnn_unpatched,
        message=f"{{conv}} (Conv3d {{kernel}}) runs on the slow native vol2col path: {_CUDNN_MSG}",
        fix=_FIX_CUDNN,
        cost="10-20x on the vision forward (pytorch/pytorch#174051), more memory",
        source=_SRC_CUDNN,
        facts=("torch", "cudnn", "device", "dtype", "memory_format"),
        action="patch",
    ),
    Rule(
        id="cudnn-conv3d-skipped-unpatchable",
        severity="warning",
        condition=_cudnn_unpatchable,
        message=f"{{conv}} (Conv3d {{kernel}}, overlapping windows) runs on the slow native path: {_CUDNN_MSG}; "
                "vlforge cannot run it as a GEMM",
        fix="install cuDNN >= 9.15 (pip install -U 'nvidia-cudnn-cu12>=9.15') or torch >= 2.10, "
            "or compute it in fp32 / channels_last_3d",
        cost="slow and memory-hungry vol2col convolution",
        source=_SRC_CUDNN,
        facts=("torch", "cudnn", "device", "dtype", "memory_format"),
    ),
    Rule(
        id="cudnn-conv3d-skipped-patched",
        severity="info",
        condition=_cudnn_patched,
        message=f"{{conv}}: {_CUDNN_MSG}, but vlforge runs this conv as a GEMM, so the slow path is not used",
        fix="none needed",
        source=_SRC_CUDNN,
        facts=("torch", "cudnn", "device", "dtype"),
    ),
    Rule(
        id="cudnn-conv3d-skipped-env",
        severity="warning",
        condition=_cudnn_env,
        message=f"{_CUDNN_MSG.replace('{dtype}', 'bf16/fp16')}: Qwen-VL patch embeddings run on the slow "
                "native path unless patched",
        fix=_FIX_CUDNN,
        cost="10-20x on the vision forward (pytorch/pytorch#174051)",
        source=_SRC_CUDNN,
        facts=("torch", "cudnn", "device", "dtype"),
        action="patch",
    ),
    Rule(
        id="slow-bf16-conv3d-kernel",
        severity="error",
        condition=_blackwell_unpatched,
        message="{conv} (Conv3d {kernel}): cuDNN {cudnn} has no fast bf16 conv3d kernel on compute "
                "capability {capability} ({gpu_name})",
        fix="vlforge.patch(model) (train/extract/profile do it at load)",
        cost="reported 1,000-50,000x on the patch embedding (RTX 5090, bf16)",
        source=_SRC_BLACKWELL,
        facts=("device", "capability", "cudnn", "dtype"),
        action="patch",
    ),
    Rule(
        id="slow-bf16-conv3d-kernel-patched",
        severity="info",
        condition=_blackwell_patched,
        message="{conv}: cuDNN {cudnn} is slow for bf16 conv3d on capability {capability}; vlforge runs this "
                "conv as a GEMM",
        fix="none needed",
        source=_SRC_BLACKWELL,
        facts=("device", "capability", "cudnn", "dtype"),
    ),
    Rule(
        id="slow-bf16-conv3d-kernel-env",
        severity="warning",
        condition=_blackwell_env,
        message="cuDNN {cudnn} has no fast bf16 conv3d kernel on compute capability {capability}: "
                "Qwen-VL patch embeddings are very slow unless patched",
        fix="vlforge.patch(model), or a newer cuDNN",
        cost="reported 1,000-50,000x on the patch embedding (RTX 5090, bf16)",
        source=_SRC_BLACKWELL,
        facts=("device", "capability", "cudnn", "dtype"),
        action="patch",
    ),
    Rule(
        id="cudnn-920-bf16-backward",
        severity="warning",
        condition=_cudnn920_unpatched,
        message="{conv} (Conv3d {kernel}): cuDNN {cudnn} may lack a bf16 backward engine for this conv; "
                "training it can fail",
        fix="vlforge.patch(model) (GEMM backward needs no cuDNN engine), or another cuDNN version",
        cost="training fails or falls back",
        source="NVIDIA-TAO/tao-core#29 (Qwen3-VL patch embedding backward on cuDNN 9.20)",
        facts=("device", "cudnn", "dtype"),
        action="patch",
    ),
    Rule(
        id="cudnn-920-bf16-backward-env",
        severity="warning",
        condition=_cudnn920_env,
        message="cuDNN {cudnn} may lack a bf16 backward engine for Conv3d patch embeddings",
        fix="vlforge.patch(model), or another cuDNN version",
        source="NVIDIA-TAO/tao-core#29 (Qwen3-VL patch embedding backward on cuDNN 9.20)",
        facts=("device", "cudnn", "dtype"),
        action="patch",
    ),
    Rule(
        id="flash-attn-missing",
        severity="error",
        condition=_flash_attn_missing,
        message="attn_implementation={attn} but {package} is not importable",
        fix="pip install the package for your torch/CUDA, or load with attn_implementation='sdpa'",
        cost="the model fails to load",
        source="transformers attention interface (attn_implementation)",
        facts=("attn_implementation", "flash_attn", "flash_attn_3"),
    ),
    Rule(
        id="bf16-unsupported",
        severity="error",
        condition=_bf16_unsupported,
        message="bfloat16 requested but this {device} device ({gpu_name}) has no native bf16",
        fix="use --dtype float16 (with loss scaling) or float32",
        cost="emulated or failing bf16 kernels",
        source="torch.cuda.is_bf16_supported(including_emulation=False)",
        facts=("dtype", "bf16_supported", "device"),
    ),
    Rule(
        id="cpu-one-thread",
        severity="warning",
        condition=_one_thread,
        message="CPU run with 1 intra-op thread",
        fix="unset OMP_NUM_THREADS=1 or call torch.set_num_threads(os.cpu_count())",
        cost="up to Nx slower on an N-core machine",
        source="torch.get_num_threads()",
        facts=("device", "cpu_threads"),
    ),
    Rule(
        id="tf32-off",
        severity="warning",
        condition=_tf32_off,
        message="TF32 matmuls are off on a compute capability {capability} GPU while computing in fp32",
        fix="torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high'))",
        cost="fp32 GEMMs several times slower than TF32 on Ampere and newer",
        source="PyTorch docs: TensorFloat-32 (TF32) on Ampere (and later) devices",
        facts=("device", "capability", "tf32_matmul", "dtype"),
    ),
    Rule(
        id="bench-conv-slow",
        severity="error",
        condition=_bench_slow_unpatched,
        message="this machine pays {ratio} on the patch embedding ({conv}) with the stock conv",
        fix="vlforge.patch(model) (train/extract/profile do it at load)",
        cost="{ratio} ({measured})",
        source="measured here (vlforge doctor --bench)",
        facts=("device", "dtype"),
        action="patch",
    ),
    Rule(
        id="bench-conv-slow-patched",
        severity="info",
        condition=_bench_slow_patched,
        message="the stock conv would cost {ratio} on {conv}; vlforge's GEMM path avoids it",
        fix="none needed",
        cost="{ratio} saved ({measured})",
        source="measured here (vlforge doctor --bench)",
        facts=("device", "dtype"),
    ),
    Rule(
        id="bench-conv-mild",
        severity="info",
        condition=_bench_mild,
        message="the GEMM path is {ratio} faster than the stock conv on {conv}",
        fix="optional: vlforge.patch(model)",
        cost="{ratio} ({measured})",
        source="measured here (vlforge doctor --bench)",
        facts=("device", "dtype"),
    ),
    Rule(
        id="bench-gemm-slower",
        severity="warning",
        condition=_bench_gemm_slower_patched,
        message="on this device the GEMM path is {ratio} slower than the stock conv on {conv}, which is patched",
        fix="vlforge.unpatch(model), or vlforge.patch(model, precision='auto') to choose by measurement",
        cost="{ratio} ({measured})",
        source="measured here (vlforge doctor --bench)",
        facts=("device", "dtype"),
    ),
    Rule(
        id="bench-gemm-slower-unpatched",
        severity="info",
        condition=_bench_gemm_slower_unpatched,
        message="on this device the GEMM path is {ratio} slower than the stock conv on {conv}: leave the conv",
        fix="do not patch here (or use precision='auto')",
        cost="{ratio} ({measured})",
        source="measured here (vlforge doctor --bench)",
        facts=("device", "dtype"),
    ),
    # The tokens audit (vlforge.tokens), read from ctx.model.extra["tokens"] (see doctor/tokens.py).
    Rule(
        id="untrained-template-token",
        severity="error",
        condition=_token_untrained,
        message="the policy must generate {tags} ({sources}) but these rows look untrained in {checkpoint}: "
                "the model (almost) never emits them",
        fix="vlforge tokens fix --model {model_arg} --out {fixed} --strategy mean-of-pieces --tags {tag_list} "
            "and keep embed_tokens / lm_head trainable{alternatives}",
        cost="zero-RL format reward stays at 0; with frozen embeddings (LoRA) SFT cannot teach the tags either",
        source=_SRC_TOKENS,
        guard_raises=False,
    ),
    Rule(
        id="untrained-template-token-weak",
        severity="warning",
        condition=_token_weak,
        message="the policy must generate {tags} ({sources}) and these rows look weakly trained in {checkpoint}",
        fix="confirm with vlforge tokens audit --model {model_arg} --verify; then vlforge tokens fix --model "
            "{model_arg} --out {fixed} --strategy mean-of-pieces --tags {tag_list}{alternatives}",
        cost="the policy may rarely emit the tags",
        source=_SRC_TOKENS,
    ),
    Rule(
        id="untrained-template-token-prefilled",
        severity="info",
        condition=_token_read_only,
        message="{tags} ({sources}) look untrained in {checkpoint} but are only prefilled / in the prompt: "
                "the policy reads them, it does not have to emit them",
        fix="none needed unless the policy must generate them (then: vlforge tokens fix ... --tags {tag_list})",
        source=_SRC_TOKENS,
    ),
    Rule(
        id="untrained-template-token-unknown",
        severity="info",
        condition=_token_unknown,
        message="cannot judge whether the rows of generated {tags} ({sources}) are trained: {notes}",
        fix="vlforge tokens audit --model {model_arg} --reference-ids ... or --verify",
        source=_SRC_TOKENS,
    ),
    Rule(
        id="tokens-audit-skipped",
        severity="info",
        condition=_tokens_skipped,
        message="{what} not checked for {checkpoint}: {reason}",
        fix="vlforge tokens audit --model {checkpoint} --tags/--format/--template to audit explicitly",
        source="vlforge tokens audit (docs/tokens.md)",
    ),
    Rule(
        id="tokens-audit-failed",
        severity="warning",
        condition=_tokens_failed,
        message="untrained template tokens unknown for {checkpoint}: {reason}",
        fix="vlforge tokens audit --model {checkpoint} -v to see the error (and report it)",
        source="vlforge tokens audit (docs/tokens.md)",
    ),
]


class _Values(dict):
    def __missing__(self, key: str) -> str:
        return "absent"


def evaluate(ctx: Context, rules: Iterable[Rule] | None = None) -> list[Finding]:
    """Run every rule over ``ctx``; findings sorted by severity (errors first), then table order."""
    findings: list[Finding] = []
    for rule in RULES if rules is None else rules:
        for hit in rule.condition(ctx):
            values = _Values({name: ctx.facts.display(name) for name in ctx.facts.names()})
            values.update(hit.values)
            findings.append(
                Finding(
                    rule=rule.id,
                    severity=rule.severity,
                    subject=hit.subject,
                    message=rule.message.format_map(values),
                    fix=rule.fix.format_map(values),
                    cost=rule.cost.format_map(values),
                    source=rule.source,
                    facts={name: ctx.facts.display(name) for name in rule.facts},
                    action=rule.action,
                )
            )
    findings.sort(key=lambda f: -SEVERITY_ORDER[f.severity])
    return findings


def worst(findings: Iterable[Finding]) -> Severity | None:
    """The highest severity among ``findings`` (None when there are none)."""
    levels = [f.severity for f in findings]
    return max(levels, key=SEVERITY_ORDER.__getitem__) if levels else None


def exit_code(findings: Iterable[Finding]) -> int:
    """OK: nothing above info; WARNING: warnings; FAILED: errors (:class:`vlforge.errors.ExitCode`)."""
    return {None: ExitCode.OK, "info": ExitCode.OK, "warning": ExitCode.WARNING,
            "error": ExitCode.FAILED}[worst(findings)]


__all__ = [
    "RULES", "Context", "Finding", "Hit", "Measurement", "Rule", "Severity", "cudnn_skipped_for",
    "evaluate", "exit_code", "format_cudnn", "torch_skips_cudnn_conv3d", "worst",
]
