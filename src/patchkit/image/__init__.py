"""Images: references, the hand-made layer and config, finding vLLM inside an image, the build
paths, and the Docker border (``engine``), the only user of the docker SDK and CLI."""
