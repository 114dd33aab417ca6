"""This host's accelerators, each handed to one process tree at a time: a GPU to the replica placed
with `compute.gpu`, so that four `gpu: 1` replicas on a four-GPU host run on four GPUs rather than
all on GPU 0.

A tree is told which devices are its own the way every framework reads it: `CUDA_VISIBLE_DEVICES`
(and `NVIDIA_VISIBLE_DEVICES`, for a container runtime) for GPUs, `NEURON_RT_VISIBLE_CORES` for
Inferentia's Neuron cores. The host's devices are the ones its own process may use: those its
`CUDA_VISIBLE_DEVICES` lists when it is set, else indices 0..N-1 of the N it offers (`--gpu N`).
The book lives in the one process that starts the trees of a host (the replica host's manager), so
placement's count and the devices handed out never disagree there: a tree that cannot have its
devices now is not started until they are free.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
NEURON_VARIABLE = "NEURON_RT_VISIBLE_CORES"


def host_gpus(count: int, env: Mapping[str, str]) -> tuple[str, ...]:
    """The ids of this host's `count` GPUs: the first `count` its CUDA_VISIBLE_DEVICES lists, or 0..count-1."""
    listed = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    if listed:
        return tuple(listed[:count])
    return tuple(str(i) for i in range(count))


@dataclass
class DeviceBook:
    """Which tree holds which of the host's GPUs and Neuron cores."""

    gpus: tuple[str, ...] = ()
    cores: tuple[str, ...] = ()
    held: dict[Hashable, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)

    def free(self) -> tuple[list[str], list[str]]:
        """The GPUs and Neuron cores no tree holds, in the host's order."""
        taken_gpus = {d for gpus, _ in self.held.values() for d in gpus}
        taken_cores = {c for _, cores in self.held.values() for c in cores}
        return [d for d in self.gpus if d not in taken_gpus], [c for c in self.cores if c not in taken_cores]

    def take(self, owner: Hashable, gpus: int = 0, cores: int = 0) -> dict[str, str] | None:
        """`gpus` GPUs and `cores` Neuron cores for `owner` (the ones it holds already, if it does), as
        the variables its processes read; None when not that many are free now."""
        if owner in self.held:
            return visible(*self.held[owner])
        free_gpus, free_cores = self.free()
        if gpus > len(free_gpus) or cores > len(free_cores):
            return None
        mine = (tuple(free_gpus[:gpus]), tuple(free_cores[:cores]))
        if gpus or cores:
            self.held[owner] = mine
        return visible(*mine)

    def give_back(self, owner: Hashable) -> None:
        self.held.pop(owner, None)


def visible(gpus: tuple[str, ...], cores: tuple[str, ...]) -> dict[str, str]:
    """The variables that show a tree only its own devices (none when it has none: a CPU tree is not
    told to hide GPUs it would not use anyway)."""
    env: dict[str, str] = {}
    if gpus:
        env.update(dict.fromkeys(GPU_VARIABLES, ",".join(gpus)))
    if cores:
        env[NEURON_VARIABLE] = ",".join(cores)
    return env
