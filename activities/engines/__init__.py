"""Inference engines for generation workers: vLLM (the default) and a plain HF fallback for fast tests."""
