"""Built-in estimators and target-free controls for bt-bench."""
