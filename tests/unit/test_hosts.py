"""What a host offers and what a replica takes, written as Kubernetes and Cortex write them."""

from __future__ import annotations

import pytest

from foundation.hosts import BadQuantity, Resources, cpu_millis, machine_resources, mem_bytes


@pytest.mark.parametrize(("written", "millis"), [
    (2, 2000), (0.5, 500), ("1.5", 1500), ("500m", 500), ("200m", 200), (" 3 ", 3000), ("0.0005", 1),
])
def test_cpu_is_held_in_whole_millicores(written: float | str, millis: int) -> None:
    assert cpu_millis(written) == millis


@pytest.mark.parametrize("written", ["", "two", "5x", "-1", "1 m", True])
def test_a_cpu_not_written_as_a_quantity_is_refused_by_name(written: object) -> None:
    with pytest.raises(BadQuantity, match="cpu must be"):
        cpu_millis(written)  # type: ignore[arg-type]


@pytest.mark.parametrize(("written", "size"), [
    ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1Gi", 2**30), (1024, 1024), ("1.5Ki", 1536),
])
def test_memory_is_held_in_bytes(written: int | str, size: int) -> None:
    assert mem_bytes(written) == size


@pytest.mark.parametrize("written", ["lots", "2GB", "-1Gi", ""])
def test_memory_not_written_as_a_quantity_is_refused_by_name(written: str) -> None:
    with pytest.raises(BadQuantity, match="mem must be"):
        mem_bytes(written)


def test_a_request_fits_only_where_every_resource_has_room() -> None:
    room = Resources.parse(cpu=2, mem="4Gi", gpu=1)

    assert Resources.parse(cpu="1500m", mem="1Gi", gpu=1).fits_in(room)
    assert not Resources.parse(cpu=1, gpu=2).fits_in(room)
    assert not Resources.parse(cpu=3).fits_in(room)


def test_taking_two_replicas_leaves_what_a_third_lacks() -> None:
    replica = Resources.parse(cpu=1, mem="1Gi", gpu=1)
    room = Resources.parse(cpu=3, mem="8Gi", gpu=2) - replica - replica

    assert room == Resources.parse(cpu=1, mem="6Gi", gpu=0)
    assert replica.shortfall(room) == "1 gpu"
    assert Resources.parse(cpu=2, gpu=1).shortfall(room) == "1 gpu, 2000m cpu"
    assert replica + replica == Resources.parse(cpu=2, mem="2Gi", gpu=2)


def test_a_negative_or_fractional_gpu_count_is_refused() -> None:
    with pytest.raises(BadQuantity, match="gpu must be"):
        Resources.parse(gpu=-1)


def test_this_machine_offers_its_cores_and_memory() -> None:
    found = machine_resources()

    assert found.cpu_m >= 1000 and found.cpu_m % 1000 == 0
    assert found.mem > 0
    assert found.gpu >= 0
