"""The input pipeline of encoded images: decoded and preprocessed per element (bwopt.preprocess),
before the cache when the preprocessing is deterministic, after shuffle and repeat when it is random
(then a cache holds the encoded bytes, or, where the crop is cut from the whole decoded image, the
decoded images); then bwopt.pipeline's stages."""

from dataclasses import dataclass, replace
from typing import Callable, Optional, Tuple

from bwopt.pipeline import (
    Maps,
    assemble,
    build_dataset,
    caches,
    epoch_size,
    make_augment,
    make_cast,
    parallel_arguments,
)

PIXEL_RANGE = (0.0, 255.0)


@dataclass(frozen=True)
class EncodedImages:
    """What the elements of an image pipeline hold, and the size to decode them to.

    Attributes:
        image_size: [height, width] of the decoded images.
        paths: the elements are (path, label, identity seeds) triples: an image file's path, read
            in the map that decodes it (or, when a cache must hold the bytes before a random stage,
            in a map of their own), and its place in the folder's file list as the image's part of
            the seeds of its random crop (image_file_elements); else (encoded bytes, label) pairs,
            keyed by a fingerprint of the bytes.
        jpeg_only: every image is a JPEG (bwopt.preprocess.Decoding).
    """

    image_size: Tuple[int, int]
    paths: bool = False
    jpeg_only: bool = False


def decodes_before_cache(pipeline) -> bool:
    """Whether the cache (or snapshot) of a random image preprocessing holds decoded images rather
    than encoded bytes: where the crop is decoded whole and cut out after (`fused_decode_crop:
    false`), decoding is deterministic and comes before the cache; a fused decode of the crop
    window is random, and the cache holds the bytes it reads. Without a cache the images are
    decoded after the shuffle, which holds them encoded."""
    return caches(pipeline) and not pipeline.fused_decode_crop


def build_image_dataset(
    config,
    encoded,
    batch_size: int,
    *,
    training: bool,
    seed: int,
    images: EncodedImages,
    service: Optional[Callable] = None,
):
    """Batches of images from (encoded image, int32 label) or (path, label, identity) elements
    (`EncodedImages.paths`), preprocessed as
    `pipeline.preprocess` says (bwopt.preprocess), per element, with `pipeline.map_parallelism`.

    A deterministic preprocessing reads and decodes before the cache, which then holds decoded
    images; a random one (imagenet's for training) runs after shuffle and repeat, so every epoch
    draws new crops, keyed by the image's identity, the epoch and the seed
    (`bwopt.preprocess.element_seeds`), whatever its order; the cache holds the encoded bytes, or,
    with `fused_decode_crop: false`, the whole decoded images (`decodes_before_cache`), from which
    each epoch cuts its crops: the same pixels as decoding every epoch, without the decode.
    Otherwise as `build_dataset`.
    """
    import tensorflow as tf

    from bwopt.preprocess import Decoding, epoch_seeds, identity_seeds, image_identity, preprocessing
    from bwopt.preprocess import decode as decode_image

    fixed, random = preprocessing(config.preprocess)
    decoding = Decoding(tuple(images.image_size), config.fused_decode_crop, images.jpeg_only)
    parallel = parallel_arguments(config, config.map_parallelism)
    read_file = images.paths
    # Per element, the cast joins the decode in one map; vectorised, build_dataset casts after batch
    # (a random preprocessing refuses vectorized_map: bwopt.schema.pipeline).
    cast = None if config.vectorized_map else make_cast(config)

    def finish(image, label):
        return cast(image, label) if cast else (image, label)

    if training and random is not None:
        if decodes_before_cache(config):
            # Decoding is the last deterministic stage: the cache holds whole decoded images, with
            # the identity their crop's seeds are made from, and each epoch crops them anew.
            def decode_whole(data, label, *image_part):
                encoded_image = tf.io.read_file(data) if read_file else data
                part = image_part[0] if image_part else identity_seeds(image_identity(encoded_image))
                return decode_image(encoded_image, decoding), label, part

            encoded = encoded.map(decode_whole, **parallel)
            decoding = replace(decoding, decoded=True)
            read_file = False
        elif read_file and caches(config):
            # The cache must hold the files' bytes, not their paths: read them in a map of their own.
            encoded = encoded.map(lambda path, *rest: (tf.io.read_file(path), *rest), **parallel)
            read_file = False

        examples_per_epoch = epoch_size(encoded)

        def decode(example, epoch_part):
            data, label, *image_part = example
            encoded_image = tf.io.read_file(data) if read_file else data
            image_part = image_part[0] if image_part else identity_seeds(image_identity(encoded_image))
            # bwopt.preprocess.element_seeds, from its two parts
            return finish(random(encoded_image, image_part + epoch_part, decoding), label)

        maps = Maps(
            decode=decode,
            position_key=lambda positions: epoch_seeds(positions // examples_per_epoch, seed),
            augment=make_augment(config, PIXEL_RANGE, seed, encoded),
        )
        return assemble(config, encoded, maps, batch_size, training=training, seed=seed, service=service)

    def decode_fixed(data, label, *_):  # a deterministic preprocessing needs no identity
        encoded_image = tf.io.read_file(data) if read_file else data
        return finish(fixed(encoded_image, decoding), label)

    decoded = encoded.map(decode_fixed, **parallel)
    return build_dataset(
        config, decoded, batch_size, training=training, seed=seed, value_range=PIXEL_RANGE, service=service
    )
