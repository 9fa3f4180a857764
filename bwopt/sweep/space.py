"""A search's space: Hydra's sweep overrides as Optuna distributions, and sampled values as overrides.

`choice(0, 2, autotune)` (or `0,2,autotune`) is categorical; `range(1, 9)` the integers 1..8
(`range(1, 9, 2)` every second one); `interval(0.0001, 0.1)` a float, `tag(log, interval(...))`
log-uniform, `tag(int, interval(1, 64))` an integer. A space that cannot be searched (an empty
range, an interval whose low end is above its high end, a log interval that does not start
above 0) is a `SearchConfigError` that names the override and what would fix it; the sweeper
prints it as one line and exits 2, as for any bad key.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep


class SearchConfigError(ValueError):
    """A sweeper setting or a search-space override that cannot be searched."""


def distribution(override: Override):
    """The Optuna distribution of one sweep override (choice, range, interval)."""
    from optuna.distributions import CategoricalDistribution

    sweep = override.value()
    if isinstance(sweep, ChoiceSweep):
        choices = list(override.sweep_iterator())
        if not all(choice is None or isinstance(choice, (bool, int, float, str)) for choice in choices):
            raise SearchConfigError(f"{override.input_line}: choices must be plain values (numbers, strings, bools)")
        return CategoricalDistribution(choices)
    if isinstance(sweep, RangeSweep):
        return _range_distribution(override, sweep)
    if isinstance(sweep, IntervalSweep):
        return _interval_distribution(override, sweep)
    raise SearchConfigError(f"{override.input_line}: only choice(), range() and interval() can be searched")


def _range_distribution(override: Override, sweep: RangeSweep):
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if not all(isinstance(bound, int) for bound in (sweep.start, sweep.stop, sweep.step)):
        raise SearchConfigError(f"{override.input_line}: range() must give integers; use interval() for floats")
    values = list(override.sweep_iterator())
    if not values or sweep.step < 0:
        raise SearchConfigError(
            f"{override.input_line}: the range is empty or runs downwards; expected range(start, stop) with "
            f"start < stop, e.g. range({min(sweep.start, sweep.stop)}, {max(sweep.start, sweep.stop)}) "
            "(stop is excluded)"
        )
    if len(values) == 1:
        return CategoricalDistribution(values)
    return IntDistribution(values[0], values[-1], step=int(sweep.step))


def _interval_distribution(override: Override, sweep: IntervalSweep):
    from optuna.distributions import FloatDistribution, IntDistribution

    log_scale, low, high = "log" in sweep.tags, sweep.start, sweep.end
    if low > high:
        raise SearchConfigError(
            f"{override.input_line}: the interval's low end {low:g} is above its high end {high:g}; "
            f"expected interval(low, high), e.g. interval({high:g}, {low:g})"
        )
    if log_scale and low <= 0:
        raise SearchConfigError(
            f"{override.input_line}: a log interval must start above 0 (log of {low:g} is undefined); "
            "give a positive low end, e.g. 1e-4, or drop tag(log, ...)"
        )
    if "int" in sweep.tags:
        if log_scale and int(low) < 1:
            raise SearchConfigError(f"{override.input_line}: an integer log interval must start at 1 or above")
        return IntDistribution(int(low), int(high), log=log_scale)
    return FloatDistribution(float(low), float(high), log=log_scale)


def search_space(params: Dict[str, str], arguments: Sequence[str]) -> Tuple[List[str], Dict[str, Any]]:
    """Fixed overrides (as typed) and the distributions by override key, from params then the command line."""
    lines = {key: f"{key}={value}" for key, value in params.items()}
    parser = OverridesParser.create()
    for override in parser.parse_overrides(list(arguments)):
        lines[override.get_key_element()] = override.input_line
    fixed, space = [], {}
    for override in parser.parse_overrides(list(lines.values())):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(override.input_line)
    if not space:
        raise SearchConfigError("nothing to search: give hydra.sweeper.params or a sweep such as key=choice(a,b)")
    return fixed, space


def override_value(value) -> str:
    """A sampled value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not value.replace("_", "").replace("-", "").replace(".", "").isalnum():
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def trial_overrides(fixed: Sequence[str], params: Dict[str, Any]) -> List[str]:
    return [*fixed, *(f"{key}={override_value(value)}" for key, value in params.items())]


def configured_params(space: Dict[str, Any], configured: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The searched keys' values as configured (`configured`: key -> value, None when the config has no
    such key), when every one of them lies in its distribution: the search's start, its first trial."""
    params = {}
    for key, dist in space.items():
        value = configured.get(key)
        if value is None:
            return None
        try:
            dist.to_internal_repr(value)
        except (ValueError, TypeError):
            return None
        if hasattr(dist, "low") and not dist.low <= value <= dist.high:
            return None
        params[key] = value
    return params
