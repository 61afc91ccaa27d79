"""Run a training command so that Ctrl-C and SIGTERM stop all of it, and nothing of it is left behind.

    python -m capo_verl.cpu.launch [--grace S] -- python -m verl.trainer.main_ppo ...

The launch scripts (``scripts/*.sh``), ``capo-verl compare`` and the tests start verl's trainer through this. Left to
itself, a terminal's Ctrl-C reaches every process of a local Ray run at once (the trainer went on training), and a
SIGTERM ends the driver but leaves Ray's agents running and vLLM's ring buffers in ``/dev/shm``. Here:

1. The command runs in its own session, as the *run*: it and every process it starts (Ray's local cluster, its
   workers, vLLM's processes) inherit :data:`capo_verl.cpu.shm.RUN_ENV`, the path of the run's ledger of
   ``/dev/shm`` segments (:func:`capo_verl.cpu.shm.start_run`). If this launcher dies, the command gets SIGTERM.
2. The first SIGINT, SIGTERM or SIGHUP sends SIGTERM to the command (verl's driver: Ray shuts its local cluster down),
   waits up to ``--grace`` s for it, then SIGTERM and, 5 s later, SIGKILL to every process of the run still alive.
   A second SIGINT or SIGTERM kills them at once. Checkpoints already written stay: verl writes
   ``latest_checkpointed_iteration.txt`` after a checkpoint is complete, and resuming
   (``trainer.resume_mode=auto``) reads that file.
3. However the command ends, the run's processes still alive are stopped the same way, then the segments in the
   ledger are removed, and the loky semaphores of the run's processes (those recorded in the ledger and those this
   launcher saw while the run went on: :data:`WATCH_S`) (:func:`capo_verl.cpu.shm.cleanup_run`); nothing another
   program made is touched.
4. Ray's session folder (logs, sockets, spilled objects; Ray never deletes it) goes to a folder of the run's own,
   ``$TMPDIR/capo-ray-XXXXXXXX/ray/session_*`` (``RAY_TMPDIR``; ``/tmp`` when ``TMPDIR`` is unset), instead of
   ``/tmp/ray``, which every Ray on the machine shares. When the run ends with status 0, or is stopped by a signal,
   and none of its processes is left, the launcher removes that folder: no other program uses it. After a failure
   it is kept, for Ray's logs, and its path is printed (an empty one is removed). With ``RAY_ADDRESS`` (an
   existing cluster, whose session folder is the cluster's) or ``RAY_TMPDIR`` set, the launcher changes nothing and
   removes nothing. A launcher killed by SIGKILL cannot remove it.

``python -m capo_verl.cpu.launch --dry-run -- python -m verl.trainer.main_ppo ...`` starts nothing: it composes the
command's config as verl's trainer does, runs verl's ``validate_config`` (with capo-verl's checks) and prints the
resolved config, or one ``error: ...`` line and exit status 2 (:func:`dry_run`; the launch scripts' ``--dry-run``).

Exit status: the command's (128 + the signal number when a signal killed it); 130 / 143 / 129 after a stop by
SIGINT / SIGTERM / SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable

from capo_verl.cpu import shm

#: seconds the command gets to end by itself after the first stop signal (verl's driver shuts Ray down in ~5 s)
DEFAULT_GRACE_S = 15.0
#: seconds between SIGTERM and SIGKILL for the run's processes that are still alive after the grace period
KILL_AFTER_S = 5.0

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: prefix of the run's own Ray temp folder (short: Ray's socket paths under it must stay below 107 bytes)
RAY_DIR_PREFIX = "capo-ray-"
#: Ray's longest socket path below its temp folder (a 7-digit pid)
_RAY_SOCKET_TAIL = "ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"


def own_ray_tmpdir(environ=os.environ) -> str | None:
    """A new, empty folder for the run's Ray session (to be its ``RAY_TMPDIR``), in the folder Ray would use:
    ``TMPDIR``, else ``/tmp`` (also when ``TMPDIR`` is too long for Ray's socket paths). None when ``RAY_TMPDIR`` is
    set (the user's choice) or ``RAY_ADDRESS`` names an existing cluster (the session folder is the cluster's)."""
    if environ.get("RAY_TMPDIR") or environ.get("RAY_ADDRESS"):
        return None
    base = environ.get("TMPDIR") or "/tmp"
    if len(os.path.join(base, RAY_DIR_PREFIX + "X" * 8, _RAY_SOCKET_TAIL)) > 107:  # a Unix socket path's limit
        base = "/tmp"
    try:
        return tempfile.mkdtemp(prefix=RAY_DIR_PREFIX, dir=base)
    except OSError as e:  # TMPDIR missing or read-only: Ray itself would fail there too
        if base == "/tmp":
            raise
        print(
            f"capo-verl launch: cannot create the run's Ray folder in TMPDIR={base} ({e}); using /tmp", file=sys.stderr
        )
        return tempfile.mkdtemp(prefix=RAY_DIR_PREFIX, dir="/tmp")


#: seconds between two looks at the run's processes (their pids name the loky semaphores they may leave)
WATCH_S = 2.0


def run_processes(ledger: str, session: int | None = None) -> list[int]:
    """PIDs of the live processes of the run whose ledger is ``ledger``: those whose environment names it (read
    from ``/proc/<pid>/environ``; a process that is not ours cannot be read and is not counted), and those of the
    command's session ``session``. This process is never in the list."""
    pids = set(shm.processes_carrying(ledger))
    for entry in os.listdir("/proc") if session is not None and os.path.isdir("/proc") else ():
        if entry.isdigit() and int(entry) not in pids:
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == session:
                    pids.add(int(entry))
    pids.discard(os.getpid())
    return sorted(p for p in pids if _alive(p))


def _alive(pid: int) -> bool:
    """False for an ended process and for a zombie (ended, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _set_parent_death_signal() -> None:
    """In the command's process, before exec: SIGTERM when this launcher dies (Linux ``prctl``; no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Run:
    """One command run under the launcher (see the module docstring)."""

    def __init__(self, cmd: list[str], grace_s: float = DEFAULT_GRACE_S, log=sys.stderr):
        self.cmd = cmd
        self.grace_s = grace_s
        self.log = log
        self.ledger = shm.start_run()
        self.stop_signal: int | None = None
        self.stop_time: float | None = None
        self.kill_now = False
        self.proc: subprocess.Popen | None = None
        self.ray_tmpdir: str | None = None
        #: pids of the run's processes seen while it ran (:func:`run_processes`), for :func:`shm.cleanup_run`
        self.seen: set[int] = set()

    def _say(self, message: str) -> None:
        print(f"capo-verl launch: {message}", file=self.log, flush=True)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            self.stop_time = time.monotonic()
            self._say(
                f"{signal.Signals(signum).name}: stopping the run (checkpoints already written are kept); "
                f"up to {self.grace_s + 2 * KILL_AFTER_S:.0f} s; Ctrl-C again to kill it now"
            )
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(self.proc.pid, signal.SIGTERM)
        elif signum != signal.SIGHUP:
            self.kill_now = True

    def _stop_all(self, session: int) -> None:
        """SIGTERM every process of the run still alive, SIGKILL after :data:`KILL_AFTER_S` (at once after a second
        signal), and wait up to :data:`KILL_AFTER_S` more for them to end."""
        pids = run_processes(self.ledger, session)
        self.seen.update(pids)
        if not pids:
            return
        if not self.kill_now:
            _signal_all(pids, signal.SIGTERM)
            deadline = time.monotonic() + KILL_AFTER_S
            while pids and time.monotonic() < deadline and not self.kill_now:
                time.sleep(0.2)
                pids = run_processes(self.ledger, session)
        _signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + KILL_AFTER_S
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = run_processes(self.ledger, session)
        if pids:
            self._say(f"processes of the run still alive after SIGKILL: {pids}")

    def _end_ray_tmpdir(self, rc: int, session: int) -> None:
        """Remove the run's own Ray folder (module docstring, point 4), or say where it is kept and why."""
        if self.ray_tmpdir is None or not os.path.isdir(self.ray_tmpdir):
            return
        if rc != 0 and self.stop_signal is None and os.listdir(self.ray_tmpdir):
            self._say(f"the run failed; Ray's logs of it are kept in {self.ray_tmpdir} (delete the folder when done)")
        elif run_processes(self.ledger, session):
            self._say(f"processes of the run still alive: its Ray folder {self.ray_tmpdir} is kept")
        else:
            shutil.rmtree(self.ray_tmpdir, ignore_errors=True)
            if os.path.exists(self.ray_tmpdir):
                self._say(f"could not remove all of the run's Ray folder {self.ray_tmpdir}")

    def __call__(self) -> int:
        rc, session = 1, -1
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        try:
            try:
                self.ray_tmpdir = own_ray_tmpdir()
            except OSError as exc:  # /tmp itself cannot take it (TMPDIR's failure falls back to /tmp)
                self._say(
                    f"error: cannot create the run's Ray folder in /tmp ({exc.strerror or exc}); export "
                    "TMPDIR=<a folder you can write> (e.g. export TMPDIR=$HOME/tmp after mkdir -p $HOME/tmp)"
                )
                return 2
            env = None if self.ray_tmpdir is None else {**os.environ, "RAY_TMPDIR": self.ray_tmpdir}
            self.proc = subprocess.Popen(self.cmd, start_new_session=True, preexec_fn=_set_parent_death_signal, env=env)
            session = self.proc.pid
            self.seen.add(session)
            next_watch = time.monotonic() + WATCH_S
            while True:
                try:
                    rc = self.proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() >= next_watch:
                    self.seen.update(run_processes(self.ledger, session))
                    next_watch = time.monotonic() + WATCH_S
                if self.kill_now or (self.stop_time is not None and time.monotonic() - self.stop_time > self.grace_s):
                    self._stop_all(session)
            self._stop_all(session)  # what outlived the command (e.g. Ray's agents)
        finally:
            not_shown = shm.not_shown_line(shm.recorded_quiet(self.ledger))
            removed = shm.cleanup_run(self.ledger, pids=self.seen)
            if self.proc is None and self.ray_tmpdir is not None:  # the command did not start: nothing in it
                shutil.rmtree(self.ray_tmpdir, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if not_shown:
            self._say(not_shown)
        if removed:
            self._say(f"removed {len(removed)} shared-memory segment(s) of the run from /dev/shm")
        self._end_ray_tmpdir(rc, session)
        hint = resume_hint(self.ledger)
        if self.stop_signal is not None:
            self._say(
                f"run stopped {time.monotonic() - self.stop_time:.0f} s after {signal.Signals(self.stop_signal).name}; "
                + hint
            )
            return 128 + self.stop_signal
        return 128 - rc if rc < 0 else rc


def resume_hint(ledger: str) -> str:
    """What a stopped run can do next: resume from the last complete checkpoint in the folder its trainer recorded
    (:func:`capo_verl.cpu.defaults.record_checkpoint_folder`), named, with ``trainer.resume_mode=auto``; or, when none
    was written, that the same command starts again from the model. The note is removed."""
    from capo_verl.compat.run_summary import last_checkpoint

    note = shm.checkpoint_note(ledger)
    try:
        with open(note) as f:
            folder = f.read().strip()
        os.unlink(note)
    except OSError:
        folder = None
    checkpoint = last_checkpoint(folder) if folder else None
    if checkpoint is None:
        return "no checkpoint was written, so the same command starts again from the model"
    return f"to resume from its last checkpoint ({checkpoint}), run the same command with trainer.resume_mode=auto"


def launch_command(cmd: list[str], grace_s: float | None = None) -> list[str]:
    """``cmd`` under this launcher, by this interpreter:
    ``[python, -m, capo_verl.cpu.launch, (--grace S), --, *cmd]``."""
    grace = [] if grace_s is None else ["--grace", str(grace_s)]
    return [sys.executable, "-m", "capo_verl.cpu.launch", *grace, "--", *cmd]


def run_launched(cmd: list[str], grace_s: float | None = None, **popen_kwargs) -> int:
    """Run ``cmd`` under this launcher (:func:`launch_command`) and return its exit status; for a Python program
    that starts a training (``capo-verl compare``).

    Ctrl-C in a terminal reaches both this process and the launcher (one process group): here the
    KeyboardInterrupt waits for the launcher to stop the run (a second Ctrl-C makes it kill the run at once), then
    propagates. A SIGTERM or SIGHUP sent to this process alone (``kill PID``) is passed on to the launcher and then
    handled as Ctrl-C (KeyboardInterrupt); and if this process dies anyway (SIGKILL), the launcher gets SIGTERM
    (Linux ``prctl``), so the run never outlives it. ``popen_kwargs`` go to :class:`subprocess.Popen` (``cwd``,
    ``env``, ``stdout``, ...).
    """
    proc = subprocess.Popen(launch_command(cmd, grace_s), preexec_fn=_set_parent_death_signal, **popen_kwargs)

    def pass_on(signum, frame):
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signum)
        raise KeyboardInterrupt

    previous = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers belong to the main thread
        previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    except KeyboardInterrupt:
        while True:
            try:
                proc.wait()
                break
            except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: the launcher kills the run at once
                continue
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: ``python -m`` modules of verl's trainer whose command line :func:`trainer_args` reads
TRAINER_MODULES = ("verl.trainer.main_ppo", "verl.trainer.main_ppo_v0")


def trainer_args(cmd: list[str]) -> tuple[str, str, list[str]]:
    """``(config dir, config name, overrides)`` of ``cmd``, a ``python -m verl.trainer.main_ppo ...`` command line.

    ``--config-path``/``-cp`` (default: verl's ``verl/trainer/config``) and ``--config-name``/``-cn`` (default
    ``ppo_trainer``), as ``=VALUE`` or as the next argument; every other argument is a Hydra override.

    Raises:
        ValueError: ``cmd`` does not run one of :data:`TRAINER_MODULES`, or has another ``-`` option.
    """
    start = next(
        (i + 2 for i in range(len(cmd) - 1) if cmd[i] == "-m" and cmd[i + 1] in TRAINER_MODULES),
        None,
    )
    if start is None:
        raise ValueError(f"not a command of verl's trainer (python -m {' | '.join(TRAINER_MODULES)} ...): {cmd}")
    options = {"--config-path": None, "--config-name": None}
    aliases = {"-cp": "--config-path", "-cn": "--config-name"}
    overrides: list[str] = []
    args = iter(cmd[start:])
    for arg in args:
        name, eq, value = arg.partition("=")
        name = aliases.get(name, name)
        if name in options:
            options[name] = value if eq else next(args, None)
        elif arg.startswith("-"):
            raise ValueError(f"{arg}: not an option the dry run knows (--config-path, --config-name)")
        else:
            overrides.append(arg)
    config_dir = options["--config-path"]
    if config_dir is None:
        import verl

        config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    return os.path.abspath(config_dir), options["--config-name"] or "ppo_trainer", overrides


def checked_config(cmd: list[str], script_files: Iterable[str] = ()):
    """The config of ``cmd`` (:func:`trainer_args`), composed like verl's trainer composes it, after verl's
    ``validate_config`` (with capo-verl's checks, the data files' included); nothing is started or loaded.

    Args:
        cmd: a ``python -m verl.trainer.main_ppo ...`` command line.
        script_files: data files and the model folder the launch script writes (or says it lacks) before a real
            run: not refused.

    Returns:
        The OmegaConf ``DictConfig``.

    Raises:
        whatever the composition or the checks raise (``ValueError``, ``AssertionError``, Hydra's errors).
    """
    import verl  # noqa: F401  loads the capo-verl plugin (estimators, compat) like verl's launcher does
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from capo_verl.compat.run_checks import launch_script_files

    config_dir, config_name, overrides = trainer_args(cmd)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    with launch_script_files(script_files, overrides):
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg


def dry_run(cmd: list[str], script_files: Iterable[str] = ()) -> int:
    """Print the resolved config of ``cmd`` after the checks of :func:`checked_config` and return 0; or print one
    line, ``error: <type>: <message>``, on stderr and return 2. Starts nothing."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    print("# resolved config (composed like verl.trainer.main_ppo, checked with verl's validate_config):", flush=True)
    try:
        cfg = checked_config(cmd, script_files)
    except (ValueError, RuntimeError, AssertionError, HydraException, OmegaConfBaseException) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"error: {type(exc).__name__}: {message}", file=sys.stderr)
        return 2
    print(OmegaConf.to_yaml(cfg, resolve=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m capo_verl.cpu.launch",
        description="Run a command (verl's trainer) so that Ctrl-C / SIGTERM stop all of its processes and remove "
        "the /dev/shm segments they made.",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        help="seconds the command gets to end after the first stop signal (default: %(default)s)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="start nothing: print the resolved config of a verl trainer command after verl's validate_config "
        "(capo-verl's checks included), or one error line and exit status 2",
    )
    parser.add_argument(
        "--script-file",
        action="append",
        default=[],
        metavar="PATH",
        help="with --dry-run: a data file or model folder the launch script writes before a real run (not refused "
        "as missing)",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command: python -m capo_verl.cpu.launch -- COMMAND [ARG ...]")
    if args.dry_run:
        return dry_run(cmd, args.script_file)
    if not args.grace >= 0:
        parser.error(f"--grace {args.grace}: must be >= 0 seconds")
    return Run(cmd, args.grace)()


if __name__ == "__main__":
    sys.exit(main())
