"""Target-free controls, run by the evaluator next to every estimator."""
