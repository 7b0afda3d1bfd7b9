"""One way for the tests to launch a script under torchrun on this machine.

``--standalone`` lets the launcher pick its own rendezvous port: the tests used to pick a
"free" port and hand it over, a window in which another parallel test could take it. A
failure shows every rank's traceback, not only the tail that torchrun's summary fills.
"""

import os
import re
import signal
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Gloo's mesh set-up between ranks inside init_process_group: a failure there is the
# transport's (seen once in about 200 CI runs), not ours. Retried only when it is every
# error the ranks raised (torchrun's own summary aside): any other error is a real failure.
_TRANSPORT = "Gloo connectFullMesh failed"
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([\w.]+(?:Error|Exception)): ?(.*)$", re.M)


def _transport_only(text: str) -> bool:
    errors = [(name, message) for name, message in _ERROR_LINE.findall(text) if not name.endswith("ChildFailedError")]
    return bool(errors) and all(_TRANSPORT in message for _, message in errors)


def torchrun(script: str, *args, ranks: int = 2, timeout: float = 180, env: dict | None = None,
             cwd: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m torch.distributed.run --standalone --nproc_per_node=RANKS SCRIPT ARGS``.

    The tests' folder and the repository root are on ``PYTHONPATH``; with ``check`` a failure
    raises AssertionError with each rank's traceback. A run whose only errors are gloo's
    failed mesh set-up (``init_process_group``) is retried once, with a warning.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script,
           *map(str, args)]
    base = env if env is not None else os.environ
    path = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), base.get("PYTHONPATH", "")])
    full_env = {**base, "PYTHONPATH": path}
    for attempt in (1, 2):
        proc = _run(cmd, timeout, full_env, cwd)
        if proc.returncode == 0 or attempt == 2 or not _transport_only(proc.stdout + proc.stderr):
            break
        warnings.warn(f"torchrun: gloo's connection set-up failed, retried once:\n{failure(proc)}", stacklevel=2)
    if check:
        assert proc.returncode == 0, failure(proc)
    return proc


def _run(cmd: list, timeout: float, env: dict, cwd: str | None) -> subprocess.CompletedProcess:
    """``cmd`` in a session of its own: at ``timeout`` the launcher and its ranks are all
    killed (killing the launcher alone left the ranks running, and holding the CPU, for the
    rest of the suite), and the error shows what each rank printed until then."""
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                             start_new_session=True)
    try:
        out, err = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        out, err = popen.communicate()
        ran = subprocess.CompletedProcess(cmd, -9, out, err)
        raise AssertionError(f"torchrun timed out after {timeout:g} s:\n{failure(ran)}") from None
    return subprocess.CompletedProcess(cmd, popen.returncode, out, err)


def failure(proc: subprocess.CompletedProcess, limit: int = 8000) -> str:
    """Each rank's last lines (torch prefixes them ``[rankN]:``), then the launcher's summary."""
    text = proc.stdout + proc.stderr
    ranks: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\[(rank\d+)\]:", line)
        if m:
            ranks.setdefault(m.group(1), []).append(line)
    parts = [f"--- {rank}, last lines:\n" + "\n".join(lines[-25:]) for rank, lines in sorted(ranks.items())]
    return ("\n".join(parts) + "\n--- output's tail:\n" + text[-2500:])[-limit:]
