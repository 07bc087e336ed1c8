"""Weight sync: publish + pull time and GB/s of fp32 state dicts, Mooncake vs a local file vs a plain socket.

Transfer part: each size's safetensors blob (Qwen2-shaped tensors of ~2.5M, ~40M
and ~400M parameters) is published by one client and pulled by another:

- mooncake: `put` (zero-copy `upsert_from` out of a registered buffer) into the
  store keeper's segment over TCP, `get` (`get_into`) back — the path weights
  take between trainer and generators;
- local: the local store (a file written via temp file + rename, read back;
  the page cache makes this a memory copy on one machine);
- socket: a plain TCP socket to a helper process that receives the blob and
  sends it back (the floor for "bytes across a process boundary").

Swap part (`--swap`): the end-to-end time of a weight swap on a real vLLM
engine — publish the trainer's new weights (buckets and a manifest), stream
them from the store into the running engine, and serve a request stamped with
the new version — for the tiny model and a ~40M model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.report import RESULTS, plot_modes, write_results

GB = 1e9

# name → (hidden, layers, intermediate, vocab): fp32 state dicts of the stated size (tied embeddings)
SIZES = {
    "2.5M": (256, 2, 768, 4096),
    "40M": (512, 10, 1536, 16384),
    "400M": (1280, 16, 4352, 65536),
}


def state_dict(hidden: int, layers: int, inter: int, vocab: int):  # -> dict[str, torch.Tensor]
    """Random fp32 tensors in a Qwen2 layout (4 heads per KV head)."""
    import torch

    g = torch.Generator().manual_seed(0)
    kv = hidden // 4
    t: dict = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (hidden, hidden),
            "self_attn.k_proj.weight": (kv, hidden),
            "self_attn.v_proj.weight": (kv, hidden),
            "self_attn.o_proj.weight": (hidden, hidden),
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
        }
        for name, shape in shapes.items():
            t[p + name] = torch.randn(*shape, generator=g)
    t["model.norm.weight"] = torch.ones(hidden)
    return t


def _params(hidden: int, layers: int, inter: int, vocab: int) -> int:
    kv = hidden // 4
    return vocab * hidden + layers * (2 * hidden * hidden + 2 * kv * hidden + 3 * inter * hidden + 2 * hidden) + hidden


def blob_of(tensors: dict) -> tuple[bytes, int]:
    from safetensors.torch import save

    return save(tensors), sum(x.numel() for x in tensors.values())


# ---------------------------------------------------------------- transports


class _SocketPeer:
    """A helper process that receives a length-prefixed blob and sends it back on request."""

    CODE = """
import socket, sys
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = bytearray()
while True:
    head = conn.recv(9, socket.MSG_WAITALL)
    if len(head) < 9: break
    op, n = head[:1], int.from_bytes(head[1:], "little")
    if op == b"P":
        buf = bytearray(n); view = memoryview(buf); got = 0
        while got < n: got += conn.recv_into(view[got:], n - got)
        conn.sendall(b"k")
    else:
        conn.sendall(len(buf).to_bytes(8, "little")); conn.sendall(buf)
"""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], stdout=subprocess.PIPE, text=True)
        port = int(self.proc.stdout.readline())
        self.sock = socket.create_connection(("127.0.0.1", port))

    def put(self, data: bytes) -> None:
        self.sock.sendall(b"P" + len(data).to_bytes(8, "little"))
        self.sock.sendall(data)
        assert self.sock.recv(1) == b"k"

    def get(self) -> bytearray:
        self.sock.sendall(b"G" + (0).to_bytes(8, "little"))
        n = int.from_bytes(self.sock.recv(8, socket.MSG_WAITALL), "little")
        out = bytearray(n)
        view, got = memoryview(out), 0
        while got < n:
            got += self.sock.recv_into(view[got:], n - got)
        return out

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(10)


def _time(fn: Callable[..., object], *args: object) -> tuple[float, object]:
    """How long `fn(*args)` took, and what it returned."""
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def transfer_rows(sizes: list[str], repeats: int, home: Path) -> list[dict]:
    from rollart.infra.local.mooncake_service import MooncakeService
    from rollart.infra.store.mooncake import MooncakeStore
    from rollart.infra.store.payload import LocalStore
    from rollart.spec.config import MooncakeConfig, StoreConfig

    biggest = max(_params(*SIZES[s]) * 4 for s in sizes)
    seg_mib = int(biggest * 1.3) // (1 << 20) + 64
    cfg = StoreConfig(
        kind="mooncake",
        path=home / "store",
        fallback="none",
        mooncake=MooncakeConfig(keeper_segment_mib=seg_mib, buffer_mib=16),
    )
    rows = []
    with MooncakeService(cfg, log_dir=home / "logs") as svc:
        publisher = MooncakeStore.connect(svc.config.mooncake)
        puller = MooncakeStore.connect(svc.config.mooncake)  # a second client: its own transfer engine
        local = LocalStore(home / "local")
        peer = _SocketPeer()
        try:
            for size in sizes:
                blob, params = blob_of(state_dict(*SIZES[size]))
                backends: dict[str, tuple[Callable[[str], object], Callable[[str], bytes]]] = {
                    "mooncake": (lambda k, b=blob: publisher.put(k, b, pinned=True), puller.get),
                    "local file": (lambda k, b=blob: local.put(k, b), local.get),
                    "socket": (lambda k, b=blob: peer.put(b), lambda k: peer.get()),
                }
                for name, (put, get) in backends.items():
                    pubs, pulls = [], []
                    for r in range(repeats + 1):  # the first round warms connections and buffers
                        key = f"bench/w{r}"
                        pub, _ = _time(put, key)
                        pull, got = _time(get, key)
                        if len(got) != len(blob):
                            raise RuntimeError(f"{name}: pulled {len(got)} bytes of {len(blob)}")
                        del got
                        if name == "mooncake":
                            publisher.delete(key, force=True)  # just read: a lease holds it for 10 s
                        elif name == "local file":
                            local.delete(key)
                        if r:
                            pubs.append(pub)
                            pulls.append(pull)
                    pub, pull = statistics.median(pubs), statistics.median(pulls)
                    rows.append(
                        {
                            "size": size,
                            "params": params,
                            "bytes": len(blob),
                            "backend": name,
                            "publish_s": pub,
                            "pull_s": pull,
                            "publish_gbps": len(blob) / pub / GB,
                            "pull_gbps": len(blob) / pull / GB,
                            "repeats": repeats,
                        }
                    )
                    print(f"  {size:>5} {name:<10} publish {pub:.3f}s  pull {pull:.3f}s", flush=True)
                del blob
        finally:
            peer.close()
            publisher.close()
            puller.close()
    return rows


# ---------------------------------------------------------------- end-to-end swap


def build_model(out: Path, tiny: Path, hidden: int, layers: int, inter: int) -> Path:
    """A random-init Qwen2 of the given shape with the tiny model's tokenizer (offline)."""
    import torch
    from transformers import AutoConfig, Qwen2ForCausalLM

    if (out / "config.json").is_file():
        return out
    base = AutoConfig.from_pretrained(tiny).to_dict()
    base.update(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        head_dim=64,
        layer_types=["full_attention"] * layers,
    )
    cfg = type(AutoConfig.from_pretrained(tiny)).from_dict(base)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.float32).save_pretrained(out, safe_serialization=True)
    for f in tiny.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt", "generation_config.json"):
            shutil.copy(f, out / f.name)
    return out


async def swap_rows(models: dict[str, Path], repeats: int, home: Path) -> list[dict]:
    """publish → pull → reload → first request on the new version, per model and store kind."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollart.client.in_process import started_engine
    from rollart.client.local import publish_model
    from rollart.infra.local.mooncake_service import MooncakeService
    from rollart.infra.store.payload import LocalStore, open_store
    from rollart.spec.config import EngineConfig, MooncakeConfig, SamplingParams, StoreConfig

    rows = []
    cfg = StoreConfig(
        kind="mooncake",
        path=home / "swap-store",
        fallback="none",
        mooncake=MooncakeConfig(keeper_segment_mib=1024, buffer_mib=16),
    )
    with MooncakeService(cfg, log_dir=home / "logs") as svc:
        stores = {"mooncake": open_store(svc.config), "local file": LocalStore(home / "swap-local")}
        for label, model_dir in models.items():
            trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            params = sum(p.numel() for p in trainer.parameters())
            async with started_engine(model_dir, EngineConfig(kind="vllm", max_model_len=128)) as engine:
                version = 0
                sampling = SamplingParams(max_tokens=2)
                await engine.generate("warm up", sampling, "warm")
                for kind, store in stores.items():
                    parts: dict[str, list[float]] = {"publish": [], "load": [], "first_request": [], "total": []}
                    for r in range(repeats + 1):
                        with torch.no_grad():
                            for p in trainer.parameters():
                                p.add_(1e-4)
                        version += 1
                        t0 = time.perf_counter()
                        source = publish_model(store, f"swap-{label}", version, trainer)  # what a train step sends
                        t1 = time.perf_counter()
                        await engine.load_weights(source, version)  # streamed from the store into the engine
                        t2 = time.perf_counter()
                        out = await engine.generate("move:", sampling, f"swap-{kind}-{version}")
                        t3 = time.perf_counter()
                        if out.policy_version != version:
                            raise RuntimeError(f"served v{out.policy_version}, expected v{version}")
                        if r:
                            for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                                parts[k].append(v)
                    row = {
                        "model": label,
                        "params": params,
                        "bytes": source.manifest.nbytes,
                        "store": kind,
                        "repeats": repeats,
                        **{f"{k}_s": statistics.median(v) for k, v in parts.items()},
                    }
                    rows.append(row)
                    print(f"  swap {label:>5} {kind:<10} total {row['total_s']:.3f}s", flush=True)
            del trainer
    return rows


# ---------------------------------------------------------------- main


def print_tables(transfer: list[dict], swap: list[dict]) -> None:
    if transfer:
        print("\nweight sync: publish + pull of an fp32 safetensors state dict (medians)")
        print(f"{'size':>6} {'MB':>7} {'backend':<11} {'publish s':>10} {'GB/s':>6} {'pull s':>8} {'GB/s':>6}")
        for r in transfer:
            print(
                f"{r['size']:>6} {r['bytes'] / 1e6:7.1f} {r['backend']:<11} {r['publish_s']:10.3f} "
                f"{r['publish_gbps']:6.2f} {r['pull_s']:8.3f} {r['pull_gbps']:6.2f}"
            )
    if swap:
        print("\nweight swap end to end on vLLM: publish → stream into the engine → first request on the new version")
        print(f"{'model':>6} {'params':>8} {'store':<11} {'publish':>8} {'load':>7} {'request':>8} {'total s':>8}")
        for r in swap:
            print(
                f"{r['model']:>6} {r['params'] / 1e6:7.1f}M {r['store']:<11} {r['publish_s']:8.3f} {r['load_s']:7.3f} "
                f"{r['first_request_s']:8.3f} {r['total_s']:8.3f}"
            )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench weight_sync", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2.5M and 40M only, 3 repeats, no swap part")
    p.add_argument("--repeats", type=int, help="repeats per measurement (default 5; --quick 3)")
    p.add_argument("--sizes", help="comma-separated subset of 2.5M,40M,400M")
    p.add_argument("--swap", action="store_true", help="also time end-to-end swaps on vLLM (tiny and ~40M models)")
    p.add_argument(
        "--no-transfer",
        action="store_true",
        help="skip the transfer part (the results file keeps its last transfer rows)",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    repeats = args.repeats or (3 if args.quick else 5)
    sizes = args.sizes.split(",") if args.sizes else (["2.5M", "40M"] if args.quick else list(SIZES))
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-ws-"))
    transfer: list[dict] = []
    swap: list[dict] = []
    try:
        if not args.no_transfer:
            transfer = transfer_rows(sizes, repeats, home)
        if args.swap:
            from rollart.infra.tiny_model import ensure_tiny_model

            tiny = ensure_tiny_model(RESULTS.parent.parent / ".rollart" / "models" / "tiny")
            big = build_model(RESULTS / "models" / "qwen2-40m", tiny, hidden=512, layers=12, inter=1792)
            swap = asyncio.run(swap_rows({"tiny": tiny, "40M": big}, repeats, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    extra: dict = {"transfer_time": time.time()}
    if args.no_transfer and (RESULTS / "weight_sync.json").is_file():  # a swap-only run keeps the last transfer
        previous = json.loads((RESULTS / "weight_sync.json").read_text())
        transfer = previous.get("transfer", [])
        extra["transfer_time"] = previous.get("transfer_time", previous.get("time"))
    print_tables(transfer, swap)
    rows = as_modes(transfer, swap)
    out = write_results("weight_sync", rows, transfer=transfer, swap=swap, time=time.time(), baseline=BASELINE, **extra)
    written = [out]
    if rows:
        written.append(plot_modes("weight_sync", rows, "weight_sync: publish + pull (transfer) and end-to-end swaps"))
    print(f"\nwritten {', '.join(map(str, written))}")
    return 0


BASELINE = "local file"
"""Each size's transfer (and each model's swap) is compared with the local file's at that size."""


def as_modes(transfer: list[dict], swap: list[dict]) -> list[dict]:
    """The `modes` of the results file: one per (size, backend) transfer and per (model, store) swap, `wall_s` the
    publish + pull (swap: publish → first request on the new version), ratio vs the local file at that size."""
    rows = [
        {
            "name": f"{r['size']} {r['backend']}",
            "group": r["size"],
            "backend": r["backend"],
            "wall_s": r["publish_s"] + r["pull_s"],
        }
        for r in transfer
    ]
    rows += [
        {
            "name": f"swap {r['model']} {r['store']}",
            "group": f"swap {r['model']}",
            "backend": r["store"],
            "wall_s": r["total_s"],
        }
        for r in swap
    ]
    for row in rows:
        base = next((b["wall_s"] for b in rows if b["group"] == row["group"] and b["backend"] == BASELINE), None)
        row["speedup_vs_baseline"] = base / row["wall_s"] if base and row["wall_s"] > 0 else None
    return rows
