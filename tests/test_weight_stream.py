"""Published weights as buckets and a manifest: bounded buckets, exact round trips in any dtype, deltas, and a
transfer whose peer stops answering failing within its timeout with the version and the peer named."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from rollart.activities.training.publish import Publisher, publish_version
from rollart.activities.training.ranks import OneProcess
from rollart.infra.store.payload import LocalStore
from rollart.infra.store.weight_delta import DeltaMirror, engine_stream, group_of
from rollart.infra.store.weight_stream import BucketWriter, WeightsTransferError, iter_manifest, read_all
from rollart.infra.store.weights import WeightsManifest, latest_weights, manifest_key, read_manifest
from rollart.spec.config import WeightsConfig

MIB = 1 << 20


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 32, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(16, 32, generator=g),
        "model.layers.0.input_layernorm.weight": torch.ones(32),
        "model.norm.weight": torch.ones(32),
        "scalar": torch.tensor(3.0),
        "empty": torch.empty(0, 4),
    }


def _publish(store: LocalStore, version: int, tensors: dict, publisher: Publisher | None = None, **cfg: object):
    weights = WeightsConfig(**{"dtype": "float32", **cfg})
    ref = publish_version(tensors.items(), OneProcess(), store, "j", version, weights, 2, publisher or Publisher())
    assert ref is not None
    return read_manifest(store, ref.key)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_version_round_trips_in_its_dtype(tmp_path: Path, dtype: str) -> None:
    store = LocalStore(tmp_path)
    tensors = _tensors()
    manifest = _publish(store, 1, tensors, dtype=dtype)
    assert manifest.dtype == dtype and latest_weights(store, "j").version == 1
    got = read_all(store, manifest)
    want = {k: v.to(getattr(torch, dtype)) for k, v in tensors.items()}
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(got[k].shape == want[k].shape for k in want)


def test_buckets_are_bounded_and_a_bigger_tensor_travels_alone(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    tensors = {f"t{i}": torch.full((MIB // 8,), float(i)) for i in range(5)}  # 0.5 MiB each
    tensors["big"] = torch.zeros(3 * MIB // 4)  # 3 MiB
    manifest = _publish(store, 1, tensors, bucket_mib=1)
    assert [[t.name for t in b.tensors] for b in manifest.buckets] == [["t0", "t1"], ["t2", "t3"], ["t4"], ["big"]]
    assert all(b.nbytes <= MIB for b in manifest.buckets[:3])
    got = read_all(store, manifest)
    assert all(torch.equal(got[k], v) for k, v in tensors.items())


def test_older_versions_are_retired_with_their_buckets(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    buckets = {v: _publish(store, v, _tensors(v)).buckets[0].key for v in range(1, 5)}
    assert [store.exists(manifest_key("j", v)) for v in range(1, 5)] == [False, False, True, True]
    assert [store.exists(buckets[v]) for v in range(1, 5)] == [False, False, True, True]


def test_a_delta_carries_only_changed_elements_and_rebuilds_whole_groups(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    publisher, mirror = Publisher(), DeltaMirror()
    v1 = _publish(store, 1, _tensors(), publisher, dtype="bfloat16", delta=True)
    assert v1.deltas and v1.delta_key is None
    loaded = dict(engine_stream(store, v1, mirror))
    mirror.mark("j", 1)
    assert mirror.holds("j", 1) and len(loaded) == len(_tensors())
    changed = _tensors()
    changed["model.layers.0.self_attn.q_proj.weight"][0, :4] += 1.0
    changed["model.norm.weight"] = torch.full((32,), 2.0)  # every element: goes dense
    v2 = _publish(store, 2, changed, publisher, dtype="bfloat16", delta=True)
    delta = read_manifest(store, v2.delta_key)
    encodings = {t.name: (t.encoding, t.count) for t in delta.tensors}
    assert encodings == {"model.layers.0.self_attn.q_proj.weight": ("sparse", 4), "model.norm.weight": ("dense", 0)}
    rebuilt = dict(engine_stream(store, delta, mirror))
    groups = {group_of(n) for n in encodings}
    assert set(rebuilt) == {n for n in changed if group_of(n) in groups}  # k_proj comes along with q_proj
    for name, t in rebuilt.items():
        assert torch.equal(t, changed[name].to(torch.bfloat16)), name
    assert group_of("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn"


def test_the_publish_dtype_must_be_resolved() -> None:
    with pytest.raises(ValueError, match="auto must be resolved"):
        BucketWriter(LocalStore(Path("/nonexistent")), "j", 1, WeightsConfig())
    assert WeightsConfig().resolved("bfloat16").dtype == "bfloat16"
    assert WeightsConfig(dtype="float32").resolved("bfloat16").dtype == "float32"


class _DeadPeer(LocalStore):
    """A store whose reads of buckets never return, as a client blocked on a peer that died."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def read_buffer(self, key: str) -> object:
        self.release.wait(30)
        raise OSError("the peer is gone")


def test_a_transfer_whose_peer_stops_answering_fails_within_its_timeout(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    manifest = _publish(store, 7, _tensors(), timeout_s=0.5)
    dead = _DeadPeer(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(WeightsTransferError) as err:
        list(iter_manifest(dead, manifest))
    took = time.monotonic() - t0
    dead.release.set()
    message = str(err.value)
    assert 0.4 < took < 5, took
    assert "weights v7 of job 'j'" in message and "published by trainer" in message and "LocalStore" in message
    assert "within 0.5 s (weights.timeout_s)" in message


def test_a_bucket_gone_or_short_is_an_error_naming_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    manifest = _publish(store, 3, _tensors())
    store.put(manifest.buckets[0].key, b"short")
    with pytest.raises(WeightsTransferError, match=r"5 bytes in LocalStore.*the manifest says"):
        list(iter_manifest(store, manifest))
    store.delete(manifest.buckets[0].key)
    with pytest.raises(WeightsTransferError, match=r"gone from LocalStore.*retired"):
        list(iter_manifest(store, manifest))


def test_a_manifest_says_what_it_is() -> None:
    m = WeightsManifest(job_id="j", version=4, dtype="bfloat16", buckets=[], publisher="trainer h:1")
    assert m.describe() == "weights v4 of job 'j', 0 bucket(s), 0.0 MB, published by trainer h:1"
    d = m.model_copy(update={"kind": "delta", "base_version": 3})
    assert d.describe().startswith("weights v4 (delta from v3) of job 'j'")
