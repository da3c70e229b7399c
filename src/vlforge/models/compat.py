"""Make Qwen-VL-family processors constructible in transformers 5 when torchvision is missing.

Without torchvision, transformers 5 cannot build *any* Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V
processor, not even for images: ``ProcessorMixin.__init__`` checks the ``video_processor`` argument
against ``transformers.VideoProcessorMixin``, which is only exported when torchvision is importable,
and ``AutoVideoProcessor`` maps these families only to torchvision classes. :func:`ensure_processor_support`
fixes both, and only when torchvision is absent:

1. it exposes ``VideoProcessorMixin`` on the ``transformers`` module (the real class, unchanged);
2. it registers the per-family subclasses of :class:`~vlforge.models.frames_video.FramesVideoProcessor`
   with ``AutoVideoProcessor`` for the five families, under their own names and as stand-ins for
   the stock names (``Qwen2VLVideoProcessor``, ``Qwen3VLVideoProcessor``, ``Glm4vVideoProcessor``),
   which are the names every file vlforge writes carries. The torchvision-free class is chosen here,
   at load time; it is never written to disk.

``import vlforge`` is enough: it calls :func:`install_import_hook`, which runs
:func:`ensure_processor_support` as soon as transformers' processor machinery
(``transformers.processing_utils``, ``transformers.models.auto.video_processing_auto``) has been
imported, or at once when it already is. ``import vlforge`` itself imports neither torch nor
transformers. With torchvision installed both do nothing, and stock transformers loads the stock
torchvision video processors named in the files.

Example:
    >>> import vlforge                                                  # installs the hook
    >>> from vlforge.models.compat import ensure_processor_support
    >>> ensure_processor_support() in (True, False)
    True
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)

_done = False
_running = False

#: Imported before the hook existed, these may still be half imported (checked by their spec's flag).
_KEY_MODULES = (
    "transformers",
    "transformers.image_processing_utils",
    "transformers.processing_utils",
    "transformers.video_processing_utils",
    "transformers.models.auto.video_processing_auto",
)
_TRIGGER = "transformers.processing_utils"
_handles: list[Any] = []
"""Every ``transformers`` module object seen in sys.modules (importing processing_utils makes a new one)."""
_executing: set[str] = set()
"""Watched modules whose code is running now (imports nest, so this is a stack without order)."""


def _watched(name: str) -> bool:
    """transformers and its submodules, and the module :func:`ensure_processor_support` imports from vlforge."""
    return name == "transformers" or name.startswith("transformers.") or name == "vlforge.models.frames_video"


def ensure_processor_support() -> bool:
    """Install the torchvision-free video path once; returns True when something was installed."""
    global _done, _running
    if _done or _running:
        return False
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return False
    _running = True  # the imports below come back through the hook
    try:
        _install()
    finally:
        _running = False
    _done = True
    _remove_hook()
    from vlforge.models.families import FAMILIES

    logger.debug("torchvision missing: %s use vlforge's frame video processors",
                 ", ".join(f.config_class for f in FAMILIES.values()))
    return True


def _install() -> None:
    import transformers
    from transformers import processing_utils, video_processing_utils
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor

    from vlforge.models import frames_video
    from vlforge.models.families import FAMILIES

    # Importing processing_utils replaces the lazy ``transformers`` module in sys.modules by a new one
    # (which processing_utils keeps); users may hold the earlier one: patch every handle.
    handles = (*_handles, transformers, processing_utils.transformers_module, sys.modules["transformers"])
    # the class ProcessorMixin checks a video processor against (VideoProcessorMixin; BaseVideoProcessor before 5.19)
    checked = processing_utils.MODALITY_TO_BASE_CLASS_MAPPING.get("video_processor", "VideoProcessorMixin")
    base = getattr(video_processing_utils, checked)
    for module in {id(handle): handle for handle in handles}.values():
        for name, value in ((checked, base), ("AutoVideoProcessor", AutoVideoProcessor)):
            if name not in vars(module) or getattr(vars(module)[name], "_backends", None):  # absent or a placeholder
                setattr(module, name, value)
    by_backend = "video_processor_classes" in inspect.signature(AutoVideoProcessor.register).parameters
    for record in FAMILIES.values():
        standin = frames_video.STOCK_STANDINS[record.stock_video_processor]
        config_class = getattr(transformers, record.config_class)
        if by_backend:  # the "alias" entry makes the stock name (as written in every file) resolve to our class
            AutoVideoProcessor.register(config_class, video_processor_classes={
                "torchvision": standin, "alias": record.stock_video_processor}, exist_ok=True)
            continue
        # transformers < 5.19 registers one class and resolves a file's stock name through the top module,
        # where it is a "requires torchvision" placeholder: our class takes the placeholder's place.
        AutoVideoProcessor.register(config_class, standin, exist_ok=True)
        for module in {id(handle): handle for handle in handles}.values():
            if getattr(getattr(module, record.stock_video_processor, None), "_backends", None):
                setattr(module, record.stock_video_processor, standin)


def _initializing(name: str, finished: str | None = None) -> bool:
    """True while ``name`` is being imported (its module exists but its code has not finished).

    ``finished`` has just run its code; the import system marks it done only after its loader returns.
    """
    if name == finished:
        return False
    if name in _executing:
        return True
    module = sys.modules.get(name)
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _note_transformers(finished: str | None = None) -> None:
    """Remember the ``transformers`` module object users may hold and un-gate its video names there.

    transformers' lazy top module answers a "requires torchvision" placeholder for ``AutoVideoProcessor``;
    without the gate, ``from transformers import AutoVideoProcessor`` imports the real module, whose
    import then installs the support.
    """
    module = sys.modules.get("transformers")
    if module is None or _initializing("transformers", finished) or any(m is module for m in _handles):
        return
    _handles.append(module)
    missing = getattr(module, "_object_missing_backend", None)
    if not isinstance(missing, dict):
        return
    for name in ("AutoVideoProcessor", "VIDEO_PROCESSOR_MAPPING"):
        if missing.get(name) == ["torchvision"] and name in getattr(module, "_class_to_module", {}):
            del missing[name]
            if getattr(vars(module).get(name), "_backends", None):  # a placeholder handed out earlier
                delattr(module, name)


def _after_import(finished: str | None = None) -> None:
    """Install the support once transformers' processor machinery is imported and no watched import is
    half done (installing in the middle of one would meet a partially initialised module)."""
    if _done:
        _remove_hook()
        return
    _note_transformers(finished)
    if _running or _TRIGGER not in sys.modules or _executing:
        return  # installing, not in use yet, or something half imported: the import completing it calls again
    if any(_initializing(name, finished) for name in _KEY_MODULES):
        return
    try:
        ensure_processor_support()
    except Exception as error:  # never break the user's import; the processor load then reports torchvision
        logger.warning("vlforge could not install its torchvision-free video processors: %s: %s",
                       type(error).__name__, error)


class _NotifyingLoader(importlib.abc.Loader):
    """Runs the real loader, then :func:`_after_import`; the module keeps the real loader."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        _executing.add(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            _executing.discard(self._name)
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        _after_import(self._name)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ... of the real loader
        return getattr(self._loader, name)


class _ProcessorHook(importlib.abc.MetaPathFinder):
    """Finds the watched transformers modules with the other finders and wraps their loaders."""

    vlforge_processor_hook = True

    def find_spec(self, fullname, path=None, target=None):
        if not _watched(fullname):
            return None
        for finder in list(sys.meta_path):
            if finder is self or getattr(finder, "vlforge_processor_hook", False):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, fullname)
                return spec
        return None


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "vlforge_processor_hook", False)]


def install_import_hook() -> bool:
    """Make transformers' processors work without torchvision from the moment they are imported.

    Idempotent; does nothing when torchvision is installed. When ``transformers.processing_utils`` is
    already imported, installs the support at once. Imports neither torch nor transformers itself.
    Returns True when the hook is (now or already) waiting for transformers.
    """
    if _done or importlib.util.find_spec("torchvision") is not None:
        return False
    if not any(getattr(f, "vlforge_processor_hook", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _ProcessorHook())
    _after_import()
    return not _done
