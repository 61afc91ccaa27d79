"""The CPU port's values for verl's own config (capo_verl/cpu/defaults.py), and what the start of a run says about
its method (capo_verl/compat/start_report.py), on verl's ``ppo_trainer`` config with the keys of verl's GRPO
examples and ``algorithm.adv_estimator=capo``: the swap of the design, checked as the launch scripts' ``--dry-run``
checks a command (no Ray, no model loaded)."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path

import pytest

from capo_verl.cpu import defaults, launch
from capo_verl.cpu.precision import cpu_compute_dtype

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("swap_setup", Path(__file__).with_name("swap_setup.py"))
swap_setup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(swap_setup)
swap_overrides = swap_setup.swap_overrides


def checked(overrides: list[str]):
    return launch.checked_config([sys.executable, "-m", "verl.trainer.main_ppo", *overrides])


def test_every_key_the_cpu_port_sets_is_listed_in_docs_cpu_md_with_its_reason():
    text = (REPO / "docs" / "cpu.md").read_text()
    section = text.split("## What the CPU port sets in verl's own config", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| ([^|]+) \|", section, flags=re.M)
    assert [key for key, _, _ in rows] == [s.key for s in defaults.SETTINGS]
    for _, value, why in rows:
        assert value.strip() and len(why.strip()) > 20, (value, why)


def test_the_cpu_port_sets_what_verls_defaults_cannot_do_one_line_per_key(e2e_inputs, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="capo_verl")
    cfg = checked(swap_overrides(e2e_inputs, tmp_path / "swap"))
    set_lines = [r.getMessage() for r in caplog.records if r.name == "capo_verl.cpu.defaults"]
    dtype = cpu_compute_dtype().dtype
    expected = {
        "ray_kwargs.ray_init.num_cpus": 16,
        "ray_kwargs.ray_init.num_gpus": 1,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.ref.strategy": "fsdp2",
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.rollout.enable_sleep_mode": False,
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.enable_chunked_prefill": False,
    }
    if dtype == "float32":  # verl's defaults are bf16: set only on a CPU without bf16 instructions
        expected["actor_rollout_ref.rollout.dtype"] = "float32"
        expected["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"] = "fp32"
        expected["actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype"] = "fp32"
    from omegaconf import OmegaConf

    for key, value in expected.items():
        assert OmegaConf.select(cfg, key) == value, key
    # verl's ref.strategy is ${actor_rollout_ref.actor.strategy}: it follows the actor's, with no line of its own
    del expected["actor_rollout_ref.ref.strategy"]
    assert len(set_lines) == len(expected), set_lines
    for line, key in zip(set_lines, [s.key for s in defaults.SETTINGS if s.key in expected], strict=True):
        assert line.startswith(f"CPU port: {key}: ") and " -> " in line and "(" in line, line
    # the swap keys stay as typed
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True


def test_a_typed_value_wins_and_one_that_cannot_work_is_refused_with_a_fix_that_works(e2e_inputs, tmp_path):
    base = swap_overrides(e2e_inputs, tmp_path / "swap")
    cfg = checked([*base, "actor_rollout_ref.rollout.enforce_eager=false", "ray_kwargs.ray_init.num_cpus=12"])
    assert cfg.actor_rollout_ref.rollout.enforce_eager is False and cfg.ray_kwargs.ray_init.num_cpus == 12
    for typed, key in (
        ("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.strategy"),
        ("+actor_rollout_ref.rollout.enable_sleep_mode=true", "actor_rollout_ref.rollout.enable_sleep_mode"),
        ("+ray_kwargs.ray_init.num_gpus=0", "ray_kwargs.ray_init.num_gpus"),
    ):
        with pytest.raises(ValueError) as info:
            checked([*base, typed])
        message = str(info.value)
        assert message.startswith(f"{key}="), message
        fix = re.findall(r"set (\+?\S+)$", message)
        assert fix and fix[0].lstrip("+").startswith(key), message
        checked([*base, typed, fix[0]])  # pasted after the refused value, as a user would


def test_nothing_is_set_off_the_cpu(e2e_inputs, tmp_path):
    cfg_cpu = checked(swap_overrides(e2e_inputs, tmp_path / "a"))
    assert defaults.apply(cfg_cpu) == []  # a config that works is left as it is
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=["trainer.device=cuda"])
    assert defaults.apply(cfg) == [] and cfg.actor_rollout_ref.actor.strategy == "fsdp"


def test_the_start_says_what_the_method_will_do(e2e_inputs, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="capo_verl")
    checked(swap_overrides(e2e_inputs, tmp_path / "swap"))
    [block] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("capo-verl: what this run")]
    lines = dict(line.strip().split(": ", 1) for line in block.splitlines()[1:])
    assert lines["estimator"].startswith("capo (capo-verl; algorithm.capo: ")
    assert lines["KL in loss"].startswith("on (") and "low_var_kl" in lines["KL in loss"]
    assert "kl_loss_coef=0.001" in lines["KL in loss"] and "use_kl_loss=false" in lines["KL in loss"]
    assert lines["KL in reward"].startswith("off")
    # on for both of its uses: verl's KL loss, and CAPO's noise mask
    assert lines["reference pass"].startswith("on") and "KL term" in lines["reference pass"]
    assert "algorithm.capo.use_mask=true" in lines["reference pass"]
    # verl's default validation (n=1, greedy): val-calib off, with the keys that turn it on
    assert lines["val-calib"].startswith("off (") and "val_kwargs.n=1" in lines["val-calib"]
    assert "val_kwargs.do_sample=true" in lines["val-calib"]
    assert lines["dtype"].startswith("rollout ")
    # CapoConfig's default thresholds are the paper's, measured on Qwen2.5-Math, not on this reference model
    folder = Path(e2e_inputs.model).name
    assert "measured on qwen2.5-math" in lines["mask thresholds"] and folder in lines["mask thresholds"]
    assert "capo-verl mask-thresholds --model" in lines["mask thresholds"]
    [warning] = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "measured on" in r.getMessage()
    ]
    assert lines["mask thresholds"] in warning


@pytest.mark.parametrize(
    "model, low, high, use_mask, warns",
    [
        ("Qwen/Qwen2.5-Math-1.5B", 1.05, 2.5, True, None),  # the paper's pair on its model family
        ("/models/Qwen2.5-Math-7B/", 1.05, 2.5, True, None),
        ("~/.cache/capo-verl/SmolLM2-135M-Instruct", 3.97, 6.43, True, None),  # the CPU configs' own pair
        ("~/.cache/capo-verl/SmolLM2-135M-Instruct", 1.05, 2.5, True, "qwen2.5-math"),  # the paper's on SmolLM2
        ("Qwen/Qwen2.5-Math-1.5B", 3.97, 6.43, True, "smollm2-135m-instruct"),
        ("~/.cache/capo-verl/SmolLM2-135M-Instruct", 1.05, 2.5, False, None),  # no mask, no window
        ("~/.cache/capo-verl/SmolLM2-135M-Instruct", 3.0, 5.0, True, None),  # a pair of the user's own
    ],
)
def test_mask_thresholds_of_another_model_are_named(model, low, high, use_mask, warns):
    from omegaconf import OmegaConf

    from capo_verl.compat.start_report import thresholds_warning

    cfg = OmegaConf.create(
        {
            "algorithm": {"capo": {"ref_low": low, "ref_high": high, "use_mask": use_mask}},
            "actor_rollout_ref": {"model": {"path": model}},
        }
    )
    got = thresholds_warning(cfg, "capo")
    assert got == thresholds_warning(cfg, "grpo_mask")  # grpo_mask reads the same section
    assert thresholds_warning(cfg, "grpo") is None
    if warns is None:
        assert got is None
    else:
        folder = Path(model).name
        assert f"measured on {warns}" in got and f"reference model is {folder}" in got, got


def test_val_calib_true_with_verls_validation_is_refused_and_the_fix_works_pasted(e2e_inputs, tmp_path):
    base = swap_overrides(e2e_inputs, tmp_path / "swap")
    with pytest.raises(ValueError) as info:
        checked([*base, "+trainer.val_calib=true"])
    message = str(info.value)
    assert message.startswith("actor_rollout_ref.rollout.val_kwargs.n=1: ") and "val-calib/*" in message
    fix, off = message.rsplit("; set ", 1)[1].split(", or ")
    checked([*base, "+trainer.val_calib=true", *fix.split()])
    checked([*base, "+trainer.val_calib=true", off])
    assert off == "trainer.val_calib=false"  # the key exists once typed: no + needed after +trainer.val_calib=true
    with pytest.raises(ValueError) as info:  # n=4 alone: four greedy answers
        checked([*base, "+trainer.val_calib=true", "actor_rollout_ref.rollout.val_kwargs.n=4"])
    assert str(info.value).startswith("actor_rollout_ref.rollout.val_kwargs.do_sample=false: ")


def test_known_harmless_warnings_are_counted_in_the_run_and_others_still_print(tmp_path, monkeypatch, capsys):
    """A known log record or Python warning is counted in the run's ledger, not printed; an unknown one on the same
    logger prints; the owner's one line sums them, most frequent first."""
    from capo_verl.cpu import quiet, shm

    ledger = str(tmp_path / "run.shm")
    monkeypatch.setenv(shm.RUN_ENV, ledger)
    quiet.install_filters()
    worker = logging.getLogger("vllm.v1.worker.cpu_worker")  # vLLM's CPU worker, as it logs
    handler = logging.StreamHandler()
    worker.addHandler(handler)
    try:
        for _ in range(3):
            worker.warning("sleep mode is not supported on CPU, ignore it.")
        worker.warning("libtcmalloc is not found in LD_PRELOAD. For best performance, please follow ...")
        worker.warning("something else went wrong")
    finally:
        worker.removeHandler(handler)
    # verl's rollout logs under its file's name (logging.getLogger(__file__))
    [_, by_file] = quiet.logger_names("verl.workers.rollout.vllm_rollout.vllm_rollout")
    logging.getLogger(by_file).warning("IPC is not supported on your devices. Falling back to shared memory ...")
    shown = []
    showwarning = quiet._showwarning(lambda message, *args: shown.append(str(message)))
    for name in ("torchtitan", "veomni"):
        showwarning(UserWarning(f"{name} engine is not available: ModuleNotFoundError('{name}')"), UserWarning, "x", 1)
    showwarning(UserWarning("another warning"), UserWarning, "x", 1)
    assert capsys.readouterr().err.splitlines() == ["something else went wrong"]
    assert shown == ["another warning"]
    counts = shm.recorded_quiet(ledger)
    assert sorted(counts.values()) == [1, 1, 2, 3] and shm.recorded(ledger) == []  # no segment paths among them
    line = shm.not_shown_line(counts)
    assert re.match(r"7 warnings\b.*: 3 x vLLM's CPU worker has no sleep\b", line), (
        line
    )  # the total, then most frequent
    assert line.index("2 x a training engine") < line.index("1 x vLLM's CPU worker suggests")


def test_every_known_warning_names_a_logger_that_exists():
    """Each logger of quiet.KNOWN_RECORDS is a module of the installed verl, vLLM, Ray or transformers (a filter on
    a logger nobody uses would drop nothing), whose source still holds the message."""
    import importlib.util
    import re

    from capo_verl.cpu import quiet

    for name, pattern, _ in quiet.KNOWN_RECORDS:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, name
        source = Path(spec.origin).read_text()
        literal = re.sub(r"\\(.)", r"\1", pattern.lstrip("^"))
        assert literal[:24] in source, (name, literal)


def test_docs_list_every_reason_a_warning_is_not_shown():
    from capo_verl.cpu import quiet

    text = (Path(__file__).resolve().parents[1] / "docs" / "cpu.md").read_text()
    listed = text.split("<!-- quiet reasons -->\n", 1)[1].split("<!-- /quiet reasons -->", 1)[0]
    reasons = [why for _, _, why in quiet.KNOWN_RECORDS] + [why for _, why in quiet.KNOWN_WARNINGS]
    assert listed.splitlines() == [f"- {why}" for why in dict.fromkeys(reasons)]
