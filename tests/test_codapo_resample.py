"""CoDaPO's resampling (``algorithm.codapo.resample``): the selection and the apply step's batch against cases worked
by hand from the authors' code (tmlr-group/CoDaPO@210c2051 ``codapo/ray_trainer.py`` L1122-1170, L1348-1397) and
an independent transcription of their loop; the batch rebuild and the selection through verl's real v1 trainer
methods (patched by capo_verl.compat.codapo_sampling); the start-time checks."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin: installs the patches)
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn

from capo_verl.compat import codapo_sampling
from capo_verl.compat.codapo_sampling import check_resample_setup
from capo_verl.estimators.codapo import CodapoConfig, apply_batch_rows, pop_question_weights, select_questions


# --- hand-worked cases -------------------------------------------------------------------------------------------
def test_selection_hand_worked_top_quarter():
    # 8 questions; sorted weights 0.1 0.1 0.2 0.3 0.4 0.5 0.7 0.9; torch.quantile(., 0.75): position 0.75 * 7 = 5.25,
    # 0.5 + 0.25 * (0.7 - 0.5) = 0.55, so questions 4 (0.9) and 6 (0.7) qualify, in batch order
    weights = [0.1, 0.5, 0.3, 0.1, 0.9, 0.2, 0.7, 0.4]
    assert select_questions(weights, 0.75) == [4, 6]
    # the authors' apply batch of 8 prompts, repeat_count 4: question 4 four times, then question 6 four times
    assert apply_batch_rows([4, 6], 8, 4) == [4, 4, 4, 4, 6, 6, 6, 6]


def test_selection_ties_all_qualify_and_only_the_first_fill_the_batch():
    # every group all-right or all-wrong: every weight is the offset 0.1, the threshold is 0.1, all 4 qualify;
    # the authors' loop stops once the batch is full: question 0 four times
    assert select_questions([0.1, 0.1, 0.1, 0.1], 0.75) == [0, 1, 2, 3]
    assert apply_batch_rows([0, 1, 2, 3], 4, 4) == [0, 0, 0, 0]


def test_fewer_questions_than_the_batch_needs_cycle_from_the_first():
    # 2 selected for a 16-prompt batch at 4 each: the authors' loop starts again at question 0 (question_idx = 0)
    assert apply_batch_rows([5, 2], 16, 4) == [5] * 4 + [2] * 4 + [5] * 4 + [2] * 4
    # a batch that whole repeats do not fill: the last question is cut (refused at start: check_resample_setup)
    assert apply_batch_rows([3, 1], 6, 4) == [3, 3, 3, 3, 1, 1]


def test_selection_is_float32_quantile_as_the_authors():
    # the authors build torch.tensor(list of Python floats): float32; a weight equal to the threshold qualifies
    weights = [0.30000001, 0.3, 0.3, 0.3]
    threshold = torch.quantile(torch.tensor(weights), 0.5).item()
    assert select_questions(weights, 0.5) == [i for i, w in enumerate(torch.tensor(weights).tolist()) if w >= threshold]


def _authors_apply_rows(selected_questions, questions, batch_size, repeat_count):
    """Transcription of tmlr-group/CoDaPO@210c2051 codapo/ray_trainer.py L1140-1158 (matching by question text)."""
    selected_entity_indices = []
    question_idx = 0
    while len(selected_entity_indices) < batch_size:
        if question_idx < len(selected_questions):
            question_text = selected_questions[question_idx]
            matching_indices = [i for i, q in enumerate(questions) if q == question_text]
            for _ in range(repeat_count):
                if len(selected_entity_indices) < batch_size:
                    selected_entity_indices.extend(matching_indices)
            question_idx += 1
        else:
            question_idx = 0
    return selected_entity_indices[:batch_size]


def _authors_selection(uids, weights, percentile):
    """Transcription of L1356-1374 (uid2avg_weight in order of first appearance). Their weights are a float32 tensor
    (``compute_codapo_advantage``: ``torch.zeros(bsz, dtype=scores.dtype)``) read with ``.item()``."""
    weights = torch.tensor(weights, dtype=torch.float32)
    uid2weights = defaultdict(list)
    for entity_idx in range(len(weights)):
        uid2weights[uids[entity_idx]].append(weights[entity_idx].item())
    uid2avg_weight = {uid: ws[0] for uid, ws in uid2weights.items()}
    question_weights = torch.tensor(list(uid2avg_weight.values()))
    weight_threshold = torch.quantile(question_weights, percentile).item()
    return [uid for uid, w in uid2avg_weight.items() if w >= weight_threshold]


@pytest.mark.parametrize("seed", range(20))
def test_against_a_transcription_of_the_authors_loop(seed):
    rng = random.Random(seed)
    batch_size = rng.choice([4, 8, 16, 32])
    repeat_count = rng.choice([1, 2, 4, 8])
    percentile = rng.choice([0.5, 0.75, 0.9])
    questions = [f"q{i}" for i in range(batch_size)]  # distinct questions, one row each
    weights = [rng.choice([0.1, 0.1, 0.2, 0.35, 0.6, 1.0]) for _ in questions]
    selected = _authors_selection(questions, weights, percentile)
    picked = select_questions(weights, percentile)
    assert [questions[i] for i in picked] == selected
    assert apply_batch_rows(picked, batch_size, repeat_count) == _authors_apply_rows(
        selected, questions, batch_size, repeat_count
    )


def test_apply_rows_refuses_an_empty_selection():
    with pytest.raises(ValueError, match="no question was selected"):
        apply_batch_rows([], 4, 4)


# --- through verl's real trainer methods ---------------------------------------------------------------------------
def _trainer(resample=True, batch_size=4, n_prompts=12, **codapo):
    config = OmegaConf.create(
        {
            "data": {"train_batch_size": batch_size, "gen_batch_size": None},
            "algorithm": {"adv_estimator": "codapo", "codapo": {"resample": resample, **codapo}},
            "trainer": {"total_training_steps": None, "total_epochs": 1},
        }
    )
    rows = [{"raw_prompt": [{"role": "user", "content": f"question {i}"}], "index": i} for i in range(n_prompts)]
    trainer = PPOTrainerSync.__new__(PPOTrainerSync)  # verl's class, without Ray, workers or TransferQueue
    trainer.config = config
    trainer.train_dataloader = StatefulDataLoader(rows, batch_size=batch_size, collate_fn=collate_fn)
    trainer.train_dataloader_it = None
    trainer.global_steps = 1
    return trainer


def _texts(batch):
    return [p[0]["content"] for p in tu.get(batch, "raw_prompt")]


def _advantage_step(trainer, batch, rewards_of, lpm=-0.5):
    """The codapo estimator through verl's real compute_advantage on the step's prompts (4 responses each, rewards
    from ``rewards_of[text]``), then the resampling's after-advantage step; returns the step's metrics."""
    uids = codapo_sampling._uids(batch)
    index, rewards = [], []
    for uid, text in zip(uids, _texts(batch)):
        index += [uid] * 4
        rewards += rewards_of[text]
    bs, T = len(index), 3
    scores = torch.zeros(bs, T)
    scores[:, -1] = torch.tensor(rewards, dtype=torch.float32)
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": scores,
            "response_mask": torch.ones(bs, T, dtype=torch.int64),
            "old_log_probs": torch.full((bs, T), lpm),
        },
        non_tensors={"uid": np.array(index, dtype=object)},
    )
    ray_trainer.compute_advantage(data, "codapo", config=trainer.config.algorithm)
    metrics = {}
    codapo_sampling._after_advantage(trainer, codapo_sampling._state(trainer), metrics)
    return metrics


def test_prepare_then_apply_batches_through_verls_next_train_batch():
    trainer = _trainer()
    first = trainer._next_train_batch()
    assert _texts(first) == [f"question {i}" for i in range(4)]
    # p = 1/2 for question 2 (weight c + 0.1), p = 1/4 for question 1 (c * 3/4 + 0.1), 0 and 1 for the others (0.1):
    # quantile 0.75 of (0.1, 0.1 + 0.75c, 0.1 + c, 0.1) lies between the two mixed ones, so only question 2 qualifies
    rewards = {
        "question 0": [0, 0, 0, 0],
        "question 1": [1, 0, 0, 0],
        "question 2": [1, 1, 0, 0],
        "question 3": [1, 1, 1, 1],
    }
    metrics = _advantage_step(trainer, first, rewards)
    assert metrics["codapo/resample_apply_step"] == 0.0 and metrics["codapo/selected_questions"] == 1.0
    assert metrics["codapo/selected_weight_min"] == pytest.approx(np.exp(-0.5) + 0.1, rel=1e-6)

    trainer.global_steps = 2
    second = trainer._next_train_batch()
    assert _texts(second) == ["question 2"] * 4  # the selected question, repeat_count 4 times
    assert tu.get(second, "index") == [2, 2, 2, 2]
    uids = codapo_sampling._uids(second)
    assert len(set(uids)) == 4 and not set(uids) & set(codapo_sampling._uids(first))  # one group per row, fresh
    assert tu.get(second, "global_steps") == 2
    assert _advantage_step(trainer, second, {"question 2": [1, 0, 0, 0]}) == {"codapo/resample_apply_step": 1.0}

    trainer.global_steps = 3
    third = trainer._next_train_batch()  # a fresh loader batch: the loader was not touched by the apply step
    assert _texts(third) == [f"question {i}" for i in range(4, 8)]


def test_resampling_off_leaves_verls_next_train_batch_alone():
    trainer = _trainer(resample=False)
    assert _texts(trainer._next_train_batch()) == [f"question {i}" for i in range(4)]
    assert _texts(trainer._next_train_batch()) == [f"question {i}" for i in range(4, 8)]
    assert codapo_sampling._state(trainer) is None


def test_a_fresh_trainer_starts_with_a_prepare_step():
    # nothing of the pairing is checkpointed (as the authors'): after a resume the first step fetches a fresh batch
    trainer = _trainer()
    trainer.train_dataloader.load_state_dict(_advanced_loader_state())
    assert _texts(trainer._next_train_batch()) == [f"question {i}" for i in range(4, 8)]
    assert codapo_sampling._state(trainer).phase == "prepare"


def _advanced_loader_state():
    trainer = _trainer()
    trainer._next_train_batch()
    return trainer.train_dataloader.state_dict()


def test_estimator_leaves_question_weights_in_first_appearance_order():
    pop_question_weights()
    index = np.array(["u_b", "u_b", "u_a", "u_a"], dtype=object)
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]]),
            "response_mask": torch.ones(4, 2, dtype=torch.int64),
            "old_log_probs": torch.zeros(4, 2),
        },
        non_tensors={"uid": index},
    )
    ray_trainer.compute_advantage(data, "codapo", config=OmegaConf.create({}))
    got_uids, weights = pop_question_weights()
    assert got_uids == ["u_b", "u_a"]
    assert weights == pytest.approx([1.0 * 1.0 + 0.1, 0.1])  # c = exp(0) = 1, p = 1/2; all right: 0.1
    assert pop_question_weights() is None


# --- start-time checks ----------------------------------------------------------------------------------------------
def _config(**over):
    base = {
        "algorithm": {"adv_estimator": "codapo", "codapo": {"resample": True, "percentile": 0.75, "repeat_count": 4}},
        "data": {"train_batch_size": 16, "gen_batch_size": None},
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync", "sync": {"parameter_sync_step": 1}}},
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(over))


def test_check_passes_the_authors_values_and_ignores_resample_off():
    check_resample_setup(_config())
    check_resample_setup(_config(algorithm={"adv_estimator": "grpo", "codapo": {"resample": False}}))
    check_resample_setup(OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}}))


@pytest.mark.parametrize(
    "over, message",
    [
        ({"algorithm": {"codapo": {"percentile": 1.0}}}, r"algorithm\.codapo\.percentile must be a number in \(0, 1\)"),
        ({"algorithm": {"codapo": {"percentile": 0}}}, r"algorithm\.codapo\.percentile must be a number in \(0, 1\)"),
        ({"algorithm": {"codapo": {"repeat_count": 0}}}, r"algorithm\.codapo\.repeat_count must be an integer >= 1"),
        ({"algorithm": {"codapo": {"repeat_count": 2.5}}}, r"algorithm\.codapo\.repeat_count must be an integer"),
        ({"algorithm": {"codapo": {"resample": "yes"}}}, r"algorithm\.codapo\.resample must be true or false"),
        ({"data": {"train_batch_size": 6}}, r"repeat_count=4 cannot fill data\.train_batch_size=6"),
        ({"algorithm": {"codapo": {"repeat_count": 32}}}, r"repeat_count=32 cannot fill data\.train_batch_size=16"),
        ({"algorithm": {"adv_estimator": "grpo"}}, r"algorithm\.codapo\.resample=true needs algorithm\.adv_estimator"),
        ({"trainer": {"use_v1": False}}, r"trainer\.use_v1=false"),
        ({"trainer": {"v1": {"trainer_mode": "colocate_async"}}}, r"trainer\.v1\.trainer_mode=sync"),
        ({"trainer": {"v1": {"sync": {"parameter_sync_step": 2}}}}, r"parameter_sync_step=1"),
        ({"data": {"gen_batch_size": 1}}, r"data\.gen_batch_size"),
        ({"algorithm": {"filter_groups": {"enable": True}}}, r"filter_groups\.enable"),
    ],
)
def test_check_refuses_in_one_line(over, message):
    with pytest.raises(ValueError, match=message) as info:
        check_resample_setup(_config(**over))
    assert "\n" not in str(info.value)


def test_config_defaults_are_the_authors():
    cfg = CodapoConfig()
    assert (cfg.resample, cfg.percentile, cfg.repeat_count, cfg.weight_offset) == (False, 0.75, 4, 0.1)


def test_legacy_trainer_refuses_resampling():
    trainer = ray_trainer.RayPPOTrainer.__new__(ray_trainer.RayPPOTrainer)
    trainer.config = _config()
    with pytest.raises(
        RuntimeError, match=r"algorithm\.codapo\.resample=true\b.*\bv1 trainer\b.*algorithm\.codapo\.resample=false"
    ):
        trainer.fit()


def test_patches_refuse_a_verl_whose_code_changed():
    class PPOTrainer:
        def _init_dataloader(self):
            pass

        def _next_train_batch(self, count=None):  # verl renamed the parameter
            pass

        def _compute_advantage(self, batch, metrics):
            pass

    class Module:
        pass

    module = Module()
    module.PPOTrainer = PPOTrainer
    with pytest.raises(RuntimeError, match=r"PPOTrainer\._next_train_batch has parameters"):
        codapo_sampling._patch_trainer(module)


@pytest.mark.parametrize(
    "resample, total, steps_per_epoch, expected", [(True, None, 6, 18), (True, 5, 6, 5), (False, None, 3, 9)]
)
def test_init_dataloader_counts_both_steps_as_the_authors(monkeypatch, resample, total, steps_per_epoch, expected):
    """verl's ``_init_dataloader`` on 12 prompts, 4 a batch, 3 epochs: 3 loader batches; with resampling 6 steps per
    epoch and, unless ``total_training_steps`` is given, 18 steps (the authors' ``len(DuplicateBatchDataLoader)``)."""
    from verl.trainer.ppo.v1 import trainer_base

    rows = [{"raw_prompt": [{"role": "user", "content": f"question {i}"}], "index": i} for i in range(12)]
    monkeypatch.setattr(trainer_base, "create_rl_dataset", lambda *args, **kwargs: rows)
    monkeypatch.setattr(trainer_base, "create_rl_sampler", lambda *args, **kwargs: None)
    trainer = _trainer(resample=resample)
    trainer.config = OmegaConf.merge(
        trainer.config,
        {
            "data": {"train_files": "x", "val_files": "y", "dataloader_num_workers": 0, "val_batch_size": None},
            "trainer": {"total_epochs": 3, "total_training_steps": total, "v1": {"sampler": {}}},
            "actor_rollout_ref": {"actor": {"optim": {"total_training_steps": -1}}},
        },
    )
    trainer.trainer_mode, trainer.parameter_sync_step, trainer.tokenizer, trainer.processor = "sync", 1, None, None
    trainer._init_dataloader()
    assert (trainer.steps_per_epoch, trainer.total_training_steps) == (steps_per_epoch, expected)
    assert trainer.config.actor_rollout_ref.actor.optim.total_training_steps == expected
