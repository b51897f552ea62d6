"""The one subprocess wrapper, for the tools patchkit drives that have no library (``pip``,
``patch``, ``skopeo``, ``ssh``, ``docker buildx``), and for a command the user gives
(``bisect --series --run``): :func:`run_user`, with a deadline and its output bounded; and
:class:`Piped`, a child that is one end of a byte stream the caller moves through the kernel
(``docker save`` into ``ssh NODE docker load``).

Every child that patchkit waits for is started with :func:`dies_with_us` (git's clones and
fetches too, through GitPython): the kernel kills it when patchkit ends, ``kill -9`` included.  A stream from
:func:`spawn` ends when its pipes close, which they do when patchkit ends."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from patchkit import interrupt, progress
from patchkit.errors import CommandError

_PR_SET_PDEATHSIG = 1   # linux/prctl.h


def _prctl():
    """libc's ``prctl``, looked up once, before any fork (a child must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def dies_with_us() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when patchkit ends, however it ends
    (``kill -9`` included): nothing patchkit starts outlives it.  A parent gone before the
    request took hold is caught by its pid.  None where the kernel has no such request."""
    if _PRCTL is None:
        return None
    parent = os.getpid()
    return lambda: bind_to_parent(parent)


def bind_to_parent(parent: int) -> None:
    """In a child of ``parent`` (a worker process patchkit forked): be killed when it ends."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(137)


def run(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, check: bool = True,
        input: str | None = None, text: bool = True, timeout: float | None = None,
        on_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``; on a non-zero exit (with ``check``) raise CommandError with its output.
    With ``text`` false, stdout and stderr are the bytes the command wrote.  A command that
    runs past ``timeout`` seconds, or is interrupted, is killed; the timeout is a CommandError
    whose ``timeout`` is set.  With ``on_line``, stderr joins stdout and each line goes to
    ``on_line`` as it comes; the error's output is then the last lines only."""
    progress.command(cmd)
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        if on_line is not None:
            proc = _streamed(cmd, cwd, full_env, on_line)
        else:
            proc = subprocess.run(list(cmd), cwd=cwd, env=full_env, input=input, text=text,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=None if input is not None else subprocess.DEVNULL,
                                  timeout=timeout,  # run() kills the child on any exception
                                  preexec_fn=dies_with_us())
    except FileNotFoundError as exc:
        raise CommandError(list(cmd), 127, f"{cmd[0]}: not found ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        out = b"".join(o if isinstance(o, bytes) else (o or "").encode()
                       for o in (exc.stdout, exc.stderr))
        raise CommandError(list(cmd), -9, out.decode(errors="replace"), timeout) from None
    interrupt.check()  # a child stopped by ^C is an interruption, not a failed command
    if check and proc.returncode != 0:
        out, err = ((o.decode(errors="replace") if isinstance(o, bytes) else o or "")
                    for o in (proc.stdout, proc.stderr))
        raise CommandError(list(cmd), proc.returncode, out + err)
    return proc


def spawn(cmd: Sequence[str]) -> subprocess.Popen:
    """Start ``cmd`` with binary pipes on its stdin, stdout and stderr, in a session of its
    own, for a byte stream the caller drives (the ssh session of an engine connection): a ^C
    at the terminal is the caller's to handle, and it ends the command by closing the pipes
    (then ``terminate``)."""
    progress.command(cmd)
    try:
        # no death signal here: the kernel sends it when the *thread* that started the
        # child ends, and a stream outlives the thread that opened it (a connection pool);
        # it ends with patchkit all the same, when its stdin closes
        return subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise CommandError(list(cmd), 127, f"{cmd[0]}: cannot run it ({exc.strerror})") from None


class Piped:
    """A child whose stdin (``feed``) or stdout (``drain``) is a pipe of which the caller holds
    the other end as a raw, non-blocking file descriptor, ``fd``: the bytes go between
    children through the kernel (``os.splice``) and never become Python objects.  Its other
    output (stdout of a feed child, stderr always) is kept for the one line of an error.  It
    runs in a session of its own: a ^C is the caller's to handle, and :meth:`end` kills it."""

    PIPE_SIZE = 1 << 20   # fewer, larger hand-overs between the children and the pump

    def __init__(self, cmd: Sequence[str], *, feed: bool,
                 env: Mapping[str, str] | None = None) -> None:
        self.cmd = list(cmd)
        read, write = os.pipe()
        mine, theirs = (write, read) if feed else (read, write)
        try:
            self.proc = subprocess.Popen(
                self.cmd, stdin=theirs if feed else subprocess.DEVNULL,
                stdout=subprocess.PIPE if feed else theirs, stderr=subprocess.PIPE,
                env={**os.environ, **env} if env is not None else None, start_new_session=True)
        except OSError as exc:
            os.close(mine)
            raise CommandError(self.cmd, 127, f"{cmd[0]}: cannot run it ({exc.strerror})"
                               ) from None
        finally:
            os.close(theirs)
        self.fd: int | None = mine
        os.set_blocking(mine, False)
        try:
            fcntl.fcntl(mine, fcntl.F_SETPIPE_SZ, self.PIPE_SIZE)
        except OSError:
            pass   # a smaller pipe works too
        self.out, self.err = b"", b""
        self._lock = threading.Lock()
        self._collected = False

    def close(self) -> None:
        """Let go of this end: a feed child reads the end of its input."""
        with self._lock:
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def wait(self, timeout: float) -> int | None:
        """The exit code once the child has ended, within ``timeout`` seconds of waiting (what
        it wrote is then in ``out`` and ``err``); None when it has not, and is still running."""
        self.close()
        if self._collected:
            return self.proc.returncode
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.out, self.err, self._collected = out or b"", err or b"", True
        return self.proc.returncode

    def ended_badly(self, within: float) -> bool:
        """Whether it has ended, or ends within ``within`` seconds, with an error; this end
        left open (a child still writing is not made to fail)."""
        try:
            return self.proc.wait(timeout=within) != 0
        except subprocess.TimeoutExpired:
            return False

    def end(self, close: bool = True) -> None:
        """Kill it (a stream abandoned, or an interruption), and collect it; nothing when it
        has been collected already.  ``close=False`` leaves this end open, for a thread that
        may still be using it (the process's exit closes it)."""
        if close:
            self.close()
        if self._collected:
            return
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass
        try:
            out, err = self.proc.communicate(timeout=5)
            self.out, self.err, self._collected = out or self.out, err or self.err, True
        except (subprocess.TimeoutExpired, ValueError, OSError):
            pass

    def said(self) -> str:
        """The last line the child wrote on stderr, stripped."""
        lines = [t.strip() for t in self.err.decode(errors="replace").splitlines()]
        return next((t for t in reversed(lines) if t), "")


def _streamed(cmd: Sequence[str], cwd, env, on_line: Callable[[str], None],
              keep: int = 20) -> subprocess.CompletedProcess:
    """``cmd`` with its lines handed on as they come; the last ``keep`` lines kept."""
    tail: list[str] = []
    with subprocess.Popen(list(cmd), cwd=cwd, env=env, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          preexec_fn=dies_with_us()) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                on_line(line.rstrip("\n"))
                tail = (tail + [line])[-keep:]
        except BaseException:
            proc.kill()  # an interrupted build must not go on behind patchkit's back
            raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, "".join(tail), "")


@dataclass(frozen=True)
class Finished:
    """How a user's command ended: its exit code (negative: the signal that ended it), or
    ``timed_out`` when it ran past its deadline and was killed; the last bytes it wrote."""

    returncode: int | None
    output: str
    truncated: bool        # it wrote more than was kept: ``output`` is the end of it
    seconds: float
    timed_out: bool = False


def run_user(cmd: Sequence[str], *, env: Mapping[str, str], timeout: float,
             keep: int = 64 * 1024, cwd: str | os.PathLike[str] | None = None) -> Finished:
    """Run a command the user gave, in a session of its own, stdout and stderr together; keep
    the last ``keep`` bytes of what it writes.  Past ``timeout`` seconds, or on an interruption,
    every process of its session is killed; so are those it leaves behind when it ends (they
    hold its output open)."""
    started = time.monotonic()
    progress.command(cmd)
    try:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env={**os.environ, **env},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=dies_with_us())
    except OSError as exc:
        raise CommandError(list(cmd), 127, f"{cmd[0]}: cannot run it ({exc.strerror})") from None
    watchdog = _watchdog(proc.pid)
    tail = _Tail(keep)
    reader = threading.Thread(target=tail.drain, args=(proc.stdout,), daemon=True)
    reader.start()
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        _kill_session(proc)
        if watchdog is not None:
            watchdog.stdin.close()   # its work is done: it ends
            watchdog.wait()
        proc.wait()
        reader.join(timeout=5)
        # a process that left the session may still hold the pipe: its reader is left to it
        # (closing under a blocked read would wait for that read)
        if proc.stdout is not None and not reader.is_alive():
            proc.stdout.close()
    interrupt.check()
    return Finished(None if timed_out else proc.returncode, tail.text(), tail.dropped > 0,
                    time.monotonic() - started, timed_out)


def _watchdog(session: int) -> subprocess.Popen | None:
    """A small process that kills every process of ``session`` when its stdin closes: when
    ``run_user`` is done with it, or when patchkit ends in any way (``kill -9`` included), since
    only patchkit holds the other end.  The death signal reaches the user's command alone; this
    reaches what that command started too."""
    try:
        return subprocess.Popen(["sh", "-c", 'cat >/dev/null; kill -9 "-$1" 2>/dev/null',
                                 "patchkit-watchdog", str(session)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Tail:
    """The last ``keep`` bytes of a stream, and how many came before them."""

    def __init__(self, keep: int) -> None:
        self.keep, self.data, self.dropped = keep, bytearray(), 0

    def drain(self, stream) -> None:
        try:
            while chunk := stream.read1(65536):
                self.data += chunk
                if len(self.data) > self.keep:
                    cut = len(self.data) - self.keep
                    self.dropped += cut
                    del self.data[:cut]
        except (OSError, ValueError):
            pass  # closed under it: the command is gone

    def text(self) -> str:
        return bytes(self.data).decode(errors="replace")


class WorkerError(Exception):
    """A call into a :class:`Worker` did not return: it ran past its deadline (``overdue``),
    its process ended, or the function raised (``str()`` says which, in one line)."""

    def __init__(self, message: str, overdue: bool = False) -> None:
        super().__init__(message)
        self.overdue = overdue


_HEADER = 8   # the length of a message on a worker's pipe, big-endian


class Worker:
    """A forked child of this process that runs module-level functions of patchkit for it, one
    call at a time, each under a deadline: code that may never return to the interpreter (a
    user's transform stuck in C, ``any(itertools.repeat(False))``) runs there, and is stopped
    wherever it is by killing the process, past its deadline or when a signal ends the run.

    The child is forked on the first call and kept for the next ones, so what it imported and
    parsed serves them all; a call that kills it forks the next.  It holds no descriptor of
    ours but its two pipes (no lock of ours stays held through it), writes what the code
    prints to stderr (stdout is the report's), and dies with this process (``kill -9``
    included).  A child process of ours (a rebase-check worker) forks its own.  Without
    ``os.fork`` the call runs in this process."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._owner: int | None = None
        self._send = self._recv = -1
        self._turn = threading.Lock()   # one call at a time; threads of a run take turns
        _workers.add(self)

    def call(self, fn: Callable[..., object], *args: object, timeout: float) -> object:
        """``fn(*args)`` in the worker; its value, or WorkerError.  ``timeout`` bounds the CPU
        time the call takes, which a busy machine does not stretch (where the system tells
        it; else the time on the clock), and ``WALL`` times it the time on the clock, for code
        that waits without working."""
        if not hasattr(os, "fork"):
            return fn(*args)
        with self._turn:
            return self._call(fn, args, timeout)

    def _call(self, fn: Callable[..., object], args: tuple, timeout: float) -> object:
        import pickle

        job = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        self._started()
        try:
            _write_all(self._send, len(job).to_bytes(_HEADER, "big") + job)
        except BrokenPipeError:   # it ended while idle (its starting thread ended): again
            self._forget()
            self._started()
            _write_all(self._send, len(job).to_bytes(_HEADER, "big") + job)
        clock = _Deadline(self._pid, timeout)
        try:
            size = int.from_bytes(self._read(_HEADER, clock), "big")
            kind, value = pickle.loads(self._read(size, clock))
        except BaseException:
            self.stop()   # past its deadline, interrupted, or gone: it is not left running
            raise
        if kind == "raised":
            raise WorkerError(f"raised {value}")
        return value

    def stop(self) -> None:
        """Kill the child (if it is ours and alive) and forget it."""
        if self._pid is not None and self._owner == os.getpid():
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self._forget()

    def _forget(self) -> None:
        for fd in (self._send, self._recv):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._pid is not None and self._owner == os.getpid():
            try:
                os.waitpid(self._pid, os.WNOHANG)   # reap one that ended by itself
            except ChildProcessError:
                pass
        self._pid, self._owner, self._send, self._recv = None, None, -1, -1

    def _started(self) -> None:
        if self._pid is not None and self._owner != os.getpid():
            # forked along with this process from its parent: the parent's, not ours
            self._pid = self._owner = None
            self._forget()
        if self._pid is not None:
            return
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:   # the worker: it never returns into the caller's code
            code = 0
            try:
                os.close(job_w)
                os.close(res_r)
                bind_to_parent(parent)
                signal.signal(signal.SIGINT, signal.SIG_IGN)    # the parent decides
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.dup2(2, 1)
                low, high = sorted((job_r, res_w))
                os.closerange(3, low)
                os.closerange(low + 1, high)
                os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
                _serve(job_r, res_w)
            except BaseException:   # noqa: BLE001  # nothing of the caller's runs here
                code = 1
            finally:
                os._exit(code)
        os.close(job_r)
        os.close(res_w)
        self._pid, self._owner, self._send, self._recv = pid, parent, job_w, res_r

    def _read(self, size: int, clock: _Deadline) -> bytes:
        import select

        chunks: list[bytes] = []
        left = size
        while left:
            interrupt.check()   # a forked worker's first signal is heard here
            clock.check()
            ready, _, _ = select.select([self._recv], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(self._recv, min(left, 1 << 20))
            if not chunk:
                raise WorkerError(f"ended ({self._ended()}) before it finished")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _ended(self) -> str:
        try:
            _, status = os.waitpid(self._pid, 0) if self._pid else (0, 0)
        except ChildProcessError:
            return "status unknown"
        self._pid = None
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit {os.WEXITSTATUS(status)}"


_workers: weakref.WeakSet[Worker] = weakref.WeakSet()


def _fresh_turns() -> None:
    """A forked child takes no turn a thread of its parent held."""
    for worker in list(_workers):
        worker._turn = threading.Lock()


os.register_at_fork(after_in_child=_fresh_turns)


class _Deadline:
    """A call's deadline: ``timeout`` seconds of the worker's CPU time (read from /proc, so
    that a loaded machine does not fail a call that does its work), and ``WALL`` times that on
    the clock."""

    def __init__(self, pid: int | None, timeout: float) -> None:
        self.pid, self.timeout = pid, timeout
        self.start = time.monotonic()
        self.cpu_start = _cpu_of(pid)

    def check(self) -> None:
        now = time.monotonic()
        if self.cpu_start is not None:
            cpu = _cpu_of(self.pid)
            if cpu is not None and cpu - self.cpu_start > self.timeout:
                raise WorkerError(f"ran past its deadline of {self.timeout:g} s of CPU time "
                                  "and was stopped", overdue=True)
            if now - self.start <= self.timeout * WALL:
                return
            raise WorkerError(f"ran for {self.timeout * WALL:g} s ({WALL} times its deadline) "
                              "and was stopped", overdue=True)
        if now - self.start > self.timeout:
            raise WorkerError(f"ran past its deadline of {self.timeout:g} s and was stopped",
                              overdue=True)


WALL = 10   # a worker's call may wait (not work) for this many times its deadline
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_of(pid: int | None) -> float | None:
    """The CPU seconds (user and system) process ``pid`` has used, or None where unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _serve(jobs: int, results: int) -> None:
    """The worker's loop: a call in, its value (or what it raised, in one line) out, until the
    caller closes its end."""
    import pickle

    while True:
        head = _read_all(jobs, _HEADER)
        if head is None:
            return
        body = _read_all(jobs, int.from_bytes(head, "big"))
        if body is None:
            return
        try:
            fn, args = pickle.loads(body)
            answer = pickle.dumps(("value", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # noqa: BLE001  # the caller says it, in one line
            answer = pickle.dumps(("raised", f"{type(exc).__name__}: {exc}"))
        _write_all(results, len(answer).to_bytes(_HEADER, "big") + answer)
