"""CoDaPO's resampling (CoDaSampling / CoDaLearning, ``algorithm.codapo.resample: true``) in verl 0.9.1's v1 trainer.

The authors' trainer (tmlr-group/CoDaPO at commit 210c2051f54de76fdf92eb4cef9bb919dd404789, ``codapo/ray_trainer.py``)
trains on every prompt batch on two consecutive steps:

- **prepare** (their even loop index ``i``): a fresh loader batch, generated and trained as usual; after the advantage
  step, the questions whose CoDaPO weight is >= the ``percentile`` quantile of the batch's weights are kept
  (L1348-1397; :func:`capo_verl.estimators.codapo.select_questions`);
- **apply** (odd ``i``): the same loader batch (``DuplicateBatchDataLoader`` yields each batch twice, L83-108), rebuilt
  around the kept questions, each ``repeat_count`` times, cut to the batch size (L1122-1170;
  :func:`capo_verl.estimators.codapo.apply_batch_rows`), then generated, weighted and trained as usual. Each row
  of the rebuilt batch is its own group: the authors' rollout loop gives every prompt row a fresh ``uid``
  (``alphaapollo/core/generation/multi_turn_rollout/rollout_loop.py`` L305-311).

Both are ordinary training steps: each counts in ``trainer.global_steps`` and logs its metrics under its own step,
``total_training_steps`` defaults to twice the loader's batches per epoch (their ``len(DuplicateBatchDataLoader)``,
L96-97 and L690), and a checkpoint keeps the loader's state only (their ``state_dict``, L104-108), so a resumed run
starts with a prepare step on the next fresh batch (their ``enumerate`` restarts at ``i = 0``).

verl 0.9.1 has no public hook for choosing the next step's prompts, so this module wraps three methods of the v1
trainer's ``PPOTrainer`` (``verl/trainer/ppo/v1/trainer_base.py``), each only when the run's config has
``algorithm.codapo.resample: true`` (every other run goes through verl's methods unchanged):

- ``_init_dataloader``: doubles ``steps_per_epoch`` (each loader batch is two steps), and the default
  ``total_training_steps`` with it;
- ``_next_train_batch``: on a prepare step, verl's own (a fresh loader batch) and a copy of its prompts kept; on an
  apply step, the kept prompts rebuilt, with fresh ``uid``\\s, and no loader fetch;
- ``_compute_advantage``: after verl's (and :mod:`capo_verl.compat.advantage`'s) advantage step, reads the
  per-question weights the ``codapo`` estimator left (:func:`capo_verl.estimators.codapo.pop_question_weights`);
  on a prepare step selects the questions for the next step; adds ``codapo/resample_apply_step`` (0 prepare, 1
  apply), and on a prepare step ``codapo/selected_questions`` and ``codapo/selected_weight_min``, to the step's
  metrics; the prepare step's weights and selection are also logged as one JSON line (``capo-verl codapo resampling``).

The legacy trainer's ``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py``) refuses a run with
``resample: true`` (``main_ppo_v0`` reaches it whatever ``trainer.use_v1`` says).
:func:`check_resample_setup` refuses, at the start of a run (verl's ``validate_config``, through
:func:`capo_verl.compat.methods.check_method_configs`), every setup this does not cover. docs/algorithms/codapo.md
lists the differences from the authors' code.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from dataclasses import dataclass, field

from capo_verl.estimators.codapo import CodapoConfig, apply_batch_rows, pop_question_weights, select_questions
from capo_verl.estimators.registry import ESTIMATORS

from .patching import after_import, patch

__all__ = ["check_resample_setup", "install", "resample_config"]

logger = logging.getLogger("capo_verl")

_STATE_ATTR = "_capo_verl_codapo_resampling"


def _get(node, key: str):
    return node.get(key, None) if node is not None and hasattr(node, "get") else None


def resample_config(config) -> CodapoConfig | None:
    """The run's :class:`CodapoConfig` if ``algorithm.codapo.resample`` is true, else None.

    Args:
        config: the full trainer config (DictConfig or dict); ValueError for an invalid ``algorithm.codapo``.
    """
    cfg = CodapoConfig.from_algorithm_config(_get(config, "algorithm"))
    return cfg if cfg.resample else None


def check_resample_setup(config) -> None:
    """Refuse, at the start of a run, a ``resample: true`` setup that the resampling cannot run as specified.

    Nothing is checked when ``algorithm.codapo.resample`` is absent or false.

    Raises:
        ValueError: one line naming the key, its value and the allowed range: ``percentile`` outside (0, 1),
            ``repeat_count`` < 1 (both from :class:`CodapoConfig`); ``data.train_batch_size`` not a multiple of
            ``repeat_count`` (the apply step's batch cannot be filled with whole repeats); an
            ``algorithm.adv_estimator`` not declared with ``resamples=True`` (whose weights choose the questions,
            :attr:`~capo_verl.estimators.registry.EstimatorSpec.resamples`: ``codapo``); or a trainer setup whose
            steps do not each take one loader batch of ``train_batch_size`` prompts (``trainer.use_v1=false``,
            ``trainer.v1.trainer_mode`` other than ``sync``, ``parameter_sync_step`` > 1, ``data.gen_batch_size``
            != ``train_batch_size``, DAPO's ``algorithm.filter_groups.enable`` or
            ``trainer.v1.sampler.sync_refill_failed_groups``).
    """
    cfg = resample_config(config)
    if cfg is None:
        return
    algorithm = _get(config, "algorithm")
    name = _get(algorithm, "adv_estimator")
    name = getattr(name, "value", name)
    spec = ESTIMATORS.get(name)
    if spec is None or not spec.resamples:
        readers = sorted(s.name for s in ESTIMATORS.values() if s.resamples)
        raise ValueError(
            f"algorithm.codapo.resample=true needs algorithm.adv_estimator={' or '.join(readers)} (its weights choose "
            f"the questions), got {name!r}; set algorithm.adv_estimator={readers[0]} or algorithm.codapo.resample=false"
        )
    trainer = _get(config, "trainer")
    data = _get(config, "data")
    if _get(trainer, "use_v1") is False:
        raise ValueError(
            "algorithm.codapo.resample=true runs in verl's v1 trainer only, got trainer.use_v1=false; "
            "set trainer.use_v1=true (or algorithm.codapo.resample=false)"
        )
    v1 = _get(trainer, "v1")
    mode = _get(v1, "trainer_mode") or "sync"
    if mode != "sync":
        raise ValueError(
            f"algorithm.codapo.resample=true needs trainer.v1.trainer_mode=sync (one fresh batch per prepare step), "
            f"got {mode!r}; set trainer.v1.trainer_mode=sync"
        )
    sync_step = _get(_get(v1, mode), "parameter_sync_step") or 1
    if sync_step != 1:
        raise ValueError(
            f"algorithm.codapo.resample=true needs trainer.v1.sync.parameter_sync_step=1 (one advantage step per "
            f"training step), got {sync_step!r}; set trainer.v1.sync.parameter_sync_step=1"
        )
    batch_size = _get(data, "train_batch_size")
    gen_batch_size = _get(data, "gen_batch_size")
    if gen_batch_size not in (None, batch_size):
        raise ValueError(
            f"algorithm.codapo.resample=true needs data.gen_batch_size unset or equal to data.train_batch_size "
            f"({batch_size}), got {gen_batch_size!r}; set data.gen_batch_size=null"
        )
    if _get(_get(algorithm, "filter_groups"), "enable") or _get(_get(v1, "sampler"), "sync_refill_failed_groups"):
        raise ValueError(
            "algorithm.codapo.resample=true cannot run with algorithm.filter_groups.enable=true or "
            "trainer.v1.sampler.sync_refill_failed_groups=true (they refill a step with other prompts); set both false"
        )
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size % cfg.repeat_count:
        raise ValueError(
            f"algorithm.codapo.repeat_count={cfg.repeat_count} cannot fill data.train_batch_size={batch_size} with "
            f"whole repeats: repeat_count must divide train_batch_size (allowed: a divisor in [1, {batch_size}]); "
            "the authors use train_batch_size 16 with algorithm.codapo.repeat_count=4"
        )


@dataclass
class _Resampling:
    """One trainer's resampling state (not checkpointed: a resumed run starts with a prepare step, as the authors').

    Attributes:
        cfg: the run's ``algorithm.codapo``.
        phase: ``"prepare"`` or ``"apply"``: the step whose batch was fetched last.
        prompts: a copy of the last prepare step's prompt batch (verl TensorDict, one row per prompt), kept for the
            apply step.
        apply_rows: the rows of ``prompts`` the next step generates for, once the prepare step has selected them.
    """

    cfg: CodapoConfig
    phase: str = "prepare"
    prompts: object = None
    apply_rows: list[int] | None = field(default=None)


def _state(trainer) -> _Resampling | None:
    """The trainer's :class:`_Resampling` (made on first use from ``trainer.config``), or None when it is off."""
    if _STATE_ATTR not in trainer.__dict__:
        cfg = resample_config(trainer.config)
        trainer.__dict__[_STATE_ATTR] = None if cfg is None else _Resampling(cfg)
    return trainer.__dict__[_STATE_ATTR]


def _uids(batch) -> list:
    """The ``uid`` of every row of a verl prompt TensorDict, as a list of str."""
    from verl.utils import tensordict_utils as tu

    uids = tu.get(batch, "uid")
    return [str(u) for u in (uids.tolist() if hasattr(uids, "tolist") else uids)]


def _after_advantage(trainer, state: _Resampling, metrics: dict) -> None:
    """After a step's advantage step: its ``codapo/resample_*`` metrics, and on a prepare step the selection.

    Reads the weights :func:`~capo_verl.estimators.codapo.compute_codapo_outcome_advantage` left; questions whose
    uid is not a row of the kept prompt batch (verl's padding rows) are left out.

    Raises:
        RuntimeError: the ``codapo`` estimator did not run in this advantage step.
    """
    weights = pop_question_weights()
    if weights is None:
        raise RuntimeError(
            "CoDaPO resampling: the codapo estimator left no question weights in this step's advantage step; "
            "algorithm.adv_estimator must be codapo"
        )
    metrics["codapo/resample_apply_step"] = float(state.phase == "apply")
    if state.phase != "prepare" or state.prompts is None:
        return
    uids, question_weights = weights
    prompt_uids = _uids(state.prompts)
    row_of = {uid: row for row, uid in enumerate(prompt_uids)}
    pairs = [(str(u), w) for u, w in zip(uids, question_weights) if str(u) in row_of]
    picked = select_questions([w for _, w in pairs], state.cfg.percentile)
    state.apply_rows = apply_batch_rows([row_of[pairs[k][0]] for k in picked], len(prompt_uids), state.cfg.repeat_count)
    metrics["codapo/selected_questions"] = float(len(picked))
    metrics["codapo/selected_weight_min"] = float(min(pairs[k][1] for k in picked))
    record = {
        "step": int(trainer.global_steps),
        "weights": {u: float(w) for u, w in pairs},
        "selected": [pairs[k][0] for k in picked],
        "apply_rows": [prompt_uids[r] for r in state.apply_rows],
    }
    logger.warning("capo-verl codapo resampling %s", json.dumps(record))


@patch(
    "verl.trainer.ppo.v1.trainer_base",
    {
        "PPOTrainer._init_dataloader": ("self",),
        "PPOTrainer._next_train_batch": ("self", "num_prompts"),
        "PPOTrainer._compute_advantage": ("self", "batch", "metrics"),
    },
)
def _patch_trainer(trainer_base) -> None:
    """verl/trainer/ppo/v1/trainer_base.py: wrap ``PPOTrainer._init_dataloader``, ``_next_train_batch`` and
    ``_compute_advantage`` (module docstring); a run without ``algorithm.codapo.resample: true`` calls verl's own."""
    from verl.utils import tensordict_utils as tu

    cls = trainer_base.PPOTrainer
    init_dataloader = cls._init_dataloader
    next_train_batch = cls._next_train_batch
    compute_advantage = cls._compute_advantage

    @functools.wraps(init_dataloader)
    def _init_dataloader(self):
        init_dataloader(self)
        if _state(self) is None:
            return
        # every loader batch is two steps (the authors' len(DuplicateBatchDataLoader) = 2 * len(loader))
        self.steps_per_epoch *= 2
        if self.config.trainer.total_training_steps is None:
            self.total_training_steps = self.steps_per_epoch * self.config.trainer.total_epochs
            optim = self.config.actor_rollout_ref.actor.get("optim", None)
            if optim is not None:
                from omegaconf import open_dict

                with open_dict(self.config):
                    optim.total_training_steps = self.total_training_steps * self.parameter_sync_step
        logger.warning(
            "capo-verl: CoDaPO resampling on (percentile %s, repeat_count %d): each loader batch is a prepare and an "
            "apply step; %d steps per epoch, %d training steps",
            self.__dict__[_STATE_ATTR].cfg.percentile,
            self.__dict__[_STATE_ATTR].cfg.repeat_count,
            self.steps_per_epoch,
            self.total_training_steps,
        )

    @functools.wraps(next_train_batch)
    def _next_train_batch(self, num_prompts=None):
        state = _state(self)
        if state is None:
            return next_train_batch(self, num_prompts)
        batch_size = self.config.data.train_batch_size
        if num_prompts not in (None, batch_size):
            raise RuntimeError(
                f"CoDaPO resampling: verl asked for {num_prompts} prompts, expected data.train_batch_size={batch_size}"
            )
        if state.apply_rows is None:  # prepare step: a fresh loader batch, its prompts kept for the apply step
            batch = next_train_batch(self, num_prompts)
            state.phase = "prepare"
            state.prompts = tu.index_select_tensor_dict(batch, list(range(len(batch))))
            return batch
        rows, prompts = state.apply_rows, state.prompts
        state.apply_rows, state.prompts, state.phase = None, None, "apply"
        batch = tu.index_select_tensor_dict(prompts, rows)
        tu.assign_non_tensor_stack(batch, "uid", [str(uuid.uuid4()) for _ in rows])  # one group per row
        tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
        return batch

    @functools.wraps(compute_advantage)
    def _compute_advantage(self, batch, metrics):
        state = _state(self)
        if state is None:
            return compute_advantage(self, batch, metrics)
        pop_question_weights()
        out = compute_advantage(self, batch, metrics)
        _after_advantage(self, state, metrics)
        return out

    cls._init_dataloader = _init_dataloader
    cls._next_train_batch = _next_train_batch
    cls._compute_advantage = _compute_advantage


@patch("verl.trainer.ppo.ray_trainer", {"RayPPOTrainer.fit": ("self",)})
def _patch_legacy_trainer(ray_trainer) -> None:
    """verl/trainer/ppo/ray_trainer.py: ``RayPPOTrainer.fit`` refuses ``resample: true``.

    ``python -m verl.trainer.main_ppo_v0`` runs this legacy trainer whatever ``trainer.use_v1`` says, so the start
    check cannot see it; without this the run would train without resampling and say nothing.
    """
    cls = ray_trainer.RayPPOTrainer
    fit = cls.fit

    @functools.wraps(fit)
    def refusing_fit(self):
        if resample_config(self.config) is not None:
            raise RuntimeError(
                "algorithm.codapo.resample=true runs in verl's v1 trainer only, and this is the legacy trainer "
                "(trainer.use_v1=false or verl.trainer.main_ppo_v0); run python -m verl.trainer.main_ppo with "
                "trainer.use_v1=true, or set algorithm.codapo.resample=false"
            )
        return fit(self)

    cls.fit = refusing_fit


def install() -> None:
    """Register this module's patches with :func:`capo_verl.compat.after_import` (applied at verl's import)."""
    after_import("verl.trainer.ppo.v1.trainer_base", _patch_trainer)
    after_import("verl.trainer.ppo.ray_trainer", _patch_legacy_trainer)
