"""LoRA adapters on a transformers model (peft): wrapping it, the adapter as files, loading them back, merging.

Why peft: its `save_pretrained` layout (`adapter_config.json` + `adapter_model.safetensors`) is what vLLM
serves as a `LoRARequest` and what `PeftModel.from_pretrained` loads, so the trainer, the engines, `rollart
eval` and the export all read one format. Only plain LoRA is made (no DoRA, no bias, no `modules_to_save`):
vLLM serves nothing else. The output head is never a target (vLLM serves no adapter there).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rollart.infra.store.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from rollart.spec.config import LoraConfig

__all__ = [
    "adapter_files",
    "adapter_state",
    "check_adapter_fits",
    "is_lora",
    "linear_module_names",
    "load_adapter_blob_into",
    "merged_model",
    "with_lora",
]


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft-wrapped model (its trainable weights are adapters)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last parts of the names of the model's linear layers, its output head left out: what
    `trainer.lora.target_modules` may name."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head
        }
    )


def with_lora(model: torch.nn.Module, lora: LoraConfig, where: str = "the model") -> Any:
    """`model` wrapped with fresh adapters (B = 0: it computes what the base does), the base frozen.

    Raises ValueError naming the model's linear layers when `lora.target_modules` names one it lacks.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    have = linear_module_names(model)
    targets = lora.target_modules
    if targets != "all-linear":
        missing = [t for t in targets if t not in have]
        if missing:
            raise ValueError(
                f"trainer.lora.target_modules: {where} has no linear layer named {', '.join(missing)}; its linear "
                f"layers: {', '.join(have)} (or use all-linear)"
            )
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def adapter_files(model: Any) -> dict[str, bytes]:
    """The adapter as peft's `save_pretrained` writes it, `ADAPTER_FILES` by name (float32 weights), made in
    memory: the same config JSON (sets as lists, sorted keys) and safetensors, without the disk round trip and
    model card (a third of a publish on the tiny model)."""
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in model.active_peft_config.to_dict().items()}
    config["inference_mode"] = True  # as save_pretrained writes it: a loaded adapter is not trainable by default
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in adapter_state(model).items()}
    return {
        ADAPTER_CONFIG: json.dumps(config, indent=2, sort_keys=True).encode(),
        ADAPTER_WEIGHTS: st_save(tensors, metadata={"format": "pt"}),
    }


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names its safetensors file uses (no adapter name in them)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_blob_into(model: Any, blob: bytes) -> None:
    """Copy an `adapter_model.safetensors` blob into the model's adapters in place (optimizer refs survive).

    Raises ValueError when the blob does not fit (other targets or rank): it was trained with another
    `trainer.lora`.
    """
    from peft import set_peft_model_state_dict

    tensors = st_load(blob)
    expected = adapter_state(model)
    check_adapter_fits(tensors, expected)
    with torch.no_grad():
        set_peft_model_state_dict(model, tensors)


def merged_model(model_dir: str | Path, adapter_dir: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """The model of `model_dir` with the adapter in `adapter_dir` merged into its weights: a plain transformers
    model (no peft left), which saves as an ordinary HF model dir."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (Path(adapter_dir) / name).is_file():
            raise ValueError(f"{adapter_dir} is no LoRA adapter: {name} is missing")
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def check_adapter_fits(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    """ValueError unless an adapter's `tensors` have exactly the names and shapes of the model's (`expected`):
    one trained with another `trainer.lora` (rank, target modules) must not be half loaded."""
    unexpected, missing = sorted(set(tensors) - set(expected)), sorted(set(expected) - set(tensors))
    wrong = sorted(n for n in set(tensors) & set(expected) if tensors[n].shape != expected[n].shape)
    if unexpected or missing or wrong:
        raise ValueError(
            f"adapter does not fit the model's: unexpected {unexpected[:3]}, missing {missing[:3]}, other shapes "
            f"{wrong[:3]}; was it trained with another trainer.lora (rank, target_modules)?"
        )
