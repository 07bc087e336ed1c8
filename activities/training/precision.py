"""Float32 master weights for a model that computes in bfloat16, and the AdamW that steps them.

Why: bf16 halves memory and doubles GPU throughput, but its 8-bit mantissa loses small updates
(lr × Adam's normalised step is often below a bf16 ulp of the weight). So the optimizer holds fp32
copies of the weights and its moments in fp32, steps those with fp32 gradients, and copies the
result back into the bf16 model. For a float32 model the copies *are* the parameters (no extra memory).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rollart.spec.config import TrainerConfig

__all__ = ["MasterWeights", "clip_scale"]


def clip_scale(grad_norm: float, max_norm: float) -> float:
    """The factor that clips gradients of global norm `grad_norm` to `max_norm` (torch's clip_grad_norm_ rule)."""
    return min(1.0, max_norm / (grad_norm + 1e-6))


class MasterWeights:
    """An AdamW over fp32 masters of `params`; `step(grads)` updates masters and copies them into `params`."""

    def __init__(self, params: Sequence[torch.nn.Parameter], cfg: TrainerConfig) -> None:
        self.params = list(params)
        self.masters = [
            p if p.dtype == torch.float32 else p.detach().float().clone().requires_grad_() for p in self.params
        ]
        self.optimizer = torch.optim.AdamW(
            self.masters, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
        )
        self._before: list[torch.Tensor] = []

    def step(self, grads: Sequence[torch.Tensor | None], cfg: TrainerConfig, scale: float = 1.0) -> None:
        """One AdamW step with `cfg`'s hyper-parameters on `grads` × `scale` (None: no gradient this step)."""
        for group in self.optimizer.param_groups:  # the config may change between steps (schedules)
            group.update(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
        for m, g in zip(self.masters, grads):
            if g is None:
                m.grad = None
                continue
            g = g.float() if g.dtype != torch.float32 else g
            m.grad = g * scale if scale != 1.0 else g
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if p is not m:
                    p.copy_(m)
        for m in self.masters:
            m.grad = None

    def remember(self) -> None:
        """Keep a copy of the masters as they are now: what `shrink` scales the next update back towards."""
        self._before = [m.detach().clone() for m in self.masters]

    def shrink(self, factor: float) -> None:
        """Scale the update made since `remember` by `factor` (0.5: half of it), in the masters and the model.
        The moments stay as the full step left them: only where the weights land changes."""
        with torch.no_grad():
            for p, m, b in zip(self.params, self.masters, self._before):
                m.sub_(b).mul_(factor).add_(b)
                if p is not m:
                    p.copy_(m)

    def forget(self) -> None:
        """Drop the copy `remember` kept (a model's worth of memory between steps)."""
        self._before = []

    def state_dict(self) -> dict:
        """Optimizer state, plus the fp32 masters where they are copies (a bf16 model alone would lose them)."""
        copies = {i: m.detach() for i, (p, m) in enumerate(zip(self.params, self.masters)) if p is not m}
        return {"optimizer": self.optimizer.state_dict(), "masters": copies}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` saved (masters first, then the moments)."""
        if "optimizer" not in state:  # a checkpoint from before master weights: a plain AdamW state
            state = {"optimizer": state}
        with torch.no_grad():
            for i, t in state.get("masters", {}).items():
                self.masters[int(i)].copy_(t)
                self.params[int(i)].copy_(t)
        self.optimizer.load_state_dict(state["optimizer"])

    def sync_from_params(self) -> None:
        """Take the model's current weights as the masters (after weights were loaded into the model)."""
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if p is not m:
                    m.copy_(p.float())
