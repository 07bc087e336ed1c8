"""Built-in rewards; importing this package registers them (the model's torch code loads only when used)."""

from rollart.activities.rewards import model_based, rule_based

__all__ = ["model_based", "rule_based"]
