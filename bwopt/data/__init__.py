"""Data sources and splits. Everything here is NumPy: TensorFlow enters in bwopt.pipeline."""
