"""``vlforge profile``: where the time of a vision-language model goes, component by component.

Example (CPU, seconds):
    >>> from rich.console import Console
    >>> from vlforge.profile import ProfileOptions, render, run_profile
    >>> report = run_profile(ProfileOptions(model="tiny:qwen3_vl", synthetic="2x64x64",
    ...                                     compare=["stock", "patched"], repeats=1))  # doctest: +SKIP
    >>> render(report, Console())  # doctest: +SKIP
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "Component": "vlforge.models.components",
    "discover": "vlforge.models.components",
    "InputSpec": "vlforge.models.inputs",
    "make_spec": "vlforge.models.inputs",
    "compare_table": "vlforge.profile.render",
    "plot": "vlforge.profile.render",
    "render": "vlforge.profile.render",
    "require_matplotlib": "vlforge.profile.render",
    "run_table": "vlforge.profile.render",
    "Comparison": "vlforge.profile.report",
    "ComponentStats": "vlforge.profile.report",
    "ProfileReport": "vlforge.profile.report",
    "RunProfile": "vlforge.profile.report",
    "ProfileOptions": "vlforge.profile.options",
    "run_profile": "vlforge.profile.runner",
    "ComponentTimer": "vlforge.profile.timer",
}
lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Comparison",
    "Component",
    "ComponentStats",
    "ComponentTimer",
    "InputSpec",
    "ProfileOptions",
    "ProfileReport",
    "RunProfile",
    "compare_table",
    "discover",
    "make_spec",
    "plot",
    "render",
    "require_matplotlib",
    "run_profile",
    "run_table",
]
