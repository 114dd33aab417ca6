"""A host pod's `controller.kubernetes.io/pod-deletion-cost`, kept by its agent from what the host runs.

When KEDA scales a host pool's Deployment in, Kubernetes removes the pods with the lowest deletion
cost first. Sluice knows which hosts hold nothing (`jobs/placement/host_demand.py`), so each host's
agent (`sluice workers`, `sluice replicas`) writes its own pod's cost: 0 while it holds nothing,
else the number of units it holds (busy worker nodes, replicas placed on it), so a pool scaled in
by one loses an idle host, not one in the middle of a batch. The cost is a hint the ReplicaSet
follows on a best-effort basis; a removed busy host still finishes its batch (warm shutdown
within the pod's grace period) and its replicas are placed again.

It runs only in a pod: the chart hands the pod's name and namespace through the downward API
(`SLUICE_POD_NAME`, `SLUICE_POD_NAMESPACE`), and the agent patches its pod with lightkube (the
`kubernetes` extra) under a service account allowed to patch pods. A failed patch is logged and
tried again on the next change or after `RETRY_S`; it never stops the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
POD_NAME_VARIABLE = "SLUICE_POD_NAME"
POD_NAMESPACE_VARIABLE = "SLUICE_POD_NAMESPACE"
MAX_COST = 2**31 - 1  # the annotation is an int32
RETRY_S = 30.0

Patch = Callable[[dict[str, Any]], None]
"""Apply a merge patch to this host's pod."""


def deletion_cost(held: int) -> int:
    """The pod's cost for a host holding `held` units: 0 when idle, more the more it holds."""
    return max(0, min(held, MAX_COST))


def cost_patch(cost: int) -> dict[str, Any]:
    """The merge patch that sets the annotation."""
    return {"metadata": {"annotations": {ANNOTATION: str(cost)}}}


class PodDeletionCost:
    """Keeps the annotation equal to `deletion_cost(held)`: patches when the cost changes, and
    again `RETRY_S` after a failed patch."""

    def __init__(self, patch: Patch, retry_s: float = RETRY_S) -> None:
        self._patch = patch
        self._retry_s = retry_s
        self._written: int | None = None
        self._failed_at: float | None = None

    @property
    def written(self) -> int | None:
        """The cost last written to the pod, None before the first success."""
        return self._written

    def update(self, held: int, now: float) -> None:
        cost = deletion_cost(held)
        if cost == self._written:
            return
        if self._failed_at is not None and now - self._failed_at < self._retry_s:
            return
        try:
            self._patch(cost_patch(cost))
        except Exception as e:  # noqa: BLE001 - the API server away or forbidding it: the host runs on regardless
            log.warning("cannot set this pod's deletion cost to %d: %s", cost, e)
            self._failed_at = now
            return
        self._written, self._failed_at = cost, None


def in_pod(env: Mapping[str, str]) -> PodDeletionCost | None:
    """A keeper patching this pod through the Kubernetes API, None outside a pod the chart made (or
    without lightkube, said once)."""
    name, namespace = env.get(POD_NAME_VARIABLE), env.get(POD_NAMESPACE_VARIABLE)
    if not name or not namespace:
        return None
    try:
        from lightkube import Client
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType
    except ImportError:
        log.warning("%s is set but lightkube is not installed (pip install 'sluice[kubernetes]'): this pod's "
                    "deletion cost is not kept", POD_NAME_VARIABLE)
        return None
    client: Any = None

    def patch(body: dict[str, Any]) -> None:
        nonlocal client
        if client is None:
            client = Client(namespace=namespace)
        client.patch(Pod, name, body, namespace=namespace, patch_type=PatchType.MERGE)

    return PodDeletionCost(patch)
