"""``vlforge profile``: where the time of a vision-language model goes, component by component.

Example (CPU, seconds):
    >>> from rich.console import Console
    >>> from vlforge.profile import ProfileOptions, render, run_profile
    >>> report = run_profile(ProfileOptions(model="tiny:qwen3_vl", synthetic="2x64x64",
    ...                                     compare=["stock", "patched"], repeats=1))  # doctest: +SKIP
    >>> render(report, Console())  # doctest: +SKIP
"""

from vlforge.models.components import Component, discover
from vlforge.models.inputs import InputSpec, make_spec
from vlforge.profile.render import compare_table, plot, render, require_matplotlib, run_table
from vlforge.profile.report import Comparison, ComponentStats, ProfileReport, RunProfile
from vlforge.profile.runner import ProfileOptions, run_profile
from vlforge.profile.timer import ComponentTimer

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
