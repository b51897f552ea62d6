"""The image formats patchkit reads and writes, pure: layers and configs, load archives,
registry manifests."""
