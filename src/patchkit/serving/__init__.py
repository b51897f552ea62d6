"""What judges a running vLLM server: its logs against the runtime markers, its ``/metrics``,
speculative-decoding acceptance, and the answers it gives.  Pure: the callers read the logs and
make the requests.  Nothing is imported here, so that the manifest may read an acceptance floor
without the rest."""
