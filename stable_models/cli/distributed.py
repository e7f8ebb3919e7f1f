"""One command, many processes: what `stable-models train / evaluate / predict` need to run as one job under torchrun,
`accelerate launch` or the deepspeed launcher (which all set RANK / WORLD_SIZE / LOCAL_RANK).

Rank 0 does what must happen once (checks of the output, printing, writing); work that fills a cache (reading a file
into Arrow, tokenizing) runs on rank 0 first and then on the others, which find the cache; an error on rank 0 reaches
every rank, so no rank waits forever for a peer that stopped. Without those variables it is one process and every
call is a plain call.
"""

import contextlib
import os
from pathlib import Path

import torch

from .errors import CliError, SilentError


class Job:
    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.world > 1 and not torch.distributed.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(self.local_rank)
            torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    def say(self, *parts, **kwargs) -> None:
        """print(), on rank 0 only."""
        if self.is_main:
            print(*parts, **kwargs)

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def share(self, value):
        """Rank 0's value, on every rank."""
        if self.world == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def main_first(self, work):
        """work() on rank 0, then on the others (which find what it cached); rank 0's error is raised everywhere."""
        result = self.on_main(work, share_result=False)
        return result if self.is_main else work()

    def on_main(self, work, share_result=True):
        """work() on rank 0 alone; rank 0's result on every rank. Its error is raised on every rank (the others exit
        quietly with the same code), so no rank waits for a peer that stopped."""
        result, error = None, None
        if self.is_main:
            try:
                result = work()
            except (Exception, SystemExit) as caught:
                error = caught
        if self.world > 1:
            shared, kind = self.share(
                (result if share_result else None, None if error is None else type(error).__name__)
            )
            result = result if self.is_main else shared
            if kind is not None and not self.is_main:
                raise SilentError() if kind == "CliError" else SystemExit(1)
        if error is not None:
            raise error
        return result

    def shard(self, rows: int) -> range:
        """This rank's contiguous share of `rows` (rank order is row order)."""
        return range(rows * self.rank // self.world, rows * (self.rank + 1) // self.world)

    def gather(self, value) -> list | None:
        """Every rank's value, in rank order, on rank 0 (None elsewhere)."""
        if self.world == 1:
            return [value]
        gathered = [None] * self.world if self.is_main else None
        torch.distributed.gather_object(value, gathered, dst=0)
        return gathered

    def leave(self) -> None:
        """Meet, so no rank exits while a peer still talks to it. The process group is left to the process's end
        (`cli.run` ends a rank with os._exit): gloo's teardown could abort a rank whose work was done."""
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()


LOCK = ".stable-models.lock"


@contextlib.contextmanager
def output_lock(output: Path, job: Job):
    """Hold `output/.stable-models.lock` while the job writes there (rank 0 holds it for the job): a second `train`
    into the same directory is refused while this one runs, and the lock dies with its process (nothing stale to
    remove). A directory the lock created is removed again if the run wrote nothing into it."""
    held = []
    created = not output.exists()
    job.on_main(lambda: held.append(lock(output)))
    try:
        yield
    finally:
        if held:
            (output / LOCK).unlink(missing_ok=True)
            held[0].close()
            if created and output.is_dir() and not any(output.iterdir()):
                output.rmdir()


def lock(output: Path):
    import fcntl

    output.mkdir(parents=True, exist_ok=True)
    handle = open(output / LOCK, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise CliError(
            f"--output {output} is being written by another stable-models train ({holder}); wait for it to finish "
            "or choose another --output"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
    handle.flush()
    return handle


def refuse_if_locked(output: Path) -> None:
    """The clear error for a directory another run holds, before any other check of it."""
    if (output / LOCK).is_file():
        lock(output).close()  # raises while the holder runs; a lock left by a killed run is free
