"""The job's `store` section: where bulk data lives (a shared directory, or Mooncake Store in front of one)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rollart.spec.config.base import DEFAULT_HOME, Section

__all__ = ["MooncakeConfig", "StoreConfig"]


class MooncakeConfig(Section):
    """How a process reaches Mooncake Store: the master, the transport, and the memory it lends or borrows.

    `master: null` means the local stack starts one (`rollart up` / `rollart train`) on free ports and
    hands its address to every worker; `rollart worker` needs an address (`--store-master HOST:PORT`).
    Objects live in the *global segments* that processes contribute: by default only the store keeper
    (Mooncake's `mooncake_client`, started beside the master) does, so workers may come and go without
    taking data with them (`segment_mib: 0`).
    """

    master: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+:[0-9]{1,5}$")
    host: str = Field("127.0.0.1", min_length=1)
    protocol: Literal["tcp", "rdma"] = "tcp"
    rdma_devices: str = ""
    segment_mib: int = Field(0, ge=0)
    keeper_segment_mib: int = Field(1024, ge=16)
    buffer_mib: int = Field(64, ge=4)
    retry_after_s: float = Field(10.0, gt=0)
    lease_s: float = Field(
        10.0,
        gt=0,
        description="how long each read holds an object against removal (the master's default_kv_lease_ttl): "
        "an old weight version read moments ago outlives the publish that retires it by up to this long; "
        "only for the master the local stack starts",
    )


class StoreConfig(Section):
    """Where bulk data (tokens, logprobs, large payloads, published weights) lives.

    `local` is a directory (`path`) every worker shares. `mooncake` is Mooncake Store (TCP here, RDMA on
    a cluster) — a cache, not storage: with `fallback: local` (the default) every write also lands in
    `path`, and a read that Mooncake cannot serve (master down, key evicted) comes from there; with
    `fallback: none` such a read is an error naming the key. `keep_weight_versions` published weight
    versions per job stay in the store; older ones are removed as the trainer publishes new ones.
    """

    kind: Literal["local", "mooncake"] = "local"
    path: Path = DEFAULT_HOME / "store"
    payload_threshold_bytes: int = Field(256 * 1024, ge=1024, le=1536 * 1024)
    fallback: Literal["local", "none"] = "local"
    keep_weight_versions: int = Field(2, ge=1)
    mooncake: MooncakeConfig = Field(default_factory=MooncakeConfig)

    def with_master(self, address: str) -> StoreConfig:
        """This config pointed at the Mooncake master `address` (HOST:PORT)."""
        mooncake = {**self.mooncake.model_dump(), "master": address}
        return StoreConfig.model_validate({**self.model_dump(), "mooncake": mooncake})
