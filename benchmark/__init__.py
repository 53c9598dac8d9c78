"""bt-bench: training-data attribution in online RL fine-tuning, scored against controls."""

__version__ = "0.1.0"
