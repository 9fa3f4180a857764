"""One worker of a real local cluster (TF_CONFIG set by the test): write the training examples its
per-worker input pipeline reads in one pass, as hashes of their feature bytes, to argv[1]."""

import hashlib
import json
import sys

import numpy as np
from conftest import compose_config

from bwopt.app import validate
from bwopt.cluster import resolve
from bwopt.data.sources import load_source
from bwopt.inputs import Inputs, plan
from bwopt.strategies import set_up_strategy

OVERRIDES = ["strategy=multi_worker_mirrored", "cluster=local", "data=synthetic", "data.num_examples=600"]


def feature_hash(features) -> str:
    return hashlib.sha1(np.ascontiguousarray(features).tobytes()).hexdigest()


def main(output: str) -> None:
    config = validate(compose_config([*OVERRIDES, "pipeline.distribute.method=distribute_datasets_from_function"]))
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    resolver = resolve(config.cluster, config.strategy)
    _, strategy = set_up_strategy(config.strategy, config.device, resolver)
    inputs = Inputs(config, source, plan(config, source))
    seen = []

    def make_dataset(context):
        # Called once in each worker with that worker's input context, as training calls it.
        elements = inputs.elements(True, context.num_input_pipelines, context.input_pipeline_id)
        seen.extend(feature_hash(features) for features, _ in elements.as_numpy_iterator())
        return inputs.dataset(True, context)

    strategy.distribute_datasets_from_function(make_dataset)
    json.dump({"task": resolver.task_id, "hashes": seen}, open(output, "w"))


if __name__ == "__main__":
    main(sys.argv[1])
