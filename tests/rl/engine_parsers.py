"""Run by the verl peer venv's python (``scripts/peer_env.py``): what an engine's own parser makes of a launch
command, as JSON on stdout. ``verl``: Hydra composes verl's packaged ``ppo_trainer`` config with the overrides, as
``python3 -m verl.trainer.main_ppo`` does; ``easyr1``: OmegaConf's command line merged over the file its
``config=`` names, as EasyR1's ``verl/trainer/main.py`` does. Argument: a JSON job
``{"engine", "overrides", "keys", "config_dir", "config_name"}``, or ``{"engine", "overrides", "values": true}``: each
override's value alone."""

import json
import sys

from omegaconf import OmegaConf


def values(job: dict) -> list:
    """Each ``KEY=VALUE`` word's value as the engine's parser reads it (Hydra's override parser; OmegaConf's dotlist)."""
    if job["engine"] == "verl":
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        return [override.value() for override in parser.parse_overrides(job["overrides"])]
    cfg = OmegaConf.from_dotlist(job["overrides"])
    return [OmegaConf.to_container(cfg, resolve=False)[word.partition("=")[0]] for word in job["overrides"]]


def main() -> None:
    job = json.loads(sys.argv[1])
    if job.get("values"):
        print(json.dumps(values(job)))
        return
    if job["engine"] == "verl":
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=job["config_dir"], version_base=None):
            cfg = compose(config_name=job["config_name"], overrides=job["overrides"])
    else:
        cli = OmegaConf.from_cli(job["overrides"])
        path = cli.pop("config")
        cfg = OmegaConf.merge(OmegaConf.load(path), cli)
    out = {}
    for key in job["keys"]:
        value = OmegaConf.select(cfg, key, default=None)
        out[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    print(json.dumps(out))


if __name__ == "__main__":
    main()
