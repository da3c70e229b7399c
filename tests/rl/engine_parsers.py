"""Run by the verl peer venv's python (``scripts/peer_env.py``): what an engine's own parser makes of a launch
command, as JSON on stdout. ``verl``: Hydra composes verl's packaged ``ppo_trainer`` config with the overrides, as
``python3 -m verl.trainer.main_ppo`` does; ``easyr1``: OmegaConf's command line merged over the file its
``config=`` names, as EasyR1's ``verl/trainer/main.py`` does. Argument: a JSON job
``{"engine", "overrides", "keys", "config_dir", "config_name"}``."""

import json
import sys

from omegaconf import OmegaConf


def main() -> None:
    job = json.loads(sys.argv[1])
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
