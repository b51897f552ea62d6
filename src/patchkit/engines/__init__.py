"""The borders to engines and registries: the Docker Engine API and CLI (local, ssh), the
registry client, and the pipes that move an image between engines."""
