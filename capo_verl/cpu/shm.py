"""``/dev/shm`` segments of a run: recorded where they are created, removed by the run that made them.

vLLM's processes are killed at the end of a Ray run (or when a run is stopped) before they unlink their ring buffers
(``MessageQueue`` in ``vllm/distributed/device_communicators/shm_broadcast.py``, hundreds of MB each), and a failed
weight sync leaves verl's ``verl_weights_*`` bucket (``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py``).
Both are Python ``multiprocessing.shared_memory.SharedMemory`` segments; ``psm_*`` is also Python's default name for
any other program's segment, so nothing here removes a segment by its name pattern or its age. vLLM's CPU worker also
leaves a POSIX semaphore of joblib's loky, ``sem.loky-<pid>-<random>``, named by the process that made it.

How a run knows its own segments:

- The *owner* of a run (:func:`start_run`: :mod:`capo_verl.cpu.launch`, which the launch scripts, ``capo-verl compare``
  and the tests run verl's trainer under; or, without it, the first process outside Ray that imports verl, e.g.
  ``python -m verl.trainer.main_ppo`` started by hand) puts the path of a ledger file in the environment variable
  :data:`RUN_ENV`. Every process the run starts inherits it: Ray's local cluster started by the trainer, its
  workers, vLLM's engine and worker processes.
- In every process that carries :data:`RUN_ENV` and loads capo-verl's CPU port (``import verl``: verl's plugin entry
  point; vLLM's ``load_general_plugins``: the ``vllm.general_plugins`` entry point :func:`capo_verl.cpu.vllm_plugin`,
  before vLLM creates its ring buffers), each ``SharedMemory(create=True)`` and each loky ``SemLock`` appends its
  ``/dev/shm`` path to the ledger, and the process appends its own pid (:func:`record_created`). The launcher adds the
  pids of the run's processes it sees (:mod:`capo_verl.cpu.launch`), also of those that never load capo-verl.
- When the run ends, the owner removes the ledger's segments that still exist, and the loky semaphores named by a pid
  of the run that no live process maps (:func:`cleanup_run`): a loky semaphore made before capo-verl loaded in its
  process (so not recorded by path) is still the run's. A segment that another program made is never in the ledger,
  whatever its name, age or mapping, and its pid is not one of the run's.

Part of the CPU port: installed by :func:`capo_verl.cpu.install` (``import verl``, only where verl finds no
accelerator: :func:`capo_verl.compat.host.cpu_port_needed`), and in vLLM's processes by the ``vllm.general_plugins``
entry point :func:`capo_verl.cpu.vllm_plugin` (pyproject.toml), which records nothing where torch sees an
accelerator. The launcher (:mod:`capo_verl.cpu.launch`) owns a run on any host: its ledger then holds the pids it
names. The ledger also counts the warnings the CPU port did not print (:mod:`capo_verl.cpu.quiet`), which the owner
reports in one line.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import logging
import os
import secrets
import tempfile
from types import ModuleType

from capo_verl.compat.patching import after_import, patch

logger = logging.getLogger("capo_verl.cpu.shm")

#: environment variable naming the ledger file of the run a process belongs to (one absolute path per line)
RUN_ENV = "CAPO_VERL_RUN"

SHM_DIR = "/dev/shm"

#: a ledger line naming a process of the run
PID_PREFIX = "pid:"
#: a ledger line counting one warning the CPU port did not print, with its reason (:mod:`capo_verl.cpu.quiet`)
QUIET_PREFIX = "quiet:"
#: a ledger's file name in the temp dir: ``capo-verl-run-<pid of its owner>-<random>.shm`` (:func:`new_ledger`)
LEDGER_GLOB = "capo-verl-run-*-*.shm"

#: joblib's loky names a semaphore ``/loky-<pid of its maker>-<random>``; POSIX puts it in ``/dev/shm/sem.<name>``
LOKY_SEMAPHORE = "sem.loky-{pid}-*"

_recording = False


def new_ledger(directory: str | None = None) -> str:
    """Path of a new ledger in ``directory`` (default: the temp dir); the file is created by the first
    :func:`record`, so a run that makes no segment leaves no file."""
    name = f"capo-verl-run-{os.getpid()}-{secrets.token_hex(8)}.shm"
    return os.path.join(directory or tempfile.gettempdir(), name)


def checkpoint_note(ledger: str) -> str:
    """The file beside a run's ledger that names its checkpoint folder
    (:func:`capo_verl.cpu.defaults.record_checkpoint_folder`); removed with the ledger."""
    return f"{ledger}.checkpoints"


def record(path: str, ledger: str | None = None) -> None:
    """Append ``path`` to the run's ledger (``ledger``, default: :data:`RUN_ENV`; no-op when neither is set).

    One ``write`` of one line on an ``O_APPEND`` descriptor: lines of concurrent processes do not interleave.
    """
    ledger = ledger or os.environ.get(RUN_ENV)
    if not ledger:
        return
    try:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:  # a ledger in a removed temp dir: the segment is not ours to lose track of silently
        logger.warning("cannot record %s in the run's ledger %s: %s", path, ledger, exc)
        return
    try:
        os.write(fd, (path + "\n").encode())
    finally:
        os.close(fd)


def _lines(ledger: str) -> list[str]:
    try:
        with open(ledger) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def recorded(ledger: str) -> list[str]:
    """The paths recorded in ``ledger``, once each, in order (empty when it does not exist)."""
    return list(dict.fromkeys(line for line in _lines(ledger) if line.startswith("/")))


def record_pid(pid: int | None = None, ledger: str | None = None) -> None:
    """Record ``pid`` (default: this process) as a process of the run (:func:`record`'s ``ledger``)."""
    record(f"{PID_PREFIX}{os.getpid() if pid is None else int(pid)}", ledger)


def recorded_pids(ledger: str) -> list[int]:
    """The pids recorded in ``ledger`` (:func:`record_pid`), once each, in order."""
    pids = (line[len(PID_PREFIX) :] for line in _lines(ledger) if line.startswith(PID_PREFIX))
    return list(dict.fromkeys(int(p) for p in pids if p.isdigit()))


def recorded_quiet(ledger: str) -> dict[str, int]:
    """``{reason: count}`` of the warnings not printed that ``ledger`` counts (:data:`QUIET_PREFIX`)."""
    counts: dict[str, int] = {}
    for line in _lines(ledger):
        if line.startswith(QUIET_PREFIX):
            why = line[len(QUIET_PREFIX) :]
            counts[why] = counts.get(why, 0) + 1
    return counts


def not_shown_line(counts: dict[str, int]) -> str | None:
    """The one line of the warnings :mod:`capo_verl.cpu.quiet` did not print (``counts``: :func:`recorded_quiet`):
    ``"N warnings known to be harmless on a CPU not shown: n x why; ..."``, most frequent first; None for none."""
    if not counts:
        return None
    parts = "; ".join(f"{n} x {why}" for why, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return f"{sum(counts.values())} warnings known to be harmless on a CPU not shown: {parts}"


def _mapped_inodes() -> set[int]:
    """Inodes of the ``/dev/shm`` files that live processes map (those of other users cannot be read: not counted).
    By inode: glibc maps a named semaphore under a temporary name, then links it to its real one."""
    inodes = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                inodes.update(int(line.split()[4]) for line in f if f" {SHM_DIR}/" in line)
        except (OSError, ValueError, IndexError):  # ended, or not ours to read
            continue
    return inodes


def loky_semaphores(pids) -> list[str]:
    """The ``/dev/shm/sem.loky-<pid>-*`` files of ``pids`` that this user owns and no live process maps."""
    paths = sorted({p for pid in pids for p in glob.glob(os.path.join(SHM_DIR, LOKY_SEMAPHORE.format(pid=int(pid))))})
    if not paths:
        return []
    mapped = _mapped_inodes()
    kept = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and st.st_ino not in mapped:
            kept.append(path)
    return kept


def cleanup_run(ledger: str, remove_ledger: bool = True, pids=()) -> list[str]:
    """Unlink the ``/dev/shm`` segments recorded in ``ledger`` that still exist and this user owns, and the loky
    semaphores (:func:`loky_semaphores`) of the pids recorded in it or given in ``pids``; returns them.

    A segment still mapped by a process keeps its memory until that process unmaps it (POSIX ``shm_unlink``), so
    this is safe to call while the run's last processes are exiting (a loky semaphore still mapped is left: its
    process is alive). ``remove_ledger``: delete the ledger file too.
    """
    removed = []
    paths = recorded(ledger)
    paths += [p for p in loky_semaphores([*recorded_pids(ledger), *pids]) if p not in paths]
    for path in paths:
        if os.path.dirname(path) != SHM_DIR:  # only what record_created() writes
            continue
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
        except OSError:  # removed by its creator (the normal case), or not ours
            continue
        removed.append(path)
    if remove_ledger:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ledger)
    return removed


def processes_carrying(ledger: str) -> list[int]:
    """PIDs of the live processes whose environment names ``ledger`` in :data:`RUN_ENV` (read from
    ``/proc/<pid>/environ``; a process that is not this user's cannot be read and is not counted), this one excluded."""
    marker = f"{RUN_ENV}={ledger}".encode()
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # ended, or not ours
            continue
    return pids


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def cleanup_dead_runs(directory: str | None = None) -> list[str]:
    """Remove what runs that ended without cleaning up left (their owner SIGKILLed, the machine's session ended):
    for each ledger in ``directory`` (default: the temp dir; :data:`LEDGER_GLOB`) whose owner process is gone and
    that no live process still carries, its recorded ``/dev/shm`` segments (:func:`cleanup_run`: only those this
    user owns), the ledger and its checkpoint note. A ledger whose owner lives, or whose pid is now another
    process's, is left alone. Returns the segments removed."""
    removed = []
    for ledger in glob.glob(os.path.join(directory or tempfile.gettempdir(), LEDGER_GLOB)):
        owner = os.path.basename(ledger).split("-")[3]
        if not owner.isdigit() or _owner_alive(int(owner)) or processes_carrying(ledger):
            continue
        removed += cleanup_run(ledger)
        with contextlib.suppress(OSError):
            os.unlink(checkpoint_note(ledger))
    return removed


def record_created() -> None:
    """In this process: every ``SharedMemory(create=True)`` and loky ``SemLock`` records its path in the run's
    ledger, and the process its pid (idempotent; no-op outside a run, i.e. without :data:`RUN_ENV`)."""
    global _recording
    if _recording or not os.environ.get(RUN_ENV):
        return
    after_import("multiprocessing.shared_memory", _record_shared_memory)
    after_import("joblib.externals.loky.backend.synchronize", _record_loky_semaphores)
    record_pid()  # its loky semaphores made before this point are still found by their name
    _recording = True


@patch(
    "multiprocessing.shared_memory",
    {"SharedMemory.__init__": ("self", "name", "create", "size")},
    written_against="Python 3.11",
)
def _record_shared_memory(shared_memory: ModuleType) -> None:
    """``multiprocessing/shared_memory.py``: every ``SharedMemory(create=True)`` records its ``/dev/shm`` path."""
    original_init = shared_memory.SharedMemory.__init__

    @functools.wraps(original_init)
    def __init__(self, name=None, create=False, size=0, *args, **kwargs):
        original_init(self, name, create, size, *args, **kwargs)
        if create:
            record(os.path.join(SHM_DIR, self.name))

    shared_memory.SharedMemory.__init__ = __init__


@patch(
    "joblib.externals.loky.backend.synchronize",
    {"SemLock.__init__": ("self", "kind", "value", "maxvalue")},
    written_against="joblib 1.6.0",
)
def _record_loky_semaphores(synchronize: ModuleType) -> None:
    """``joblib/externals/loky/backend/synchronize.py``: every ``SemLock`` records its ``/dev/shm/sem.loky-*`` file.

    vLLM's CPU worker makes one through joblib's loky; loky unlinks it when the process exits normally, not when it
    is killed at the end of a Ray run.
    """
    original_init = synchronize.SemLock.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        record(os.path.join(SHM_DIR, "sem." + self._semlock.name.lstrip("/")))

    synchronize.SemLock.__init__ = __init__


def start_run() -> str:
    """Make this process the owner of a new run: a fresh ledger in :data:`RUN_ENV` (inherited by every process
    started from here on, which then record their segments); returns the ledger's path. The caller removes the
    segments with :func:`cleanup_run` when the run ends. First, the leftovers of earlier runs that ended without
    cleaning up (:func:`cleanup_dead_runs`) are removed, with one log line."""
    removed = cleanup_dead_runs()
    if removed:
        logger.info("removed %d shared-memory segment(s) of earlier runs that ended without cleanup", len(removed))
    ledger = new_ledger()
    os.environ[RUN_ENV] = ledger
    record_created()
    return ledger


def _own_run_at_exit() -> None:
    """Outside a run and outside Ray (``python -m verl.trainer.main_ppo`` by hand, a notebook, pytest): start one,
    and remove its segments at this process's exit (what the processes it started recorded; nothing else)."""
    if os.environ.get(RUN_ENV) or os.environ.get("RAY_RAYLET_PID"):
        return
    ledger = start_run()
    pid = os.getpid()

    def at_exit():
        if os.getpid() != pid:  # a forked child inherited the handler
            return
        quiet = not_shown_line(recorded_quiet(ledger))
        if quiet:
            logger.info("%s", quiet)
        removed = cleanup_run(ledger)
        with contextlib.suppress(OSError):  # written by the checks of a run (or a --dry-run) this process owned
            os.unlink(checkpoint_note(ledger))
        if removed:
            logger.info("removed %d shared-memory segments of this run from /dev/shm", len(removed))

    atexit.register(at_exit)


@patch(
    "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",
    {"BucketedWeightSender.async_send_weights": ("self", "weights"), "create_shared_memory": ("size", "name")},
)
def _remove_failed_buckets(transfer: ModuleType) -> None:
    """``bucketed_weight_transfer.py``: a failed send removes its ``/dev/shm`` bucket (verl loses track of it when
    the first send fails)."""
    from multiprocessing import shared_memory

    cls = transfer.BucketedWeightSender
    original_send = cls.async_send_weights
    original_create = transfer.create_shared_memory
    created: list[str] = []

    @functools.wraps(original_create)
    def create_shared_memory(size, name):
        segment = original_create(size, name)
        created.append(name)
        return segment

    @functools.wraps(original_send)
    async def async_send_weights(self, weights):
        first = len(created)
        try:
            return await original_send(self, weights)
        finally:
            for name in created[first:]:
                with contextlib.suppress(FileNotFoundError):  # verl's own cleanup already removed it
                    segment = shared_memory.SharedMemory(name=name)
                    segment.close()
                    segment.unlink()
            del created[first:]

    transfer.create_shared_memory = create_shared_memory
    cls.async_send_weights = async_send_weights


def install() -> None:
    """Bucket removal on a failed send; in a run, the recording of this process's segments; outside a run and
    outside Ray, a run owned by this process (:func:`_own_run_at_exit`)."""
    after_import("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer", _remove_failed_buckets)
    _own_run_at_exit()
    record_created()
