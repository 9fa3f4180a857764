"""The per-call references that split a step's input wait, as one value (bwopt.measure.overhead
measures them; bwopt.measure.timing splits with them)."""

from dataclasses import dataclass, field, fields
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class HostReferences:
    """Per-call costs measured apart from training, in the same run (`bwopt.measure.overhead`).

    Attributes:
        fetch_overhead_s: `next()` on a ready batch (steps_per_execution 1; else None).
        dispatch_overhead_s: a distributed step that computes nothing, dispatched and read on the host.
        ready_execution_s: one N-step execution on batches always ready (steps_per_execution > 1).
        ranges: name -> (lowest, highest) of the blocks each reference is the median of
            (bwopt.measure.overhead): its own noise, which moves every step's split at once, so
            the partition's intervals take it in (`timing_figures`).
    """

    dispatch_overhead_s: float
    fetch_overhead_s: Optional[float] = None
    ready_execution_s: Optional[float] = None
    ranges: Dict[str, Tuple[float, float]] = field(default_factory=dict)

    def values(self) -> Dict[str, float]:
        return {item.name: getattr(self, item.name) for item in fields(self) if item.name != "ranges"}

    def metrics(self) -> Dict[str, float]:
        """The measured references by field name, each range as `<name>_ci95_low/_high`; a mode
        returns them with its figures."""
        metrics = {key: value for key, value in self.values().items() if value is not None}
        for name, (low, high) in self.ranges.items():
            metrics.update({f"{name}_ci95_low": low, f"{name}_ci95_high": high})
        return metrics

    @classmethod
    def split_from(cls, figures: Dict[str, float]) -> Tuple[Optional["HostReferences"], Dict[str, float]]:
        """(the references among a mode's figures, or None; the other figures)."""
        names = {item.name for item in fields(cls)} - {"ranges"}
        bounds = {f"{name}_ci95_{side}" for name in names for side in ("low", "high")}
        found = {key: value for key, value in figures.items() if key in names}
        ranges = {
            name: (figures[f"{name}_ci95_low"], figures[f"{name}_ci95_high"])
            for name in found
            if f"{name}_ci95_low" in figures and f"{name}_ci95_high" in figures
        }
        rest = {key: value for key, value in figures.items() if key not in names | bounds}
        return (cls(**found, ranges=ranges) if "dispatch_overhead_s" in found else None), rest

    def at(self, side: int) -> "HostReferences":
        """These references with each one that has a range at its lowest (side 0) or highest (1) block."""
        values = self.values()
        return HostReferences(**{**values, **{name: bounds[side] for name, bounds in self.ranges.items()}})
