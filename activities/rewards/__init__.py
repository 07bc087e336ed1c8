"""Built-in reward functions; importing this package registers them."""

from rollart.activities.rewards import rule_based

__all__ = ["rule_based"]
