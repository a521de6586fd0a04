"""The file system calls a checkpoint save makes, read from strace's log, for the tests that kill
a save at each of them in turn (checkpoint_crash_test.py, checkpoint_crash_mpi_test.py)."""
import re
import shutil
import subprocess
import os

# Both spellings of each: a C library may make either (Debian 12's makes the first).
CALLS = ["mkdir", "mkdirat", "openat", "write", "fsync", "fdatasync", "rename", "renameat",
         "renameat2", "unlink", "unlinkat", "rmdir", "close"]

# A call of one pid in an strace log: (pid, name, the text up to its result).
LINE = re.compile(r"^(\d+) +(\w+)\((.*?)(?:\) += .*| <unfinished \.\.\.>)?$")
TIME = re.compile(r"\[\d\d:\d\d:\d\d\.\d+\]")


def usable_strace():
    """strace's path, or None where it is missing or the machine forbids tracing."""
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-f", "-o", os.devnull, "true"],
                                        capture_output=True).returncode != 0:
        return None
    return strace


def calls_of(log):
    """The main thread's calls among CALLS, as (name, arguments; a log line's time left out)."""
    out = []
    with open(log) as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if m and m.group(2) in CALLS:
                out.append((int(m.group(1)), m.group(2), TIME.sub("[time]", m.group(3))))
    main = out[0][0] if out else None
    return [(name, args) for pid, name, args in out if pid == main]


def numbered(calls):
    """Each call with its number among the calls of its name (strace's inject=NAME:when=N)."""
    seen = {}
    out = []
    for name, args in calls:
        seen[name] = seen.get(name, 0) + 1
        out.append((name, seen[name], args))
    return out


def kill_at(strace, log, name, nth):
    """strace's arguments that trace `name` into `log` and SIGKILL the process at its nth call."""
    return [strace, "-f", "-o", log, "-e", "trace=" + name, "-e",
            f"inject={name}:signal=SIGKILL:when={nth}"]
