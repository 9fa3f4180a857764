"""Property: any value for any key of the config is either accepted as a valid config or refused
with a clear error that names the key: never a crash, never a NaN or infinity let through.

Hypothesis draws a key among every leaf of the composed default config (and of each group's
options) and a value of any kind (numbers of every size and sign, NaN, infinities, booleans,
strings, null, lists); the override goes through Hydra's compose and bwopt's validation, the path
`python -m bwopt` takes before anything heavy is imported.
"""

import math

import pytest
from conftest import compose_config
from hydra.errors import HydraException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from bwopt.app import validate
from bwopt.schema import ConfigError
from bwopt.schema.checks import check_known_and_finite

BASES = [[], ["data=synthetic"], ["data=artificial", "split=uniform"], ["strategy=mirrored"], ["pipeline=tuned"]]


def leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


KEYS = sorted(
    {key for base in BASES for key in leaves(OmegaConf.to_container(compose_config(base)))} - {"tracking.tags"}
)


def rendered(value) -> str:
    """A value in Hydra's override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, str):
        return "'" + value.replace("\\\\", "\\\\\\\\").replace("'", "\\\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(rendered(item) for item in value) + "]"
    return repr(value)


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0, -1, 0.0, -0.5, 1e300]),
    st.text(alphabet=st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=12),
    st.lists(st.integers(min_value=-5, max_value=300), max_size=4),
)


@pytest.mark.slow  # 200 examples: over a minute
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), key=st.sampled_from(KEYS), value=VALUES)
def test_any_value_for_any_key_is_valid_or_refused_naming_the_key(base, key, value):
    override = f"{key}={rendered(value)}"
    try:
        config = validate(compose_config([*base, override]))
    except ConfigError as error:  # bwopt's or OmegaConf's own error, as `python -m bwopt` prints it
        assert key.split(".")[-1] in str(error), (override, str(error))
        return
    except HydraException:  # Hydra's own refusal: a malformed override, an option that does not exist
        return  # (its command line prints the override it could not read; compose's message may not)
    check_known_and_finite(config)  # what is accepted holds no NaN, no infinity, no unknown key


@pytest.mark.parametrize("key", ["train.learning_rate", "data.signal", "data.element_latency_s", "seed"])
def test_the_examples_that_used_to_get_through_still_do_not(key):
    base = {"data.signal": ["data=synthetic"], "data.element_latency_s": ["data=artificial", "split=uniform"]}
    with pytest.raises(ConfigError, match=key.split(".")[-1]):
        validate(compose_config([*base.get(key, []), f"{key}={'-1' if key == 'seed' else 'nan'}"]))
