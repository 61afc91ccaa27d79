"""What a GPU node loads of capo-verl: the path it really runs, in a fresh process with verl's ``nvidia`` platform
forced and torch reporting CUDA. ``import verl`` (the plugin's entry point) and ``verl.trainer.ppo.ray_trainer``,
then the driver's call (verl's ``validate_config`` on the CAPO 1.5B recipe's config) and the TaskRunner's (one
``compute_advantage`` for ``capo``). After both, none of the CPU port, the study tools, the evaluation or the CLI's
plumbing is loaded: the start checks' preflight of files, which uses the CLI helpers, loads only in a process that
checks a run (verl's ``main_ppo``, a launch script's ``--dry-run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: modules a GPU worker never needs
NEVER = (
    "capo_verl.cpu",
    "capo_verl.compare",
    "capo_verl.evaluation",
    "capo_verl.commands",
    "capo_verl.inputs",
    "capo_verl.outputs",
    "capo_verl.compat.preflight",
)
#: lines of capo_verl loaded after both calls: a ceiling that keeps the plugin from growing back (8,787 when it was
#: set: 8,696 after the evaluation metrics moved to capo_verl.evaluation.metrics, then the checkpoint stamp, the run
#: summary's question counts and the recipe's estimator check; 10,847 before the preflight and the CLI helpers left
#: the workers)
MAX_LINES = 8_800

PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 8
    import verl  # noqa: F401  loads the plugin through its entry point
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
        cfg = compose(config_name="capo_qwen2.5_math_1.5b")
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

    bs, T = 8, 6
    mask = torch.ones(bs, T, dtype=torch.int64)
    rewards = torch.zeros(bs, T)
    rewards[:, -1] = torch.tensor([1.0, -1.0] * 4)
    batch = {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "old_log_probs": -torch.rand(bs, T),
        "ref_log_prob": -torch.rand(bs, T),
    }
    uids = np.array([f"q{i // 4}" for i in range(bs)], dtype=object)
    data = DataProto.from_dict(tensors=batch, non_tensors={"uid": uids})
    algo = OmegaConf.create({"adv_estimator": "capo", "gamma": 1.0, "lam": 1.0, "capo": {}})
    out = ray_trainer.compute_advantage(data, adv_estimator="capo", config=algo)
    loaded = {}
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "capo_verl" or name.startswith("capo_verl.")) and path and path.endswith(".py"):
            with open(path) as f:
                loaded[name] = sum(1 for _ in f)
    print(json.dumps({"loaded": loaded, "advantages": out.batch["advantages"][:, -1].tolist()}))
    """
)


def test_a_gpu_node_loads_the_plugin_only():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERL_USE_EXTERNAL_PLUGINS")}
    env.update(VERL_PLATFORM="nvidia", CAPO_DATA_DIR="/nonexistent/data", CAPO_CKPT_DIR="/nonexistent/ckpt")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "configs")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    advantages = seen["advantages"]
    assert len(advantages) == 8 and any(a != 0 for a in advantages)  # the estimator ran (correct vs incorrect)
    loaded = seen["loaded"]
    assert "capo_verl.estimators.capo" in loaded and "capo_verl.compat.run_checks" in loaded
    wrong = sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in NEVER))
    assert wrong == [], wrong
    assert sum(loaded.values()) <= MAX_LINES, sorted(loaded.items(), key=lambda kv: -kv[1])[:10]
