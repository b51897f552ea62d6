"""The overlay image through an engine: the base as the engine holds it, plus one layer.

The base's files are read through a stopped container, the layer and config are made here
(:func:`~patchkit.image.build.overlay_image`), and the image reaches the engine as a load
archive: the layer alone where the engine's store holds the base's layers, else complete.  An
image carrying the same inputs key is found by its label and reused.
"""

from __future__ import annotations

from contextlib import ExitStack

from patchkit.formats import layer
from patchkit.image.base import opened
from patchkit.image.build import (OVERLAY_MODE, Built, LayerInfo, overlay_image, overlay_inputs,
                                  plan_overlay)
from patchkit.image.builders.protocol import EnginePath, Job
from patchkit.engines.docker import Engine
from patchkit.image.labels import INPUTS_LABEL, ImageFacts


class EngineOverlay(EnginePath):
    name = "engine-overlay"
    mode = OVERLAY_MODE

    def build(self, job: Job) -> Built:
        engine = job.engine
        assert engine is not None, "a path through an engine is given one"
        base_ref, platform, log = job.base_ref(), job.platform, job.log
        if job.held is not None:   # read once, before the apply
            base = job.held.image
        else:
            log(f"resolving the base {base_ref} for {platform}")
            base = engine.resolve_base(base_ref, platform, log)
        log(f"base pinned by {base.pinned_by}: {base.pinned}")
        inputs = overlay_inputs(job.manifest, job.tree, job.choice, base, job.packages,
                                job.project)
        built = _known(engine, inputs.key, base, log)
        if built is None:
            with ExitStack() as hold:   # the base's files: the ones held open, else opened here
                held = job.held or hold.enter_context(opened(engine, base_ref, platform, log))
                plan = plan_overlay(held.files, base, job.tree, job.choice.shipped,
                                    inputs.serve, log, job.packages, job.artifacts,
                                    lambda: held.installed)
            made, config = overlay_image(base, plan, inputs)
            held, load = _load(engine, base, made, config, log)
            built = Built(held, base, load is None,
                          LayerInfo(made.files, made.bytes, made.whiteouts, made.diff_id),
                          plan.package.dir, plan.installed, config_digest=layer.image_id_of(config),
                          load=load)
        engine.tag(built.image_id, job.tag)
        log(f"tagged {job.tag}")
        return built


def _known(engine: Engine, key: str, base: layer.BaseImage, log) -> Built | None:
    """The image an earlier run made of the same inputs, found by its label: the base's layers
    and one more.  An image built FROM it carries its labels too, on more layers."""
    for known in engine.images_with_label(INPUTS_LABEL, key):
        image = engine.inspect(known)
        layers = list(image.diff_ids) if image is not None else []
        if layers[:-1] != list(base.diff_ids) or len(layers) != len(base.diff_ids) + 1:
            continue
        facts = ImageFacts.from_labels(image.labels)
        log(f"nothing changed since image {known[:19]}: reusing it")
        return Built(known, base, True, LayerInfo(*facts.layer, layers[-1]), facts.vllm_dir,
                     facts.installed)
    return None


def _load(engine: Engine, base: layer.BaseImage, made: layer.Layer, config: bytes, log
          ) -> tuple[str, str | None]:
    """The id the engine holds the image by, and how it was loaded (None: it was there)."""
    image_id = layer.image_id_of(config)
    store = engine.store()
    if engine.has_image(image_id):
        log(f"image {image_id[:19]} is already in the engine")
        return image_id, None
    if store.partial_load:
        log(f"loading the layer alone ({made.files} files, {made.bytes} bytes) onto {base.pinned}: "
            f"the engine at {engine.host} keeps images in {store}, which holds the base's layers")
        engine.load(layer.load_archive(config, made, len(base.diff_ids)), image_id)
        return image_id, "partial"
    log(f"loading a complete archive: the engine at {engine.host} keeps images in {store}, "
        "which cannot take a partial load")
    return engine.load_complete(base, config, made, image_id, log), "complete"


BUILDER = EngineOverlay()
