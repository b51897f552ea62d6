"""patchkit: exact, fail-closed patch management for vLLM images."""

__version__ = "0.1.0"
