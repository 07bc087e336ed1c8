"""The payload store: keys, the local and Mooncake stores, published weights and LoRA adapters."""
