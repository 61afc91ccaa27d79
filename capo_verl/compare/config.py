"""The config of ``capo-verl compare``: where it is found, and the checks of each method's composed config that run
before anything is trained.

The configs ship inside the package (``capo_verl/compare/configs/*.yaml``, package data; in a source checkout that
folder is a link to the repository's ``configs/``), so the default config is found from an installed wheel too.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

from capo_verl import commands

#: the configs shipped with capo-verl (the base configs ``--config`` names by default)
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "compare_smollm2_135m_cpu"
#: MIN_VAL_QUESTIONS: the validation problems the default config's data holds (``--val-questions``' default; another
#: number writes its data to a folder of its own). MIN_VAL_SAMPLES: samples per question (``val_kwargs.n``) below
#: which ``capo-verl compare`` warns that a per-question AUC gets few answers.
MIN_VAL_QUESTIONS, MIN_VAL_SAMPLES = 64, 8
#: ``--val-questions all``: every GSM8K test calculation outside the held-out set that ``--val-questions
#: VAL_ALL_HELDOUT_AFTER`` has (the 64 problems after the first 256 of the shuffled slice), less those whose
#: expression is also a training row's
VAL_ALL, VAL_ALL_HELDOUT_AFTER = "all", 256


class UsageError(commands.UsageError):
    """A request ``capo-verl compare`` refuses before training anything (the CLI prints it on one line, exit 2:
    :func:`capo_verl.commands.main`)."""


def find_config_dir(config_name: str, config_dir: str | Path | None = None) -> Path:
    """The folder holding ``<config_name>.yaml``: ``config_dir`` if given, else the configs shipped with capo-verl.

    Raises:
        UsageError: the folder has no ``<config_name>.yaml``; the message names ``--config`` and ``--config-dir``.
    """
    folder = Path(config_dir).expanduser() if config_dir is not None else CONFIG_DIR
    if not (folder / f"{config_name}.yaml").is_file():
        where = f"--config-dir {folder}" if config_dir is not None else f"the configs shipped with capo-verl ({folder})"
        raise UsageError(
            f"config '{config_name}' not found in {where}: pass --config-dir DIR (a folder holding "
            f"{config_name}.yaml, e.g. a checkout's configs/) or --config NAME of a config there"
        )
    return folder.resolve()


def compose(config_name: str, config_dir: Path, overrides: list[str]):
    """The config verl's trainer composes from ``--config-path=config_dir --config-name=config_name overrides``.

    Raises:
        hydra / omegaconf errors: the overrides do not compose (unknown key, bad syntax, missing config).
    """
    import verl  # noqa: F401  loads the capo-verl plugin, as verl's launcher does
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def checked_config(label: str, config_name: str, config_dir: Path, overrides: list[str], *, validate: bool = True):
    """Compose a run's config and check it as verl's launcher does, before anything is trained.

    Checks: Hydra composition, every interpolation resolves; with ``validate`` also verl's ``validate_config``,
    the advantage estimator and policy loss are registered, ``trainer.total_training_steps >= 1`` (if set), and
    validation is sampled (``val_kwargs.do_sample``, ``temperature > 0``: a per-question AUC needs several answers).

    Returns:
        the composed ``DictConfig`` (interpolations unresolved).

    Raises:
        UsageError: any check fails; the one-line message starts with ``label``.
    """
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        cfg = compose(config_name, config_dir, overrides)
        OmegaConf.to_container(cfg, resolve=True)
        if not validate:
            return cfg
        with _quiet():  # verl's and capo-verl's notices about the run: its own log has them
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        get_adv_estimator_fn(cfg.algorithm.adv_estimator)
        get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    except Exception as exc:  # noqa: BLE001  whatever verl or Hydra refuse, the run would fail on it later
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"{label}: the overrides do not give a valid verl config: {message}") from exc
    steps = cfg.trainer.total_training_steps  # None: verl derives it from trainer.total_epochs
    if steps is not None and int(steps) < 1:
        raise UsageError(f"{label}: trainer.total_training_steps must be >= 1 (got {steps})")
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    if not val.do_sample or float(val.temperature) <= 0:
        raise UsageError(
            f"{label}: capo-verl compare needs sampled validation: set actor_rollout_ref.rollout."
            "val_kwargs.do_sample=true and temperature > 0 (the paper: 1.0)"
        )
    return cfg


@contextlib.contextmanager
def _quiet():
    """No warnings, stdout or capo-verl log records below ERROR inside the block."""
    log = logging.getLogger("capo_verl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def as_record(cfg) -> dict:
    """A composed config as plain JSON data (interpolations unresolved), for recording and comparing settings."""
    from omegaconf import OmegaConf

    return json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=False), default=str))
