"""bwopt: measure and optimize the input pipeline and memory bandwidth of TensorFlow training."""

__version__ = "0.1.0"
