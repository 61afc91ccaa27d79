"""``global_step_<N>/capo_verl.json`` (:func:`.resume.run_identity`), written as verl's ``PPOTrainer`` (v1) and
``RayPPOTrainer``'s ``_save_checkpoint(self)`` start; the ``resume_state`` start check compares it (:mod:`.resume`)."""

import functools
import json
import logging
import os

from .patching import after_import, patch


def write_stamp(config, step: int) -> str | None:
    """Write step ``step``'s stamp into verl's ``<trainer.default_local_dir>/global_step_<step>``; its path, or None:
    a remote folder (skipped), or one warning line when it cannot be written (never raises: the save stands)."""
    from .resume import STAMP, run_identity  # loaded at the first save only

    folder = str(config.trainer.default_local_dir)
    path = os.path.join(folder, f"global_step_{step}", STAMP)
    try:
        if "://" not in folder:
            stamp = run_identity(config)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(stamp, f, indent=1, sort_keys=True, default=str)
            return path
    except (OSError, ValueError) as exc:
        logging.getLogger("capo_verl").warning("capo-verl: %s not written (%s); a resume is not checked", path, exc)


def _wrap(cls) -> None:
    original = cls._save_checkpoint

    @functools.wraps(original)
    def _save_checkpoint(self, *args, **kwargs):
        write_stamp(self.config, self.global_steps)  # before verl's tracker names the step
        return original(self, *args, **kwargs)

    cls._save_checkpoint = _save_checkpoint


@patch("verl.trainer.ppo.v1.trainer_base", {"PPOTrainer._save_checkpoint": ("self",)})
def _stamp_v1_saves(trainer_base) -> None:
    _wrap(trainer_base.PPOTrainer)


@patch("verl.trainer.ppo.ray_trainer", {"RayPPOTrainer._save_checkpoint": ("self",)})
def _stamp_legacy_saves(ray_trainer) -> None:
    _wrap(ray_trainer.RayPPOTrainer)


def install() -> None:
    after_import("verl.trainer.ppo.v1.trainer_base", _stamp_v1_saves)
    after_import("verl.trainer.ppo.ray_trainer", _stamp_legacy_saves)
