"""This host's accelerators, each held by one process tree at a time: a GPU to the replica placed with
`compute.gpu`, or to a worker node of a GPU worker host, so that four `gpu: 1` replicas (or nodes)
on a four-GPU host run on four GPUs rather than all on GPU 0.

A tree is told which devices are its own the way every framework reads it: `CUDA_VISIBLE_DEVICES`
(and `NVIDIA_VISIBLE_DEVICES`, for a container runtime) for GPUs. The host's GPUs are those its
own `CUDA_VISIBLE_DEVICES` lists when it is set, else indices 0..N-1 of the N it offers (`--gpu N`);
Inferentia's Neuron cores (`compute.inf`, `--inf N`) likewise, as `NEURON_RT_VISIBLE_CORES`.

Every process of a host that hands GPUs out (a replica host's manager, a worker host's agent, both
under `sluice up`) claims them in one folder of the host (`HostDevices`): a claim is a file per
device, made with O_EXCL and naming its holder's process and tag, so two processes never hand out
one device, and a claim whose process has died is taken back. A tree that cannot have its devices
now is not started until they are free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
NEURON_VARIABLE = "NEURON_RT_VISIBLE_CORES"
DEVICES_FOLDER_VARIABLE = "SLUICE_DEVICES_DIR"
# The kinds of device a host hands out, by the `compute` field that asks for them.
GPU, NEURON = "gpu", "neuron"


def host_cores(count: int, env: Mapping[str, str]) -> tuple[str, ...]:
    """The ids of this host's `count` Neuron cores: those its NEURON_RT_VISIBLE_CORES lists, or 0..count-1."""
    listed = [c.strip() for c in (env.get(NEURON_VARIABLE) or "").split(",") if c.strip()]
    if listed:
        return tuple(listed[:count])
    return tuple(str(i) for i in range(count))


def host_gpus(count: int, env: Mapping[str, str]) -> tuple[str, ...]:
    """The ids of this host's `count` GPUs: the first `count` its CUDA_VISIBLE_DEVICES lists, or 0..count-1."""
    listed = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    if listed:
        return tuple(listed[:count])
    return tuple(str(i) for i in range(count))


def devices_folder(env: Mapping[str, str], cache_dir: str | Path) -> Path:
    """Where this host's claims are kept: one folder for every Sluice process of the host."""
    given = env.get(DEVICES_FOLDER_VARIABLE)
    return Path(given) if given else Path(cache_dir).expanduser() / "devices"


@dataclass
class HostDevices:
    """The host's GPUs and their claims, in `folder`, for holders that are processes of this host."""

    folder: Path
    gpus: tuple[str, ...]         # the host's devices of this kind (GPUs, or Neuron cores)
    pid: int = 0                  # the claiming process (default: this one)
    kind: str = GPU

    def __post_init__(self) -> None:
        self.pid = self.pid or os.getpid()

    def _claim_file(self, device: str) -> Path:
        return self.folder / f"{self.kind}-{device}.claim"

    def visible(self, devices: tuple[str, ...]) -> dict[str, str]:
        """The variables that show a tree only these devices of this kind."""
        if not devices:
            return {}
        if self.kind == NEURON:
            return {NEURON_VARIABLE: ",".join(devices)}
        return visible(devices)

    def holder(self, device: str) -> tuple[int, str] | None:
        """(pid, tag) of the live claim on `device`, None when it is free (a dead holder's claim is removed)."""
        path = self._claim_file(device)
        try:
            pid_text, _, tag = path.read_text(encoding="utf-8").partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        if psutil.pid_exists(pid):
            return pid, tag
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    def held(self) -> dict[str, tuple[int, str]]:
        """Device -> its holder, for every device claimed now."""
        return {device: found for device in self.gpus if (found := self.holder(device)) is not None}

    def mine(self, tag: str) -> tuple[str, ...]:
        return tuple(d for d, (pid, held_tag) in self.held().items() if pid == self.pid and held_tag == tag)

    def free(self) -> list[str]:
        held = self.held()
        return [d for d in self.gpus if d not in held]

    def claim(self, tag: str, count: int) -> tuple[str, ...] | None:
        """`count` GPUs for the holder `tag` of this process (those it holds already, if it does); None
        when not that many are free now (nothing is claimed then)."""
        if count <= 0:
            return ()
        held = self.mine(tag)
        if len(held) >= count:
            return held[:count]
        self.folder.mkdir(parents=True, exist_ok=True)
        taken: list[str] = list(held)
        for device in self.free():
            if len(taken) == count:
                break
            try:
                fd = os.open(self._claim_file(device), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:  # another process of the host claimed it meanwhile
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"{self.pid} {tag}")
            taken.append(device)
        if len(taken) < count:
            self.release(tag)
            return None
        return tuple(taken)

    def release(self, tag: str) -> None:
        """Give back what the holder `tag` of this process holds."""
        for device in self.mine(tag):
            with contextlib.suppress(OSError):
                self._claim_file(device).unlink()

    def release_all(self) -> None:
        """Give back everything this process holds."""
        for device, (pid, _) in self.held().items():
            if pid == self.pid:
                with contextlib.suppress(OSError):
                    self._claim_file(device).unlink()


def visible(gpus: tuple[str, ...]) -> dict[str, str]:
    """The variables that show a tree only its own GPUs (none when it has none: a CPU tree is not
    told to hide GPUs it would not use anyway)."""
    return dict.fromkeys(GPU_VARIABLES, ",".join(gpus)) if gpus else {}
