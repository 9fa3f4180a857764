"""Schema of the `sweep` section: how a sweep's report and search judge the jobs they compare."""

from dataclasses import dataclass

from bwopt.schema.checks import ConfigError


@dataclass
class SweepConfig:
    # A job whose final val_accuracy is more than this (absolute) below the best job's learned
    # worse: the sweep report flags it and never names it best, the search never picks it
    # (bwopt.sweep.results, bwopt.sweep.search). 1 flags nothing.
    accuracy_tolerance: float = 0.03

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy_tolerance <= 1.0:
            raise ConfigError(
                f"sweep.accuracy_tolerance={self.accuracy_tolerance!r} is out of range; expected an absolute "
                "accuracy difference in [0, 1] (1 flags no job)"
            )
