"""Preprocessing of encoded images, one element at a time: what `pipeline.preprocess` names.

    none       decode, resize to the image size (bilinear, aspect ratio not kept, as
               keras.utils.image_dataset_from_directory does)
    imagenet   TF Model Garden's classification preprocessing:
               training    decode a random crop (a sampled distorted bounding box covering
                           8-100 % of the area, aspect ratio 3/4 to 4/3, 10 attempts, else the
                           whole image), resize, flip left-right at random (after the
                           resize: the same pixels as before it, for less work)
               validation  decode the central square of 87.5 % of the shorter side, resize

`pipeline.fused_decode_crop`: a JPEG's crop window is decoded alone (`tf.io.decode_and_crop_jpeg`,
the window found from the header by `tf.io.extract_jpeg_shape`) instead of decoding the whole
image and cropping it; PNG, BMP and GIF files are always decoded whole. Both give the same window
(the same pixels within two levels).

Every function returns uint8 images of shape [height, width, 3]. Random choices are stateless,
drawn with seeds made from the image's identity (`image_identity`: an image file's place in its
folder's file list, or a fingerprint of encoded bytes), the epoch and the run's seed
(`element_seeds`), never from its place in the stream: an image gets the same crop and flip in an
epoch whatever the order it arrives in (shuffling, or a parallel map or read with
pipeline.deterministic=false), so the pipeline's speed knobs never change the examples.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
MAX_ATTEMPTS = 10
CENTER_CROP_FRACTION = 0.875


@dataclass(frozen=True)
class Decoding:
    """How the images of one pipeline are decoded.

    Attributes:
        image_size: [height, width] of the results.
        fused_crop: decode only a JPEG's crop window (pipeline.fused_decode_crop).
        jpeg_only: every image is a JPEG (image files named .jpg or .jpeg), so no image needs
            its format tested first (a test per image costs about 4 % of the CPU time of a
            200-pixel JPEG's preprocessing).
        decoded: the elements hold decoded images already (a cache before the random crop
            holds them: bwopt.image_pipeline), so decoding them is nothing and their crop a slice.
    """

    image_size: Tuple[int, int]
    fused_crop: bool = True
    jpeg_only: bool = False
    decoded: bool = False


def decode(encoded, decoding: Decoding):
    """The whole image (JPEG, PNG, BMP, GIF's first frame) -> uint8 [h, w, 3]."""
    import tensorflow as tf

    if decoding.decoded:
        return encoded
    if decoding.jpeg_only:
        return tf.io.decode_jpeg(encoded, channels=3)
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    return tf.ensure_shape(image, [None, None, 3])


def resize(image, decoding: Decoding):
    """Bilinear resize to [height, width], rounded back to uint8."""
    import tensorflow as tf

    resized = tf.image.resize(image, list(decoding.image_size), method="bilinear")
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def decode_window(encoded, window: Callable, decoding: Decoding):
    """The part of an encoded image that `window(shape) -> (offset [y, x], size [h, w])` names."""
    import tensorflow as tf

    def decode_then_crop():
        image = decode(encoded, decoding)
        offset, size = window(tf.shape(image))
        return tf.slice(image, tf.concat([offset, [0]], 0), tf.concat([size, [3]], 0))

    def decode_only_the_window():
        offset, size = window(tf.io.extract_jpeg_shape(encoded))
        return tf.io.decode_and_crop_jpeg(encoded, tf.concat([offset, size], 0), channels=3)

    if decoding.decoded or not decoding.fused_crop:
        return decode_then_crop()
    if decoding.jpeg_only:
        return decode_only_the_window()
    image = tf.cond(tf.io.is_jpeg(encoded), decode_only_the_window, decode_then_crop)
    return tf.ensure_shape(image, [None, None, 3])


def center_window(shape):
    """The central square of CENTER_CROP_FRACTION of the shorter side (Model Garden's rounding)."""
    import tensorflow as tf

    height, width = shape[0], shape[1]
    side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * CENTER_CROP_FRACTION, tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2]), tf.stack([side, side])


def random_window(seed):
    """shape -> a sampled distorted bounding box (offset, size), drawn with the stateless `seed`."""
    import tensorflow as tf

    def window(shape):
        offset, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            seed=seed,
            min_object_covered=AREA_RANGE[0],
            aspect_ratio_range=ASPECT_RATIO_RANGE,
            area_range=AREA_RANGE,
            max_attempts=MAX_ATTEMPTS,
            use_image_if_no_bounding_boxes=True,
        )
        return offset[:2], size[:2]

    return window


def image_identity(encoded):
    """int64: a fingerprint of an image's encoded bytes (tf.fingerprint, farmhash), for images that
    arrive as bytes (TFRecords, your dataset). Image files are known by their place in the folder's
    file list instead, given with the path: fingerprinting each file's bytes measured 1-8 % of a
    200-pixel JPEG's preprocessing (CPU time per image on one thread, alternated rounds)."""
    import tensorflow as tf

    return tf.bitcast(tf.fingerprint(tf.reshape(encoded, [1]))[0], tf.int64)


def element_seeds(identity, epoch, seed: int):
    """int64 [2, 2]: the stateless seeds of one image's crop ([0]) and flip ([1]):
    `identity_seeds(identity) + epoch_seeds(epoch, seed)`, [[identity, stream], [~identity, stream]].

    Made from the image's identity (an int64 scalar, `image_identity`), the epoch (an int64
    scalar) and the run's seed (its low 32 bits), so they depend on which image it is and when,
    never on its position in the stream. The pairs are plain integers: TensorFlow passes a
    stateless seed pair through Philox before it draws (so that no part of the pair must be
    strong), and two distinct pairs give independent draws. Deriving them with stateless_fold_in
    and stateless_split instead cost ~6 % of the whole preprocessing (benchmarks/jpeg_pipeline.py).
    """
    return identity_seeds(identity) + epoch_seeds(epoch, seed)


def identity_seeds(identity):
    """int64 [..., 2, 2]: the image's part of its seeds, [[identity, 0], [~identity, 0]], for
    identities of any shape: the pipeline works out a folder's once, for all its files, as the
    file list's part of each element (bwopt.pipeline.image_file_elements)."""
    import tensorflow as tf

    identity = tf.cast(identity, tf.int64)
    zero = tf.zeros_like(identity)
    return tf.stack([tf.stack([identity, zero], -1), tf.stack([tf.bitwise.invert(identity), zero], -1)], -2)


def epoch_seeds(epoch, seed: int):
    """int64 [..., 2, 2]: the epoch's part of the seeds, [[0, stream], [0, stream]] with stream =
    epoch << 32 ^ the seed's low 32 bits, for epochs of any shape: the pipeline works them out for
    a block of positions at a time (bwopt.pipeline.Maps.position_keys), since each operation a
    per-element map runs costs about a microsecond per image."""
    import tensorflow as tf

    epoch_bits = tf.bitwise.left_shift(tf.cast(epoch, tf.int64), tf.constant(32, tf.int64))
    stream = tf.bitwise.bitwise_xor(epoch_bits, tf.constant(seed & 0xFFFFFFFF, tf.int64))
    zero = tf.zeros_like(stream)
    pair = tf.stack([zero, stream], -1)
    return tf.stack([pair, pair], -2)


def decoded_resized(encoded, decoding: Decoding):
    """`none`: the whole image, resized."""
    return resize(decode(encoded, decoding), decoding)


def center_cropped(encoded, decoding: Decoding):
    """`imagenet` for validation: the central crop, resized."""
    return resize(decode_window(encoded, center_window, decoding), decoding)


def randomly_cropped(encoded, seeds, decoding: Decoding):
    """`imagenet` for training: a random crop (drawn with seeds[0]), resized, flipped at random (seeds[1]).

    Model Garden flips the crop before resizing it; a bilinear resize commutes with a left-right
    flip, so flipping the small resized image gives the same pixels (bitwise, on 300 sample
    images) for 5 % less CPU time per example of the training dataset (400.5 -> 378.7 us,
    benchmarks/README.md).
    """
    import tensorflow as tf

    cropped = decode_window(encoded, random_window(seeds[0]), decoding)
    return tf.image.stateless_random_flip_left_right(resize(cropped, decoding), seeds[1])


# Keyed by bwopt.schema.pipeline.PREPROCESSINGS: (the deterministic preprocessing, used for
# validation and for training when there is no random one; the random training one, or None).
PREPROCESSINGS: Dict[str, Tuple[Callable, Optional[Callable]]] = {
    "none": (decoded_resized, None),
    "imagenet": (center_cropped, randomly_cropped),
}


def preprocessing(name: str) -> Tuple[Callable, Optional[Callable]]:
    try:
        return PREPROCESSINGS[name]
    except KeyError:
        raise ValueError(f"unknown preprocessing {name!r}; expected one of: {', '.join(PREPROCESSINGS)}") from None
