"""Zero-RL pre-flight: will a GRPO run on this model, template and reward learn its format?

``vlforge rl check`` answers from the files (token audit, the engine's decode, the template's pre-fill);
``vlforge rl probe`` samples groups of completions and scores them; :class:`PreflightCallback` does both inside a
TRL ``GRPOTrainer`` and stops a run that cannot learn. See docs/rl.md.

Example:
    >>> from vlforge.rl import RunRequest, resolve, run_check     # doctest: +SKIP
    >>> run_check(resolve(RunRequest(model="ckpt", format_regex="^<think>.*</think>"))).verdict  # doctest: +SKIP
    'dead'
"""

from vlforge.lazy import lazy_exports

_EXPORTS = {
    "PreflightCallback": "vlforge.rl.callback",
    "RunCannotLearn": "vlforge.rl.callback",
    "CheckReport": "vlforge.rl.check",
    "run_check": "vlforge.rl.check",
    "ProbeReport": "vlforge.rl.probe",
    "run_probe": "vlforge.rl.probe",
    "RunRequest": "vlforge.rl.spec",
    "RunSpec": "vlforge.rl.spec",
    "resolve": "vlforge.rl.spec",
}
lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
