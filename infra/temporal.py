"""Connecting to Temporal: one data converter (pydantic + external storage) for clients and workers alike."""

from __future__ import annotations

import dataclasses

from rollart.infra.config import StoreConfig, TemporalConfig
from rollart.infra.payload_storage import external_storage
from rollart.infra.store import open_store
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

__all__ = ["DEFAULT_ADDRESS", "connect", "data_converter", "ui_url"]

DEFAULT_ADDRESS = "127.0.0.1:7233"


def data_converter(store: StoreConfig) -> DataConverter:
    """Pydantic JSON payloads; those over the store's threshold go to the store by reference."""
    return dataclasses.replace(
        pydantic_data_converter,
        external_storage=external_storage(open_store(store), store.payload_threshold_bytes),
    )


async def connect(temporal: TemporalConfig, store: StoreConfig) -> Client:
    """A client for the job's server (the local default when no address is set)."""
    address = temporal.address or DEFAULT_ADDRESS
    try:
        return await Client.connect(address, namespace=temporal.namespace, data_converter=data_converter(store))
    except RuntimeError as e:
        raise ConnectionError(
            f"cannot reach the Temporal server at {address} (namespace {temporal.namespace!r}): {e}. "
            "Start one with `rollart up`, or pass --temporal-address HOST:PORT."
        ) from e


def ui_url(ui_base: str, namespace: str, workflow_id: str, run_id: str | None = None) -> str:
    """The Temporal UI page of one workflow run."""
    url = f"{ui_base.rstrip('/')}/namespaces/{namespace}/workflows/{workflow_id}"
    return f"{url}/{run_id}/history" if run_id else url
