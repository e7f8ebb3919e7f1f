"""Launching the multi-process test workers (torchrun on gloo, CPU only) and leaving their process groups."""

import json
import os
import subprocess
import sys
from pathlib import Path


def run_worker(worker: Path, out: Path, *args: str, processes: int = 2, torchrun=None, env: dict | None = None):
    """Run `worker OUT *args` under torchrun (default: when processes > 1) or as one plain process; return the JSON
    the worker wrote to OUT."""
    launcher = [sys.executable]
    use_torchrun = processes > 1 if torchrun is None else torchrun
    if use_torchrun:
        # --standalone: rendezvous on a port the OS picks (a fixed port can still be held by an earlier run)
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    cmd = [*launcher, str(worker), str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONFAULTHANDLER": "1", **(env or {})}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{failure_output(done)}"
    return json.loads(Path(out).read_text())


def failure_output(done: subprocess.CompletedProcess) -> str:
    """The ends of a failed run's stdout and stderr, and the Python stacks faulthandler printed for a rank that
    crashed (PYTHONFAULTHANDLER=1; they come before its long list of extension modules, which a plain tail keeps)."""
    crash = done.stderr.find("Fatal Python error")
    stacks = done.stderr[crash : done.stderr.find("Extension modules", crash)][:6000] if crash >= 0 else ""
    return f"{done.stdout[-2000:]}\n{stacks}\n{done.stderr[-4000:]}"


def leave_process_group() -> None:
    """End a worker: left to the interpreter's exit, gloo's threads can abort a rank (SIGABRT, "terminate called
    without an active exception"), and destroy_process_group() once a peer has exited can hang. Meet, then leave."""
    import torch.distributed

    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
