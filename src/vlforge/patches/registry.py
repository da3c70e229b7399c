"""Apply, report and undo vlforge's fast paths on live models or on transformers' classes.

Example:
    >>> import torch, vlforge
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, kernel_size=2, stride=2), torch.nn.Conv2d(4, 4, 3))
    >>> report = vlforge.patch(model, precision="fp32")
    >>> [(e.name, e.kernel, e.in_features, e.out_features) for e in report.patched]
    [('0', (2, 2), 12, 4)]
    >>> vlforge.patch(model).newly_patched  # patching twice is a no-op
    []
    >>> vlforge.unpatch(model)
    1
"""

from __future__ import annotations

import fnmatch
import logging
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from vlforge.errors import PatchError
from vlforge.patches.patch_embed import PRECISIONS, gemm_class_for, is_patchable, is_patched

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PatchedModule:
    """One convolution that now runs as a GEMM."""

    name: str
    """Qualified module name inside the model, e.g. ``model.visual.patch_embed.proj``."""
    conv: str
    """Stock class name: ``Conv2d`` or ``Conv3d`` (or the user's subclass)."""
    kernel: tuple[int, ...]
    in_features: int
    """Flattened window size, ``in_channels * prod(kernel)``: the GEMM's K."""
    out_features: int
    bias: bool
    precision: str
    newly_patched: bool
    """False when the module was already patched before this call."""


@dataclass
class PatchReport:
    """What :func:`patch` did: every matching convolution, its shape and precision."""

    precision: str
    patched: list[PatchedModule] = field(default_factory=list)

    @property
    def newly_patched(self) -> list[str]:
        return [entry.name for entry in self.patched if entry.newly_patched]

    def __len__(self) -> int:
        return len(self.patched)

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "patched": [asdict(entry) for entry in self.patched]}

    def summary(self) -> str:
        if not self.patched:
            return "vlforge.patch: no stride==kernel convolution found"
        names = ", ".join(entry.name for entry in self.patched)
        return f"vlforge.patch: {len(self.patched)} convolution(s) as GEMM ({self.precision}): {names}"


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise PatchError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name, pattern)


def _select(model: nn.Module, include: Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    candidates = [(name, module) for name, module in model.named_modules() if is_patchable(module)]
    if include is None:
        return candidates
    if isinstance(include, str):
        include = [include]
    chosen: dict[str, nn.Module] = {}
    for pattern in include:
        hits = [(name, module) for name, module in candidates if _matches(name, pattern)]
        if not hits:
            named = [name for name, _ in model.named_modules() if _matches(name, pattern)]
            why = (
                f"it names {named[0]!r}, which holds no stride==kernel convolution"
                if named
                else "no module has that name"
            )
            raise PatchError(f"include={pattern!r} matches nothing to patch: {why}")
        chosen.update(hits)
    return [(name, module) for name, module in candidates if name in chosen]


def patch(model: nn.Module, *, precision: str = "native", include: Sequence[str] | None = None) -> PatchReport:
    """Make every stride==kernel Conv2d/Conv3d of ``model`` run as reshape + GEMM.

    Keeps the same Parameter objects (state_dict keys, shapes and storage unchanged). ``precision``:
    ``"native"`` computes in the input's dtype, ``"fp32"`` computes in fp32 and casts back,
    ``"auto"`` measures stock conv vs GEMM once per (device, dtype, shape) and runs the faster.
    ``include`` limits the patch to the named modules (exact names, parent names or glob patterns)
    and raises :class:`PatchError` when a name matches nothing patchable.
    """
    _check_precision(precision)
    report = PatchReport(precision=precision)
    for name, module in _select(model, include):
        already = is_patched(module)
        previous = getattr(module, "_vlforge_precision", None)
        if not already:
            module.__class__ = gemm_class_for(type(module))
        module._vlforge_precision = precision
        kernel = tuple(module.kernel_size)
        entry = PatchedModule(
            name=name,
            conv=module._vlforge_stock_class.__name__,
            kernel=kernel,
            in_features=module.in_channels * math.prod(kernel),
            out_features=module.out_channels,
            bias=module.bias is not None,
            precision=precision,
            newly_patched=not already,
        )
        report.patched.append(entry)
        if not already:
            logger.info(
                "patched %s: %s kernel=%s (%d -> %d) now runs as GEMM [%s]",
                name or "<root>", entry.conv, kernel, entry.in_features, entry.out_features, precision,
            )
        elif previous != precision:
            logger.info("patched %s: precision %s -> %s", name or "<root>", previous, precision)
    if not report.patched:
        logger.warning("vlforge.patch: %s holds no stride==kernel Conv2d/Conv3d; nothing patched",
                       type(model).__name__)
    return report


def unpatch(model: nn.Module) -> int:
    """Restore the stock forward of every patched convolution in ``model``; returns how many."""
    restored = 0
    for name, module in model.named_modules():
        if not is_patched(module):
            continue
        klass = type(module)
        if "_vlforge_stock_class" not in klass.__dict__:
            raise PatchError(
                f"cannot unpatch {name!r}: its class {klass.__name__} was wrapped after patching "
                "(e.g. by fully_shard); unpatch before wrapping"
            )
        module.__class__ = klass._vlforge_stock_class
        module.__dict__.pop("_vlforge_precision", None)
        restored += 1
        logger.info("unpatched %s: stock %s forward restored", name or "<root>", type(module).__name__)
    return restored


def patched_modules(model: nn.Module) -> list[str]:
    """Names of the modules of ``model`` that currently run the GEMM forward."""
    return [name for name, module in model.named_modules() if is_patched(module)]


class TransformersPatch:
    """Class-level patch of transformers: every model built while active is patched at construction.

    Returned by :func:`patch_transformers`; already active when returned, and a context manager
    whose exit undoes the class-level hook (models built meanwhile stay patched).
    """

    _lock = threading.Lock()
    _active: TransformersPatch | None = None

    def __init__(self, precision: str, include: Sequence[str] | None) -> None:
        self.precision = precision
        self.include = include
        self._original_post_init = None

    def _install(self) -> None:
        from transformers import PreTrainedModel

        original = PreTrainedModel.post_init
        handle = self

        def post_init(model: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(model, *args, **kwargs)
            handle._patch_new_model(model)
            return result

        post_init._vlforge_original = original  # type: ignore[attr-defined]
        self._original_post_init = original
        PreTrainedModel.post_init = post_init
        logger.info("patch_transformers: models built from now on run patch convolutions as GEMM")

    def _patch_new_model(self, model: nn.Module) -> None:
        # post_init also runs for sub-models (text model, vision tower): only those with a conv are patched.
        names = {name for name, module in model.named_modules() if is_patchable(module)}
        if not names:
            return
        if self.include is None:
            patch(model, precision=self.precision)
            return
        wanted = [p for p in self.include if any(_matches(name, p) for name in names)]
        if wanted:
            patch(model, precision=self.precision, include=wanted)

    def undo(self) -> None:
        """Remove the class-level hook (idempotent)."""
        from transformers import PreTrainedModel

        with TransformersPatch._lock:
            if TransformersPatch._active is not self or self._original_post_init is None:
                return
            PreTrainedModel.post_init = self._original_post_init
            self._original_post_init = None
            TransformersPatch._active = None
        logger.info("patch_transformers: class-level hook removed")

    @property
    def active(self) -> bool:
        return TransformersPatch._active is self

    def __enter__(self) -> TransformersPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def patch_transformers(*, precision: str = "native", include: Iterable[str] | None = None) -> TransformersPatch:
    """Patch at class level so models built by any code (HF Trainer, TRL, ...) are fast from construction.

    Calling it again while active returns the active handle (a no-op, same precision required).

    Example:
        >>> import vlforge
        >>> with vlforge.patch_transformers():
        ...     pass  # build models here; each is patched by its post_init
    """
    _check_precision(precision)
    include = None if include is None else list(include)
    with TransformersPatch._lock:
        active = TransformersPatch._active
        if active is not None:
            if active.precision != precision or active.include != include:
                raise PatchError(
                    f"patch_transformers is already active with precision={active.precision!r} "
                    f"include={active.include!r}; undo it first"
                )
            return active
        handle = TransformersPatch(precision, include)
        handle._install()
        TransformersPatch._active = handle
    return handle


def unpatch_transformers() -> bool:
    """Remove the class-level hook if one is active; True when one was removed."""
    active = TransformersPatch._active
    if active is None:
        return False
    active.undo()
    return True
